//! The feed-forward block: a gated linear unit, `down · (act(gate · x) * (up · x))`
//! (`ffn_gate`, `ffn_up`, `ffn_down`; or gate and up fused in one `ffn_up` of twice the
//! rows, gate first, as phi3 and jina-bert-v2's GEGLU have them), BERT's plain
//! `down · gelu(up · x)`, each matrix with an optional bias; or a mixture of experts
//! (`block::moe`).

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
    /// `down · gelu(up · x)` (BERT), `n_ff` hidden values.
    Gelu { norms: Norms, n_ff: usize },
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
            Ffn::Gated { n_ff, .. } | Ffn::Gelu { n_ff, .. } => *n_ff,
            Ffn::Moe { moe, .. } => moe.shared.map_or(0, |s| s.n_ff),
        }
    }

    pub fn norms(&self) -> Norms {
        match self {
            Ffn::Gated { norms, .. } | Ffn::Gelu { norms, .. } | Ffn::Moe { norms, .. } => *norms,
        }
    }

    pub fn moe(&self) -> Option<&Moe> {
        match self {
            Ffn::Moe { moe, .. } => Some(moe),
            Ffn::Gated { .. } | Ffn::Gelu { .. } => None,
        }
    }
}

/// A dense unit's matrices, each with its bias where the file has one: gated (a GLU) or,
/// without `gate`, plain GELU (BERT).
pub struct Glu<W> {
    pub gate: Option<(W, Option<W>)>,
    pub up: (W, Option<W>),
    pub down: (W, Option<W>),
}

impl<W> Glu<W> {
    /// `blk.{il}.ffn_{gate,up,down}{suffix}.weight` (and `.bias`) of `n_ff` hidden values;
    /// `gated` false: no gate.
    pub(crate) fn load<B: Backend<Weight = W>>(
        l: &Loader<B>,
        il: usize,
        suffix: &str,
        ff: usize,
        gated: bool,
    ) -> Result<Self> {
        let d = l.cfg.n_embd;
        let n = |s: &str, what: &str| blk(il, &format!("ffn_{s}{suffix}.{what}"));
        let down = (l.get(&n("down", "weight"), ff, d)?, l.opt(&n("down", "bias"), d, 1)?);
        if !gated {
            let up = (l.get(&n("up", "weight"), d, ff)?, l.opt(&n("up", "bias"), ff, 1)?);
            return Ok(Glu { gate: None, up, down });
        }
        // Fused: no gate, an up of twice the rows (gate first), its bias likewise.
        let fused = l.g.tensor(&n("gate", "weight")).is_none()
            && l.g.tensor(&n("up", "weight")).is_some_and(|t| t.rows_cols().0 == 2 * ff);
        let ([gate, up], [gate_b, up_b]) = match fused {
            true => {
                let w = l.fused(&n("up", "weight"), d, [ff, ff])?;
                let b = match l.split_vector(&n("up", "bias"), [ff, ff])? {
                    Some([g, u]) => [Some(g), Some(u)],
                    None => [None, None],
                };
                (w, b)
            }
            false => {
                let w = l.group([(n("gate", "weight"), d, ff), (n("up", "weight"), d, ff)])?;
                (w, [l.opt(&n("gate", "bias"), ff, 1)?, l.opt(&n("up", "bias"), ff, 1)?])
            }
        };
        Ok(Glu { gate: Some((gate, gate_b)), up: (up, up_b), down })
    }
}

pub enum FfnWeights<B: Backend> {
    /// A GLU or a plain GELU unit.
    Dense {
        norms: NormWeights<B::Weight>,
        glu: Glu<B::Weight>,
    },
    Moe {
        norms: NormWeights<B::Weight>,
        moe: MoeWeights<B>,
    },
}

impl<B: Backend> FfnWeights<B> {
    pub(crate) fn load(l: &Loader<B>, il: usize, f: &Ffn) -> Result<Self> {
        let norms = NormWeights::load(l, il, f.norms(), ["ffn_norm", "post_ffw_norm", "layer_output_norm"])?;
        Ok(match f {
            Ffn::Gated { n_ff, .. } => FfnWeights::Dense { norms, glu: Glu::load(l, il, "", *n_ff, true)? },
            Ffn::Gelu { n_ff, .. } => FfnWeights::Dense { norms, glu: Glu::load(l, il, "", *n_ff, false)? },
            Ffn::Moe { moe, .. } => FfnWeights::Moe { norms, moe: MoeWeights::load(l, il, moe)? },
        })
    }

    pub fn norms(&self) -> &NormWeights<B::Weight> {
        match self {
            FfnWeights::Dense { norms, .. } | FfnWeights::Moe { norms, .. } => norms,
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

/// A dense unit on `n` rows of `x`, its output to `out`: gated by `act`, or plain GELU
/// where it has no gate.
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
    let (up, up_b) = (&w.up.0, w.up.1.as_ref());
    let hidden = match &w.gate {
        Some((gate, gate_b)) => {
            b.matmul_many(&[gate, up], &[gate_b.as_ref(), up_b], x, n, &mut [&mut s.gate, &mut s.up]);
            b.glu(&mut s.gate, &s.up, act, n * n_ff);
            &s.gate
        }
        None => {
            b.matmul_many(&[up], &[up_b], x, n, &mut [&mut s.up]);
            b.gelu(&mut s.up, n * n_ff);
            &s.up
        }
    };
    match &w.down {
        (down, Some(db)) => b.matmul_many(&[down], &[Some(db)], hidden, n, &mut [out]),
        (down, None) => b.matmul(down, hidden, n, out),
    }
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
        (Ffn::Gated { act, n_ff, .. }, FfnWeights::Dense { glu: g, .. }) => {
            glu(b, g, *act, *n_ff, x, n, &mut s.glu, out)
        }
        (Ffn::Gelu { n_ff, .. }, FfnWeights::Dense { glu: g, .. }) => {
            glu(b, g, Activation::GeluTanh, *n_ff, x, n, &mut s.glu, out)
        }
        (Ffn::Moe { moe: m, .. }, FfnWeights::Moe { moe: mw, .. }) => {
            let ms = s.moe.as_mut().expect("scratch made for the model's experts");
            moe::forward(b, m, mw, x, n, &mut s.glu, ms, out)
        }
        _ => unreachable!("weights are loaded for their spec"),
    }
}
