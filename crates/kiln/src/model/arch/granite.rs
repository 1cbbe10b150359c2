//! IBM Granite (3.x): llama's layer with four multipliers from the metadata: the
//! embeddings (`embedding_scale`), each block's output before its residual add
//! (`residual_scale`), the attention scores (`attention.scale`) and the logits (divided by
//! `logit_scale`).

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
    let mut c = h.config(m, |_| layer.clone());
    c.embd_scale = m.f32("embedding_scale")?.unwrap_or(1.0);
    c.residual_scale = m.f32("residual_scale")?.unwrap_or(1.0);
    c.logit_scale = m.f32("logit_scale")?.unwrap_or(1.0);
    Ok(c)
}
