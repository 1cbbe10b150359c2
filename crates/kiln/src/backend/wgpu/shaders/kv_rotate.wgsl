// Rows rotated by a quantized KV cache's Walsh-Hadamard transform (hadamard.wgsl), an
// invocation per group of n values, out of place: the query before it is quantized for
// the K cache's dot products (each token's rows first times its q multiplier, as the
// CPU's attention scales q before rotating it), and the attention's output, rotated back
// by the V cache's. n = 32 with `rotated` 0: the multiplier alone.
// prm: n_rows, row length, n, rotated, scale (f32 bits), rows per token, then each
// token's multiplier (f32 bits).
@group(0) @binding(0) var<storage, read> prm: array<u32>;
@group(0) @binding(1) var<storage, read> xs: array<f32>;
@group(0) @binding(2) var<storage, read_write> ys: array<f32>;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let g = gidx(wid, nwg, lid);
    let len = prm[1];
    let n = prm[2];
    let per = len / n;
    if g >= prm[0] * per {
        return;
    }
    let row = g / per;
    let at = row * len + (g % per) * n;
    let mult = pf(6u + row / prm[5]);
    for (var i = 0u; i < n; i = i + 1u) {
        hv[i] = xs[at + i] * mult;
    }
    if prm[3] != 0u {
        hadamard(n, pf(4u));
    }
    for (var i = 0u; i < n; i = i + 1u) {
        ys[at + i] = hv[i];
    }
}
