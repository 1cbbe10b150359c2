//! nomic-bert (nomic-embed-text): BERT's post-LN encoder with rotary positions (NEOX
//! pairs) instead of learned ones, one fused `attn_qkv`, and a SiLU-gated feed-forward,
//! without biases.

use super::encoder;
use crate::backend::Activation;
use crate::error::Result;
use crate::model::block::{Ffn, Norms};
use crate::model::config::{Hparams, Meta, ModelConfig};

pub fn config(m: &Meta) -> Result<ModelConfig> {
    let rope = Hparams::read(m)?.rope_neox();
    encoder(m, Some(rope), None, |n_ff| Ffn::Gated { norms: Norms::AFTER, act: Activation::Silu, n_ff })
}
