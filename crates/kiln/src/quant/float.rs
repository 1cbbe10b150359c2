//! F32, F16 and BF16 rows: conversion both ways and ggml's scalar dot products, which sum
//! f32 products in an f64 accumulator (`ggml_float`).

use half::f16;

pub(super) fn dequantize_f32(src: &[u8], dst: &mut [f32]) {
    for (d, s) in dst.iter_mut().zip(src.chunks_exact(4)) {
        *d = f32::from_le_bytes([s[0], s[1], s[2], s[3]]);
    }
}

pub(super) fn dequantize_f16(src: &[u8], dst: &mut [f32]) {
    // Aligned input (the usual case for tensor data) as u16s vectorizes much better.
    #[cfg(target_endian = "little")]
    if let Ok(h) = bytemuck::try_cast_slice::<u8, u16>(src) {
        for (d, &h) in dst.iter_mut().zip(h) {
            *d = f16_to_f32(h);
        }
        return;
    }
    for (d, s) in dst.iter_mut().zip(src.chunks_exact(2)) {
        *d = f16_to_f32(u16::from_le_bytes([s[0], s[1]]));
    }
}

pub(super) fn dequantize_bf16(src: &[u8], dst: &mut [f32]) {
    for (d, s) in dst.iter_mut().zip(src.chunks_exact(2)) {
        *d = bf16_to_f32(u16::from_le_bytes([s[0], s[1]]));
    }
}

pub(super) fn quantize_f32(src: &[f32], dst: &mut [u8]) {
    for (s, d) in src.iter().zip(dst.chunks_exact_mut(4)) {
        d.copy_from_slice(&s.to_le_bytes());
    }
}

/// Round to nearest even, as F16C's `vcvtps2ph` and ggml's portable converter both do.
pub(super) fn quantize_f16(src: &[f32], dst: &mut [u8]) {
    for (s, d) in src.iter().zip(dst.chunks_exact_mut(2)) {
        d.copy_from_slice(&f16::from_f32(*s).to_le_bytes());
    }
}

pub(super) fn quantize_bf16(src: &[f32], dst: &mut [u8]) {
    for (s, d) in src.iter().zip(dst.chunks_exact_mut(2)) {
        d.copy_from_slice(&f32_to_bf16(*s).to_le_bytes());
    }
}

/// Exact f16 -> f32 widening without branches or int->float conversions, so loops over it
/// vectorize (`half`'s portable path is several times slower, and this runs for every block
/// scale in the scalar kernels). NaN payloads are kept, like numpy's conversion.
#[inline(always)]
pub(super) fn f16_to_f32(h: u16) -> f32 {
    const EXP: u32 = 0x7c00 << 13;
    let h = h as u32;
    let o = (h & 0x7fff) << 13;
    let exp = o & EXP;
    let rebiased = o + ((127 - 15) << 23);
    // Subnormals: give them the smallest normal exponent, then subtract its implicit one.
    let sub = (f32::from_bits(rebiased + (1 << 23)) - f32::from_bits(113 << 23)).to_bits();
    let bits = if exp == EXP {
        rebiased + ((128 - 16) << 23)
    } else if exp == 0 {
        sub
    } else {
        rebiased
    };
    f32::from_bits(bits | ((h & 0x8000) << 16))
}

#[inline]
pub(super) fn bf16_to_f32(b: u16) -> f32 {
    f32::from_bits((b as u32) << 16)
}

/// ggml's `ggml_compute_fp32_to_bf16`: NaNs are made quiet, everything else rounds to
/// nearest even (infinities and overflow land on infinity).
#[inline]
pub(super) fn f32_to_bf16(x: f32) -> u16 {
    let u = x.to_bits();
    if u & 0x7fff_ffff > 0x7f80_0000 {
        return ((u >> 16) | 64) as u16;
    }
    ((u as u64 + (0x7fff + ((u >> 16) & 1)) as u64) >> 16) as u16
}

pub(super) fn dot_f32(w: &[u8], a: &[u8], n: usize) -> f32 {
    let mut sum = 0f64;
    for (x, y) in w.chunks_exact(4).zip(a.chunks_exact(4)).take(n) {
        let x = f32::from_le_bytes([x[0], x[1], x[2], x[3]]);
        let y = f32::from_le_bytes([y[0], y[1], y[2], y[3]]);
        sum += (x * y) as f64;
    }
    sum as f32
}

pub(super) fn dot_f16(w: &[u8], a: &[u8], n: usize) -> f32 {
    let mut sum = 0f64;
    for (x, y) in w.chunks_exact(2).zip(a.chunks_exact(2)).take(n) {
        let x = f16_to_f32(u16::from_le_bytes([x[0], x[1]]));
        let y = f16_to_f32(u16::from_le_bytes([y[0], y[1]]));
        sum += (x * y) as f64;
    }
    sum as f32
}

pub(super) fn dot_bf16(w: &[u8], a: &[u8], n: usize) -> f32 {
    let mut sum = 0f64;
    for (x, y) in w.chunks_exact(2).zip(a.chunks_exact(2)).take(n) {
        let x = bf16_to_f32(u16::from_le_bytes([x[0], x[1]]));
        let y = bf16_to_f32(u16::from_le_bytes([y[0], y[1]]));
        sum += (x * y) as f64;
    }
    sum as f32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bf16_rounds_like_ggml() {
        assert_eq!(f32_to_bf16(1.0), 0x3f80);
        // 1 + 2^-8 is exactly halfway between two bf16 values: ties go to even.
        assert_eq!(f32_to_bf16(f32::from_bits(0x3f80_8000)), 0x3f80);
        assert_eq!(f32_to_bf16(f32::from_bits(0x3f81_8000)), 0x3f82);
        assert_eq!(f32_to_bf16(f32::INFINITY), 0x7f80);
        assert_eq!(f32_to_bf16(f32::from_bits(0x7f80_0001)), 0x7fc0);
    }

    #[test]
    fn f16_widening_matches_half_for_every_non_nan() {
        for h in 0..=u16::MAX {
            let want = f16::from_bits(h).to_f32();
            if !want.is_nan() {
                assert_eq!(f16_to_f32(h).to_bits(), want.to_bits(), "{h:#06x}");
            }
        }
    }
}
