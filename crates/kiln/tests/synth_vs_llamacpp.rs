//! Architectures and features with no real model at hand (qwen3 q/k norms, granite
//! multipliers, llama-3 rope_freqs, YaRN, gemma3's sliding window, qwen2 biases, the
//! mixtures of experts), checked on synthetic models against llama.cpp on the same files
//! (`scripts/gen-synth-fixtures` regenerates the fixtures; they record llama.cpp's
//! version): next-token logits after a prompt, and for the peaked presets greedy ids and
//! perplexity on a text the model wrote.

mod support;

use kiln::engine::{Engine, EngineOptions};
use kiln::eval::log_softmax_at;
use kiln::gguf::{GgufWriter, Value};
use kiln::model::{synth, Entry, OutputKind};
use support::*;

/// Greedy steps are compared up to kiln's first top-2 margin under this.
const TAU: f32 = 0.05;

/// The engine of `preset` (its file edited by `edit` first), on the CPU.
fn load(preset: &str, tag: &str, edit: impl FnOnce(&mut GgufWriter)) -> Engine {
    let dir = std::env::temp_dir().join(format!("kiln-synth-{}-{preset}-{tag}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(format!("{preset}.gguf"));
    let mut w = synth::preset(preset).unwrap().build().unwrap();
    edit(&mut w);
    w.write_file(&path).unwrap();
    let opts = EngineOptions::default().with_n_ctx(256).with_threads(2);
    let e = Engine::load(path.to_str().unwrap(), opts).unwrap();
    std::fs::remove_dir_all(&dir).ok();
    e
}

fn check(preset: &str) {
    let fx = fixture_json(&format!("synth/{preset}.json"));
    let want: Vec<f32> =
        fx["logits"].as_array().unwrap().iter().map(|x| x.as_f64().unwrap() as f32).collect();
    let prompt = ids(&fx["prompt_ids"]);
    let e = load(preset, "logits", |_| {});
    let r = e.runner();
    let seq = r.new_seq();
    let entries: Vec<Entry> = prompt
        .iter()
        .enumerate()
        .map(|(i, &t)| Entry { seq, token: t, output: i + 1 == prompt.len() })
        .collect();
    let got = r.decode(&entries, OutputKind::Logits).unwrap();
    assert_eq!(got.len(), want.len(), "{preset}: n_vocab");
    let max_abs = got.iter().zip(&want).map(|(a, b)| (a - b).abs()).fold(0.0f32, f32::max);
    let top = kiln::eval::top_k(&want, 20);
    let max_lp = top
        .iter()
        .map(|&(id, _)| (log_softmax_at(&got, id as usize) - log_softmax_at(&want, id as usize)).abs())
        .fold(0.0f64, f64::max);
    eprintln!(
        "{preset}: {} prompt tokens, max |Δ logit| {max_abs:.5}, max |Δ logprob| over top 20 {max_lp:.5}",
        prompt.len()
    );
    if top[0].1 - top[1].1 >= TAU {
        assert_eq!(argmax(&got), top[0].0, "{preset}: argmax");
    }
    // F16 weights with f32 activations on both sides: agreement far inside the real-model
    // tolerances (0.5 logprob); a missing feature moves logits by whole units.
    assert!(max_lp < 0.05 && max_abs < 0.1, "{preset}: max |Δ logit| {max_abs}, |Δ logprob| {max_lp}");
    if fx.get("greedy").is_some() {
        greedy(&e, preset, &fx);
    }
}

/// kiln's greedy continuation (one token a step) against llama.cpp's: the same ids up to
/// a step where kiln's best leads llama.cpp's choice by less than `TAU` (a near-tie, where
/// rounding may pick either; the texts part there).
fn greedy(e: &Engine, preset: &str, fx: &serde_json::Value) {
    let want = ids(&fx["greedy"]);
    let r = e.runner();
    let seq = r.new_seq();
    let prompt = ids(&fx["prompt_ids"]);
    let n = prompt.len();
    let mut entries: Vec<Entry> =
        prompt.iter().enumerate().map(|(i, &token)| Entry { seq, token, output: i + 1 == n }).collect();
    let mut same = 0;
    for &w in &want {
        let logits = r.decode(&entries, OutputKind::Logits).unwrap();
        let best = argmax(&logits);
        if best != w {
            let lead = logits[best as usize] - logits[w as usize];
            assert!(lead < TAU, "{preset}: greedy step {same}: {best}, llama.cpp {w} (lead {lead})");
            break;
        }
        same += 1;
        entries = vec![Entry { seq, token: w, output: true }];
    }
    eprintln!("{preset}: {same} of {} greedy ids identical to llama.cpp's", want.len());
    assert!(same >= want.len() / 2, "{preset}: only {same} greedy steps compared");
}

/// kiln's perplexity on the text the model wrote, and llama-perplexity's.
fn perplexity(e: &Engine, preset: &str) -> (f64, f64) {
    let fx = fixture_json(&format!("synth/{preset}.json"));
    let text = std::fs::read(fixtures().join(format!("synth/{preset}.txt"))).unwrap();
    // A byte vocabulary: each byte is its token.
    let tokens: Vec<u32> = text.iter().map(|&b| b as u32).collect();
    let got = kiln::eval::perplexity(e, &tokens, 128, None).unwrap().ppl;
    (got, fx["perplexity"].as_f64().unwrap())
}

/// Perplexity within 1% of llama-perplexity's, which is far below the vocabulary size (a
/// near-uniform model would prove nothing).
fn check_perplexity(preset: &str) {
    let e = load(preset, "ppl", |_| {});
    let (got, want) = perplexity(&e, preset);
    eprintln!("{preset}: perplexity {got:.4}, llama.cpp {want:.4}");
    assert!(want < e.config().n_vocab as f64 / 10.0, "{preset}: llama.cpp's perplexity {want} is not peaked");
    assert!((got / want - 1.0).abs() < 0.01, "{preset}: perplexity {got}, llama.cpp {want}");
}

macro_rules! synth_tests {
    ($($name:ident: $preset:literal;)*) => {$(
        #[test]
        fn $name() {
            check($preset);
        }
    )*};
}

synth_tests! {
    qwen3_qk_norm: "qwen3-tiny";
    qwen2_qkv_bias: "qwen2-tiny";
    granite_multipliers: "granite-tiny";
    llama3_rope_freqs: "llama3-rope-freqs-tiny";
    llama_yarn: "llama-yarn-tiny";
    gemma3_sliding_window: "gemma3-tiny";
    qwen3moe: "qwen3moe-tiny";
    qwen2moe_shared_expert: "qwen2moe-tiny";
    mixtral: "mixtral-tiny";
    olmoe: "olmoe-tiny";
    granitemoe_shared_expert: "granitemoe-tiny";
}

#[test]
fn perplexity_matches_llama_cpp() {
    for preset in ["qwen3moe-tiny", "qwen2moe-tiny", "mixtral-tiny", "olmoe-tiny", "granitemoe-tiny"] {
        check_perplexity(preset);
    }
}

/// The perplexity fixtures see the experts: routing each token to its top expert only, or
/// dropping the shared expert, moves the perplexity by more than 5%.
#[test]
fn perplexity_depends_on_the_routing() {
    let moved = |preset: &str, tag: &str, edit: &dyn Fn(&mut GgufWriter)| {
        let (full, _) = perplexity(&load(preset, "full", |_| {}), preset);
        let (cut, _) = perplexity(&load(preset, tag, edit), preset);
        eprintln!("{preset}: perplexity {full:.3}, {tag} {cut:.3}");
        assert!((cut / full - 1.0).abs() > 0.05, "{preset}: {tag} moved perplexity {full} -> {cut}");
    };
    for (preset, arch) in
        [("qwen3moe-tiny", "qwen3moe"), ("qwen2moe-tiny", "qwen2moe"), ("olmoe-tiny", "olmoe")]
    {
        moved(preset, "top-1", &|w| {
            w.set(format!("{arch}.expert_used_count"), Value::U32(1));
        });
    }
    moved("granitemoe-tiny", "no shared expert", &|w| {
        w.set("granitemoe.expert_shared_feed_forward_length", Value::U32(0));
    });
}
