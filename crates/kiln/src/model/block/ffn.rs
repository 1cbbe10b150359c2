//! The feed-forward block: a gated linear unit, `down · (act(gate · x) * (up · x))`
//! (`ffn_gate`, `ffn_up`, `ffn_down`).

use super::{blk, NormWeights, Norms};
use crate::backend::{Activation, Backend};
use crate::error::Result;
use crate::model::config::ModelConfig;
use crate::model::weights::Loader;

/// One layer's feed-forward block, as its architecture defines it.
#[derive(Clone, Debug)]
pub enum Ffn {
    /// A gated linear unit of `n_ff` hidden values.
    Gated { norms: Norms, act: Activation, n_ff: usize },
}

impl Ffn {
    /// Llama's: pre-norm, SiLU gate.
    pub fn gated(act: Activation, n_ff: usize) -> Self {
        Ffn::Gated { norms: Norms::PRE, act, n_ff }
    }

    /// Hidden width (scratch sizing).
    pub fn n_ff(&self) -> usize {
        match self {
            Ffn::Gated { n_ff, .. } => *n_ff,
        }
    }

    pub fn norms(&self) -> Norms {
        match self {
            Ffn::Gated { norms, .. } => *norms,
        }
    }
}

pub enum FfnWeights<W> {
    Gated { norms: NormWeights<W>, gate: W, up: W, down: W },
}

impl<W> FfnWeights<W> {
    pub(crate) fn load<B: Backend<Weight = W>>(l: &Loader<B>, il: usize, f: &Ffn) -> Result<Self> {
        let d = l.cfg.n_embd;
        let n = |s: &str| blk(il, s);
        match *f {
            Ffn::Gated { norms, n_ff: ff, .. } => {
                let [gate, up] = l.group([(n("ffn_gate.weight"), d, ff), (n("ffn_up.weight"), d, ff)])?;
                Ok(FfnWeights::Gated {
                    norms: NormWeights::load(l, il, norms, "ffn_norm.weight", "post_ffw_norm.weight")?,
                    gate,
                    up,
                    down: l.get(&n("ffn_down.weight"), ff, d)?,
                })
            }
        }
    }

    pub fn norms(&self) -> &NormWeights<W> {
        match self {
            FfnWeights::Gated { norms, .. } => norms,
        }
    }
}

/// The feed-forward block's activations, `n_ubatch` rows each.
pub struct FfnScratch<B: Backend> {
    gate: B::Buf,
    up: B::Buf,
}

impl<B: Backend> FfnScratch<B> {
    pub fn new(b: &B, cfg: &ModelConfig, n: usize) -> Result<Self> {
        Ok(FfnScratch { gate: b.alloc(n * cfg.n_ff)?, up: b.alloc(n * cfg.n_ff)? })
    }
}

/// The block on `n` rows of `x` (already normed), its output to `out`.
pub fn forward<B: Backend>(
    b: &B,
    f: &Ffn,
    w: &FfnWeights<B::Weight>,
    x: &B::Buf,
    n: usize,
    s: &mut FfnScratch<B>,
    out: &mut B::Buf,
) {
    match (f, w) {
        (Ffn::Gated { act, n_ff, .. }, FfnWeights::Gated { gate, up, down, .. }) => {
            b.matmul_many(&[gate, up], &[], x, n, &mut [&mut s.gate, &mut s.up]);
            b.glu(&mut s.gate, &s.up, *act, n * n_ff);
            b.matmul(down, &s.gate, n, out);
        }
    }
}
