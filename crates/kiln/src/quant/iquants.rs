//! The non-linear 4-bit formats, whose quants index a fixed 16-entry table:
//!
//! - IQ4_NL (18 B per 32): `d: f16, qs: [u8; 16]` — x = d * KVALUES[q]; low nibbles hold
//!   elements 0..16, high nibbles 16..32.
//! - IQ4_XS (136 B per 256): `d: f16, scales_h: u16, scales_l: [u8; 4], qs: [u8; 128]` —
//!   eight 32-element sub-blocks with 6-bit scales (4 low bits in `scales_l`, 2 high bits
//!   in `scales_h`), x = d * (ls - 32) * KVALUES[q].

use super::{f16_at, nearest_int, put_f16, signed_absmax};

pub(super) const KVALUES_IQ4NL: [i8; 16] =
    [-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113];

const GROUP_MAX_EPS: f32 = 1e-15;

fn ls_iq4_xs(b: &[u8], ib: usize) -> i32 {
    let sh = u16::from_le_bytes([b[2], b[3]]);
    let lo = (b[4 + ib / 2] >> (4 * (ib % 2))) & 0xf;
    let hi = ((sh >> (2 * ib)) & 3) as u8;
    (lo | (hi << 4)) as i32
}

pub(super) fn dequantize_iq4_nl(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(18).zip(dst.chunks_exact_mut(32)) {
        let d = f16_at(b, 0);
        for (j, &q) in b[2..18].iter().enumerate() {
            y[j] = d * KVALUES_IQ4NL[(q & 0xf) as usize] as f32;
            y[j + 16] = d * KVALUES_IQ4NL[(q >> 4) as usize] as f32;
        }
    }
}

pub(super) fn dequantize_iq4_xs(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(136).zip(dst.chunks_exact_mut(256)) {
        let d = f16_at(b, 0);
        for (ib, (qs, y)) in b[8..].chunks_exact(16).zip(y.chunks_exact_mut(32)).enumerate() {
            let dl = d * (ls_iq4_xs(b, ib) - 32) as f32;
            for (j, &q) in qs.iter().enumerate() {
                y[j] = dl * KVALUES_IQ4NL[(q & 0xf) as usize] as f32;
                y[j + 16] = dl * KVALUES_IQ4NL[(q >> 4) as usize] as f32;
            }
        }
    }
}

/// `best_index_int8`: the index of the table value nearest to `x` (bisection).
fn best_index(values: &[i8; 16], x: f32) -> u8 {
    if x <= values[0] as f32 {
        return 0;
    }
    if x >= values[15] as f32 {
        return 15;
    }
    let (mut ml, mut mu) = (0usize, 15usize);
    while mu - ml > 1 {
        let mav = (ml + mu) / 2;
        if x < values[mav] as f32 {
            mu = mav;
        } else {
            ml = mav;
        }
    }
    if x - (values[mu - 1] as f32) < values[mu] as f32 - x {
        (mu - 1) as u8
    } else {
        mu as u8
    }
}

/// `quantize_row_iq4_nl_impl` without importance weights, for one super-block of
/// `x.len()` elements in 32-element blocks. Returns the super-block scale d (to store as
/// f16), the biased 6-bit sub-block scales (IQ4_XS only) and the 4-bit indices.
fn quantize_iq4_impl(x: &[f32], ntry: i32) -> (f32, Vec<i32>, Vec<u8>) {
    let values = &KVALUES_IQ4NL;
    let nblocks = x.len() / 32;
    let mut l = vec![0u8; x.len()];
    let mut scales = vec![0f32; nblocks];
    let mut weight = [0f32; 32];
    for ib in 0..nblocks {
        let xb = &x[32 * ib..32 * ib + 32];
        let lb = &mut l[32 * ib..32 * ib + 32];
        for (w, &v) in weight.iter_mut().zip(xb) {
            *w = v * v;
        }
        let max = signed_absmax(xb);
        if max.abs() < GROUP_MAX_EPS {
            scales[ib] = 0.0;
            continue;
        }
        let v0 = values[0] as f32;
        let mut d = if ntry > 0 { -max / v0 } else { max / v0 };
        let mut id = 1.0 / d;
        let (mut sumqx, mut sumq2) = (0f32, 0f32);
        for j in 0..32 {
            let li = best_index(values, id * xb[j]);
            lb[j] = li;
            let q = values[li as usize] as f32;
            sumqx += weight[j] * q * xb[j];
            sumq2 += weight[j] * q * q;
        }
        d = if sumq2 > 0.0 { sumqx / sumq2 } else { 0.0 };
        let mut best = d * sumqx;
        for itry in -ntry..=ntry {
            id = (itry as f32 + v0) / max;
            sumqx = 0.0;
            sumq2 = 0.0;
            for j in 0..32 {
                let q = values[best_index(values, id * xb[j]) as usize] as f32;
                sumqx += weight[j] * q * xb[j];
                sumq2 += weight[j] * q * q;
            }
            if sumq2 > 0.0 && sumqx * sumqx > best * sumq2 {
                d = sumqx / sumq2;
                best = d * sumqx;
            }
        }
        scales[ib] = d;
    }
    let max_scale = signed_absmax(&scales);
    let mut ls = vec![0i32; nblocks];
    let dh;
    if nblocks > 1 {
        let d = -max_scale / 32.0;
        dh = d;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        for ib in 0..nblocks {
            let li = nearest_int(id * scales[ib]).clamp(-32, 31);
            let dl = d * li as f32;
            let idl = if dl != 0.0 { 1.0 / dl } else { 0.0 };
            for j in 0..32 {
                l[32 * ib + j] = best_index(values, idl * x[32 * ib + j]);
            }
            ls[ib] = li + 32;
        }
    } else {
        dh = scales[0];
        if ntry > 0 {
            let id = if scales[0] != 0.0 { 1.0 / scales[0] } else { 0.0 };
            for (li, &v) in l.iter_mut().zip(x) {
                *li = best_index(values, id * v);
            }
        }
    }
    (dh, ls, l)
}

/// Packs 4-bit indices: byte j of each 16-byte group holds elements j and j+16.
fn pack_nibbles(l: &[u8], qs: &mut [u8]) {
    for (l, q) in l.chunks_exact(32).zip(qs.chunks_exact_mut(16)) {
        for j in 0..16 {
            q[j] = l[j] | (l[16 + j] << 4);
        }
    }
}

/// `quantize_row_iq4_nl_ref` (no search around the initial scale).
pub(super) fn quantize_iq4_nl(src: &[f32], dst: &mut [u8]) {
    for (x, b) in src.chunks_exact(32).zip(dst.chunks_exact_mut(18)) {
        let (d, _, l) = quantize_iq4_impl(x, -1);
        put_f16(b, 0, d);
        pack_nibbles(&l, &mut b[2..]);
    }
}

/// `quantize_row_iq4_xs_ref` (= `quantize_iq4_xs` without importance weights).
pub(super) fn quantize_iq4_xs(src: &[f32], dst: &mut [u8]) {
    for (x, b) in src.chunks_exact(256).zip(dst.chunks_exact_mut(136)) {
        let (d, ls, l) = quantize_iq4_impl(x, 7);
        put_f16(b, 0, d);
        let mut sh = 0u16;
        b[4..8].iter_mut().for_each(|s| *s = 0);
        for (ib, &v) in ls.iter().enumerate() {
            b[4 + ib / 2] |= ((v & 0xf) as u8) << (4 * (ib % 2));
            sh |= ((v >> 4) as u16) << (2 * ib);
        }
        b[2..4].copy_from_slice(&sh.to_le_bytes());
        pack_nibbles(&l, &mut b[8..]);
    }
}

/// `ggml_vec_dot_iq4_nl_q8_0_generic`.
pub(super) fn dot_iq4_nl_q8_0(w: &[u8], a: &[u8], _n: usize) -> f32 {
    let mut sumf = 0f32;
    for (x, y) in w.chunks_exact(18).zip(a.chunks_exact(34)) {
        let d = f16_at(y, 0) * f16_at(x, 0);
        let (mut s1, mut s2) = (0i32, 0i32);
        for j in 0..16 {
            s1 += y[2 + j] as i8 as i32 * KVALUES_IQ4NL[(x[2 + j] & 0xf) as usize] as i32;
            s2 += y[18 + j] as i8 as i32 * KVALUES_IQ4NL[(x[2 + j] >> 4) as usize] as i32;
        }
        sumf += d * (s1 + s2) as f32;
    }
    sumf
}

/// `ggml_vec_dot_iq4_xs_q8_K_generic`.
pub(super) fn dot_iq4_xs_q8_k(w: &[u8], a: &[u8], _n: usize) -> f32 {
    let mut sumf = 0f32;
    for (x, y) in w.chunks_exact(136).zip(a.chunks_exact(292)) {
        let d4d8 = f16_at(x, 0) * f32::from_le_bytes([y[0], y[1], y[2], y[3]]);
        for (ib, (qs, q8)) in x[8..].chunks_exact(16).zip(y[4..260].chunks_exact(32)).enumerate() {
            let dl = d4d8 * (ls_iq4_xs(x, ib) - 32) as f32;
            let (mut s1, mut s2) = (0i32, 0i32);
            for j in 0..16 {
                s1 += q8[j] as i8 as i32 * KVALUES_IQ4NL[(qs[j] & 0xf) as usize] as i32;
                s2 += q8[j + 16] as i8 as i32 * KVALUES_IQ4NL[(qs[j] >> 4) as usize] as i32;
            }
            sumf += dl * (s1 + s2) as f32;
        }
    }
    sumf
}
