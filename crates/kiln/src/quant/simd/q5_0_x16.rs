//! Matmul kernels on Q5_0×16 (sixteen rows interleaved, `quant/interleave.rs`) with Q8_0
//! activations prepared for them: one call gives the dots of the sixteen rows with 1, 2, 4
//! or 8 tokens.
//!
//! The layout puts four quants of each of the sixteen rows side by side, so one
//! `vpdpbusd` against four of a token's quants broadcast adds them into sixteen 32-bit
//! lanes, one per row (an outer product): eight of them give a block's exact integer sums
//! for sixteen rows, and the float steps then take one operation per block for all sixteen
//! rows, where a row-major kernel spends one per row. The quants are used unsigned (0..31,
//! not minus 16): the `-16 · Σy` each lane then needs is computed once per token and block
//! by [`Q5_0X16Kernels::prepare`] and is the sums' starting value. The unpacked weights of a
//! block are shared by the call's tokens.
//!
//! The float steps are ggml's generic `vec_dot_q5_0_q8_0` (the scalar reference,
//! `legacy.rs`): per block `sumf += (x.d · y.d) · f32(sum)`, unfused, in block order. The
//! integer sums are exact whatever the instructions, so every tier, tile and token count
//! gives the scalar reference's bits.

#![allow(clippy::needless_range_loop)] // t indexes several per-token arrays at once

use std::arch::x86_64::*;

use super::avx2::loadu;
use super::prefetch;
use super::GroupCore as Core;
use crate::quant::interleave::{Q5_0_X16_BLOCK as BLOCK, Q5_0_X16_ROWS as ROWS};

/// Offsets in an interleaved block: the fifth-bit masks and the quant chunks.
const QH: usize = 32;
const QS: usize = 96;
/// A prepared activation block: the 32 quants (i8), d as f32, then `-16 · Σ` of the quants
/// (i32).
const ACT: usize = 40;
const ACT_D: usize = 32;
const ACT_INIT: usize = 36;

#[inline(always)]
unsafe fn read_i32(p: *const u8) -> i32 {
    (p as *const i32).read_unaligned()
}

/// The 16 rows of a block with T tokens in 512-bit registers (AVX-512 VNNI).
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn core512<const T: usize>(
    x: *const u8,
    y: *const u8,
    ys: usize,
    nb: usize,
    out: *mut f32,
    os: usize,
) {
    let mut acc = [_mm512_setzero_ps(); T];
    let m4 = _mm512_set1_epi8(0x0f);
    let sixteen = _mm512_set1_epi8(0x10);
    for i in 0..nb {
        let xb = x.add(BLOCK * i);
        prefetch::block(xb, prefetch::DISTANCE, BLOCK);
        let dw = _mm512_cvtph_ps(loadu(xb));
        // Step s holds quants 4s..4s+3 of every row: chunk s's low nibbles (s < 4) or chunk
        // s - 4's high nibbles, plus 16 where mask s has the row's fifth bit.
        let mut w = [_mm512_setzero_si512(); 8];
        for c in 0..4 {
            let v = _mm512_loadu_si512(xb.add(QS + 64 * c).cast());
            let mask = |s: usize| _cvtu64_mask64((xb.add(QH + 8 * s) as *const u64).read_unaligned());
            let lo = _mm512_and_si512(v, m4);
            let hi = _mm512_and_si512(_mm512_srli_epi16::<4>(v), m4);
            w[c] = _mm512_mask_add_epi8(lo, mask(c), lo, sixteen);
            w[c + 4] = _mm512_mask_add_epi8(hi, mask(c + 4), hi, sixteen);
        }
        for t in 0..T {
            let yb = y.add(t * ys + ACT * i);
            let q = |s: usize| _mm512_set1_epi32(read_i32(yb.add(4 * s)));
            // Two chains (exact integer sums: the order does not matter).
            let mut s0 = _mm512_set1_epi32(read_i32(yb.add(ACT_INIT)));
            let mut s1 = _mm512_setzero_si512();
            for s in 0..4 {
                s0 = _mm512_dpbusd_epi32(s0, w[s], q(s));
                s1 = _mm512_dpbusd_epi32(s1, w[s + 4], q(s + 4));
            }
            let d = _mm512_mul_ps(dw, _mm512_set1_ps(f32::from_bits(read_i32(yb.add(ACT_D)) as u32)));
            let sum = _mm512_cvtepi32_ps(_mm512_add_epi32(s0, s1));
            acc[t] = _mm512_add_ps(acc[t], _mm512_mul_ps(d, sum));
        }
    }
    for t in 0..T {
        _mm512_storeu_ps(out.add(t * os), acc[t]);
    }
}

/// The fifth bits of mask word `m` (32 bits: 8 rows × 4 quants) as 32 bytes: 16 where set.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn fifth_bytes(m: i32) -> __m256i {
    let spread = _mm256_setr_epi64x(0, 0x0101_0101_0101_0101, 0x0202_0202_0202_0202, 0x0303_0303_0303_0303);
    let sel = _mm256_set1_epi64x(0x8040_2010_0804_0201u64 as i64);
    let bytes = _mm256_and_si256(_mm256_shuffle_epi8(_mm256_set1_epi32(m), spread), sel);
    _mm256_and_si256(_mm256_cmpeq_epi8(bytes, sel), _mm256_set1_epi8(0x10))
}

/// The same in two 256-bit halves of eight rows each (AVX2): `maddubs` pairs summed in 16
/// bits over four steps (|sum| ≤ 4 · 2 · 31 · 128 < 2^15), then `madd` to 32 bits.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn core256<const T: usize>(
    x: *const u8,
    y: *const u8,
    ys: usize,
    nb: usize,
    out: *mut f32,
    os: usize,
) {
    let mut acc = [[_mm256_setzero_ps(); 2]; T];
    let m4 = _mm256_set1_epi8(0x0f);
    let ones = _mm256_set1_epi16(1);
    for i in 0..nb {
        let xb = x.add(BLOCK * i);
        prefetch::block(xb, prefetch::DISTANCE, BLOCK);
        for h in 0..2 {
            let dw = _mm256_cvtph_ps(_mm_loadu_si128(xb.add(16 * h).cast()));
            let mut w = [_mm256_setzero_si256(); 8];
            for c in 0..4 {
                let v = loadu(xb.add(QS + 64 * c + 32 * h));
                let fifth = |s: usize| fifth_bytes(read_i32(xb.add(QH + 8 * s + 4 * h)));
                w[c] = _mm256_or_si256(_mm256_and_si256(v, m4), fifth(c));
                w[c + 4] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16::<4>(v), m4), fifth(c + 4));
            }
            for t in 0..T {
                let yb = y.add(t * ys + ACT * i);
                let q = |s: usize| _mm256_set1_epi32(read_i32(yb.add(4 * s)));
                let pairs = |s0: usize| {
                    let p = |s: usize| _mm256_maddubs_epi16(w[s], q(s));
                    _mm256_add_epi16(
                        _mm256_add_epi16(p(s0), p(s0 + 1)),
                        _mm256_add_epi16(p(s0 + 2), p(s0 + 3)),
                    )
                };
                let s =
                    _mm256_add_epi32(_mm256_madd_epi16(pairs(0), ones), _mm256_madd_epi16(pairs(4), ones));
                let s = _mm256_add_epi32(s, _mm256_set1_epi32(read_i32(yb.add(ACT_INIT))));
                let d = _mm256_mul_ps(dw, _mm256_set1_ps(f32::from_bits(read_i32(yb.add(ACT_D)) as u32)));
                acc[t][h] = _mm256_add_ps(acc[t][h], _mm256_mul_ps(d, _mm256_cvtepi32_ps(s)));
            }
        }
    }
    for t in 0..T {
        _mm256_storeu_ps(out.add(t * os), acc[t][0]);
        _mm256_storeu_ps(out.add(t * os + 8), acc[t][1]);
    }
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
    if VNNI {
        core512::<T>(x, y, ys, nb, out, os)
    } else {
        core256::<T>(x, y, ys, nb, out, os)
    }
}

super::group_cores!();

/// The Q5_0×16 matmul kernels of one tier.
#[derive(Clone, Copy)]
pub struct Q5_0X16Kernels {
    /// For 1, 2, 4 and 8 tokens.
    cores: [Core; 4],
}

impl Q5_0X16Kernels {
    /// Most tokens one call of [`Self::dots`] takes.
    pub const TOKENS: usize = 8;
    /// Rows one call of [`Self::dots`] gives.
    pub const ROWS: usize = ROWS;

    /// Bytes of a prepared activation row of `n` values.
    pub fn act_row_size(n: usize) -> usize {
        n / 32 * ACT
    }

    /// Quantizes an activation row (`x`, a multiple of 32 values) for [`Self::dots`]: the
    /// Q8_0 blocks of `quantize_activation`, with d as f32 and the sums' offsets.
    pub fn prepare(&self, x: &[f32], dst: &mut [u8]) -> crate::error::Result<()> {
        if !x.len().is_multiple_of(32) || dst.len() != Self::act_row_size(x.len()) {
            return Err(crate::error::KilnError::invalid("Q5_0×16 activations: mis-sized row"));
        }
        let mut q8 = [0u8; 34];
        for (v, b) in x.chunks_exact(32).zip(dst.chunks_exact_mut(ACT)) {
            super::avx2::quantize_q8_0_act(v, &mut q8);
            b[..32].copy_from_slice(&q8[2..]);
            b[ACT_D..ACT_D + 4].copy_from_slice(&crate::quant::f16_at(&q8, 0).to_le_bytes());
            let sum: i32 = q8[2..].iter().map(|&q| q as i8 as i32).sum();
            b[ACT_INIT..ACT].copy_from_slice(&(-16 * sum).to_le_bytes());
        }
        Ok(())
    }

    /// `out[t * os + r] = dot(row r, token t)` for one interleaved group `w` (`n` columns,
    /// sixteen rows) and `n_tok` (1..=8) prepared activation rows `a`. Mis-sized input writes
    /// NaN to whatever of `out` exists.
    pub fn dots(&self, w: &[u8], a: &[u8], n: usize, n_tok: usize, out: &mut [f32], os: usize) {
        let nb = n / 32;
        let ok = n.is_multiple_of(32)
            && (1..=Self::TOKENS).contains(&n_tok)
            && os >= ROWS
            && w.len() >= nb * BLOCK
            && a.len() >= n_tok * nb * ACT
            && out.len() >= (n_tok - 1) * os + ROWS;
        if !ok {
            out.iter_mut().for_each(|v| *v = f32::NAN);
            return;
        }
        // SAFETY: the tier was detected before these kernels were handed out, and the slices
        // hold every byte read and written (checked above).
        unsafe { super::by_token_width(&self.cores, w, a, nb * ACT, nb, n_tok, out, os) }
    }
}

/// The Q5_0×16 kernels at `tier` (AVX2 and up).
pub(super) fn kernels(tier: super::CpuTier) -> Option<Q5_0X16Kernels> {
    cores(tier).map(|cores| Q5_0X16Kernels { cores })
}
