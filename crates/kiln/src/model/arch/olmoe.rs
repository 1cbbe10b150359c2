//! OLMoE (OLMoE-1B-7B): RMSNorms of all of q and of all of k before NEOX RoPE, and a
//! mixture of experts (`feed_forward_length` wide each): softmax routing, the top `k`
//! weights not renormalized.

use crate::backend::{Activation, Gating};
use crate::error::{KilnError, Result};
use crate::model::block::{Attention, Ffn, Layer, Moe, Norms, QkNorm};
use crate::model::config::{Hparams, Meta, ModelConfig};

pub fn config(m: &Meta) -> Result<ModelConfig> {
    let h = Hparams::read(m)?;
    let routing = m
        .routing(Gating::Softmax, false)?
        .ok_or_else(|| KilnError::Metadata(format!("{} is missing", m.key("expert_count"))))?;
    let moe = Moe { routing, n_ff: h.n_ff, act: Activation::Silu, shared: None, selection_bias: false };
    let attn = Attention { qk_norm: QkNorm::Whole, ..Attention::new(h.rope_neox(), h.attn_scale) };
    let layer = Layer { mixer: attn.into(), ffn: Ffn::Moe { norms: Norms::PRE, moe } };
    Ok(h.config(m, |_| layer.clone()))
}
