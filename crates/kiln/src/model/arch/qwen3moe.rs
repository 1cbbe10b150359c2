//! Qwen3-MoE (Qwen3-30B-A3B, 235B-A22B): qwen3's attention (per-head q/k norms, NEOX
//! RoPE) with a mixture of experts for the FFN: softmax routing, the top `k` weights
//! renormalized to sum to one, experts `expert_feed_forward_length` wide.

use crate::backend::{Activation, Gating};
use crate::error::{KilnError, Result};
use crate::model::block::{Attention, Ffn, Layer, Moe, Norms, QkNorm};
use crate::model::config::{Hparams, Meta, ModelConfig};

pub fn config(m: &Meta) -> Result<ModelConfig> {
    let h = Hparams::read(m)?;
    let routing = m
        .routing(Gating::Softmax, true)?
        .ok_or_else(|| KilnError::Metadata(format!("{} is missing", m.key("expert_count"))))?;
    let n_ff = m.usize("expert_feed_forward_length")?.unwrap_or(h.n_ff / routing.k);
    let moe = Moe { routing, n_ff, act: Activation::Silu, shared: None, selection_bias: false };
    let attn = Attention { qk_norm: QkNorm::PerHead, ..Attention::new(h.rope_neox(), h.attn_scale) };
    let layer = Layer { mixer: attn.into(), ffn: Ffn::Moe { norms: Norms::PRE, moe } };
    Ok(h.config(m, |_| layer.clone()))
}
