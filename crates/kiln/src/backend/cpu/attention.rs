//! Causal attention over the f16 KV cache, one online-softmax pass per (token, head),
//! with ggml's CPU flash-attention numerics: a batch of fewer than 64 queries takes its
//! "one chunk" path (queries rounded to f16, the V accumulator kept in f16), larger ones its
//! tiled path (f32 queries and accumulator). Mirroring this keeps near-ties as llama.cpp has them.

use half::f16;

use super::ops::SyncPtr;
use super::pool::ThreadPool;
use crate::backend::AttnPlan;

/// ggml's GGML_FA_TILE_Q: query batches at least this long take the tiled (f32) path.
const FA_TILE_Q: usize = 64;

fn round_f16(x: f32) -> f32 {
    f16::from_f32(x).to_f32()
}

pub fn attention(pool: &ThreadPool, q: &[f32], kc: &[f16], vc: &[f16], plan: &AttnPlan, out: &mut [f32]) {
    let (n_head, hd) = (plan.n_head, plan.head_dim);
    let kv_dim = plan.n_head_kv * hd;
    let group = n_head / plan.n_head_kv;
    let n_tok = plan.pos.len();
    let f16_path = n_tok < FA_TILE_Q;
    let op = SyncPtr(out.as_mut_ptr());
    pool.run(n_tok * n_head, &|task| {
        let (t, h) = (task / n_head, task % n_head);
        let kvh = h / group;
        let qrow = &q[(t * n_head + h) * hd..(t * n_head + h + 1) * hd];
        let qv: Vec<f32> = if f16_path { qrow.iter().map(|&x| round_f16(x)).collect() } else { qrow.to_vec() };
        let mut acc = vec![0.0f32; hd];
        let (mut m, mut s) = (f32::NEG_INFINITY, 0.0f32);
        let seq = plan.seq[t];
        for p in plan.first_pos(t)..=plan.pos[t] {
            let base = plan.slot(seq, p) * kv_dim + kvh * hd;
            let k = &kc[base..base + hd];
            let score = qv.iter().zip(k).map(|(&a, &b)| a * b.to_f32()).sum::<f32>() * plan.scale;
            let v = &vc[base..base + hd];
            let (ms, vs);
            if score > m {
                ms = (m - score).exp();
                vs = 1.0;
                m = score;
                if f16_path {
                    acc.iter_mut().for_each(|a| *a = round_f16(*a * ms));
                } else {
                    acc.iter_mut().for_each(|a| *a *= ms);
                }
            } else {
                ms = 1.0;
                vs = (score - m).exp();
            }
            if f16_path {
                acc.iter_mut().zip(v).for_each(|(a, &x)| *a = round_f16(x.to_f32().mul_add(vs, *a)));
            } else {
                acc.iter_mut().zip(v).for_each(|(a, &x)| *a += x.to_f32() * vs);
            }
            s = s * ms + vs;
        }
        let inv = if s == 0.0 { 0.0 } else { 1.0 / s };
        // SAFETY: each task writes its own (token, head) slice of `out`.
        let o = unsafe { std::slice::from_raw_parts_mut(op.get().add((t * n_head + h) * hd), hd) };
        o.iter_mut().zip(&acc).for_each(|(o, &a)| *o = a * inv);
    });
}
