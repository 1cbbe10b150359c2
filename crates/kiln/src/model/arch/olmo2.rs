//! OLMo 2 (and OLMo 3, converted as olmo2): RMSNorms after each block
//! (`post_attention_norm`, `post_ffw_norm`) and none before it; q and k each normed as a
//! whole (`attn_q_norm` over all heads' values, `attn_k_norm` over the KV heads'),
//! NEOX-paired RoPE. Where `attention.sliding_window` is set (OLMo 3), three of every four
//! layers (`attention.sliding_window_pattern`) attend within it, rotated with the base but
//! without the file's RoPE scaling, as llama.cpp's olmo2 does.

use crate::backend::{Activation, RopeParams};
use crate::error::Result;
use crate::model::block::{Attention, Ffn, Layer, Norms, QkNorm};
use crate::model::config::{Hparams, Meta, ModelConfig};

pub fn config(m: &Meta) -> Result<ModelConfig> {
    let h = Hparams::read(m)?;
    let window = m.usize("attention.sliding_window")?.filter(|&w| w > 0).map(|w| w as u32);
    let swa = match window {
        Some(_) => m.swa_layers(h.n_layer, 4)?,
        None => vec![false; h.n_layer],
    };
    let global = h.rope_neox();
    let local = RopeParams { freq_scale: 1.0, ext_factor: 0.0, attn_factor: 1.0, ..global.clone() };
    Ok(h.config(m, |il| {
        let attn = Attention {
            norms: Norms::POST,
            qk_norm: QkNorm::Whole,
            window: window.filter(|_| swa[il]),
            ..Attention::new(if swa[il] { local.clone() } else { global.clone() }, h.attn_scale)
        };
        Layer {
            mixer: attn.into(),
            ffn: Ffn::Gated { norms: Norms::POST, act: Activation::Silu, n_ff: h.n_ff },
        }
    }))
}
