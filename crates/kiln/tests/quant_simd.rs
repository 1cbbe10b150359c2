//! The SIMD dot products against the scalar reference on random rows, for every tier this
//! CPU has. They may differ only by float rounding (summation order, FMA).

mod support;

use std::time::Instant;

use kiln::quant::{
    dequantize_row, detected_cpu_tier, quantize_activation, quantize_row, vec_dot, vec_dot_f16,
    vec_dot_fn_for, CpuTier, GgmlType, ALL_TYPES,
};
use support::Rng;

fn tiers() -> Vec<CpuTier> {
    [CpuTier::Avx2, CpuTier::Avx512].into_iter().filter(|&t| t <= detected_cpu_tier()).collect()
}

fn rows(ty: GgmlType, n: usize, rng: &mut Rng) -> (Vec<u8>, Vec<u8>, f64) {
    let x: Vec<f32> = (0..n).map(|_| rng.normal(0.3)).collect();
    let y: Vec<f32> = (0..n).map(|_| rng.normal(2.0)).collect();
    let mut w = vec![0u8; ty.row_size(n).unwrap()];
    quantize_row(ty, &x, &mut w).unwrap();
    let at = ty.vec_dot_type();
    let mut a = vec![0u8; at.row_size(n).unwrap()];
    quantize_activation(at, &y, &mut a).unwrap();
    let (mut wd, mut ad) = (vec![0f32; n], vec![0f32; n]);
    dequantize_row(ty, &w, &mut wd).unwrap();
    dequantize_row(at, &a, &mut ad).unwrap();
    let magnitude = wd.iter().zip(&ad).map(|(&p, &q)| (p * q).abs() as f64).sum();
    (w, a, magnitude)
}

#[test]
fn simd_vec_dot_matches_scalar() {
    println!("detected CPU tier: {:?}", detected_cpu_tier());
    let mut rng = Rng(0x1234_5678_9abc_def1);
    for tier in tiers() {
        for ty in ALL_TYPES.into_iter().filter(|t| t.is_supported()) {
            let f = vec_dot_fn_for(ty, tier);
            let (mut num, mut den) = (0f64, 0f64);
            for blocks in [1usize, 2, 3, 7, 16] {
                let n = blocks * ty.block_size().max(32);
                let n = n.div_ceil(ty.block_size()) * ty.block_size();
                let (w, a, magnitude) = rows(ty, n, &mut rng);
                let want = vec_dot(ty, &w, &a, n) as f64;
                let got = f(&w, &a, n) as f64;
                if ty == GgmlType::Q5_0 {
                    // Every Q5_0 kernel takes the scalar reference's float steps.
                    assert_eq!(got.to_bits(), want.to_bits(), "{ty} {tier:?} n={n}: bits");
                }
                assert!(
                    (got - want).abs() <= 1e-5 * magnitude + 1e-6,
                    "{ty} {tier:?} n={n}: simd {got} scalar {want} (magnitude {magnitude})"
                );
                num += (got - want).powi(2);
                den += want.powi(2);
            }
            let nmse = num / den.max(1e-30);
            assert!(nmse < 1e-10, "{ty} {tier:?}: NMSE {nmse:e}");
        }
    }
}

#[test]
fn f16_dot_any_length() {
    let mut rng = Rng(99);
    for n in (0..200).chain([255, 256, 257, 1000, 4097]) {
        let x: Vec<f32> = (0..n).map(|_| rng.normal(1.0)).collect();
        let y: Vec<f32> = (0..n).map(|_| rng.normal(1.0)).collect();
        let (mut w, mut a) = (vec![0u8; 2 * n], vec![0u8; 2 * n]);
        quantize_row(GgmlType::F16, &x, &mut w).unwrap();
        quantize_row(GgmlType::F16, &y, &mut a).unwrap();
        let want = vec_dot(GgmlType::F16, &w, &a, n);
        let magnitude: f32 = x.iter().zip(&y).map(|(p, q)| (p * q).abs()).sum();
        for got in [vec_dot_f16(&w, &a, n)]
            .into_iter()
            .chain(tiers().into_iter().map(|t| vec_dot_fn_for(GgmlType::F16, t)(&w, &a, n)))
        {
            assert!((got - want).abs() <= 1e-5 * magnitude + 1e-6, "n={n}: {got} vs {want}");
        }
    }
}

#[test]
fn scalar_tier_is_the_reference() {
    let mut rng = Rng(7);
    for ty in [GgmlType::Q4_0, GgmlType::Q4_K, GgmlType::F16] {
        let (w, a, _) = rows(ty, 512, &mut rng);
        let f = vec_dot_fn_for(ty, CpuTier::Scalar);
        assert_eq!(f(&w, &a, 512).to_bits(), vec_dot(ty, &w, &a, 512).to_bits());
    }
    assert!(CpuTier::Scalar < CpuTier::Avx2 && CpuTier::Avx2 < CpuTier::Avx512);
}

/// Not a pass/fail check: prints the speed-up of each tier over scalar (release builds).
#[test]
fn simd_speed_report() {
    let mut rng = Rng(5);
    let n = 4096;
    let mut lines = Vec::new();
    for ty in [
        GgmlType::F16,
        GgmlType::Q8_0,
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q5_0,
        GgmlType::Q4_K,
        GgmlType::Q5_K,
        GgmlType::Q6_K,
    ] {
        let (w, a, _) = rows(ty, n, &mut rng);
        let time = |tier: CpuTier| {
            let f = vec_dot_fn_for(ty, tier);
            let reps = 300;
            let t = Instant::now();
            let mut s = 0f32;
            for _ in 0..reps {
                s += f(std::hint::black_box(&w), std::hint::black_box(&a), n);
            }
            std::hint::black_box(s);
            t.elapsed().as_secs_f64() * 1e9 / (reps * n) as f64
        };
        let scalar = time(CpuTier::Scalar);
        let mut line = format!("{ty}: scalar {scalar:.3} ns/elem");
        for tier in tiers() {
            let t = time(tier);
            line += &format!(", {} {t:.3} ({:.1}x)", tier.name(), scalar / t);
        }
        lines.push(line);
    }
    println!("{}", lines.join("\n"));
}

/// Not a pass/fail check: scalar dequantization speed (it runs when loading and for
/// embeddings), per type.
#[test]
fn dequantize_speed_report() {
    let n = 1 << 16;
    let mut lines = Vec::new();
    for ty in [GgmlType::F16, GgmlType::BF16, GgmlType::Q8_0, GgmlType::Q4_K, GgmlType::Q6_K] {
        let x: Vec<f32> = (0..n).map(|i| (i as f32 * 0.37).sin()).collect();
        let mut q = vec![0u8; ty.row_size(n).unwrap()];
        quantize_row(ty, &x, &mut q).unwrap();
        let mut y = vec![0f32; n];
        let t = Instant::now();
        for _ in 0..20 {
            dequantize_row(ty, std::hint::black_box(&q), &mut y).unwrap();
        }
        lines.push(format!("{ty} {:.3} ns/elem", t.elapsed().as_secs_f64() * 1e9 / (20 * n) as f64));
    }
    println!("dequantize: {}", lines.join(", "));
}

#[test]
fn f16_dequantize_exact_for_every_value() {
    let src: Vec<u8> = (0..=u16::MAX).flat_map(|h| h.to_le_bytes()).collect();
    let mut out = vec![0f32; 1 << 16];
    dequantize_row(GgmlType::F16, &src, &mut out).unwrap();
    for (h, v) in out.iter().enumerate() {
        let want = half::f16::from_bits(h as u16).to_f32();
        assert!(want.is_nan() && v.is_nan() || want.to_bits() == v.to_bits(), "{h:#06x}: {v} vs {want}");
    }
    // And unaligned input takes the same (or the scalar) path with the same result.
    let mut shifted = vec![0u8; src.len() + 1];
    shifted[1..].copy_from_slice(&src);
    let mut out2 = vec![0f32; 1 << 16];
    dequantize_row(GgmlType::F16, &shifted[1..], &mut out2).unwrap();
    assert!(out.iter().zip(&out2).all(|(a, b)| a.to_bits() == b.to_bits() || a.is_nan() && b.is_nan()));
}

/// ggml's x86 activation quantization written out plainly: `127 / amax`, round half to
/// even, d (and d * sum for Q8_1) as f16.
fn q8_act_reference(ty: GgmlType, x: &[f32]) -> Vec<u8> {
    let (bytes, off) = if ty == GgmlType::Q8_1 { (36, 4) } else { (34, 2) };
    let mut out = vec![0u8; x.len() / 32 * bytes];
    for (xb, b) in x.chunks_exact(32).zip(out.chunks_exact_mut(bytes)) {
        let amax = xb.iter().fold(0f32, |m, v| m.max(v.abs()));
        let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
        let mut sum = 0i32;
        for (q, &v) in b[off..].iter_mut().zip(xb) {
            let qi = ((v * id).round_ties_even() as i32).clamp(-128, 127);
            *q = qi as i8 as u8;
            sum += qi;
        }
        let d = amax / 127.0;
        b[..2].copy_from_slice(&half::f16::from_f32(d).to_le_bytes());
        if ty == GgmlType::Q8_1 {
            b[2..4].copy_from_slice(&half::f16::from_f32(d * sum as f32).to_le_bytes());
        }
    }
    out
}

/// The activation quantizers (SIMD where the CPU has it) give exactly ggml's bytes: random
/// rows, an all-zero block, exact halves (ties) and a block whose amax is negative.
#[test]
fn activation_quantization_is_bit_exact() {
    let mut rng = Rng(0x0bad_cafe_f00d_d00d);
    let mut x: Vec<f32> = (0..32 * 64).map(|_| rng.normal(3.0)).collect();
    x[..32].fill(0.0);
    for (i, v) in x[32..64].iter_mut().enumerate() {
        *v = if i == 0 { 127.0 } else { (i as f32 - 16.0) + 0.5 };
    }
    for (i, v) in x[64..96].iter_mut().enumerate() {
        *v = if i == 5 { -50.0 } else { i as f32 * 0.25 };
    }
    for ty in [GgmlType::Q8_0, GgmlType::Q8_1] {
        let mut got = vec![0u8; ty.row_size(x.len()).unwrap()];
        quantize_activation(ty, &x, &mut got).unwrap();
        assert_eq!(got, q8_act_reference(ty, &x), "{ty}");
    }
}

/// Q8_K activations (SIMD where the CPU has it) give the reference quantizer's bytes:
/// random superblocks, an all-zero one, one whose largest magnitude appears first negative
/// then positive (the first wins), exact halves (ties) and a NaN (skipped by the max).
#[test]
fn q8_k_activation_quantization_is_bit_exact() {
    let mut rng = Rng(0x5eed_0f08);
    let mut x: Vec<f32> = (0..256 * 12).map(|_| rng.normal(2.0)).collect();
    x[..256].fill(0.0);
    for (i, v) in x[256..512].iter_mut().enumerate() {
        *v = match i {
            37 => -9.0,
            200 => 9.0,
            _ => (i % 17) as f32 * 0.5 - 4.0,
        };
    }
    x[600] = f32::NAN;
    x[1000] = 1e-30;
    let mut want = vec![0u8; GgmlType::Q8_K.row_size(x.len()).unwrap()];
    quantize_row(GgmlType::Q8_K, &x, &mut want).unwrap();
    let mut got = vec![0u8; want.len()];
    quantize_activation(GgmlType::Q8_K, &x, &mut got).unwrap();
    assert_eq!(got, want);
}
