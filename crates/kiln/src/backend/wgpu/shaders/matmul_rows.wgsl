// out[t, col0 + r] = dot(w[r], x[t]) with one invocation per weight row and tile of up to
// TT tokens: no barriers, chunks summed in row order. Software adapters (lavapipe) run
// this far faster than a workgroup per row; the order is batch-independent too.
// prm: n_rows, k, n_tok, row_size, out_stride, col0, block sums offset (Q8_1, else 0).
@group(0) @binding(0) var<storage, read> prm: array<u32>;
@group(0) @binding(1) var<storage, read> wq: array<u32>;
@group(0) @binding(2) var<storage, read> xs: array<f32>;
@group(0) @binding(3) var<storage, read_write> ys: array<f32>;

const TT: u32 = 8u;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let r = (wid.y * nwg.x + wid.x) * WG + lid;
    if r >= prm[0] {
        return;
    }
    let k = prm[1];
    let base = r * prm[3];
    let t0 = wid.z * TT;
    let tt = min(TT, prm[2] - t0);
    var acc: array<f32, 8>;
    let nc = k / 32u;
    for (var c = 0u; c < nc; c = c + 1u) {
        load_chunk(base, c);
        for (var t = 0u; t < tt; t = t + 1u) {
            let xo = (t0 + t) * k + c * 32u;
            var s = 0.0;
            for (var i = 0u; i < 32u; i = i + 1u) {
                s = s + wv[i] * xs[xo + i];
            }
            if prm[6] != 0u {
                s = s + wmin * xs[prm[6] + (t0 + t) * nc + c];
            }
            acc[t] = acc[t] + s;
        }
    }
    for (var t = 0u; t < tt; t = t + 1u) {
        ys[(t0 + t) * prm[4] + prm[5] + r] = acc[t];
    }
}
