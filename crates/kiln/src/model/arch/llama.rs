//! Llama (and the many models converted as `llama`: Mistral, SmolLM2, TinyLlama...):
//! pre-norm attention with NORM-paired RoPE (llama-3's `rope_freqs` factors where the
//! file has them) and a SiLU-gated FFN.

use crate::backend::Activation;
use crate::error::Result;
use crate::model::block::{Attention, Ffn, Layer};
use crate::model::config::{Hparams, Meta, ModelConfig};

pub fn config(m: &Meta) -> Result<ModelConfig> {
    let h = Hparams::read(m)?;
    let layer = Layer {
        attn: Attention::new(h.rope.clone(), h.attn_scale),
        ffn: Ffn::gated(Activation::Silu, h.n_ff),
    };
    Ok(h.config(m, |_| layer.clone()))
}
