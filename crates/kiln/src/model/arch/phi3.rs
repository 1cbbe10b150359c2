//! Phi-3 (Phi-3.5, Phi-4-mini): llama's layer with q, k and v fused in one tensor
//! (`attn_qkv`) and the FFN's gate and up in another (`ffn_up`, gate first), NEOX-paired
//! RoPE with LongRoPE's per-dimension factors (`rope_factors_short` within the original
//! training context, `rope_factors_long` past it) and its `rope.scaling.attn_factor`.
//! llama.cpp scales q rather than the scores, and ignores the sliding window some files
//! declare; so does kiln.

use crate::backend::Activation;
use crate::error::Result;
use crate::model::block::{Attention, Ffn, Layer};
use crate::model::config::{Hparams, Meta, ModelConfig};

pub fn config(m: &Meta) -> Result<ModelConfig> {
    let h = Hparams::read(m)?;
    let attn = Attention { scale_q: true, ..Attention::new(h.rope_neox(), h.attn_scale) };
    let layer = Layer { mixer: attn.into(), ffn: Ffn::gated(Activation::Silu, h.n_ff) };
    Ok(h.config(m, |_| layer.clone()))
}
