//! LFM2-MoE (Liquid AI: LFM2-8B-A1B, LFM2-24B-A2B): LFM2's layers (`lfm2`: gated short
//! convolutions and a few attention layers) whose feed-forward block is a mixture of
//! experts past the first `leading_dense_block_count` layers (SiLU-gated FFNs
//! `feed_forward_length` wide). Experts are `expert_feed_forward_length` wide and routed
//! by `expert_gating_func` scores (sigmoid in the released models) plus an
//! expert-selection bias (`exp_probs_b`), the top `k` weights renormalized. No sliding
//! window: llama.cpp reads none for it.

use super::lfm2;
use crate::backend::Activation;
use crate::error::{KilnError, Result};
use crate::model::block::{Ffn, Moe, Norms};
use crate::model::config::{Hparams, Meta, ModelConfig};

pub fn config(m: &Meta) -> Result<ModelConfig> {
    let h = Hparams::read(m)?;
    let missing = |k: &str| KilnError::Metadata(format!("{} is missing", m.key(k)));
    let gating = m.gating()?.ok_or_else(|| missing("expert_gating_func"))?;
    let routing = m.routing(gating, true)?.ok_or_else(|| missing("expert_count"))?;
    let n_ff =
        m.uniform("expert_feed_forward_length")?.ok_or_else(|| missing("expert_feed_forward_length"))?;
    let n_dense = m.usize("leading_dense_block_count")?.unwrap_or(0);
    let moe = Moe { routing, n_ff, act: Activation::Silu, shared: None, selection_bias: true };
    lfm2::hybrid(m, &h, None, |il| match il < n_dense {
        true => Ffn::gated(Activation::Silu, h.n_ff),
        false => Ffn::Moe { norms: Norms::PRE, moe },
    })
}
