//! The F16 matmul's dot of one weight row and one activation row, in the order of
//! llamafile's tinyBLAS on AVX-512 (llama.cpp's CPU F16 matmul): sixteen lane chains, value
//! `i` fused into lane `i % 16` in ascending order, then the lanes summed as GCC's
//! `_mm512_reduce_add_ps`: halves, quarters, pairs, the last two. The scalar reference the
//! SIMD tiles (`simd/f16_gemm.rs`) are tested against, bit for bit.

use super::f16_at;

/// Lanes of the chains.
pub const F16_LANES: usize = 16;

/// `dot(w, a)` of an F16 row `w` (`2 n` bytes, little-endian) and an f32 row `a` of `n`
/// values (F16 values widened: `round_f16_rows`), `n` a multiple of [`F16_LANES`] (NaN
/// otherwise, or if a row is short).
pub fn dot_f16_lanes(w: &[u8], a: &[f32], n: usize) -> f32 {
    if !n.is_multiple_of(F16_LANES) || w.len() < 2 * n || a.len() < n {
        return f32::NAN;
    }
    let mut acc = [0f32; F16_LANES];
    for (i, &y) in a[..n].iter().enumerate() {
        acc[i % F16_LANES] = f16_at(w, 2 * i).mul_add(y, acc[i % F16_LANES]);
    }
    let h: [f32; 8] = std::array::from_fn(|j| acc[j] + acc[j + 8]);
    let q: [f32; 4] = std::array::from_fn(|j| h[j] + h[j + 4]);
    (q[0] + q[2]) + (q[1] + q[3])
}
