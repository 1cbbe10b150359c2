//! Q4_K with eight rows interleaved ("Q4_K×8"): the layout the CPU backend repacks Q4_K
//! matrices into at load for its SIMD tiers, so that one vector load holds eight bytes of
//! four rows and the matmul kernels sum 32-quant groups of eight rows at once (one scale
//! multiply per group for eight rows, not one per row: see `simd/q4k_x8.rs`).
//!
//! Same bytes, moved: rows 8g..8g+8 form row group g; its superblock i is one block of
//! 8 × 144 bytes at `(g · nb + i) · 1152`:
//!
//! - `[0, 16)`: the eight `d` (f16), lane j holding row [`Q4K_X8_LANES`]`[j]`;
//! - `[16, 32)`: the eight `dmin`, same lanes;
//! - `[32, 128)`: the 12 packed scale bytes as planes: byte p of row r at `32 + 8p + r`;
//! - `[128, 1152)`: the quants in 16 columns of 8 bytes: bytes `8c..8c+8` of row r's 128
//!   quant bytes at `128 + 64c + 8r`.

use super::GgmlType;
use crate::error::{KilnError, Result};

/// Rows per interleaved group.
pub const Q4K_X8_ROWS: usize = 8;
/// Bytes of one interleaved block: one superblock of each of the eight rows.
pub const Q4K_X8_BLOCK: usize = Q4K_X8_ROWS * 144;
/// Lane j of a block's `d`/`dmin` (and of the kernels' integer sums) holds row `LANES[j]`:
/// the order `packs` + `madd` leave 8 rows in (rows 0, 1, 4, 5 in the low 128 bits). It is
/// its own inverse.
pub const Q4K_X8_LANES: [usize; 8] = [0, 1, 4, 5, 2, 3, 6, 7];

/// The contiguous pieces of row `r`'s (0..8) superblock in its interleaved block, as
/// `(offset in the superblock, offset in the block, length)`: d, dmin, the 12 scale bytes
/// one by one, the 16 columns of 8 quant bytes.
fn x8_pieces(r: usize) -> impl Iterator<Item = (usize, usize, usize)> {
    let lane = Q4K_X8_LANES[r];
    let scales = (0..12).map(move |p| (4 + p, 32 + 8 * p + r, 1));
    let quants = (0..16).map(move |c| (16 + 8 * c, 128 + 64 * c + 8 * r, 8));
    [(0, 2 * lane, 2), (2, 16 + 2 * lane, 2)].into_iter().chain(scales).chain(quants)
}

fn check(cols: usize, rows_bytes: usize, packed: usize) -> Result<(usize, usize)> {
    let row = GgmlType::Q4_K.row_size(cols)?;
    let rows = rows_bytes / row.max(1);
    if rows_bytes != rows * row || !rows.is_multiple_of(Q4K_X8_ROWS) || packed != rows_bytes {
        return Err(KilnError::invalid(format!(
            "Q4_K×8: {rows_bytes} bytes are not whole groups of {Q4K_X8_ROWS} rows of {cols}, or the \
             interleaved buffer has {packed}"
        )));
    }
    Ok((rows, cols / 256))
}

/// Interleaves a Q4_K matrix (`src`: rows of `cols` values, a multiple of 8 rows) into `dst`
/// (the same size).
pub fn pack_q4_k_x8(src: &[u8], cols: usize, dst: &mut [u8]) -> Result<()> {
    let (rows, nb) = check(cols, src.len(), dst.len())?;
    for (g, group) in dst.chunks_exact_mut(nb * Q4K_X8_BLOCK).enumerate() {
        for (i, block) in group.chunks_exact_mut(Q4K_X8_BLOCK).enumerate() {
            for r in 0..Q4K_X8_ROWS {
                let sb = &src[((g * Q4K_X8_ROWS + r) * nb + i) * 144..][..144];
                for (from, to, len) in x8_pieces(r) {
                    block[to..to + len].copy_from_slice(&sb[from..from + len]);
                }
            }
        }
    }
    debug_assert_eq!(rows, dst.len() / (nb * 144));
    Ok(())
}

/// Row `r` of an interleaved Q4_K matrix of `cols` columns, back in plain Q4_K (`dst`: one
/// row, `Q4_K.row_size(cols)` bytes).
pub fn unpack_q4_k_x8_row(packed: &[u8], cols: usize, r: usize, dst: &mut [u8]) -> Result<()> {
    let (rows, nb) = check(cols, packed.len(), packed.len())?;
    if r >= rows || dst.len() != nb * 144 {
        return Err(KilnError::invalid(format!("Q4_K×8: no row {r} of {rows}, or a {}-byte row", dst.len())));
    }
    let group = &packed[(r / Q4K_X8_ROWS) * nb * Q4K_X8_BLOCK..][..nb * Q4K_X8_BLOCK];
    for (block, sb) in group.chunks_exact(Q4K_X8_BLOCK).zip(dst.chunks_exact_mut(144)) {
        for (from, to, len) in x8_pieces(r % Q4K_X8_ROWS) {
            sb[from..from + len].copy_from_slice(&block[to..to + len]);
        }
    }
    Ok(())
}
