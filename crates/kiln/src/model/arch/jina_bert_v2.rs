//! jina-bert-v2 (jina-embeddings-v2, jina-reranker-v1): BERT's post-LN encoder with
//! ALiBi (a linear bias of the scores by distance, maximum bias 8, as llama.cpp fixes it)
//! instead of positions, and a GELU feed-forward: gated (GEGLU; the gate fused into
//! `ffn_up` as its first half, or a separate `ffn_gate`) or plain.

use super::encoder;
use crate::backend::Activation;
use crate::error::{KilnError, Result};
use crate::model::block::{Ffn, Norms};
use crate::model::config::{Meta, ModelConfig};

pub fn config(m: &Meta) -> Result<ModelConfig> {
    for t in ["blk.0.attn_q_norm.weight", "blk.0.attn_norm_2.weight"] {
        if m.g.tensor(t).is_some() {
            return Err(KilnError::unsupported("jina-bert-v2 tensor", t));
        }
    }
    let n_ff = m.uniform("feed_forward_length")?.unwrap_or(0);
    let up_rows = m.g.tensor("blk.0.ffn_up.weight").map(|t| t.rows_cols().0);
    let gated = m.g.tensor("blk.0.ffn_gate.weight").is_some() || up_rows == Some(2 * n_ff);
    encoder(m, None, Some(8.0), |n_ff| match gated {
        true => Ffn::Gated { norms: Norms::AFTER, act: Activation::GeluTanh, n_ff },
        false => Ffn::Gelu { norms: Norms::AFTER, n_ff },
    })
}
