// Rows rotated by a quantized KV cache's Walsh-Hadamard transform (hadamard.wgsl), a
// workgroup per 256 values (whole groups of n), out of place: the query before the K
// cache's dot products (each token's rows first times its q multiplier, as the CPU's
// attention scales q before rotating it), and the attention's output, rotated back by the
// V cache's. n = 32 with `rotated` 0: the multiplier alone. With `rot_tail`'s quantization
// (kernels.rs: KvRotate(true)) the rotated values are also quantized as quantize.wgsl does
// (quantize_core.wgsl, mode prm[8]), four a lane: the query to the K type's dot type, or
// the output for the matmul that reads it (a deferred op's tail, as attention's).
// prm: n_rows, row length, n, rotated, scale (f32 bits), rows per token, -, -, mode, then
// each token's multiplier (f32 bits).
@group(0) @binding(0) var<storage, read> prm: array<u32>;
@group(0) @binding(1) var<storage, read> xs: array<f32>;
@group(0) @binding(2) var<storage, read_write> ys: array<f32>;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let len = prm[1];
    let total = prm[0] * len;
    let w = 64u * (wid.y * nwg.x + wid.x) + lid;
    let live = 4u * w < total;
    for (var e = 0u; e < 4u; e = e + 1u) {
        let x = min(4u * w + e, total - 1u);
        wh[4u * lid + e] = select(0.0, xs[x] * pf(9u + x / len / prm[5]), live);
    }
    workgroupBarrier();
    if prm[3] != 0u {
        hadamard(prm[2], 256u, pf(4u), lid);
    }
    let v = vec4<f32>(wh[4u * lid], wh[4u * lid + 1u], wh[4u * lid + 2u], wh[4u * lid + 3u]);
    if live {
        for (var e = 0u; e < 4u; e = e + 1u) {
            ys[4u * w + e] = v[e];
        }
    }
    rot_tail(w, v, live, lid);
}
