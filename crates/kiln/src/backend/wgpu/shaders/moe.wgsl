// Mixture-of-experts ops with the CPU backend's arithmetic (backend/cpu/moe.rs): the
// router's top-k, the weighted sum of the experts' outputs, a shared expert's gated add.
// Each entry point's three buffers are bound at 1, 2, 3.
@group(0) @binding(0) var<storage, read> prm: array<u32>;
@group(0) @binding(1) var<storage, read_write> b1: array<f32>;
@group(0) @binding(2) var<storage, read_write> b2: array<f32>;
@group(0) @binding(3) var<storage, read_write> b3: array<f32>;

// The most experts a router scores (a token's scores are kept per invocation).
const MAX_EXPERTS: u32 = 256u;
var<private> p: array<f32, MAX_EXPERTS>;

// ggml's _mm512_reduce_add_ps of p[o..o + 16] (GCC's order): halves, quarters, then pairs.
fn reduce16(o: u32) -> f32 {
    var a: array<f32, 8>;
    for (var i = 0u; i < 8u; i = i + 1u) {
        a[i] = p[o + i + 8u] + p[o + i];
    }
    return (a[0] + a[4] + (a[2] + a[6])) + (a[1] + a[5] + (a[3] + a[7]));
}

// (hi, lo) + v, a float-float sum standing for the CPU's f64 one.
fn ff_add1(s: vec2<f32>, v: f32) -> vec2<f32> {
    let t = two_sum(s.x, v);
    return vec2<f32>(t.x, s.y + t.y);
}

// route: a token per invocation. Scores of the row's n experts (softmax: ggml's vector
// expf sixteen at a time, each group's sum reduced in f32, the groups and the libm tail
// summed in f64, every value times 1 / sum; or each its sigmoid), then the top k, highest
// first (the lowest index on ties), their weights divided by their f64 sum (at least the
// least normal f16) where `norm`, then times `scale`.
// prm: rows, n_expert, k, gating (0 softmax, 1 sigmoid), norm, scale. b1 the router's
// logits, b2 the chosen ids (as f32), b3 their weights.
@compute @workgroup_size(64)
fn route(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
         @builtin(local_invocation_index) lid: u32) {
    let t = gidx(wid, nwg, lid);
    if t >= prm[0] {
        return;
    }
    let n = prm[1];
    let k = prm[2];
    let base = t * n;
    if prm[3] == 0u {
        var mx = bitcast<f32>(0xff800000u);
        for (var i = 0u; i < n; i = i + 1u) {
            mx = max(mx, b1[base + i]);
        }
        var sum = vec2<f32>(0.0, 0.0);
        let body = n / 16u * 16u;
        for (var g = 0u; g < body; g = g + 16u) {
            for (var i = g; i < g + 16u; i = i + 1u) {
                p[i] = expf_ggml(b1[base + i] - mx);
            }
            sum = ff_add1(sum, reduce16(g));
        }
        for (var i = body; i < n; i = i + 1u) {
            p[i] = exp_acc(b1[base + i] - mx);
            sum = ff_add1(sum, p[i]);
        }
        // 1 / (hi + lo) rounded once: 1 / hi, then one Newton step on the exact residual.
        let q = 1.0 / sum.x;
        let r = fma_x(-q, sum.x, 1.0) - nc(q * sum.y);
        let inv = fma_x(q, r, q);
        for (var i = 0u; i < n; i = i + 1u) {
            p[i] = p[i] * inv;
        }
    } else {
        for (var i = 0u; i < n; i = i + 1u) {
            p[i] = 1.0 / (1.0 + exp_acc(-b1[base + i]));
        }
    }
    let o = t * k;
    var wsum = vec2<f32>(0.0, 0.0);
    for (var j = 0u; j < k; j = j + 1u) {
        // Scores are >= 0: a taken one is set to -1.
        var best = 0u;
        var bv = -1.0;
        for (var i = 0u; i < n; i = i + 1u) {
            if p[i] > bv {
                best = i;
                bv = p[i];
            }
        }
        p[best] = -1.0;
        b2[o + j] = f32(best);
        b3[o + j] = bv;
        wsum = ff_add1(wsum, bv);
    }
    if prm[4] == 1u {
        let s = max(wsum.x + wsum.y, 6.1035156e-5);
        for (var j = 0u; j < k; j = j + 1u) {
            b3[o + j] = b3[o + j] / s;
        }
    }
    let scale = pf(5u);
    if scale != 0.0 && scale != 1.0 {
        for (var j = 0u; j < k; j = j + 1u) {
            b3[o + j] = b3[o + j] * scale;
        }
    }
}

// sum: out[t] = sum over j of w[t, j] * y[t * k + j], each product rounded, added in slot
// order. prm: rows * dim, dim, k. b1 y, b2 the weights, b3 out.
@compute @workgroup_size(64)
fn sum(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
       @builtin(local_invocation_index) lid: u32) {
    let i = gidx(wid, nwg, lid);
    if i >= prm[0] {
        return;
    }
    let dim = prm[1];
    let k = prm[2];
    let t = i / dim;
    let c = i % dim;
    var o = b1[t * k * dim + c] * b2[t * k];
    for (var j = 1u; j < k; j = j + 1u) {
        o = o + nc(b1[(t * k + j) * dim + c] * b2[t * k + j]);
    }
    b3[i] = o;
}

// gated_add: x[t] += y[t] * sigmoid(g[t]), the sigmoid as ggml's silu(g) / g.
// prm: rows * dim, dim. b1 x, b2 y, b3 g.
@compute @workgroup_size(64)
fn gated_add(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
             @builtin(local_invocation_index) lid: u32) {
    let i = gidx(wid, nwg, lid);
    if i >= prm[0] {
        return;
    }
    let g = b3[i / prm[1]];
    let gate = (g / (1.0 + exp_acc(-g))) / g;
    b1[i] = b1[i] + nc(b2[i] * gate);
}
