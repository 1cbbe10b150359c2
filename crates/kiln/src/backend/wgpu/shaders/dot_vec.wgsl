// matmul_vec's wide units for the formats that dominate decode (Q4_0, Q4_K, Q6_K): each
// loads its weight bytes as whole words (16-byte loads where the format is aligned), its
// activations 16 bytes at a time (`xv_at`, kernels.rs: bound, or a prologue's in workgroup
// memory), and takes the offset and minimum terms from the sums the quantize stored
// (quantize_core.wgsl) instead of summing activations per row. The integer
// sums equal dot.wgsl's; only the float grouping differs (the vec path's contract).
// FAST (kernels.rs): 1 Q4_0 (a unit is one 32-value block), 2 Q4_K and 3 Q6_K (a unit is
// 64 values: sub-blocks 2c and 2c + 1, or ql's two nibbles of one 32-byte run).
@group(0) @binding(WV) var<storage, read> wv4: array<vec4<u32>>;

const M4: u32 = 0x0f0f0f0fu;

// Packed dot of four weight words with four activation words.
fn dot16(w: vec4<u32>, x: vec4<u32>) -> i32 {
    return dot4i8(w.x, x.x) + dot4i8(w.y, x.y) + dot4i8(w.z, x.z) + dot4i8(w.w, x.w);
}

// The word at weight byte o + 4i of a run starting at an even byte o (w0 is its first
// aligned word, `odd` whether o is 2 mod 4).
fn wrun(w0: u32, i: u32, odd: bool) -> u32 {
    let a = wq[w0 + i];
    return select(a, (a >> 16u) | (wq[w0 + i + 1u] << 16u), odd);
}

fn vec4_run(w0: u32, i: u32, odd: bool) -> vec4<u32> {
    return vec4<u32>(wrun(w0, i, odd), wrun(w0, i + 1u, odd), wrun(w0, i + 2u, odd), wrun(w0, i + 3u, odd));
}

fn xsum(i: u32) -> i32 {
    return bitcast<i32>(xq[prm[7] + i]);
}

// A unit's weights, loaded and unpacked once for every token of the workgroup (fast_w):
// nibbles and 6-bit values as bytes in a..d, scales and the f16 factors in s; a token's
// activations of a unit, loaded once for the slot's rows (fast_xl): 16-byte words, the
// block scale, the sums the offsets and minimums take; and their dot (fast_dot).
struct WUnit {
    a: vec4<u32>,
    b: vec4<u32>,
    c: vec4<u32>,
    d: vec4<u32>,
    s: vec4<u32>,
}

struct XUnit {
    v: array<vec4<u32>, 4>,
    d: f32,
    s: vec4<i32>,
}

// Q4_0 block u of the row at byte `base`: 18 bytes from five aligned words.
fn w_q4_0(base: u32, u: u32) -> WUnit {
    let o = base + 18u * u;
    let w0 = o >> 2u;
    let odd = (o & 2u) != 0u;
    let h = wq[w0];
    // The quants start at o + 2: word-aligned when o is 2 mod 4.
    let q = vec4_run(w0 + select(0u, 1u, odd), 0u, !odd);
    let m = vec4<u32>(M4);
    let z = vec4<u32>();
    return WUnit(q & m, (q >> vec4<u32>(4u)) & m, z, z, vec4<u32>(select(h, h >> 16u, odd), 0u, 0u, 0u));
}

fn xl_q4_0(u: u32, t: u32, k: u32) -> XUnit {
    let xw = (t * k / 4u + 8u * u) >> 2u;
    let b = t * (k / 32u) + u;
    let z = vec4<u32>();
    return XUnit(array<vec4<u32>, 4>(xv_at(xw), xv_at(xw + 1u), z, z), xd(b), vec4<i32>(xsum(b), 0, 0, 0));
}

fn dot_q4_0(w: WUnit, x: XUnit) -> f32 {
    let d = unpack2x16float(w.s.x).x;
    let s = dot16(w.a, x.v[0]) + dot16(w.b, x.v[1]);
    return (d * x.d) * f32(s - 8 * x.s.x);
}

// Q4_K sub-blocks 2c, 2c + 1 of superblock b = u / 4: the header (d, dmin, 12 scale bytes)
// and the 32 quant bytes as three 16-byte loads.
fn w_q4_k(base: u32, u: u32) -> WUnit {
    let b = u / 4u;
    let c = u % 4u;
    let v = (base + 144u * b) >> 4u;
    let h = wv4[v];
    let qa = wv4[v + 1u + 2u * c];
    let qb = wv4[v + 2u + 2u * c];
    // Scale and min bytes of sub-blocks 2c (low byte) and 2c + 1 (high byte).
    let sh = 16u * (c & 1u);
    let y = h.y >> sh;
    let z = h.z >> sh;
    let w = h.w >> sh;
    let hi = c >= 2u;
    let sc = select(y & 0x3f3fu, (w & 0x0f0fu) | ((y >> 2u) & 0x3030u), hi);
    let mn = select(z & 0x3f3fu, ((w >> 4u) & 0x0f0fu) | ((z >> 2u) & 0x3030u), hi);
    let m = vec4<u32>(M4);
    let s4 = vec4<u32>(4u);
    return WUnit(qa & m, qb & m, (qa >> s4) & m, (qb >> s4) & m, vec4<u32>(sc, mn, h.x, 0u));
}

fn xl_q4_k(u: u32, t: u32, k: u32) -> XUnit {
    let b = u / 4u;
    let c = u % 4u;
    let xw = (t * k / 4u + 64u * b + 16u * c) >> 2u;
    let g = t * (k / 16u) + 16u * b + 4u * c;
    let v = array<vec4<u32>, 4>(xv_at(xw), xv_at(xw + 1u), xv_at(xw + 2u), xv_at(xw + 3u));
    let sums = vec4<i32>(xsum(g) + xsum(g + 1u), xsum(g + 2u) + xsum(g + 3u), 0, 0);
    return XUnit(v, xd(t * (k / 256u) + b), sums);
}

fn dot_q4_k(w: WUnit, x: XUnit) -> f32 {
    let d0 = dot16(w.a, x.v[0]) + dot16(w.b, x.v[1]);
    let d1 = dot16(w.c, x.v[2]) + dot16(w.d, x.v[3]);
    let dm = unpack2x16float(w.s.z);
    let isum = i32(w.s.x & 0xffu) * d0 + i32(w.s.x >> 8u) * d1;
    let imin = i32(w.s.y & 0xffu) * x.s.x + i32(w.s.y >> 8u) * x.s.y;
    return x.d * (dm.x * f32(isum) - dm.y * f32(imin));
}

// Q6_K: half `h` (16 quants) of the groups in ql's low nibbles (qh bits at `sa`) and
// high nibbles (at `sb`), as 6-bit bytes.
fn q6_half(ql: u32, qh: u32, h: u32, odd: bool, sa: vec4<u32>, sb: vec4<u32>) -> array<vec4<u32>, 2> {
    let m = vec4<u32>(M4);
    let m2 = vec4<u32>(0x03030303u);
    let l = vec4_run(ql, 4u * h, odd);
    let hb = vec4_run(qh, 4u * h, odd);
    let qa = (l & m) | (((hb >> sa) & m2) << vec4<u32>(4u));
    let qb = ((l >> vec4<u32>(4u)) & m) | (((hb >> sb) & m2) << vec4<u32>(4u));
    return array<vec4<u32>, 2>(qa, qb);
}

// Q6_K unit c of superblock b: half n = c / 2, groups p = c % 2 (ql's low nibbles) and
// p + 2 (its high nibbles) of 32 quants, each two 16-value scales.
fn w_q6_k(base: u32, u: u32) -> WUnit {
    let b = u / 4u;
    let n = (u % 4u) / 2u;
    let p = u % 2u;
    let o = base + 210u * b;
    let odd = (o & 2u) != 0u;
    let w0 = o >> 2u;
    let ql = w0 + 16u * n + 8u * p;
    let qh = w0 + 32u + 8u * n;
    let sh = 16u * p;
    let sc_lo = wrun(w0 + 48u + 2u * n, 0u, odd) >> sh;
    let sc_hi = wrun(w0 + 48u + 2u * n, 1u, odd) >> sh;
    let dh = wrun(w0 + 52u, 0u, odd);
    let sa = vec4<u32>(2u * p);
    let sb = vec4<u32>(2u * p + 4u);
    let lo = q6_half(ql, qh, 0u, odd, sa, sb);
    let hi = q6_half(ql, qh, 1u, odd, sa, sb);
    return WUnit(lo[0], lo[1], hi[0], hi[1], vec4<u32>(sc_lo, sc_hi, dh, 0u));
}

fn xl_q6_k(u: u32, t: u32, k: u32) -> XUnit {
    let b = u / 4u;
    let n = (u % 4u) / 2u;
    let p = u % 2u;
    let xw = (t * k / 4u + 64u * b + 32u * n + 8u * p) >> 2u;
    // 16-value sums of groups p and p + 2.
    let g = t * (k / 16u) + 16u * b + 8u * n + 2u * p;
    let v = array<vec4<u32>, 4>(xv_at(xw), xv_at(xw + 4u), xv_at(xw + 1u), xv_at(xw + 5u));
    return XUnit(v, xd(t * (k / 256u) + b), vec4<i32>(xsum(g), xsum(g + 1u), xsum(g + 4u), xsum(g + 5u)));
}

fn dot_q6_k(w: WUnit, x: XUnit) -> f32 {
    let d = unpack2x16float(w.s.z).x;
    let lo = vec2<i32>(dot16(w.a, x.v[0]), dot16(w.b, x.v[1]));
    let hi = vec2<i32>(dot16(w.c, x.v[2]), dot16(w.d, x.v[3]));
    // The groups' int8 scales.
    let s = i32(extractBits(bitcast<i32>(w.s.x), 0u, 8u)) * (lo.x - 32 * x.s.x)
        + i32(extractBits(bitcast<i32>(w.s.x), 8u, 8u)) * (hi.x - 32 * x.s.y)
        + i32(extractBits(bitcast<i32>(w.s.y), 0u, 8u)) * (lo.y - 32 * x.s.z)
        + i32(extractBits(bitcast<i32>(w.s.y), 8u, 8u)) * (hi.y - 32 * x.s.w);
    return (x.d * d) * f32(s);
}

// Unit u's weights in format f (FAST, or the tail's: kernels.rs Outs).
fn fast_w(f: u32, base: u32, u: u32) -> WUnit {
    if f == 1u {
        return w_q4_0(base, u);
    }
    if f == 2u {
        return w_q4_k(base, u);
    }
    return w_q6_k(base, u);
}

// Token t's activations of unit u, read as format f's units take them.
fn fast_xl(f: u32, u: u32, t: u32, k: u32) -> XUnit {
    if f == 1u {
        return xl_q4_0(u, t, k);
    }
    if f == 2u {
        return xl_q4_k(u, t, k);
    }
    return xl_q6_k(u, t, k);
}

fn fast_dot(f: u32, w: WUnit, x: XUnit) -> f32 {
    if f == 1u {
        return dot_q4_0(w, x);
    }
    if f == 2u {
        return dot_q4_k(w, x);
    }
    return dot_q6_k(w, x);
}

// Bytes of a row of k values in format f.
fn row_bytes(f: u32, k: u32) -> u32 {
    if f == 1u {
        return k / 32u * 18u;
    }
    return k / 256u * select(210u, 144u, f == 2u);
}
