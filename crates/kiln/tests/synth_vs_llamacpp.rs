//! Architectures and features with no real model at hand (qwen3 q/k norms, granite
//! multipliers, llama-3 rope_freqs, YaRN, gemma3's sliding window, qwen2 biases, the
//! mixtures of experts, phi3, gemma2, olmo2, smollm3, mistral3, LFM2's short
//! convolutions and LFM2-MoE's biased routing), checked on synthetic models against llama.cpp on the same files
//! (`scripts/gen-synth-fixtures` regenerates the fixtures; they record llama.cpp's
//! version): next-token logits after a prompt, and for the peaked presets greedy ids and
//! perplexity on a text the model wrote.

mod support;

use kiln::engine::{Device, Engine, EngineOptions};
use kiln::eval::log_softmax_at;
use kiln::gguf::{GgufWriter, Value};
use kiln::model::{synth, Entry, OutputKind};
use support::*;

/// Greedy steps are compared up to kiln's first top-2 margin under this.
const TAU: f32 = 0.05;

/// The engine of `preset` (its file edited by `edit` first), on the CPU.
fn load(preset: &str, tag: &str, edit: impl FnOnce(&mut GgufWriter)) -> Engine {
    load_on(preset, tag, Device::Cpu, edit)
}

/// [`load`] on `device`.
fn load_on(preset: &str, tag: &str, device: Device, edit: impl FnOnce(&mut GgufWriter)) -> Engine {
    load_spec(synth::preset(preset).unwrap(), preset, tag, device, edit)
}

/// The engine of the model `spec` writes (edited by `edit` first).
fn load_spec(
    spec: synth::SynthSpec,
    preset: &str,
    tag: &str,
    device: Device,
    edit: impl FnOnce(&mut GgufWriter),
) -> Engine {
    let dir =
        std::env::temp_dir().join(format!("kiln-synth-{}-{preset}-{tag}-{device:?}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(format!("{preset}.gguf"));
    let mut w = spec.build().unwrap();
    edit(&mut w);
    w.write_file(&path).unwrap();
    let opts = EngineOptions::default().with_n_ctx(256).with_threads(2).with_device(device);
    let e = Engine::load(path.to_str().unwrap(), opts).unwrap();
    std::fs::remove_dir_all(&dir).ok();
    e
}

fn check(preset: &str) {
    check_on(preset, Device::Cpu)
}

fn check_on(preset: &str, device: Device) {
    let fx = fixture_json(&format!("synth/{preset}.json"));
    let want = fixture_logits(&fx);
    let prompt = ids(&fx["prompt_ids"]);
    let e = load_on(preset, "logits", device, |_| {});
    let got = prompt_logits(&e, &prompt);
    assert_eq!(got.len(), want.len(), "{preset}: n_vocab");
    let max_abs = max_abs_diff(&got, &want);
    let top = kiln::eval::top_k(&want, 20);
    let max_lp = top
        .iter()
        .map(|&(id, _)| (log_softmax_at(&got, id as usize) - log_softmax_at(&want, id as usize)).abs())
        .fold(0.0f64, f64::max);
    eprintln!(
        "{preset} on {}: {} prompt tokens, max |Δ logit| {max_abs:.5}, max |Δ logprob| over top 20 {max_lp:.5}",
        e.backend_name(),
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

/// llama.cpp's next-token logits after the prompt of `fx`.
fn fixture_logits(fx: &serde_json::Value) -> Vec<f32> {
    fx["logits"].as_array().unwrap().iter().map(|x| x.as_f64().unwrap() as f32).collect()
}

/// kiln's next-token logits after `prompt`, in one micro-batch.
fn prompt_logits(e: &Engine, prompt: &[u32]) -> Vec<f32> {
    let r = e.runner();
    let seq = r.new_seq();
    let entries: Vec<Entry> = prompt
        .iter()
        .enumerate()
        .map(|(i, &t)| Entry { seq, token: t, output: i + 1 == prompt.len() })
        .collect();
    r.decode(&entries, OutputKind::Logits).unwrap()
}

fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(a, b)| (a - b).abs()).fold(0.0f32, f32::max)
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
    phi3_fused_longrope: "phi3-tiny";
    phi3_longrope_long_factors: "phi3-long-tiny";
    gemma2_softcap: "gemma2-tiny";
    olmo2_post_norms: "olmo2-tiny";
    smollm3_nope_layers: "smollm3-tiny";
    mistral3_temperature: "mistral3-tiny";
    lfm2_short_conv: "lfm2-tiny";
    lfm2moe_selection_bias: "lfm2moe-tiny";
}

/// The mixtures of experts on the GPU (lavapipe in CI): the same bars against llama.cpp.
#[cfg(feature = "gpu")]
#[test]
fn moe_presets_on_the_gpu() {
    for preset in peaked(true) {
        check_on(preset, Device::Gpu);
    }
}

#[test]
fn perplexity_matches_llama_cpp() {
    for preset in synth::peaked_presets() {
        check_perplexity(preset);
    }
}

/// The perplexity fixtures see the experts: routing each token to its top expert only,
/// dropping the shared expert, or routing without the selection bias, moves the perplexity
/// by more than 5%.
#[test]
fn perplexity_depends_on_the_routing() {
    let moved = |preset: &str, tag: &str, edit: &dyn Fn(&mut GgufWriter)| {
        let (full, _) = perplexity(&load(preset, "full", |_| {}), preset);
        let (cut, _) = perplexity(&load(preset, tag, edit), preset);
        eprintln!("{preset}: perplexity {full:.3}, {tag} {cut:.3}");
        assert!((cut / full - 1.0).abs() > 0.05, "{preset}: {tag} moved perplexity {full} -> {cut}");
    };
    for (preset, arch) in [
        ("qwen3moe-tiny", "qwen3moe"),
        ("qwen2moe-tiny", "qwen2moe"),
        ("olmoe-tiny", "olmoe"),
        ("lfm2moe-tiny", "lfm2moe"),
    ] {
        moved(preset, "top-1", &|w| {
            w.set(format!("{arch}.expert_used_count"), Value::U32(1));
        });
    }
    moved("granitemoe-tiny", "no shared expert", &|w| {
        w.set("granitemoe.expert_shared_feed_forward_length", Value::U32(0));
    });
    // lfm2moe-tiny: experts in layers 1 to 3 of 4.
    moved("lfm2moe-tiny", "no selection bias", &|w| {
        for il in 1..4 {
            let name = format!("blk.{il}.exp_probs_b.bias");
            assert!(w.remove_tensor(&name));
            w.add_f32(&name, &[8], &[0.0; 8]).unwrap();
        }
    });
}

/// The peaked presets with experts (`moe`), or without: the dense architectures added with
/// the mixtures of experts.
fn peaked(moe: bool) -> impl Iterator<Item = &'static str> {
    synth::peaked_presets().filter(move |p| synth::preset(p).unwrap().experts.is_some() == moe)
}

/// The dense presets exercise what sets their architecture apart: without it (the file
/// edited, or read as plain llama), kiln's logits lie more than 0.5 from llama.cpp's, five
/// times what the parity tests allow.
#[test]
fn dense_features_matter() {
    let moved = |preset: &str, tag: &str, spec: synth::SynthSpec, edit: &dyn Fn(&mut GgufWriter)| {
        let fx = fixture_json(&format!("synth/{preset}.json"));
        let e = load_spec(spec, preset, tag, Device::Cpu, edit);
        let d = max_abs_diff(&prompt_logits(&e, &ids(&fx["prompt_ids"])), &fixture_logits(&fx));
        eprintln!("{preset}, {tag}: max |Δ logit| {d:.3} from llama.cpp's");
        assert!(d > 0.5, "{preset}: {tag} moved the logits by only {d}");
    };
    let edited = |preset: &str, tag: &str, key: &str, v: Value| {
        moved(preset, tag, synth::preset(preset).unwrap(), &|w| {
            w.set(key, v.clone());
        })
    };
    edited("gemma2-tiny", "no attention soft-capping", "gemma2.attn_logit_softcapping", Value::F32(1e9));
    edited("gemma2-tiny", "no final soft-capping", "gemma2.final_logit_softcapping", Value::F32(1e9));
    edited("gemma2-tiny", "no sliding window", "gemma2.attention.sliding_window", Value::U32(1 << 20));
    edited("olmo2-tiny", "no sliding window", "olmo2.attention.sliding_window", Value::U32(0));
    edited("mistral3-tiny", "no temperature", "mistral3.attention.temperature_scale", Value::F32(0.0));
    // The LongRoPE factor sets swapped: the original context past, or beyond, the prompt.
    edited("phi3-tiny", "long factors", "phi3.rope.scaling.original_context_length", Value::U32(32));
    edited("phi3-long-tiny", "short factors", "phi3.rope.scaling.original_context_length", Value::U32(256));
    // RoPE on every layer: the same weights read as llama.
    let llama = synth::SynthSpec { arch: "llama".into(), ..synth::preset("smollm3-tiny").unwrap() };
    moved("smollm3-tiny", "RoPE on every layer", llama, &|_| {});
}

/// LFM2's short convolutions on the GPU (lavapipe in CI): the same bars against llama.cpp.
#[cfg(feature = "gpu")]
#[test]
fn lfm2_on_the_gpu() {
    check_on("lfm2-tiny", Device::Gpu);
}

/// The dense presets on the GPU (lavapipe in CI): the same logits and greedy ids as on the
/// CPU, against llama.cpp's.
#[cfg(feature = "gpu")]
#[test]
fn dense_presets_on_the_gpu() {
    for preset in ["qwen3-tiny", "llama-yarn-tiny", "gemma3-tiny"].into_iter().chain(peaked(false)) {
        check_on(preset, Device::Gpu);
    }
}
