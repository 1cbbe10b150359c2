//! libm's `expf`, sixteen values at a time, with the same bits.
//!
//! The attention's softmax weights are `expf` of f32 differences; llama.cpp computes them
//! with glibc's `expf` one at a time, and so did kiln. On x86-64 glibc (2.27 and later)
//! picks the FMA build of its `expf` (ARM's optimized-routines algorithm): in double,
//! `k = round(x · 32/ln2)` by adding `0x1.8p52` in one FMA, `r = x · 32/ln2 - k` in
//! another, `2^(k/32)` from a 32-entry table with `k/32` added to its exponent, a cubic in
//! `r`, one multiply, one rounding to f32. Doing exactly that on eight doubles per AVX-512
//! register gives the same bits for every input (`tests::matches_libm_on_every_input`),
//! without a call and a serial dependency per value.
//!
//! The constants are glibc's `__exp2f_data`, read from this machine's libm.

/// `2^(i/32)` as the bits of a double with `i << 47` subtracted, so adding `k << 47`
/// (`k ≡ i mod 32`) gives `2^(k/32)`.
const TAB: [u64; 32] = [
    0x3ff0000000000000,
    0x3fefd9b0d3158574,
    0x3fefb5586cf9890f,
    0x3fef9301d0125b51,
    0x3fef72b83c7d517b,
    0x3fef54873168b9aa,
    0x3fef387a6e756238,
    0x3fef1e9df51fdee1,
    0x3fef06fe0a31b715,
    0x3feef1a7373aa9cb,
    0x3feedea64c123422,
    0x3feece086061892d,
    0x3feebfdad5362a27,
    0x3feeb42b569d4f82,
    0x3feeab07dd485429,
    0x3feea47eb03a5585,
    0x3feea09e667f3bcd,
    0x3fee9f75e8ec5f74,
    0x3feea11473eb0187,
    0x3feea589994cce13,
    0x3feeace5422aa0db,
    0x3feeb737b0cdc5e5,
    0x3feec49182a3f090,
    0x3feed503b23e255d,
    0x3feee89f995ad3ad,
    0x3feeff76f2fb5e47,
    0x3fef199bdd85529c,
    0x3fef3720dcef9069,
    0x3fef5818dcfba487,
    0x3fef7c97337b9b5f,
    0x3fefa4afa2a490da,
    0x3fefd0765b6e4540,
];
/// `32 / ln 2`.
const INV_LN2_N: f64 = f64::from_bits(0x4047_1547_652b_82fe);
/// `0x1.8p52`: adding it rounds to an integer held in the low mantissa bits.
const SHIFT: f64 = f64::from_bits(0x4338_0000_0000_0000);
/// The cubic's coefficients (of `r³`, `r²`, `r`), scaled for `r` in units of ln2/32.
const C: [f64; 3] = [
    f64::from_bits(0x3ebc_6af8_4b91_2394),
    f64::from_bits(0x3f2e_bfce_50fa_c4f3),
    f64::from_bits(0x3f96_2e42_ff0c_52d6),
];
/// Below this glibc returns +0 (underflow); below `MAY_UFLOW`, the least subnormal.
const UFLOW: f32 = -103.972_08; // -0x1.9fe368p6
const MAY_UFLOW: f32 = -103.278_93; // -0x1.9d1d9ep6

/// `x[i] = expf(x[i])`, the bits of libm's `expf`.
pub fn expf_slice(x: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if crate::quant::cpu_tier() >= crate::quant::CpuTier::Avx512 {
        // SAFETY: the CPU has AVX-512 F.
        return unsafe { simd::expf_slice(x) };
    }
    x.iter_mut().for_each(|v| *v = v.exp());
}

/// The value glibc's normal path gives (|x| < 88, or the underflow range below -88).
#[cfg(test)]
fn expf_scalar(x: f32) -> f32 {
    let xd = x as f64;
    let kr = xd.mul_add(INV_LN2_N, SHIFT);
    let ki = kr.to_bits();
    let kd = kr - SHIFT;
    let r = xd.mul_add(INV_LN2_N, -kd);
    let s = f64::from_bits(TAB[(ki % 32) as usize].wrapping_add(ki << 47));
    let z = r.mul_add(C[0], C[1]);
    let y = z.mul_add(r * r, r.mul_add(C[2], 1.0));
    (y * s) as f32
}

#[cfg(target_arch = "x86_64")]
pub(super) mod simd {
    use std::arch::x86_64::*;

    use super::{C, INV_LN2_N, MAY_UFLOW, SHIFT, TAB, UFLOW};

    /// Eight values: glibc's normal path in double.
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn expf8(x: __m256) -> __m256 {
        let xd = _mm512_cvtps_pd(x);
        let (inv, shift) = (_mm512_set1_pd(INV_LN2_N), _mm512_set1_pd(SHIFT));
        let kr = _mm512_fmadd_pd(xd, inv, shift);
        let ki = _mm512_castpd_si512(kr);
        let kd = _mm512_sub_pd(kr, shift);
        let r = _mm512_fmsub_pd(xd, inv, kd);
        // The table in four registers; bit 3 of the index picks within a pair, bit 4 the pair.
        let tab = |i: usize| _mm512_loadu_si512(TAB.as_ptr().add(i).cast());
        let lo = _mm512_permutex2var_epi64(tab(0), ki, tab(8));
        let hi = _mm512_permutex2var_epi64(tab(16), ki, tab(24));
        let upper = _mm512_test_epi64_mask(ki, _mm512_set1_epi64(16));
        let t = _mm512_mask_blend_epi64(upper, lo, hi);
        let s = _mm512_castsi512_pd(_mm512_add_epi64(t, _mm512_slli_epi64::<47>(ki)));
        let z = _mm512_fmadd_pd(r, _mm512_set1_pd(C[0]), _mm512_set1_pd(C[1]));
        let y = _mm512_fmadd_pd(r, _mm512_set1_pd(C[2]), _mm512_set1_pd(1.0));
        let y = _mm512_fmadd_pd(z, _mm512_mul_pd(r, r), y);
        _mm512_cvtpd_ps(_mm512_mul_pd(y, s))
    }

    /// Sixteen values, with glibc's branches for |x| >= 88 (top bits of x at or above
    /// those of 88.0) as masks: underflow to +0 or the least subnormal, and libm itself
    /// for the rest (overflow, infinities, NaN), which attention never feeds it.
    #[inline]
    #[target_feature(enable = "avx512f")]
    pub unsafe fn expf16(x: __m512) -> __m512 {
        let lo = expf8(_mm512_castps512_ps256(x));
        let hi = expf8(_mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(x))));
        let mut y = _mm512_castpd_ps(_mm512_insertf64x4::<1>(
            _mm512_castps_pd(_mm512_castps256_ps512(lo)),
            _mm256_castps_pd(hi),
        ));
        let top = _mm512_and_si512(_mm512_srli_epi32::<20>(_mm512_castps_si512(x)), _mm512_set1_epi32(0x7ff));
        let special = _mm512_cmpgt_epi32_mask(top, _mm512_set1_epi32(0x42a));
        if special == 0 {
            return y;
        }
        let below = |c: f32| _mm512_cmp_ps_mask::<_CMP_LT_OQ>(x, _mm512_set1_ps(c));
        let (uflow, may) = (below(UFLOW), below(MAY_UFLOW));
        // x in [MAY_UFLOW, -88] takes the normal path; -inf is below UFLOW (glibc: +0).
        y = _mm512_mask_blend_ps(may, y, _mm512_set1_ps(f32::from_bits(1)));
        y = _mm512_mask_blend_ps(uflow, y, _mm512_setzero_ps());
        let normal_neg = _mm512_cmp_ps_mask::<_CMP_LT_OQ>(x, _mm512_setzero_ps());
        let rest = special & !normal_neg;
        if rest != 0 {
            let (mut xs, mut ys) = ([0f32; 16], [0f32; 16]);
            _mm512_storeu_ps(xs.as_mut_ptr(), x);
            _mm512_storeu_ps(ys.as_mut_ptr(), y);
            for i in 0..16 {
                if rest >> i & 1 == 1 {
                    ys[i] = xs[i].exp();
                }
            }
            y = _mm512_loadu_ps(ys.as_ptr());
        }
        y
    }

    #[target_feature(enable = "avx512f")]
    pub unsafe fn expf_slice(x: &mut [f32]) {
        let body = x.len() / 16 * 16;
        for i in (0..body).step_by(16) {
            let p = x.as_mut_ptr().add(i);
            _mm512_storeu_ps(p, expf16(_mm512_loadu_ps(p)));
        }
        let tail = x.len() - body;
        if tail > 0 {
            let mut buf = [0f32; 16];
            buf[..tail].copy_from_slice(&x[body..]);
            let y = expf16(_mm512_loadu_ps(buf.as_ptr()));
            _mm512_storeu_ps(buf.as_mut_ptr(), y);
            x[body..].copy_from_slice(&buf[..tail]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Compares `expf_slice` with libm over the f32 inputs with bits `lo..hi`, by `step`.
    fn check(lo: u64, hi: u64, step: u64) {
        let mut buf = Vec::with_capacity(4096);
        let mut i = lo;
        while i < hi {
            buf.clear();
            while buf.len() < 4093 && i < hi {
                buf.push(f32::from_bits(i as u32));
                i += step;
            }
            let mut y = buf.clone();
            expf_slice(&mut y);
            for (&x, &y) in buf.iter().zip(&y) {
                let want = x.exp();
                let same = want.to_bits() == y.to_bits() || (want.is_nan() && y.is_nan());
                assert!(same, "expf({x:e} = {:#x}): libm {want:e}, ours {y:e}", x.to_bits());
            }
        }
    }

    #[test]
    fn matches_libm_on_sampled_inputs() {
        // A prime stride through all 2^32 bit patterns, plus the edges of every branch.
        check(0, 1 << 32, 4099);
        for x in [0.0, -0.0, -88.0, 88.0, UFLOW, MAY_UFLOW, f32::INFINITY, f32::NEG_INFINITY, f32::NAN] {
            let b = x.to_bits() as u64;
            check(b.saturating_sub(64), (b + 64).min(1 << 32), 1);
        }
    }

    /// Every f32 input; about half a minute, so only with KILN_FULL=1.
    #[test]
    fn matches_libm_on_every_input() {
        if std::env::var("KILN_FULL").as_deref() != Ok("1") {
            eprintln!("skipped: set KILN_FULL=1 to compare expf on all 2^32 inputs");
            return;
        }
        check(0, 1 << 32, 1);
    }

    #[test]
    fn scalar_form_matches_libm_on_the_normal_path() {
        for i in (0..1u64 << 32).step_by(65_537) {
            let x = f32::from_bits(i as u32);
            if x.abs() < 88.0 {
                assert_eq!(expf_scalar(x).to_bits(), x.exp().to_bits(), "{x:e}");
            }
        }
    }
}
