// Dequantization of one 32-value chunk of a weight row into `wv`, per GGML block format.
// `wq` is the weight buffer (bytes packed in u32 words); `b` is the row's byte offset and
// `c` the chunk index within the row. Float operations follow ggml's dequantize_row_*.
var<private> wv: array<f32, 32>;
// The chunk's additive min (Q4_1), kept apart so a matmul can pair it with the
// activation block's stored sum as ggml's q4_1·q8_1 dot does; 0 for other formats.
var<private> wmin: f32;

fn wbyte(o: u32) -> u32 {
    return (wq[o >> 2u] >> ((o & 3u) * 8u)) & 0xffu;
}

// f16 at an even byte offset.
fn wf16(o: u32) -> f32 {
    return unpack2x16float(wq[o >> 2u] >> ((o & 2u) * 8u)).x;
}

// u32 at an even byte offset.
fn wu32(o: u32) -> u32 {
    let s = (o & 3u) * 8u;
    if s == 0u {
        return wq[o >> 2u];
    }
    return (wq[o >> 2u] >> s) | (wq[(o >> 2u) + 1u] << (32u - s));
}

fn sbyte(x: u32) -> f32 {
    return f32(extractBits(bitcast<i32>(x), 0u, 8u));
}

fn chunk_f32(b: u32, c: u32) {
    let o = (b >> 2u) + c * 32u;
    for (var i = 0u; i < 32u; i = i + 1u) {
        wv[i] = bitcast<f32>(wq[o + i]);
    }
}

fn chunk_f16(b: u32, c: u32) {
    let o = b + c * 64u;
    for (var i = 0u; i < 32u; i = i + 2u) {
        let h = unpack2x16float(wu32(o + 2u * i));
        wv[i] = h.x;
        wv[i + 1u] = h.y;
    }
}

fn chunk_q8_0(b: u32, c: u32) {
    let o = b + c * 34u;
    let d = wf16(o);
    for (var i = 0u; i < 32u; i = i + 4u) {
        let w = wu32(o + 2u + i);
        for (var k = 0u; k < 4u; k = k + 1u) {
            wv[i + k] = d * sbyte(w >> (8u * k));
        }
    }
}

fn chunk_q4_0(b: u32, c: u32) {
    let o = b + c * 18u;
    let d = wf16(o);
    for (var i = 0u; i < 16u; i = i + 4u) {
        let w = wu32(o + 2u + i);
        for (var k = 0u; k < 4u; k = k + 1u) {
            let q = (w >> (8u * k)) & 0xffu;
            wv[i + k] = d * (f32(q & 15u) - 8.0);
            wv[16u + i + k] = d * (f32(q >> 4u) - 8.0);
        }
    }
}

fn chunk_q4_1(b: u32, c: u32) {
    let o = b + c * 20u;
    let d = wf16(o);
    wmin = wf16(o + 2u);
    for (var i = 0u; i < 16u; i = i + 4u) {
        let w = wu32(o + 4u + i);
        for (var k = 0u; k < 4u; k = k + 1u) {
            let q = (w >> (8u * k)) & 0xffu;
            wv[i + k] = d * f32(q & 15u);
            wv[16u + i + k] = d * f32(q >> 4u);
        }
    }
}

fn chunk_q5_0(b: u32, c: u32) {
    let o = b + c * 22u;
    let d = wf16(o);
    let qh = wu32(o + 2u);
    for (var i = 0u; i < 16u; i = i + 4u) {
        let w = wu32(o + 6u + i);
        for (var k = 0u; k < 4u; k = k + 1u) {
            let q = (w >> (8u * k)) & 0xffu;
            let j = i + k;
            let lo = (q & 15u) | (((qh >> j) & 1u) << 4u);
            let hi = (q >> 4u) | (((qh >> (j + 16u)) & 1u) << 4u);
            wv[j] = d * (f32(lo) - 16.0);
            wv[16u + j] = d * (f32(hi) - 16.0);
        }
    }
}

// ggml's get_scale_min_k4 over the 12 scale bytes at `s`.
fn scale_min_k4(j: u32, s: u32) -> vec2<f32> {
    if j < 4u {
        return vec2<f32>(f32(wbyte(s + j) & 63u), f32(wbyte(s + j + 4u) & 63u));
    }
    let sc = (wbyte(s + j + 4u) & 15u) | ((wbyte(s + j - 4u) >> 6u) << 4u);
    let m = (wbyte(s + j + 4u) >> 4u) | ((wbyte(s + j) >> 6u) << 4u);
    return vec2<f32>(f32(sc), f32(m));
}

fn chunk_q4_k(b: u32, c: u32) {
    let o = b + (c / 8u) * 144u;
    let j = c % 8u;
    let d = wf16(o);
    let dmin = wf16(o + 2u);
    let sm = scale_min_k4(j, o + 4u);
    let d1 = d * sm.x;
    let m1 = dmin * sm.y;
    let qs = o + 16u + 32u * (j / 2u);
    let sh = (j & 1u) * 4u;
    for (var l = 0u; l < 32u; l = l + 4u) {
        let w = wq[(qs + l) >> 2u];
        for (var k = 0u; k < 4u; k = k + 1u) {
            wv[l + k] = d1 * f32((w >> (8u * k + sh)) & 15u) - m1;
        }
    }
}

fn chunk_q5_k(b: u32, c: u32) {
    let o = b + (c / 8u) * 176u;
    let j = c % 8u;
    let d = wf16(o);
    let dmin = wf16(o + 2u);
    let sm = scale_min_k4(j, o + 4u);
    let d1 = d * sm.x;
    let m1 = dmin * sm.y;
    let qs = o + 48u + 32u * (j / 2u);
    let sh = (j & 1u) * 4u;
    for (var l = 0u; l < 32u; l = l + 4u) {
        let w = wq[(qs + l) >> 2u];
        let h = wq[(o + 16u + l) >> 2u];
        for (var k = 0u; k < 4u; k = k + 1u) {
            let q = ((w >> (8u * k + sh)) & 15u) + (((h >> (8u * k + j)) & 1u) << 4u);
            wv[l + k] = d1 * f32(q) - m1;
        }
    }
}

fn chunk_q6_k(b: u32, c: u32) {
    let o = b + (c / 8u) * 210u;
    let cc = c % 8u;
    let n = cc / 4u;
    let quarter = cc % 4u;
    let d = wf16(o + 208u);
    let ql = o + 64u * n + (quarter & 1u) * 32u;
    let nsh = (quarter >> 1u) * 4u;
    let qh = o + 128u + 32u * n;
    let hsh = 2u * quarter;
    let sc0 = d * sbyte(wbyte(o + 192u + 8u * n + 2u * quarter));
    let sc1 = d * sbyte(wbyte(o + 192u + 8u * n + 2u * quarter + 1u));
    for (var l = 0u; l < 32u; l = l + 2u) {
        let lo = wu32(ql + l);
        let hi = wu32(qh + l);
        for (var k = 0u; k < 2u; k = k + 1u) {
            let q = ((lo >> (8u * k + nsh)) & 15u) | (((hi >> (8u * k + hsh)) & 3u) << 4u);
            let sc = select(sc1, sc0, l + k < 16u);
            wv[l + k] = sc * (f32(q) - 32.0);
        }
    }
}
