//! Software prefetch of the weight stream, issued by the kernels between their blocks.
//!
//! Decode reads every weight from DRAM once per token, and one core alone keeps too few
//! misses in flight to cover DRAM latency, so without help the kernels wait on memory and
//! then on arithmetic, one after the other. Requests for the bytes a few KiB ahead, a
//! block's worth between the arithmetic of each block, overlap the two. (A burst of
//! requests for a whole group of rows before its dots would instead stall the core on its
//! fill buffers.)

use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};

/// How many bytes ahead of the block being read a kernel asks for the next (anything from
/// 3 to 8 KiB serves decode alike).
pub(super) const DISTANCE: usize = 4096;

/// The distance in a stream of tiles `tile` bytes apart (R rows read side by side, so each
/// row's block `tile` bytes further is the same block of the next tile): whole tiles, at
/// least [`DISTANCE`].
#[inline(always)]
pub(super) fn tile_distance(tile: usize) -> usize {
    DISTANCE.div_ceil(tile.max(1)) * tile
}

/// Prefetches into L1 the cache lines of the `len` bytes at `p + ahead`, where `len`-byte
/// blocks are read one after another: the lines of the block's 64th, 128th, ... and last
/// bytes, so that consecutive blocks between them ask for every line, mostly once. Never
/// faults, so `p + ahead` may lie past the weights.
///
/// # Safety
/// The CPU has SSE (every x86_64 does); nothing is dereferenced.
#[inline(always)]
pub(super) unsafe fn block(p: *const u8, ahead: usize, len: usize) {
    let p = p.wrapping_add(ahead);
    let mut off = 63;
    while off < len {
        _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(off).cast());
        off += 64;
    }
    if !len.is_multiple_of(64) {
        _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(len - 1).cast());
    }
}
