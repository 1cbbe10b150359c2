//! BERT (bge, all-MiniLM, and rerankers with a classification head): an encoder. The
//! token embeddings plus token type 0's row plus learned absolute positions, LayerNormed;
//! then post-LN layers (each block's output added to the residual stream, then a LayerNorm
//! of it), biases on every projection, a GELU feed-forward, and attention over the whole
//! sequence (`attention.causal` false). No final norm beyond the last layer's.

use super::encoder;
use crate::error::Result;
use crate::model::block::Ffn;
use crate::model::config::{Meta, ModelConfig};

pub fn config(m: &Meta) -> Result<ModelConfig> {
    let mut c = encoder(m, None, None, |n_ff| Ffn::Gelu { norms: crate::model::block::Norms::AFTER, n_ff })?;
    c.embd.positions = true;
    Ok(c)
}
