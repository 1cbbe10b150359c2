//! Gemma 2: RMSNorms before and after both blocks, a GELU-tanh-gated FFN, embeddings
//! scaled by sqrt(n_embd), tied output; attention scores and logits soft-capped,
//! `cap · tanh(x / cap)` (`attn_logit_softcapping`, 50, and `final_logit_softcapping`, 30,
//! by default); every other layer, from the first, attends within a sliding window
//! (`attention.sliding_window`, 4096 by default).
//!
//! llama.cpp scales q before attention, by 1/sqrt(head_dim), or for the 27B (46 layers)
//! by 1/sqrt(n_embd / n_head), its query_pre_attn_scalar; so does kiln.

use crate::backend::{Activation, RopeParams};
use crate::error::Result;
use crate::model::block::{Attention, Ffn, Layer, Norms};
use crate::model::config::{Hparams, Meta, ModelConfig};

pub fn config(m: &Meta) -> Result<ModelConfig> {
    let h = Hparams::read(m)?;
    let window = m.usize("attention.sliding_window")?.unwrap_or(4096);
    let swa = m.swa_layers(h.n_layer, 2)?;
    let global = h.rope_neox();
    let local =
        RopeParams { freq_base: m.f32("rope.freq_base_swa")?.unwrap_or(global.freq_base), ..global.clone() };
    let head = if h.n_layer == 46 { h.n_embd / h.n_head } else { h.head_dim };
    let softcap = m.f32("attn_logit_softcapping")?.unwrap_or(50.0);
    let mut c = h.config(m, |il| {
        let local_layer = swa[il] && window > 0;
        let attn = Attention {
            norms: Norms::PRE_POST,
            window: local_layer.then_some(window as u32),
            scale_q: true,
            softcap: Some(softcap),
            ..Attention::new(
                if local_layer { local.clone() } else { global.clone() },
                1.0 / (head as f32).sqrt(),
            )
        };
        Layer {
            mixer: attn.into(),
            ffn: Ffn::Gated { norms: Norms::PRE_POST, act: Activation::GeluTanh, n_ff: h.n_ff },
        }
    });
    c.embd_scale = (h.n_embd as f32).sqrt();
    c.final_softcap = Some(m.f32("final_logit_softcapping")?.unwrap_or(30.0));
    Ok(c)
}
