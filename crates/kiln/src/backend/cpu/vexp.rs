//! SwiGLU with ggml's vectorized `expf` (the AVX-512 form of `ggml_v_expf`: a degree-5
//! polynomial of the reduced argument, scaled by `2^n`), so that `silu(gate) * up` is
//! bit-identical to llama.cpp's `ggml_vec_swiglu_f32`. Like ggml, groups of 16 values take
//! the polynomial and a tail shorter than 16 takes libm's `expf`.

/// ggml's vector `expf` of one value (exact emulation of one SIMD lane).
#[inline(always)]
pub fn expf_ggml(x: f32) -> f32 {
    let (j, n) = poly(x);
    scalef(j, n)
}

/// `(j, n)` with `exp(x) ≈ j · 2^n`.
#[inline(always)]
fn poly(x: f32) -> (f32, f32) {
    let r = f32::from_bits(0x4b40_0000); // 0x1.8p23: rounds to an integer when added
    let z = x.mul_add(f32::from_bits(0x3fb8_aa3b), r); // log2(e)
    let n = z - r;
    let b = (-n).mul_add(f32::from_bits(0x35bf_be8e), (-n).mul_add(f32::from_bits(0x3f31_7200), x));
    let u = b * b;
    let c = [0x3c07_2010u32, 0x3d2b_9f17, 0x3e2a_af33, 0x3eff_fedb, 0x3f7f_fff6].map(f32::from_bits);
    let j = c[0].mul_add(b, c[1]).mul_add(u, c[2].mul_add(b, c[3])).mul_add(u, c[4].mul_add(b, 1.0));
    (j, n)
}

/// `vscalefps`: `j · 2^n` rounded once; beyond |n| > 192 ggml returns 0 or infinity.
#[inline(always)]
fn scalef(j: f32, n: f32) -> f32 {
    if n.abs() > 192.0 {
        return if n <= 0.0 { 0.0 } else { f32::INFINITY };
    }
    // Exact in f64 (|n| <= 192), then one rounding to f32, as the instruction does.
    (j as f64 * 2f64.powi(n as i32)) as f32
}

fn silu_mul(g: f32, u: f32, exp: impl Fn(f32) -> f32) -> f32 {
    g / (1.0 + exp(-g)) * u
}

/// `gate = silu(gate) * up`, rows of any length (ggml's tail rule applies per call).
pub fn swiglu(gate: &mut [f32], up: &[f32]) {
    #[cfg(target_arch = "x86_64")]
    if crate::quant::cpu_tier() >= crate::quant::CpuTier::Avx2 {
        // SAFETY: the CPU has AVX2 and FMA.
        return unsafe { simd::swiglu(gate, up) };
    }
    swiglu_scalar(gate, up);
}

fn swiglu_scalar(gate: &mut [f32], up: &[f32]) {
    let body = gate.len() / 16 * 16;
    let (gb, gt) = gate.split_at_mut(body);
    for (g, &u) in gb.iter_mut().zip(up) {
        *g = silu_mul(*g, u, expf_ggml);
    }
    for (g, &u) in gt.iter_mut().zip(&up[body..]) {
        *g = silu_mul(*g, u, f32::exp);
    }
}

#[cfg(target_arch = "x86_64")]
mod simd {
    use std::arch::x86_64::*;

    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn expf8(x: __m256) -> __m256 {
        let r = _mm256_set1_ps(f32::from_bits(0x4b40_0000));
        let z = _mm256_fmadd_ps(x, _mm256_set1_ps(f32::from_bits(0x3fb8_aa3b)), r);
        let n = _mm256_sub_ps(z, r);
        let b = _mm256_fnmadd_ps(
            n,
            _mm256_set1_ps(f32::from_bits(0x35bf_be8e)),
            _mm256_fnmadd_ps(n, _mm256_set1_ps(f32::from_bits(0x3f31_7200)), x),
        );
        let u = _mm256_mul_ps(b, b);
        let c = |bits: u32| _mm256_set1_ps(f32::from_bits(bits));
        let j = _mm256_fmadd_ps(
            _mm256_fmadd_ps(
                _mm256_fmadd_ps(c(0x3c07_2010), b, c(0x3d2b_9f17)),
                u,
                _mm256_fmadd_ps(c(0x3e2a_af33), b, c(0x3eff_fedb)),
            ),
            u,
            _mm256_fmadd_ps(c(0x3f7f_fff6), b, _mm256_set1_ps(1.0)),
        );
        let big =
            _mm256_cmp_ps::<_CMP_GT_OQ>(_mm256_andnot_ps(_mm256_set1_ps(-0.0), n), _mm256_set1_ps(126.0));
        if _mm256_movemask_ps(big) == 0 {
            // 2^n is a normal float: one exact multiply-by-power-of-two, rounded once.
            let k = _mm256_slli_epi32::<23>(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)));
            return _mm256_mul_ps(j, _mm256_castsi256_ps(k));
        }
        let (mut jv, mut nv) = ([0f32; 8], [0f32; 8]);
        _mm256_storeu_ps(jv.as_mut_ptr(), j);
        _mm256_storeu_ps(nv.as_mut_ptr(), n);
        let out: [f32; 8] = std::array::from_fn(|i| super::scalef(jv[i], nv[i]));
        _mm256_loadu_ps(out.as_ptr())
    }

    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn swiglu(gate: &mut [f32], up: &[f32]) {
        let body = gate.len() / 16 * 16;
        let one = _mm256_set1_ps(1.0);
        for i in (0..body).step_by(8) {
            let g = _mm256_loadu_ps(gate.as_ptr().add(i));
            let e = expf8(_mm256_sub_ps(_mm256_setzero_ps(), g));
            let s = _mm256_div_ps(g, _mm256_add_ps(one, e));
            _mm256_storeu_ps(gate.as_mut_ptr().add(i), _mm256_mul_ps(s, _mm256_loadu_ps(up.as_ptr().add(i))));
        }
        for (g, &u) in gate[body..].iter_mut().zip(&up[body..]) {
            *g = super::silu_mul(*g, u, f32::exp);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn simd_swiglu_equals_the_scalar_emulation_bit_for_bit() {
        // Arguments over the whole range, including |n| > 126 and > 192.
        let n = 16 * 500 + 7;
        let gate: Vec<f32> =
            (0..n).map(|i| (i as f32 * 0.731).sin() * 40.0 + (i % 7) as f32 * 31.0 - 100.0).collect();
        let up: Vec<f32> = (0..n).map(|i| (i as f32 * 0.37).cos() * 3.0).collect();
        let mut a = gate.clone();
        let mut b = gate.clone();
        swiglu(&mut a, &up);
        swiglu_scalar(&mut b, &up);
        for (i, (x, y)) in a.iter().zip(&b).enumerate() {
            assert_eq!(x.to_bits(), y.to_bits(), "value {i}: gate {}", gate[i]);
        }
    }

    #[test]
    fn ggml_expf_is_within_two_ulps_of_libm() {
        for i in -8700..8800 {
            let x = i as f32 * 0.01;
            let (g, l) = (expf_ggml(x), x.exp());
            if l.is_normal() {
                assert!((g.to_bits() as i64 - l.to_bits() as i64).abs() <= 2, "{x}: {g} vs {l}");
            }
        }
        assert_eq!(expf_ggml(-200.0), 0.0);
        assert_eq!(expf_ggml(200.0), f32::INFINITY);
    }
}
