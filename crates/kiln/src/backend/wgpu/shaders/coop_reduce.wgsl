// The tile matmul's partial sums over KS splits of k (matmul_coop.wgsl), added in split
// order and stored as the matmul stores (kernels.rs matmul_store: outputs, biases; bound
// from 2 on).
// prm: as the matmul's (n_rows, k, n_tok, ..., col0, KS at 6, ...).
@group(0) @binding(0) var<storage, read> prm: array<u32>;
@group(0) @binding(1) var<storage, read> part: array<f32>;
@group(0) @binding(2) var<storage, read_write> ys: array<f32>;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let i = gidx(wid, nwg, lid);
    let n = prm[0] * prm[2];
    if i >= n {
        return;
    }
    var v = 0.0;
    for (var z = 0u; z < prm[6]; z = z + 1u) {
        v = v + part[z * n + i];
    }
    store(i / prm[0], i % prm[0], v);
}
