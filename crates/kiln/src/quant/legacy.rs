//! The 32-element block formats: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 and the activation format
//! Q8_1. Layouts (little-endian, packed):
//!
//! - Q4_0 (18 B): `d: f16, qs: [u8; 16]` — x = d * (q - 8); low nibbles hold elements 0..16,
//!   high nibbles 16..32.
//! - Q4_1 (20 B): `d: f16, m: f16, qs: [u8; 16]` — x = d * q + m.
//! - Q5_0 (22 B): `d: f16, qh: u32, qs: [u8; 16]` — bit j of qh is bit 4 of element j.
//! - Q5_1 (24 B): `d: f16, m: f16, qh: u32, qs: [u8; 16]`.
//! - Q8_0 (34 B): `d: f16, qs: [i8; 32]`.
//! - Q8_1 (36 B): `d: f16, s: f16, qs: [i8; 32]` — s = d * sum(qs), used for the min term.

use super::{f16_at, put_f16, signed_absmax};

const QK: usize = 32;

// ---------------------------------------------------------------- dequantize

pub(super) fn dequantize_q4_0(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(18).zip(dst.chunks_exact_mut(QK)) {
        let d = f16_at(b, 0);
        for (j, &q) in b[2..18].iter().enumerate() {
            y[j] = ((q & 0x0f) as i32 - 8) as f32 * d;
            y[j + 16] = ((q >> 4) as i32 - 8) as f32 * d;
        }
    }
}

pub(super) fn dequantize_q4_1(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(20).zip(dst.chunks_exact_mut(QK)) {
        let (d, m) = (f16_at(b, 0), f16_at(b, 2));
        for (j, &q) in b[4..20].iter().enumerate() {
            y[j] = (q & 0x0f) as f32 * d + m;
            y[j + 16] = (q >> 4) as f32 * d + m;
        }
    }
}

pub(super) fn dequantize_q5_0(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(22).zip(dst.chunks_exact_mut(QK)) {
        let d = f16_at(b, 0);
        let qh = u32::from_le_bytes([b[2], b[3], b[4], b[5]]);
        for (j, &q) in b[6..22].iter().enumerate() {
            let h0 = ((qh >> j) << 4) & 0x10;
            let h1 = (qh >> (j + 12)) & 0x10;
            y[j] = (((q & 0x0f) as u32 | h0) as i32 - 16) as f32 * d;
            y[j + 16] = (((q >> 4) as u32 | h1) as i32 - 16) as f32 * d;
        }
    }
}

pub(super) fn dequantize_q5_1(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(24).zip(dst.chunks_exact_mut(QK)) {
        let (d, m) = (f16_at(b, 0), f16_at(b, 2));
        let qh = u32::from_le_bytes([b[4], b[5], b[6], b[7]]);
        for (j, &q) in b[8..24].iter().enumerate() {
            let h0 = ((qh >> j) << 4) & 0x10;
            let h1 = (qh >> (j + 12)) & 0x10;
            y[j] = ((q & 0x0f) as u32 | h0) as f32 * d + m;
            y[j + 16] = ((q >> 4) as u32 | h1) as f32 * d + m;
        }
    }
}

pub(super) fn dequantize_q8_0(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(34).zip(dst.chunks_exact_mut(QK)) {
        let d = f16_at(b, 0);
        for (y, &q) in y.iter_mut().zip(&b[2..34]) {
            *y = q as i8 as f32 * d;
        }
    }
}

/// ggml has no `to_float` for Q8_1; this is the obvious d * q (s is redundant).
pub(super) fn dequantize_q8_1(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(36).zip(dst.chunks_exact_mut(QK)) {
        let d = f16_at(b, 0);
        for (y, &q) in y.iter_mut().zip(&b[4..36]) {
            *y = q as i8 as f32 * d;
        }
    }
}

// ---------------------------------------------------------------- reference quantizers

fn min_max(x: &[f32]) -> (f32, f32) {
    let (mut min, mut max) = (f32::MAX, -f32::MAX);
    for &v in x {
        if v < min {
            min = v;
        }
        if v > max {
            max = v;
        }
    }
    (min, max)
}

pub(super) fn quantize_q4_0(src: &[f32], dst: &mut [u8]) {
    for (x, b) in src.chunks_exact(QK).zip(dst.chunks_exact_mut(18)) {
        let d = signed_absmax(x) / -8.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        put_f16(b, 0, d);
        for j in 0..16 {
            // C's `(int8_t)(v + 8.5f)` truncates toward zero.
            let q0 = ((x[j] * id + 8.5) as i8).min(15) as u8;
            let q1 = ((x[j + 16] * id + 8.5) as i8).min(15) as u8;
            b[2 + j] = q0 | (q1 << 4);
        }
    }
}

pub(super) fn quantize_q4_1(src: &[f32], dst: &mut [u8]) {
    for (x, b) in src.chunks_exact(QK).zip(dst.chunks_exact_mut(20)) {
        let (min, max) = min_max(x);
        let d = (max - min) / 15.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        put_f16(b, 0, d);
        put_f16(b, 2, min);
        for j in 0..16 {
            let q0 = (((x[j] - min) * id + 0.5) as i8).min(15) as u8;
            let q1 = (((x[j + 16] - min) * id + 0.5) as i8).min(15) as u8;
            b[4 + j] = q0 | (q1 << 4);
        }
    }
}

pub(super) fn quantize_q5_0(src: &[f32], dst: &mut [u8]) {
    for (x, b) in src.chunks_exact(QK).zip(dst.chunks_exact_mut(22)) {
        let d = signed_absmax(x) / -16.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        put_f16(b, 0, d);
        let mut qh = 0u32;
        for j in 0..16 {
            let q0 = ((x[j] * id + 16.5) as i8).min(31) as u8;
            let q1 = ((x[j + 16] * id + 16.5) as i8).min(31) as u8;
            b[6 + j] = (q0 & 0x0f) | ((q1 & 0x0f) << 4);
            qh |= ((q0 as u32 & 0x10) >> 4) << j;
            qh |= ((q1 as u32 & 0x10) >> 4) << (j + 16);
        }
        b[2..6].copy_from_slice(&qh.to_le_bytes());
    }
}

pub(super) fn quantize_q5_1(src: &[f32], dst: &mut [u8]) {
    for (x, b) in src.chunks_exact(QK).zip(dst.chunks_exact_mut(24)) {
        let (min, max) = min_max(x);
        let d = (max - min) / 31.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        put_f16(b, 0, d);
        put_f16(b, 2, min);
        let mut qh = 0u32;
        for j in 0..16 {
            let q0 = ((x[j] - min) * id + 0.5) as u8;
            let q1 = ((x[j + 16] - min) * id + 0.5) as u8;
            b[8 + j] = (q0 & 0x0f) | ((q1 & 0x0f) << 4);
            qh |= ((q0 as u32 & 0x10) >> 4) << j;
            qh |= ((q1 as u32 & 0x10) >> 4) << (j + 16);
        }
        b[4..8].copy_from_slice(&qh.to_le_bytes());
    }
}

fn absmax(x: &[f32]) -> f32 {
    x.iter().fold(0f32, |m, v| m.max(v.abs()))
}

/// `quantize_row_q8_0_ref`: multiplies by 1/d and rounds half away from zero.
pub(super) fn quantize_q8_0(src: &[f32], dst: &mut [u8]) {
    for (x, b) in src.chunks_exact(QK).zip(dst.chunks_exact_mut(34)) {
        let d = absmax(x) / 127.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        put_f16(b, 0, d);
        for (q, &v) in b[2..].iter_mut().zip(x) {
            *q = (v * id).round() as i8 as u8;
        }
    }
}

/// `quantize_row_q8_1_ref`.
pub(super) fn quantize_q8_1(src: &[f32], dst: &mut [u8]) {
    for (x, b) in src.chunks_exact(QK).zip(dst.chunks_exact_mut(36)) {
        let d = absmax(x) / 127.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        put_f16(b, 0, d);
        let mut sum = 0i32;
        for (q, &v) in b[4..].iter_mut().zip(x) {
            let qi = (v * id).round() as i8;
            *q = qi as u8;
            sum += qi as i32;
        }
        put_f16(b, 2, sum as f32 * d);
    }
}

// ---------------------------------------------------------------- activations (x86 ggml)

/// One block the way ggml's AVX/AVX2 `quantize_row_q8_0`/`q8_1` do it: multiply by
/// 127/amax (not 1/d) and round half to even. Returns d and the sum of the quants.
fn quantize_block_x86(x: &[f32], qs: &mut [u8]) -> (f32, i32) {
    let amax = absmax(x);
    let d = amax / 127.0;
    let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
    let mut sum = 0i32;
    for (q, &v) in qs.iter_mut().zip(x) {
        // cvtps_epi32 then the saturating packs.
        let qi = ((v * id).round_ties_even() as i32).clamp(-128, 127);
        *q = qi as i8 as u8;
        sum += qi;
    }
    (d, sum)
}

pub(super) fn quantize_q8_0_act(src: &[f32], dst: &mut [u8]) {
    for (x, b) in src.chunks_exact(QK).zip(dst.chunks_exact_mut(34)) {
        let (d, _) = quantize_block_x86(x, &mut b[2..]);
        put_f16(b, 0, d);
    }
}

pub(super) fn quantize_q8_1_act(src: &[f32], dst: &mut [u8]) {
    for (x, b) in src.chunks_exact(QK).zip(dst.chunks_exact_mut(36)) {
        let (d, sum) = quantize_block_x86(x, &mut b[4..]);
        put_f16(b, 0, d);
        put_f16(b, 2, d * sum as f32);
    }
}

// ---------------------------------------------------------------- dot products

/// `ggml_vec_dot_q4_0_q8_0_generic`.
pub(super) fn dot_q4_0_q8_0(w: &[u8], a: &[u8], _n: usize) -> f32 {
    let mut sumf = 0f32;
    for (x, y) in w.chunks_exact(18).zip(a.chunks_exact(34)) {
        let (mut s0, mut s1) = (0i32, 0i32);
        for j in 0..16 {
            s0 += ((x[2 + j] & 0x0f) as i32 - 8) * y[2 + j] as i8 as i32;
            s1 += ((x[2 + j] >> 4) as i32 - 8) * y[18 + j] as i8 as i32;
        }
        sumf += (s0 + s1) as f32 * f16_at(x, 0) * f16_at(y, 0);
    }
    sumf
}

/// `ggml_vec_dot_q4_1_q8_1_generic`.
pub(super) fn dot_q4_1_q8_1(w: &[u8], a: &[u8], _n: usize) -> f32 {
    let mut sumf = 0f32;
    for (x, y) in w.chunks_exact(20).zip(a.chunks_exact(36)) {
        let (mut s0, mut s1) = (0i32, 0i32);
        for j in 0..16 {
            s0 += (x[4 + j] & 0x0f) as i32 * y[4 + j] as i8 as i32;
            s1 += (x[4 + j] >> 4) as i32 * y[20 + j] as i8 as i32;
        }
        sumf += (f16_at(x, 0) * f16_at(y, 0)) * (s0 + s1) as f32 + f16_at(x, 2) * f16_at(y, 2);
    }
    sumf
}

/// `ggml_vec_dot_q5_0_q8_0_generic`.
pub(super) fn dot_q5_0_q8_0(w: &[u8], a: &[u8], _n: usize) -> f32 {
    let mut sumf = 0f32;
    for (x, y) in w.chunks_exact(22).zip(a.chunks_exact(34)) {
        let qh = u32::from_le_bytes([x[2], x[3], x[4], x[5]]);
        let (mut s0, mut s1) = (0i32, 0i32);
        for j in 0..16 {
            let h0 = ((qh >> j) & 1) << 4;
            let h1 = ((qh >> (j + 16)) & 1) << 4;
            let x0 = ((x[6 + j] & 0x0f) as u32 | h0) as i32 - 16;
            let x1 = ((x[6 + j] >> 4) as u32 | h1) as i32 - 16;
            s0 += x0 * y[2 + j] as i8 as i32;
            s1 += x1 * y[18 + j] as i8 as i32;
        }
        sumf += (f16_at(x, 0) * f16_at(y, 0)) * (s0 + s1) as f32;
    }
    sumf
}

/// `ggml_vec_dot_q5_1_q8_1_generic`.
pub(super) fn dot_q5_1_q8_1(w: &[u8], a: &[u8], _n: usize) -> f32 {
    let mut sumf = 0f32;
    for (x, y) in w.chunks_exact(24).zip(a.chunks_exact(36)) {
        let qh = u32::from_le_bytes([x[4], x[5], x[6], x[7]]);
        let (mut s0, mut s1) = (0i32, 0i32);
        for j in 0..16 {
            let h0 = ((qh >> j) & 1) << 4;
            let h1 = ((qh >> (j + 16)) & 1) << 4;
            let x0 = ((x[8 + j] & 0x0f) as u32 | h0) as i32;
            let x1 = ((x[8 + j] >> 4) as u32 | h1) as i32;
            s0 += x0 * y[4 + j] as i8 as i32;
            s1 += x1 * y[20 + j] as i8 as i32;
        }
        sumf += (f16_at(x, 0) * f16_at(y, 0)) * (s0 + s1) as f32 + f16_at(x, 2) * f16_at(y, 2);
    }
    sumf
}

/// `ggml_vec_dot_q8_0_q8_0_generic`.
pub(super) fn dot_q8_0_q8_0(w: &[u8], a: &[u8], _n: usize) -> f32 {
    let mut sumf = 0f32;
    for (x, y) in w.chunks_exact(34).zip(a.chunks_exact(34)) {
        let sumi: i32 = x[2..].iter().zip(&y[2..]).map(|(&p, &q)| p as i8 as i32 * q as i8 as i32).sum();
        sumf += sumi as f32 * (f16_at(x, 0) * f16_at(y, 0));
    }
    sumf
}
