//! Batch invariance of the CPU backend (DESIGN.md): a token's logits must not depend on
//! how many tokens, or which other sequences, share its forward pass — bit for bit.

mod support;

use kiln::engine::{Engine, EngineOptions};
use kiln::model::synth;
use kiln::AttnArith;
use support::*;

const N: usize = 72;

#[test]
fn smollm2_logits_do_not_depend_on_the_batch() {
    check(SMOLLM2.name, AttnArith::Ggml);
}

/// The default attention past its first chunk of keys (256 positions), where it turns to
/// f32: a prompt of 300 tokens in batches against one token at a time.
#[test]
fn smollm2_default_attention_past_one_chunk_does_not_depend_on_the_batch() {
    let opts = EngineOptions::default().with_n_ctx(512).with_batch(128).with_n_seq(2).with_threads(2);
    let e = Engine::load(model(SMOLLM2.name).to_str().unwrap(), opts).unwrap();
    let alone = last_logits(&e, &[1; 300], false);
    for sizes in [vec![100, 100, 100], vec![120, 125, 12, 43]] {
        let got = last_logits(&e, &sizes, true);
        let diff = bits_differ(&alone, &got);
        assert_eq!(diff, 0, "batches {sizes:?}: {diff} logits differ from the token-by-token run");
    }
}

/// The opt-in f32 attention: its key blocks are aligned to positions, not to batches.
#[test]
fn smollm2_f32_attention_logits_do_not_depend_on_the_batch() {
    check(SMOLLM2.name, AttnArith::F32);
}

/// Q4_K and Q5_0 weights: batches of 16 tokens and more take the AMX Q4_K kernel where the
/// CPU has one, smaller ones and single tokens the VNNI kernels.
#[test]
fn qwen05_logits_do_not_depend_on_the_batch() {
    check(QWEN05.name, AttnArith::Ggml);
}

/// The peaked synthetic presets, of the architectures with no real model at hand (their
/// logits against llama.cpp's in `synth_vs_llamacpp.rs`): the dense ones past their sliding
/// windows (8) and mistral3's temperature floor (16), and the mixtures of experts, whose
/// tokens in a batch share experts.
#[test]
fn synthetic_architectures_do_not_depend_on_the_batch() {
    let presets: Vec<_> = synth::peaked_presets().collect();
    assert!(presets.len() > 10, "peaked presets: {presets:?}");
    for preset in presets {
        let dir = std::env::temp_dir().join(format!("kiln-invariance-{}-{preset}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(format!("{preset}.gguf"));
        synth::preset(preset).unwrap().build().unwrap().write_file(&path).unwrap();
        let e = Engine::load(path.to_str().unwrap(), options(AttnArith::Ggml)).unwrap();
        std::fs::remove_dir_all(&dir).ok();
        check_engine(&e, preset);
    }
}

fn options(arith: AttnArith) -> EngineOptions {
    let opts = EngineOptions::default().with_n_ctx(256).with_batch(128).with_n_seq(2).with_threads(2);
    opts.with_attn_arith(arith)
}

fn check(name: &str, arith: AttnArith) {
    let e = Engine::load(model(name).to_str().unwrap(), options(arith)).unwrap();
    check_engine(&e, name);
}

/// The last logits of a 72-token prompt fed one token at a time, and in batches of
/// several sizes alone and beside another sequence.
fn check_engine(e: &Engine, name: &str) {
    // Alone: one token at a time.
    let alone = last_logits(e, &[1; N], false);
    assert_eq!(alone.len(), e.config().n_vocab);
    for (what, sizes, noise) in [
        ("batches of 7", vec![7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 2], false),
        ("batches of 32", vec![8, 32, 32], false),
        ("a batch of 64", vec![8, 64], false),
        ("one batch of 72", vec![N], false),
        ("batches of 7 beside another sequence", vec![2, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7], true),
        ("batches of 32 beside another sequence", vec![8, 32, 32], true),
    ] {
        let got = last_logits(e, &sizes, noise);
        let diff = bits_differ(&alone, &got);
        assert_eq!(diff, 0, "{name}, {what}: {diff} logits differ from the token-by-token run");
    }
}
