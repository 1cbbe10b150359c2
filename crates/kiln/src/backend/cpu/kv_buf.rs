//! The CPU backend's KV caches: f16 buffers in anonymous mappings of their own.
//!
//! Fresh anonymous pages read as zeros and take no memory until written, so the slots a
//! context never reaches cost nothing: `kiln run` on smollm2 at its default 4096 positions
//! peaked at 213 MB with the caches in zero-filled vectors, 125 MB this way (as at 512
//! positions). Huge pages were tried for the reads at depth: no gain measured (the decode
//! attention alone at depth 2048, `attn_bench`), and a huge page is resident whole once
//! touched, which took the 88 MB back.

use std::ops::{Deref, DerefMut};

use half::f16;

use crate::error::{KilnError, Result};

/// `len` f16 values, zero at first.
pub struct KvBuf {
    map: memmap2::MmapMut,
    len: usize,
}

impl KvBuf {
    pub fn zeroed(len: usize) -> Result<KvBuf> {
        let bytes = len.checked_mul(2).filter(|&b| b <= isize::MAX as usize).ok_or_else(|| {
            KilnError::Backend(format!("a KV cache of {len} values does not fit in memory"))
        })?;
        // A mapping cannot be empty; an empty buffer takes one page.
        let map = memmap2::MmapMut::map_anon(bytes.max(1))
            .map_err(|e| KilnError::Backend(format!("cannot allocate a KV cache of {bytes} bytes: {e}")))?;
        Ok(KvBuf { map, len })
    }
}

impl Deref for KvBuf {
    type Target = [f16];
    fn deref(&self) -> &[f16] {
        // A mapping starts on a page, so its bytes are aligned for f16.
        bytemuck::cast_slice(&self.map[..2 * self.len])
    }
}

impl DerefMut for KvBuf {
    fn deref_mut(&mut self) -> &mut [f16] {
        let bytes = 2 * self.len;
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
    }
}
