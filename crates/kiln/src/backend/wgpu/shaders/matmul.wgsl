// out[t, col0 + r] = dot(w[r], x[t]) for the rows of one weight part. One workgroup per
// weight row and tile of up to TT tokens: the row is dequantized once per tile and each
// token's dot is reduced in the same order whatever the tile (batch invariance).
// prm: n_rows, k, n_tok, row_size, out_stride, col0, block sums offset (Q8_1, else 0).
@group(0) @binding(0) var<storage, read> prm: array<u32>;
@group(0) @binding(1) var<storage, read> wq: array<u32>;
@group(0) @binding(2) var<storage, read> xs: array<f32>;
@group(0) @binding(3) var<storage, read_write> ys: array<f32>;

const TT: u32 = 8u;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32 /*SG*/) {
    /*SGI*/
    let r = wid.y * nwg.x + wid.x;
    let n_rows = prm[0];
    if r >= n_rows {
        return;
    }
    let k = prm[1];
    let n_tok = prm[2];
    let base = r * prm[3];
    let t0 = wid.z * TT;
    let tt = min(TT, n_tok - t0);
    var acc: array<f32, 8>;
    let nc = k / 32u;
    for (var c = lid; c < nc; c = c + WG) {
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
        let v = wg_sum(acc[t], lid);
        if lid == 0u {
            ys[(t0 + t) * prm[4] + prm[5] + r] = v;
        }
    }
}
