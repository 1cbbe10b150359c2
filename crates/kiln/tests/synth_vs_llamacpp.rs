//! Architecture features with no real model at hand (qwen3 q/k norms, granite multipliers,
//! llama-3 rope_freqs, YaRN, gemma3's sliding window, qwen2 biases), checked on synthetic
//! models against llama.cpp's logits on the same files (`scripts/gen-synth-fixtures`
//! regenerates the fixtures; they record llama.cpp's version).

mod support;

use kiln::engine::{Engine, EngineOptions};
use kiln::eval::log_softmax_at;
use kiln::model::{synth, Entry, OutputKind};
use support::*;

fn check(preset: &str) {
    let fx = fixture_json(&format!("synth/{preset}.json"));
    let want: Vec<f32> =
        fx["logits"].as_array().unwrap().iter().map(|x| x.as_f64().unwrap() as f32).collect();
    let prompt = ids(&fx["prompt_ids"]);
    let dir = std::env::temp_dir().join(format!("kiln-synth-{}-{preset}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(format!("{preset}.gguf"));
    synth::preset(preset).unwrap().build().unwrap().write_file(&path).unwrap();
    let e = Engine::load(path.to_str().unwrap(), EngineOptions::default().with_n_ctx(256).with_threads(2))
        .unwrap();
    let r = e.runner();
    let seq = r.new_seq();
    let entries: Vec<Entry> = prompt
        .iter()
        .enumerate()
        .map(|(i, &t)| Entry { seq, token: t, output: i + 1 == prompt.len() })
        .collect();
    let got = r.decode(&entries, OutputKind::Logits).unwrap();
    std::fs::remove_dir_all(&dir).ok();
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
    if top[0].1 - top[1].1 >= 0.05 {
        assert_eq!(argmax(&got), top[0].0, "{preset}: argmax");
    }
    // F16 weights with f32 activations on both sides: agreement far inside the real-model
    // tolerances (0.5 logprob); a missing feature moves logits by whole units.
    assert!(max_lp < 0.05 && max_abs < 0.1, "{preset}: max |Δ logit| {max_abs}, |Δ logprob| {max_lp}");
}

#[test]
fn qwen3_qk_norm() {
    check("qwen3-tiny");
}
#[test]
fn qwen2_qkv_bias() {
    check("qwen2-tiny");
}
#[test]
fn granite_multipliers() {
    check("granite-tiny");
}
#[test]
fn llama3_rope_freqs() {
    check("llama3-rope-freqs-tiny");
}
#[test]
fn llama_yarn() {
    check("llama-yarn-tiny");
}
#[test]
fn gemma3_sliding_window() {
    check("gemma3-tiny");
}
#[test]
fn qwen3moe() {
    check("qwen3moe-tiny");
}
#[test]
fn qwen2moe_shared_expert() {
    check("qwen2moe-tiny");
}
#[test]
fn mixtral() {
    check("mixtral-tiny");
}
#[test]
fn olmoe() {
    check("olmoe-tiny");
}
#[test]
fn granitemoe_shared_expert() {
    check("granitemoe-tiny");
}
