//! The blocks a layer is made of, shared by every architecture: what each block is (data
//! an architecture fills in), which tensors it reads, and how it runs against the
//! `Backend`. A layer is a mixer (attention, or LFM2's short convolution) then a
//! feed-forward block, each with its norms, each added to the residual stream.

pub mod attention;
pub mod conv;
pub mod ffn;
pub mod moe;

pub use attention::{Attention, AttnWeights, QkNorm, Temperature};
pub use conv::{ShortConv, ShortConvWeights};
pub use ffn::{Ffn, FfnWeights, Glu};
pub use moe::{Moe, SharedExpert};

use super::weights::Loader;
use crate::backend::Backend;
use crate::error::Result;

/// One layer: what mixes its positions and what its feed-forward block is.
#[derive(Clone, Debug)]
pub struct Layer {
    pub mixer: Mixer,
    pub ffn: Ffn,
}

/// The block of a layer that mixes information across positions.
#[derive(Clone, Debug)]
pub enum Mixer {
    Attention(Attention),
    /// A gated short convolution with a recurrent state per sequence (LFM2).
    ShortConv(ShortConv),
}

impl Mixer {
    pub fn norms(&self) -> Norms {
        match self {
            Mixer::Attention(a) => a.norms,
            Mixer::ShortConv(c) => c.norms,
        }
    }

    pub fn attention(&self) -> Option<&Attention> {
        match self {
            Mixer::Attention(a) => Some(a),
            Mixer::ShortConv(_) => None,
        }
    }
}

impl From<Attention> for Mixer {
    fn from(a: Attention) -> Self {
        Mixer::Attention(a)
    }
}

/// Where a block's norms sit: `pre` on the residual stream before the block (`attn_norm`,
/// `ffn_norm`), `post` on the block's output before the residual add
/// (`post_attention_norm`, `post_ffw_norm`), `after` on the residual stream after the add
/// (BERT's post-LN: `attn_output_norm`, `layer_output_norm`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Norms {
    pub pre: bool,
    pub post: bool,
    pub after: bool,
}

impl Norms {
    /// Pre-norm only (llama and most).
    pub const PRE: Norms = Norms { pre: true, post: false, after: false };
    /// Both (gemma).
    pub const PRE_POST: Norms = Norms { pre: true, post: true, after: false };
    /// Post-norm only (olmo2).
    pub const POST: Norms = Norms { pre: false, post: true, after: false };
    /// A norm of the residual stream after the add (BERT).
    pub const AFTER: Norms = Norms { pre: false, post: false, after: true };
}

/// One norm's tensors: the weight, and LayerNorm's bias where the model has one.
pub struct Norm<W> {
    pub w: W,
    pub b: Option<W>,
}

impl<W> Norm<W> {
    /// `{name}.weight` (required) and `{name}.bias` (optional) of `n` values each.
    pub(crate) fn load<B: Backend<Weight = W>>(l: &Loader<B>, name: &str, n: usize) -> Result<Self> {
        Ok(Norm { w: l.get(&format!("{name}.weight"), n, 1)?, b: l.opt(&format!("{name}.bias"), n, 1)? })
    }
}

/// A block's norm weights.
pub struct NormWeights<W> {
    pub pre: Option<Norm<W>>,
    pub post: Option<Norm<W>>,
    pub after: Option<Norm<W>>,
}

impl<W> NormWeights<W> {
    /// Layer `il`'s norms named `[pre, post, after]` (without `.weight`) as `norms` says,
    /// `n_embd` values each.
    pub(super) fn load<B: Backend<Weight = W>>(
        l: &Loader<B>,
        il: usize,
        norms: Norms,
        names: [&str; 3],
    ) -> Result<Self> {
        let d = l.cfg.n_embd;
        let get = |on: bool, name: &str| on.then(|| Norm::load(l, &blk(il, name), d)).transpose();
        Ok(NormWeights {
            pre: get(norms.pre, names[0])?,
            post: get(norms.post, names[1])?,
            after: get(norms.after, names[2])?,
        })
    }
}

/// A layer's mixer tensors.
pub enum MixerWeights<W> {
    Attention(AttnWeights<W>),
    ShortConv(ShortConvWeights<W>),
}

impl<W> MixerWeights<W> {
    pub fn norms(&self) -> &NormWeights<W> {
        match self {
            MixerWeights::Attention(a) => &a.norms,
            MixerWeights::ShortConv(c) => &c.norms,
        }
    }
}

/// A layer's tensors.
pub struct LayerWeights<B: Backend> {
    pub mixer: MixerWeights<B::Weight>,
    pub ffn: FfnWeights<B>,
}

impl<B: Backend> LayerWeights<B> {
    pub(super) fn load(l: &Loader<B>, il: usize, layer: &Layer) -> Result<Self> {
        let mixer = match &layer.mixer {
            Mixer::Attention(a) => MixerWeights::Attention(AttnWeights::load(l, il, a)?),
            Mixer::ShortConv(c) => MixerWeights::ShortConv(ShortConvWeights::load(l, il, c)?),
        };
        Ok(LayerWeights { mixer, ffn: FfnWeights::load(l, il, &layer.ffn)? })
    }

    /// The norm on the residual stream before the mixer, if any.
    pub fn mixer_pre_norm(&self) -> Option<&Norm<B::Weight>> {
        self.mixer.norms().pre.as_ref()
    }
}

/// The GGUF name of layer `il`'s tensor `name` (`blk.{il}.{name}`).
pub fn blk(il: usize, name: &str) -> String {
    format!("blk.{il}.{name}")
}
