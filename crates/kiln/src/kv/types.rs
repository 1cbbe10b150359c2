//! What the KV cache stores: f16 values (the default), or rows quantized to one of the
//! 32-value block formats, as llama.cpp's `--cache-type-k/-v` do.
//!
//! A quantized cache holds each slot's row of `n_head_kv · head_dim` values as blocks of
//! 32 (never across heads: a quantized cache needs heads of a multiple of 32 values),
//! quantized as the row is stored, with ggml's CPU quantizer for the type. Attention reads
//! the blocks themselves: keys through the type's dot product with the query quantized to
//! its `vec_dot_type`, values dequantized a block of keys at a time.
//!
//! Before quantizing, K (and q with it) and V rows are rotated by an orthonormal
//! Walsh-Hadamard transform per group of head values ([`KvTypes::k_rotation`],
//! [`KvTypes::v_rotation`]), as llama.cpp does for quantized caches: q·k is unchanged, the
//! attention output is rotated back, and the rotation spreads outlying values over their
//! group, so a block's scale fits its values better.

use crate::error::{KilnError, Result};
use crate::quant::GgmlType;

/// The cache types llama.cpp's `-ctk`/`-ctv` take that kiln stores, with their names.
pub const CACHE_TYPES: [(&str, GgmlType); 7] = [
    ("f16", GgmlType::F16),
    ("q8_0", GgmlType::Q8_0),
    ("q5_1", GgmlType::Q5_1),
    ("q5_0", GgmlType::Q5_0),
    ("q4_1", GgmlType::Q4_1),
    ("q4_0", GgmlType::Q4_0),
    ("iq4_nl", GgmlType::IQ4_NL),
];

/// The cache type named `name` (llama.cpp's spelling: `q8_0`, ...; any case).
pub fn cache_type(name: &str) -> Result<GgmlType> {
    CACHE_TYPES.iter().find(|(n, _)| n.eq_ignore_ascii_case(name)).map(|&(_, t)| t).ok_or_else(|| {
        let names: Vec<&str> = CACHE_TYPES.iter().map(|(n, _)| *n).collect();
        KilnError::invalid(format!("unknown KV cache type {name:?} (expected one of {})", names.join(", ")))
    })
}

/// The name [`cache_type`] reads for `ty`.
pub fn cache_type_name(ty: GgmlType) -> &'static str {
    CACHE_TYPES.iter().find(|(_, t)| *t == ty).map_or("?", |(n, _)| n)
}

/// The storage of the K and the V cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KvTypes {
    pub k: GgmlType,
    pub v: GgmlType,
}

impl Default for KvTypes {
    fn default() -> Self {
        KvTypes { k: GgmlType::F16, v: GgmlType::F16 }
    }
}

impl KvTypes {
    /// Checks that both are cache types and that heads of `head_dim` values fit their blocks.
    pub fn check(&self, head_dim: usize) -> Result<()> {
        for (what, ty) in [("K", self.k), ("V", self.v)] {
            if !CACHE_TYPES.iter().any(|&(_, t)| t == ty) {
                return Err(KilnError::invalid(format!("{ty} is not a KV cache type")));
            }
            if !head_dim.is_multiple_of(ty.block_size()) {
                return Err(KilnError::invalid(format!(
                    "a {} {what} cache needs heads of a multiple of {} values; this model's have {head_dim}",
                    cache_type_name(ty),
                    ty.block_size()
                )));
            }
        }
        Ok(())
    }

    /// Bytes one token takes in the caches of `n_layer` layers of `kv_dim` values.
    pub fn bytes_per_token(&self, n_layer: usize, kv_dim: usize) -> usize {
        let row = |t: GgmlType| t.row_size(kv_dim).unwrap_or(2 * kv_dim);
        n_layer * (row(self.k) + row(self.v))
    }

    /// Values per Walsh-Hadamard group of K (and q) rows: for a quantized K with heads of a
    /// multiple of 64 values, the largest power of two from 64 up that divides the head
    /// (llama.cpp's choice); `None`: not rotated.
    pub fn k_rotation(&self, head_dim: usize) -> Option<usize> {
        if self.k == GgmlType::F16 || head_dim == 0 || !head_dim.is_multiple_of(64) {
            return None;
        }
        let mut n = 64;
        while head_dim.is_multiple_of(2 * n) {
            n *= 2;
        }
        Some(n)
    }

    /// Values per Walsh-Hadamard group of V rows and of the attention's output: 64 for a
    /// quantized V with heads of a multiple of 64 values; `None`: not rotated.
    pub fn v_rotation(&self, head_dim: usize) -> Option<usize> {
        (self.v != GgmlType::F16 && head_dim > 0 && head_dim.is_multiple_of(64)).then_some(64)
    }
}

/// The orthonormal Walsh-Hadamard transform of each group of `n` values of `x` (`n` a power
/// of two dividing `x.len()`), in ggml's arithmetic (`ggml_compute_forward_fwht`): the
/// values scaled by `1/sqrt(n)` first, then butterflies of growing span. Its own inverse
/// (up to rounding).
pub fn hadamard(x: &mut [f32], n: usize) {
    debug_assert!(n.is_power_of_two() && x.len().is_multiple_of(n));
    let scale = 1.0 / (n as f32).sqrt();
    for g in x.chunks_exact_mut(n) {
        g.iter_mut().for_each(|v| *v *= scale);
        let mut len = 1;
        while len < n {
            for i in (0..n).step_by(2 * len) {
                let (lo, hi) = g[i..i + 2 * len].split_at_mut(len);
                for (u, v) in lo.iter_mut().zip(hi) {
                    (*u, *v) = (*u + *v, *u - *v);
                }
            }
            len *= 2;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_unknown_names_fail() {
        for (name, ty) in CACHE_TYPES {
            assert_eq!(cache_type(name).unwrap(), ty);
            assert_eq!(cache_type(&name.to_uppercase()).unwrap(), ty);
            assert_eq!(cache_type_name(ty), name);
        }
        let e = cache_type("q3_k").unwrap_err().to_string();
        assert!(e.contains("unknown KV cache type \"q3_k\"") && e.contains("iq4_nl"), "{e}");
    }

    #[test]
    fn rotation_sizes_follow_llama_cpp() {
        let q = KvTypes { k: GgmlType::Q8_0, v: GgmlType::Q4_0 };
        assert_eq!(q.k_rotation(64), Some(64));
        assert_eq!(q.k_rotation(128), Some(128));
        assert_eq!(q.k_rotation(192), Some(64));
        assert_eq!(q.k_rotation(256), Some(256));
        assert_eq!(q.k_rotation(96), None);
        assert_eq!(q.v_rotation(256), Some(64));
        assert_eq!(KvTypes::default().k_rotation(128), None);
        assert_eq!(KvTypes::default().v_rotation(128), None);
        assert!(q.check(64).is_ok());
        assert!(q.check(48).unwrap_err().to_string().contains("multiple of 32"));
    }

    #[test]
    fn bytes_per_token() {
        let f16 = KvTypes::default().bytes_per_token(30, 192);
        let q8 = KvTypes { k: GgmlType::Q8_0, v: GgmlType::Q8_0 }.bytes_per_token(30, 192);
        assert_eq!(f16, 30 * 2 * 384);
        assert_eq!(q8 * 64, f16 * 34, "q8_0 takes 34/64 of f16");
    }

    /// Matches the matrix ggml builds (`ggml_gen_hadamard`, Sylvester's order) times the
    /// vector, and is its own inverse.
    #[test]
    fn hadamard_is_the_orthonormal_matrix() {
        for n in [64, 128] {
            let mut h = vec![0f32; n * n];
            h[0] = 1.0 / (n as f32).sqrt();
            let mut s = 1;
            while s < n {
                for i in 0..s {
                    for j in 0..s {
                        let v = h[i * n + j];
                        h[(i + s) * n + j] = v;
                        h[i * n + j + s] = v;
                        h[(i + s) * n + j + s] = -v;
                    }
                }
                s *= 2;
            }
            let x: Vec<f32> = (0..2 * n).map(|i| ((i * 37 % 101) as f32 - 50.0) / 7.0).collect();
            let mut y = x.clone();
            hadamard(&mut y, n);
            for (g, yg) in x.chunks(n).zip(y.chunks(n)) {
                for (r, &yr) in yg.iter().enumerate() {
                    let want: f64 = (0..n).map(|c| h[r * n + c] as f64 * g[c] as f64).sum();
                    assert!((yr as f64 - want).abs() < 1e-4, "n {n} row {r}: {yr} vs {want}");
                }
            }
            hadamard(&mut y, n);
            for (a, b) in x.iter().zip(&y) {
                assert!((a - b).abs() < 1e-4);
            }
        }
    }
}
