//! Embeddings: the model's hidden states after the final norm, pooled over the tokens of
//! a text. `kiln embed` and the server's `/v1/embeddings` both use this.
//!
//! Pooling follows llama.cpp's: `Mean` averages every token's row (BOS included when the
//! model adds one), `Last` takes the last token's row, `None` returns every row. Attention
//! is the model's own (causal for the decoder-only models kiln runs).

use crate::engine::Engine;
use crate::error::{KilnError, Result};
use crate::model::{Entry, OutputKind};

/// How token rows become embeddings.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Pooling {
    /// Every token's hidden state, one row per token.
    None,
    /// The mean of the rows.
    #[default]
    Mean,
    /// The last token's row.
    Last,
}

impl Pooling {
    /// The name the CLI and server use.
    pub fn as_str(self) -> &'static str {
        match self {
            Pooling::None => "none",
            Pooling::Mean => "mean",
            Pooling::Last => "last",
        }
    }
}

impl std::str::FromStr for Pooling {
    type Err = KilnError;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "none" => Ok(Pooling::None),
            "mean" => Ok(Pooling::Mean),
            "last" => Ok(Pooling::Last),
            _ => Err(KilnError::invalid(format!("unknown pooling {s:?} (expected mean, last or none)"))),
        }
    }
}

/// Runs `ids` through the model in a fresh sequence and pools the hidden states: one row
/// for `Mean` and `Last`, `ids.len()` rows for `None`, each `n_embd` wide.
pub fn embed_tokens(engine: &Engine, ids: &[u32], pooling: Pooling) -> Result<Vec<Vec<f32>>> {
    if ids.is_empty() {
        return Err(KilnError::invalid("nothing to embed: the text has no tokens"));
    }
    if ids.len() > engine.n_ctx() {
        return Err(KilnError::invalid(format!(
            "the input has {} tokens, more than the context ({})",
            ids.len(),
            engine.n_ctx()
        )));
    }
    let runner = engine.runner();
    let seq = runner.new_seq();
    let last = ids.len() - 1;
    let entries: Vec<Entry> = ids
        .iter()
        .enumerate()
        .map(|(i, &token)| Entry { seq, token, output: pooling != Pooling::Last || i == last })
        .collect();
    let rows = runner.decode(&entries, OutputKind::Hidden);
    runner.free_seq(seq);
    Ok(pool(&rows?, engine.config().n_embd, pooling))
}

/// Pools row-major `rows` (`[n, n_embd]`) as `pooling` says.
pub fn pool(rows: &[f32], n_embd: usize, pooling: Pooling) -> Vec<Vec<f32>> {
    let n = rows.len() / n_embd.max(1);
    match pooling {
        Pooling::None => rows.chunks_exact(n_embd).map(<[f32]>::to_vec).collect(),
        Pooling::Last => rows.chunks_exact(n_embd).last().map(<[f32]>::to_vec).into_iter().collect(),
        Pooling::Mean => {
            let mut sum = vec![0f64; n_embd];
            for r in rows.chunks_exact(n_embd) {
                sum.iter_mut().zip(r).for_each(|(s, &x)| *s += x as f64);
            }
            vec![sum.iter().map(|&s| (s / n.max(1) as f64) as f32).collect()]
        }
    }
}

/// Scales `v` to unit Euclidean length (a zero vector stays zero).
pub fn normalize(v: &mut [f32]) {
    let norm = v.iter().map(|&x| x as f64 * x as f64).sum::<f64>().sqrt();
    if norm > 0.0 {
        v.iter_mut().for_each(|x| *x = (*x as f64 / norm) as f32);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pooling_of_rows() {
        let rows = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0];
        assert_eq!(pool(&rows, 2, Pooling::Mean), vec![vec![3.0, 4.0]]);
        assert_eq!(pool(&rows, 2, Pooling::Last), vec![vec![5.0, 6.0]]);
        assert_eq!(pool(&rows, 2, Pooling::None).len(), 3);
        let mut v = [3.0, 4.0];
        normalize(&mut v);
        assert_eq!(v, [0.6, 0.8]);
        assert!("max".parse::<Pooling>().is_err());
    }
}
