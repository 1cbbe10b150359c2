// Quantized dot products with exactly the CPU backend's arithmetic (quant/simd/avx2.rs):
// integer sums of i8 quants, then the same f32 operations in the same order, so each
// output is bit-identical to the CPU's. The activation row is packed i8 words (quantize.wgsl).
//
// 32-value formats (Q4_0, Q4_1, Q8_0): the CPU keeps eight lane accumulators; lane l
// of block b adds fma_x(d_w * d_x, sum of products of quants 4l..4l+3, acc_l), in block order;
// the row's dot is hsum8 of the lanes (+ the sum of d_min * s_x for Q4_1). Q5_0 (GENERIC)
// takes ggml's generic steps instead: its unit leaves the block's whole sum in lane 0 (the
// others 0) and `chain` adds nc((d_w * d_x) * sum), unfused, so hsum8 is lane 0's chain.
// K formats (Q4_K, Q5_K, Q6_K): per superblock exact integer sums, then (KMODE) as the
// CPU's kernels: 0 (Q5_K) sum += (d_x * d_w) * f32(int), mins += (d_x * d_min) *
// f32(int_min), dot = sum - mins; 1 (Q4_K, llama.cpp's repacked order) sum = fma(f32(int),
// d_w * d_x, sum), mins likewise, dot = sum - mins; 2 (Q6_K, ggml's AVX2 order) eight i32
// lanes per superblock (lane m: bytes 4m..4m+3 of every 32-quant group, the +32 offset
// taken out with group m's sums), acc_m = fma(d_x * d_w, f32(lane), acc_m), dot = hsum8.
// F16: 16 fma chains (element i on chain i % 16) summed as _mm512_reduce_add_ps, the CPU's
// F16 GEMM (quant/f16_lanes.rs); F32: 32 chains combined as the CPU's 4x8 registers.

// The eight lane sums and the weight scales of the unit last computed.
var<private> ls: array<i32, 8>;
var<private> udw: f32;
var<private> umw: f32;

fn dot4i8(a: u32, b: u32) -> i32 {
//DOT4
}

fn xsum4(x: u32) -> i32 {
    return dot4i8(0x01010101u, x);
}

// Four bits to bit 4 of four bytes.
fn spread4(b: u32) -> u32 {
    return ((b & 1u) << 4u) | ((b & 2u) << 11u) | ((b & 4u) << 18u) | ((b & 8u) << 25u);
}

// Block at weight byte `o`, activation block at word `xw`.
fn unit_q8_0(o: u32, xw: u32) {
    udw = wf16(o);
    for (var l = 0u; l < 8u; l = l + 1u) {
        ls[l] = dot4i8(wu32(o + 2u + 4u * l), xq[xw + l]);
    }
}

fn unit_q4_0(o: u32, xw: u32) {
    udw = wf16(o);
    for (var l = 0u; l < 4u; l = l + 1u) {
        let w = wu32(o + 2u + 4u * l);
        let x0 = xq[xw + l];
        let x1 = xq[xw + 4u + l];
        ls[l] = dot4i8(w & 0x0f0f0f0fu, x0) - 8 * xsum4(x0);
        ls[l + 4u] = dot4i8((w >> 4u) & 0x0f0f0f0fu, x1) - 8 * xsum4(x1);
    }
}

fn unit_q4_1(o: u32, xw: u32) {
    udw = wf16(o);
    umw = wf16(o + 2u);
    for (var l = 0u; l < 4u; l = l + 1u) {
        let w = wq[(o >> 2u) + 1u + l];
        ls[l] = dot4i8(w & 0x0f0f0f0fu, xq[xw + l]);
        ls[l + 4u] = dot4i8((w >> 4u) & 0x0f0f0f0fu, xq[xw + 4u + l]);
    }
}

fn unit_q5_0(o: u32, xw: u32) {
    udw = wf16(o);
    let qh = wu32(o + 2u);
    var s = 0;
    for (var l = 0u; l < 4u; l = l + 1u) {
        let w = wu32(o + 6u + 4u * l);
        let x0 = xq[xw + l];
        let x1 = xq[xw + 4u + l];
        let q0 = (w & 0x0f0f0f0fu) | spread4((qh >> (4u * l)) & 15u);
        let q1 = ((w >> 4u) & 0x0f0f0f0fu) | spread4((qh >> (16u + 4u * l)) & 15u);
        s = s + dot4i8(q0, x0) - 16 * xsum4(x0) + dot4i8(q1, x1) - 16 * xsum4(x1);
        ls[l + 1u] = 0;
        ls[l + 4u] = 0;
    }
    ls[0] = s;
}

// One step of a 32-value format's lane chain (see the top).
fn chain(d: f32, l: f32, acc: f32) -> f32 {
    if GENERIC {
        return acc + nc(d * l);
    }
    return fma_x(d, l, acc);
}

// K formats: sub-block j (32 values) of the superblock at byte `o`, activation superblock
// at word `xw`: (scale * dot, min * sum of x) as integers.
fn scale_min_k4_u(j: u32, s: u32) -> vec2<u32> {
    if j < 4u {
        return vec2<u32>(wbyte(s + j) & 63u, wbyte(s + j + 4u) & 63u);
    }
    let sc = (wbyte(s + j + 4u) & 15u) | ((wbyte(s + j - 4u) >> 6u) << 4u);
    let m = (wbyte(s + j + 4u) >> 4u) | ((wbyte(s + j) >> 6u) << 4u);
    return vec2<u32>(sc, m);
}

fn sub_q4_k(o: u32, j: u32, xw: u32) -> vec2<i32> {
    let sm = vec2<i32>(scale_min_k4_u(j, o + 4u));
    let qs = ((o + 16u) >> 2u) + 8u * (j / 2u);
    let sh = (j & 1u) * 4u;
    var s = 0;
    var ys = 0;
    for (var l = 0u; l < 8u; l = l + 1u) {
        let x = xq[xw + 8u * j + l];
        s = s + dot4i8((wq[qs + l] >> sh) & 0x0f0f0f0fu, x);
        ys = ys + xsum4(x);
    }
    return vec2<i32>(sm.x * s, sm.y * ys);
}

fn sub_q5_k(o: u32, j: u32, xw: u32) -> vec2<i32> {
    let sm = vec2<i32>(scale_min_k4_u(j, o + 4u));
    let qs = ((o + 48u) >> 2u) + 8u * (j / 2u);
    let qh = (o + 16u) >> 2u;
    let sh = (j & 1u) * 4u;
    var s = 0;
    var ys = 0;
    for (var l = 0u; l < 8u; l = l + 1u) {
        let x = xq[xw + 8u * j + l];
        let q = ((wq[qs + l] >> sh) & 0x0f0f0f0fu) | (((wq[qh + l] >> j) & 0x01010101u) << 4u);
        s = s + dot4i8(q, x);
        ys = ys + xsum4(x);
    }
    return vec2<i32>(sm.x * s, sm.y * ys);
}

// Q6_K: word l (quants 4l..4l+3, unsigned, +32) of 32-quant group j, and scale i.
fn q6_word(o: u32, j: u32, l: u32) -> u32 {
    let n = j / 4u;
    let kq = j % 4u;
    let ql = o + 64u * n + (kq & 1u) * 32u;
    let qh = o + 128u + 32u * n;
    return ((wu32(ql + 4u * l) >> ((kq >> 1u) * 4u)) & 0x0f0f0f0fu)
        | (((wu32(qh + 4u * l) >> (2u * kq)) & 0x03030303u) << 4u);
}

fn q6_scale(o: u32, i: u32) -> i32 {
    return i32(extractBits(bitcast<i32>(wbyte(o + 192u + i)), 0u, 8u));
}

// Q6_K lane m of the superblock at byte `o` with the activation superblock at word `xw`.
fn q6_lane(o: u32, m: u32, xw: u32) -> i32 {
    var s = 0;
    for (var j = 0u; j < 8u; j = j + 1u) {
        s = s + q6_scale(o, 2u * j + m / 4u) * dot4i8(q6_word(o, j, m), xq[xw + 8u * j + m]);
    }
    var lo = 0;
    var hi = 0;
    for (var w = 0u; w < 4u; w = w + 1u) {
        lo = lo + xsum4(xq[xw + 8u * m + w]);
        hi = hi + xsum4(xq[xw + 8u * m + 4u + w]);
    }
    return s - 32 * (q6_scale(o, 2u * m) * lo + q6_scale(o, 2u * m + 1u) * hi);
}

fn sub_q6_k(o: u32, j: u32, xw: u32) -> vec2<i32> {
    let sc0 = q6_scale(o, 2u * j);
    let sc1 = q6_scale(o, 2u * j + 1u);
    var s0 = 0;
    var s1 = 0;
    for (var l = 0u; l < 8u; l = l + 1u) {
        let x = xq[xw + 8u * j + l];
        let v = dot4i8(q6_word(o, j, l), x) - 32 * xsum4(x);
        if l < 4u {
            s0 = s0 + v;
        } else {
            s1 = s1 + v;
        }
    }
    return vec2<i32>(sc0 * s0 + sc1 * s1, 0);
}

// (d, d_min) of a K superblock.
fn kscale_q4_k(o: u32) -> vec2<f32> {
    return vec2<f32>(wf16(o), wf16(o + 2u));
}

fn kscale_q6_k(o: u32) -> vec2<f32> {
    return vec2<f32>(wf16(o + 208u), 0.0);
}

// Weight element i of the F16/F32 row at byte `base`.
fn wfloat(base: u32, i: u32) -> f32 {
    if WF16 {
        return unpack2x16float(wq[(base >> 2u) + (i >> 1u)] >> ((i & 1u) * 16u)).x;
    }
    return bitcast<f32>(wq[(base >> 2u) + i]);
}

// The activation of token t: its quants start at word t * k / 4, its block scales at
// prm[6] + t * nb, its Q8_1 sums at prm[7] + t * nb.
fn xd(i: u32) -> f32 {
    return bitcast<f32>(xq[prm[6] + i]);
}

fn xs1(i: u32) -> f32 {
    return bitcast<f32>(xq[prm[7] + i]);
}

// The whole dot of the row at byte `base` with token t, serially (one invocation).
fn row_dot(base: u32, t: u32, k: u32) -> f32 {
    if CLASS == 0u {
        let nb = k / 32u;
        var acc: array<f32, 8>;
        var summs = 0.0;
        for (var b = 0u; b < nb; b = b + 1u) {
            unit_a(base + b * BB, t * k / 4u + 8u * b);
            let d = udw * xd(t * nb + b);
            for (var l = 0u; l < 8u; l = l + 1u) {
                acc[l] = chain(d, f32(ls[l]), acc[l]);
            }
            if HAS_MIN {
                summs = summs + nc(umw * xs1(t * nb + b));
            }
        }
        return hsum8(acc) + summs;
    }
    if CLASS == 1u && KMODE == 2u {
        let nb = k / 256u;
        var acc: array<f32, 8>;
        for (var b = 0u; b < nb; b = b + 1u) {
            let o = base + b * BB;
            let d = nc(xd(t * nb + b) * kscale(o).x);
            for (var m = 0u; m < 8u; m = m + 1u) {
                acc[m] = fma_x(d, f32(q6_lane(o, m, t * k / 4u + 64u * b)), acc[m]);
            }
        }
        return hsum8(acc);
    }
    if CLASS == 1u {
        let nb = k / 256u;
        var sum = 0.0;
        var mins = 0.0;
        for (var b = 0u; b < nb; b = b + 1u) {
            let o = base + b * BB;
            var im = vec2<i32>(0);
            for (var j = 0u; j < 8u; j = j + 1u) {
                im = im + sub_k(o, j, t * k / 4u + 64u * b);
            }
            let dy = xd(t * nb + b);
            let ds = kscale(o);
            if KMODE == 1u {
                sum = fma_x(f32(im.x), nc(ds.x * dy), sum);
                mins = fma_x(f32(im.y), nc(ds.y * dy), mins);
            } else {
                sum = sum + nc((dy * ds.x) * f32(im.x));
                mins = mins + nc((dy * ds.y) * f32(im.y));
            }
        }
        return sum - mins;
    }
    var c: array<f32, 32>;
    let n = float_chains();
    for (var i = 0u; i < k; i = i + n) {
        for (var l = 0u; l < n; l = l + 1u) {
            c[l] = fma_x(wfloat(base, i + l), bitcast<f32>(xq[t * k + i + l]), c[l]);
        }
    }
    return float_chains_sum(c);
}

// How many fma chains a float (F16/F32) row's dot runs.
fn float_chains() -> u32 {
    if WF16 {
        return 16u;
    }
    return 32u;
}

// The dot of a float row from its chains, in the CPU's order (see the top of this file).
fn float_chains_sum(c: array<f32, 32>) -> f32 {
    if WF16 {
        var h: array<f32, 8>;
        for (var l = 0u; l < 8u; l = l + 1u) {
            h[l] = c[l] + c[8u + l];
        }
        return ((h[0] + h[4]) + (h[2] + h[6])) + ((h[1] + h[5]) + (h[3] + h[7]));
    }
    var s: array<f32, 8>;
    for (var l = 0u; l < 8u; l = l + 1u) {
        s[l] = (c[l] + c[8u + l]) + (c[16u + l] + c[24u + l]);
    }
    return hsum8(s);
}
