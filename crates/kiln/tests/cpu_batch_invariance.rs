//! Batch invariance of the CPU backend (DESIGN.md): a token's logits must not depend on
//! how many tokens, or which other sequences, share its forward pass — bit for bit.

mod support;

use kiln::engine::{Engine, EngineOptions};
use kiln::model::{Entry, OutputKind};
use support::*;

const N: usize = 40;

fn tokens() -> Vec<u32> {
    (0..N as u32).map(|i| 100 + (i * 7919) % 20000).collect()
}

/// Logits after the last token when the prompt is fed in chunks of `sizes` (summing to N),
/// with `noise` tokens of another sequence decoded in the same batches.
fn last_logits(e: &Engine, sizes: &[usize], noise: bool) -> Vec<f32> {
    let r = e.runner();
    let toks = tokens();
    let seq = r.new_seq();
    let other = r.new_seq();
    let mut at = 0;
    let mut out = Vec::new();
    for &n in sizes {
        let mut entries: Vec<Entry> = Vec::new();
        if noise {
            // Neighbours first, so our rows sit at other offsets of the batch.
            entries.extend((0..3).map(|i| Entry { seq: other, token: 5 + i, output: false }));
        }
        entries.extend((at..at + n).map(|i| Entry { seq, token: toks[i], output: i + 1 == N }));
        out = r.decode(&entries, OutputKind::Logits).unwrap();
        at += n;
    }
    assert_eq!(at, N);
    r.free_seq(seq);
    r.free_seq(other);
    out
}

#[test]
fn smollm2_logits_do_not_depend_on_the_batch() {
    let opts = EngineOptions::default().with_n_ctx(128).with_batch(64).with_n_seq(2).with_threads(2);
    let e = Engine::load(model(SMOLLM2.name).to_str().unwrap(), opts).unwrap();
    // Alone: one token at a time.
    let alone = last_logits(&e, &[1; N], false);
    assert_eq!(alone.len(), e.config().n_vocab);
    for (what, sizes, noise) in [
        ("batches of 7", vec![7, 7, 7, 7, 7, 5], false),
        ("a batch of 32", vec![8, 32], false),
        ("one batch of 40", vec![N], false),
        ("batches of 7 beside another sequence", vec![5, 7, 7, 7, 7, 7], true),
        ("a batch of 32 beside another sequence", vec![8, 32], true),
    ] {
        let got = last_logits(&e, &sizes, noise);
        let diff = alone.iter().zip(&got).filter(|(a, b)| a.to_bits() != b.to_bits()).count();
        assert_eq!(diff, 0, "{what}: {diff} logits differ from the token-by-token run");
    }
}
