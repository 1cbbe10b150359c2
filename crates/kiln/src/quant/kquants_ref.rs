//! Reference quantizers for the k-quants and Q8_K, following ggml's `quantize_row_*_ref`
//! step by step (same searches, same float operation order), so files written with them
//! match llama.cpp's.

use super::kquants::{scale_min_k4, QK_K};
use super::{f16_at, nearest_int, put_f16, signed_absmax};

const GROUP_MAX_EPS: f32 = 1e-15;

/// `make_qx_quants` with no importance weights: a symmetric scale for `nmax` levels each
/// side, refined over 18 nearby candidates. `L` gets values in 0..2*nmax.
pub(super) fn make_qx_quants(nmax: i32, x: &[f32], l_out: &mut [i8], rmse_type: i32) -> f32 {
    let max = signed_absmax(x);
    if max.abs() < GROUP_MAX_EPS {
        l_out.iter_mut().for_each(|l| *l = 0);
        return 0.0;
    }
    let nmaxf = nmax as f32;
    let mut iscale = -nmaxf / max;
    if rmse_type == 0 {
        for (l, &v) in l_out.iter_mut().zip(x) {
            *l = (nmax + nearest_int(iscale * v).clamp(-nmax, nmax - 1)) as i8;
        }
        return 1.0 / iscale;
    }
    let weight = |v: f32| match rmse_type {
        1 => v * v,
        2 => 1.0,
        3 => v.abs(),
        _ => v.abs().sqrt(),
    };
    let (mut sumlx, mut suml2) = (0f32, 0f32);
    for (l, &v) in l_out.iter_mut().zip(x) {
        let q = nearest_int(iscale * v).clamp(-nmax, nmax - 1);
        *l = (q + nmax) as i8;
        let w = weight(v);
        sumlx += w * v * q as f32;
        suml2 += w * q as f32 * q as f32;
    }
    let mut scale = if suml2 != 0.0 { sumlx / suml2 } else { 0.0 };
    let mut best = scale * sumlx;
    for is in -9..=9 {
        if is == 0 {
            continue;
        }
        iscale = -(nmaxf + 0.1 * is as f32) / max;
        sumlx = 0.0;
        suml2 = 0.0;
        for &v in x {
            let q = nearest_int(iscale * v).clamp(-nmax, nmax - 1);
            let w = weight(v);
            sumlx += w * v * q as f32;
            suml2 += w * q as f32 * q as f32;
        }
        if suml2 > 0.0 && sumlx * sumlx > best * suml2 {
            for (l, &v) in l_out.iter_mut().zip(x) {
                *l = (nmax + nearest_int(iscale * v).clamp(-nmax, nmax - 1)) as i8;
            }
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    scale
}

/// `make_q3_quants` (with `do_rmse`): L gets values in 0..2*nmax.
fn make_q3_quants(nmax: i32, x: &[f32], l_out: &mut [i8]) -> f32 {
    let max = signed_absmax(x);
    if max.abs() < GROUP_MAX_EPS {
        l_out.iter_mut().for_each(|l| *l = 0);
        return 0.0;
    }
    let iscale = -(nmax as f32) / max;
    let (mut sumlx, mut suml2) = (0f32, 0f32);
    for (l, &v) in l_out.iter_mut().zip(x) {
        let q = nearest_int(iscale * v).clamp(-nmax, nmax - 1);
        *l = q as i8;
        let w = v * v;
        sumlx += w * v * q as f32;
        suml2 += w * q as f32 * q as f32;
    }
    for _ in 0..5 {
        let mut n_changed = 0;
        for (i, &v) in x.iter().enumerate() {
            let w = v * v;
            let li = l_out[i] as f32;
            let mut slx = sumlx - w * v * li;
            if slx > 0.0 {
                let mut sl2 = suml2 - w * li * li;
                let new_l = nearest_int(v * sl2 / slx).clamp(-nmax, nmax - 1);
                if new_l != l_out[i] as i32 {
                    slx += w * v * new_l as f32;
                    sl2 += w * new_l as f32 * new_l as f32;
                    if sl2 > 0.0 && slx * slx * suml2 > sumlx * sumlx * sl2 {
                        l_out[i] = new_l as i8;
                        sumlx = slx;
                        suml2 = sl2;
                        n_changed += 1;
                    }
                }
            }
        }
        if n_changed == 0 {
            break;
        }
    }
    for l in l_out.iter_mut() {
        *l += nmax as i8;
    }
    if suml2 > 0.0 {
        sumlx / suml2
    } else {
        0.0
    }
}

/// `make_qkx2_quants`: an asymmetric scale and min for levels 0..=nmax, minimizing the
/// weighted error over `nstep + 1` candidate scales. Returns (scale, -min).
#[allow(clippy::too_many_arguments)]
fn make_qkx2_quants(
    nmax: i32,
    x: &[f32],
    weights: &[f32],
    l_out: &mut [u8],
    laux: &mut [u8],
    rmin: f32,
    rdelta: f32,
    nstep: i32,
    use_mad: bool,
) -> (f32, f32) {
    let n = x.len();
    let (mut min, mut max) = (x[0], x[0]);
    let mut sum_w = weights[0];
    let mut sum_x = sum_w * x[0];
    for i in 1..n {
        if x[i] < min {
            min = x[i];
        }
        if x[i] > max {
            max = x[i];
        }
        let w = weights[i];
        sum_w += w;
        sum_x += w * x[i];
    }
    if min > 0.0 {
        min = 0.0;
    }
    if max == min {
        l_out.iter_mut().for_each(|l| *l = 0);
        return (0.0, -min);
    }
    let nmaxf = nmax as f32;
    let err = |d: f32| if use_mad { d.abs() } else { d * d };
    let mut iscale = nmaxf / (max - min);
    let mut scale = 1.0 / iscale;
    let mut best_error = 0f32;
    for i in 0..n {
        let l = nearest_int(iscale * (x[i] - min)).clamp(0, nmax);
        l_out[i] = l as u8;
        best_error += weights[i] * err(scale * l as f32 + min - x[i]);
    }
    if nstep < 1 {
        return (scale, -min);
    }
    for is in 0..=nstep {
        iscale = (rmin + rdelta * is as f32 + nmaxf) / (max - min);
        let (mut sum_l, mut sum_l2, mut sum_xl) = (0f32, 0f32, 0f32);
        for i in 0..n {
            let l = nearest_int(iscale * (x[i] - min)).clamp(0, nmax);
            laux[i] = l as u8;
            let (w, lf) = (weights[i], l as f32);
            sum_l += w * lf;
            sum_l2 += w * lf * lf;
            sum_xl += w * lf * x[i];
        }
        let dd = sum_w * sum_l2 - sum_l * sum_l;
        if dd > 0.0 {
            let mut this_scale = (sum_w * sum_xl - sum_x * sum_l) / dd;
            let mut this_min = (sum_l2 * sum_x - sum_l * sum_xl) / dd;
            if this_min > 0.0 {
                this_min = 0.0;
                this_scale = sum_xl / sum_l2;
            }
            let mut cur_error = 0f32;
            for i in 0..n {
                cur_error += weights[i] * err(this_scale * laux[i] as f32 + this_min - x[i]);
            }
            if cur_error < best_error {
                l_out[..n].copy_from_slice(&laux[..n]);
                best_error = cur_error;
                scale = this_scale;
                min = this_min;
            }
        }
    }
    (scale, -min)
}

pub(super) fn quantize_q2_k(src: &[f32], dst: &mut [u8]) {
    const Q4SCALE: f32 = 15.0;
    for (x, y) in src.chunks_exact(QK_K).zip(dst.chunks_exact_mut(84)) {
        let mut l = [0u8; QK_K];
        let mut laux = [0u8; 16];
        let mut weights = [0f32; 16];
        let (mut mins, mut scales) = ([0f32; 16], [0f32; 16]);
        let (mut max_scale, mut max_min) = (0f32, 0f32);
        for j in 0..16 {
            let xj = &x[16 * j..16 * j + 16];
            for (w, &v) in weights.iter_mut().zip(xj) {
                *w = v.abs();
            }
            (scales[j], mins[j]) = make_qkx2_quants(
                3,
                xj,
                &weights,
                &mut l[16 * j..16 * j + 16],
                &mut laux,
                -0.5,
                0.1,
                15,
                true,
            );
            if scales[j] > max_scale {
                max_scale = scales[j];
            }
            if mins[j] > max_min {
                max_min = mins[j];
            }
        }
        let (sc, rest) = y.split_at_mut(16);
        if max_scale > 0.0 {
            let iscale = Q4SCALE / max_scale;
            for j in 0..16 {
                sc[j] = nearest_int(iscale * scales[j]) as u8;
            }
            put_f16(rest, 64, max_scale / Q4SCALE);
        } else {
            sc.iter_mut().for_each(|s| *s = 0);
            put_f16(rest, 64, 0.0);
        }
        if max_min > 0.0 {
            let iscale = Q4SCALE / max_min;
            for j in 0..16 {
                sc[j] |= (nearest_int(iscale * mins[j]) << 4) as u8;
            }
            put_f16(rest, 66, max_min / Q4SCALE);
        } else {
            put_f16(rest, 66, 0.0);
        }
        let (d_all, dmin_all) = (f16_at(rest, 64), f16_at(rest, 66));
        for j in 0..16 {
            let d = d_all * (sc[j] & 0xf) as f32;
            if d == 0.0 {
                continue;
            }
            let dm = dmin_all * (sc[j] >> 4) as f32;
            for ii in 0..16 {
                l[16 * j + ii] = nearest_int((x[16 * j + ii] + dm) / d).clamp(0, 3) as u8;
            }
        }
        pack_2bit(&l, &mut rest[..64]);
    }
}

/// Four 2-bit planes per 128 elements: byte l of each 32-byte group holds elements
/// l, l+32, l+64, l+96.
fn pack_2bit<T: Copy + Into<i32>>(l: &[T], qs: &mut [u8]) {
    for (j, q) in (0..QK_K).step_by(128).zip(qs.chunks_exact_mut(32)) {
        for i in 0..32 {
            let v = |k: usize| (l[j + i + 32 * k].into() as u8) << (2 * k);
            q[i] = v(0) | v(1) | v(2) | v(3);
        }
    }
}

pub(super) fn quantize_q3_k(src: &[f32], dst: &mut [u8]) {
    for (x, y) in src.chunks_exact(QK_K).zip(dst.chunks_exact_mut(110)) {
        let mut l = [0i8; QK_K];
        let mut scales = [0f32; 16];
        for j in 0..16 {
            scales[j] = make_q3_quants(4, &x[16 * j..16 * j + 16], &mut l[16 * j..16 * j + 16]);
        }
        let max_scale = signed_absmax(&scales);
        let (hmask, rest) = y.split_at_mut(32);
        let (qs, rest) = rest.split_at_mut(64);
        let (ysc, yd) = rest.split_at_mut(12);
        ysc.iter_mut().for_each(|s| *s = 0);
        if max_scale != 0.0 {
            let iscale = -32.0 / max_scale;
            for j in 0..16 {
                // C stores nearest_int's result in an int8_t before clamping.
                let q = (nearest_int(iscale * scales[j]) as i8).clamp(-32, 31) + 32;
                let q = q as u8;
                if j < 8 {
                    ysc[j] = q & 0xf;
                } else {
                    ysc[j - 8] |= (q & 0xf) << 4;
                }
                ysc[j % 4 + 8] |= (q >> 4) << (2 * (j / 4));
            }
            put_f16(yd, 0, 1.0 / iscale);
        } else {
            put_f16(yd, 0, 0.0);
        }
        let d_all = f16_at(yd, 0);
        let sc = super::kquants::q3k_scales(ysc);
        for j in 0..16 {
            let d = d_all * (sc[j] as i32 - 32) as f32;
            if d == 0.0 {
                continue;
            }
            for ii in 0..16 {
                l[16 * j + ii] = (nearest_int(x[16 * j + ii] / d).clamp(-4, 3) + 4) as i8;
            }
        }
        hmask.iter_mut().for_each(|h| *h = 0);
        let (mut m, mut hm) = (0, 1u8);
        for v in l.iter_mut() {
            if *v > 3 {
                hmask[m] |= hm;
                *v -= 4;
            }
            m += 1;
            if m == 32 {
                m = 0;
                hm = hm.wrapping_shl(1);
            }
        }
        pack_2bit(&l, qs);
    }
}

/// Writes 8 6-bit scales and mins into a Q4_K/Q5_K block's 12 scale bytes.
fn pack_scales_k4(scales: &[f32; 8], mins: &[f32; 8], max_scale: f32, max_min: f32, out: &mut [u8]) {
    let inv_scale = if max_scale > 0.0 { 63.0 / max_scale } else { 0.0 };
    let inv_min = if max_min > 0.0 { 63.0 / max_min } else { 0.0 };
    out.iter_mut().for_each(|s| *s = 0);
    for j in 0..8 {
        let ls = (nearest_int(inv_scale * scales[j]) as u8).min(63);
        let lm = (nearest_int(inv_min * mins[j]) as u8).min(63);
        if j < 4 {
            out[j] = ls;
            out[j + 4] = lm;
        } else {
            out[j + 4] = (ls & 0xf) | ((lm & 0xf) << 4);
            out[j - 4] |= (ls >> 4) << 6;
            out[j] |= (lm >> 4) << 6;
        }
    }
}

/// Q4_K and Q5_K share everything but the number of levels and the search range.
fn quantize_k4_levels(x: &[f32], y: &mut [u8], nmax: i32, rmin: f32, nstep: i32) -> [u8; QK_K] {
    let mut l = [0u8; QK_K];
    let mut laux = [0u8; 32];
    let mut weights = [0f32; 32];
    let (mut mins, mut scales) = ([0f32; 8], [0f32; 8]);
    let (mut max_scale, mut max_min) = (0f32, 0f32);
    for j in 0..8 {
        let xj = &x[32 * j..32 * j + 32];
        let sum_x2 = xj.iter().fold(0f32, |s, &v| s + v * v);
        let av_x = (sum_x2 / 32.0).sqrt();
        for (w, &v) in weights.iter_mut().zip(xj) {
            *w = av_x + v.abs();
        }
        (scales[j], mins[j]) = make_qkx2_quants(
            nmax,
            xj,
            &weights,
            &mut l[32 * j..32 * j + 32],
            &mut laux,
            rmin,
            0.1,
            nstep,
            false,
        );
        if scales[j] > max_scale {
            max_scale = scales[j];
        }
        if mins[j] > max_min {
            max_min = mins[j];
        }
    }
    pack_scales_k4(&scales, &mins, max_scale, max_min, &mut y[4..16]);
    put_f16(y, 0, max_scale / 63.0);
    put_f16(y, 2, max_min / 63.0);
    let (d_all, dmin_all) = (f16_at(y, 0), f16_at(y, 2));
    for j in 0..8 {
        let (sc, m) = scale_min_k4(j, &y[4..16]);
        let d = d_all * sc as f32;
        if d == 0.0 {
            continue;
        }
        let dm = dmin_all * m as f32;
        for ii in 0..32 {
            l[32 * j + ii] = nearest_int((x[32 * j + ii] + dm) / d).clamp(0, nmax) as u8;
        }
    }
    l
}

pub(super) fn quantize_q4_k(src: &[f32], dst: &mut [u8]) {
    for (x, y) in src.chunks_exact(QK_K).zip(dst.chunks_exact_mut(144)) {
        let l = quantize_k4_levels(x, y, 15, -1.0, 20);
        for (j, q) in (0..QK_K).step_by(64).zip(y[16..].chunks_exact_mut(32)) {
            for i in 0..32 {
                q[i] = l[j + i] | (l[j + i + 32] << 4);
            }
        }
    }
}

pub(super) fn quantize_q5_k(src: &[f32], dst: &mut [u8]) {
    for (x, y) in src.chunks_exact(QK_K).zip(dst.chunks_exact_mut(176)) {
        let l = quantize_k4_levels(x, y, 31, -0.5, 15);
        let (qh, ql) = y[16..].split_at_mut(32);
        qh.iter_mut().for_each(|h| *h = 0);
        let (mut m1, mut m2) = (1u8, 2u8);
        for (n, ql) in (0..QK_K).step_by(64).zip(ql.chunks_exact_mut(32)) {
            for j in 0..32 {
                let (mut l1, mut l2) = (l[n + j], l[n + j + 32]);
                if l1 > 15 {
                    l1 -= 16;
                    qh[j] |= m1;
                }
                if l2 > 15 {
                    l2 -= 16;
                    qh[j] |= m2;
                }
                ql[j] = l1 | (l2 << 4);
            }
            m1 = m1.wrapping_shl(2);
            m2 = m2.wrapping_shl(2);
        }
    }
}

pub(super) fn quantize_q6_k(src: &[f32], dst: &mut [u8]) {
    for (x, y) in src.chunks_exact(QK_K).zip(dst.chunks_exact_mut(210)) {
        let mut l = [0i8; QK_K];
        let mut scales = [0f32; 16];
        let (mut max_scale, mut max_abs_scale) = (0f32, 0f32);
        for ib in 0..16 {
            let scale = make_qx_quants(32, &x[16 * ib..16 * ib + 16], &mut l[16 * ib..16 * ib + 16], 1);
            scales[ib] = scale;
            if scale.abs() > max_abs_scale {
                max_abs_scale = scale.abs();
                max_scale = scale;
            }
        }
        if max_abs_scale < GROUP_MAX_EPS {
            y.iter_mut().for_each(|b| *b = 0);
            continue;
        }
        let iscale = -128.0 / max_scale;
        put_f16(y, 208, 1.0 / iscale);
        for ib in 0..16 {
            y[192 + ib] = nearest_int(iscale * scales[ib]).min(127) as i8 as u8;
        }
        let d_all = f16_at(y, 208);
        for j in 0..16 {
            let d = d_all * y[192 + j] as i8 as f32;
            if d == 0.0 {
                continue;
            }
            for ii in 0..16 {
                l[16 * j + ii] = (nearest_int(x[16 * j + ii] / d).clamp(-32, 31) + 32) as i8;
            }
        }
        let (ql, rest) = y.split_at_mut(128);
        let qh = &mut rest[..64];
        for ((j, ql), qh) in (0..QK_K).step_by(128).zip(ql.chunks_exact_mut(64)).zip(qh.chunks_exact_mut(32))
        {
            for i in 0..32 {
                let q = |k: usize| l[j + i + 32 * k] as u8;
                ql[i] = (q(0) & 0xf) | ((q(2) & 0xf) << 4);
                ql[i + 32] = (q(1) & 0xf) | ((q(3) & 0xf) << 4);
                qh[i] = (q(0) >> 4) | ((q(1) >> 4) << 2) | ((q(2) >> 4) << 4) | ((q(3) >> 4) << 6);
            }
        }
    }
}

/// `quantize_row_q8_K_ref`, which ggml's x86 backend also uses for activations:
/// scale -127/max (signed), round half to even, clamp at 127, and 16-element sums.
pub(super) fn quantize_q8_k(src: &[f32], dst: &mut [u8]) {
    for (x, y) in src.chunks_exact(QK_K).zip(dst.chunks_exact_mut(292)) {
        let max = signed_absmax(x);
        if max.abs() == 0.0 {
            y.iter_mut().for_each(|b| *b = 0);
            continue;
        }
        let iscale = -127.0 / max;
        for (q, &v) in y[4..260].iter_mut().zip(x) {
            *q = nearest_int(iscale * v).min(127) as i8 as u8;
        }
        for j in 0..16 {
            let sum: i32 = y[4 + 16 * j..20 + 16 * j].iter().map(|&q| q as i8 as i32).sum();
            y[260 + 2 * j..262 + 2 * j].copy_from_slice(&(sum as i16).to_le_bytes());
        }
        y[0..4].copy_from_slice(&(1.0 / iscale).to_le_bytes());
    }
}
