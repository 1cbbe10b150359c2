//! AVX2 (+FMA, F16C) dot products of weight rows with quantized activation rows.
//!
//! Integer work is exact (8-bit products summed in 16 then 32 bits, never saturating for
//! these value ranges); only the float accumulation order differs from the scalar
//! reference, so results agree with it to float rounding.
//!
//! Every `unsafe fn` here requires AVX2, FMA and F16C; `super::dispatch` hands out the safe
//! wrappers only after detecting them. The wrappers clamp the block count to what both
//! slices hold, so reads never go out of bounds.

use std::arch::x86_64::*;

use super::super::kquants::scale_min_k4;

// ---------------------------------------------------------------- helpers

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn h2f(p: *const u8) -> f32 {
    let bits = (p as *const u16).read_unaligned();
    // A broadcast, not an insert: an insert would merge into (and wait for) a live register.
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_set1_epi16(bits as i16)))
}

/// The products f16(x.d) * f16(y.d) for `count` (<= 8) consecutive blocks, converted
/// together: converting one f16 at a time makes LLVM insert into a live register, which
/// chains every block on the previous block's accumulation.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn scales8(x: *const u8, xs: usize, y: *const u8, ys: usize, count: usize) -> [f32; 8] {
    let (mut hx, mut hy) = ([0u16; 8], [0u16; 8]);
    for k in 0..count.min(8) {
        hx[k] = (x.add(k * xs) as *const u16).read_unaligned();
        hy[k] = (y.add(k * ys) as *const u16).read_unaligned();
    }
    let cvt = |h: &[u16; 8]| _mm256_cvtph_ps(_mm_loadu_si128(h.as_ptr() as *const __m128i));
    let mut out = [0f32; 8];
    _mm256_storeu_ps(out.as_mut_ptr(), _mm256_mul_ps(cvt(&hx), cvt(&hy)));
    out
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn f32_at(p: *const u8) -> f32 {
    (p as *const f32).read_unaligned()
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn loadu(p: *const u8) -> __m256i {
    _mm256_loadu_si256(p as *const __m256i)
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn hsum_ps(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_movehdup_ps(s));
    _mm_cvtss_f32(s)
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn hsum_epi32(v: __m256i) -> i32 {
    let s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256::<1>(v));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b01_00_11_10>(s));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b10_11_00_01>(s));
    _mm_cvtsi128_si32(s)
}

/// Eight i32 sums of four u8 x i8 products each.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn dot_us8(ux: __m256i, sy: __m256i) -> __m256i {
    _mm256_madd_epi16(_mm256_maddubs_epi16(ux, sy), _mm256_set1_epi16(1))
}

/// Eight i32 sums of four i8 x i8 products each (the sign moves onto y so `maddubs`,
/// which wants one unsigned operand, applies).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_s8(x: __m256i, y: __m256i) -> __m256i {
    dot_us8(_mm256_sign_epi8(x, x), _mm256_sign_epi8(y, x))
}

/// 16 packed bytes of nibbles -> 32 bytes: low nibbles first, then high nibbles.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn nibbles_32(p: *const u8) -> __m256i {
    let t = _mm_loadu_si128(p as *const __m128i);
    _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16::<4>(t), t), _mm256_set1_epi8(0x0f))
}

/// The 32 bits at `p` as 32 bytes, 0xff where the bit is set.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn bits_32(p: *const u8) -> __m256i {
    let x = (p as *const u32).read_unaligned();
    let spread = _mm256_set_epi64x(
        0x0303_0303_0303_0303,
        0x0202_0202_0202_0202,
        0x0101_0101_0101_0101,
        0x0000_0000_0000_0000,
    );
    let bytes = _mm256_shuffle_epi8(_mm256_set1_epi32(x as i32), spread);
    let sel = _mm256_set1_epi64x(0x8040_2010_0804_0201u64 as i64);
    _mm256_cmpeq_epi8(_mm256_and_si256(bytes, sel), sel)
}

macro_rules! safe_wrapper {
    ($(#[$m:meta])* $name:ident => $inner:ident, $wsize:expr, $asize:expr) => {
        $(#[$m])*
        pub(super) fn $name(w: &[u8], a: &[u8], _n: usize) -> f32 {
            let nb = (w.len() / $wsize).min(a.len() / $asize);
            // SAFETY: dispatch only returns this after detecting AVX2, FMA and F16C, and
            // the kernel reads `nb` whole blocks, which both slices hold.
            unsafe { $inner(w.as_ptr(), a.as_ptr(), nb) }
        }
    };
}

// ---------------------------------------------------------------- 32-element blocks

/// Runs `body(block, d, ms)` over `nb` 32-element blocks (weight blocks of `xs` bytes,
/// activation blocks of `ys`), with d = x.d * y.d and ms = x.m * y.s (the f16 at byte 2 of
/// each; meaningless for formats without them).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn blocks32(
    x: *const u8,
    xs: usize,
    y: *const u8,
    ys: usize,
    nb: usize,
    with_min: bool,
    mut body: impl FnMut(usize, f32, f32),
) {
    let mut i = 0;
    while i < nb {
        let count = (nb - i).min(8);
        let d = scales8(x.add(xs * i), xs, y.add(ys * i), ys, count);
        let ms =
            if with_min { scales8(x.add(xs * i + 2), xs, y.add(ys * i + 2), ys, count) } else { [0f32; 8] };
        for k in 0..count {
            body(i + k, d[k], ms[k]);
        }
        i += count;
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q8_0_q8_0(x: *const u8, y: *const u8, nb: usize) -> f32 {
    let mut acc = _mm256_setzero_ps();
    blocks32(x, 34, y, 34, nb, false, |i, d, _| {
        let s = dot_s8(loadu(x.add(34 * i + 2)), loadu(y.add(34 * i + 2)));
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(s), acc);
    });
    hsum_ps(acc)
}
safe_wrapper!(dot_q8_0_q8_0 => q8_0_q8_0, 34, 34);

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q4_0_q8_0(x: *const u8, y: *const u8, nb: usize) -> f32 {
    let mut acc = _mm256_setzero_ps();
    let eight = _mm256_set1_epi8(8);
    blocks32(x, 18, y, 34, nb, false, |i, d, _| {
        let qx = _mm256_sub_epi8(nibbles_32(x.add(18 * i + 2)), eight);
        let s = dot_s8(qx, loadu(y.add(34 * i + 2)));
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(s), acc);
    });
    hsum_ps(acc)
}
safe_wrapper!(dot_q4_0_q8_0 => q4_0_q8_0, 18, 34);

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q4_1_q8_1(x: *const u8, y: *const u8, nb: usize) -> f32 {
    let mut acc = _mm256_setzero_ps();
    let mut summs = 0f32;
    blocks32(x, 20, y, 36, nb, true, |i, d, ms| {
        summs += ms;
        let s = dot_us8(nibbles_32(x.add(20 * i + 4)), loadu(y.add(36 * i + 4)));
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(s), acc);
    });
    hsum_ps(acc) + summs
}
safe_wrapper!(dot_q4_1_q8_1 => q4_1_q8_1, 20, 36);

#[target_feature(enable = "avx2,fma,f16c")]
/// ggml's generic float steps (the whole block's integer sum, then `sumf += d · sum`), as
/// every Q5_0 kernel (`x16.rs`).
unsafe fn q5_0_q8_0(x: *const u8, y: *const u8, nb: usize) -> f32 {
    let mut sumf = 0f32;
    let f0 = _mm256_set1_epi8(0xf0u8 as i8);
    blocks32(x, 22, y, 34, nb, false, |i, d, _| {
        let x = x.add(22 * i);
        // Where the fifth bit is clear, nibble | 0xf0 is the nibble minus 16 as an i8.
        let high = _mm256_andnot_si256(bits_32(x.add(2)), f0);
        let qx = _mm256_or_si256(nibbles_32(x.add(6)), high);
        sumf += d * hsum_epi32(dot_s8(qx, loadu(y.add(34 * i + 2)))) as f32;
    });
    sumf
}
safe_wrapper!(dot_q5_0_q8_0 => q5_0_q8_0, 22, 34);

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q5_1_q8_1(x: *const u8, y: *const u8, nb: usize) -> f32 {
    let mut acc = _mm256_setzero_ps();
    let mut summs = 0f32;
    let sixteen = _mm256_set1_epi8(0x10);
    blocks32(x, 24, y, 36, nb, true, |i, d, ms| {
        let x = x.add(24 * i);
        summs += ms;
        let high = _mm256_and_si256(bits_32(x.add(4)), sixteen);
        let qx = _mm256_or_si256(nibbles_32(x.add(8)), high);
        let s = dot_us8(qx, loadu(y.add(36 * i + 4)));
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(s), acc);
    });
    hsum_ps(acc) + summs
}
safe_wrapper!(dot_q5_1_q8_1 => q5_1_q8_1, 24, 36);

// ---------------------------------------------------------------- k-quants

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn bsum(y: *const u8, j: usize) -> i32 {
    (y.add(260 + 2 * j) as *const i16).read_unaligned() as i32
}

/// Q5_K: `quants(j)` gives the 32 low and 32 high unsigned quants of
/// 64-element group j.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn k4_block(
    x: *const u8,
    y: *const u8,
    mut quants: impl FnMut(usize) -> (__m256i, __m256i),
) -> (f32, f32) {
    let scales = std::slice::from_raw_parts(x.add(4), 12);
    let mut summ = 0i32;
    let mut sumi = _mm256_setzero_si256();
    for j in 0..4 {
        let (sc1, m1) = scale_min_k4(2 * j, scales);
        let (sc2, m2) = scale_min_k4(2 * j + 1, scales);
        summ += m1 as i32 * (bsum(y, 4 * j) + bsum(y, 4 * j + 1));
        summ += m2 as i32 * (bsum(y, 4 * j + 2) + bsum(y, 4 * j + 3));
        let (lo, hi) = quants(j);
        let p1 = _mm256_madd_epi16(
            _mm256_maddubs_epi16(lo, loadu(y.add(4 + 64 * j))),
            _mm256_set1_epi16(sc1 as i16),
        );
        let p2 = _mm256_madd_epi16(
            _mm256_maddubs_epi16(hi, loadu(y.add(36 + 64 * j))),
            _mm256_set1_epi16(sc2 as i16),
        );
        sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(p1, p2));
    }
    let dy = f32_at(y);
    (dy * h2f(x) * hsum_epi32(sumi) as f32, dy * h2f(x.add(2)) * summ as f32)
}

/// Q4_K and Q6_K: the 1×1 tile core (ggml's order), so tiles equal the single pair.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q4_k_q8_k(x: *const u8, y: *const u8, nb: usize) -> f32 {
    let mut out = 0f32;
    super::ktiles::q4_k_core::<1, 1, false>(x, 0, y, 0, nb, &mut out);
    out
}
safe_wrapper!(dot_q4_k_q8_k => q4_k_q8_k, 144, 292);

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q5_k_q8_k(x: *const u8, y: *const u8, nb: usize) -> f32 {
    let (m4, one, two) = (_mm256_set1_epi8(0x0f), _mm256_set1_epi8(1), _mm256_set1_epi8(2));
    let (mut sum, mut mins) = (0f32, 0f32);
    for i in 0..nb {
        let (x, y) = (x.add(176 * i), y.add(292 * i));
        let mut hb = loadu(x.add(16));
        let (s, m) = k4_block(x, y, |j| {
            let q = loadu(x.add(48 + 32 * j));
            let lo =
                _mm256_or_si256(_mm256_and_si256(q, m4), _mm256_slli_epi16::<4>(_mm256_and_si256(hb, one)));
            let hi = _mm256_or_si256(
                _mm256_and_si256(_mm256_srli_epi16::<4>(q), m4),
                _mm256_slli_epi16::<3>(_mm256_and_si256(hb, two)),
            );
            hb = _mm256_srli_epi16::<2>(hb);
            (lo, hi)
        });
        sum += s;
        mins += m;
    }
    sum - mins
}
safe_wrapper!(dot_q5_k_q8_k => q5_k_q8_k, 176, 292);

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q6_k_q8_k(x: *const u8, y: *const u8, nb: usize) -> f32 {
    let mut out = 0f32;
    super::ktiles::q6_k_core::<1, 1, false>(x, 0, y, 0, nb, &mut out);
    out
}
safe_wrapper!(dot_q6_k_q8_k => q6_k_q8_k, 210, 292);

// ---------------------------------------------------------------- floats

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn f16_f16(x: *const u8, y: *const u8, n: usize) -> f32 {
    let mut acc = [_mm256_setzero_ps(); 4];
    let mut i = 0;
    let load = |p: *const u8, i: usize| _mm256_cvtph_ps(_mm_loadu_si128(p.add(2 * i) as *const __m128i));
    while i + 32 <= n {
        for (k, acc) in acc.iter_mut().enumerate() {
            *acc = _mm256_fmadd_ps(load(x, i + 8 * k), load(y, i + 8 * k), *acc);
        }
        i += 32;
    }
    while i + 8 <= n {
        acc[0] = _mm256_fmadd_ps(load(x, i), load(y, i), acc[0]);
        i += 8;
    }
    let s = _mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3]));
    let mut sum = hsum_ps(s) as f64;
    for j in i..n {
        sum += (h2f(x.add(2 * j)) * h2f(y.add(2 * j))) as f64;
    }
    sum as f32
}
safe_wrapper!(
    /// F16 weights times F16 activations, `n` elements (whole rows of any length).
    dot_f16 => f16_f16, 2, 2
);

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn f32_f32(x: *const u8, y: *const u8, n: usize) -> f32 {
    let mut acc = [_mm256_setzero_ps(); 4];
    let mut i = 0;
    let load = |p: *const u8, i: usize| _mm256_loadu_ps(p.add(4 * i) as *const f32);
    while i + 32 <= n {
        for (k, acc) in acc.iter_mut().enumerate() {
            *acc = _mm256_fmadd_ps(load(x, i + 8 * k), load(y, i + 8 * k), *acc);
        }
        i += 32;
    }
    let s = _mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3]));
    let mut sum = hsum_ps(s) as f64;
    for j in i..n {
        sum += (f32_at(x.add(4 * j)) * f32_at(y.add(4 * j))) as f64;
    }
    sum as f32
}
safe_wrapper!(dot_f32 => f32_f32, 4, 4);

// ---------------------------------------------------------------- conversions

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn f16_to_f32_row(src: *const u8, dst: *mut f32, n: usize) {
    let mut i = 0;
    while i + 8 <= n {
        let h = _mm_loadu_si128(src.add(2 * i) as *const __m128i);
        _mm256_storeu_ps(dst.add(i), _mm256_cvtph_ps(h));
        i += 8;
    }
    for j in i..n {
        *dst.add(j) = h2f(src.add(2 * j));
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn round_f16_row(src: *const f32, dst: *mut f32, n: usize) {
    let mut i = 0;
    while i + 8 <= n {
        let h = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(_mm256_loadu_ps(src.add(i)));
        _mm256_storeu_ps(dst.add(i), _mm256_cvtph_ps(h));
        i += 8;
    }
    for j in i..n {
        let h = _mm_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(_mm_set_ss(*src.add(j)));
        *dst.add(j) = _mm_cvtss_f32(_mm_cvtph_ps(h));
    }
}

/// Each value rounded to F16 (to nearest, ties to even, as `half::f16::from_f32`) and
/// widened back, with F16C: the scalar path's values (NaNs stay NaN).
pub(super) fn round_f16(src: &[f32], dst: &mut [f32]) {
    let n = src.len().min(dst.len());
    // SAFETY: only called for the Avx2 tier; n values fit both slices.
    unsafe { round_f16_row(src.as_ptr(), dst.as_mut_ptr(), n) }
}

/// F16 -> f32 with F16C (exact, like the scalar path).
pub(super) fn dequantize_f16(src: &[u8], dst: &mut [f32]) {
    let n = dst.len().min(src.len() / 2);
    // SAFETY: only called for the Avx2 tier; n elements fit both slices.
    unsafe { f16_to_f32_row(src.as_ptr(), dst.as_mut_ptr(), n) }
}

/// Q8_0 -> f32: each quant widened and times the block's scale, as the scalar path (exact:
/// the same single rounding).
pub(super) fn dequantize_q8_0(src: &[u8], dst: &mut [f32]) {
    let nb = (src.len() / 34).min(dst.len() / 32);
    // SAFETY: only called for the Avx2 tier; nb whole blocks fit both slices.
    unsafe { q8_0_to_f32(src.as_ptr(), dst.as_mut_ptr(), nb) }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q8_0_to_f32(src: *const u8, dst: *mut f32, nb: usize) {
    for i in 0..nb {
        let (b, y) = (src.add(34 * i), dst.add(32 * i));
        let d = _mm256_set1_ps(h2f(b));
        for k in 0..4 {
            let q = _mm256_cvtepi8_epi32(_mm_loadl_epi64(b.add(2 + 8 * k) as *const __m128i));
            _mm256_storeu_ps(y.add(8 * k), _mm256_mul_ps(_mm256_cvtepi32_ps(q), d));
        }
    }
}

// ---------------------------------------------------------------- activations

/// One 32-value block as `legacy::quantize_block_x86` (ggml's AVX2 `quantize_row_q8_0/1`):
/// the same absmax, the same `127 / amax` multiply, round half to even, saturation to i8;
/// so the bytes are identical to the scalar path. Returns d and the sum of the quants.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn quantize_block_32(x: *const f32, qs: *mut u8) -> (f32, i32) {
    let sign = _mm256_set1_ps(-0.0);
    let v: [__m256; 4] = std::array::from_fn(|k| _mm256_loadu_ps(x.add(8 * k)));
    let m = v.iter().fold(_mm256_setzero_ps(), |m, &v| _mm256_max_ps(m, _mm256_andnot_ps(sign, v)));
    let m = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps::<1>(m));
    let m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    let amax = _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)));
    let d = amax / 127.0;
    let id = _mm256_set1_ps(if amax != 0.0 { 127.0 / amax } else { 0.0 });
    let q: [__m256i; 4] = std::array::from_fn(|k| {
        let r = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(_mm256_mul_ps(v[k], id));
        _mm256_cvtps_epi32(r)
    });
    let sum = hsum_epi32(_mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3])));
    // The saturating packs interleave 128-bit lanes; the permute puts the bytes in order.
    let p = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
    let p = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    _mm256_storeu_si256(qs as *mut __m256i, p);
    (d, sum)
}

/// Q8_0 activations (d, 32 quants per block), bit-identical to the scalar path.
pub(super) fn quantize_q8_0_act(src: &[f32], dst: &mut [u8]) {
    for (x, b) in src.chunks_exact(32).zip(dst.chunks_exact_mut(34)) {
        // SAFETY: only called for the Avx2 tier; the block holds 32 values and 32 quants.
        let (d, _) = unsafe { quantize_block_32(x.as_ptr(), b[2..].as_mut_ptr()) };
        super::super::put_f16(b, 0, d);
    }
}

/// Q8_1 activations (d, d * sum, 32 quants per block), bit-identical to the scalar path.
pub(super) fn quantize_q8_1_act(src: &[f32], dst: &mut [u8]) {
    for (x, b) in src.chunks_exact(32).zip(dst.chunks_exact_mut(36)) {
        // SAFETY: as above.
        let (d, sum) = unsafe { quantize_block_32(x.as_ptr(), b[4..].as_mut_ptr()) };
        super::super::put_f16(b, 0, d);
        super::super::put_f16(b, 2, d * sum as f32);
    }
}
