// A workgroup's chunk of a KV row (`count` values in hadamard.wgsl's `wh`: whole blocks of
// 32, at most 8) made into the cache's bytes as the CPU's kv_rows.rs makes them, in three
// steps over the workgroup: each block's scale from its values (a lane per block, scanning
// them in the CPU's order), each value's quant (a lane per value), then each output word
// from those (a lane per word). Types by their code (kv_blocks.wgsl's KV_TY; 6: F16,
// rounded): Q8_0 as the CPU's x86 quantizer (quantize_core.wgsl's mode 0), the others by
// ggml's reference quantizers (quant/legacy.rs, quant/iquants.rs). Every lane of the
// workgroup calls `kv_quantize` (it has barriers); `kv_byte` then gives the bytes.

// Per block: the scale d (f32, before its f16 rounding), its inverse, and the minimum
// (Q4_1, Q5_1) or the signed max (IQ4_NL).
var<workgroup> kv_d: array<f32, 8>;
var<workgroup> kv_id: array<f32, 8>;
var<workgroup> kv_m: array<f32, 8>;
// Per value: its quant (Q8_0's as an i8 byte; IQ4_NL's table index).
var<workgroup> kv_q: array<u32, 256>;
// IQ4_NL's per-value terms of sum(w q q) (those of sum(w q x) go to wh).
var<workgroup> kv_t: array<f32, 256>;

// Bytes per block of 32 values of a type.
fn kv_bb(ty: u32) -> u32 {
    switch ty {
        case 0u: {
            return 34u;
        }
        case 2u: {
            return 20u;
        }
        case 3u: {
            return 22u;
        }
        case 4u: {
            return 24u;
        }
        case 6u: {
            return 64u;
        }
        default: {
            return 18u;
        }
    }
}

fn f16_bits(x: f32) -> u32 {
    return pack2x16float(vec2<f32>(x, 0.0)) & 0xffffu;
}

// The value with the largest magnitude of the block at x0 (the first of equals), ggml's
// signed max.
fn signed_absmax(x0: u32) -> f32 {
    var amax = 0.0;
    var mx = 0.0;
    for (var j = 0u; j < 32u; j = j + 1u) {
        if amax < abs(wh[x0 + j]) {
            amax = abs(wh[x0 + j]);
            mx = wh[x0 + j];
        }
    }
    return mx;
}

// `best_index_int8`: the IQ4_NL table's nearest value to x, by bisection.
fn best_index(x: f32) -> u32 {
    if x <= f32(kv_iq4nl[0]) {
        return 0u;
    }
    if x >= f32(kv_iq4nl[15]) {
        return 15u;
    }
    var ml = 0u;
    var mu = 15u;
    while mu - ml > 1u {
        let mav = (ml + mu) / 2u;
        if x < f32(kv_iq4nl[mav]) {
            mu = mav;
        } else {
            ml = mav;
        }
    }
    return select(mu, mu - 1u, x - f32(kv_iq4nl[mu - 1u]) < f32(kv_iq4nl[mu]) - x);
}

// C's `(int8_t)x` saturated as Rust's `as i8`.
fn trunc_i8(x: f32) -> i32 {
    return clamp(i32(x), -128, 127);
}

// Block b's scale (and minimum) from its values.
fn kv_block_scale(ty: u32, b: u32) {
    let x0 = 32u * b;
    var d = 0.0;
    var id = 0.0;
    var m = 0.0;
    if ty == 0u {
        // ggml's AVX2 quantize_row_q8_0: scale 127/amax, round half to even.
        var amax = 0.0;
        for (var j = 0u; j < 32u; j = j + 1u) {
            amax = max(amax, abs(wh[x0 + j]));
        }
        d = amax / 127.0;
        id = select(0.0, 127.0 / amax, amax != 0.0);
    } else if ty == 1u || ty == 3u {
        // Q4_0, Q5_0: d = max / -8 (-16).
        d = signed_absmax(x0) / -select(8.0, 16.0, ty == 3u);
        id = select(0.0, 1.0 / d, d != 0.0);
    } else if ty == 2u || ty == 4u {
        // Q4_1, Q5_1: d = (max - min) / 15 (31).
        var mn = bitcast<f32>(0x7f7fffffu);
        var mx = -mn;
        for (var j = 0u; j < 32u; j = j + 1u) {
            let v = wh[x0 + j];
            if v < mn {
                mn = v;
            }
            if v > mx {
                mx = v;
            }
        }
        d = (mx - mn) / select(15.0, 31.0, ty == 4u);
        id = select(0.0, 1.0 / d, d != 0.0);
        m = mn;
    } else if ty == 5u {
        // IQ4_NL (quantize_row_iq4_nl_impl without importance weights, one block): the
        // first scale from the signed max (the least-squares one follows the quants).
        m = signed_absmax(x0);
        id = 1.0 / (m / f32(kv_iq4nl[0]));
    }
    kv_d[b] = d;
    kv_id[b] = id;
    kv_m[b] = m;
}

// Value i's quant.
fn kv_value_quant(ty: u32, i: u32) {
    let b = i / 32u;
    let x = wh[i];
    let id = kv_id[b];
    var q = 0u;
    if ty == 0u {
        q = u32(clamp(i32(round(x * id)), -128, 127)) & 0xffu;
    } else if ty == 1u || ty == 3u {
        // quants trunc(x / d + 8.5 (16.5)).
        let off = select(8.5, 16.5, ty == 3u);
        q = u32(min(trunc_i8(nc(x * id) + off), select(15, 31, ty == 3u)));
    } else if ty == 2u || ty == 4u {
        // quants trunc((x - min) / d + 0.5) (Q5_1: Rust's `as u8`, saturated at 0 and 255).
        let r = nc((x - kv_m[b]) * id) + 0.5;
        q = select(u32(clamp(i32(r), 0, 255)), u32(min(trunc_i8(r), 15)), ty == 2u);
    } else if ty == 5u {
        // Each value's nearest table entry, and its terms of the least-squares scale
        // sum(w q x) / sum(w q q), weights w = x² (the block all zero for a tiny max).
        if abs(kv_m[b]) >= 1e-15 {
            q = best_index(id * x);
        }
        let qv = f32(kv_iq4nl[q]);
        let wq = nc(nc(x * x) * qv);
        wh[i] = nc(wq * x);
        kv_t[i] = nc(wq * qv);
    }
    kv_q[i] = q;
}

// The chunk's `count` values of wh quantized to type `ty` (nothing to do for F16).
fn kv_quantize(ty: u32, count: u32, lid: u32) {
    if ty == 6u {
        return;
    }
    let nb = count / 32u;
    if lid < nb {
        kv_block_scale(ty, lid);
    }
    workgroupBarrier();
    for (var i = lid; i < count; i = i + WG) {
        kv_value_quant(ty, i);
    }
    workgroupBarrier();
    if ty == 5u {
        if lid < nb {
            var sumqx = 0.0;
            var sumq2 = 0.0;
            for (var j = 0u; j < 32u; j = j + 1u) {
                sumqx = sumqx + wh[32u * lid + j];
                sumq2 = sumq2 + kv_t[32u * lid + j];
            }
            kv_d[lid] = select(0.0, select(0.0, sumqx / sumq2, sumq2 > 0.0), abs(kv_m[lid]) >= 1e-15);
        }
        workgroupBarrier();
    }
}

// Q5's fifth bits of the block at value x0, byte k of their 32 (bit i: value 8k + i).
fn kv_high_byte(x0: u32, k: u32) -> u32 {
    var h = 0u;
    for (var i = 0u; i < 8u; i = i + 1u) {
        h = h | (((kv_q[x0 + 8u * k + i] >> 4u) & 1u) << i);
    }
    return h;
}

// Byte `ob` of the chunk's bytes, as ggml lays out its blocks: the f16 scale d (Q4_1, Q5_1:
// then the f16 minimum), the fifth bits (Q5_0, Q5_1), the quants (four-bit formats: byte j
// holds values j and j + 16).
fn kv_byte(ty: u32, ob: u32) -> u32 {
    let bb = kv_bb(ty);
    let b = ob / bb;
    let r = ob % bb;
    let x0 = 32u * b;
    if ty == 6u {
        return (f16_bits(wh[x0 + r / 2u]) >> (8u * (r & 1u))) & 0xffu;
    }
    if r < 2u {
        return (f16_bits(kv_d[b]) >> (8u * r)) & 0xffu;
    }
    let has_min = ty == 2u || ty == 4u;
    if has_min && r < 4u {
        return (f16_bits(kv_m[b]) >> (8u * (r - 2u))) & 0xffu;
    }
    if ty == 0u {
        return kv_q[x0 + r - 2u];
    }
    let hb = select(2u, 4u, has_min);
    let five = ty == 3u || ty == 4u;
    if five && r < hb + 4u {
        return kv_high_byte(x0, r - hb);
    }
    let j = r - select(hb, hb + 4u, five);
    return (kv_q[x0 + j] & 15u) | ((kv_q[x0 + j + 16u] & 15u) << 4u);
}

// The four bytes from `ob` (a multiple of 4) as a word.
fn kv_word_at(ty: u32, ob: u32) -> u32 {
    return kv_byte(ty, ob) | (kv_byte(ty, ob + 1u) << 8u) | (kv_byte(ty, ob + 2u) << 16u)
        | (kv_byte(ty, ob + 3u) << 24u);
}
