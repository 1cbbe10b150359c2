//! Gemma 3: RMSNorms before and after both blocks, per-head q/k norms, a GELU-tanh-gated
//! FFN, embeddings scaled by sqrt(n_embd), tied output. Five of every six layers (the
//! `attention.sliding_window_pattern`) attend within a sliding window, rotated with their
//! own base (`rope.freq_base_swa`, 10000 by default); the others see the whole context.
//!
//! llama.cpp scales q by 1/sqrt(head_dim) before attention; gemma3's head sizes are powers
//! of two, so scaling the scores instead gives the same bits.

use crate::backend::{Activation, RopeParams};
use crate::error::Result;
use crate::model::block::{Attention, Ffn, Layer, Norms, QkNorm};
use crate::model::config::{Hparams, Meta, ModelConfig};

pub fn config(m: &Meta) -> Result<ModelConfig> {
    let h = Hparams::read(m)?;
    let window =
        m.usize("attention.sliding_window")?.filter(|&w| w > 0).map(|w| w.min(u32::MAX as usize) as u32);
    let swa = match window {
        Some(_) => m.swa_layers(h.n_layer, 6)?,
        None => vec![false; h.n_layer],
    };
    let global = h.rope_neox();
    let local = RopeParams { freq_base: m.f32("rope.freq_base_swa")?.unwrap_or(10000.0), ..global.clone() };
    let mut c = h.config(m, |il| {
        let rope = if swa[il] { local.clone() } else { global.clone() };
        let attn = Attention {
            norms: Norms::PRE_POST,
            qk_norm: QkNorm::PerHead,
            window: if swa[il] { window } else { None },
            ..Attention::new(rope, h.attn_scale)
        };
        Layer {
            mixer: attn.into(),
            ffn: Ffn::Gated { norms: Norms::PRE_POST, act: Activation::GeluTanh, n_ff: h.n_ff },
        }
    });
    c.embd_scale = (h.n_embd as f32).sqrt();
    Ok(c)
}
