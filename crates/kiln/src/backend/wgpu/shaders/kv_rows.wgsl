// Rows into and out of one KV cache of any cache type (kq_ of kv_blocks.wgsl; KT its type,
// 6: F16), as the CPU's kv_rows.rs moves them:
// `store` writes rows of f32 values to their slots, an invocation per group of values (the
// cache's rotation group, or one block): the group rotated by the cache's Walsh-Hadamard
// transform where it has one (hadamard.wgsl), then quantized block by block, Q8_0 as the
// CPU's x86 quantizer (quantize_core.wgsl's mode 0), the others by ggml's reference
// quantizers (quant/legacy.rs, quant/iquants.rs); F16 rounded. `load` reads slots back as
// f32 rows, dequantized and rotated back (a context shift's keys). `copy` copies rows
// between slots as they are, a half word an invocation.
// Blocks lie at even byte offsets, so two invocations may write the halves of one word:
// writes go a half at a time with atomic and/or.
// prm: n_rows, dim, group, rotated, rotation scale (f32 bits), then the slots (copy: the
// source slots, then the destination slots).
@group(0) @binding(0) var<storage, read> prm: array<u32>;
@group(0) @binding(1) var<storage, read_write> kq: array<atomic<u32>>;
@group(0) @binding(2) var<storage, read_write> xs: array<f32>;

const SLOTS: u32 = 5u;

// Bytes a slot's row of `dim` values takes.
fn row_bytes(dim: u32) -> u32 {
    return dim / 32u * kq_BB;
}

// Writes the low 16 bits of v at byte o (even).
fn put16(o: u32, v: u32) {
    let sh = (o & 2u) * 8u;
    atomicAnd(&kq[o >> 2u], ~(0xffffu << sh));
    atomicOr(&kq[o >> 2u], (v & 0xffffu) << sh);
}

fn f16_bits(x: f32) -> u32 {
    return pack2x16float(vec2<f32>(x, 0.0)) & 0xffffu;
}

// The block's bytes, written out by `put_block`.
var<private> qb: array<u32, 34>;

fn put_block(o: u32) {
    for (var h = 0u; h < kq_BB / 2u; h = h + 1u) {
        put16(o + 2u * h, qb[2u * h] | (qb[2u * h + 1u] << 8u));
    }
}

// Four-bit quants q0 (value j) and q1 (value j + 16) into byte j of the quants at `qs`.
fn put_nibbles(qs: u32, j: u32, q0: u32, q1: u32) {
    qb[qs + j] = (q0 & 15u) | ((q1 & 15u) << 4u);
}

// Q5's fifth bits of values j and j + 16 into the 32 bits at byte 2 (Q5_0) or 4 (Q5_1).
fn put_high(at: u32, j: u32, q0: u32, q1: u32) {
    let b0 = at + j / 8u;
    let b1 = at + 2u + j / 8u;
    qb[b0] = qb[b0] | (((q0 >> 4u) & 1u) << (j % 8u));
    qb[b1] = qb[b1] | (((q1 >> 4u) & 1u) << (j % 8u));
}

// The value with the largest magnitude (the first of equals), ggml's signed max.
fn signed_absmax(x0: u32) -> f32 {
    var amax = 0.0;
    var mx = 0.0;
    for (var j = 0u; j < 32u; j = j + 1u) {
        if amax < abs(hv[x0 + j]) {
            amax = abs(hv[x0 + j]);
            mx = hv[x0 + j];
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

// The block of hv[x0..x0 + 32] quantized into qb.
fn quantize_block(x0: u32) {
    for (var i = 0u; i < 34u; i = i + 1u) {
        qb[i] = 0u;
    }
    if KT == 0u {
        // ggml's AVX2 quantize_row_q8_0: scale 127/amax, round half to even.
        var amax = 0.0;
        for (var j = 0u; j < 32u; j = j + 1u) {
            amax = max(amax, abs(hv[x0 + j]));
        }
        let d = amax / 127.0;
        let id = select(0.0, 127.0 / amax, amax != 0.0);
        let db = f16_bits(d);
        qb[0] = db & 0xffu;
        qb[1] = db >> 8u;
        for (var j = 0u; j < 32u; j = j + 1u) {
            qb[2u + j] = u32(clamp(i32(round(hv[x0 + j] * id)), -128, 127)) & 0xffu;
        }
        return;
    }
    if KT == 1u || KT == 3u {
        // Q4_0, Q5_0: d = max / -8 (-16), quants trunc(x / d + 8.5 (16.5)).
        let half = select(8.0, 16.0, KT == 3u);
        let off = select(8.5, 16.5, KT == 3u);
        let top = select(15, 31, KT == 3u);
        let d = signed_absmax(x0) / -half;
        let id = select(0.0, 1.0 / d, d != 0.0);
        let db = f16_bits(d);
        qb[0] = db & 0xffu;
        qb[1] = db >> 8u;
        let qs = select(2u, 6u, KT == 3u);
        for (var j = 0u; j < 16u; j = j + 1u) {
            let q0 = u32(min(trunc_i8(nc(hv[x0 + j] * id) + off), top));
            let q1 = u32(min(trunc_i8(nc(hv[x0 + j + 16u] * id) + off), top));
            put_nibbles(qs, j, q0, q1);
            if KT == 3u {
                put_high(2u, j, q0, q1);
            }
        }
        return;
    }
    if KT == 2u || KT == 4u {
        // Q4_1, Q5_1: d = (max - min) / 15 (31), quants trunc((x - min) / d + 0.5).
        var mn = bitcast<f32>(0x7f7fffffu);
        var mx = -mn;
        for (var j = 0u; j < 32u; j = j + 1u) {
            let v = hv[x0 + j];
            if v < mn {
                mn = v;
            }
            if v > mx {
                mx = v;
            }
        }
        let d = (mx - mn) / select(15.0, 31.0, KT == 4u);
        let id = select(0.0, 1.0 / d, d != 0.0);
        let db = f16_bits(d);
        let mb = f16_bits(mn);
        qb[0] = db & 0xffu;
        qb[1] = db >> 8u;
        qb[2] = mb & 0xffu;
        qb[3] = mb >> 8u;
        let qs = select(4u, 8u, KT == 4u);
        for (var j = 0u; j < 16u; j = j + 1u) {
            let r0 = nc((hv[x0 + j] - mn) * id) + 0.5;
            let r1 = nc((hv[x0 + j + 16u] - mn) * id) + 0.5;
            if KT == 2u {
                put_nibbles(qs, j, u32(min(trunc_i8(r0), 15)), u32(min(trunc_i8(r1), 15)));
            } else {
                // (Rust's `as u8`: saturated at 0 and 255.)
                let q0 = u32(clamp(i32(r0), 0, 255));
                let q1 = u32(clamp(i32(r1), 0, 255));
                put_nibbles(qs, j, q0, q1);
                put_high(4u, j, q0, q1);
            }
        }
        return;
    }
    // IQ4_NL (quantize_row_iq4_nl_impl without importance weights, one block): the scale
    // from the signed max, each value's nearest table entry, then the least-squares scale
    // sum(w q x) / sum(w q q) with weights w = x².
    let mx = signed_absmax(x0);
    if abs(mx) < 1e-15 {
        return;
    }
    let d0 = mx / f32(kv_iq4nl[0]);
    let id = 1.0 / d0;
    var sumqx = 0.0;
    var sumq2 = 0.0;
    var l: array<u32, 32>;
    for (var j = 0u; j < 32u; j = j + 1u) {
        let x = hv[x0 + j];
        l[j] = best_index(id * x);
        let q = f32(kv_iq4nl[l[j]]);
        let wq = nc(nc(x * x) * q);
        sumqx = sumqx + nc(wq * x);
        sumq2 = sumq2 + nc(wq * q);
    }
    let d = select(0.0, sumqx / sumq2, sumq2 > 0.0);
    let db = f16_bits(d);
    qb[0] = db & 0xffu;
    qb[1] = db >> 8u;
    for (var j = 0u; j < 16u; j = j + 1u) {
        put_nibbles(2u, j, l[j], l[j + 16u]);
    }
}

@compute @workgroup_size(64)
fn store(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
         @builtin(local_invocation_index) lid: u32) {
    let g = gidx(wid, nwg, lid);
    let dim = prm[1];
    let gs = prm[2];
    let per = dim / gs;
    if g >= prm[0] * per {
        return;
    }
    let i = g / per;
    let c = g % per;
    for (var j = 0u; j < gs; j = j + 1u) {
        hv[j] = xs[i * dim + c * gs + j];
    }
    if prm[3] != 0u {
        hadamard(gs, pf(4u));
    }
    let o = prm[SLOTS + i] * row_bytes(dim) + c * gs / 32u * kq_BB;
    for (var b = 0u; b < gs / 32u; b = b + 1u) {
        if KT == 6u {
            for (var j = 0u; j < 32u; j = j + 1u) {
                put16(o + 64u * b + 2u * j, f16_bits(hv[32u * b + j]));
            }
        } else {
            quantize_block(32u * b);
            put_block(o + b * kq_BB);
        }
    }
}

@compute @workgroup_size(64)
fn load(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let g = gidx(wid, nwg, lid);
    let dim = prm[1];
    let gs = prm[2];
    let per = dim / gs;
    if g >= prm[0] * per {
        return;
    }
    let i = g / per;
    let c = g % per;
    let o = prm[SLOTS + i] * row_bytes(dim) + c * gs / 32u * kq_BB;
    for (var j = 0u; j < gs; j = j + 2u) {
        var v: vec2<f32>;
        if KT == 6u {
            v = unpack2x16float(kq_word((o + 2u * j) >> 2u));
        } else {
            v = kq_pair(o, j);
        }
        hv[j] = v.x;
        hv[j + 1u] = v.y;
    }
    if prm[3] != 0u {
        hadamard(gs, pf(4u));
    }
    for (var j = 0u; j < gs; j = j + 1u) {
        xs[i * dim + c * gs + j] = hv[j];
    }
}

@compute @workgroup_size(64)
fn copy(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let g = gidx(wid, nwg, lid);
    let n = prm[0];
    let halves = row_bytes(prm[1]) / 2u;
    if g >= n * halves {
        return;
    }
    let i = g / halves;
    let h = 2u * (g % halves);
    let s = prm[SLOTS + i] * row_bytes(prm[1]) + h;
    let d = prm[SLOTS + n + i] * row_bytes(prm[1]) + h;
    put16(d, kq_word(s >> 2u) >> ((s & 2u) * 8u));
}
