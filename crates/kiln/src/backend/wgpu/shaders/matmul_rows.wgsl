// out[t, col0 + r] = dot(w[r], x[t]) with one invocation per weight row: no barriers, the
// CPU's order (dot.wgsl). Software adapters (lavapipe) run this far faster than a
// workgroup per row. prm: n_rows, k, n_tok, row_size, out_stride, col0, x scales word,
// x sums word, first row in the weight buffer, output row boundaries (matmul_store).
@group(0) @binding(0) var<storage, read> prm: array<u32>;
@group(0) @binding(1) var<storage, read> wq: array<u32>;
@group(0) @binding(2) var<storage, read> xq: array<u32>;
@group(0) @binding(3) var<storage, read_write> ys: array<f32>;

const TT: u32 = 8u;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let r = (wid.y * nwg.x + wid.x) * WG + lid;
    if r >= prm[0] {
        return;
    }
    let t0 = wid.z * TT;
    let tt = min(TT, prm[2] - t0);
    for (var t = t0; t < t0 + tt; t = t + 1u) {
        store(t, r, row_dot((prm[8] + r) * prm[3], t, prm[1]));
    }
}
