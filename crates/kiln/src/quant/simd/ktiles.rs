//! Tile cores of the k-quants (256-element superblocks with Q8_K activations), in the
//! arithmetic order of the kernels llama.cpp runs on x86 for each format (see each core),
//! so that kiln's results track llama.cpp's: the integer work is exact, only the float
//! operations' order matters, and it is theirs.
//!
//! Each weight superblock (scales, mins, quants) is unpacked once per tile and shared by its
//! T tokens; every (row, token) pair then runs the same operations in the same order as the
//! 1×1 instantiation, which is also the single-pair AVX2 kernel: tiles stay bit-identical.

#![allow(clippy::needless_range_loop)] // r, t index several tile arrays at once

use std::arch::x86_64::*;

use super::avx2::{f32_at, h2f, hsum_ps, loadu};

/// Q8_K: f32 d, 256 quants, then 16 i16 sums of 16 quants each.
const Q8K_BYTES: usize = 292;
const Q8K_QS: usize = 4;
const Q8K_BSUMS: usize = 260;

/// `vpshufb` patterns: bytes (2k, 2k+1) repeated, i.e. i16 lane k broadcast within each
/// 128-bit half.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn i16_lane(v: __m256i, k: usize) -> __m256i {
    let b = (2 * k) as i8;
    _mm256_shuffle_epi8(v, _mm256_set1_epi16(i16::from_le_bytes([b as u8, b as u8 + 1])))
}

/// Q4_K's 12 bytes of packed 6-bit scales and mins as 16 i16: the 8 scales, then the 8 mins
/// (the unpacking of ggml's `utmp` words; `kquants::scale_min_k4` per element).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q4_k_scales_mins(p: *const u8) -> __m256i {
    const LOW6: u32 = 0x3f3f_3f3f;
    const LOW4: u32 = 0x0f0f_0f0f;
    const LOW2: u32 = 0x0303_0303;
    let word = |k: usize| (p.add(4 * k) as *const u32).read_unaligned();
    let (u0, u1, u2) = (word(0), word(1), word(2));
    let scales_lo = u0 & LOW6;
    let scales_hi = (u2 & LOW4) | (((u0 >> 6) & LOW2) << 4);
    let mins_lo = u1 & LOW6;
    let mins_hi = ((u2 >> 4) & LOW4) | (((u1 >> 6) & LOW2) << 4);
    let v = _mm_setr_epi32(scales_lo as i32, scales_hi as i32, mins_lo as i32, mins_hi as i32);
    _mm256_cvtepu8_epi16(v)
}

/// The i32 lanes of `Σ_k scale_k · maddubs(q_k, y_k)` over the eight 32-element groups of
/// a superblock (`scale_k` as i16 pairs, `q_k` unsigned quants), `y` at the Q8_K quants.
/// `WIDE` (the AVX-512 tier) runs groups 2j, 2j+1 (adjacent in `y`) as one 512-bit vector
/// and folds the halves at the end: integer sums, so the same lanes, bit for bit.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn scaled_sums<const WIDE: bool>(q: &[__m256i; 8], scale: &[__m256i; 8], y: *const u8) -> __m256i {
    if WIDE {
        return scaled_sums_512(q, scale, y);
    }
    let mut sumi = _mm256_setzero_si256();
    for k in (0..8).step_by(2) {
        let p0 = _mm256_madd_epi16(scale[k], _mm256_maddubs_epi16(q[k], loadu(y.add(32 * k))));
        let p1 = _mm256_madd_epi16(scale[k + 1], _mm256_maddubs_epi16(q[k + 1], loadu(y.add(32 * k + 32))));
        sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(p0, p1));
    }
    sumi
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw")]
unsafe fn scaled_sums_512(q: &[__m256i; 8], scale: &[__m256i; 8], y: *const u8) -> __m256i {
    let join = |a: __m256i, b: __m256i| _mm512_inserti64x4::<1>(_mm512_castsi256_si512(a), b);
    let mut sumi = _mm512_setzero_si512();
    for j in 0..4 {
        let p = _mm512_maddubs_epi16(join(q[2 * j], q[2 * j + 1]), _mm512_loadu_si512(y.add(64 * j).cast()));
        sumi = _mm512_add_epi32(sumi, _mm512_madd_epi16(join(scale[2 * j], scale[2 * j + 1]), p));
    }
    _mm256_add_epi32(_mm512_castsi512_si256(sumi), _mm512_extracti64x4_epi64::<1>(sumi))
}

/// Q4_K with Q8_K activations: `out[r * T + t] = dot(x row r, y row t)`, in the order of
/// ggml's repacked Q4_K kernels (what llama.cpp runs on x86): per superblock the exact
/// integer sum and min sum, each folded in by one FMA (`sum · (x.d·y.d)`, `mins ·
/// (x.dmin·y.d)`), the min total subtracted at the end.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn q4_k_core<const R: usize, const T: usize, const VNNI: bool>(
    x: *const u8,
    xs: usize,
    y: *const u8,
    ys: usize,
    nb: usize,
    out: *mut f32,
) {
    let m4 = _mm256_set1_epi8(0x0f);
    // Lanes [sum, mins, sum, mins] of each pair.
    let mut acc = [[_mm_setzero_ps(); T]; R];
    for i in 0..nb {
        let yb: [*const u8; T] = std::array::from_fn(|t| y.add(t * ys + Q8K_BYTES * i));
        let dy: [__m128; T] = std::array::from_fn(|t| _mm_set1_ps(f32_at(yb[t])));
        // Sums of 32 quants: one per (scale, min) group.
        let q8s: [__m128i; T] = std::array::from_fn(|t| {
            let bsums = loadu(yb[t].add(Q8K_BSUMS));
            _mm_hadd_epi16(_mm256_castsi256_si128(bsums), _mm256_extracti128_si256::<1>(bsums))
        });
        for r in 0..R {
            // One row's superblock, unpacked once for the T tokens.
            let xb = x.add(r * xs + 144 * i);
            let sm = q4_k_scales_mins(xb.add(4));
            let mins = _mm256_extracti128_si256::<1>(sm);
            let sc = _mm256_permute2x128_si256::<0x00>(sm, sm);
            let mut q = [_mm256_setzero_si256(); 8];
            let mut scale = [_mm256_setzero_si256(); 8];
            for j in 0..4 {
                let bits = loadu(xb.add(16 + 32 * j));
                q[2 * j] = _mm256_and_si256(bits, m4);
                q[2 * j + 1] = _mm256_and_si256(_mm256_srli_epi16::<4>(bits), m4);
                scale[2 * j] = i16_lane(sc, 2 * j);
                scale[2 * j + 1] = i16_lane(sc, 2 * j + 1);
            }
            // [d, dmin, d, dmin]
            let dx = _mm_cvtph_ps(_mm_set1_epi32((xb as *const i32).read_unaligned()));
            for t in 0..T {
                let sumi = scaled_sums::<VNNI>(&q, &scale, yb[t].add(Q8K_QS));
                let sum4 = _mm_add_epi32(_mm256_castsi256_si128(sumi), _mm256_extracti128_si256::<1>(sumi));
                let h = _mm_hadd_epi32(sum4, _mm_madd_epi16(mins, q8s[t]));
                let totals = _mm_cvtepi32_ps(_mm_hadd_epi32(h, h));
                acc[r][t] = _mm_fmadd_ps(totals, _mm_mul_ps(dx, dy[t]), acc[r][t]);
            }
        }
    }
    for r in 0..R {
        for t in 0..T {
            let a = acc[r][t];
            *out.add(r * T + t) = _mm_cvtss_f32(_mm_sub_ss(a, _mm_movehdup_ps(a)));
        }
    }
}

/// Q6_K with Q8_K activations, in the order of ggml's AVX2 `ggml_vec_dot_q6_K_q8_K` (x86
/// llama.cpp does not repack Q6_K): per superblock the scaled integer sums stay in eight
/// i32 lanes, folded into an eight-lane f32 accumulator by one FMA; one horizontal sum at
/// the end. The quants are stored +32; that offset comes out through the activation block
/// sums (`32 · Σ scale_j · bsum_j`, subtracted lane-wise).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn q6_k_core<const R: usize, const T: usize, const VNNI: bool>(
    x: *const u8,
    xs: usize,
    y: *const u8,
    ys: usize,
    nb: usize,
    out: *mut f32,
) {
    let (m4, m2) = (_mm256_set1_epi8(0x0f), _mm256_set1_epi8(3));
    let hbits = |s: __m256i| _mm256_slli_epi16::<4>(_mm256_and_si256(s, m2));
    let mut acc = [[_mm256_setzero_ps(); T]; R];
    for i in 0..nb {
        let yb: [*const u8; T] = std::array::from_fn(|t| y.add(t * ys + Q8K_BYTES * i));
        let dy: [f32; T] = std::array::from_fn(|t| f32_at(yb[t]));
        for r in 0..R {
            // One row's superblock, unpacked once for the T tokens.
            let xb = x.add(r * xs + 210 * i);
            let mut q = [_mm256_setzero_si256(); 8];
            for n in 0..2 {
                let (ql, qh) = (xb.add(64 * n), xb.add(128 + 32 * n));
                let (l0, l1, h) = (loadu(ql), loadu(ql.add(32)), loadu(qh));
                let l0_hi = _mm256_and_si256(_mm256_srli_epi16::<4>(l0), m4);
                let l1_hi = _mm256_and_si256(_mm256_srli_epi16::<4>(l1), m4);
                q[4 * n] = _mm256_or_si256(_mm256_and_si256(l0, m4), hbits(h));
                q[4 * n + 1] = _mm256_or_si256(_mm256_and_si256(l1, m4), hbits(_mm256_srli_epi16::<2>(h)));
                q[4 * n + 2] = _mm256_or_si256(l0_hi, hbits(_mm256_srli_epi16::<4>(h)));
                q[4 * n + 3] = _mm256_or_si256(l1_hi, hbits(_mm256_srli_epi16::<6>(h)));
            }
            // 16 i8 scales, one per 16 quants: group k (32 quants) takes scales 2k, 2k+1.
            let raw = _mm_loadu_si128(xb.add(192) as *const __m128i);
            let scales16 = _mm256_cvtepi8_epi16(raw);
            let scale: [__m256i; 8] = std::array::from_fn(|k| {
                let byte = |s: usize| s as i64 * 0x0101_0101_0101_0101;
                let pick = _mm_set_epi64x(byte(2 * k + 1), byte(2 * k));
                _mm256_cvtepi8_epi16(_mm_shuffle_epi8(raw, pick))
            });
            let dx = h2f(xb.add(208));
            for t in 0..T {
                let bsums = loadu(yb[t].add(Q8K_BSUMS));
                let offset = _mm256_slli_epi32::<5>(_mm256_madd_epi16(bsums, scales16));
                let sumi = _mm256_sub_epi32(scaled_sums::<VNNI>(&q, &scale, yb[t].add(Q8K_QS)), offset);
                let d = dy[t] * dx;
                acc[r][t] = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc[r][t]);
            }
        }
    }
    for r in 0..R {
        for t in 0..T {
            *out.add(r * T + t) = hsum_ps(acc[r][t]);
        }
    }
}
