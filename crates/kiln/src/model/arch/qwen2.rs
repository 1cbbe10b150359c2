//! Qwen2 (and Qwen2.5): llama's layer with biases on q, k and v (`attn_{q,k,v}.bias`) and
//! NEOX-paired RoPE.

use crate::backend::Activation;
use crate::error::Result;
use crate::model::block::{Attention, Ffn, Layer};
use crate::model::config::{Hparams, Meta, ModelConfig};

pub fn config(m: &Meta) -> Result<ModelConfig> {
    let h = Hparams::read(m)?;
    let layer = Layer {
        mixer: Attention::new(h.rope_neox(), h.attn_scale).into(),
        ffn: Ffn::gated(Activation::Silu, h.n_ff),
    };
    Ok(h.config(m, |_| layer.clone()))
}
