// Activations quantized to the weight's dot type exactly as the CPU's
// `quant::quantize_activation` does (ggml's x86 rounding), into the layout the matmul
// reads: the i8 quants packed four to a u32 word, row after row, then one f32 scale per
// block ([n_tok, nb]), then per block (Q8_1) one f32 s = f16(d * sum(q)), (Q8_0) the i32
// sum of its quants, or (Q8_K) the i32 sums of each 16 quants. F16 mode
// writes the f16-rounded values as f32, F16 packed two to a word (the tile matmul's
// activations). Shared by quantize.wgsl and the norm kernels'
// fused tail (kernels.rs NORM_QUANTIZE); the includer declares `xq`.
// An invocation takes four values (one word): a 32-block is eight neighbouring
// invocations, a Q8_K superblock 64 (a workgroup has 64 or 256).
// Modes: 0 Q8_0, 1 Q8_K, 2 F16, 3 Q8_1, 4 F16 packed.

var<workgroup> q_amax: array<f32, 256>;
var<workgroup> q_mx: array<f32, 256>;
var<workgroup> q_sum: array<i32, 256>;

// Word w of n_tok rows of k values (v its values; `live` false past the end), by
// invocation lid. Every invocation of the workgroup calls it (it has barriers).
fn quantize_word(w: u32, v: vec4<f32>, live: bool, lid: u32, mode: u32, n_tok: u32, k: u32) {
    let n_words = n_tok * k / 4u;
    let o = 4u * w;
    if mode == 2u {
        if live {
            for (var i = 0u; i < 4u; i = i + 1u) {
                xq[o + i] = bitcast<u32>(f16r(v[i]));
            }
        }
        return;
    }
    if mode == 4u {
        if live {
            xq[2u * w] = pack2x16float(v.xy);
            xq[2u * w + 1u] = pack2x16float(v.zw);
        }
        return;
    }
    // Largest |v| of this word, and (Q8_K) the first value reaching it.
    var amax = 0.0;
    var mx = 0.0;
    for (var i = 0u; i < 4u; i = i + 1u) {
        if abs(v[i]) > amax {
            amax = abs(v[i]);
            mx = v[i];
        }
    }
    q_amax[lid] = amax;
    q_mx[lid] = mx;
    workgroupBarrier();
    var q: vec4<i32>;
    var d: f32;
    if mode == 1u {
        // quantize_row_q8_K_ref: signed max, scale -127/max, clamp at 127. The first value
        // reaching the superblock's largest |v|, as one scan of its 64 words finds it: each
        // eight words' first, then the eight octets' first, in order (16 reads, not 64).
        var a8 = 0.0;
        var m8 = 0.0;
        let o8 = lid & ~7u;
        for (var i = o8; i < o8 + 8u; i = i + 1u) {
            if q_amax[i] > a8 {
                a8 = q_amax[i];
                m8 = q_mx[i];
            }
        }
        workgroupBarrier();
        q_amax[lid] = a8;
        q_mx[lid] = m8;
        workgroupBarrier();
        amax = 0.0;
        mx = 0.0;
        let g = lid & ~63u;
        for (var i = g; i < g + 64u; i = i + 8u) {
            if q_amax[i] > amax {
                amax = q_amax[i];
                mx = q_mx[i];
            }
        }
        if amax == 0.0 {
            q = vec4<i32>(0);
            d = 0.0;
        } else {
            let iscale = -127.0 / mx;
            d = 1.0 / iscale;
            q = min(vec4<i32>(round(iscale * v)), vec4<i32>(127));
        }
    } else {
        // ggml's AVX2 quantize_row_q8_0/q8_1: scale 127/amax, round half to even.
        let g = lid & ~7u;
        amax = 0.0;
        for (var i = 0u; i < 8u; i = i + 1u) {
            amax = max(amax, q_amax[g + i]);
        }
        d = amax / 127.0;
        let id = select(0.0, 127.0 / amax, amax != 0.0);
        q = clamp(vec4<i32>(round(v * id)), vec4<i32>(-128), vec4<i32>(127));
    }
    q_sum[lid] = q.x + q.y + q.z + q.w;
    workgroupBarrier();
    if !live {
        return;
    }
    xq[w] = pack4xI8(q);
    let bs = select(32u, 256u, mode == 1u);
    let n_blocks = n_tok * k / bs;
    if mode == 1u && o % 16u == 0u {
        // Q8_K: the sum of each 16 quants (matmul_vec's K units take their offset and
        // minimum terms from them, as ggml's bsums).
        let s16 = q_sum[lid] + q_sum[lid + 1u] + q_sum[lid + 2u] + q_sum[lid + 3u];
        xq[n_words + n_blocks + o / 16u] = bitcast<u32>(s16);
    }
    if o % bs != 0u {
        return;
    }
    // The block's first invocation writes its scale (and sum).
    let blk = o / bs;
    if mode == 1u {
        xq[n_words + blk] = bitcast<u32>(d);
        return;
    }
    xq[n_words + blk] = bitcast<u32>(f16r(d));
    var sum = 0;
    for (var i = 0u; i < 8u; i = i + 1u) {
        sum = sum + q_sum[lid + i];
    }
    // Q8_1: s = f16(d * sum); Q8_0: the integer sum (matmul_vec's Q4_0 offset term).
    xq[n_words + n_blocks + blk] = select(bitcast<u32>(sum), bitcast<u32>(f16r(d * f32(sum))), mode == 3u);
}
