//! Matmul kernels on Q5_0×2 (two rows interleaved, `quant/interleave.rs`) with Q8_0
//! activations prepared for them: one call gives the dots of the two rows with 1, 2, 4 or
//! 8 tokens.
//!
//! One 256-bit load holds a block of both rows (16 quant bytes each), so the fifth bits,
//! nibbles and scales of two rows are unpacked at once and shared by the call's tokens. The
//! quants are used unsigned (0..31, not minus 16): the `-16 · Σy` each 32-bit lane then
//! needs is computed once per token and block by [`Q5_0X2Kernels::prepare`] and loaded as
//! the lane's starting value, so a block of two rows and one token costs two `vpdpbusd`
//! (VNNI) and, for the floats, one multiply, two converts and two FMAs.
//!
//! With AVX-512 VNNI a prompt's two consecutive pairs (four rows) go through 512-bit registers,
//! `[a | b | c | d]`, against each token's 16 quants broadcast to all four 128-bit lanes
//! (a plain load): seven 512-bit operations per block of four rows and one token instead of
//! fourteen 256-bit ones, so the float steps, the bottleneck, issue a quarter faster
//! (512-bit operations have two ports, 256-bit three).
//!
//! The float steps are those of ggml's AVX2 `vec_dot_q5_0_q8_0` (the single-pair kernel
//! in `avx2.rs` and the row-major tiles): per block, the eight lanes of four-quant sums
//! folded into an eight-lane accumulator by one FMA with `x.d · y.d`, then the same
//! horizontal sum; row a's lanes sit in the low halves of two accumulators, row b's in the
//! high halves. The integer lanes are exact, so every tier and token count gives the same
//! bits as the row-major kernels.

#![allow(clippy::needless_range_loop)] // t indexes several per-token arrays at once

use std::arch::x86_64::*;

use super::prefetch;

use super::avx2::loadu;

/// Bytes of an interleaved block (two rows).
const BLOCK: usize = 44;
/// A prepared activation block: the Q8_0 block (d, 32 quants), 2 bytes of padding, d as
/// f32, then the eight lanes' `-16 · Σ` of their four quants (i32).
const ACT: usize = 72;
const ACT_QS: usize = 2;
const ACT_D: usize = 36;
const ACT_INIT: usize = 40;

/// `out[t * os + r] = dot(row r, token t)` for the pair at `x` and T prepared activation
/// rows `ys` bytes apart at `y`, `nb` blocks each.
use super::GroupCore as Core;

/// The 16 bytes at `p` in both halves.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn bcast16(p: *const u8) -> __m256i {
    _mm256_broadcastsi128_si256(_mm_loadu_si128(p.cast()))
}

/// A block of the pair: `[row a | row b]` quants 0-15 and 16-31, unsigned (0..31), and
/// `[x.d of a ×4 | x.d of b ×4]`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn block(xb: *const u8) -> (__m256i, __m256i, __m256) {
    let m4 = _mm256_set1_epi8(0x0f);
    let halves = _mm256_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1);
    let qs = loadu(xb.add(12));
    // Each half: its row's 32 fifth bits, spread to bytes (bit k of byte k / 8).
    let qh = _mm_cvtsi64_si128((xb.add(4) as *const i64).read_unaligned());
    let qh = _mm256_permutevar8x32_epi32(_mm256_castsi128_si256(qh), halves);
    let sel = _mm256_set1_epi64x(0x8040_2010_0804_0201u64 as i64);
    let fifth = |spread: __m256i| {
        let bytes = _mm256_shuffle_epi8(qh, spread);
        _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(bytes, sel), sel), _mm256_set1_epi8(0x10))
    };
    let lo_spread = _mm256_setr_epi64x(0, 0x0101_0101_0101_0101, 0, 0x0101_0101_0101_0101);
    let hi_spread = _mm256_add_epi8(lo_spread, _mm256_set1_epi8(2));
    let lo = _mm256_or_si256(_mm256_and_si256(qs, m4), fifth(lo_spread));
    let hi = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16::<4>(qs), m4), fifth(hi_spread));
    let d = _mm_cvtph_ps(_mm_cvtsi32_si128((xb as *const i32).read_unaligned()));
    (lo, hi, _mm256_permutevar8x32_ps(_mm256_castps128_ps256(d), halves))
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn core<const T: usize, const VNNI: bool>(
    x: *const u8,
    y: *const u8,
    ys: usize,
    nb: usize,
    out: *mut f32,
    os: usize,
) {
    let mut acc_lo = [_mm256_setzero_ps(); T];
    let mut acc_hi = [_mm256_setzero_ps(); T];
    let ones = _mm256_set1_epi16(1);
    let ahead = prefetch::DISTANCE;
    for i in 0..nb {
        prefetch::block(x.add(BLOCK * i), ahead, BLOCK);
        let (lo, hi, dx) = block(x.add(BLOCK * i));
        for t in 0..T {
            let yb = y.add(t * ys + ACT * i);
            let (y_lo, y_hi) = (bcast16(yb.add(ACT_QS)), bcast16(yb.add(ACT_QS + 16)));
            let (init_lo, init_hi) = (bcast16(yb.add(ACT_INIT)), bcast16(yb.add(ACT_INIT + 16)));
            let (s_lo, s_hi) = if VNNI {
                (vnni_dot(init_lo, lo, y_lo), vnni_dot(init_hi, hi, y_hi))
            } else {
                let dot = |q, y| _mm256_madd_epi16(_mm256_maddubs_epi16(q, y), ones);
                (_mm256_add_epi32(init_lo, dot(lo, y_lo)), _mm256_add_epi32(init_hi, dot(hi, y_hi)))
            };
            let d = _mm256_mul_ps(dx, _mm256_set1_ps((yb.add(ACT_D) as *const f32).read_unaligned()));
            acc_lo[t] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(s_lo), acc_lo[t]);
            acc_hi[t] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(s_hi), acc_hi[t]);
        }
    }
    for t in 0..T {
        // `hsum_ps` of each row's eight lanes: lanes l and l + 4 first.
        let s = _mm256_add_ps(acc_lo[t], acc_hi[t]);
        for (r, h) in [_mm256_castps256_ps128(s), _mm256_extractf128_ps::<1>(s)].into_iter().enumerate() {
            let h = _mm_add_ps(h, _mm_movehl_ps(h, h));
            *out.add(t * os + r) = _mm_cvtss_f32(_mm_add_ss(h, _mm_movehdup_ps(h)));
        }
    }
}

/// [`core`] on two consecutive pairs (`x` and `x + nb · BLOCK`) at once, each 128-bit lane
/// one row's, with the same lane arithmetic: the same bits.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn core4<const T: usize>(x: *const u8, y: *const u8, ys: usize, nb: usize, out: *mut f32, os: usize) {
    let mut acc_lo = [_mm512_setzero_ps(); T];
    let mut acc_hi = [_mm512_setzero_ps(); T];
    let x1 = x.add(nb * BLOCK);
    let ahead = prefetch::DISTANCE;
    let join = |a: __m256i, b: __m256i| _mm512_inserti64x4::<1>(_mm512_castsi256_si512(a), b);
    let bcast = |p: *const u8| _mm512_broadcast_i32x4(_mm_loadu_si128(p.cast()));
    for i in 0..nb {
        prefetch::block(x.add(BLOCK * i), ahead, BLOCK);
        prefetch::block(x1.add(BLOCK * i), ahead, BLOCK);
        let (lo0, hi0, d0) = block(x.add(BLOCK * i));
        let (lo1, hi1, d1) = block(x1.add(BLOCK * i));
        let (lo, hi) = (join(lo0, lo1), join(hi0, hi1));
        let dx = _mm512_castsi512_ps(join(_mm256_castps_si256(d0), _mm256_castps_si256(d1)));
        for t in 0..T {
            let yb = y.add(t * ys + ACT * i);
            let s_lo = _mm512_dpbusd_epi32(bcast(yb.add(ACT_INIT)), lo, bcast(yb.add(ACT_QS)));
            let s_hi = _mm512_dpbusd_epi32(bcast(yb.add(ACT_INIT + 16)), hi, bcast(yb.add(ACT_QS + 16)));
            let d = _mm512_mul_ps(dx, _mm512_set1_ps((yb.add(ACT_D) as *const f32).read_unaligned()));
            acc_lo[t] = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(s_lo), acc_lo[t]);
            acc_hi[t] = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(s_hi), acc_hi[t]);
        }
    }
    for t in 0..T {
        let s = _mm512_add_ps(acc_lo[t], acc_hi[t]);
        let lanes = [
            _mm512_castps512_ps128(s),
            _mm512_extractf32x4_ps::<1>(s),
            _mm512_extractf32x4_ps::<2>(s),
            _mm512_extractf32x4_ps::<3>(s),
        ];
        for (r, h) in lanes.into_iter().enumerate() {
            let h = _mm_add_ps(h, _mm_movehl_ps(h, h));
            *out.add(t * os + r) = _mm_cvtss_f32(_mm_add_ss(h, _mm_movehdup_ps(h)));
        }
    }
}

#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn vnni4<const T: usize>(x: *const u8, y: *const u8, ys: usize, nb: usize, out: *mut f32, os: usize) {
    core4::<T>(x, y, ys, nb, out, os)
}

/// `-16 ·` the sum of each four quants of the prepared block at `b`, as eight i32.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn lane_offsets(b: *mut u8) {
    let q = loadu(b.add(ACT_QS));
    let sums = _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_set1_epi8(1), q), _mm256_set1_epi16(1));
    let init = _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32::<4>(sums));
    _mm256_storeu_si256(b.add(ACT_INIT).cast(), init);
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512vnni")]
unsafe fn vnni_dot(acc: __m256i, q: __m256i, y: __m256i) -> __m256i {
    _mm256_dpbusd_epi32(acc, q, y)
}

super::group_cores!();

/// The Q5_0×2 matmul kernels of one tier.
#[derive(Clone, Copy)]
pub struct Q5_0X2Kernels {
    /// For 1, 2, 4 and 8 tokens.
    cores: [Core; 4],
    /// The same on two pairs at once, where the CPU has AVX-512 VNNI.
    quads: Option<[Core; 4]>,
}

impl Q5_0X2Kernels {
    /// Most tokens one call of [`Self::dots`] takes.
    pub const TOKENS: usize = 8;

    /// Bytes of a prepared activation row of `n` values.
    pub fn act_row_size(n: usize) -> usize {
        n / 32 * ACT
    }

    /// Quantizes an activation row (`x`, a multiple of 32 values) for [`Self::dots`]: the
    /// Q8_0 blocks of `quantize_activation`, with d as f32 and the lanes' offsets.
    pub fn prepare(&self, x: &[f32], dst: &mut [u8]) -> crate::error::Result<()> {
        if !x.len().is_multiple_of(32) || dst.len() != Self::act_row_size(x.len()) {
            return Err(crate::error::KilnError::invalid("Q5_0×2 activations: mis-sized row"));
        }
        for (v, b) in x.chunks_exact(32).zip(dst.chunks_exact_mut(ACT)) {
            super::avx2::quantize_q8_0_act(v, &mut b[..34]);
            let d = crate::quant::f16_at(b, 0);
            b[34..36].fill(0);
            b[ACT_D..ACT_D + 4].copy_from_slice(&d.to_le_bytes());
            // SAFETY: these kernels exist only on AVX2 tiers and up; `b` holds the block.
            unsafe { lane_offsets(b.as_mut_ptr()) };
        }
        Ok(())
    }

    /// `out[t * os + r] = dot(row r, token t)` for one interleaved pair `w` (`n` columns),
    /// or two consecutive pairs (rows 0-3) where `w` holds two, and `n_tok` (1..=8)
    /// prepared activation rows `a`. Mis-sized input writes NaN to whatever of `out` exists.
    pub fn dots(&self, w: &[u8], a: &[u8], n: usize, n_tok: usize, out: &mut [f32], os: usize) {
        let nb = n / 32;
        let pairs = if nb > 0 && w.len() >= 2 * nb * BLOCK { 2 } else { 1 };
        let ok = n.is_multiple_of(32)
            && (1..=Self::TOKENS).contains(&n_tok)
            && os >= 2 * pairs
            && w.len() >= pairs * nb * BLOCK
            && a.len() >= n_tok * nb * ACT
            && out.len() >= (n_tok - 1) * os + 2 * pairs;
        if !ok {
            out.iter_mut().for_each(|v| *v = f32::NAN);
            return;
        }
        // SAFETY: the tier was detected before these kernels were handed out, and the slices
        // hold every byte read and written (checked above).
        unsafe {
            match (pairs, &self.quads) {
                // A decode step takes the pairs one after the other: one stream from DRAM
                // (two side by side: qwen2.5-coder-0.5b tg 58 -> 70 tok/s on a Zen 4).
                (2, Some(quads)) if n_tok > 1 => {
                    super::by_token_width(quads, w, a, nb * ACT, nb, n_tok, out, os)
                }
                _ => {
                    for p in 0..pairs {
                        let (w, out) = (&w[p * nb * BLOCK..], &mut out[2 * p..]);
                        super::by_token_width(&self.cores, w, a, nb * ACT, nb, n_tok, out, os)
                    }
                }
            }
        }
    }
}

/// The Q5_0×2 kernels at `tier` (AVX2 and up).
pub(super) fn kernels(tier: super::CpuTier) -> Option<Q5_0X2Kernels> {
    let quads =
        (tier >= super::CpuTier::Avx512Vnni).then_some([vnni4::<1>, vnni4::<2>, vnni4::<4>, vnni4::<8>]);
    cores(tier).map(|cores| Q5_0X2Kernels { cores, quads })
}
