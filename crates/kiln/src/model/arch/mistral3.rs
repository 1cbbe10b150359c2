//! Mistral 3 (Ministral 3): llama's layer, with YaRN's attention factor divided by
//! `rope.scaling.yarn_log_multiplier` (read with the generic hparams) and llama-4's
//! attention temperature where `attention.temperature_scale` is set: the query at position
//! `p` scaled by `1 + scale · ln(⌊p / n_ctx_orig⌋ + 1)` (1 within the original context).

use crate::backend::Activation;
use crate::error::{KilnError, Result};
use crate::model::block::{Attention, Ffn, Layer, Temperature};
use crate::model::config::{Hparams, Meta, ModelConfig};

pub fn config(m: &Meta) -> Result<ModelConfig> {
    let h = Hparams::read(m)?;
    let temperature = match m.f32("attention.temperature_scale")? {
        Some(scale) if scale != 0.0 => {
            if h.rope.n_ctx_orig == 0 {
                return Err(KilnError::Metadata(
                    "attention temperature with no original context length".into(),
                ));
            }
            Some(Temperature { scale, floor: h.rope.n_ctx_orig as f32, offset: 0.0 })
        }
        _ => None,
    };
    let layer = Layer {
        mixer: Attention { temperature, ..Attention::new(h.rope.clone(), h.attn_scale) }.into(),
        ffn: Ffn::gated(Activation::Silu, h.n_ff),
    };
    Ok(h.config(m, |_| layer.clone()))
}
