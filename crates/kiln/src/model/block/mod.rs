//! The blocks a layer is made of, shared by every architecture: what each block is (data
//! an architecture fills in), which tensors it reads, and how it runs against the
//! `Backend`. A layer is an attention block then a feed-forward block, each with its
//! RMSNorms, each added to the residual stream.

pub mod attention;
pub mod ffn;
pub mod moe;

pub use attention::{Attention, AttnWeights, QkNorm, Temperature};
pub use ffn::{Ffn, FfnWeights, Glu};
pub use moe::{Moe, SharedExpert};

use super::weights::Loader;
use crate::backend::Backend;
use crate::error::Result;

/// One layer: what its attention and feed-forward blocks are.
#[derive(Clone, Debug)]
pub struct Layer {
    pub attn: Attention,
    pub ffn: Ffn,
}

/// Where a block's RMSNorms sit: `pre` on the residual stream before the block
/// (`attn_norm`, `ffn_norm`), `post` on the block's output before the residual add
/// (`post_attention_norm`, `post_ffw_norm`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Norms {
    pub pre: bool,
    pub post: bool,
}

impl Norms {
    /// Pre-norm only (llama and most).
    pub const PRE: Norms = Norms { pre: true, post: false };
    /// Both (gemma).
    pub const PRE_POST: Norms = Norms { pre: true, post: true };
    /// Post-norm only (olmo2).
    pub const POST: Norms = Norms { pre: false, post: true };
}

/// A block's norm weights.
pub struct NormWeights<W> {
    pub pre: Option<W>,
    pub post: Option<W>,
}

impl<W> NormWeights<W> {
    /// `blk.{il}.{pre}` and `blk.{il}.{post}` as `norms` says, `n_embd` values each.
    pub(super) fn load<B: Backend<Weight = W>>(
        l: &Loader<B>,
        il: usize,
        norms: Norms,
        pre: &str,
        post: &str,
    ) -> Result<Self> {
        let d = l.cfg.n_embd;
        let get = |on: bool, name: &str| on.then(|| l.get(&blk(il, name), d, 1)).transpose();
        Ok(NormWeights { pre: get(norms.pre, pre)?, post: get(norms.post, post)? })
    }
}

/// A layer's tensors.
pub struct LayerWeights<B: Backend> {
    pub attn: AttnWeights<B::Weight>,
    pub ffn: FfnWeights<B>,
}

impl<B: Backend> LayerWeights<B> {
    pub(super) fn load(l: &Loader<B>, il: usize, layer: &Layer) -> Result<Self> {
        Ok(LayerWeights {
            attn: AttnWeights::load(l, il, &layer.attn)?,
            ffn: FfnWeights::load(l, il, &layer.ffn)?,
        })
    }

    /// The norm on the residual stream before the attention block, if any.
    pub fn attn_pre_norm(&self) -> Option<&B::Weight> {
        self.attn.norms.pre.as_ref()
    }
}

/// The GGUF name of layer `il`'s tensor `name` (`blk.{il}.{name}`).
pub fn blk(il: usize, name: &str) -> String {
    format!("blk.{il}.{name}")
}
