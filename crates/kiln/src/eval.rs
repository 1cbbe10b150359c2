//! Model evaluation as llama.cpp measures it: chunked perplexity, top logits.

use crate::engine::Engine;
use crate::error::{KilnError, Result};
use crate::model::{Entry, OutputKind};

/// Result of [`perplexity`].
#[derive(Clone, Debug)]
pub struct Perplexity {
    pub ppl: f64,
    /// llama.cpp's uncertainty estimate.
    pub ppl_stderr: f64,
    /// Mean negative log-likelihood.
    pub nll: f64,
    pub n_chunks: usize,
    pub n_scored: usize,
    /// Perplexity over chunks 1..=k, for each k (llama.cpp's running `[k]` values).
    pub running: Vec<f64>,
}

/// llama-perplexity's method on already tokenized text: chunks of `n_ctx` tokens, each
/// from an empty cache with its first token replaced by BOS when the model adds one,
/// scoring positions `n_ctx/2 .. n_ctx-1`.
pub fn perplexity(
    engine: &Engine,
    tokens: &[u32],
    n_ctx: usize,
    max_chunks: Option<usize>,
) -> Result<Perplexity> {
    if n_ctx < 4 || tokens.len() < 2 * n_ctx {
        return Err(KilnError::invalid(format!(
            "the text has {} tokens; perplexity at context {n_ctx} needs at least {}",
            tokens.len(),
            2 * n_ctx
        )));
    }
    let n_chunks = (tokens.len() / n_ctx).min(max_chunks.unwrap_or(usize::MAX).max(1));
    let tok = engine.tokenizer();
    let runner = engine.runner();
    let n_vocab = engine.config().n_vocab;
    let first = n_ctx / 2;
    let (mut nll, mut nll2, mut n) = (0.0f64, 0.0f64, 0usize);
    let mut running = Vec::with_capacity(n_chunks);
    for c in 0..n_chunks {
        let mut chunk = tokens[c * n_ctx..(c + 1) * n_ctx].to_vec();
        if let Some(bos) = tok.bos().filter(|_| tok.add_bos()) {
            chunk[0] = bos;
        }
        let seq = runner.new_seq();
        let entries: Vec<Entry> = chunk
            .iter()
            .enumerate()
            .map(|(p, &t)| Entry { seq, token: t, output: p >= first && p + 1 < n_ctx })
            .collect();
        let logits = runner.decode(&entries, OutputKind::Logits);
        runner.free_seq(seq);
        let logits = logits?;
        for (row, p) in (first..n_ctx - 1).enumerate() {
            let v = -log_softmax_at(&logits[row * n_vocab..(row + 1) * n_vocab], chunk[p + 1] as usize);
            nll += v;
            nll2 += v * v;
            n += 1;
        }
        running.push((nll / n as f64).exp());
    }
    let mean = nll / n as f64;
    let var = (nll2 / n as f64 - mean * mean).max(0.0);
    let ppl = mean.exp();
    Ok(Perplexity {
        ppl,
        ppl_stderr: ppl * (var / (n as f64 - 1.0).max(1.0)).sqrt(),
        nll: mean,
        n_chunks,
        n_scored: n,
        running,
    })
}

/// `log softmax(logits)[i]`, computed in f64.
pub fn log_softmax_at(logits: &[f32], i: usize) -> f64 {
    let max = logits.iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x));
    let sum: f64 = logits.iter().map(|&x| ((x - max) as f64).exp()).sum();
    (logits[i] - max) as f64 - sum.ln()
}

/// The `k` largest logits, descending, ties by ascending id.
pub fn top_k(logits: &[f32], k: usize) -> Vec<(u32, f32)> {
    let mut idx: Vec<u32> = (0..logits.len() as u32).collect();
    let cmp = |a: &u32, b: &u32| logits[*b as usize].total_cmp(&logits[*a as usize]).then(a.cmp(b));
    let k = k.min(idx.len());
    if k > 0 && k < idx.len() {
        idx.select_nth_unstable_by(k - 1, cmp);
    }
    idx.truncate(k);
    idx.sort_by(cmp);
    idx.into_iter().map(|i| (i, logits[i as usize])).collect()
}
