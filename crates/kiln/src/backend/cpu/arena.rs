//! One anonymous mapping per model file for the weights the CPU backend repacks, handed
//! out in consecutive slices.
//!
//! Decode streams every weight once per token, so TLB misses count: a mapping per tensor
//! is too small for huge pages (gemma3-270m's repacked matrices are 0.1-1 MB each, so none
//! got one) or only partly covered by them (qwen2.5-coder-1.5b: 58% of its repacked
//! bytes). One mapping aligned to and advised as huge pages gives every tensor huge pages,
//! in the order the forward pass reads them, which makes small decode matmuls up to a
//! third faster. The mapping reserves the file's size (an upper bound of what is
//! repacked); untouched pages take no memory.

use std::sync::atomic::{AtomicUsize, Ordering};

use crate::error::{KilnError, Result};

/// The huge page size the mapping is aligned to.
const HUGE: usize = 2 << 20;
/// Slices start on cache lines.
const ALIGN: usize = 64;

pub(super) struct Arena {
    map: memmap2::MmapMut,
    /// The first huge-page boundary in the map, where slices start.
    base: *mut u8,
    cap: usize,
    next: AtomicUsize,
}

// SAFETY: slices never overlap (`next` only grows), and each is written once by its owner
// before it is shared (see `alloc`).
unsafe impl Send for Arena {}
unsafe impl Sync for Arena {}

impl Arena {
    /// Reserves room for `cap` bytes of slices (each rounded up to a cache line).
    pub fn new(cap: usize) -> Result<Arena> {
        let len = cap.next_multiple_of(ALIGN) + HUGE;
        let mut map = memmap2::MmapOptions::new()
            .len(len)
            .map_anon()
            .map_err(|e| KilnError::Backend(format!("cannot reserve {len} bytes for weights: {e}")))?;
        let skip = map.as_ptr().align_offset(HUGE).min(HUGE);
        #[cfg(target_os = "linux")]
        let _ = map.advise_range(memmap2::Advice::HugePage, skip, len - skip);
        // SAFETY: `skip + cap <= len`.
        let base = unsafe { map.as_mut_ptr().add(skip) };
        Ok(Arena { map, base, cap: cap.next_multiple_of(ALIGN), next: AtomicUsize::new(0) })
    }

    /// A fresh slice of `len` zero bytes, or `None` when the arena is full. The caller owns
    /// it: it fills it before handing the arena's [`Self::get`] of it to others.
    #[allow(clippy::mut_from_ref)] // disjoint slices of a shared mapping, by construction
    pub fn alloc(&self, len: usize) -> Option<(usize, &mut [u8])> {
        let size = len.next_multiple_of(ALIGN);
        let off = self
            .next
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                (n + size <= self.cap).then_some(n + size)
            })
            .ok()?;
        // SAFETY: `off..off + len` is inside the reservation and was handed out once.
        Some((off, unsafe { std::slice::from_raw_parts_mut(self.base.add(off), len) }))
    }

    /// Bytes left (a slice of up to this many may still fail to fit, being rounded up).
    pub fn room(&self) -> usize {
        self.cap - self.next.load(Ordering::Relaxed)
    }

    /// The slice `alloc` returned at `off`, once filled.
    pub fn get(&self, off: usize, len: usize) -> &[u8] {
        assert!(off + len <= self.cap && off + len <= self.map.len(), "slice inside the arena");
        // SAFETY: inside the mapping (checked); written only before it was shared.
        unsafe { std::slice::from_raw_parts(self.base.add(off), len) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slices_are_disjoint_aligned_and_bounded() {
        let arena = Arena::new(1000).unwrap();
        let (a, sa) = arena.alloc(100).unwrap();
        sa.fill(1);
        let (b, sb) = arena.alloc(900 - 28).unwrap();
        sb.fill(2);
        assert_eq!((a, b), (0, 128));
        assert!(arena.alloc(1).is_none(), "full");
        assert_eq!(arena.base as usize % HUGE, 0);
        assert!(arena.get(a, 100).iter().all(|&x| x == 1));
        assert!(arena.get(b, 872).iter().all(|&x| x == 2));
    }
}
