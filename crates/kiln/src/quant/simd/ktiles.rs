//! Tile cores of the k-quants (256-element superblocks with Q8_K activations), in the
//! arithmetic order of the kernels llama.cpp runs on x86 for each format (see each core),
//! so that kiln's results track llama.cpp's: the integer work is exact, only the float
//! operations' order matters, and it is theirs.
//!
//! Each weight superblock (scales, mins, quants) is unpacked once per tile and shared by its
//! T tokens; every (row, token) pair then runs the same float operations in the same order
//! as the 1×1 instantiation, which is also the single-pair AVX2 kernel: tiles stay
//! bit-identical. The `VNNI` instantiations (the AVX-512 VNNI tier) unpack into 512-bit
//! pairs of groups; their integer sums are the same, so every tier gives the same bits.

#![allow(clippy::needless_range_loop)] // r, t index several tile arrays at once

use std::arch::x86_64::*;

use super::prefetch;

use super::avx2::{f32_at, h2f, hsum_ps, loadu};

use super::{Q8K_BSUMS, Q8K_BYTES, Q8K_QS};

/// `vpshufb` patterns: bytes (2k, 2k+1) repeated, i.e. i16 lane k broadcast within each
/// 128-bit half.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn i16_lane(v: __m256i, k: usize) -> __m256i {
    let b = (2 * k) as i8;
    _mm256_shuffle_epi8(v, _mm256_set1_epi16(i16::from_le_bytes([b as u8, b as u8 + 1])))
}

/// Q4_K's 12 bytes of packed 6-bit scales and mins at `p` (16 bytes are read) as 16 i16:
/// the 8 scales, then the 8 mins (`kquants::scale_min_k4` for all eight at once). Bytes
/// 0-3 and 4-7 hold the low 6 bits of scales and mins 0-3 and their top 2 bits those of
/// 4-7, whose low 4 bits are the nibbles of bytes 8-11.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q4_k_scales_mins(p: *const u8) -> __m256i {
    const Z: i8 = -128; // a `pshufb` index that yields 0
    let v = _mm_loadu_si128(p as *const __m128i);
    let low = _mm_shuffle_epi8(v, _mm_setr_epi8(0, 1, 2, 3, 8, 9, 10, 11, 4, 5, 6, 7, 8, 9, 10, 11));
    let top = _mm_shuffle_epi8(v, _mm_setr_epi8(Z, Z, Z, Z, 0, 1, 2, 3, Z, Z, Z, Z, 4, 5, 6, 7));
    let lo6 = _mm_set1_epi32(0x3f3f_3f3f);
    let low_bits = _mm_and_si128(low, _mm_setr_epi32(0x3f3f_3f3f, 0x0f0f_0f0f, 0x3f3f_3f3f, 0));
    let high_nibbles = _mm_and_si128(_mm_srli_epi16::<4>(low), _mm_setr_epi32(0, 0, 0, 0x0f0f_0f0f));
    let top_bits = _mm_srli_epi16::<2>(_mm_andnot_si128(lo6, top));
    _mm256_cvtepu8_epi16(_mm_or_si128(_mm_or_si128(low_bits, high_nibbles), top_bits))
}

/// The i32 lanes of `Σ_k scale_k · maddubs(q_k, y_k)` over the eight 32-element groups of
/// a superblock (`scale_k` as i16 pairs, `q_k` unsigned quants), `y` at the Q8_K quants.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn scaled_sums(q: &[__m256i; 8], scale: &[__m256i; 8], y: *const u8) -> __m256i {
    let mut sumi = _mm256_setzero_si256();
    for k in (0..8).step_by(2) {
        let p0 = _mm256_madd_epi16(scale[k], _mm256_maddubs_epi16(q[k], loadu(y.add(32 * k))));
        let p1 = _mm256_madd_epi16(scale[k + 1], _mm256_maddubs_epi16(q[k + 1], loadu(y.add(32 * k + 32))));
        sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(p0, p1));
    }
    sumi
}

/// [`scaled_sums`] on the AVX-512 tier, the groups paired (2j, 2j+1: adjacent in `y`) in
/// 512-bit vectors, the halves folded at the end: integer sums, so the same lanes, bit for
/// bit.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vnni")]
unsafe fn scaled_sums_512(q: &[__m512i; 4], scale: &[__m512i; 4], y: *const u8) -> __m256i {
    let mut sumi = _mm512_setzero_si512();
    for j in 0..4 {
        let p = _mm512_maddubs_epi16(q[j], _mm512_loadu_si512(y.add(64 * j).cast()));
        sumi = _mm512_dpwssd_epi32(sumi, scale[j], p);
    }
    _mm256_add_epi32(_mm512_castsi512_si256(sumi), _mm512_extracti64x4_epi64::<1>(sumi))
}

/// `vpermw` indices that spread i16 scales over a 512-bit group pair: Q4_K's pair j takes
/// scales 2j, 2j+1 (32 quants each); Q6_K's takes 4j..4j+4 (16 quants each).
static Q4K_PAIR_SCALES: [[i16; 32]; 4] = pair_scale_table(16);
static Q6K_PAIR_SCALES: [[i16; 32]; 4] = pair_scale_table(8);

/// Lane l of pair j takes scale (32j + l) / `lanes_per_scale`.
const fn pair_scale_table(lanes_per_scale: usize) -> [[i16; 32]; 4] {
    let mut t = [[0i16; 32]; 4];
    let mut j = 0;
    while j < 4 {
        let mut l = 0;
        while l < 32 {
            t[j][l] = ((32 * j + l) / lanes_per_scale) as i16;
            l += 1;
        }
        j += 1;
    }
    t
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw")]
unsafe fn pair_scales(table: &[[i16; 32]; 4], scales: __m256i) -> [__m512i; 4] {
    let s = _mm512_castsi256_si512(scales);
    std::array::from_fn(|j| _mm512_permutexvar_epi16(_mm512_loadu_si512(table[j].as_ptr().cast()), s))
}

/// i16 shift counts: `a` for the low 256 bits, `b` for the high.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw")]
unsafe fn shifts(a: i16, b: i16) -> __m512i {
    _mm512_inserti64x4::<1>(_mm512_castsi256_si512(_mm256_set1_epi16(a)), _mm256_set1_epi16(b))
}

/// Q4_K's groups as 512-bit pairs: pair j is the low then the high nibbles of quant bytes
/// 32j..32j+32 (groups 2j, 2j+1), with their scales.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw")]
unsafe fn q4_k_pairs(xb: *const u8, scales_mins: __m256i) -> ([__m512i; 4], [__m512i; 4]) {
    let m4 = _mm512_set1_epi8(0x0f);
    let q = std::array::from_fn(|j| {
        let bits = _mm512_broadcast_i64x4(loadu(xb.add(16 + 32 * j)));
        _mm512_and_si512(_mm512_srlv_epi16(bits, shifts(0, 4)), m4)
    });
    (q, pair_scales(&Q4K_PAIR_SCALES, scales_mins))
}

/// Q6_K's groups as 512-bit pairs: pair 2n + h holds groups 4n + 2h, 4n + 2h + 1, whose low
/// 4 bits are the low (h = 0) or high nibbles of `ql` bytes 64n..64n+64 and whose top 2
/// bits are bit pairs 2h, 2h + 1 (first 32 quants) and 2h + 2, 2h + 3 (next 32) of `qh`
/// bytes 32n..32n+32.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw")]
unsafe fn q6_k_pairs(xb: *const u8, scales16: __m256i) -> ([__m512i; 4], [__m512i; 4]) {
    let (m4, m2) = (_mm512_set1_epi8(0x0f), _mm512_set1_epi8(3));
    let top = |h: __m512i| _mm512_slli_epi16::<4>(_mm512_and_si512(h, m2));
    let mut q = [_mm512_setzero_si512(); 4];
    for n in 0..2 {
        let l = _mm512_loadu_si512(xb.add(64 * n).cast());
        let h = _mm512_srlv_epi16(_mm512_broadcast_i64x4(loadu(xb.add(128 + 32 * n))), shifts(0, 2));
        q[2 * n] = _mm512_or_si512(_mm512_and_si512(l, m4), top(h));
        q[2 * n + 1] =
            _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16::<4>(l), m4), top(_mm512_srli_epi16::<4>(h)));
    }
    (q, pair_scales(&Q6K_PAIR_SCALES, scales16))
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
    const MAX_PAIRS: usize = 8;
    const GROUPS: usize = MAX_PAIRS / 4;
    const { assert!(R * T <= MAX_PAIRS) };
    let m4 = _mm256_set1_epi8(0x0f);
    // Pair p = r·T + t is lane p % 4 of group p / 4: its sum and min accumulators.
    let (mut acc_sum, mut acc_min) = ([_mm_setzero_ps(); GROUPS], [_mm_setzero_ps(); GROUPS]);
    let ahead = prefetch::tile_distance(R * xs);
    for i in 0..nb {
        let yb: [*const u8; T] = std::array::from_fn(|t| y.add(t * ys + Q8K_BYTES * i));
        // Sums of 32 quants: one per (scale, min) group.
        let q8s: [__m128i; T] = std::array::from_fn(|t| {
            let bsums = loadu(yb[t].add(Q8K_BSUMS));
            _mm_hadd_epi16(_mm256_castsi256_si128(bsums), _mm256_extracti128_si256::<1>(bsums))
        });
        let mut sums = [_mm256_setzero_si256(); MAX_PAIRS];
        let mut mins_sums = [_mm_setzero_si128(); MAX_PAIRS];
        let (mut d_bits, mut dmin_bits, mut dy) = ([0i16; MAX_PAIRS], [0i16; MAX_PAIRS], [0f32; MAX_PAIRS]);
        for r in 0..R {
            // One row's superblock, unpacked once for the T tokens.
            let xb = x.add(r * xs + 144 * i);
            prefetch::block(xb, ahead, 144);
            let sm = q4_k_scales_mins(xb.add(4));
            let mins = _mm256_extracti128_si256::<1>(sm);
            for t in 0..T {
                let p = r * T + t;
                mins_sums[p] = _mm_madd_epi16(mins, q8s[t]);
                d_bits[p] = (xb as *const i16).read_unaligned();
                dmin_bits[p] = (xb.add(2) as *const i16).read_unaligned();
                dy[p] = f32_at(yb[t]);
            }
            if VNNI {
                let (q, scale) = q4_k_pairs(xb, sm);
                for t in 0..T {
                    sums[r * T + t] = scaled_sums_512(&q, &scale, yb[t].add(Q8K_QS));
                }
                continue;
            }
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
            for t in 0..T {
                sums[r * T + t] = scaled_sums(&q, &scale, yb[t].add(Q8K_QS));
            }
        }
        // Four pairs at a time: their integer totals, then one FMA each into their lanes.
        for g in 0..(R * T).div_ceil(4) {
            let four = |v: &[i16; MAX_PAIRS]| {
                _mm_cvtph_ps(_mm_setr_epi16(v[4 * g], v[4 * g + 1], v[4 * g + 2], v[4 * g + 3], 0, 0, 0, 0))
            };
            let dyv = _mm_loadu_ps(dy.as_ptr().add(4 * g));
            let s = _mm_cvtepi32_ps(hsum4_256(&sums[4 * g..4 * g + 4]));
            let m = _mm_cvtepi32_ps(hsum4_128(&mins_sums[4 * g..4 * g + 4]));
            acc_sum[g] = _mm_fmadd_ps(s, _mm_mul_ps(four(&d_bits), dyv), acc_sum[g]);
            acc_min[g] = _mm_fmadd_ps(m, _mm_mul_ps(four(&dmin_bits), dyv), acc_min[g]);
        }
    }
    let mut res = [0f32; MAX_PAIRS];
    for g in 0..GROUPS {
        _mm_storeu_ps(res.as_mut_ptr().add(4 * g), _mm_sub_ps(acc_sum[g], acc_min[g]));
    }
    std::ptr::copy_nonoverlapping(res.as_ptr(), out, R * T);
}

/// The totals of four vectors of eight i32, as one vector of four.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn hsum4_256(v: &[__m256i]) -> __m128i {
    let h = _mm256_hadd_epi32(_mm256_hadd_epi32(v[0], v[1]), _mm256_hadd_epi32(v[2], v[3]));
    _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256::<1>(h))
}

/// The totals of four vectors of four i32, as one vector of four.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn hsum4_128(v: &[__m128i]) -> __m128i {
    _mm_hadd_epi32(_mm_hadd_epi32(v[0], v[1]), _mm_hadd_epi32(v[2], v[3]))
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
    let ahead = prefetch::tile_distance(R * xs);
    for i in 0..nb {
        let yb: [*const u8; T] = std::array::from_fn(|t| y.add(t * ys + Q8K_BYTES * i));
        let dy: [f32; T] = std::array::from_fn(|t| f32_at(yb[t]));
        for r in 0..R {
            // One row's superblock, unpacked once for the T tokens.
            let xb = x.add(r * xs + 210 * i);
            prefetch::block(xb, ahead, 210);
            // 16 i8 scales, one per 16 quants: group k (32 quants) takes scales 2k, 2k+1.
            let raw = _mm_loadu_si128(xb.add(192) as *const __m128i);
            let scales16 = _mm256_cvtepi8_epi16(raw);
            let dx = h2f(xb.add(208));
            let fold = |sumi: __m256i, t: usize, acc: __m256| {
                let bsums = loadu(yb[t].add(Q8K_BSUMS));
                let offset = _mm256_slli_epi32::<5>(_mm256_madd_epi16(bsums, scales16));
                let d = dy[t] * dx;
                _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(_mm256_sub_epi32(sumi, offset)), acc)
            };
            if VNNI {
                let (q, scale) = q6_k_pairs(xb, scales16);
                for t in 0..T {
                    acc[r][t] = fold(scaled_sums_512(&q, &scale, yb[t].add(Q8K_QS)), t, acc[r][t]);
                }
                continue;
            }
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
            let scale: [__m256i; 8] = std::array::from_fn(|k| {
                let byte = |s: usize| s as i64 * 0x0101_0101_0101_0101;
                let pick = _mm_set_epi64x(byte(2 * k + 1), byte(2 * k));
                _mm256_cvtepi8_epi16(_mm_shuffle_epi8(raw, pick))
            });
            for t in 0..T {
                acc[r][t] = fold(scaled_sums(&q, &scale, yb[t].add(Q8K_QS)), t, acc[r][t]);
            }
        }
    }
    for r in 0..R {
        for t in 0..T {
            *out.add(r * T + t) = hsum_ps(acc[r][t]);
        }
    }
}
