//! `kiln bench`: llama-bench's pp/tg measurements, with its JSON shape.

use std::time::Instant;

use kiln::engine::Engine;
use kiln::model::{Entry, OutputKind};
use kiln::KilnError;
use serde_json::json;

use super::common::{print_out, ModelArgs};

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    model: ModelArgs,
    /// Prompt lengths to process (comma list; 0 skips).
    #[arg(short = 'p', long = "n-prompt", default_value = "512")]
    n_prompt: String,
    /// Tokens to generate (comma list; 0 skips).
    #[arg(short = 'n', long = "n-gen", default_value = "128")]
    n_gen: String,
    /// Tokens already in the context before each test (comma list).
    #[arg(short = 'd', long = "n-depth", default_value = "0")]
    n_depth: String,
    /// Repetitions of each test.
    #[arg(short = 'r', long = "repetitions", default_value_t = 5)]
    reps: usize,
    #[arg(long)]
    json: bool,
    /// GPU profile on stderr after each step: 1 host time, 2 also each kernel's GPU time.
    #[arg(long = "gpu-profile", default_value_t = 0)]
    gpu_profile: u8,
}

fn list(s: &str, flag: &str) -> kiln::Result<Vec<usize>> {
    s.split(',')
        .map(|x| x.trim().parse().map_err(|_| KilnError::invalid(format!("{flag}: {x:?} is not a number"))))
        .collect()
}

/// A deterministic stream of token ids (values do not change the timing).
struct Lcg(u64);
impl Lcg {
    fn next(&mut self, n: usize) -> u32 {
        self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        ((self.0 >> 33) % n as u64) as u32
    }
}

struct Test {
    n_prompt: usize,
    n_gen: usize,
    n_depth: usize,
}

pub fn run(mut a: Args) -> kiln::Result<()> {
    let (pp, tg, depth) = (list(&a.n_prompt, "-p")?, list(&a.n_gen, "-n")?, list(&a.n_depth, "-d")?);
    if a.reps == 0 {
        return Err(KilnError::invalid("-r must be at least 1"));
    }
    let mut tests = Vec::new();
    for &d in &depth {
        tests.extend(pp.iter().filter(|&&p| p > 0).map(|&p| Test { n_prompt: p, n_gen: 0, n_depth: d }));
        tests.extend(tg.iter().filter(|&&n| n > 0).map(|&n| Test { n_prompt: 0, n_gen: n, n_depth: d }));
    }
    let need =
        tests.iter().map(|t| t.n_depth.saturating_add(t.n_prompt).saturating_add(t.n_gen)).max().unwrap_or(1);
    a.model.ctx_size.get_or_insert(need.max(1));
    let engine = Engine::load(a.model.name(), a.model.engine_options()?.with_gpu_profile(a.gpu_profile))?;
    if need > engine.n_ctx() {
        return Err(KilnError::invalid(format!(
            "a test needs {need} tokens of context (-d + -p + -n); the context is {}",
            engine.n_ctx()
        )));
    }
    let g = engine.gguf();
    let model_size: u64 = g.tensors.iter().map(|t| t.size).sum();
    let bytes_per_token = weight_bytes_per_token(&engine);
    let n_threads = a.model.threads.unwrap_or(usize::MAX).min(kiln::backend::cpu::default_threads());
    let file = engine.path().file_name().map(|f| f.to_string_lossy().into_owned()).unwrap_or_default();
    let kv_types = engine.runner().kv_types();
    let (type_k, type_v) = (kiln::kv::cache_type_name(kv_types.k), kiln::kv::cache_type_name(kv_types.v));
    let kv_row = engine.runner().kv_bytes_per_token();
    if !a.json {
        eprintln!("KV cache: {type_k} keys, {type_v} values, {kv_row} bytes per token");
    }
    let mut rows = Vec::new();
    let mut rng = Lcg(1234);
    for t in &tests {
        let n_tok = t.n_prompt + t.n_gen;
        run_once(&engine, t, &mut rng)?; // warm-up
        let mut ns = Vec::with_capacity(a.reps.min(1024));
        for _ in 0..a.reps {
            ns.push(run_once(&engine, t, &mut rng)?);
        }
        let ts: Vec<f64> = ns.iter().map(|&n| n_tok as f64 * 1e9 / n as f64).collect();
        let avg_ts = ts.iter().sum::<f64>() / ts.len() as f64;
        let sd = if ts.len() > 1 {
            (ts.iter().map(|x| (x - avg_ts).powi(2)).sum::<f64>() / (ts.len() - 1) as f64).sqrt()
        } else {
            0.0
        };
        let name = if t.n_prompt > 0 { format!("pp{}", t.n_prompt) } else { format!("tg{}", t.n_gen) };
        let kv = kv_bytes_per_step(engine.config(), kv_row, t.n_depth + t.n_prompt, t.n_gen);
        let gbps = (t.n_gen > 0).then(|| (bytes_per_token as f64 + kv) * avg_ts / 1e9);
        // The prompt path's useful arithmetic: matmuls and attention scores and sums.
        let tflops =
            (t.n_prompt > 0).then(|| prompt_flops_per_token(&engine, t.n_depth, t.n_prompt) * avg_ts / 1e12);
        if !a.json {
            let d = if t.n_depth > 0 { format!(" @ d{}", t.n_depth) } else { String::new() };
            let gb = gbps.map(|g| format!("  {g:.1} GB/s")).unwrap_or_default();
            let gb = gb + &tflops.map(|f| format!("  {f:.1} TFLOP/s")).unwrap_or_default();
            print_out(&format!(
                "{file} | {} | {name}{d} | {avg_ts:.2} ± {sd:.2} tok/s{gb}\n",
                engine.backend_name()
            ));
        }
        rows.push(json!({
            "test": name, "n_prompt": t.n_prompt, "n_gen": t.n_gen, "n_depth": t.n_depth,
            "n_threads": n_threads, "device": engine.backend_name(), "model_filename": file,
            "model_size": model_size, "avg_ts": avg_ts, "stddev_ts": sd, "samples_ts": ts,
            "avg_ns": ns.iter().sum::<u64>() / ns.len() as u64, "samples_ns": ns, "gbps": gbps,
            "tflops": tflops, "type_k": type_k, "type_v": type_v, "kv_bytes_per_token": kv_row,
        }));
    }
    if a.json {
        print_out(&format!("{}\n", serde_json::Value::Array(rows)));
    }
    Ok(())
}

/// One timed run of a test, in nanoseconds (the depth fill is not timed).
fn run_once(engine: &Engine, t: &Test, rng: &mut Lcg) -> kiln::Result<u64> {
    let runner = engine.runner();
    let n_vocab = engine.config().n_vocab;
    let seq = runner.new_seq();
    let result = (|| {
        if t.n_depth > 0 {
            let fill: Vec<Entry> = (0..t.n_depth)
                .map(|i| Entry { seq, token: rng.next(n_vocab), output: i + 1 == t.n_depth })
                .collect();
            runner.decode(&fill, OutputKind::Logits)?;
        }
        let t0 = Instant::now();
        if t.n_prompt > 0 {
            let entries: Vec<Entry> = (0..t.n_prompt)
                .map(|i| Entry { seq, token: rng.next(n_vocab), output: i + 1 == t.n_prompt })
                .collect();
            runner.decode(&entries, OutputKind::Logits)?;
        }
        let mut token = rng.next(n_vocab);
        for _ in 0..t.n_gen {
            // Greedy decoding: only the next id leaves the device.
            let out = runner.decode(&[Entry { seq, token, output: true }], OutputKind::Argmax)?;
            token = out[0] as u32;
        }
        Ok(t0.elapsed().as_nanos() as u64)
    })();
    runner.free_seq(seq);
    result
}

/// The K and V bytes the attention reads in a decode step, averaged over `n_gen` steps
/// after `n_past` positions: every cached key of a layer, or its window's (`kv_row`: a
/// token's bytes in all layers).
fn kv_bytes_per_step(cfg: &kiln::model::ModelConfig, kv_row: usize, n_past: usize, n_gen: usize) -> f64 {
    let row = (kv_row / cfg.n_layer.max(1)) as u64;
    let total: u64 = (n_past..n_past + n_gen)
        .map(|pos| {
            (0..cfg.n_layer)
                .map(|l| {
                    let keys = pos as u64 + 1;
                    match cfg.window(l) {
                        Some(w) => keys.min(w as u64),
                        None => keys,
                    }
                })
                .sum::<u64>()
                * row
        })
        .sum();
    total as f64 / n_gen.max(1) as f64
}

/// Floating-point operations per prompt token: two per weight of every matrix a token
/// passes through (not the output projection, which a prompt applies to its last token),
/// and the attention's scores and weighted sums over the keys it sees (causal: on average
/// half the prompt, plus the depth).
fn prompt_flops_per_token(engine: &Engine, n_depth: usize, n_prompt: usize) -> f64 {
    let cfg = engine.config();
    let weights: u64 = engine
        .gguf()
        .tensors
        .iter()
        .filter(|t| t.name.starts_with("blk."))
        .map(|t| t.rows_cols())
        .filter(|&(rows, _)| rows > 1)
        .map(|(rows, cols)| (rows * cols) as u64)
        .sum();
    let keys = n_depth as f64 + (n_prompt as f64 + 1.0) / 2.0;
    let attn = 4.0 * (cfg.n_head * cfg.head_dim) as f64 * keys * cfg.n_layer as f64;
    2.0 * weights as f64 + attn
}

/// Weight bytes one decode step reads: every tensor, except that an untied `token_embd`
/// contributes one row and routed experts only the `k` of `n_expert` a token uses.
fn weight_bytes_per_token(engine: &Engine) -> u64 {
    let g = engine.gguf();
    let tied = g.tensor("output.weight").is_none();
    g.tensors
        .iter()
        .map(|t| {
            if t.name == "token_embd.weight" && !tied {
                let (rows, _) = t.rows_cols();
                t.size / rows.max(1) as u64
            } else {
                (t.size as f64 * engine.config().active_share(&t.name)) as u64
            }
        })
        .sum()
}
