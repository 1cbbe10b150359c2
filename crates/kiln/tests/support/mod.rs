//! Shared helpers of the integration tests: real models from the cache, fixtures, tiers,
//! batch-invariance runs, a generator of random rows.
#![allow(dead_code)]

use std::path::PathBuf;

#[path = "../common/rng.rs"]
pub mod rng;
#[allow(unused_imports)]
pub use rng::nmse;

/// `KILN_FULL=1` runs the slow tier (the 1.5B model, long contexts).
pub fn full() -> bool {
    std::env::var("KILN_FULL").is_ok_and(|v| v == "1")
}

/// A catalog model, fetched into the cache on first use (CI pulls them beforehand).
pub fn model(name: &str) -> PathBuf {
    kiln::hub::resolve_model(name).unwrap_or_else(|e| panic!("model {name}: {e}"))
}

pub fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures")
}

pub fn fixture_json(rel: &str) -> serde_json::Value {
    let p = fixtures().join(rel);
    let s = std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    serde_json::from_str(&s).unwrap()
}

/// The catalog name and oracle stem of each real model, and its tolerance class.
pub struct RealModel {
    pub name: &'static str,
    pub stem: &'static str,
    pub gemma: bool,
    pub slow: bool,
}

pub const SMOLLM2: RealModel =
    RealModel { name: "smollm2-135m", stem: "SmolLM2-135M-Instruct.Q4_1", gemma: false, slow: false };
pub const GEMMA3: RealModel =
    RealModel { name: "gemma3-270m", stem: "gemma-3-270m-q4_k_m", gemma: true, slow: false };
pub const QWEN05: RealModel = RealModel {
    name: "qwen2.5-coder-0.5b",
    stem: "qwen2.5-coder-0.5b-instruct-q4_k_m",
    gemma: false,
    slow: false,
};
pub const QWEN15: RealModel = RealModel {
    name: "qwen2.5-coder-1.5b",
    stem: "qwen2.5-coder-1.5b-instruct-q4_k_m",
    gemma: false,
    slow: true,
};

impl RealModel {
    /// False (with a note) when the model belongs to the slow tier and it is not enabled.
    pub fn enabled(&self) -> bool {
        if self.slow && !full() {
            eprintln!("skipping {}: slow tier, set KILN_FULL=1", self.name);
            return false;
        }
        true
    }

    /// The oracle's near-tie threshold for this model.
    pub fn tau(&self) -> f32 {
        if self.gemma {
            0.5
        } else {
            0.3
        }
    }
}

pub fn argmax(v: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &x) in v.iter().enumerate() {
        if x > v[best] {
            best = i;
        }
    }
    best as u32
}

pub fn ids(v: &serde_json::Value) -> Vec<u32> {
    v.as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect()
}

/// Greedy generation through a session of `e` (incremental decode) gives llama.cpp's
/// oracle ids up to its first near-tie, at most `cap` steps per case.
pub fn session_greedy_matches_oracle(e: &kiln::engine::Engine, m: &RealModel, cap: usize) {
    use kiln::sample::SamplerParams;
    use kiln::session::{GenerateOptions, SessionOptions};
    let oracle = fixture_json(&format!("oracle/{}/greedy.json", m.stem));
    for case in oracle["cases"].as_array().unwrap() {
        let prompt = ids(&case["prompt_ids"]);
        let want = ids(&case["ids"]);
        let margins: Vec<f32> =
            case["margins"].as_array().unwrap().iter().map(|x| x.as_f64().unwrap() as f32).collect();
        let n = margins.iter().position(|&x| x < m.tau()).unwrap_or(want.len()).min(cap);
        let mut s = e.session(SessionOptions::default()).unwrap();
        s.append_tokens(&prompt).unwrap();
        let opts = GenerateOptions::default()
            .with_max_tokens(n)
            .with_sampler(SamplerParams::greedy())
            .with_ignore_eos(true);
        let got = s.generate(&opts, |_| std::ops::ControlFlow::Continue(())).unwrap().ids;
        let what = e.backend_name();
        assert_eq!(got[..n], want[..n], "{:?} on {what}: greedy ids differ from llama.cpp's", case["prompt"]);
        eprintln!("  {:?}: {n} greedy ids identical to llama.cpp's", case["prompt"].as_str().unwrap());
    }
}

/// The relative distance of kiln's perplexity `got` from llama.cpp's `want`, printed with
/// both under `label`.
pub fn ppl_vs_llama_cpp(label: &str, got: f64, want: f64) -> f64 {
    eprintln!("{label}: kiln {got:.4}, llama.cpp {want:.4} ({:+.2}%)", 100.0 * (got - want) / want);
    (got - want).abs() / want
}

/// `n` token ids spread over the vocabulary (below 20100, and below `n_vocab`).
pub fn spread_tokens(n: usize, n_vocab: usize) -> Vec<u32> {
    (0..n as u32).map(|i| (100 + (i * 7919) % 20000) % n_vocab as u32).collect()
}

/// Logits after the last of `spread_tokens` fed in chunks of `sizes` (their sum the prompt's
/// length), with tokens of another sequence decoded in the same batches where `noise`.
pub fn last_logits(e: &kiln::engine::Engine, sizes: &[usize], noise: bool) -> Vec<f32> {
    use kiln::model::{Entry, OutputKind};
    let r = e.runner();
    let toks = spread_tokens(sizes.iter().sum(), e.config().n_vocab);
    let (seq, other) = (r.new_seq(), r.new_seq());
    let mut at = 0;
    let mut out = Vec::new();
    for &n in sizes {
        let mut entries: Vec<Entry> = Vec::new();
        if noise {
            // Neighbours first, so our rows sit at other offsets of the batch.
            entries.extend((0..3).map(|i| Entry { seq: other, token: 5 + i, output: false }));
        }
        entries.extend((at..at + n).map(|i| Entry { seq, token: toks[i], output: true }));
        // Every row is an output, so the logits matmul runs as a GEMM too; keep the last.
        let all = r.decode(&entries, OutputKind::Logits).unwrap();
        out = all[all.len() - e.config().n_vocab..].to_vec();
        at += n;
    }
    r.free_seq(seq);
    r.free_seq(other);
    out
}

/// How many values of `a` and `b` differ in their bits.
pub fn bits_differ(a: &[f32], b: &[f32]) -> usize {
    a.iter().zip(b).filter(|(a, b)| a.to_bits() != b.to_bits()).count()
}

/// A context-shift fixture (scripts/gen-shift-fixture.sh): greedy generation of
/// `n_predict` tokens after `prompt` in a session of `e` that keeps `n_keep` tokens
/// through its shifts gives llama-completion's `completion`.
pub fn shifted_completion_matches(e: &kiln::engine::Engine, fx: &serde_json::Value) {
    use kiln::sample::SamplerParams;
    use kiln::session::{GenerateOptions, SessionOptions};
    let opts = SessionOptions::default().with_context_shift(fx["n_keep"].as_u64().unwrap() as usize);
    let mut s = e.session(opts).unwrap();
    s.append_text(fx["prompt"].as_str().unwrap()).unwrap();
    let n = fx["n_predict"].as_u64().unwrap() as usize;
    let greedy = GenerateOptions::default()
        .with_sampler(SamplerParams::greedy())
        .with_max_tokens(n)
        .with_ignore_eos(true);
    let mut text = String::new();
    s.generate(&greedy, |ev| {
        text.push_str(ev.text);
        std::ops::ControlFlow::Continue(())
    })
    .unwrap();
    let want = fx["completion"].as_str().unwrap();
    let same = text.chars().zip(want.chars()).take_while(|(a, b)| a == b).count();
    assert_eq!(text, want, "differs after {same} chars");
}

/// A small deterministic generator (xorshift64*) for random rows.
pub struct Rng(pub u64);
impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// Roughly normal (a sum of uniforms), scaled.
    pub fn normal(&mut self, scale: f32) -> f32 {
        let s: f32 = (0..4).map(|_| (self.next() >> 40) as f32 / (1u64 << 24) as f32).sum();
        (s - 2.0) * 1.7 * scale
    }
}

/// Top token and its margin over the runner-up.
pub fn top2(l: &[f32]) -> (u32, f32) {
    let (mut i1, mut v1, mut v2) = (0, f32::NEG_INFINITY, f32::NEG_INFINITY);
    for (i, &v) in l.iter().enumerate() {
        if v > v1 {
            (v2, v1, i1) = (v1, v, i);
        } else if v > v2 {
            v2 = v;
        }
    }
    (i1 as u32, v1 - v2)
}
