//! Q8_K activations (the k-quants' `vec_dot_type`) with AVX2, bit-identical to the scalar
//! reference `kquants_ref::quantize_q8_k`: the same f32 multiply and round-half-even trick
//! per value, the same first-of-the-largest `max`, exact integer block sums.

use std::arch::x86_64::*;

/// `kquants_ref::quantize_q8_k` for whole superblocks.
pub(super) fn quantize_q8_k_act(src: &[f32], dst: &mut [u8]) {
    for (x, y) in src.chunks_exact(256).zip(dst.chunks_exact_mut(292)) {
        // SAFETY: only handed out for the AVX2 tier and up; `x` holds 256 values, `y` 292 bytes.
        unsafe { superblock(x.as_ptr(), y.as_mut_ptr()) };
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn superblock(x: *const f32, y: *mut u8) {
    let sign = _mm256_set1_ps(-0.0);
    let v: [__m256; 32] = std::array::from_fn(|i| _mm256_loadu_ps(x.add(8 * i)));
    // max(|v|, acc) keeps acc where |v| is NaN, as the scalar `>` skips it.
    let mut amax = _mm256_setzero_ps();
    for vi in &v {
        amax = _mm256_max_ps(_mm256_andnot_ps(sign, *vi), amax);
    }
    let a = _mm_max_ps(_mm256_castps256_ps128(amax), _mm256_extractf128_ps::<1>(amax));
    let a = _mm_max_ps(a, _mm_movehl_ps(a, a));
    let amax = _mm_cvtss_f32(_mm_max_ss(a, _mm_movehdup_ps(a)));
    if amax == 0.0 {
        std::ptr::write_bytes(y, 0, 292);
        return;
    }
    // The first value of largest magnitude, with its sign.
    let target = _mm256_set1_ps(amax);
    let mut max = amax;
    for (i, vi) in v.iter().enumerate() {
        let hit = _mm256_movemask_ps(_mm256_cmp_ps::<_CMP_EQ_OQ>(_mm256_andnot_ps(sign, *vi), target));
        if hit != 0 {
            max = *x.add(8 * i + hit.trailing_zeros() as usize);
            break;
        }
    }
    let iscale = -127.0 / max;
    let (scale, magic) = (_mm256_set1_ps(iscale), _mm256_set1_ps(12582912.0));
    let (mask, bias, top) =
        (_mm256_set1_epi32(0x007f_ffff), _mm256_set1_epi32(0x0040_0000), _mm256_set1_epi32(127));
    // `nearest_int(iscale * v).min(127)` per value, 32 bits.
    let q: [__m256i; 32] = std::array::from_fn(|i| {
        let r = _mm256_castps_si256(_mm256_add_ps(_mm256_mul_ps(scale, v[i]), magic));
        _mm256_min_epi32(_mm256_sub_epi32(_mm256_and_si256(r, mask), bias), top)
    });
    let order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    for j in 0..8 {
        // packs interleave 128-bit halves; the permute restores value order.
        let w = _mm256_packs_epi16(
            _mm256_packs_epi32(q[4 * j], q[4 * j + 1]),
            _mm256_packs_epi32(q[4 * j + 2], q[4 * j + 3]),
        );
        _mm256_storeu_si256(y.add(4 + 32 * j).cast(), _mm256_permutevar8x32_epi32(w, order));
    }
    // Sums of 16 quants: pairs of vectors, reduced four at a time.
    let s: [__m256i; 16] = std::array::from_fn(|j| _mm256_add_epi32(q[2 * j], q[2 * j + 1]));
    let mut sums = [0i32; 16];
    for g in 0..4 {
        let h = _mm256_hadd_epi32(
            _mm256_hadd_epi32(s[4 * g], s[4 * g + 1]),
            _mm256_hadd_epi32(s[4 * g + 2], s[4 * g + 3]),
        );
        let h = _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256::<1>(h));
        _mm_storeu_si128(sums.as_mut_ptr().add(4 * g).cast(), h);
    }
    for (j, &sum) in sums.iter().enumerate() {
        (y.add(260 + 2 * j) as *mut [u8; 2]).write_unaligned((sum as i16).to_le_bytes());
    }
    (y as *mut [u8; 4]).write_unaligned((1.0 / iscale).to_le_bytes());
}
