//! Mixture-of-experts ops on the CPU: the router's top-k with ggml's softmax arithmetic,
//! the experts' matmuls with tokens grouped by expert (each expert's rows are read once
//! per batch, by the dense matmul's kernels), and the weighted sum of their outputs.

use std::sync::Arc;

use super::ops::{self, SyncPtr};
use super::pool::ThreadPool;
use super::{expert_gemv, vexp, CpuWeight};
use crate::backend::{ExpertInput, Gating, Routing};
use crate::error::{KilnError, Result};
use crate::gguf::{GgufFile, TensorInfo};

/// `n_expert` matrices of `rows × cols`, each a view of its rows in the 3-D tensor.
pub struct CpuExperts {
    pub experts: Vec<CpuWeight>,
    pub rows: usize,
    pub cols: usize,
}

/// The per-part stacks of the 3-D tensor `t` (see `Backend::load_experts`).
pub(super) fn load(
    gguf: &Arc<GgufFile>,
    arena: Option<Arc<super::arena::Arena>>,
    t: &TensorInfo,
    n_expert: usize,
    parts: &[usize],
) -> Result<Vec<CpuExperts>> {
    let (rows, cols) = t.rows_cols();
    let per_expert: usize = parts.iter().sum();
    if n_expert == 0 || rows != n_expert * per_expert {
        return Err(KilnError::Tensor {
            name: t.name.clone(),
            msg: format!("{rows} rows, expected {n_expert} experts of {per_expert}"),
        });
    }
    let row_size = t.ty.row_size(cols)? as u64;
    let mut start = 0;
    parts
        .iter()
        .map(|&part| {
            let experts = (0..n_expert)
                .map(|e| {
                    let first = (e * per_expert + start) as u64;
                    let view = TensorInfo {
                        name: t.name.clone(),
                        dims: vec![cols as u64, part as u64],
                        ty: t.ty,
                        offset: t.offset + first * row_size,
                        size: part as u64 * row_size,
                        part: t.part,
                    };
                    CpuWeight::load(gguf, arena.clone(), &view)
                })
                .collect::<Result<Vec<_>>>()?;
            start += part;
            Ok(CpuExperts { experts, rows: part, cols })
        })
        .collect()
}

/// ggml's `_mm512_reduce_add_ps` (GCC's order): halves, quarters, then pairs.
fn reduce16(v: &[f32; 16]) -> f32 {
    let a: [f32; 8] = std::array::from_fn(|i| v[i + 8] + v[i]);
    let b: [f32; 4] = std::array::from_fn(|i| a[i + 4] + a[i]);
    let c = [b[0] + b[2], b[1] + b[3]];
    c[0] + c[1]
}

/// ggml's `soft_max` of one row (AVX-512 build): `expf(x - max)` sixteen values at a time
/// with its vector `expf`, each group's sum reduced in f32 and added in f64, the tail
/// with libm's `expf`; then every value times `1 / sum` (rounded to f32).
fn softmax(x: &[f32], y: &mut [f32]) {
    let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0f64;
    let body = x.len() / 16 * 16;
    for (xs, ys) in x[..body].chunks_exact(16).zip(y[..body].chunks_exact_mut(16)) {
        let v: [f32; 16] = std::array::from_fn(|i| vexp::expf_ggml(xs[i] - max));
        ys.copy_from_slice(&v);
        sum += reduce16(&v) as f64;
    }
    for (xv, yv) in x[body..].iter().zip(&mut y[body..]) {
        *yv = (xv - max).exp();
        sum += *yv as f64;
    }
    let inv = (1.0 / sum) as f32;
    y.iter_mut().for_each(|v| *v *= inv);
}

/// Routes one row: the top `r.k` experts' ids and weights, as `Backend::moe_route` says
/// (chosen by score plus `bias` where there is one, weighted by score alone).
pub fn route_row(
    logits: &[f32],
    r: &Routing,
    bias: Option<&[f32]>,
    probs: &mut [f32],
    ids: &mut [f32],
    weights: &mut [f32],
) {
    match r.gating {
        Gating::Softmax => softmax(logits, probs),
        Gating::Sigmoid => probs.iter_mut().zip(logits).for_each(|(p, &x)| *p = 1.0 / (1.0 + (-x).exp())),
    }
    let key = |e: u32| probs[e as usize] + bias.map_or(0.0, |b| b[e as usize]);
    // Top k by key, highest first, the lowest index on ties (a stable descending sort).
    let mut order: Vec<u32> = (0..r.n_expert as u32).collect();
    order.sort_by(|&a, &b| key(b).total_cmp(&key(a)));
    for j in 0..r.k {
        ids[j] = order[j] as f32;
        weights[j] = probs[order[j] as usize];
    }
    if r.norm {
        let sum: f64 = weights[..r.k].iter().map(|&w| w as f64).sum();
        // The least normal f16 (ggml's clamp against dividing by zero).
        let sum = (sum as f32).max(6.1035156e-5);
        weights[..r.k].iter_mut().for_each(|w| *w /= sum);
    }
    if r.scale != 0.0 && r.scale != 1.0 {
        weights[..r.k].iter_mut().for_each(|w| *w *= r.scale);
    }
}

pub(super) fn route(
    logits: &[f32],
    rows: usize,
    r: &Routing,
    bias: Option<&[f32]>,
    ids: &mut [f32],
    weights: &mut [f32],
) {
    let mut probs = vec![0f32; r.n_expert];
    for t in 0..rows {
        let (a, b) = (t * r.k, (t + 1) * r.k);
        route_row(
            &logits[t * r.n_expert..(t + 1) * r.n_expert],
            r,
            bias,
            &mut probs,
            &mut ids[a..b],
            &mut weights[a..b],
        );
    }
}

/// An expert with fewer slots than this takes its matmuls in [`expert_gemv`]'s one
/// dispatch (the dense matmul's GEMV range); from here on, in its own (the GEMM tiles).
const FEW: usize = crate::quant::TILE;

/// `Backend::matmul_id`: the experts some slot chose, each meeting its slots' input rows.
/// Experts with few slots (every expert in a decode step) go through one dispatch for all
/// of them ([`expert_gemv`]); each of the others has its slots' rows gathered, multiplied
/// by the dense matmul and scattered back to the slots' output rows. Either way a row's
/// value is that of the same dot kernel, whatever the batch.
pub(super) fn matmul_id(
    pool: &ThreadPool,
    ws: &[&CpuExperts],
    input: ExpertInput<Vec<f32>>,
    outs: &mut [&mut Vec<f32>],
    act_buf: &mut Vec<u8>,
) {
    let ExpertInput { x, per_slot, ids, rows, k } = input;
    let Some(first) = ws.first() else { return };
    let n_expert = first.experts.len();
    let cols = first.cols;
    let mut slots: Vec<Vec<usize>> = vec![Vec::new(); n_expert];
    for (slot, &id) in ids[..rows * k].iter().enumerate() {
        slots[id as usize].push(slot);
    }
    let chosen = slots.iter().enumerate().filter(|(_, s)| !s.is_empty());
    let (few, many): (Vec<_>, Vec<_>) = chosen.map(|(e, s)| (e, &s[..])).partition(|(_, s)| s.len() < FEW);
    if !few.is_empty() {
        expert_gemv::matmul(pool, ws, x, per_slot, k, &few, outs, act_buf);
    }
    let mut xin = Vec::new();
    let mut y = Vec::new();
    for (e, sl) in many {
        xin.clear();
        for &slot in sl {
            let src = if per_slot { slot } else { slot / k };
            xin.extend_from_slice(&x[src * cols..(src + 1) * cols]);
        }
        for (w, out) in ws.iter().zip(outs.iter_mut()) {
            let n = w.rows;
            y.resize(sl.len() * n, 0.0);
            ops::matmul(pool, &w.experts[e], &xin, sl.len(), &mut y, act_buf);
            for (i, &slot) in sl.iter().enumerate() {
                out[slot * n..(slot + 1) * n].copy_from_slice(&y[i * n..(i + 1) * n]);
            }
        }
    }
}

/// `Backend::moe_sum`.
pub(super) fn sum(
    pool: &ThreadPool,
    y: &[f32],
    weights: &[f32],
    rows: usize,
    k: usize,
    dim: usize,
    out: &mut [f32],
) {
    let op = SyncPtr(out.as_mut_ptr());
    pool.run(rows, &|t| {
        // SAFETY: each task writes its own row of `out`.
        let o = unsafe { std::slice::from_raw_parts_mut(op.get().add(t * dim), dim) };
        let w = &weights[t * k..(t + 1) * k];
        let ys = |j: usize| &y[(t * k + j) * dim..(t * k + j + 1) * dim];
        o.iter_mut().zip(ys(0)).for_each(|(o, &v)| *o = v * w[0]);
        for (j, &wj) in w.iter().enumerate().skip(1) {
            o.iter_mut().zip(ys(j)).for_each(|(o, &v)| *o += v * wj);
        }
    });
}

/// `Backend::add_sigmoid_gated`.
pub(super) fn add_sigmoid_gated(x: &mut [f32], y: &[f32], g: &[f32], rows: usize, dim: usize) {
    for t in 0..rows {
        let gt = g[t];
        let gate = (gt / (1.0 + (-gt).exp())) / gt;
        let xr = &mut x[t * dim..(t + 1) * dim];
        xr.iter_mut().zip(&y[t * dim..(t + 1) * dim]).for_each(|(x, &v)| *x += v * gate);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn route_picks_the_top_k_in_order_and_normalizes() {
        let r = Routing { n_expert: 5, k: 2, gating: Gating::Softmax, norm: true, scale: 1.0 };
        let logits = [0.1, 2.0, -1.0, 2.0, 1.5];
        let (mut p, mut ids, mut w) = ([0f32; 5], [0f32; 2], [0f32; 2]);
        route_row(&logits, &r, None, &mut p, &mut ids, &mut w);
        // Ties go to the lower index first.
        assert_eq!(ids, [1.0, 3.0]);
        assert_eq!(w, [0.5, 0.5]);
        let r = Routing { norm: false, scale: 2.0, k: 3, ..r };
        let (mut ids, mut w) = ([0f32; 3], [0f32; 3]);
        route_row(&logits, &r, None, &mut p, &mut ids, &mut w);
        assert_eq!(ids, [1.0, 3.0, 4.0]);
        let total: f32 = p.iter().sum();
        assert!((total - 1.0).abs() < 1e-6);
        assert_eq!(w[2], 2.0 * p[4]);
        let r = Routing { gating: Gating::Sigmoid, ..r };
        route_row(&logits, &r, None, &mut p, &mut ids, &mut w);
        assert_eq!(w[0], 2.0 / (1.0 + (-2.0f32).exp()));
    }

    /// An expert-selection bias (LFM2-MoE's `exp_probs_b`) picks the experts; the sigmoid
    /// scores alone weight them.
    #[test]
    fn the_bias_picks_the_experts_and_the_scores_weight_them() {
        let r = Routing { n_expert: 4, k: 2, gating: Gating::Sigmoid, norm: false, scale: 1.0 };
        let logits = [2.0, 1.0, 0.0, -1.0];
        let s = |x: f32| 1.0 / (1.0 + (-x).exp());
        let (mut p, mut ids, mut w) = ([0f32; 4], [0f32; 2], [0f32; 2]);
        route_row(&logits, &r, Some(&[0.0; 4]), &mut p, &mut ids, &mut w);
        assert_eq!((ids, w), ([0.0, 1.0], [s(2.0), s(1.0)]));
        // A bias lifts expert 3 over 1 and a negative one drops expert 0; the weights stay
        // the sigmoid scores, normalized to sum to one.
        let r = Routing { norm: true, ..r };
        route_row(&logits, &r, Some(&[-1.0, 0.0, 0.5, 0.9]), &mut p, &mut ids, &mut w);
        assert_eq!(ids, [3.0, 2.0]);
        let sum = s(-1.0) + s(0.0);
        assert!((w[0] - s(-1.0) / sum).abs() < 1e-6 && (w[1] - s(0.0) / sum).abs() < 1e-6, "{w:?}");
        // Ties go to the lower index.
        route_row(&[0.0; 4], &r, Some(&[0.0; 4]), &mut p, &mut ids, &mut w);
        assert_eq!((ids, w), ([0.0, 1.0], [0.5, 0.5]));
    }

    #[test]
    fn softmax_sums_to_one_over_groups_and_tail() {
        let x: Vec<f32> = (0..37).map(|i| (i as f32 * 0.37).sin() * 3.0).collect();
        let mut y = vec![0f32; 37];
        softmax(&x, &mut y);
        let s: f64 = y.iter().map(|&v| v as f64).sum();
        assert!((s - 1.0).abs() < 1e-5, "{s}");
        let want: Vec<f64> = x.iter().map(|&v| (v as f64).exp()).collect();
        let ws: f64 = want.iter().sum();
        for (g, w) in y.iter().zip(&want) {
            assert!((*g as f64 - w / ws).abs() < 1e-6);
        }
    }
}
