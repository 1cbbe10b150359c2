//! An encoder's F16 matmul on AMX-BF16 tiles (`quant::F16Amx`): the activations laid out as
//! token tiles once (a task per tile), then each task lays out its range of 16-row weight
//! panels once and multiplies them by the token tiles a block at a time, so a block of
//! tiles stays in L2 while every panel of the range passes over it.
//!
//! Only weights marked as an encoder's (`Backend::encoder_weight`) take this path, at every
//! token count: each (row, token) has one sequence of operations whatever the batch, so a
//! row's result does not depend on the batch, though its bits differ from the FMA tiles'
//! (`quant::F16Gemm`, llama.cpp's tinyBLAS order) by float rounding.

use std::cell::RefCell;

use super::ops::SyncPtr;
use super::pool::ThreadPool;
use super::CpuWeight;
use crate::quant::F16Amx;

/// Bytes of token tiles multiplied by every panel of a task before the next block: about
/// half of a core's L2, beside the panel being read.
const TOKEN_BLOCK_BYTES: usize = 768 << 10;

/// A cache line, so the laid-out panels start aligned for the tile loads.
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(C, align(64))]
struct Line([u8; 64]);

/// `out[t, r] = dot(w[r], x[t])` for an F16 weight of rows of `k` values, `k` whole steps
/// (`F16Amx::fits`).
pub(super) fn matmul(
    pool: &ThreadPool,
    amx: F16Amx,
    w: &CpuWeight,
    x: &[f32],
    n_tok: usize,
    out: &mut [f32],
    act_buf: &mut Vec<u8>,
) {
    let (k, n, rs) = (w.cols, w.rows, w.row_size);
    let tl = F16Amx::tile_len(k);
    let tiles = n_tok.div_ceil(F16Amx::TOKENS);
    if act_buf.len() < tiles * tl {
        act_buf.resize(tiles * tl, 0);
    }
    let ap = SyncPtr(act_buf.as_mut_ptr());
    pool.run(tiles, &|j| {
        let t1 = (F16Amx::TOKENS * (j + 1)).min(n_tok);
        // SAFETY: each task writes its own tile of the buffer, sized above.
        let dst = unsafe { std::slice::from_raw_parts_mut(ap.get().add(j * tl), tl) };
        let ok = amx.token_tile(&x[F16Amx::TOKENS * j * k..t1 * k], k, dst);
        assert!(ok, "token tile of {k} values");
    });
    let acts = &act_buf[..tiles * tl];
    let wb = w.bytes().expect("F16 weights are not interleaved");
    let panels = n.div_ceil(F16Amx::ROWS);
    let chunk = panels.div_ceil(2 * pool.n_threads()).max(1);
    let block = (TOKEN_BLOCK_BYTES / tl).max(1);
    let op = SyncPtr(out.as_mut_ptr());
    thread_local!(static PANELS: RefCell<Vec<Line>> = const { RefCell::new(Vec::new()) });
    pool.run(panels.div_ceil(chunk), &|task| {
        let ps = task * chunk..((task + 1) * chunk).min(panels);
        PANELS.with_borrow_mut(|buf| {
            let lines = ps.len() * tl / 64;
            if buf.len() < lines {
                buf.resize(lines, Line([0; 64]));
            }
            let bytes: &mut [u8] = bytemuck::cast_slice_mut(&mut buf[..lines]);
            for (p, dst) in ps.clone().zip(bytes.chunks_exact_mut(tl)) {
                let r0 = p * F16Amx::ROWS;
                let ok = amx.panel(&wb[r0 * rs..], rs, F16Amx::ROWS.min(n - r0), k, dst);
                assert!(ok, "panel of {n} rows of {k} values");
            }
            for b0 in (0..tiles).step_by(block) {
                let b1 = (b0 + block).min(tiles);
                let (t0, nt) = (b0 * F16Amx::TOKENS, (b1 * F16Amx::TOKENS).min(n_tok) - b0 * F16Amx::TOKENS);
                for (p, panel) in ps.clone().zip(bytes.chunks_exact(tl)) {
                    let r0 = p * F16Amx::ROWS;
                    let rows = F16Amx::ROWS.min(n - r0);
                    // SAFETY: the task owns rows r0..r0 + rows of every token's output row
                    // (other tasks write other columns of the same rows, never these).
                    let o = unsafe {
                        std::slice::from_raw_parts_mut(op.get().add(t0 * n + r0), (nt - 1) * n + rows)
                    };
                    let ok = amx.dots(panel, &acts[b0 * tl..b1 * tl], k, nt, rows, o, n);
                    assert!(ok, "dots of {k} values");
                }
            }
        });
    });
}
