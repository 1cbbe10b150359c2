//! Quantize/dequantize round trips and dot products, with the thresholds of ggml's
//! tests/test-quantize-fns.cpp, plus vec_dot against the dot of the dequantized rows.

mod support;

use kiln::quant::{dequantize_row, quantize_activation, quantize_row, vec_dot, GgmlType, ALL_TYPES};
use support::Rng;

const MAX_QUANTIZATION_REFERENCE_ERROR: f32 = 0.0001;
const MAX_QUANTIZATION_TOTAL_ERROR: f32 = 0.002;
const MAX_QUANTIZATION_TOTAL_ERROR_2BITS: f32 = 0.0075;
const MAX_QUANTIZATION_TOTAL_ERROR_3BITS: f32 = 0.0040;
const MAX_DOT_PRODUCT_ERROR: f32 = 0.02;
const MAX_DOT_PRODUCT_ERROR_LOWBIT: f32 = 0.04;

/// test-quantize-fns' size: 32 * 128.
const TEST_SIZE: usize = 32 * 128;

/// ggml's `generate_data`: 0.1 + amplitude * cos(i + offset).
fn generate_data(offset: f32, n: usize) -> Vec<f32> {
    (0..n).map(|i| (0.1 + (2.0f32 * (i as f32 + offset).cos()) as f64) as f32).collect()
}

/// ggml's `array_rmse` (which divides the root by n, not inside it).
fn array_rmse(a: &[f32], b: &[f32]) -> f32 {
    let sum: f64 = a.iter().zip(b).map(|(&x, &y)| ((x - y) as f64).powi(2)).sum();
    (sum.sqrt() as f32) / a.len() as f32
}

fn dot_f64(a: &[f32], b: &[f32]) -> f64 {
    a.iter().zip(b).map(|(&x, &y)| (x * y) as f64).sum()
}

fn supported() -> impl Iterator<Item = GgmlType> {
    ALL_TYPES.into_iter().filter(|t| t.is_supported())
}

fn quantize(ty: GgmlType, x: &[f32]) -> Vec<u8> {
    let mut q = vec![0u8; ty.row_size(x.len()).unwrap()];
    quantize_row(ty, x, &mut q).unwrap();
    q
}

fn activation(ty: GgmlType, x: &[f32]) -> Vec<u8> {
    let mut q = vec![0u8; ty.row_size(x.len()).unwrap()];
    quantize_activation(ty, x, &mut q).unwrap();
    q
}

fn dequantize(ty: GgmlType, q: &[u8], n: usize) -> Vec<f32> {
    let mut y = vec![0f32; n];
    dequantize_row(ty, q, &mut y).unwrap();
    y
}

#[test]
fn quantize_round_trip_within_ggml_thresholds() {
    let data = generate_data(0.0, TEST_SIZE);
    let mut report = Vec::new();
    for ty in supported() {
        let err = array_rmse(&data, &dequantize(ty, &quantize(ty, &data), TEST_SIZE));
        let max = match ty {
            GgmlType::Q2_K => MAX_QUANTIZATION_TOTAL_ERROR_2BITS,
            GgmlType::Q3_K => MAX_QUANTIZATION_TOTAL_ERROR_3BITS,
            _ => MAX_QUANTIZATION_TOTAL_ERROR,
        };
        assert!(err < max, "{ty}: quantization error {err} >= {max}");
        report.push(format!("{ty} {err:.6}"));
    }
    println!("round-trip errors: {}", report.join(", "));
}

#[test]
fn activation_quantizers_match_reference_within_ggml_threshold() {
    let data = generate_data(0.0, TEST_SIZE);
    for ty in [GgmlType::Q8_0, GgmlType::Q8_1, GgmlType::Q8_K, GgmlType::F16, GgmlType::BF16, GgmlType::F32] {
        let fast = dequantize(ty, &activation(ty, &data), TEST_SIZE);
        let reference = dequantize(ty, &quantize(ty, &data), TEST_SIZE);
        let err = array_rmse(&fast, &reference);
        assert!(err < MAX_QUANTIZATION_REFERENCE_ERROR, "{ty}: reference error {err}");
    }
}

#[test]
fn vec_dot_close_to_f32_dot_within_ggml_thresholds() {
    let x = generate_data(0.0, TEST_SIZE);
    let y = generate_data(1.0, TEST_SIZE);
    let want = dot_f64(&x, &y) as f32;
    let mut report = Vec::new();
    for ty in supported() {
        let w = quantize(ty, &x);
        let a = activation(ty.vec_dot_type(), &y);
        let got = vec_dot(ty, &w, &a, TEST_SIZE);
        let err = (got - want).abs() / TEST_SIZE as f32;
        let max = if ty == GgmlType::Q2_K { MAX_DOT_PRODUCT_ERROR_LOWBIT } else { MAX_DOT_PRODUCT_ERROR };
        assert!(err < max, "{ty}: dot product error {err} (got {got}, want {want})");
        report.push(format!("{ty} {err:.6}"));
    }
    println!("dot errors: {}", report.join(", "));
}

#[test]
fn vec_dot_f32_small_sizes() {
    for n in [1, 2, 3, 5, 7, 8, 15, 16, 17, 31, 33, 63, 67, 127, 129, 193, 255, 1023] {
        let (a, b) = (generate_data(0.0, n), generate_data(1.0, n));
        let want = dot_f64(&a, &b) as f32;
        let got = vec_dot(GgmlType::F32, &quantize(GgmlType::F32, &a), &quantize(GgmlType::F32, &b), n);
        assert!((got - want).abs() / (n as f32) < MAX_QUANTIZATION_REFERENCE_ERROR, "n={n}");
    }
}

/// vec_dot works on the quantized integers; it must agree with the plain dot product of
/// the two dequantized rows up to float rounding. (For Q8_1 activations the block sum s
/// is stored as f16, so the min term of Q4_1/Q5_1 carries that rounding too.)
#[test]
fn vec_dot_equals_dot_of_dequantized_rows() {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    for ty in supported() {
        for &blocks in &[1usize, 3, 8] {
            let n = ty.block_size().max(256) * blocks;
            let x: Vec<f32> = (0..n).map(|_| rng.normal(0.5)).collect();
            let y: Vec<f32> = (0..n).map(|_| rng.normal(3.0)).collect();
            let w = quantize(ty, &x);
            let at = ty.vec_dot_type();
            let a = activation(at, &y);
            let (wd, ad) = (dequantize(ty, &w, n), dequantize(at, &a, n));
            let want = dot_f64(&wd, &ad);
            let magnitude: f64 = wd.iter().zip(&ad).map(|(&p, &q)| (p * q).abs() as f64).sum();
            let mut tol = 2e-6 * magnitude + 1e-6;
            if at == GgmlType::Q8_1 {
                // |m| * |s| per block, s off by up to half an f16 ulp (2^-11 relative).
                let (ts, bs) = (ty.type_size(), ty.block_size());
                for (wb, yb) in w.chunks(ts).zip(ad.chunks(bs)) {
                    let m = half::f16::from_le_bytes([wb[2], wb[3]]).to_f32().abs() as f64;
                    tol += m * yb.iter().map(|v| v.abs() as f64).sum::<f64>() * 1e-3;
                }
            }
            let got = vec_dot(ty, &w, &a, n) as f64;
            assert!(
                (got - want).abs() <= tol,
                "{ty} n={n}: vec_dot {got} vs dequantized dot {want} (tol {tol})"
            );
        }
    }
}

/// ggml's x86 activation quantizer multiplies by 127/amax and rounds half to even;
/// the reference one multiplies by 1/d and rounds half away from zero.
#[test]
fn q8_activation_rounding_follows_ggml_x86() {
    let mut x = vec![0f32; 32];
    x[0] = 127.0;
    x[1] = 2.5;
    x[2] = -3.5;
    let fast = activation(GgmlType::Q8_0, &x);
    let reference = quantize(GgmlType::Q8_0, &x);
    assert_eq!((fast[3] as i8, fast[4] as i8), (2, -4));
    assert_eq!((reference[3] as i8, reference[4] as i8), (3, -4));

    let q81 = activation(GgmlType::Q8_1, &x);
    let d = half::f16::from_le_bytes([q81[0], q81[1]]).to_f32();
    let s = half::f16::from_le_bytes([q81[2], q81[3]]).to_f32();
    assert_eq!(d, 1.0);
    assert_eq!(s, 127.0 + 2.0 - 4.0);
}

#[test]
fn bad_lengths_are_errors_and_odd_input_does_not_panic() {
    let mut out = vec![0f32; 32];
    assert!(dequantize_row(GgmlType::Q4_0, &[0u8; 17], &mut out).is_err());
    assert!(dequantize_row(GgmlType::Q4_K, &[0u8; 18], &mut out).is_err());
    assert!(dequantize_row(GgmlType::IQ2_XXS, &[0u8; 66], &mut vec![0f32; 256]).is_err());
    assert!(quantize_row(GgmlType::Q4_0, &out[..31], &mut [0u8; 18]).is_err());
    assert!(quantize_activation(GgmlType::Q4_0, &out, &mut [0u8; 18]).is_err());
    assert!(!GgmlType::IQ2_XXS.is_supported() && !GgmlType::TQ1_0.is_supported());

    // Arbitrary bytes (NaN/inf scales included) must dequantize and dot without panicking.
    let mut rng = Rng(42);
    for ty in supported() {
        let n = 512;
        let w: Vec<u8> = (0..ty.row_size(n).unwrap()).map(|_| rng.next() as u8).collect();
        let a: Vec<u8> = (0..ty.vec_dot_type().row_size(n).unwrap()).map(|_| rng.next() as u8).collect();
        let mut y = vec![0f32; n];
        dequantize_row(ty, &w, &mut y).unwrap();
        let _ = vec_dot(ty, &w, &a, n);
        let mut q = vec![0u8; ty.row_size(n).unwrap()];
        let junk: Vec<f32> = (0..n).map(|_| f32::from_bits(rng.next() as u32)).collect();
        quantize_row(ty, &junk, &mut q).unwrap();
    }
}
