// Dequantization of one 32-value chunk of a weight row, per GGML block format, in two
// steps so a kernel can issue a chunk's loads early and do its arithmetic later (the tile
// matmul: the next stage's loads stay in flight while this stage's products run):
// `fetch_chunk(b, c, q)` loads the words chunk c of the row at byte `b` needs into slot q of
// `raw` (RAW words a slot, NQ slots), `unpack_chunk(c, q)` turns them into `wv` (and
// `wmin`); `load_chunk` (kernels.rs) does both. `wq` is the weight buffer (bytes packed in
// u32 words). Float operations follow ggml's dequantize_row_*. The helpers after them
// read `wq` directly (dot.wgsl's integer units).
var<private> wv: array<f32, 32>;
// The chunk's additive min (Q4_1), kept apart so a matmul can pair it with the
// activation block's stored sum as ggml's q4_1·q8_1 dot does; 0 for other formats.
var<private> wmin: f32;
// A slot's words: for the formats whose blocks lie at any even offset, the 16-byte words
// around the chunk's block (a window), the block starting `g_sh` bytes into the first; for
// Q4_K and Q5_K (at multiples of 16) and F32, the words themselves (`g_sh` 0).
var<private> raw: array<u32, RAW * NQ>;
var<private> g_sh: array<u32, NQ>;

// raw[b + k] for k in 0..4, by selects: every index static, so `raw` stays in registers
// and its loads stay in flight until the unpack reads them.
fn pick(b: u32, k: u32) -> u32 {
    let lo = select(raw[b], raw[b + 1u], k == 1u);
    let hi = select(raw[b + 2u], raw[b + 3u], k == 3u);
    return select(select(lo, hi, k >= 2u), raw[b + 4u], k == 4u);
}

// The u32 at byte p (even; static where unrolled) of slot q's block.
fn rw(q: u32, p: u32) -> u32 {
    let s = g_sh[q] + (p & 3u);
    let b = q * RAW + (p >> 2u);
    let lo = pick(b, s >> 2u);
    return select(lo, (lo >> 16u) | (pick(b + 1u, s >> 2u) << 16u), (s & 2u) != 0u);
}

// Loads n words from the word holding byte `o` into slot q at word `at`.
fn fetch_words(o: u32, q: u32, at: u32, n: u32) {
    for (var i = 0u; i < n; i = i + 1u) {
        raw[q * RAW + at + i] = wword((o >> 2u) + i);
    }
}

// Loads the window of n 16-byte words around byte o (even) into slot q at word `at`
// (words from 4n on pad the window: `rw` may look past it), and its shift.
fn fetch_window(o: u32, q: u32, at: u32, n: u32) {
    g_sh[q] = o & 15u;
    fetch_quads(o & ~15u, q, at, n);
}

// Loads n 16-byte words from byte o (a multiple of 16) into slot q at word `at`.
fn fetch_quads(o: u32, q: u32, at: u32, n: u32) {
    for (var i = 0u; i < n; i = i + 1u) {
        let v = wquad((o >> 4u) + i);
        for (var j = 0u; j < 4u; j = j + 1u) {
            raw[q * RAW + at + 4u * i + j] = v[j];
        }
    }
}

fn sbyte(x: u32) -> f32 {
    return f32(extractBits(bitcast<i32>(x), 0u, 8u));
}

fn fetch_f32(b: u32, c: u32, q: u32) {
    g_sh[q] = 0u;
    fetch_words(b + c * 128u, q, 0u, 32u);
}

fn unpack_f32(c: u32, q: u32) {
    for (var i = 0u; i < 32u; i = i + 1u) {
        wv[i] = bitcast<f32>(raw[q * RAW + i]);
    }
}

fn fetch_f16(b: u32, c: u32, q: u32) {
    fetch_window(b + c * 64u, q, 0u, 5u);
}

fn unpack_f16(c: u32, q: u32) {
    for (var i = 0u; i < 32u; i = i + 2u) {
        let h = unpack2x16float(rw(q, 2u * i));
        wv[i] = h.x;
        wv[i + 1u] = h.y;
    }
}

fn fetch_q8_0(b: u32, c: u32, q: u32) {
    fetch_window(b + c * 34u, q, 0u, 3u);
}

fn unpack_q8_0(c: u32, q: u32) {
    let d = unpack2x16float(rw(q, 0u)).x;
    for (var i = 0u; i < 32u; i = i + 4u) {
        let w = rw(q, 2u + i);
        for (var k = 0u; k < 4u; k = k + 1u) {
            wv[i + k] = d * sbyte(w >> (8u * k));
        }
    }
}

fn fetch_q4_0(b: u32, c: u32, q: u32) {
    fetch_window(b + c * 18u, q, 0u, 2u);
}

fn unpack_q4_0(c: u32, q: u32) {
    let d = unpack2x16float(rw(q, 0u)).x;
    for (var i = 0u; i < 16u; i = i + 4u) {
        let w = rw(q, 2u + i);
        for (var k = 0u; k < 4u; k = k + 1u) {
            let v = (w >> (8u * k)) & 0xffu;
            wv[i + k] = d * (f32(v & 15u) - 8.0);
            wv[16u + i + k] = d * (f32(v >> 4u) - 8.0);
        }
    }
}

fn fetch_q4_1(b: u32, c: u32, q: u32) {
    // (Blocks at multiples of 4: a shift of at most 12.)
    fetch_window(b + c * 20u, q, 0u, 2u);
}

fn unpack_q4_1(c: u32, q: u32) {
    let dm = unpack2x16float(rw(q, 0u));
    let d = dm.x;
    wmin = dm.y;
    for (var i = 0u; i < 16u; i = i + 4u) {
        let w = rw(q, 4u + i);
        for (var k = 0u; k < 4u; k = k + 1u) {
            let v = (w >> (8u * k)) & 0xffu;
            wv[i + k] = d * f32(v & 15u);
            wv[16u + i + k] = d * f32(v >> 4u);
        }
    }
}

fn fetch_q5_0(b: u32, c: u32, q: u32) {
    fetch_window(b + c * 22u, q, 0u, 3u);
}

fn unpack_q5_0(c: u32, q: u32) {
    let d = unpack2x16float(rw(q, 0u)).x;
    let qh = rw(q, 2u);
    for (var i = 0u; i < 16u; i = i + 4u) {
        let w = rw(q, 6u + i);
        for (var k = 0u; k < 4u; k = k + 1u) {
            let v = (w >> (8u * k)) & 0xffu;
            let j = i + k;
            let lo = (v & 15u) | (((qh >> j) & 1u) << 4u);
            let hi = (v >> 4u) | (((qh >> (j + 16u)) & 1u) << 4u);
            wv[j] = d * (f32(lo) - 16.0);
            wv[16u + j] = d * (f32(hi) - 16.0);
        }
    }
}

// Byte i (0-11) of a K superblock's scales, held in slot q's words 1-3.
fn kscale_byte(q: u32, i: u32) -> u32 {
    let w = select(select(raw[q * RAW + 3u], raw[q * RAW + 2u], i < 8u), raw[q * RAW + 1u], i < 4u);
    return (w >> (8u * (i & 3u))) & 0xffu;
}

// ggml's get_scale_min_k4 for sub-block j.
fn kscale_min(q: u32, j: u32) -> vec2<f32> {
    if j < 4u {
        return vec2<f32>(f32(kscale_byte(q, j) & 63u), f32(kscale_byte(q, j + 4u) & 63u));
    }
    let sc = (kscale_byte(q, j + 4u) & 15u) | ((kscale_byte(q, j - 4u) >> 6u) << 4u);
    let m = (kscale_byte(q, j + 4u) >> 4u) | ((kscale_byte(q, j) >> 6u) << 4u);
    return vec2<f32>(f32(sc), f32(m));
}

// Q4_K and Q5_K superblocks (144 and 176 bytes: rows and superblocks start at multiples
// of 16): d, dmin and the scales (4 words), then (Q5_K) the high bits (8 words), then the
// chunk's 32 bytes of low bits (8 words).
fn fetch_q4_k(b: u32, c: u32, q: u32) {
    let o = b + (c / 8u) * 144u;
    g_sh[q] = 0u;
    fetch_quads(o, q, 0u, 1u);
    fetch_quads(o + 16u + 32u * ((c % 8u) / 2u), q, 4u, 2u);
}

fn unpack_q4_k(c: u32, q: u32) {
    let j = c % 8u;
    let dd = unpack2x16float(raw[q * RAW]);
    let sm = kscale_min(q, j);
    let d1 = dd.x * sm.x;
    let m1 = dd.y * sm.y;
    let sh = (j & 1u) * 4u;
    for (var l = 0u; l < 32u; l = l + 4u) {
        let w = raw[q * RAW + 4u + l / 4u];
        for (var k = 0u; k < 4u; k = k + 1u) {
            wv[l + k] = d1 * f32((w >> (8u * k + sh)) & 15u) - m1;
        }
    }
}

fn fetch_q5_k(b: u32, c: u32, q: u32) {
    let o = b + (c / 8u) * 176u;
    g_sh[q] = 0u;
    fetch_quads(o, q, 0u, 3u);
    fetch_quads(o + 48u + 32u * ((c % 8u) / 2u), q, 12u, 2u);
}

fn unpack_q5_k(c: u32, q: u32) {
    let j = c % 8u;
    let dd = unpack2x16float(raw[q * RAW]);
    let sm = kscale_min(q, j);
    let d1 = dd.x * sm.x;
    let m1 = dd.y * sm.y;
    let sh = (j & 1u) * 4u;
    for (var l = 0u; l < 32u; l = l + 4u) {
        let w = raw[q * RAW + 12u + l / 4u];
        let h = raw[q * RAW + 4u + l / 4u];
        for (var k = 0u; k < 4u; k = k + 1u) {
            let v = ((w >> (8u * k + sh)) & 15u) + (((h >> (8u * k + j)) & 1u) << 4u);
            wv[l + k] = d1 * f32(v) - m1;
        }
    }
}

// Q6_K superblocks are 210 bytes (starting at even offsets): windows of the chunk's 32
// bytes of low bits (12 words) and of its 32 bytes of high bits (12 words at 12; both lie
// at the superblock's shift), the word holding its two scales (24) and the one holding d
// (25).
fn fetch_q6_k(b: u32, c: u32, q: u32) {
    let o = b + (c / 8u) * 210u;
    let cc = c % 8u;
    let n = cc / 4u;
    fetch_window(o + 128u + 32u * n, q, 12u, 3u);
    fetch_window(o + 64u * n + ((cc % 4u) & 1u) * 32u, q, 0u, 3u);
    fetch_words(o + 192u + 8u * n + 2u * (cc % 4u), q, 24u, 1u);
    fetch_words(o + 208u, q, 25u, 1u);
}

fn unpack_q6_k(c: u32, q: u32) {
    let quarter = (c % 8u) % 4u;
    let r = q * RAW;
    let off = g_sh[q] & 3u;
    let d = unpack2x16float(raw[r + 25u] >> (8u * off)).x;
    let scs = raw[r + 24u] >> (8u * ((off + 2u * quarter) & 3u));
    let sc0 = d * sbyte(scs);
    let sc1 = d * sbyte(scs >> 8u);
    let nsh = (quarter >> 1u) * 4u;
    let hsh = 2u * quarter;
    for (var l = 0u; l < 32u; l = l + 4u) {
        let lo = rw(q, l);
        let hi = rw(q, 48u + l);
        for (var k = 0u; k < 4u; k = k + 1u) {
            let v = ((lo >> (8u * k + nsh)) & 15u) | (((hi >> (8u * k + hsh)) & 3u) << 4u);
            let sc = select(sc1, sc0, l + k < 16u);
            wv[l + k] = sc * (f32(v) - 32.0);
        }
    }
}

// Helpers reading `wq` directly.
fn wbyte(o: u32) -> u32 {
    return (wword(o >> 2u) >> ((o & 3u) * 8u)) & 0xffu;
}

// f16 at an even byte offset.
fn wf16(o: u32) -> f32 {
    return unpack2x16float(wword(o >> 2u) >> ((o & 2u) * 8u)).x;
}

// u32 at an even byte offset.
fn wu32(o: u32) -> u32 {
    let s = (o & 3u) * 8u;
    if s == 0u {
        return wword(o >> 2u);
    }
    return (wword(o >> 2u) >> s) | (wword((o >> 2u) + 1u) << (32u - s));
}
