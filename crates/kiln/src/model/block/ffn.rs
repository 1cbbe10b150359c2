//! The feed-forward block: a gated linear unit, `down · (act(gate · x) * (up · x))`
//! (`ffn_gate`, `ffn_up`, `ffn_down`; or gate and up fused in one `ffn_up` of twice the
//! rows, gate first, as phi3 has them), or a mixture of experts (`block::moe`).

use super::moe::{self, Moe, MoeScratch, MoeWeights};
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
    /// A mixture of experts.
    Moe { norms: Norms, moe: Moe },
}

impl Ffn {
    /// Llama's: pre-norm, SiLU gate.
    pub fn gated(act: Activation, n_ff: usize) -> Self {
        Ffn::Gated { norms: Norms::PRE, act, n_ff }
    }

    /// Hidden width of its dense units (scratch sizing): the GLU's, or a shared expert's.
    pub fn n_ff(&self) -> usize {
        match self {
            Ffn::Gated { n_ff, .. } => *n_ff,
            Ffn::Moe { moe, .. } => moe.shared.map_or(0, |s| s.n_ff),
        }
    }

    pub fn norms(&self) -> Norms {
        match self {
            Ffn::Gated { norms, .. } | Ffn::Moe { norms, .. } => *norms,
        }
    }

    pub fn moe(&self) -> Option<&Moe> {
        match self {
            Ffn::Moe { moe, .. } => Some(moe),
            Ffn::Gated { .. } => None,
        }
    }
}

/// A gated linear unit's matrices.
pub struct Glu<W> {
    pub gate: W,
    pub up: W,
    pub down: W,
}

impl<W> Glu<W> {
    /// `blk.{il}.ffn_{gate,up,down}{suffix}.weight` of `n_ff` hidden values.
    pub(crate) fn load<B: Backend<Weight = W>>(
        l: &Loader<B>,
        il: usize,
        suffix: &str,
        ff: usize,
    ) -> Result<Self> {
        let d = l.cfg.n_embd;
        let n = |s: &str| blk(il, &format!("ffn_{s}{suffix}.weight"));
        // Fused: no gate, an up of twice the rows.
        let fused = l.g.tensor(&n("gate")).is_none()
            && l.g.tensor(&n("up")).is_some_and(|t| t.rows_cols().0 == 2 * ff);
        let [gate, up] = match fused {
            true => l.fused(&n("up"), d, [ff, ff])?,
            false => l.group([(n("gate"), d, ff), (n("up"), d, ff)])?,
        };
        Ok(Glu { gate, up, down: l.get(&n("down"), ff, d)? })
    }
}

pub enum FfnWeights<B: Backend> {
    Gated { norms: NormWeights<B::Weight>, glu: Glu<B::Weight> },
    Moe { norms: NormWeights<B::Weight>, moe: MoeWeights<B> },
}

impl<B: Backend> FfnWeights<B> {
    pub(crate) fn load(l: &Loader<B>, il: usize, f: &Ffn) -> Result<Self> {
        let norms = NormWeights::load(l, il, f.norms(), "ffn_norm.weight", "post_ffw_norm.weight")?;
        Ok(match f {
            Ffn::Gated { n_ff, .. } => FfnWeights::Gated { norms, glu: Glu::load(l, il, "", *n_ff)? },
            Ffn::Moe { moe, .. } => FfnWeights::Moe { norms, moe: MoeWeights::load(l, il, moe)? },
        })
    }

    pub fn norms(&self) -> &NormWeights<B::Weight> {
        match self {
            FfnWeights::Gated { norms, .. } | FfnWeights::Moe { norms, .. } => norms,
        }
    }
}

/// The feed-forward block's activations, `n_ubatch` rows each.
pub struct FfnScratch<B: Backend> {
    glu: GluScratch<B>,
    /// Where some layer is a mixture of experts.
    moe: Option<MoeScratch<B>>,
}

/// A GLU's hidden activations.
pub struct GluScratch<B: Backend> {
    gate: B::Buf,
    up: B::Buf,
}

impl<B: Backend> FfnScratch<B> {
    pub fn new(b: &B, cfg: &ModelConfig, n: usize) -> Result<Self> {
        let moe = cfg.layers.iter().filter_map(|l| l.ffn.moe()).max_by_key(|m| m.scratch_len());
        Ok(FfnScratch {
            glu: GluScratch { gate: b.alloc(n * cfg.n_ff)?, up: b.alloc(n * cfg.n_ff)? },
            moe: moe.map(|m| MoeScratch::new(b, cfg, m, n)).transpose()?,
        })
    }
}

/// A GLU on `n` rows of `x`, its output to `out`.
#[allow(clippy::too_many_arguments)]
pub fn glu<B: Backend>(
    b: &B,
    w: &Glu<B::Weight>,
    act: Activation,
    n_ff: usize,
    x: &B::Buf,
    n: usize,
    s: &mut GluScratch<B>,
    out: &mut B::Buf,
) {
    b.matmul_many(&[&w.gate, &w.up], &[], x, n, &mut [&mut s.gate, &mut s.up]);
    b.glu(&mut s.gate, &s.up, act, n * n_ff);
    b.matmul(&w.down, &s.gate, n, out);
}

/// The block on `n` rows of `x` (already normed), its output to `out`.
pub fn forward<B: Backend>(
    b: &B,
    f: &Ffn,
    w: &FfnWeights<B>,
    x: &B::Buf,
    n: usize,
    s: &mut FfnScratch<B>,
    out: &mut B::Buf,
) {
    match (f, w) {
        (Ffn::Gated { act, n_ff, .. }, FfnWeights::Gated { glu: g, .. }) => {
            glu(b, g, *act, *n_ff, x, n, &mut s.glu, out)
        }
        (Ffn::Moe { moe: m, .. }, FfnWeights::Moe { moe: mw, .. }) => {
            let ms = s.moe.as_mut().expect("scratch made for the model's experts");
            moe::forward(b, m, mw, x, n, &mut s.glu, ms, out)
        }
        _ => unreachable!("weights are loaded for their spec"),
    }
}
