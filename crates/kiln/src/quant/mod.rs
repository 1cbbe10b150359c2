//! GGML block formats: layouts, reference (scalar) dequantize/quantize, and dot products
//! of a weight row with an activation row quantized to the weight's `vec_dot_type`.
//!
//! The scalar code here is the truth every SIMD and GPU kernel is tested against.

mod types;

pub use types::{GgmlType, ALL_TYPES};

use crate::error::{KilnError, Result};

/// Dequantizes `dst.len()` elements from `src` (whole blocks of `ty`).
pub fn dequantize_row(ty: GgmlType, src: &[u8], dst: &mut [f32]) -> Result<()> {
    check_len(ty, src.len(), dst.len())?;
    match ty {
        GgmlType::F32 => {
            for (d, s) in dst.iter_mut().zip(src.chunks_exact(4)) {
                *d = f32::from_le_bytes([s[0], s[1], s[2], s[3]]);
            }
        }
        GgmlType::F16 => {
            for (d, s) in dst.iter_mut().zip(src.chunks_exact(2)) {
                *d = half::f16::from_le_bytes([s[0], s[1]]).to_f32();
            }
        }
        _ => return Err(KilnError::unsupported("tensor type", ty.name())),
    }
    Ok(())
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

// Temporary until the quant module lands (F32/F16 only).
pub fn quantize_activation(ty: GgmlType, src: &[f32], dst: &mut [u8]) -> Result<()> {
    match ty {
        GgmlType::F16 => {
            for (d, &s) in dst.chunks_exact_mut(2).zip(src) {
                d.copy_from_slice(&half::f16::from_f32(s).to_le_bytes());
            }
            Ok(())
        }
        _ => Err(KilnError::unsupported("activation type", ty.name())),
    }
}

pub type VecDotFn = fn(&[u8], &[u8], usize) -> f32;

pub fn vec_dot_fn(ty: GgmlType) -> VecDotFn {
    match ty {
        GgmlType::F16 => |w, a, n| {
            let mut wf = vec![0.0; n];
            let mut af = vec![0.0; n];
            dequantize_row(GgmlType::F16, w, &mut wf).unwrap();
            dequantize_row(GgmlType::F16, a, &mut af).unwrap();
            wf.iter().zip(&af).map(|(a, b)| a * b).sum()
        },
        _ => |_, _, _| f32::NAN,
    }
}

// Temporary until the quant module lands.
pub fn quantize_row(ty: GgmlType, src: &[f32], dst: &mut [u8]) -> Result<()> {
    match ty {
        GgmlType::F32 => {
            dst.copy_from_slice(bytemuck::cast_slice(src));
            Ok(())
        }
        _ => quantize_activation(ty, src, dst),
    }
}
