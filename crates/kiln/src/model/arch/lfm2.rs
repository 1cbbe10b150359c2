//! LFM2 (Liquid AI): a hybrid of gated short convolutions (`block::conv`: most layers)
//! and GQA attention with per-head q/k RMSNorms and NEOX RoPE (the layers whose
//! `attention.head_count_kv` entry is not 0), each followed by a SiLU-gated FFN. The
//! final norm is the file's `token_embd_norm`. lfm2moe is these layers with experts.

use crate::backend::Activation;
use crate::error::{KilnError, Result};
use crate::model::block::{Attention, Ffn, Layer, Mixer, Norms, QkNorm, ShortConv};
use crate::model::config::{Hparams, Meta, ModelConfig};

pub fn config(m: &Meta) -> Result<ModelConfig> {
    let h = Hparams::read(m)?;
    let window = m.usize("attention.sliding_window")?.filter(|&w| w > 0).map(|w| w as u32);
    hybrid(m, &h, window, |_| Ffn::gated(Activation::Silu, h.n_ff))
}

/// LFM2's layers with `ffn(il)` as layer `il`'s feed-forward block: a short convolution of
/// `shortconv.l_cache` taps where the layer has no KV heads, else attention (sliding
/// `window` wide where set).
pub(super) fn hybrid(
    m: &Meta,
    h: &Hparams,
    window: Option<u32>,
    ffn: impl Fn(usize) -> Ffn,
) -> Result<ModelConfig> {
    let l_cache = m.req("shortconv.l_cache")?;
    if !(2..=64).contains(&l_cache) {
        return Err(KilnError::Metadata(format!("{} = {l_cache}: 2 to 64", m.key("shortconv.l_cache"))));
    }
    let kv = m
        .per_layer("attention.head_count_kv", h.n_layer)?
        .ok_or_else(|| KilnError::Metadata(format!("{} is missing", m.key("attention.head_count_kv"))))?;
    let attn = Attention { qk_norm: QkNorm::PerHead, window, ..Attention::new(h.rope_neox(), h.attn_scale) };
    let mut c = h.config(m, |il| Layer {
        mixer: match kv[il] {
            0 => Mixer::ShortConv(ShortConv { norms: Norms::PRE, l_cache }),
            _ => attn.clone().into(),
        },
        ffn: ffn(il),
    });
    c.output_norm = Some("token_embd_norm");
    Ok(c)
}
