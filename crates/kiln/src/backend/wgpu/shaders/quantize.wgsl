// Activations rounded through the weight's dot type (as ggml quantizes them before a
// matmul) and written back as f32: x' = d * q. One invocation per block.
// prm: mode (0 Q8_0, 1 Q8_K, 2 F16, 3 Q8_1), n_values. Q8_1 also stores each block's
// f16(d * sum(q)) after the n_values values.
@group(0) @binding(0) var<storage, read> prm: array<u32>;
@group(0) @binding(1) var<storage, read> xs: array<f32>;
@group(0) @binding(2) var<storage, read_write> xq: array<f32>;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let blk = gidx(wid, nwg, lid);
    let mode = prm[0];
    let bs = select(32u, 256u, mode == 1u);
    if blk >= prm[1] / bs {
        return;
    }
    let o = blk * bs;
    if mode == 2u {
        for (var i = 0u; i < 32u; i = i + 1u) {
            xq[o + i] = f16r(xs[o + i]);
        }
        return;
    }
    if mode == 0u || mode == 3u {
        // ggml's AVX2 quantize_row_q8_0/q8_1: scale 127/amax, round half to even.
        var amax = 0.0;
        for (var i = 0u; i < 32u; i = i + 1u) {
            amax = max(amax, abs(xs[o + i]));
        }
        let d32 = amax / 127.0;
        let d = f16r(d32);
        let id = select(0.0, 127.0 / amax, amax != 0.0);
        var sum = 0.0;
        for (var i = 0u; i < 32u; i = i + 1u) {
            let q = clamp(round(xs[o + i] * id), -128.0, 127.0);
            sum = sum + q;
            xq[o + i] = d * q;
        }
        if mode == 3u {
            // ggml rounds s = d * sum(q) from the unrounded scale.
            xq[prm[1] + blk] = f16r(d32 * sum);
        }
        return;
    }
    // quantize_row_q8_K_ref: signed max, scale -127/max, clamp at 127.
    var amax = 0.0;
    var mx = 0.0;
    for (var i = 0u; i < 256u; i = i + 1u) {
        let v = xs[o + i];
        if abs(v) > amax {
            amax = abs(v);
            mx = v;
        }
    }
    if amax == 0.0 {
        for (var i = 0u; i < 256u; i = i + 1u) {
            xq[o + i] = 0.0;
        }
        return;
    }
    let iscale = -127.0 / mx;
    let d = 1.0 / iscale;
    for (var i = 0u; i < 256u; i = i + 1u) {
        xq[o + i] = d * min(round(iscale * xs[o + i]), 127.0);
    }
}
