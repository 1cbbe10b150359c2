//! Rows in and out of the CPU's KV caches, whatever they store: f16 (K in tiles,
//! `kv_buf.rs`) or blocks of a quantized type, rows rotated first where the cache says
//! (`crate::kv::types`). ggml quantizes a row stored into a cache with its CPU `from_float`
//! for the type: Q8_0's x86 quantizer (the one activations go through), the reference
//! quantizers of the others.

use half::f16;

use super::attention::{Blocks, Cache};
use super::kv_buf::{k_index, KvBuf};
use crate::kv::hadamard;
use crate::quant::{self, GgmlType};

/// The cache as the attention reads it.
pub fn cache(buf: &KvBuf) -> Cache<'_> {
    match buf.ty() {
        GgmlType::F16 => Cache::F16(buf),
        ty => Cache::Blocks(Blocks { data: buf.bytes(), ty, rot: buf.rot() }),
    }
}

/// Quantizes one row (whole blocks) as ggml stores it into a cache of `ty`.
pub fn quantize(ty: GgmlType, src: &[f32], dst: &mut [u8]) {
    let r = match ty {
        GgmlType::Q8_0 => quant::quantize_activation(ty, src, dst),
        _ => quant::quantize_row(ty, src, dst),
    };
    r.expect("a cache row of whole blocks");
}

/// Writes row `i` of `x` (`dim` values each) to slot `slots[i]`; `tiled`: an f16 cache
/// lays its slots out in K tiles.
pub fn store(buf: &mut KvBuf, tiled: bool, x: &[f32], slots: &[u32], dim: usize) {
    let ty = buf.ty();
    if ty == GgmlType::F16 {
        let n_slots = buf.len() / dim.max(1);
        for (i, &s) in slots.iter().enumerate() {
            let (s, row) = (s as usize, &x[i * dim..(i + 1) * dim]);
            if tiled {
                row.iter()
                    .enumerate()
                    .for_each(|(j, &v)| buf[k_index(s, j, dim, n_slots)] = f16::from_f32(v));
            } else {
                buf[s * dim..(s + 1) * dim].iter_mut().zip(row).for_each(|(d, &v)| *d = f16::from_f32(v));
            }
        }
        return;
    }
    let bytes = ty.row_size(dim).expect("checked at allocation");
    let rot = buf.rot();
    let mut tmp = vec![0f32; dim];
    for (i, &s) in slots.iter().enumerate() {
        tmp.copy_from_slice(&x[i * dim..(i + 1) * dim]);
        if let Some(n) = rot {
            hadamard(&mut tmp, n);
        }
        let s = s as usize;
        quantize(ty, &tmp, &mut buf.bytes_mut()[s * bytes..(s + 1) * bytes]);
    }
}

/// Reads slot `slot`'s row (`out.len()` values), dequantized and rotated back.
pub fn load(buf: &KvBuf, tiled: bool, slot: usize, out: &mut [f32]) {
    let (ty, dim) = (buf.ty(), out.len());
    if ty == GgmlType::F16 {
        let n_slots = buf.len() / dim.max(1);
        for (j, o) in out.iter_mut().enumerate() {
            let at = if tiled { k_index(slot, j, dim, n_slots) } else { slot * dim + j };
            *o = buf[at].to_f32();
        }
        return;
    }
    let bytes = ty.row_size(dim).expect("checked at allocation");
    quant::dequantize_row(ty, &buf.bytes()[slot * bytes..(slot + 1) * bytes], out).expect("whole blocks");
    if let Some(n) = buf.rot() {
        hadamard(out, n);
    }
}

/// Copies slot `src`'s row to slot `dst` (rows stored as they are, not tiled: V).
pub fn copy(buf: &mut KvBuf, src: usize, dst: usize, dim: usize) {
    let bytes = buf.ty().row_size(dim).expect("checked at allocation");
    buf.bytes_mut().copy_within(src * bytes..(src + 1) * bytes, dst * bytes);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A stored row loads back as itself (f16: rounded; quantized: within the type's error,
    /// rotation undone), in either layout.
    #[test]
    fn rows_load_back() {
        let dim = 128;
        let row: Vec<f32> = (0..dim).map(|i| ((i * 29 % 97) as f32 - 48.0) / 11.0).collect();
        for (ty, rot, tol) in [
            (GgmlType::F16, None, 0.01),
            (GgmlType::Q8_0, None, 0.05),
            (GgmlType::Q8_0, Some(64), 0.1),
            (GgmlType::Q4_0, Some(128), 0.8),
            (GgmlType::IQ4_NL, None, 0.8),
        ] {
            for tiled in [true, false] {
                let mut buf = KvBuf::typed(40, dim, ty, rot).unwrap();
                store(&mut buf, tiled, &row, &[33], dim);
                let mut out = vec![0f32; dim];
                load(&buf, tiled, 33, &mut out);
                let err = row.iter().zip(&out).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
                assert!(err <= tol, "{ty} rot {rot:?}: error {err}");
                if !tiled {
                    copy(&mut buf, 33, 2, dim);
                    let mut again = vec![0f32; dim];
                    load(&buf, tiled, 2, &mut again);
                    assert_eq!(again, out);
                }
            }
        }
    }
}
