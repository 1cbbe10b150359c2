// out = x / sqrt(mean(x²) + eps) * w, one workgroup per row; `w` has `wlen` values
// (`dim`, or one head's worth for per-head norms). prm: n_rows, dim, eps, wlen.
@group(0) @binding(0) var<storage, read> prm: array<u32>;
@group(0) @binding(1) var<storage, read> wn: array<f32>;
@group(0) @binding(2) var<storage, read> xs: array<f32>;
@group(0) @binding(3) var<storage, read_write> ys: array<f32>;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32 /*SG*/) {
    /*SGI*/
    let r = wid.y * nwg.x + wid.x;
    if r >= prm[0] {
        return;
    }
    let dim = prm[1];
    let o = r * dim;
    var s = 0.0;
    for (var i = lid; i < dim; i = i + WG) {
        let v = xs[o + i];
        s = s + v * v;
    }
    let sum = wg_sum(s, lid);
    let scale = 1.0 / sqrt(sum / f32(dim) + pf(2u));
    let wlen = prm[3];
    for (var i = lid; i < dim; i = i + WG) {
        ys[o + i] = (xs[o + i] * scale) * wn[i % wlen];
    }
}
