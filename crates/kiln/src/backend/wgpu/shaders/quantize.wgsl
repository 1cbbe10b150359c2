// Activations quantized to the weight's dot type exactly as the CPU's
// `quant::quantize_activation` does (ggml's x86 rounding), into the layout the matmul
// reads: the i8 quants packed four to a u32 word, row after row, then one f32 scale per
// block ([n_tok, nb]), then (Q8_1) one f32 s = f16(d * sum(q)) per block. F16 mode
// writes the f16-rounded values as f32.
// Each invocation takes four values (one word); a workgroup 256 values, so a Q8_K
// superblock is one workgroup and a 32-block eight neighbouring invocations.
// QuantizeGlu quantizes act(gate) * up, computed here and stored back to the gate rows
// (the deferred glu op; glu.wgsl).
// prm: mode (0 Q8_0, 1 Q8_K, 2 F16, 3 Q8_1), n_tok, k (, glu act).
@group(0) @binding(0) var<storage, read> prm: array<u32>;
@group(0) @binding(2) var<storage, read_write> xq: array<u32>;
//INPUT

var<workgroup> smax: array<f32, 64>;
var<workgroup> ssum: array<i32, 64>;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let w = gidx(wid, nwg, lid);
    let mode = prm[0];
    let n_tok = prm[1];
    let k = prm[2];
    let n_words = n_tok * k / 4u;
    let live = w < n_words;
    let o = 4u * min(w, n_words - 1u);
    let v = x4(o, live);
    if mode == 2u {
        if live {
            for (var i = 0u; i < 4u; i = i + 1u) {
                xq[o + i] = bitcast<u32>(f16r(v[i]));
            }
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
    smax[lid] = amax;
    red[lid] = mx;
    workgroupBarrier();
    var q: vec4<i32>;
    var d: f32;
    if mode == 1u {
        // quantize_row_q8_K_ref: signed max, scale -127/max, clamp at 127.
        amax = 0.0;
        mx = 0.0;
        for (var i = 0u; i < WG; i = i + 1u) {
            if smax[i] > amax {
                amax = smax[i];
                mx = red[i];
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
            amax = max(amax, smax[g + i]);
        }
        d = amax / 127.0;
        let id = select(0.0, 127.0 / amax, amax != 0.0);
        q = clamp(vec4<i32>(round(v * id)), vec4<i32>(-128), vec4<i32>(127));
    }
    ssum[lid] = q.x + q.y + q.z + q.w;
    workgroupBarrier();
    if !live {
        return;
    }
    xq[w] = pack4xI8(q);
    let bs = select(32u, 256u, mode == 1u);
    if (4u * w) % bs != 0u {
        return;
    }
    // The block's first invocation writes its scale (and sum).
    let nb = k / bs;
    let blk = 4u * w / bs;
    if mode == 1u {
        xq[n_words + blk] = bitcast<u32>(d);
        return;
    }
    xq[n_words + blk] = bitcast<u32>(f16r(d));
    if mode == 3u {
        var sum = 0;
        for (var i = 0u; i < 8u; i = i + 1u) {
            sum = sum + ssum[lid + i];
        }
        xq[n_words + n_tok * nb + blk] = bitcast<u32>(f16r(d * f32(sum)));
    }
}
