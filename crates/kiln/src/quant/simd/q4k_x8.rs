//! Matmul kernels on Q4_K×8 (eight rows interleaved, `quant/interleave.rs`) with Q8_K
//! activations: one call gives the dots of the eight rows with 1 to 8 tokens.
//!
//! Each 256-bit load holds bytes `8c..8c+8` of four rows, so a multiply by one broadcast
//! 8-byte piece of a token's quants works on four rows at once, and the 32 quants of a
//! group (one 6-bit scale per row) are summed for eight rows before one scale multiply:
//! AVX2 sums four `maddubs` in 16 bits, then `madd`s by the scales; the VNNI tier sums
//! four `vpdpbusd` into 32-bit lanes of 16 quants (|sum| ≤ 16·15·128 < 2^15), packs them
//! to 16 bits and folds both halves with the scale in one `vpdpwssd`. The unpacked
//! weights of a 64-quant column are shared by all tokens of the call.
//!
//! The float steps are those of `ktiles::q4_k_core` (llama.cpp's repacked Q4_K order):
//! per superblock the exact integer sum and min sum of each (row, token), each folded in by
//! one FMA, `sum · (x.d·y.d)` and `mins · (x.dmin·y.d)`, subtracted at the end; integer
//! sums are exact whatever the instructions, so every tier and token count gives the same
//! bits as the row-major tiles.

#![allow(clippy::needless_range_loop)] // t indexes several per-token arrays at once

use std::arch::x86_64::*;

use super::prefetch;

use super::avx2::{f32_at, loadu};
use crate::quant::interleave::{Q4K_X8_BLOCK, Q4K_X8_LANES, Q4K_X8_ROWS};

use super::{Q8K_BSUMS, Q8K_BYTES, Q8K_QS};
const SCALES: usize = 32;
const QS: usize = 128;

/// `out[t * os + r] = dot(row r, token t)` for the eight rows of the interleaved blocks at
/// `x` and T activation rows `ys` bytes apart at `y`, `nb` superblocks each.
use super::GroupCore as Core;

/// A `vpshufb` pattern: per 128-bit half, 16 byte indices (`-128` yields 0).
type Pattern = [i8; 32];
const Z: i8 = -128;

/// i16 (scale, scale) pairs in the VNNI sum's lane order (rows 0 1 4 5 | 2 3 6 7), from 8
/// scale bytes broadcast to every quadword; also the min pattern's row order.
const SCALE_PAIRS: Pattern =
    [0, Z, 0, Z, 1, Z, 1, Z, 4, Z, 4, Z, 5, Z, 5, Z, 2, Z, 2, Z, 3, Z, 3, Z, 6, Z, 6, Z, 7, Z, 7, Z];
/// AVX2: i16 scales of rows 0-3 (four lanes each), the order of `maddubs` on rows 0-3.
const SCALE_03: Pattern =
    [0, Z, 0, Z, 0, Z, 0, Z, 1, Z, 1, Z, 1, Z, 1, Z, 2, Z, 2, Z, 2, Z, 2, Z, 3, Z, 3, Z, 3, Z, 3, Z];
const SCALE_47: Pattern =
    [4, Z, 4, Z, 4, Z, 4, Z, 5, Z, 5, Z, 5, Z, 5, Z, 6, Z, 6, Z, 6, Z, 6, Z, 7, Z, 7, Z, 7, Z, 7, Z];
/// i16 (min of group 2k, min of group 2k+1) per row in the sum's lane order, from the 16
/// min bytes of the two groups broadcast to both halves.
const MIN_PAIRS: Pattern =
    [0, Z, 8, Z, 1, Z, 9, Z, 4, Z, 12, Z, 5, Z, 13, Z, 2, Z, 10, Z, 3, Z, 11, Z, 6, Z, 14, Z, 7, Z, 15, Z];

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn pattern(p: &Pattern) -> __m256i {
    _mm256_loadu_si256(p.as_ptr().cast())
}

/// The six-bit scales and mins of the eight rows (12 planes of 8 bytes at `p`), as bytes:
/// scales of group g at `8g`, mins at `64 + 8g` (`kquants::scale_min_k4` for 64 values).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn scales_mins(p: *const u8, buf: &mut [u8; 128]) {
    let (y0, y1, y2) = (loadu(p), loadu(p.add(32)), loadu(p.add(64)));
    let (lo6, lo4, top) = (_mm256_set1_epi8(63), _mm256_set1_epi8(15), _mm256_set1_epi8(0x30));
    let high = |v: __m256i| _mm256_and_si256(_mm256_srli_epi16::<2>(v), top);
    let sc47 = _mm256_or_si256(_mm256_and_si256(y2, lo4), high(y0));
    let mn47 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16::<4>(y2), lo4), high(y1));
    let b = buf.as_mut_ptr() as *mut __m256i;
    _mm256_storeu_si256(b, _mm256_and_si256(y0, lo6));
    _mm256_storeu_si256(b.add(1), sc47);
    _mm256_storeu_si256(b.add(2), _mm256_and_si256(y1, lo6));
    _mm256_storeu_si256(b.add(3), mn47);
}

/// The 8 bytes at `p` in every quadword.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn bcast8(p: *const u8) -> __m256i {
    _mm256_set1_epi64x((p as *const i64).read_unaligned())
}

/// One 64-quant column of the eight rows, unpacked: `[lo 0-3, lo 4-7, hi 0-3, hi 4-7][m]`
/// for the four 8-byte steps m; low nibbles are group 2k, high ones group 2k + 1.
type Column = [[__m256i; 4]; 4];

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn column(q: *const u8) -> Column {
    let m4 = _mm256_set1_epi8(0x0f);
    let mut w = [[_mm256_setzero_si256(); 4]; 4];
    for m in 0..4 {
        for h in 0..2 {
            let raw = loadu(q.add(64 * m + 32 * h));
            w[h][m] = _mm256_and_si256(raw, m4);
            w[2 + h][m] = _mm256_and_si256(_mm256_srli_epi16::<4>(raw), m4);
        }
    }
    w
}

/// The scaled sums of groups 2k (low nibbles) and 2k + 1 for eight rows and one token
/// (`yq` at its quants of the column), in lane order: AVX2.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn column_sums_avx2(w: &Column, yq: *const u8, sc: &[[__m256i; 2]; 2]) -> __m256i {
    let mut rows = [_mm256_setzero_si256(); 2];
    for h in 0..2 {
        for nib in 0..2 {
            // Four steps of 8 quants per row, summed in 16 bits (|lane| ≤ 4·2·15·128).
            let part = |m: usize| _mm256_maddubs_epi16(w[2 * nib + h][m], bcast8(yq.add(32 * nib + 8 * m)));
            let s16 =
                _mm256_add_epi16(_mm256_add_epi16(part(0), part(1)), _mm256_add_epi16(part(2), part(3)));
            rows[h] = _mm256_add_epi32(rows[h], _mm256_madd_epi16(s16, sc[nib][h]));
        }
    }
    // [r0 r0 r1 r1 | r2 r2 r3 r3] and rows 4-7 -> [r0 r1 r4 r5 | r2 r3 r6 r7].
    _mm256_hadd_epi32(rows[0], rows[1])
}

/// [`column_sums_avx2`] on the VNNI tier: 16-quant halves in 32 bits, packed to 16 bits
/// (rows 0 1 4 5 | 2 3 6 7, two halves each), folded with the scales by `vpdpwssd`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512vnni")]
unsafe fn column_sums_vnni(w: &Column, yq: *const u8, sc: &[__m256i; 2], acc: __m256i) -> __m256i {
    let mut acc = acc;
    for nib in 0..2 {
        let mut half = [_mm256_setzero_si256(); 2];
        for m in 0..4 {
            let y = bcast8(yq.add(32 * nib + 8 * m));
            for h in 0..2 {
                half[h] = _mm256_dpbusd_epi32(half[h], w[2 * nib + h][m], y);
            }
        }
        acc = _mm256_dpwssd_epi32(acc, _mm256_packs_epi32(half[0], half[1]), sc[nib]);
    }
    acc
}

/// A column's weights in both 256-bit halves, for [`pair_sums_vnni`].
type WideColumn = [[__m512i; 4]; 4];

#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn widen_column(w: &Column, wide: &mut WideColumn, sc: &[__m256i; 2], sc_wide: &mut [__m512i; 2]) {
    for (wr, r) in wide.iter_mut().zip(w) {
        for (d, &v) in wr.iter_mut().zip(r) {
            *d = _mm512_broadcast_i64x4(v);
        }
    }
    *sc_wide = [_mm512_broadcast_i64x4(sc[0]), _mm512_broadcast_i64x4(sc[1])];
}

/// [`column_sums_vnni`] for two tokens at once (`ya`, `yb` at their quants of the column),
/// one per 256-bit half of each 512-bit step: lane for lane the same integer operations,
/// half the `vpdpbusd`s (a 512-bit VNNI unit does twice the work of a 256-bit one).
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn pair_sums_vnni(
    w: &WideColumn,
    ya: *const u8,
    yb: *const u8,
    sc: &[__m512i; 2],
    acc: &mut [__m256i; 2],
) {
    let (a, b) = (_mm512_loadu_si512(ya.cast()), _mm512_loadu_si512(yb.cast()));
    let mut sum = _mm512_inserti64x4::<1>(_mm512_castsi256_si512(acc[0]), acc[1]);
    for nib in 0..2 {
        let mut half = [_mm512_setzero_si512(); 2];
        for m in 0..4 {
            // Token a's 8 quants of this step in the low half, token b's in the high.
            let q = (4 * nib + m) as i64;
            let y =
                _mm512_permutex2var_epi64(a, _mm512_setr_epi64(q, q, q, q, q + 8, q + 8, q + 8, q + 8), b);
            for h in 0..2 {
                half[h] = _mm512_dpbusd_epi32(half[h], w[2 * nib + h][m], y);
            }
        }
        sum = _mm512_dpwssd_epi32(sum, _mm512_packs_epi32(half[0], half[1]), sc[nib]);
    }
    *acc = [_mm512_castsi512_si256(sum), _mm512_extracti64x4_epi64::<1>(sum)];
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn core<const T: usize, const VNNI: bool, const PAIRS: bool>(
    x: *const u8,
    y: *const u8,
    ys: usize,
    nb: usize,
    out: *mut f32,
    os: usize,
) {
    let mut acc_sum = [_mm256_setzero_ps(); T];
    let mut acc_min = [_mm256_setzero_ps(); T];
    let mut buf = [0u8; 128];
    // SAFETY of the zeroed vectors: any bit pattern is a valid integer vector.
    let mut wide: WideColumn = std::mem::zeroed();
    let mut sc_wide: [__m512i; 2] = std::mem::zeroed();
    let (pairs, p03, p47, min_pairs) =
        (pattern(&SCALE_PAIRS), pattern(&SCALE_03), pattern(&SCALE_47), pattern(&MIN_PAIRS));
    let ahead = prefetch::DISTANCE;
    for i in 0..nb {
        let xb = x.add(i * Q4K_X8_BLOCK);
        prefetch::block(xb, ahead, Q4K_X8_BLOCK);
        let yb: [*const u8; T] = std::array::from_fn(|t| y.add(t * ys + Q8K_BYTES * i));
        scales_mins(xb.add(SCALES), &mut buf);
        let mut sums = [_mm256_setzero_si256(); T];
        for k in 0..4 {
            let w = column(xb.add(QS + 256 * k));
            let s = |g: usize, p: __m256i| _mm256_shuffle_epi8(bcast8(buf.as_ptr().add(8 * g)), p);
            if VNNI && PAIRS && T >= 2 {
                // Tokens in pairs on 512-bit steps (an odd last one on a 256-bit step).
                let sc = [s(2 * k, pairs), s(2 * k + 1, pairs)];
                widen_column(&w, &mut wide, &sc, &mut sc_wide);
                for p in 0..T / 2 {
                    let (ya, yb2) = (yb[2 * p].add(Q8K_QS + 64 * k), yb[2 * p + 1].add(Q8K_QS + 64 * k));
                    let mut acc = [sums[2 * p], sums[2 * p + 1]];
                    pair_sums_vnni(&wide, ya, yb2, &sc_wide, &mut acc);
                    [sums[2 * p], sums[2 * p + 1]] = acc;
                }
                if T % 2 == 1 {
                    sums[T - 1] = column_sums_vnni(&w, yb[T - 1].add(Q8K_QS + 64 * k), &sc, sums[T - 1]);
                }
            } else if VNNI {
                let sc = [s(2 * k, pairs), s(2 * k + 1, pairs)];
                for t in 0..T {
                    sums[t] = column_sums_vnni(&w, yb[t].add(Q8K_QS + 64 * k), &sc, sums[t]);
                }
            } else {
                let sc = [[s(2 * k, p03), s(2 * k, p47)], [s(2 * k + 1, p03), s(2 * k + 1, p47)]];
                for t in 0..T {
                    let v = column_sums_avx2(&w, yb[t].add(Q8K_QS + 64 * k), &sc);
                    sums[t] = _mm256_add_epi32(sums[t], v);
                }
            }
        }
        // Min sums: Σ_g min_g · (sum of the token's 32 quants of group g), two groups a step.
        let mins: [__m256i; 4] = std::array::from_fn(|k| {
            let two = _mm_loadu_si128(buf.as_ptr().add(64 + 16 * k).cast());
            _mm256_shuffle_epi8(_mm256_broadcastsi128_si256(two), min_pairs)
        });
        let d = _mm256_cvtph_ps(_mm_loadu_si128(xb.cast()));
        let dmin = _mm256_cvtph_ps(_mm_loadu_si128(xb.add(16).cast()));
        for t in 0..T {
            let bsums = _mm256_loadu_si256(yb[t].add(Q8K_BSUMS).cast());
            let groups = _mm_hadd_epi16(_mm256_castsi256_si128(bsums), _mm256_extracti128_si256::<1>(bsums));
            let groups = _mm256_broadcastsi128_si256(groups);
            let mut m = _mm256_setzero_si256();
            for k in 0..4 {
                let pair = _mm256_shuffle_epi32::<0>(match k {
                    0 => groups,
                    1 => _mm256_srli_si256::<4>(groups),
                    2 => _mm256_srli_si256::<8>(groups),
                    _ => _mm256_srli_si256::<12>(groups),
                });
                m = _mm256_add_epi32(m, _mm256_madd_epi16(mins[k], pair));
            }
            let dy = _mm256_set1_ps(f32_at(yb[t]));
            acc_sum[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums[t]), _mm256_mul_ps(d, dy), acc_sum[t]);
            acc_min[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(m), _mm256_mul_ps(dmin, dy), acc_min[t]);
        }
    }
    let lanes = _mm256_setr_epi32(0, 1, 4, 5, 2, 3, 6, 7);
    debug_assert_eq!(Q4K_X8_LANES, [0, 1, 4, 5, 2, 3, 6, 7]);
    for t in 0..T {
        let v = _mm256_sub_ps(acc_sum[t], acc_min[t]);
        _mm256_storeu_ps(out.add(t * os), _mm256_permutevar8x32_ps(v, lanes));
    }
}

super::group_cores!(PAIRS: bool);

/// The Q4_K×8 matmul kernels of one tier.
#[derive(Clone, Copy)]
pub struct Q4kX8Kernels {
    /// For 1 to 8 tokens.
    cores: [Core; 8],
}

impl Q4kX8Kernels {
    /// Most tokens one call of [`Self::dots`] takes.
    pub const TOKENS: usize = 8;

    /// `out[t * os + r] = dot(row r of the group, token t)` for one group of eight
    /// interleaved rows `w` (`n` columns) and `n_tok` (1..=8) Q8_K activation rows `a`.
    /// Mis-sized input writes NaN to whatever of `out` exists.
    pub fn dots(&self, w: &[u8], a: &[u8], n: usize, n_tok: usize, out: &mut [f32], os: usize) {
        let shape = (Q4K_X8_ROWS, 256, Q4K_X8_BLOCK, Q8K_BYTES);
        super::group_dots(&self.cores, shape, w, a, n, n_tok, out, os)
    }
}

/// The Q4_K×8 kernels at `tier` (AVX2 and up); `pairs`: the VNNI tier's prompt steps take
/// tokens in pairs on 512-bit steps (`super::full_width_512`), else one per 256-bit step.
pub(super) fn kernels(tier: super::CpuTier, pairs: bool) -> Option<Q4kX8Kernels> {
    if pairs { cores::<true>(tier) } else { cores::<false>(tier) }.map(|cores| Q4kX8Kernels { cores })
}
