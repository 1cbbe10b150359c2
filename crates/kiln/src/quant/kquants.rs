//! The 256-element "k-quant" super-block formats and the activation format Q8_K:
//! dequantization and ggml's generic dot products. (The quantizers are in `kquants_ref`.)
//!
//! Layouts (little-endian, packed):
//! - Q2_K (84 B): `scales: [u8; 16]` (low nibble scale, high nibble min), `qs: [u8; 64]`,
//!   `d: f16, dmin: f16`.
//! - Q3_K (110 B): `hmask: [u8; 32], qs: [u8; 64], scales: [u8; 12]` (16 6-bit scales),
//!   `d: f16`.
//! - Q4_K (144 B): `d: f16, dmin: f16, scales: [u8; 12]` (8 6-bit scales and mins),
//!   `qs: [u8; 128]`.
//! - Q5_K (176 B): like Q4_K with `qh: [u8; 32]` before `qs`.
//! - Q6_K (210 B): `ql: [u8; 128], qh: [u8; 64], scales: [i8; 16], d: f16`.
//! - Q8_K (292 B): `d: f32, qs: [i8; 256], bsums: [i16; 16]` (sums of 16 quants each).

use super::f16_at;

pub(super) const QK_K: usize = 256;

/// Scale and min `j` (0..8) of a Q4_K/Q5_K block's 12 packed bytes (`get_scale_min_k4`).
#[inline]
pub(super) fn scale_min_k4(j: usize, q: &[u8]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        ((q[j + 4] & 0xf) | ((q[j - 4] >> 6) << 4), (q[j + 4] >> 4) | ((q[j] >> 6) << 4))
    }
}

/// The 16 signed 6-bit scales of a Q3_K block (before subtracting 32).
#[inline]
pub(super) fn q3k_scales(s: &[u8]) -> [i8; 16] {
    let mut out = [0i8; 16];
    for (j, o) in out.iter_mut().enumerate() {
        let lo = if j < 8 { s[j] & 0xf } else { s[j - 8] >> 4 };
        let hi = (s[8 + j % 4] >> (2 * (j / 4))) & 3;
        *o = (lo | (hi << 4)) as i8;
    }
    out
}

// ---------------------------------------------------------------- dequantize

pub(super) fn dequantize_q2_k(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(84).zip(dst.chunks_exact_mut(QK_K)) {
        let (scales, qs) = (&b[0..16], &b[16..80]);
        let (d, min) = (f16_at(b, 80), f16_at(b, 82));
        let mut out = y.iter_mut();
        let mut is = 0;
        for q in qs.chunks_exact(32) {
            for shift in [0, 2, 4, 6] {
                for half in [&q[..16], &q[16..]] {
                    let sc = scales[is];
                    is += 1;
                    let (dl, ml) = (d * (sc & 0xf) as f32, min * (sc >> 4) as f32);
                    for (&v, o) in half.iter().zip(out.by_ref()) {
                        *o = dl * ((v >> shift) & 3) as f32 - ml;
                    }
                }
            }
        }
    }
}

pub(super) fn dequantize_q3_k(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(110).zip(dst.chunks_exact_mut(QK_K)) {
        let (hm, qs) = (&b[0..32], &b[32..96]);
        let scales = q3k_scales(&b[96..108]);
        let d_all = f16_at(b, 108);
        let mut out = y.iter_mut();
        let mut is = 0;
        let mut m = 1u8;
        for q in qs.chunks_exact(32) {
            for shift in [0, 2, 4, 6] {
                for h in [0, 16] {
                    let dl = d_all * (scales[is] as i32 - 32) as f32;
                    is += 1;
                    for (l, o) in (h..h + 16).zip(out.by_ref()) {
                        let v = ((q[l] >> shift) & 3) as i32 - if hm[l] & m != 0 { 0 } else { 4 };
                        *o = dl * v as f32;
                    }
                }
                m <<= 1;
            }
        }
    }
}

pub(super) fn dequantize_q4_k(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(144).zip(dst.chunks_exact_mut(QK_K)) {
        let (d, min) = (f16_at(b, 0), f16_at(b, 2));
        let scales = &b[4..16];
        for (k, (q, y)) in b[16..].chunks_exact(32).zip(y.chunks_exact_mut(64)).enumerate() {
            let (sc1, m1) = scale_min_k4(2 * k, scales);
            let (sc2, m2) = scale_min_k4(2 * k + 1, scales);
            let (d1, m1) = (d * sc1 as f32, min * m1 as f32);
            let (d2, m2) = (d * sc2 as f32, min * m2 as f32);
            for l in 0..32 {
                y[l] = d1 * (q[l] & 0xf) as f32 - m1;
                y[l + 32] = d2 * (q[l] >> 4) as f32 - m2;
            }
        }
    }
}

pub(super) fn dequantize_q5_k(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(176).zip(dst.chunks_exact_mut(QK_K)) {
        let (d, min) = (f16_at(b, 0), f16_at(b, 2));
        let (scales, qh) = (&b[4..16], &b[16..48]);
        for (k, (ql, y)) in b[48..].chunks_exact(32).zip(y.chunks_exact_mut(64)).enumerate() {
            let (sc1, m1) = scale_min_k4(2 * k, scales);
            let (sc2, m2) = scale_min_k4(2 * k + 1, scales);
            let (d1, m1) = (d * sc1 as f32, min * m1 as f32);
            let (d2, m2) = (d * sc2 as f32, min * m2 as f32);
            let (u1, u2) = (1u8 << (2 * k), 2u8 << (2 * k));
            for l in 0..32 {
                let h1 = if qh[l] & u1 != 0 { 16 } else { 0 };
                let h2 = if qh[l] & u2 != 0 { 16 } else { 0 };
                y[l] = d1 * ((ql[l] & 0xf) + h1) as f32 - m1;
                y[l + 32] = d2 * ((ql[l] >> 4) + h2) as f32 - m2;
            }
        }
    }
}

/// The 256 signed 6-bit quants of a Q6_K block, in element order.
#[inline]
fn q6k_quants(ql: &[u8], qh: &[u8]) -> [i8; QK_K] {
    let mut a = [0i8; QK_K];
    for (a, (ql, qh)) in a.chunks_exact_mut(128).zip(ql.chunks_exact(64).zip(qh.chunks_exact(32))) {
        for l in 0..32 {
            a[l] = ((ql[l] & 0xf) | ((qh[l] & 3) << 4)) as i8 - 32;
            a[l + 32] = ((ql[l + 32] & 0xf) | (((qh[l] >> 2) & 3) << 4)) as i8 - 32;
            a[l + 64] = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i8 - 32;
            a[l + 96] = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i8 - 32;
        }
    }
    a
}

pub(super) fn dequantize_q6_k(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(210).zip(dst.chunks_exact_mut(QK_K)) {
        let q = q6k_quants(&b[0..128], &b[128..192]);
        let d = f16_at(b, 208);
        for (j, (y, q)) in y.chunks_exact_mut(16).zip(q.chunks_exact(16)).enumerate() {
            let dl = d * b[192 + j] as i8 as f32;
            for (y, &q) in y.iter_mut().zip(q) {
                *y = dl * q as f32;
            }
        }
    }
}

#[inline]
pub(super) fn q8k_d(b: &[u8]) -> f32 {
    f32::from_le_bytes([b[0], b[1], b[2], b[3]])
}

#[inline]
pub(super) fn q8k_bsum(b: &[u8], j: usize) -> i32 {
    i16::from_le_bytes([b[260 + 2 * j], b[261 + 2 * j]]) as i32
}

pub(super) fn dequantize_q8_k(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(292).zip(dst.chunks_exact_mut(QK_K)) {
        let d = q8k_d(b);
        for (y, &q) in y.iter_mut().zip(&b[4..260]) {
            *y = d * q as i8 as f32;
        }
    }
}

// ---------------------------------------------------------------- dot products

/// Adds `scale * q8[i] * a[i]` into eight lanes by `i % 8`, as ggml's generic k-quant dots
/// do, so the final float sums happen in the same order.
#[inline]
fn lanes_add(aux32: &mut [i32; 8], scale: i32, q8: &[u8], a: &[i8]) {
    for (q8, a) in q8.chunks_exact(8).zip(a.chunks_exact(8)) {
        for l in 0..8 {
            aux32[l] += scale * (q8[l] as i8 as i32 * a[l] as i32);
        }
    }
}

/// `ggml_vec_dot_q2_K_q8_K_generic`.
pub(super) fn dot_q2_k_q8_k(w: &[u8], a: &[u8], _n: usize) -> f32 {
    let mut sumf = 0f32;
    for (x, y) in w.chunks_exact(84).zip(a.chunks_exact(292)) {
        let (sc, q2) = (&x[0..16], &x[16..80]);
        let q8 = &y[4..260];
        let summs: i32 = (0..16).map(|j| q8k_bsum(y, j) * (sc[j] >> 4) as i32).sum();
        let dall = q8k_d(y) * f16_at(x, 80);
        let dmin = q8k_d(y) * f16_at(x, 82);
        let mut isum = 0i32;
        let mut is = 0;
        for (k, q2) in q2.chunks_exact(32).enumerate() {
            for (j, shift) in [0, 2, 4, 6].into_iter().enumerate() {
                let q8 = &q8[128 * k + 32 * j..128 * k + 32 * j + 32];
                for h in [0, 16] {
                    let d = (sc[is] & 0xf) as i32;
                    is += 1;
                    let s: i32 =
                        (h..h + 16).map(|l| q8[l] as i8 as i32 * ((q2[l] >> shift) & 3) as i32).sum();
                    isum += d * s;
                }
            }
        }
        sumf += dall * isum as f32 - dmin * summs as f32;
    }
    sumf
}

/// `ggml_vec_dot_q3_K_q8_K_generic`.
pub(super) fn dot_q3_k_q8_k(w: &[u8], a: &[u8], _n: usize) -> f32 {
    let mut sums = [0f32; 8];
    for (x, y) in w.chunks_exact(110).zip(a.chunks_exact(292)) {
        let (hm, q3) = (&x[0..32], &x[32..96]);
        let mut aux8 = [0i8; QK_K];
        let mut m = 1u8;
        for (k, q3) in q3.chunks_exact(32).enumerate() {
            for (j, shift) in [0, 2, 4, 6].into_iter().enumerate() {
                let a = &mut aux8[128 * k + 32 * j..128 * k + 32 * j + 32];
                for l in 0..32 {
                    a[l] = ((q3[l] >> shift) & 3) as i8 - if hm[l] & m != 0 { 0 } else { 4 };
                }
                m <<= 1;
            }
        }
        let scales = q3k_scales(&x[96..108]);
        let mut aux32 = [0i32; 8];
        for (j, (q8, a)) in y[4..260].chunks_exact(16).zip(aux8.chunks_exact(16)).enumerate() {
            lanes_add(&mut aux32, scales[j] as i32 - 32, q8, a);
        }
        let d = f16_at(x, 108) * q8k_d(y);
        for l in 0..8 {
            sums[l] += d * aux32[l] as f32;
        }
    }
    sums.iter().fold(0f32, |s, &v| s + v)
}

/// Q4_K/Q5_K scales and mins unpacked into two arrays of 8.
#[inline]
fn k4_scales_mins(s: &[u8]) -> ([u8; 8], [u8; 8]) {
    let (mut sc, mut mn) = ([0u8; 8], [0u8; 8]);
    for j in 0..8 {
        (sc[j], mn[j]) = scale_min_k4(j, s);
    }
    (sc, mn)
}

/// The common tail of the Q4_K and Q5_K generic dots: `a` holds the unsigned quants.
#[inline]
fn dot_k4_block(x: &[u8], y: &[u8], a: &[i8; QK_K], sums: &mut [f32; 8], sumf: &mut f32) {
    let (scales, mins) = k4_scales_mins(&x[4..16]);
    let sumi: i32 = (0..16).map(|j| q8k_bsum(y, j) * mins[j / 2] as i32).sum();
    let mut aux32 = [0i32; 8];
    for (j, (q8, a)) in y[4..260].chunks_exact(32).zip(a.chunks_exact(32)).enumerate() {
        lanes_add(&mut aux32, scales[j] as i32, q8, a);
    }
    let d = f16_at(x, 0) * q8k_d(y);
    for l in 0..8 {
        sums[l] += d * aux32[l] as f32;
    }
    let dmin = f16_at(x, 2) * q8k_d(y);
    *sumf -= dmin * sumi as f32;
}

/// `ggml_vec_dot_q4_K_q8_K_generic`.
pub(super) fn dot_q4_k_q8_k(w: &[u8], a: &[u8], _n: usize) -> f32 {
    let (mut sums, mut sumf) = ([0f32; 8], 0f32);
    for (x, y) in w.chunks_exact(144).zip(a.chunks_exact(292)) {
        let mut aux8 = [0i8; QK_K];
        for (q4, a) in x[16..144].chunks_exact(32).zip(aux8.chunks_exact_mut(64)) {
            for l in 0..32 {
                a[l] = (q4[l] & 0xf) as i8;
                a[l + 32] = (q4[l] >> 4) as i8;
            }
        }
        dot_k4_block(x, y, &aux8, &mut sums, &mut sumf);
    }
    sums.iter().fold(sumf, |s, &v| s + v)
}

/// `ggml_vec_dot_q5_K_q8_K_generic`.
pub(super) fn dot_q5_k_q8_k(w: &[u8], a: &[u8], _n: usize) -> f32 {
    let (mut sums, mut sumf) = ([0f32; 8], 0f32);
    for (x, y) in w.chunks_exact(176).zip(a.chunks_exact(292)) {
        let hm = &x[16..48];
        let mut aux8 = [0i8; QK_K];
        for (k, (q4, a)) in x[48..176].chunks_exact(32).zip(aux8.chunks_exact_mut(64)).enumerate() {
            let (m1, m2) = (1u8 << (2 * k), 2u8 << (2 * k));
            for l in 0..32 {
                a[l] = (q4[l] & 0xf) as i8 + if hm[l] & m1 != 0 { 16 } else { 0 };
                a[l + 32] = (q4[l] >> 4) as i8 + if hm[l] & m2 != 0 { 16 } else { 0 };
            }
        }
        dot_k4_block(x, y, &aux8, &mut sums, &mut sumf);
    }
    sums.iter().fold(sumf, |s, &v| s + v)
}

/// `ggml_vec_dot_q6_K_q8_K_generic`.
pub(super) fn dot_q6_k_q8_k(w: &[u8], a: &[u8], _n: usize) -> f32 {
    let mut sums = [0f32; 8];
    for (x, y) in w.chunks_exact(210).zip(a.chunks_exact(292)) {
        let aux8 = q6k_quants(&x[0..128], &x[128..192]);
        let mut aux32 = [0i32; 8];
        for (j, (q8, a)) in y[4..260].chunks_exact(16).zip(aux8.chunks_exact(16)).enumerate() {
            lanes_add(&mut aux32, x[192 + j] as i8 as i32, q8, a);
        }
        let d = f16_at(x, 208) * q8k_d(y);
        for l in 0..8 {
            sums[l] += d * aux32[l] as f32;
        }
    }
    sums.iter().fold(0f32, |s, &v| s + v)
}
