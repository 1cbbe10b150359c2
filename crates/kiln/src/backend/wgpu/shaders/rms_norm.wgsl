// out = x / sqrt(mean(x²) + eps) * w, one workgroup of NT invocations per row (a decode
// step's norm is one workgroup: wide, so it is short); `w` has `wlen` values (`dim`, or
// one head's worth for per-head norms). The CPU sums the f32 squares in f64; a
// float-float (hi + lo) sum is as exact, so the mean rounds to the same f32 in any order.
// AddRmsNorm (kernels.rs rewrites `x_at`, `x_keep`) first adds the residual: x += y *
// scale, stored; each invocation reads back only the values it stored itself. `norm_tail`
// (kernels.rs) is empty, or quantizes the rows for the next matmul (norm_quantize.wgsl).
// prm: n_rows, dim, eps, wlen, scale, quantize mode.
@group(0) @binding(0) var<storage, read> prm: array<u32>;
@group(0) @binding(1) var<storage, read> wn: array<f32>;
@group(0) @binding(2) var<storage, read> xs: array<f32>;
@group(0) @binding(3) var<storage, read_write> ys: array<f32>;

const NT: u32 = 256u;

var<workgroup> red_hi: array<f32, NT>;
var<workgroup> red_lo: array<f32, NT>;

// Value i of the row, and where the fused kernel stores it back (after all loads of a
// step are issued).
fn x_at(i: u32) -> f32 {
    return xs[i];
}

fn x_keep(i: u32, v: f32) {
}

// hi + lo + b as a float-float pair.
fn ff_add(a: vec2<f32>, b: vec2<f32>) -> vec2<f32> {
    let s = two_sum(a.x, b.x);
    return two_sum(s.x, s.y + a.y + b.y);
}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let r = wid.y * nwg.x + wid.x;
    if r >= prm[0] {
        return;
    }
    let dim = prm[1];
    let eps = pf(2u);
    let wlen = prm[3];
    let o = r * dim;
    // Eight values per step, loaded together: a lone workgroup (decode) is latency-bound.
    var s = vec2<f32>(0.0, 0.0);
    for (var i0 = lid; i0 < dim; i0 = i0 + 8u * NT) {
        var v: array<f32, 8>;
        for (var j = 0u; j < 8u; j = j + 1u) {
            v[j] = x_at(o + min(i0 + j * NT, dim - 1u));
        }
        for (var j = 0u; j < 8u; j = j + 1u) {
            if i0 + j * NT < dim {
                x_keep(o + i0 + j * NT, v[j]);
                s = ff_add(s, vec2<f32>(nc(v[j] * v[j]), 0.0));
            }
        }
    }
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
    let fd = f32(dim);
    let hi = red_hi[0];
    let m0 = hi / fd;
    let mean = m0 + (fma_x(-m0, fd, hi) + red_lo[0]) / fd;
    let scale = 1.0 / sqrt(mean + eps);
    for (var i0 = lid; i0 < dim; i0 = i0 + 8u * NT) {
        var v: array<f32, 8>;
        var w: array<f32, 8>;
        for (var j = 0u; j < 8u; j = j + 1u) {
            let i = min(i0 + j * NT, dim - 1u);
            if i0 + j * NT < dim {
                v[j] = xs[o + i];
            }
            w[j] = wn[i % wlen];
        }
        for (var j = 0u; j < 8u; j = j + 1u) {
            if i0 + j * NT < dim {
                ys[o + i0 + j * NT] = nc(v[j] * scale) * w[j];
            }
        }
    }
    norm_tail(r, lid);
}
