//! Llama (and the many models converted as `llama`: Mistral, SmolLM2, TinyLlama...):
//! pre-norm attention with NORM-paired RoPE (llama-3's `rope_freqs` factors where the
//! file has them) and a SiLU-gated FFN. With `expert_count` set (Mixtral) the FFN is a
//! mixture of experts (`feed_forward_length` wide each): softmax routing, the top `k`
//! weights renormalized.

use crate::backend::{Activation, Gating};
use crate::error::Result;
use crate::model::block::{Attention, Ffn, Layer, Moe, Norms};
use crate::model::config::{Hparams, Meta, ModelConfig};

pub fn config(m: &Meta) -> Result<ModelConfig> {
    let h = Hparams::read(m)?;
    let ffn = match m.routing(Gating::Softmax, true)? {
        Some(routing) => Ffn::Moe {
            norms: Norms::PRE,
            moe: Moe { routing, n_ff: h.n_ff, act: Activation::Silu, shared: None, selection_bias: false },
        },
        None => Ffn::gated(Activation::Silu, h.n_ff),
    };
    let layer = Layer { mixer: Attention::new(h.rope.clone(), h.attn_scale).into(), ffn };
    Ok(h.config(m, |_| layer.clone()))
}
