//! SmolLM3: llama's layer, but every fourth layer (the 4th, 8th, ...) attends without
//! RoPE (NoPE). llama.cpp fixes that interval at 4 (the files carry no key for it). A
//! context shift leaves those layers' keys as they are (llama.cpp's K-shift rotates them
//! too, as if they had RoPE).

use crate::backend::Activation;
use crate::error::Result;
use crate::model::block::{Attention, Ffn, Layer};
use crate::model::config::{Hparams, Meta, ModelConfig};

/// Every this many layers, the last has no RoPE.
const NO_ROPE_INTERVAL: usize = 4;

pub fn config(m: &Meta) -> Result<ModelConfig> {
    let h = Hparams::read(m)?;
    Ok(h.config(m, |il| {
        let rope = ((il + 1) % NO_ROPE_INTERVAL != 0).then(|| h.rope.clone());
        Layer {
            mixer: Attention { rope, ..Attention::new(h.rope.clone(), h.attn_scale) }.into(),
            ffn: Ffn::gated(Activation::Silu, h.n_ff),
        }
    }))
}
