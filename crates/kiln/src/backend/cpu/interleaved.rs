//! Matmuls on weights repacked with rows interleaved at load (`quant::interleave`): Q4_K
//! eight rows at a time, Q5_0 and Q4_1 sixteen. Each kernel call gives a group of rows × up to eight
//! tokens; a task's rows pass over eight tokens' activations while those stay in L1.
//! Every (row, token) dot has the bits of the row-major kernels, whatever the batch.

use super::ops::{quantize_rows, rows_per_task, SyncPtr};
use super::pool::ThreadPool;
use super::CpuWeight;
use crate::quant::{self, GgmlType, Interleave, Q4kX8Amx, Q4kX8Kernels, X16Kernels};

/// Fewest tokens that take the AMX kernel: its 16-token tiles go in pairs, so 16 tokens pay
/// for 32 (the VNNI kernels were 1.4x faster there on an AMX Xeon, even from 20 to 28, and
/// the AMX kernel faster from 32).
const AMX_MIN_TOKENS: usize = 24;

/// Most tokens a kernel call takes (both kernels' limit).
const TOKENS: usize = 8;
const _: () = assert!(Q4kX8Kernels::TOKENS == TOKENS && X16Kernels::TOKENS == TOKENS);
/// Most rows a kernel call gives.
const ROWS: usize = X16Kernels::ROWS;

/// An interleaved layout's group kernels for rows of `k` columns, and the form of the
/// activation rows they read.
#[derive(Clone, Copy)]
pub(super) struct GroupDots {
    kernels: Kernels,
    k: usize,
    /// Rows a group.
    pub group: usize,
    /// Bytes of an activation row.
    pub act_row: usize,
}

#[derive(Clone, Copy)]
enum Kernels {
    Q4kX8(Q4kX8Kernels),
    X16(X16Kernels),
}

impl GroupDots {
    pub fn of(layout: Interleave, k: usize) -> Self {
        let expect = "weights are repacked only where the kernels exist";
        let (kernels, act_row) = match layout {
            Interleave::Q4kX8 => (
                Kernels::Q4kX8(quant::q4_k_x8_kernels().expect(expect)),
                GgmlType::Q8_K.row_size(k).expect("weight rows are whole blocks"),
            ),
            Interleave::Q5_0X16 | Interleave::Q4_1X16 => {
                (Kernels::X16(quant::x16_kernels(layout.ty()).expect(expect)), X16Kernels::act_row_size(k))
            }
        };
        GroupDots { kernels, k, group: layout.rows(), act_row }
    }

    /// One activation row in the form the kernels read.
    pub fn prepare(&self, src: &[f32], dst: &mut [u8]) {
        match self.kernels {
            Kernels::Q4kX8(_) => quant::quantize_activation(GgmlType::Q8_K, src, dst),
            Kernels::X16(k16) => k16.prepare(src, dst),
        }
        .expect("sizes match")
    }

    /// `v[t * group + i] = dot(row i of the group w, token t)` for `nt` (1..=8) tokens.
    fn dots(&self, w: &[u8], a: &[u8], nt: usize, v: &mut [f32]) {
        match self.kernels {
            Kernels::Q4kX8(k8) => k8.dots(w, a, self.k, nt, v, self.group),
            Kernels::X16(k16) => k16.dots(w, a, self.k, nt, v, self.group),
        }
    }

    /// `put(t, r, dot(w[r], act[t]))` for tokens `0..n_tok` and `rows` (whole groups) of
    /// the packed weight (`rs` bytes a row), eight tokens a kernel call.
    pub fn rows(
        &self,
        packed: &[u8],
        rs: usize,
        rows: std::ops::Range<usize>,
        act: &[u8],
        n_tok: usize,
        put: &impl Fn(usize, usize, f32),
    ) {
        let (group, act_row) = (self.group, self.act_row);
        let mut v = [0f32; TOKENS * ROWS];
        for t0 in (0..n_tok).step_by(TOKENS) {
            let nt = (n_tok - t0).min(TOKENS);
            for r in rows.clone().step_by(group) {
                self.dots(
                    &packed[r * rs..(r + group) * rs],
                    &act[t0 * act_row..(t0 + nt) * act_row],
                    nt,
                    &mut v,
                );
                for (t, vt) in v.chunks_exact(group).take(nt).enumerate() {
                    vt.iter().enumerate().for_each(|(i, &x)| put(t0 + t, r + i, x));
                }
            }
        }
    }
}

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
    let gd = GroupDots::of(layout, k);
    let act = quantize_rows(pool, x, n_tok, k, gd.act_row, act_buf, &|src, dst| gd.prepare(src, dst));
    let op = SyncPtr(out.as_mut_ptr());
    // SAFETY: element (t, r) is written by the task owning row r only.
    let put = |t: usize, r: usize, v: f32| unsafe { *op.get().add(t * n + r) = v };
    let amx = quant::q4_k_x8_amx().filter(|_| layout == Interleave::Q4kX8 && n_tok >= AMX_MIN_TOKENS);
    if let Some(amx) = amx {
        return amx_matmul(pool, amx, packed, rs, act, k, n, n_tok, &op, &gd);
    }
    let chunk = rows_per_task(n, pool.n_threads()).next_multiple_of(gd.group);
    pool.run(n.div_ceil(chunk), &|task| {
        let rows = task * chunk..((task + 1) * chunk).min(n);
        gd.rows(packed, rs, rows, act, n_tok, &put);
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
    gd: &GroupDots,
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
                    gd.dots(w8, &act[t0 * act_row..(t0 + nt) * act_row], nt, &mut v);
                    v.chunks_exact(8).take(nt).enumerate().for_each(|(t, vt)| put(t0 + t, r, vt));
                }
            }
        });
    });
}
