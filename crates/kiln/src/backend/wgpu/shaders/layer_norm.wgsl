// LayerNorm: out = (x - mean) / sqrt(var + eps) * w (+ b) over rows of `dim`, a workgroup
// per row, in the CPU's arithmetic (backend/cpu/ops.rs `layer_norm`, ggml's): the mean
// from the f64 sum of the row, the variance from the centered squares summed sixteen at
// a time in f32 as `_mm512_reduce_add_ps` does, those sums (and the tail's squares one at
// a time) added in f64. The f64 sums are float-float sums here (ff_sum.wgsl): as exact, so
// they round to the same f32 in any order.
// prm: n_rows, dim, eps, whether `bn` holds a bias.
@group(0) @binding(0) var<storage, read> prm: array<u32>;
@group(0) @binding(1) var<storage, read> wn: array<f32>;
@group(0) @binding(2) var<storage, read> bn: array<f32>;
@group(0) @binding(3) var<storage, read> xs: array<f32>;
@group(0) @binding(4) var<storage, read_write> ys: array<f32>;

const NT: u32 = 256u;

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32 /*SG*/) {
    /*SGI*/
    let r = wid.y * nwg.x + wid.x;
    if r >= prm[0] {
        return;
    }
    let dim = prm[1];
    let o = r * dim;
    var s = vec2<f32>(0.0, 0.0);
    for (var i = lid; i < dim; i = i + NT) {
        s = ff_add(s, vec2<f32>(xs[o + i], 0.0));
    }
    // The f64 sum rounded to f32, then divided in f32.
    let mean = ff_total(s, lid).x / f32(dim);
    workgroupBarrier();
    let n16 = dim / 16u;
    var v = vec2<f32>(0.0, 0.0);
    for (var c = lid; c < n16; c = c + NT) {
        var sq: array<f32, 16>;
        for (var l = 0u; l < 16u; l = l + 1u) {
            let d = xs[o + 16u * c + l] - mean;
            sq[l] = nc(d * d);
        }
        for (var l = 0u; l < 8u; l = l + 1u) {
            sq[l] = sq[l + 8u] + sq[l];
        }
        for (var l = 0u; l < 4u; l = l + 1u) {
            sq[l] = sq[l + 4u] + sq[l];
        }
        v = ff_add(v, vec2<f32>((sq[0] + sq[2]) + (sq[1] + sq[3]), 0.0));
    }
    for (var i = 16u * n16 + lid; i < dim; i = i + NT) {
        let d = xs[o + i] - mean;
        v = ff_add(v, vec2<f32>(nc(d * d), 0.0));
    }
    // 1 / sqrt(variance + eps), the variance the f32 nearest the mean of the squares.
    let scale = rms_scale(ff_total(v, lid), dim, pf(2u));
    let bias = prm[3] != 0u;
    for (var i = lid; i < dim; i = i + NT) {
        let y = nc(nc((xs[o + i] - mean) * scale) * wn[i]);
        ys[o + i] = select(y, y + bn[i], bias);
    }
}
