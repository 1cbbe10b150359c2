//! The mixture-of-experts feed-forward block: a router (`ffn_gate_inp`, `[n_embd,
//! n_expert]`) scores the experts of each token; the top `k` run their GLUs (3-D tensors
//! `ffn_{gate,up,down}_exps`, or a fused `ffn_gate_up_exps`) and their outputs are summed,
//! weighted by the routing. A shared expert (`ffn_{gate,up,down}_shexp`) runs for every
//! token and is added, scaled by its own sigmoid gate (`ffn_gate_inp_shexp`) where the
//! architecture has one. An expert-selection bias (`exp_probs_b.bias`, `[n_expert]`)
//! shifts which experts a token goes to without changing their weights (LFM2-MoE).

use super::blk;
use super::ffn::{self, Glu, GluScratch};
use crate::backend::{Activation, Backend, ExpertInput, Routing};
use crate::error::{KilnError, Result};
use crate::model::config::ModelConfig;
use crate::model::weights::Loader;

/// One layer's experts, as its architecture defines them.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Moe {
    pub routing: Routing,
    /// Hidden width of each expert.
    pub n_ff: usize,
    pub act: Activation,
    pub shared: Option<SharedExpert>,
    /// The layer has an expert-selection bias (`exp_probs_b`): its experts are chosen by
    /// score plus bias (`Backend::moe_route`'s `bias`).
    pub selection_bias: bool,
}

/// An expert every token goes through.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SharedExpert {
    pub n_ff: usize,
    /// Its output scaled by `σ(x · ffn_gate_inp_shexp)` (qwen2moe).
    pub gated: bool,
}

impl Moe {
    /// Values of the block's scratch per token (the largest layer sizes it).
    pub fn scratch_len(&self) -> usize {
        let r = &self.routing;
        r.n_expert + r.k * (2 + 2 * self.n_ff)
    }
}

pub struct MoeWeights<B: Backend> {
    pub router: B::Weight,
    pub gate: B::Experts,
    pub up: B::Experts,
    pub down: B::Experts,
    pub shared: Option<Glu<B::Weight>>,
    /// The shared expert's gate, `[n_embd]`.
    pub shared_gate: Option<B::Weight>,
    /// The expert-selection bias, `n_expert` values on the host (the routing reads them as
    /// parameters, as RoPE its frequency factors).
    pub selection_bias: Option<Vec<f32>>,
}

impl<B: Backend> MoeWeights<B> {
    pub(crate) fn load(l: &Loader<B>, il: usize, m: &Moe) -> Result<Self> {
        let (d, ff, ne) = (l.cfg.n_embd, m.n_ff, m.routing.n_expert);
        let n = |s: &str| blk(il, s);
        let one = |v: Option<Vec<B::Experts>>| v.and_then(|mut v| v.pop());
        let [gate, up] = match l.experts(&n("ffn_gate_up_exps.weight"), d, &[ff, ff], ne)? {
            Some(v) => {
                v.try_into().map_err(|_| KilnError::Backend("load_experts returned a wrong count".into()))?
            }
            None => {
                let names = [n("ffn_gate_exps.weight"), n("ffn_up_exps.weight")];
                l.experts_together(&[&names[0], &names[1]], d, ff, ne)?
                    .try_into()
                    .map_err(|_| KilnError::Backend("load_experts_together returned a wrong count".into()))?
            }
        };
        let down = one(l.experts(&n("ffn_down_exps.weight"), ff, &[d], ne)?).ok_or_else(|| {
            KilnError::Tensor { name: n("ffn_down_exps.weight"), msg: "missing from the file".into() }
        })?;
        let (shared, shared_gate) = match m.shared {
            None => (None, None),
            Some(s) => {
                let g = if s.gated { Some(l.get(&n("ffn_gate_inp_shexp.weight"), d, 1)?) } else { None };
                (Some(Glu::load(l, il, "_shexp", s.n_ff, true)?), g)
            }
        };
        let selection_bias = match m.selection_bias {
            false => None,
            true => Some(l.host_vector(&n("exp_probs_b.bias"), ne)?.ok_or_else(|| KilnError::Tensor {
                name: n("exp_probs_b.bias"),
                msg: "missing from the file".into(),
            })?),
        };
        Ok(MoeWeights {
            router: l.get(&n("ffn_gate_inp.weight"), d, ne)?,
            gate,
            up,
            down,
            shared,
            shared_gate,
            selection_bias,
        })
    }
}

/// The block's activations for up to `n` tokens.
pub struct MoeScratch<B: Backend> {
    logits: B::Buf,
    ids: B::Buf,
    weights: B::Buf,
    gate: B::Buf,
    up: B::Buf,
    /// Each slot's expert output, `[n * k, n_embd]`.
    y: B::Buf,
    /// The shared expert's output and gate logit.
    shared: B::Buf,
    shared_gate: B::Buf,
}

impl<B: Backend> MoeScratch<B> {
    pub fn new(b: &B, cfg: &ModelConfig, m: &Moe, n: usize) -> Result<Self> {
        let (k, d) = (m.routing.k, cfg.n_embd);
        Ok(MoeScratch {
            logits: b.alloc(n * m.routing.n_expert)?,
            ids: b.alloc(n * k)?,
            weights: b.alloc(n * k)?,
            gate: b.alloc(n * k * m.n_ff)?,
            up: b.alloc(n * k * m.n_ff)?,
            y: b.alloc(n * k * d)?,
            shared: b.alloc(n * d)?,
            shared_gate: b.alloc(n)?,
        })
    }
}

/// The block on `n` rows of `x` (already normed), its output to `out`.
#[allow(clippy::too_many_arguments)]
pub fn forward<B: Backend>(
    b: &B,
    m: &Moe,
    w: &MoeWeights<B>,
    x: &B::Buf,
    n: usize,
    glu: &mut GluScratch<B>,
    s: &mut MoeScratch<B>,
    out: &mut B::Buf,
) {
    let r = &m.routing;
    let d = b.weight_shape(&w.router).1;
    let bias = w.selection_bias.as_deref();
    b.moe_router(&w.router, &w.gate, x, n, r, bias, (&mut s.logits, &mut s.ids, &mut s.weights));
    let input = ExpertInput { x, per_slot: false, ids: &s.ids, rows: n, k: r.k };
    b.matmul_id(&[&w.gate, &w.up], input, &mut [&mut s.gate, &mut s.up]);
    b.glu(&mut s.gate, &s.up, m.act, n * r.k * m.n_ff);
    b.matmul_id(&[&w.down], ExpertInput { x: &s.gate, per_slot: true, ..input }, &mut [&mut s.y]);
    b.moe_sum(&s.y, &s.weights, n, r.k, d, out);
    if let (Some(sw), Some(se)) = (&w.shared, m.shared) {
        ffn::glu(b, sw, m.act, se.n_ff, x, n, glu, &mut s.shared);
        match &w.shared_gate {
            Some(g) => {
                b.matmul(g, x, n, &mut s.shared_gate);
                b.add_sigmoid_gated(out, &s.shared, &s.shared_gate, n, d);
            }
            None => b.add(out, &s.shared, 1.0, n * d),
        }
    }
}
