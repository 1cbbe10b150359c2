// The blocks of a quantized KV cache (crate::kv::types), read where they lie. A template:
// kernels.rs names the cache (`KV_` becomes kc_, vc_ or kq_), gives its word reader
// `KV_word(i)` and its type KV_TY (0 Q8_0, 1 Q4_0, 2 Q4_1, 3 Q5_0, 4 Q5_1, 5 IQ4_NL), and
// KV_BB, its block bytes. A block of 32 values at byte `o` (even) holds the f16 scale d
// (Q4_1, Q5_1: then the f16 minimum m), the fifth bits (Q5_0, Q5_1: 32 bits) and the
// quants (four-bit formats: byte j holds values j and j + 16), as ggml lays them out.

fn KV_byte(o: u32) -> u32 {
    return (KV_word(o >> 2u) >> ((o & 3u) * 8u)) & 0xffu;
}

// The f16 at an even byte offset.
fn KV_f16(o: u32) -> f32 {
    return unpack2x16float(KV_word(o >> 2u) >> ((o & 2u) * 8u)).x;
}

// The u32 at an even byte offset.
fn KV_u32(o: u32) -> u32 {
    let s = (o & 3u) * 8u;
    if s == 0u {
        return KV_word(o >> 2u);
    }
    return (KV_word(o >> 2u) >> s) | (KV_word((o >> 2u) + 1u) << (32u - s));
}

// Whether the type stores a minimum (its values are d * q + m, q unsigned).
const KV_MIN: bool = KV_TY == 2u || KV_TY == 4u;

// Quants 4l..4l+3 of the block at `o` as ggml's dot products take them: signed (the
// offset taken out: Q4_0 8, Q5_0 16; IQ4_NL its table's values), unsigned for Q4_1 and
// Q5_1 (their minimum is apart).
fn KV_lane(o: u32, l: u32) -> vec4<i32> {
    if KV_TY == 0u {
        return unpack4xI8(KV_u32(o + 2u + 4u * l));
    }
    // The four-bit formats: quants j < 16 in the low nibbles of bytes j, the others in
    // the high nibbles of bytes j - 16.
    let qs = select(select(2u, 4u, KV_TY == 2u), select(6u, 8u, KV_TY == 4u), KV_TY == 3u || KV_TY == 4u);
    let j = (4u * l) % 16u;
    let nib = vec4<i32>(unpack4xU8((KV_u32(o + qs + j) >> (4u * (l / 4u))) & 0x0f0f0f0fu));
    if KV_TY == 5u {
        return vec4<i32>(kv_iq4nl[nib.x], kv_iq4nl[nib.y], kv_iq4nl[nib.z], kv_iq4nl[nib.w]);
    }
    if KV_TY == 3u || KV_TY == 4u {
        // The fifth bits of quants 4l..4l+3 (bit i of the 32 at byte 2 or 4).
        let hb = KV_u32(o + select(2u, 4u, KV_TY == 4u)) >> (4u * l);
        let h = vec4<i32>(vec4<u32>(hb & 1u, (hb >> 1u) & 1u, (hb >> 2u) & 1u, (hb >> 3u) & 1u) << vec4<u32>(4u));
        return nib + h - select(vec4<i32>(16), vec4<i32>(0), KV_TY == 4u);
    }
    return nib - select(vec4<i32>(8), vec4<i32>(0), KV_TY == 2u);
}

// Values e and e + 1 (e even) of the row of blocks at `o`, as ggml's to_float gives them:
// q * d, plus m for the types with a minimum (rounded before the add).
fn KV_pair(o: u32, e: u32) -> vec2<f32> {
    let ob = o + (e / 32u) * KV_BB;
    let j = e % 32u;
    let q = KV_lane(ob, j / 4u);
    let d = KV_f16(ob);
    var v = vec2<f32>(f32(q[j % 4u]) * d, f32(q[j % 4u + 1u]) * d);
    if KV_MIN {
        let m = KV_f16(ob + 2u);
        v = vec2<f32>(nc(v.x) + m, nc(v.y) + m);
    }
    return v;
}
