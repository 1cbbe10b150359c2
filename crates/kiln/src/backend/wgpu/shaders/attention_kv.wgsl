// Scores over a quantized K cache (attention.wgsl, attention_split.wgsl with KQ): the query
// was rotated by the cache's Walsh-Hadamard transform and quantized to the K type's
// vec_dot_type (kv_rotate.wgsl, then quantize.wgsl's Q8_0 or Q8_1 mode) into `qq`: each
// row's i8 quants four to a word, then every row's block scales, then (Q8_1) their sums.
// A key's score is the type's dot product with it in the CPU's arithmetic
// (quant/simd/avx2.rs, quant/iquants.rs): exact integer sums of four quants per lane;
// Q8_0, Q4_0, Q4_1, Q5_1 keep eight lane chains fma(d_k * d_q, lane, acc), summed as
// hsum8 (plus Q4_1/Q5_1's sum of m_k * s_q); Q5_0 and IQ4_NL add each block's whole sum
// times d_k * d_q, unfused (ggml's generic steps).
@group(0) @binding(5) var<storage, read> qq: array<u32>;

const K_GENERIC: bool = kc_TY == 3u || kc_TY == 5u;

// The dot product of the head's blocks at byte `o` with query row `row`.
fn k_score(o: u32, row: u32, hd: u32) -> f32 {
    let nb = hd / 32u;
    let n_rows = prm[0] * prm[1];
    let nw = n_rows * hd / 4u;
    let xw = row * hd / 4u;
    var acc: array<f32, 8>;
    var sum = 0.0;
    for (var b = 0u; b < nb; b = b + 1u) {
        let ob = o + b * kc_BB;
        let d = kc_f16(ob) * bitcast<f32>(qq[nw + row * nb + b]);
        var s = 0;
        for (var l = 0u; l < 8u; l = l + 1u) {
            let li = dot(kc_lane(ob, l), unpack4xI8(qq[xw + 8u * b + l]));
            if K_GENERIC {
                s = s + li;
            } else {
                acc[l] = fma_x(d, f32(li), acc[l]);
            }
        }
        if K_GENERIC {
            sum = sum + nc(d * f32(s));
        } else if kc_MIN {
            sum = sum + nc(kc_f16(ob + 2u) * bitcast<f32>(qq[nw + n_rows * nb + row * nb + b]));
        }
    }
    if K_GENERIC {
        return sum;
    }
    return hsum8(acc) + sum;
}
