//! IBM Granite (3.x), and `granitemoe` (Granite 3.x MoE): llama's layer with four
//! multipliers from the metadata: the embeddings (`embedding_scale`), each block's output
//! before its residual add (`residual_scale`), the attention scores (`attention.scale`)
//! and the logits (divided by `logit_scale`). With `expert_count` set the FFN is a mixture
//! of experts (`feed_forward_length` wide each: softmax routing, the top `k` weights
//! renormalized), plus an ungated shared expert where `expert_shared_feed_forward_length`
//! is set.

use crate::backend::{Activation, Gating};
use crate::error::Result;
use crate::model::block::{Attention, Ffn, Layer, Moe, Norms, SharedExpert};
use crate::model::config::{Hparams, Meta, ModelConfig};

pub fn config(m: &Meta) -> Result<ModelConfig> {
    let h = Hparams::read(m)?;
    let ffn = match m.routing(Gating::Softmax, true)? {
        Some(routing) => {
            let shared = m.usize("expert_shared_feed_forward_length")?.filter(|&n| n > 0);
            let shared = shared.map(|n_ff| SharedExpert { n_ff, gated: false });
            Ffn::Moe {
                norms: Norms::PRE,
                moe: Moe { routing, n_ff: h.n_ff, act: Activation::Silu, shared, selection_bias: false },
            }
        }
        None => Ffn::gated(Activation::Silu, h.n_ff),
    };
    let layer = Layer { mixer: Attention::new(h.rope.clone(), h.attn_scale).into(), ffn };
    let mut c = h.config(m, |_| layer.clone());
    c.embd_scale = m.f32("embedding_scale")?.unwrap_or(1.0);
    c.residual_scale = m.f32("residual_scale")?.unwrap_or(1.0);
    c.logit_scale = m.f32("logit_scale")?.unwrap_or(1.0);
    Ok(c)
}
