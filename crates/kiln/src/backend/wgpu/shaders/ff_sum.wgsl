// RMSNorm's float-float sum of squares and its scale, shared by rms_norm.wgsl, the vec
// matmul's norm prologue (matmul_prologue.wgsl) and the RoPE stores' head norms. The
// includer defines NT (its workgroup size).
var<workgroup> red_hi: array<f32, NT>;
var<workgroup> red_lo: array<f32, NT>;

// hi + lo + b as a float-float pair.
fn ff_add(a: vec2<f32>, b: vec2<f32>) -> vec2<f32> {
    let s = two_sum(a.x, b.x);
    return two_sum(s.x, s.y + a.y + b.y);
}

fn ff_squares(s: vec2<f32>, v: vec4<f32>) -> vec2<f32> {
    var t = s;
    for (var i = 0u; i < 4u; i = i + 1u) {
        t = ff_add(t, vec2<f32>(nc(v[i] * v[i]), 0.0));
    }
    return t;
}

// The workgroup's float-float total of every invocation's `s`, by a halving tree;
// `ff_total` (kernels.rs) takes it or a subgroup butterfly.
fn ff_total_tree(s: vec2<f32>, lid: u32) -> vec2<f32> {
    red_hi[lid] = s.x;
    red_lo[lid] = s.y;
    workgroupBarrier();
    for (var h = NT / 2u; h > 0u; h = h >> 1u) {
        if lid < h {
            let t = ff_add(vec2<f32>(red_hi[lid], red_lo[lid]), vec2<f32>(red_hi[lid + h], red_lo[lid + h]));
            red_hi[lid] = t.x;
            red_lo[lid] = t.y;
        }
        workgroupBarrier();
    }
    return vec2<f32>(red_hi[0], red_lo[0]);
}

// 1 / sqrt(mean + eps) from the float-float total of a row's `dim` squares: the mean is the
// f32 nearest the exact one, whatever order the total was taken in.
fn rms_scale(tot: vec2<f32>, dim: u32, eps: f32) -> f32 {
    let fd = f32(dim);
    let m0 = tot.x / fd;
    let mean = m0 + (fma_x(-m0, fd, tot.x) + tot.y) / fd;
    return 1.0 / sqrt(mean + eps);
}
