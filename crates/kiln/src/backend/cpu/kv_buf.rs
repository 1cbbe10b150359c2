//! The CPU backend's KV caches: buffers in anonymous mappings of their own.
//!
//! In an f16 cache, V holds a slot's values as one row (`[slot][dim]`), as the attention's
//! weighted sum reads them. K is stored in tiles of [`K_TILE`] consecutive slots, each tile
//! `[dim][K_TILE]` ([`k_index`]): a key block's scores then read one dimension of 16 keys
//! as one vector and need no per-key horizontal sums. A quantized cache (`crate::kv::types`)
//! holds each slot's row of blocks, `[slot][dim / 32 blocks]`, K and V alike: a key's
//! dot product reads its blocks in order.
//!
//! Fresh anonymous pages read as zeros and take no memory until written, so the slots a
//! context never reaches cost nothing (smollm2 at its default 4096 positions peaks at the
//! same memory as at 512). The mappings use ordinary pages: a huge page is resident whole
//! once touched, which would give that memory back, and huge pages do not speed up the
//! attention's reads.

use std::ops::{Deref, DerefMut};

use half::f16;

use crate::error::{KilnError, Result};
use crate::quant::GgmlType;

/// Slots per tile of the K cache (the attention's key block).
pub const K_TILE: usize = 16;

/// Where value `j` (of `dim`) of slot `slot` lies in a K cache of `n_slots` slots: tiles of
/// [`K_TILE`] slots, `[dim][K_TILE]` each; a last tile of fewer slots is as wide as it is.
#[inline]
pub fn k_index(slot: usize, j: usize, dim: usize, n_slots: usize) -> usize {
    let t0 = slot - slot % K_TILE;
    let w = (n_slots - t0).min(K_TILE);
    t0 * dim + j * w + (slot - t0)
}

/// A K cache's rows in slot order, `[slot][dim]` (for tests and the GPU mirror).
pub fn k_rows(kc: &[f16], dim: usize) -> Vec<f16> {
    let n = kc.len() / dim.max(1);
    (0..n * dim).map(|i| kc[k_index(i / dim, i % dim, dim, n)]).collect()
}

/// The inverse of [`k_rows`]: `rows` (`[slot][dim]`) laid out as a K cache into `kc`.
pub fn set_k_rows(kc: &mut [f16], rows: &[f16], dim: usize) {
    let n = kc.len().min(rows.len()) / dim.max(1);
    for (i, &x) in rows[..n * dim].iter().enumerate() {
        kc[k_index(i / dim, i % dim, dim, n)] = x;
    }
}

/// A KV cache, zero at first: `len` f16 values, or rows of blocks of a quantized type.
/// It derefs to its f16 values (for a quantized cache: its bytes in pairs, which nothing
/// reads as numbers).
pub struct KvBuf {
    map: memmap2::MmapMut,
    bytes: usize,
    ty: GgmlType,
    rot: Option<usize>,
}

impl KvBuf {
    /// An f16 cache of `len` values.
    pub fn zeroed(len: usize) -> Result<KvBuf> {
        let bytes = len.checked_mul(2).ok_or_else(|| too_large(len))?;
        Self::map(bytes, GgmlType::F16, None).map_err(|_| too_large(len))
    }

    /// A cache of `n_slots` rows of `dim` values stored as `ty` (F16 or a block type), rows
    /// rotated in groups of `rot` values before they are quantized.
    pub fn typed(n_slots: usize, dim: usize, ty: GgmlType, rot: Option<usize>) -> Result<KvBuf> {
        let row = ty.row_size(dim)?;
        let bytes = n_slots.checked_mul(row).ok_or_else(|| too_large(n_slots.saturating_mul(dim)))?;
        Self::map(bytes, ty, rot)
    }

    fn map(bytes: usize, ty: GgmlType, rot: Option<usize>) -> Result<KvBuf> {
        if bytes > isize::MAX as usize {
            return Err(KilnError::Backend(format!("a KV cache of {bytes} bytes does not fit in memory")));
        }
        // A mapping cannot be empty; an empty buffer takes one page.
        let map = memmap2::MmapMut::map_anon(bytes.max(1))
            .map_err(|e| KilnError::Backend(format!("cannot allocate a KV cache of {bytes} bytes: {e}")))?;
        Ok(KvBuf { map, bytes, ty, rot })
    }

    /// How the values are stored.
    pub fn ty(&self) -> GgmlType {
        self.ty
    }

    /// Values per Walsh-Hadamard group of the stored rows (`None`: not rotated).
    pub fn rot(&self) -> Option<usize> {
        self.rot
    }

    pub fn bytes(&self) -> &[u8] {
        &self.map[..self.bytes]
    }

    pub fn bytes_mut(&mut self) -> &mut [u8] {
        &mut self.map[..self.bytes]
    }
}

fn too_large(len: usize) -> KilnError {
    KilnError::Backend(format!("a KV cache of {len} values does not fit in memory"))
}

impl Deref for KvBuf {
    type Target = [f16];
    fn deref(&self) -> &[f16] {
        // A mapping starts on a page, so its bytes are aligned for f16; every block size
        // of a cache type is even.
        bytemuck::cast_slice(&self.map[..self.bytes / 2 * 2])
    }
}

impl DerefMut for KvBuf {
    fn deref_mut(&mut self) -> &mut [f16] {
        let bytes = self.bytes / 2 * 2;
        bytemuck::cast_slice_mut(&mut self.map[..bytes])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_are_zeroed_and_sized() {
        for len in [0, 1, 1000, 1 << 20] {
            let mut b = KvBuf::zeroed(len).unwrap();
            assert_eq!(b.len(), len);
            assert!(b.iter().all(|x| x.to_bits() == 0), "zero at first");
            b.fill(f16::ONE);
            assert!(b.iter().all(|&x| x == f16::ONE));
        }
        assert!(KvBuf::zeroed(usize::MAX / 2 + 1).is_err(), "too large: an error, not a panic");
        let q = KvBuf::typed(64, 128, GgmlType::Q8_0, Some(64)).unwrap();
        assert_eq!((q.bytes().len(), q.ty(), q.rot()), (64 * 4 * 34, GgmlType::Q8_0, Some(64)));
        assert!(KvBuf::typed(usize::MAX / 64, 128, GgmlType::Q8_0, None).is_err());
        assert!(KvBuf::typed(4, 48, GgmlType::Q8_0, None).is_err(), "not whole blocks");
    }

    /// Every slot's values land on distinct places inside the cache, whole tiles or not,
    /// and `k_rows` undoes `set_k_rows`.
    #[test]
    fn k_layout_is_a_permutation() {
        for (n_slots, dim) in [(32, 8), (40, 3), (7, 5), (16, 1), (0, 4)] {
            let mut seen = vec![false; n_slots * dim];
            for s in 0..n_slots {
                for j in 0..dim {
                    let i = k_index(s, j, dim, n_slots);
                    assert!(!seen[i], "{n_slots} slots x {dim}: {i} twice");
                    seen[i] = true;
                }
            }
            let rows: Vec<f16> = (0..n_slots * dim).map(|i| f16::from_f32(i as f32)).collect();
            let mut kc = vec![f16::ZERO; rows.len()];
            set_k_rows(&mut kc, &rows, dim);
            assert_eq!(k_rows(&kc, dim), rows);
        }
        // A whole tile: a dimension's 16 keys are consecutive.
        assert_eq!(k_index(16 + 5, 3, 8, 48), 16 * 8 + 3 * 16 + 5);
    }
}
