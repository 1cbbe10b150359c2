//! GGML block formats: layouts, reference (scalar) dequantize/quantize, and dot products
//! of a weight row with an activation row quantized to the weight's `vec_dot_type`.
//!
//! The scalar code here is the truth every SIMD and GPU kernel is tested against. Each
//! function mirrors the ggml routine it is named after, including the order of float
//! operations, so results match llama.cpp (gguf-py for dequantization) bit for bit where
//! the C code is deterministic.
//!
//! Families: `float` (F32, F16, BF16), `legacy` (the 32-element Q4_0..Q8_1 blocks),
//! `kquants` + `kquants_ref` (Q2_K..Q6_K, Q8_K), `iquants` (IQ4_NL, IQ4_XS), and `simd`:
//! the runtime-dispatched AVX2/AVX-512 dot products the engine's hot loops use via
//! [`vec_dot_fn`] (chosen once per type; `KILN_CPU=scalar|avx2|avx512|avx512vnni|amx` caps the tier).

mod f16_lanes;
mod float;
mod interleave;
mod iquants;
mod kquants;
mod kquants_ref;
mod legacy;
mod simd;
mod types;

pub use f16_lanes::{dot_f16_lanes, F16_LANES};
pub use interleave::{Interleave, Q4K_X8_BLOCK, Q4K_X8_ROWS};
pub use simd::{cpu_tier, detected_cpu_tier, vec_dot_f16, vec_dot_fn, vec_dot_fn_for, CpuTier};
#[cfg(target_arch = "x86_64")]
pub use simd::{
    f16_amx, f16_amx_for, f16_gemm, f16_gemm_for, q4_k_x8_amx, q4_k_x8_amx_for, q4_k_x8_kernels,
    q4_k_x8_kernels_for, tile_kernels, tile_kernels_for, x16_kernels, x16_kernels_for, F16Amx, F16Gemm,
    Q4kX8Amx, Q4kX8Kernels, TileKernels, X16Kernels, TILE,
};
pub use types::{GgmlType, ALL_TYPES};

use crate::error::{KilnError, Result};

/// A dot product of `n` elements of a weight row and an activation row, both as raw blocks.
pub type VecDotFn = fn(&[u8], &[u8], usize) -> f32;

/// Dequantizes `dst.len()` elements from `src` (whole blocks of `ty`).
/// Err if lengths mismatch or the type is unsupported.
pub fn dequantize_row(ty: GgmlType, src: &[u8], dst: &mut [f32]) -> Result<()> {
    let f = dequantizer(ty)?;
    check_len(ty, src.len(), dst.len())?;
    f(src, dst);
    Ok(())
}

/// Whole blocks of one type to f32 (`dst.len()` values; the blocks past those ignored).
pub type DequantizeFn = fn(&[u8], &mut [f32]);

/// `ty`'s dequantizer on this CPU (a SIMD one where kiln has it: exact, the scalar
/// reference's bits), for callers that dequantize many short rows; unlike
/// [`dequantize_row`] it checks no lengths. Err if the type is unsupported.
pub fn dequantizer(ty: GgmlType) -> Result<DequantizeFn> {
    use GgmlType::*;
    let f: DequantizeFn = match ty {
        F32 => float::dequantize_f32,
        F16 => float::dequantize_f16,
        BF16 => float::dequantize_bf16,
        Q4_0 => legacy::dequantize_q4_0,
        Q4_1 => legacy::dequantize_q4_1,
        Q5_0 => legacy::dequantize_q5_0,
        Q5_1 => legacy::dequantize_q5_1,
        Q8_0 => legacy::dequantize_q8_0,
        Q8_1 => legacy::dequantize_q8_1,
        Q2_K => kquants::dequantize_q2_k,
        Q3_K => kquants::dequantize_q3_k,
        Q4_K => kquants::dequantize_q4_k,
        Q5_K => kquants::dequantize_q5_k,
        Q6_K => kquants::dequantize_q6_k,
        Q8_K => kquants::dequantize_q8_k,
        IQ4_NL => iquants::dequantize_iq4_nl,
        IQ4_XS => iquants::dequantize_iq4_xs,
        _ => return Err(KilnError::unsupported("tensor type", ty.name())),
    };
    Ok(simd::simd_dequantize(ty).unwrap_or(f))
}

/// Reference quantizer (ggml's `quantize_row_*_ref` semantics) for every supported type.
pub fn quantize_row(ty: GgmlType, src: &[f32], dst: &mut [u8]) -> Result<()> {
    use GgmlType::*;
    let f: fn(&[f32], &mut [u8]) = match ty {
        F32 => float::quantize_f32,
        F16 => float::quantize_f16,
        BF16 => float::quantize_bf16,
        Q4_0 => legacy::quantize_q4_0,
        Q4_1 => legacy::quantize_q4_1,
        Q5_0 => legacy::quantize_q5_0,
        Q5_1 => legacy::quantize_q5_1,
        Q8_0 => legacy::quantize_q8_0,
        Q8_1 => legacy::quantize_q8_1,
        Q2_K => kquants_ref::quantize_q2_k,
        Q3_K => kquants_ref::quantize_q3_k,
        Q4_K => kquants_ref::quantize_q4_k,
        Q5_K => kquants_ref::quantize_q5_k,
        Q6_K => kquants_ref::quantize_q6_k,
        Q8_K => kquants_ref::quantize_q8_k,
        IQ4_NL => iquants::quantize_iq4_nl,
        IQ4_XS => iquants::quantize_iq4_xs,
        _ => return Err(KilnError::unsupported("quantization type", ty.name())),
    };
    check_len(ty, dst.len(), src.len())?;
    f(src, dst);
    Ok(())
}

/// Quantizes an activation row to `ty` (Q8_0, Q8_1, Q8_K, F16, BF16, F32) exactly as ggml's
/// x86 CPU backend does before a matmul: its AVX2 `quantize_row_q8_0`/`q8_1` multiply by
/// 127/amax and round half to even, and q8_1 stores s = d * sum(qs); Q8_K uses the
/// reference quantizer. This decides near-ties like llama.cpp.
pub fn quantize_activation(ty: GgmlType, src: &[f32], dst: &mut [u8]) -> Result<()> {
    use GgmlType::*;
    let f: fn(&[f32], &mut [u8]) = match ty {
        F32 => float::quantize_f32,
        F16 => float::quantize_f16,
        BF16 => float::quantize_bf16,
        Q8_0 => legacy::quantize_q8_0_act,
        Q8_1 => legacy::quantize_q8_1_act,
        Q8_K => kquants_ref::quantize_q8_k,
        _ => return Err(KilnError::unsupported("activation type", ty.name())),
    };
    check_len(ty, dst.len(), src.len())?;
    simd::simd_quantize_activation(ty).unwrap_or(f)(src, dst);
    Ok(())
}

/// An activation row rounded to F16 as [`quantize_activation`] does for F16 weights, then
/// widened back: `dst` holds `src.len()` native-endian f32 (the rows the F16 matmul tiles
/// read, so each matmul converts its activations once, not once per weight row).
pub fn round_f16_rows(src: &[f32], dst: &mut [u8]) {
    const C: usize = 64;
    let round = simd::simd_round_f16();
    let mut wide = [0f32; C];
    // Through an f32 buffer: `dst` need not be aligned for f32.
    for (s, d) in src.chunks(C).zip(dst.chunks_mut(4 * C)) {
        let wide = &mut wide[..s.len()];
        match round {
            Some(f) => f(s, wide),
            None => wide.iter_mut().zip(s).for_each(|(w, &v)| *w = half::f16::from_f32(v).to_f32()),
        }
        d.copy_from_slice(bytemuck::cast_slice(wide));
    }
}

/// Dot product of `n` elements: a weight row `w` of type `ty` with an activation row `a`
/// already quantized to `ty.vec_dot_type()`. Scalar reference mirroring ggml's generic
/// (scalar) vec_dot formulas for each pair (bit-exact with ggml's `*_generic` functions).
/// This is the reference; hot loops should call [`vec_dot_fn`]'s SIMD version instead.
/// Mis-sized input is a bug (debug-asserted);
/// in release it reads only whole blocks present in both rows. Unsupported types give NaN.
pub fn vec_dot(ty: GgmlType, w: &[u8], a: &[u8], n: usize) -> f32 {
    debug_assert_eq!(ty.row_size(n).ok(), Some(w.len()), "{ty} weight row of {n}");
    debug_assert_eq!(ty.vec_dot_type().row_size(n).ok(), Some(a.len()), "{ty} activation row of {n}");
    scalar_vec_dot_fn(ty)(w, a, n)
}

/// The scalar reference dot product for weights of type `ty` (see [`vec_dot`]), as a plain
/// function pointer the hot loop can call without matching on the type each time.
pub fn scalar_vec_dot_fn(ty: GgmlType) -> VecDotFn {
    use GgmlType::*;
    match ty {
        F32 => float::dot_f32,
        F16 => float::dot_f16,
        BF16 => float::dot_bf16,
        Q4_0 => legacy::dot_q4_0_q8_0,
        Q4_1 => legacy::dot_q4_1_q8_1,
        Q5_0 => legacy::dot_q5_0_q8_0,
        Q5_1 => legacy::dot_q5_1_q8_1,
        Q8_0 => legacy::dot_q8_0_q8_0,
        Q2_K => kquants::dot_q2_k_q8_k,
        Q3_K => kquants::dot_q3_k_q8_k,
        Q4_K => kquants::dot_q4_k_q8_k,
        Q5_K => kquants::dot_q5_k_q8_k,
        Q6_K => kquants::dot_q6_k_q8_k,
        IQ4_NL => iquants::dot_iq4_nl_q8_0,
        IQ4_XS => iquants::dot_iq4_xs_q8_k,
        Q8_1 => |w, a, n| dot_dequantized(Q8_1, w, a, n),
        Q8_K => |w, a, n| dot_dequantized(Q8_K, w, a, n),
        _ => |_, _, _| f32::NAN,
    }
}

/// For formats ggml only uses for activations (Q8_1, Q8_K), which have no vec_dot of their
/// own: dequantize block by block and dot with an F32 row (their `vec_dot_type`).
fn dot_dequantized(ty: GgmlType, w: &[u8], a: &[u8], _n: usize) -> f32 {
    let mut buf = [0f32; 256];
    let (bs, ts) = (ty.block_size(), ty.type_size());
    let mut sum = 0f64;
    for (wb, ab) in w.chunks_exact(ts).zip(a.chunks_exact(4 * bs)) {
        let buf = &mut buf[..bs];
        if dequantize_row(ty, wb, buf).is_err() {
            return f32::NAN;
        }
        for (x, y) in buf.iter().zip(ab.chunks_exact(4)) {
            sum += (x * f32::from_le_bytes([y[0], y[1], y[2], y[3]])) as f64;
        }
    }
    sum as f32
}

fn check_len(ty: GgmlType, bytes: usize, n: usize) -> Result<()> {
    let want = ty.row_size(n)?;
    if bytes != want {
        return Err(KilnError::invalid(format!(
            "{}: {n} elements need {want} bytes, got {bytes}",
            ty.name()
        )));
    }
    Ok(())
}

// ---------------------------------------------------------------- shared helpers

/// The little-endian f16 at byte `off`, widened exactly.
#[inline(always)]
pub(crate) fn f16_at(b: &[u8], off: usize) -> f32 {
    float::f16_to_f32(u16::from_le_bytes([b[off], b[off + 1]]))
}

/// Stores `x` as a little-endian f16 (round to nearest even) at byte `off`.
#[inline(always)]
fn put_f16(b: &mut [u8], off: usize, x: f32) {
    b[off..off + 2].copy_from_slice(&half::f16::from_f32(x).to_le_bytes());
}

/// The element of largest magnitude (the first one on ties), with its sign.
fn signed_absmax(x: &[f32]) -> f32 {
    let (mut amax, mut max) = (0f32, 0f32);
    for &v in x {
        if amax < v.abs() {
            amax = v.abs();
            max = v;
        }
    }
    max
}

/// ggml's `nearest_int`: round half to even via the 1.5 * 2^23 trick (exact for
/// |x| < 2^22, which the callers guarantee; garbage-in stays garbage-out without panics).
#[inline(always)]
fn nearest_int(x: f32) -> i32 {
    let v = x + 12582912.0;
    (v.to_bits() & 0x007f_ffff) as i32 - 0x0040_0000
}
