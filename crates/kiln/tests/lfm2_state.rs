//! LFM2's convolution state (synthetic `lfm2-tiny`, and `lfm2moe-tiny` with experts):
//! greedy ids equal llama.cpp's (recorded by scripts/gen-synth-fixtures), and every way
//! kiln manages a sequence carries the state: prompts split into micro-batches, a session
//! saved and restored, a prefix-cache hit, truncation to a common prefix, sequences batched
//! together in one decode. Each gives the same greedy tokens as the uninterrupted run, and
//! the GPU (lavapipe in CI) gives the CPU's.

mod support;

use std::ops::ControlFlow;

use kiln::model::{synth, Entry, OutputKind};
use kiln::sample::SamplerParams;
use kiln::{Engine, EngineOptions, GenerateOptions, SessionOptions};
use support::*;

const N_GEN: usize = 40;

/// The presets with short convolutions.
const PRESETS: [&str; 2] = ["lfm2-tiny", "lfm2moe-tiny"];

fn engine(preset: &str, opts: EngineOptions) -> Engine {
    let dir = std::env::temp_dir().join(format!(
        "kiln-lfm2-{}-{:?}",
        std::process::id(),
        std::thread::current().id()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(format!("{preset}.gguf"));
    synth::preset(preset).unwrap().build().unwrap().write_file(&path).unwrap();
    let e = Engine::load(path.to_str().unwrap(), opts.with_n_ctx(256).with_threads(2)).unwrap();
    e.model_sha256().unwrap(); // read now (sessions are saved bound to it), kept by the engine
    std::fs::remove_dir_all(&dir).ok();
    e
}

fn greedy() -> GenerateOptions {
    GenerateOptions::default()
        .with_sampler(SamplerParams::greedy())
        .with_max_tokens(N_GEN)
        .with_ignore_eos(true)
}

/// The prompt of the preset's fixture, and llama.cpp's greedy continuation of it.
fn fixture(preset: &str) -> (Vec<u32>, Vec<u32>) {
    let fx = fixture_json(&format!("synth/{preset}.json"));
    (ids(&fx["prompt_ids"]), ids(&fx["greedy"]))
}

/// Greedy ids after `prompt` in a fresh session.
fn generate(e: &Engine, prompt: &[u32]) -> Vec<u32> {
    let mut s = e.session(SessionOptions::default()).unwrap();
    s.append_tokens(prompt).unwrap();
    s.generate(&greedy(), |_| ControlFlow::Continue(())).unwrap().ids
}

#[test]
fn greedy_matches_llama_cpp_and_micro_batches() {
    for preset in PRESETS {
        let (prompt, want) = fixture(preset);
        let base = generate(&engine(preset, EngineOptions::default()), &prompt);
        let n = want.len().min(N_GEN);
        assert_eq!(base[..n], want[..n], "{preset}: greedy ids vs llama.cpp");
        // The prompt in micro-batches of 5 and 1: the state crosses every boundary.
        for batch in [5, 1] {
            assert_eq!(
                generate(&engine(preset, EngineOptions::default().with_batch(batch)), &prompt),
                base,
                "{preset}: -b {batch}"
            );
        }
    }
}

#[test]
fn save_restore_prefix_cache_and_truncation_keep_the_state() {
    for preset in PRESETS {
        save_restore_prefix_cache_and_truncation(preset);
    }
}

fn save_restore_prefix_cache_and_truncation(preset: &str) {
    let (prompt, _) = fixture(preset);
    let e = engine(preset, EngineOptions::default().with_n_seq(4));
    let base = generate(&e, &prompt);
    // A long conversation (prompt + generated, over two blocks), saved and restored into
    // a new session of the same engine: its whole blocks come from the prefix cache.
    let mut long = prompt.clone();
    long.extend(&base);
    let mut s = e.session(SessionOptions::default()).unwrap();
    s.append_tokens(&long).unwrap();
    let cont = s.generate(&greedy(), |_| ControlFlow::Continue(())).unwrap().ids;
    let path = std::env::temp_dir().join(format!("kiln-lfm2-session-{}.json", std::process::id()));
    s.save(&path).unwrap();
    let mut r = e.session(SessionOptions::default()).unwrap();
    r.restore(&path).unwrap();
    std::fs::remove_file(&path).ok();
    assert!(r.n_evaluated() < long.len() + cont.len(), "the restore reused cached blocks");
    let after_restore = r.generate(&greedy(), |_| ControlFlow::Continue(())).unwrap().ids;
    let mut whole = long.clone();
    whole.extend(&cont);
    let fresh = generate(&engine(preset, EngineOptions::default().with_prefix_cache_tokens(0)), &whole);
    assert_eq!(after_restore, fresh, "{preset}: restored session vs one uninterrupted run");

    // Own-prefix reuse diverging inside a block: the sequence keeps its whole blocks
    // only (the state inside a block is gone), and the rest evaluates exactly.
    let e = engine(preset, EngineOptions::default().with_prefix_cache_tokens(0));
    let r = e.runner();
    let seq = r.new_seq();
    let entries: Vec<Entry> = long.iter().map(|&token| Entry { seq, token, output: false }).collect();
    r.decode(&entries, OutputKind::Logits).unwrap();
    let mut other = long[..long.len() - 7].to_vec();
    other.extend(&prompt[..5]);
    let kept = r.reuse_prefix(seq, &other, None);
    assert!(kept % 32 == 0 && kept > 0 && kept < long.len() - 7, "{preset}: kept {kept}");
    let rest: Vec<Entry> = other[kept..]
        .iter()
        .enumerate()
        .map(|(i, &token)| Entry { seq, token, output: kept + i + 1 == other.len() })
        .collect();
    let got = r.decode(&rest, OutputKind::Logits).unwrap();
    r.free_seq(seq);
    let seq = r.new_seq();
    let all: Vec<Entry> = other
        .iter()
        .enumerate()
        .map(|(i, &token)| Entry { seq, token, output: i + 1 == other.len() })
        .collect();
    assert_eq!(got, r.decode(&all, OutputKind::Logits).unwrap(), "{preset}");
}

#[test]
fn sequences_batched_together_match_alone() {
    for preset in PRESETS {
        batched_match_alone(preset, &engine(preset, EngineOptions::default().with_n_seq(3)));
    }
}

/// On the GPU: greedy ids (the device's greedy look-ahead, which records a step ahead and
/// may drop it, over the state's alternate slots) equal the CPU's, in micro-batches of 5
/// too; sequences batched together match each alone.
#[cfg(feature = "gpu")]
#[test]
fn the_gpu_gives_the_cpus_greedy_ids() {
    use kiln::engine::Device;
    for preset in PRESETS {
        let (prompt, _) = fixture(preset);
        let cpu = generate(&engine(preset, EngineOptions::default()), &prompt);
        let gpu = EngineOptions::default().with_device(Device::Gpu).with_batch_invariant(true);
        let e = engine(preset, gpu.clone().with_n_seq(3));
        assert!(e.backend_name().starts_with("gpu"), "{}", e.backend_name());
        assert_eq!(generate(&e, &prompt), cpu, "{preset}: GPU vs CPU");
        assert_eq!(generate(&engine(preset, gpu.with_batch(5)), &prompt), cpu, "{preset}: GPU -b 5 vs CPU");
        batched_match_alone(preset, &e);
    }
}

/// Three sequences' prompts and greedy steps in one decode each give what each gives alone.
fn batched_match_alone(preset: &str, e: &Engine) {
    let (prompt, _) = fixture(preset);
    let r = e.runner();
    let prompts = [prompt.clone(), prompt[3..].to_vec(), prompt[..20].to_vec()];
    // Each alone: greedy steps of one sequence.
    let alone: Vec<Vec<u32>> = prompts.iter().map(|p| generate(e, p)).collect();
    // All three at once: prompts then every step in one decode call.
    let seqs: Vec<_> = prompts.iter().map(|_| r.new_seq()).collect();
    let mut entries = Vec::new();
    for (&seq, p) in seqs.iter().zip(&prompts) {
        entries.extend(p.iter().enumerate().map(|(i, &token)| Entry {
            seq,
            token,
            output: i + 1 == p.len(),
        }));
    }
    let mut got: Vec<Vec<u32>> = vec![Vec::new(); 3];
    let mut out = r.decode(&entries, OutputKind::Logits).unwrap();
    for _ in 0..N_GEN {
        let n_vocab = e.config().n_vocab;
        let next: Vec<u32> = out.chunks_exact(n_vocab).map(argmax).collect();
        for (g, &t) in got.iter_mut().zip(&next) {
            g.push(t);
        }
        let step: Vec<Entry> =
            seqs.iter().zip(&next).map(|(&seq, &token)| Entry { seq, token, output: true }).collect();
        out = r.decode(&step, OutputKind::Logits).unwrap();
    }
    for seq in seqs {
        r.free_seq(seq);
    }
    assert_eq!(got, alone, "{preset}");
}

#[test]
fn context_shift_is_an_explicit_error() {
    let (prompt, _) = fixture("lfm2-tiny");
    let e = engine("lfm2-tiny", EngineOptions::default());
    let r = e.runner();
    let seq = r.new_seq();
    let entries: Vec<Entry> = prompt.iter().map(|&token| Entry { seq, token, output: false }).collect();
    r.decode(&entries, OutputKind::Logits).unwrap();
    let err = r.shift_seq(seq, 4, 8).unwrap_err().to_string();
    assert!(err.contains("convolution"), "{err}");
    assert_eq!(r.seq_len(seq), prompt.len());
}
