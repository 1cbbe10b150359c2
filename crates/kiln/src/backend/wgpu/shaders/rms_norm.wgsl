// out = x / sqrt(mean(x²) + eps) * w over rows of `dim`; `w` has `wlen` values (`dim`, or
// one head's worth for per-head norms). A row is split into slices of NT words (four
// values each), one workgroup per slice: every workgroup sums the squares of the whole
// row (a few loads per invocation, all in flight at once), then normalizes its own slice,
// so a decode step's norm is several short workgroups, not one long one. The CPU sums the
// f32 squares in f64; a float-float (hi + lo) sum is as exact, so the mean rounds to the
// same f32 in any order (a tree, or with subgroups a butterfly per subgroup). `x_at` and
// `x_keep` (kernels.rs NORM_IN, NORM_ADD_IN) read the row, with the residual add in front
// (x + y * scale, stored to the other residual buffer: other workgroups still read x).
// `norm_tail` (kernels.rs) is empty, or quantizes the slice for the next matmul
// (norm_quantize.wgsl).
// prm: n_rows, dim, eps, wlen, scale, quantize mode.
@group(0) @binding(0) var<storage, read> prm: array<u32>;
@group(0) @binding(1) var<storage, read> wn: array<f32>;
@group(0) @binding(3) var<storage, read_write> ys: array<vec4<f32>>;
//INPUT

const NT: u32 = 256u;

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32 /*SG*/) {
    /*SGI*/
    let dim = prm[1];
    let nw = dim / 4u;
    let n_slices = (nw + NT - 1u) / NT;
    let g = wid.y * nwg.x + wid.x;
    let r = g / n_slices;
    if r >= prm[0] {
        return;
    }
    let slice = g % n_slices;
    let eps = pf(2u);
    let wlen = prm[3];
    let o = r * nw;
    // Four words per step, loaded together; this slice's word is kept.
    var s = vec2<f32>(0.0, 0.0);
    var mine = vec4<f32>(0.0);
    for (var c0 = 0u; c0 < n_slices; c0 = c0 + 4u) {
        var v: array<vec4<f32>, 4>;
        for (var c = 0u; c < 4u; c = c + 1u) {
            v[c] = x_at(o + min((c0 + c) * NT + lid, nw - 1u));
        }
        for (var c = 0u; c < 4u; c = c + 1u) {
            if (c0 + c) * NT + lid < nw {
                s = ff_squares(s, v[c]);
                if c0 + c == slice {
                    mine = v[c];
                }
            }
        }
    }
    let scale = rms_scale(ff_total(s, lid), dim, eps);
    let j = slice * NT + lid;
    let live = j < nw;
    var y = vec4<f32>(0.0);
    if live {
        x_keep(o + j, mine);
        y = rms_apply(mine, scale, j, wlen);
        ys[o + j] = y;
    }
    norm_tail(o + min(j, nw - 1u), y, live, lid);
}
