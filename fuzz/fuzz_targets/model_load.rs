//! A model's configuration as a file could state it, against the weights it carries: a
//! valid tiny model (one of the synthetic presets, picked by the first byte) with
//! metadata values overwritten by the rest of the input, then loaded (configuration,
//! weight binding) and run on a prompt and two decode steps. Each step must give Ok or a
//! clear error, never panic: odd head counts, head sizes, rope dimensions, windows, scales
//! and NaN or huge values that the weights' shapes happen to allow reach the forward.

#![no_main]

use std::sync::Arc;

use kiln::backend::cpu::CpuBackend;
use kiln::gguf::{GgufFile, Value};
use kiln::model::synth::{preset, SynthSpec};
use kiln::model::{Entry, Model, ModelRunner, OutputKind, Runner};
use libfuzzer_sys::fuzz_target;

const PRESETS: [&str; 9] = [
    "qwen3-tiny",
    "qwen2-tiny",
    "granite-tiny",
    "llama3-rope-freqs-tiny",
    "llama-yarn-tiny",
    "gemma3-tiny",
    "qwen2moe-tiny",
    "lfm2-tiny",
    "lfm2moe-tiny",
];

/// Keys an edit may overwrite: `{arch}.` + these, then the global ones.
const ARCH_KEYS: [&str; 29] = [
    "block_count",
    "embedding_length",
    "feed_forward_length",
    "attention.head_count",
    "attention.head_count_kv",
    "attention.key_length",
    "attention.value_length",
    "attention.layer_norm_rms_epsilon",
    "attention.sliding_window",
    "attention.sliding_window_pattern",
    "attention.scale",
    "rope.dimension_count",
    "rope.freq_base",
    "rope.scaling.type",
    "rope.scaling.factor",
    "rope.scaling.original_context_length",
    "context_length",
    "embedding_scale",
    "residual_scale",
    "logit_scale",
    "final_logit_softcapping",
    "vocab_size",
    "expert_count",
    "expert_used_count",
    "expert_feed_forward_length",
    "expert_gating_func",
    "expert_weights_norm",
    "leading_dense_block_count",
    "shortconv.l_cache",
];
const ARCHES: [&str; 8] = ["llama", "qwen2", "qwen3", "gemma3", "granite", "lfm2", "qwen2moe", "lfm2moe"];

fuzz_target!(|data: &[u8]| {
    let Some((&sel, edits)) = data.split_first() else { return };
    let spec = match sel as usize % (PRESETS.len() + 1) {
        0 => SynthSpec::default(),
        i => preset(PRESETS[i - 1]).expect("preset"),
    };
    let arch = spec.arch.clone();
    let mut w = spec.build().expect("a preset builds");
    // Each edit: a key, a value kind, four value bytes.
    for e in edits.chunks_exact(6) {
        let v = u32::from_le_bytes([e[2], e[3], e[4], e[5]]);
        let value = match e[1] % 5 {
            0 => Value::U32(v),
            1 => Value::U32(v % 80),
            2 => Value::F32(f32::from_bits(v)),
            3 => Value::I32(v as i32),
            _ => Value::String(["linear", "yarn", "none", ""][v as usize % 4].into()),
        };
        let k = e[0] as usize % (ARCH_KEYS.len() + 1);
        if k == ARCH_KEYS.len() {
            // Another architecture's name over this one's keys and tensors.
            w.set("general.architecture", Value::String(ARCHES[v as usize % ARCHES.len()].into()));
        } else {
            w.set(format!("{arch}.{}", ARCH_KEYS[k]), value);
        }
    }
    let Ok(g) = GgufFile::from_bytes(w.to_bytes()) else { return };
    let Ok(model) = Model::load(&Arc::new(g), CpuBackend::new(1)) else { return };
    let n_vocab = model.cfg.n_vocab as u32;
    let Ok(r) = ModelRunner::new(model, 64, 16) else { return };
    let seq = r.new_seq();
    let prompt: Vec<Entry> =
        (0..5).map(|i| Entry { seq, token: (i * 37) % n_vocab.max(1), output: i == 4 }).collect();
    if r.decode(&prompt, OutputKind::Logits).is_err() {
        return;
    }
    for t in [1, 2] {
        if r.decode(&[Entry { seq, token: t % n_vocab.max(1), output: true }], OutputKind::Argmax).is_err() {
            return;
        }
    }
});
