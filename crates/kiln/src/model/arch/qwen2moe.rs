//! Qwen2-MoE (Qwen1.5-MoE-A2.7B, Qwen2-57B-A14B): qwen2's attention (q/k/v biases, NEOX
//! RoPE) with a mixture of experts: softmax routing, the top `k` weights as they are (not
//! renormalized), and a shared expert for every token (`expert_shared_feed_forward_length`
//! wide) scaled by its sigmoid gate.

use crate::backend::{Activation, Gating};
use crate::error::{KilnError, Result};
use crate::model::block::{Attention, Ffn, Layer, Moe, Norms, SharedExpert};
use crate::model::config::{Hparams, Meta, ModelConfig};

pub fn config(m: &Meta) -> Result<ModelConfig> {
    let h = Hparams::read(m)?;
    let routing = m
        .routing(Gating::Softmax, false)?
        .ok_or_else(|| KilnError::Metadata(format!("{} is missing", m.key("expert_count"))))?;
    let n_ff = m.usize("expert_feed_forward_length")?.unwrap_or(h.n_ff / routing.k);
    let shared_ff = m.usize("expert_shared_feed_forward_length")?.unwrap_or(h.n_ff);
    let shared = Some(SharedExpert { n_ff: shared_ff, gated: true });
    let moe = Moe { routing, n_ff, act: Activation::Silu, shared, selection_bias: false };
    let layer = Layer {
        mixer: Attention::new(h.rope_neox(), h.attn_scale).into(),
        ffn: Ffn::Moe { norms: Norms::PRE, moe },
    };
    Ok(h.config(m, |_| layer.clone()))
}
