//! Matmuls on weights repacked with rows interleaved at load (`quant::interleave`): Q4_K
//! eight rows at a time, Q5_0 and Q4_1 sixteen. Each kernel call gives a group of rows × up to eight
//! tokens; a task's rows pass over eight tokens' activations while those stay in L1.
//! Every (row, token) dot has the bits of the row-major kernels, whatever the batch.

use super::ops::{quantize_rows, rows_per_task, SyncPtr};
use super::pool::ThreadPool;
use super::CpuWeight;
use crate::quant::{self, GgmlType, Interleave, Q4kX8Amx, Q4kX8Kernels, X16Kernels};

/// A group kernel with its activations' form bound: (weights, activations, tokens, out).
type DotsFn<'k> = dyn Fn(&[u8], &[u8], usize, &mut [f32]) + Sync + 'k;

/// Fewest tokens that take the AMX kernel (16-token tiles; below this the VNNI kernels
/// waste less on padding).
const AMX_MIN_TOKENS: usize = 16;

/// Most tokens a kernel call takes (both kernels' limit).
const TOKENS: usize = 8;
const _: () = assert!(Q4kX8Kernels::TOKENS == TOKENS && X16Kernels::TOKENS == TOKENS);
/// Most rows a kernel call gives.
const ROWS: usize = X16Kernels::ROWS;

#[allow(clippy::too_many_arguments)]
pub(super) fn matmul(
    pool: &ThreadPool,
    w: &CpuWeight,
    layout: Interleave,
    packed: &[u8],
    x: &[f32],
    n_tok: usize,
    out: &mut [f32],
    act_buf: &mut Vec<u8>,
) {
    let (k, n, rs) = (w.cols, w.rows, w.row_size);
    let group = layout.rows();
    // The kernels and the activations in the form they read.
    type Dots<'k> = Box<DotsFn<'k>>;
    type Prepare<'k> = Box<dyn Fn(&[f32], &mut [u8]) + Sync + 'k>;
    let (act_row, prepare, dots): (usize, Prepare, Dots) = match layout {
        Interleave::Q4kX8 => {
            let k8 = quant::q4_k_x8_kernels().expect("weights are repacked only where the kernels exist");
            let act_row = GgmlType::Q8_K.row_size(k).expect("weight rows are whole blocks");
            let prepare = |src: &[f32], dst: &mut [u8]| {
                quant::quantize_activation(GgmlType::Q8_K, src, dst).expect("sizes match")
            };
            (act_row, Box::new(prepare), Box::new(move |w, a, nt, v| k8.dots(w, a, k, nt, v, group)))
        }
        Interleave::Q5_0X16 | Interleave::Q4_1X16 => {
            let k16 =
                quant::x16_kernels(layout.ty()).expect("weights are repacked only where the kernels exist");
            let prepare = move |src: &[f32], dst: &mut [u8]| k16.prepare(src, dst).expect("sizes match");
            let dots = move |w: &[u8], a: &[u8], nt, v: &mut [f32]| k16.dots(w, a, k, nt, v, group);
            (X16Kernels::act_row_size(k), Box::new(prepare), Box::new(dots))
        }
    };
    let act = quantize_rows(pool, x, n_tok, k, act_row, act_buf, &prepare);
    let op = SyncPtr(out.as_mut_ptr());
    // SAFETY: element (t, r) is written by the task owning row r only.
    let put = |t: usize, r: usize, v: f32| unsafe { *op.get().add(t * n + r) = v };
    let amx = quant::q4_k_x8_amx().filter(|_| layout == Interleave::Q4kX8 && n_tok >= AMX_MIN_TOKENS);
    if let Some(amx) = amx {
        return amx_matmul(pool, amx, packed, rs, act, k, n, n_tok, &op, &dots);
    }
    let chunk = rows_per_task(n, pool.n_threads()).next_multiple_of(group);
    pool.run(n.div_ceil(chunk), &|task| {
        let rows = task * chunk..((task + 1) * chunk).min(n);
        let mut v = [0f32; TOKENS * ROWS];
        for t0 in (0..n_tok).step_by(TOKENS) {
            let nt = (n_tok - t0).min(TOKENS);
            for r in rows.clone().step_by(group) {
                dots(&packed[r * rs..(r + group) * rs], &act[t0 * act_row..(t0 + nt) * act_row], nt, &mut v);
                for (t, vt) in v.chunks_exact(group).take(nt).enumerate() {
                    vt.iter().enumerate().for_each(|(i, &x)| put(t0 + t, r + i, x));
                }
            }
        }
    });
}

/// The prompt matmul on AMX tiles: 16 rows (two groups) × every token per call; a last
/// group of 8 rows takes the VNNI kernel.
#[allow(clippy::too_many_arguments)]
fn amx_matmul(
    pool: &ThreadPool,
    amx: Q4kX8Amx,
    packed: &[u8],
    rs: usize,
    act: &[u8],
    k: usize,
    n: usize,
    n_tok: usize,
    out: &SyncPtr<f32>,
    dots: &DotsFn,
) {
    // SAFETY: outputs (t, r..r + len) are written by the task owning rows r.. only.
    let put = |t: usize, r: usize, v: &[f32]| unsafe {
        std::ptr::copy_nonoverlapping(v.as_ptr(), out.get().add(t * n + r), v.len())
    };
    const ROWS: usize = Q4kX8Amx::ROWS;
    thread_local!(static TILED: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) });
    TILED.with_borrow_mut(|tiled| {
        tiled.resize(Q4kX8Amx::acts_len(k, n_tok), 0);
        let act_row = act.len() / n_tok;
        // Laid out a pair of token tiles per task (a whole number of the layout's units).
        let (pair, pair_bytes) = (2 * Q4kX8Amx::TOKENS, Q4kX8Amx::acts_len(k, 2 * Q4kX8Amx::TOKENS));
        let tp = SyncPtr(tiled.as_mut_ptr());
        pool.run(n_tok.div_ceil(pair), &|task| {
            let toks = task * pair..((task + 1) * pair).min(n_tok);
            // SAFETY: each task writes its own pair's bytes of `tiled`, sized for n_tok above.
            let dst = unsafe {
                std::slice::from_raw_parts_mut(
                    tp.get().add(task * pair_bytes),
                    Q4kX8Amx::acts_len(k, toks.len()),
                )
            };
            amx.prepare(&act[toks.start * act_row..toks.end * act_row], k, toks.len(), dst);
        });
        let tiled = &tiled[..];
        let chunk = rows_per_task(n, pool.n_threads()).next_multiple_of(ROWS);
        pool.run(n.div_ceil(chunk), &|task| {
            let rows = task * chunk..((task + 1) * chunk).min(n);
            let mut v = vec![0f32; n_tok * ROWS];
            for r in rows.step_by(ROWS) {
                if r + ROWS <= n {
                    amx.dots(&packed[r * rs..(r + ROWS) * rs], tiled, k, n_tok, &mut v);
                    v.chunks_exact(ROWS).enumerate().for_each(|(t, vt)| put(t, r, vt));
                    continue;
                }
                for t0 in (0..n_tok).step_by(TOKENS) {
                    let nt = (n_tok - t0).min(TOKENS);
                    let w8 = &packed[r * rs..(r + 8) * rs];
                    dots(w8, &act[t0 * act_row..(t0 + nt) * act_row], nt, &mut v);
                    v.chunks_exact(8).take(nt).enumerate().for_each(|(t, vt)| put(t0 + t, r, vt));
                }
            }
        });
    });
}
