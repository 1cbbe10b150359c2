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
//!
//! Q5_0 and Q4_1 with sixteen rows interleaved ("Q5_0×16", "Q4_1×16"): rows 16g..16g+16
//! form group g; its block i is 16 blocks at `(g · nb + i) · 16 · type_size`, laid out for
//! a `vpdpbusd` whose 32-bit lane r is row r (`simd/x16.rs`):
//!
//! - `[0, 32)`: the sixteen `d` (f16), row r's at `2r`;
//! - Q4_1: `[32, 64)`: the sixteen `m`, likewise; Q5_0: `[32, 96)`: the fifth bits as eight
//!   64-bit masks: bit `4r + j` of mask s is bit `4s + j` of row r's `qh` (quant `4s + j`);
//! - then (at 64 or 96) the quant bytes in four 64-byte chunks: byte `4r + j` of chunk c
//!   is row r's quant byte `4c + j` (quants `4c + j` low, `16 + 4c + j` high).
//!
//! The same bytes, except that Q5_0's `qh` bits move between bytes.

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

/// Rows per Q5_0×16 / Q4_1×16 group.
pub const X16_ROWS: usize = 16;

/// A row-interleaved layout: the same bytes (bits, for Q5_0's `qh`) as the plain matrix,
/// moved.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Interleave {
    Q4kX8,
    Q5_0X16,
    Q4_1X16,
}

impl Interleave {
    /// The weight type it holds.
    pub fn ty(self) -> GgmlType {
        match self {
            Interleave::Q4kX8 => GgmlType::Q4_K,
            Interleave::Q5_0X16 => GgmlType::Q5_0,
            Interleave::Q4_1X16 => GgmlType::Q4_1,
        }
    }

    /// Rows per interleaved group.
    pub fn rows(self) -> usize {
        match self {
            Interleave::Q4kX8 => Q4K_X8_ROWS,
            Interleave::Q5_0X16 | Interleave::Q4_1X16 => X16_ROWS,
        }
    }

    /// Moves row `r`'s (of a group) block `plain` into its interleaved `block`, or back
    /// (`to_plain`).
    fn move_row(self, r: usize, plain: &mut [u8], block: &mut [u8], to_plain: bool) {
        let mut copy = |from: usize, to: usize, len: usize| {
            if to_plain {
                plain[from..from + len].copy_from_slice(&block[to..to + len]);
            } else {
                block[to..to + len].copy_from_slice(&plain[from..from + len]);
            }
        };
        match self {
            Interleave::Q4kX8 => x8_pieces(r).for_each(|(from, to, len)| copy(from, to, len)),
            Interleave::Q4_1X16 => {
                copy(0, 2 * r, 2);
                copy(2, 32 + 2 * r, 2);
                (0..4).for_each(|c| copy(4 + 4 * c, 64 + 64 * c + 4 * r, 4));
            }
            Interleave::Q5_0X16 => {
                copy(0, 2 * r, 2);
                (0..4).for_each(|c| copy(6 + 4 * c, 96 + 64 * c + 4 * r, 4));
                // qh's nibble s is the nibble at bit 4r of mask s.
                let mask = |s: usize| 32 + 8 * s + r / 2;
                let shift = 4 * (r % 2);
                if to_plain {
                    let qh =
                        (0..8).fold(0u32, |qh, s| qh | (((block[mask(s)] >> shift) & 15) as u32) << (4 * s));
                    plain[2..6].copy_from_slice(&qh.to_le_bytes());
                } else {
                    let qh = u32::from_le_bytes([plain[2], plain[3], plain[4], plain[5]]);
                    for s in 0..8 {
                        let b = &mut block[mask(s)];
                        *b = (*b & !(15 << shift)) | ((((qh >> (4 * s)) & 15) as u8) << shift);
                    }
                }
            }
        }
    }

    /// Rows and blocks per row of a `bytes`-long matrix of `cols` columns, checked to be
    /// whole groups of rows and to match the other buffer's `other` bytes.
    fn check(self, cols: usize, bytes: usize, other: usize) -> Result<(usize, usize)> {
        let ty = self.ty();
        let row = ty.row_size(cols)?;
        let rows = bytes / row.max(1);
        if bytes != rows * row || !rows.is_multiple_of(self.rows()) || other != bytes {
            return Err(KilnError::invalid(format!(
                "{self:?}: {bytes} bytes are not whole groups of {} rows of {cols}, or the other \
                 buffer has {other}",
                self.rows()
            )));
        }
        Ok((rows, cols / ty.block_size()))
    }

    /// Interleaves a matrix (`src`: rows of `cols` values, whole groups of rows) into `dst`
    /// (the same size).
    pub fn pack(self, src: &[u8], cols: usize, dst: &mut [u8]) -> Result<()> {
        let (_, nb) = self.check(cols, src.len(), dst.len())?;
        let (r_n, bs) = (self.rows(), self.ty().type_size());
        let mut sb = vec![0u8; bs];
        for (g, group) in dst.chunks_exact_mut(nb * r_n * bs).enumerate() {
            for (i, block) in group.chunks_exact_mut(r_n * bs).enumerate() {
                for r in 0..r_n {
                    sb.copy_from_slice(&src[((g * r_n + r) * nb + i) * bs..][..bs]);
                    self.move_row(r, &mut sb, block, false);
                }
            }
        }
        Ok(())
    }

    /// Row `r` of an interleaved matrix of `cols` columns, back in the plain layout (`dst`:
    /// one row).
    pub fn unpack_row(self, packed: &[u8], cols: usize, r: usize, dst: &mut [u8]) -> Result<()> {
        let (rows, nb) = self.check(cols, packed.len(), packed.len())?;
        let (r_n, bs) = (self.rows(), self.ty().type_size());
        if r >= rows || dst.len() != nb * bs {
            return Err(KilnError::invalid(format!(
                "{self:?}: no row {r} of {rows}, or a {}-byte row",
                dst.len()
            )));
        }
        let group = &packed[(r / r_n) * nb * r_n * bs..][..nb * r_n * bs];
        let mut block = vec![0u8; r_n * bs];
        for (b, sb) in group.chunks_exact(r_n * bs).zip(dst.chunks_exact_mut(bs)) {
            block.copy_from_slice(b);
            self.move_row(r % r_n, sb, &mut block, true);
        }
        Ok(())
    }
}
