//! Qwen3: llama's layer with an RMSNorm of each q and k head before RoPE
//! (`attn_q_norm`, `attn_k_norm`), NEOX-paired.

use crate::backend::Activation;
use crate::error::Result;
use crate::model::block::{Attention, Ffn, Layer, QkNorm};
use crate::model::config::{Hparams, Meta, ModelConfig};

pub fn config(m: &Meta) -> Result<ModelConfig> {
    let h = Hparams::read(m)?;
    let attn = Attention { qk_norm: QkNorm::PerHead, ..Attention::new(h.rope_neox(), h.attn_scale) };
    let layer = Layer { mixer: attn.into(), ffn: Ffn::gated(Activation::Silu, h.n_ff) };
    Ok(h.config(m, |_| layer.clone()))
}
