//! Causal attention over the f16 KV cache with an online softmax per query, with the
//! numerics of ggml's CPU flash-attention "one chunk" path (queries rounded to f16, the V
//! accumulator kept in f16), which llama.cpp takes for every decode step and for prompts of
//! fewer than 64 tokens. ggml switches to f32 for longer batches; kiln does not, so that a
//! row's result never depends on its batch (DESIGN.md, batch invariance).
//!
//! Flash-style tiling: one task takes a head and a tile of consecutive queries of the same
//! sequence, and widens each K/V row to f32 once for the whole tile. Every query still
//! sees its keys in ascending position with the same arithmetic, so its result does not
//! depend on the tile (batch invariance). Scratch lives on the task's stack: no allocation.

use half::f16;

use super::ops::SyncPtr;
use super::pool::ThreadPool;
use crate::backend::AttnPlan;
use crate::quant::{self, GgmlType, VecDotFn};

/// Queries per task; their accumulators and one K/V row stay in L1.
const Q_TILE: usize = 8;
/// Widest head the stack scratch holds; wider heads use heap scratch per task.
const MAX_HEAD_DIM: usize = 256;

pub fn attention(pool: &ThreadPool, q: &[f32], kc: &[f16], vc: &[f16], plan: &AttnPlan, out: &mut [f32]) {
    let n_head = plan.n_head;
    let n_tok = plan.pos.len();
    let n_tiles = n_tok.div_ceil(Q_TILE);
    let dot = quant::vec_dot_fn(GgmlType::F32);
    let f16_acc = true;
    let op = SyncPtr(out.as_mut_ptr());
    pool.run(n_tiles * n_head, &|task| {
        // Heads vary fastest: a decode step's heads spread over the threads.
        let (tile, h) = (task / n_head, task % n_head);
        let t0 = tile * Q_TILE;
        let t1 = (t0 + Q_TILE).min(n_tok);
        // Split the tile into runs of one sequence.
        let mut a = t0;
        while a < t1 {
            let mut b = a + 1;
            while b < t1 && plan.seq[b] == plan.seq[a] {
                b += 1;
            }
            if plan.head_dim <= MAX_HEAD_DIM {
                let mut scratch = Scratch::<[f32; MAX_HEAD_DIM * Q_TILE], [f32; MAX_HEAD_DIM]> {
                    q: [0.0; MAX_HEAD_DIM * Q_TILE],
                    acc: [0.0; MAX_HEAD_DIM * Q_TILE],
                    k: [0.0; MAX_HEAD_DIM],
                    v: [0.0; MAX_HEAD_DIM],
                };
                run_tile(q, kc, vc, plan, h, a..b, dot, f16_acc, &mut scratch, op);
            } else {
                let hd = plan.head_dim;
                let mut scratch = Scratch {
                    q: vec![0.0; hd * Q_TILE],
                    acc: vec![0.0; hd * Q_TILE],
                    k: vec![0.0; hd],
                    v: vec![0.0; hd],
                };
                run_tile(q, kc, vc, plan, h, a..b, dot, f16_acc, &mut scratch, op);
            }
            a = b;
        }
    });
}

struct Scratch<T, R> {
    /// f16-rounded queries of the tile, `[tile, head_dim]`.
    q: T,
    /// Unnormalized outputs, `[tile, head_dim]`.
    acc: T,
    /// The current K and V rows, widened.
    k: R,
    v: R,
}

/// Attention of head `h` for queries `ts` (all of one sequence).
#[allow(clippy::too_many_arguments)]
fn run_tile<T: AsMut<[f32]>, R: AsMut<[f32]>>(
    q: &[f32],
    kc: &[f16],
    vc: &[f16],
    plan: &AttnPlan,
    h: usize,
    ts: std::ops::Range<usize>,
    dot: VecDotFn,
    f16_acc: bool,
    s: &mut Scratch<T, R>,
    op: SyncPtr<f32>,
) {
    let (n_head, hd) = (plan.n_head, plan.head_dim);
    let kv_dim = plan.n_head_kv * hd;
    let kvh = h / (n_head / plan.n_head_kv);
    let nq = ts.len();
    let (qs, acc) = (&mut s.q.as_mut()[..nq * hd], &mut s.acc.as_mut()[..nq * hd]);
    let (kr, vr) = (&mut s.k.as_mut()[..hd], &mut s.v.as_mut()[..hd]);
    for (j, t) in ts.clone().enumerate() {
        let src = &q[(t * n_head + h) * hd..(t * n_head + h + 1) * hd];
        let dst = &mut qs[j * hd..(j + 1) * hd];
        dst.copy_from_slice(src);
        if f16_acc {
            round_f16(dst);
        }
    }
    acc.fill(0.0);
    let mut m = [f32::NEG_INFINITY; Q_TILE];
    let mut sum = [0.0f32; Q_TILE];
    let seq = plan.seq[ts.start];
    let lo = ts.clone().map(|t| plan.first_pos(t)).min().unwrap_or(0);
    let hi = ts.clone().map(|t| plan.pos[t]).max().unwrap_or(0);
    for p in lo..=hi {
        let base = plan.slot(seq, p) * kv_dim + kvh * hd;
        widen(&kc[base..base + hd], kr);
        widen(&vc[base..base + hd], vr);
        let kb: &[u8] = bytemuck::cast_slice(kr);
        for (j, t) in ts.clone().enumerate() {
            if p < plan.first_pos(t) || p > plan.pos[t] {
                continue;
            }
            let qj = &qs[j * hd..(j + 1) * hd];
            let score = dot(bytemuck::cast_slice(qj), kb, hd) * plan.scale;
            let a = &mut acc[j * hd..(j + 1) * hd];
            let (ms, vs);
            if score > m[j] {
                ms = (m[j] - score).exp();
                vs = 1.0;
                m[j] = score;
                a.iter_mut().for_each(|a| *a *= ms);
                if f16_acc {
                    round_f16(a);
                }
            } else {
                ms = 1.0;
                vs = (score - m[j]).exp();
            }
            if f16_acc {
                mad_f16(a, vr, vs);
            } else {
                a.iter_mut().zip(vr.iter()).for_each(|(a, &x)| *a += x * vs);
            }
            sum[j] = sum[j] * ms + vs;
        }
    }
    for (j, t) in ts.enumerate() {
        let inv = if sum[j] == 0.0 { 0.0 } else { 1.0 / sum[j] };
        // SAFETY: each task writes its own (token, head) slices of `out`.
        let o = unsafe { std::slice::from_raw_parts_mut(op.get().add((t * n_head + h) * hd), hd) };
        o.iter_mut().zip(&acc[j * hd..(j + 1) * hd]).for_each(|(o, &a)| *o = a * inv);
    }
}

/// f16 -> f32 (exact), with F16C where the CPU has it.
fn widen(src: &[f16], dst: &mut [f32]) {
    quant::dequantize_row(GgmlType::F16, bytemuck::cast_slice(src), dst).expect("sizes match");
}

/// Rounds every value to the nearest f16 (ties to even), as storing to f16 does.
fn round_f16(x: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if quant::cpu_tier() >= quant::CpuTier::Avx2 {
        // SAFETY: the CPU has AVX2, FMA and F16C.
        return unsafe { simd::round_f16(x) };
    }
    x.iter_mut().for_each(|v| *v = f16::from_f32(*v).to_f32());
}

/// `acc = f16(fma(v, s, acc))`: ggml's f16 accumulator update.
fn mad_f16(acc: &mut [f32], v: &[f32], s: f32) {
    #[cfg(target_arch = "x86_64")]
    if quant::cpu_tier() >= quant::CpuTier::Avx2 {
        // SAFETY: the CPU has AVX2, FMA and F16C.
        return unsafe { simd::mad_f16(acc, v, s) };
    }
    acc.iter_mut().zip(v).for_each(|(a, &x)| *a = f16::from_f32(x.mul_add(s, *a)).to_f32());
}

#[cfg(target_arch = "x86_64")]
mod simd {
    use std::arch::x86_64::*;

    use half::f16;

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn round8(v: __m256) -> __m256 {
        _mm256_cvtph_ps(_mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(v))
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn round_f16(x: &mut [f32]) {
        let mut c = x.chunks_exact_mut(8);
        for c in &mut c {
            _mm256_storeu_ps(c.as_mut_ptr(), round8(_mm256_loadu_ps(c.as_ptr())));
        }
        c.into_remainder().iter_mut().for_each(|v| *v = f16::from_f32(*v).to_f32());
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn mad_f16(acc: &mut [f32], v: &[f32], s: f32) {
        let n = acc.len().min(v.len());
        let sv = _mm256_set1_ps(s);
        let mut i = 0;
        while i + 8 <= n {
            let a = _mm256_loadu_ps(acc.as_ptr().add(i));
            let x = _mm256_loadu_ps(v.as_ptr().add(i));
            _mm256_storeu_ps(acc.as_mut_ptr().add(i), round8(_mm256_fmadd_ps(x, sv, a)));
            i += 8;
        }
        for j in i..n {
            acc[j] = f16::from_f32(v[j].mul_add(s, acc[j])).to_f32();
        }
    }
}
