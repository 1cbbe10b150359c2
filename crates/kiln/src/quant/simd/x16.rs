//! Matmul kernels on sixteen rows interleaved (`quant/interleave.rs`: Q5_0×16, Q4_1×16)
//! with Q8_0 / Q8_1 activations prepared for them: one call gives the dots of the sixteen
//! rows with 1 to 8 tokens.
//!
//! The layouts put four quants of each of the sixteen rows side by side, so one
//! `vpdpbusd` against four of a token's quants broadcast adds them into sixteen 32-bit
//! lanes, one per row (an outer product): eight of them cover a block for sixteen rows,
//! and each weight unpacked serves the call's tokens. Quants are used unsigned: Q5_0's
//! `-16 · Σy` per lane is computed once per token and block by [`X16Kernels::prepare`] and
//! is the sums' starting value.
//!
//! Float steps: Q5_0 takes ggml's generic dot (the scalar reference, `legacy.rs`): the
//! block's whole integer sum, then `sumf += (x.d · y.d) · f32(sum)`, unfused, one
//! operation per block for all sixteen rows, where a row-major kernel spends one per row.
//! Q4_1 keeps ggml's AVX2 dot, the one llama.cpp runs (its generic order moved smollm2's
//! greedy text at a llama.cpp margin of 0.73): step s's sums are exactly that kernel's
//! lane s, each folded into its own accumulator by an FMA with `x.d · y.d`, `x.m · y.s`
//! summed aside, and the lanes added at the end as its `hsum`, here for sixteen rows at
//! once. Integer sums are exact whatever the instructions, so every tier, layout and token
//! count gives the same bits (Q5_0: the scalar reference's; Q4_1: the row-major tiles').

#![allow(clippy::needless_range_loop)] // t indexes several per-token arrays at once

use std::arch::x86_64::*;

use super::avx2::loadu;
use super::prefetch;
use super::{CpuTier, GroupCore as Core};

use crate::quant::interleave::X16_ROWS as ROWS;
use crate::quant::GgmlType;

/// A prepared activation block: the 32 quants (i8), d as f32, then Q5_0's `-16 · Σ` of the
/// quants (i32) or Q4_1's `y.s` (f32).
const ACT: usize = 40;
const ACT_D: usize = 32;
const ACT_4: usize = 36;

/// Bytes of an interleaved block and where its quant chunks start: Q4_1 (`Q41`) has the
/// sixteen `m` after the sixteen `d`, Q5_0 the eight fifth-bit masks.
const fn block(q41: bool) -> usize {
    if q41 {
        ROWS * 20
    } else {
        ROWS * 22
    }
}
const fn qs(q41: bool) -> usize {
    if q41 {
        64
    } else {
        96
    }
}
/// Q5_0's fifth-bit masks, Q4_1's mins.
const QH: usize = 32;

#[inline(always)]
unsafe fn read_i32(p: *const u8) -> i32 {
    (p as *const i32).read_unaligned()
}

#[inline(always)]
unsafe fn read_f32(p: *const u8) -> f32 {
    (p as *const f32).read_unaligned()
}

/// The 16 rows of a block with T tokens in 512-bit registers (AVX-512 VNNI).
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn core512<const T: usize, const Q41: bool>(
    x: *const u8,
    y: *const u8,
    ys: usize,
    nb: usize,
    out: *mut f32,
    os: usize,
) {
    // Q5_0: acc[t][0]; Q4_1: the eight lanes and the mins (T ≤ 2, in registers).
    let mut acc = [[_mm512_setzero_ps(); 8]; T];
    let mut summs = [_mm512_setzero_ps(); T];
    let m4 = _mm512_set1_epi8(0x0f);
    let sixteen = _mm512_set1_epi8(0x10);
    for i in 0..nb {
        let xb = x.add(block(Q41) * i);
        prefetch::block(xb, prefetch::DISTANCE, block(Q41));
        let dw = _mm512_cvtph_ps(loadu(xb));
        let mw = if Q41 { _mm512_cvtph_ps(loadu(xb.add(QH))) } else { dw };
        // Step s holds quants 4s..4s+3 of every row: chunk s's low nibbles (s < 4) or chunk
        // s - 4's high nibbles, plus (Q5_0) 16 where mask s has the row's fifth bit.
        let mut w = [_mm512_setzero_si512(); 8];
        for c in 0..4 {
            let v = _mm512_loadu_si512(xb.add(qs(Q41) + 64 * c).cast());
            let lo = _mm512_and_si512(v, m4);
            let hi = _mm512_and_si512(_mm512_srli_epi16::<4>(v), m4);
            if Q41 {
                (w[c], w[c + 4]) = (lo, hi);
            } else {
                let mask = |s: usize| _cvtu64_mask64((xb.add(QH + 8 * s) as *const u64).read_unaligned());
                w[c] = _mm512_mask_add_epi8(lo, mask(c), lo, sixteen);
                w[c + 4] = _mm512_mask_add_epi8(hi, mask(c + 4), hi, sixteen);
            }
        }
        for t in 0..T {
            let yb = y.add(t * ys + ACT * i);
            let q = |s: usize| _mm512_set1_epi32(read_i32(yb.add(4 * s)));
            let d = _mm512_mul_ps(dw, _mm512_set1_ps(read_f32(yb.add(ACT_D))));
            if Q41 {
                for s in 0..8 {
                    let lane = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w[s], q(s));
                    acc[t][s] = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(lane), acc[t][s]);
                }
                summs[t] =
                    _mm512_add_ps(summs[t], _mm512_mul_ps(mw, _mm512_set1_ps(read_f32(yb.add(ACT_4)))));
                continue;
            }
            // Two chains (exact integer sums: the order does not matter).
            let mut s0 = _mm512_set1_epi32(read_i32(yb.add(ACT_4)));
            let mut s1 = _mm512_setzero_si512();
            for s in 0..4 {
                s0 = _mm512_dpbusd_epi32(s0, w[s], q(s));
                s1 = _mm512_dpbusd_epi32(s1, w[s + 4], q(s + 4));
            }
            let sum = _mm512_cvtepi32_ps(_mm512_add_epi32(s0, s1));
            acc[t][0] = _mm512_add_ps(acc[t][0], _mm512_mul_ps(d, sum));
        }
    }
    for t in 0..T {
        let v = if Q41 {
            // `hsum_ps`'s order: lanes l and l + 4, then those two apart, then the last two.
            let a = &acc[t];
            let (l04, l26) = (_mm512_add_ps(a[0], a[4]), _mm512_add_ps(a[2], a[6]));
            let (l15, l37) = (_mm512_add_ps(a[1], a[5]), _mm512_add_ps(a[3], a[7]));
            let h = _mm512_add_ps(_mm512_add_ps(l04, l26), _mm512_add_ps(l15, l37));
            _mm512_add_ps(h, summs[t])
        } else {
            acc[t][0]
        };
        _mm512_storeu_ps(out.add(t * os), v);
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
unsafe fn core256<const T: usize, const Q41: bool>(
    x: *const u8,
    y: *const u8,
    ys: usize,
    nb: usize,
    out: *mut f32,
    os: usize,
) {
    // Per half: Q5_0 acc[t][h][0]; Q4_1 the eight lanes and the mins.
    let mut acc = [[[_mm256_setzero_ps(); 8]; 2]; T];
    let mut summs = [[_mm256_setzero_ps(); 2]; T];
    let m4 = _mm256_set1_epi8(0x0f);
    let ones = _mm256_set1_epi16(1);
    for i in 0..nb {
        let xb = x.add(block(Q41) * i);
        prefetch::block(xb, prefetch::DISTANCE, block(Q41));
        for h in 0..2 {
            let dw = _mm256_cvtph_ps(_mm_loadu_si128(xb.add(16 * h).cast()));
            let mw = if Q41 { _mm256_cvtph_ps(_mm_loadu_si128(xb.add(QH + 16 * h).cast())) } else { dw };
            let mut w = [_mm256_setzero_si256(); 8];
            for c in 0..4 {
                let v = loadu(xb.add(qs(Q41) + 64 * c + 32 * h));
                (w[c], w[c + 4]) = (_mm256_and_si256(v, m4), _mm256_and_si256(_mm256_srli_epi16::<4>(v), m4));
                if !Q41 {
                    let fifth = |s: usize| fifth_bytes(read_i32(xb.add(QH + 8 * s + 4 * h)));
                    w[c] = _mm256_or_si256(w[c], fifth(c));
                    w[c + 4] = _mm256_or_si256(w[c + 4], fifth(c + 4));
                }
            }
            for t in 0..T {
                let yb = y.add(t * ys + ACT * i);
                let q = |s: usize| _mm256_set1_epi32(read_i32(yb.add(4 * s)));
                let p = |s: usize| _mm256_maddubs_epi16(w[s], q(s));
                let d = _mm256_mul_ps(dw, _mm256_set1_ps(read_f32(yb.add(ACT_D))));
                if Q41 {
                    for s in 0..8 {
                        let lane = _mm256_madd_epi16(p(s), ones);
                        acc[t][h][s] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(lane), acc[t][h][s]);
                    }
                    let m = _mm256_mul_ps(mw, _mm256_set1_ps(read_f32(yb.add(ACT_4))));
                    summs[t][h] = _mm256_add_ps(summs[t][h], m);
                    continue;
                }
                let pairs = |s0: usize| {
                    _mm256_add_epi16(
                        _mm256_add_epi16(p(s0), p(s0 + 1)),
                        _mm256_add_epi16(p(s0 + 2), p(s0 + 3)),
                    )
                };
                let s =
                    _mm256_add_epi32(_mm256_madd_epi16(pairs(0), ones), _mm256_madd_epi16(pairs(4), ones));
                let s = _mm256_add_epi32(s, _mm256_set1_epi32(read_i32(yb.add(ACT_4))));
                acc[t][h][0] = _mm256_add_ps(acc[t][h][0], _mm256_mul_ps(d, _mm256_cvtepi32_ps(s)));
            }
        }
    }
    for t in 0..T {
        for h in 0..2 {
            let v = if Q41 {
                let a = &acc[t][h];
                let (l04, l26) = (_mm256_add_ps(a[0], a[4]), _mm256_add_ps(a[2], a[6]));
                let (l15, l37) = (_mm256_add_ps(a[1], a[5]), _mm256_add_ps(a[3], a[7]));
                let sum = _mm256_add_ps(_mm256_add_ps(l04, l26), _mm256_add_ps(l15, l37));
                _mm256_add_ps(sum, summs[t][h])
            } else {
                acc[t][h][0]
            };
            _mm256_storeu_ps(out.add(t * os + 8 * h), v);
        }
    }
}

/// One core: 512-bit with VNNI, else 256-bit. Q4_1's eight lane accumulators per token
/// fill the registers at two tokens: more go through two at a time (the weights unpacked
/// again, from L1).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn core<const T: usize, const VNNI: bool, const Q41: bool>(
    x: *const u8,
    y: *const u8,
    ys: usize,
    nb: usize,
    out: *mut f32,
    os: usize,
) {
    if !(Q41 && T > 2) {
        return match VNNI {
            true => core512::<T, Q41>(x, y, ys, nb, out, os),
            false => core256::<T, Q41>(x, y, ys, nb, out, os),
        };
    }
    // Two tokens a pass, and an odd last one alone.
    for t in (0..T).step_by(2) {
        let (y, out) = (y.add(t * ys), out.add(t * os));
        match (VNNI, T - t >= 2) {
            (true, true) => core512::<2, true>(x, y, ys, nb, out, os),
            (true, false) => core512::<1, true>(x, y, ys, nb, out, os),
            (false, true) => core256::<2, true>(x, y, ys, nb, out, os),
            (false, false) => core256::<1, true>(x, y, ys, nb, out, os),
        }
    }
}

super::group_cores!(Q41: bool);

/// The matmul kernels of one interleaved format (Q5_0×16 or Q4_1×16) on one tier.
#[derive(Clone, Copy)]
pub struct X16Kernels {
    /// For 1 to 8 tokens.
    cores: [Core; 8],
    q41: bool,
}

impl X16Kernels {
    /// Most tokens one call of [`Self::dots`] takes.
    pub const TOKENS: usize = 8;
    /// Rows one call of [`Self::dots`] gives.
    pub const ROWS: usize = ROWS;

    /// Bytes of a prepared activation row of `n` values.
    pub fn act_row_size(n: usize) -> usize {
        n / 32 * ACT
    }

    /// Quantizes an activation row (`x`, a multiple of 32 values) for [`Self::dots`]: the
    /// Q8_0 (Q5_0) or Q8_1 (Q4_1) blocks of `quantize_activation`, d (and s) as f32, and
    /// Q5_0's offsets.
    pub fn prepare(&self, x: &[f32], dst: &mut [u8]) -> crate::error::Result<()> {
        if !x.len().is_multiple_of(32) || dst.len() != Self::act_row_size(x.len()) {
            return Err(crate::error::KilnError::invalid("×16 activations: mis-sized row"));
        }
        let mut q8 = [0u8; 36];
        for (v, b) in x.chunks_exact(32).zip(dst.chunks_exact_mut(ACT)) {
            let last4 = if self.q41 {
                super::avx2::quantize_q8_1_act(v, &mut q8);
                b[..32].copy_from_slice(&q8[4..]);
                crate::quant::f16_at(&q8, 2).to_le_bytes()
            } else {
                super::avx2::quantize_q8_0_act(v, &mut q8[..34]);
                b[..32].copy_from_slice(&q8[2..34]);
                let sum: i32 = q8[2..34].iter().map(|&q| q as i8 as i32).sum();
                (-16 * sum).to_le_bytes()
            };
            b[ACT_D..ACT_D + 4].copy_from_slice(&crate::quant::f16_at(&q8, 0).to_le_bytes());
            b[ACT_4..ACT].copy_from_slice(&last4);
        }
        Ok(())
    }

    /// `out[t * os + r] = dot(row r, token t)` for one interleaved group `w` (`n` columns,
    /// sixteen rows) and `n_tok` (1..=8) prepared activation rows `a`. Mis-sized input writes
    /// NaN to whatever of `out` exists.
    pub fn dots(&self, w: &[u8], a: &[u8], n: usize, n_tok: usize, out: &mut [f32], os: usize) {
        super::group_dots(&self.cores, (ROWS, 32, block(self.q41), ACT), w, a, n, n_tok, out, os)
    }
}

/// The ×16 kernels for weights of `ty` (Q5_0 or Q4_1) at `tier` (AVX2 and up).
pub(super) fn kernels(ty: GgmlType, tier: CpuTier) -> Option<X16Kernels> {
    match ty {
        GgmlType::Q5_0 => cores::<false>(tier).map(|cores| X16Kernels { cores, q41: false }),
        GgmlType::Q4_1 => cores::<true>(tier).map(|cores| X16Kernels { cores, q41: true }),
        _ => None,
    }
}
