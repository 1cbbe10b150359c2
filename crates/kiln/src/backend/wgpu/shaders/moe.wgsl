// Mixture-of-experts ops with the CPU backend's arithmetic (backend/cpu/moe.rs): the
// router's top-k, the weighted sum of the experts' outputs, a shared expert's gated add.
// Each entry point's three buffers are bound at 1, 2, 3.
@group(0) @binding(0) var<storage, read> prm: array<u32>;
@group(0) @binding(1) var<storage, read_write> b1: array<f32>;
@group(0) @binding(2) var<storage, read_write> b2: array<f32>;
@group(0) @binding(3) var<storage, read_write> b3: array<f32>;

// The most experts a router scores (a workgroup's invocations, one expert each).
const MAX_EXPERTS: u32 = 256u;
// A token's scores, the reductions' values and indices, the softmax's group sums.
var<workgroup> sp: array<f32, MAX_EXPERTS>;
var<workgroup> rv: array<f32, MAX_EXPERTS>;
var<workgroup> ri: array<u32, MAX_EXPERTS>;
var<workgroup> gs: array<f32, 16>;

// ggml's _mm512_reduce_add_ps of sp[o..o + 16] (GCC's order): halves, quarters, then pairs.
fn reduce16(o: u32) -> f32 {
    var a: array<f32, 8>;
    for (var i = 0u; i < 8u; i = i + 1u) {
        a[i] = sp[o + i + 8u] + sp[o + i];
    }
    return (a[0] + a[4] + (a[2] + a[6])) + (a[1] + a[5] + (a[3] + a[7]));
}

// (hi, lo) + v, a float-float sum standing for the CPU's f64 one.
fn ff_add1(s: vec2<f32>, v: f32) -> vec2<f32> {
    let t = two_sum(s.x, v);
    return vec2<f32>(t.x, s.y + t.y);
}

// route: a token per workgroup, an expert per invocation. Scores of the row's n experts
// (softmax: ggml's vector expf sixteen at a time, each group's sum reduced in f32, the
// groups and the libm tail summed in f64 in order, every value times 1 / sum; or each its
// sigmoid), then the top k, highest first (the lowest index on ties: a tree of exact
// comparisons), their weights divided by their f64 sum (at least the least normal f16)
// where `norm`, then times `scale`. Every invocation reaches every barrier.
// prm: rows, n_expert, k, gating (0 softmax, 1 sigmoid), norm, scale. b1 the router's
// logits, b2 the chosen ids (as f32), b3 their weights.
@compute @workgroup_size(256)
fn route(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
         @builtin(local_invocation_index) i: u32) {
    let t = wid.y * nwg.x + wid.x;
    if t >= prm[0] {
        return;
    }
    let n = prm[1];
    let k = prm[2];
    let live = i < n;
    let x = b1[t * n + min(i, n - 1u)];
    if prm[3] == 0u {
        rv[i] = select(bitcast<f32>(0xff800000u), x, live);
        workgroupBarrier();
        for (var s = MAX_EXPERTS / 2u; s > 0u; s = s >> 1u) {
            if i < s {
                rv[i] = max(rv[i], rv[i + s]);
            }
            workgroupBarrier();
        }
        let mx = rv[0];
        let body = n / 16u * 16u;
        var e = 0.0;
        if i < body {
            e = expf_ggml(x - mx);
        } else if live {
            e = exp_acc(x - mx);
        }
        sp[i] = e;
        workgroupBarrier();
        if i < body / 16u {
            gs[i] = reduce16(16u * i);
        }
        workgroupBarrier();
        if i == 0u {
            var sum = vec2<f32>(0.0, 0.0);
            for (var g = 0u; g < body / 16u; g = g + 1u) {
                sum = ff_add1(sum, gs[g]);
            }
            for (var j = body; j < n; j = j + 1u) {
                sum = ff_add1(sum, sp[j]);
            }
            // 1 / (hi + lo) rounded once: 1 / hi, then one Newton step on the exact residual.
            let q = 1.0 / sum.x;
            let r = fma_x(-q, sum.x, 1.0) - nc(q * sum.y);
            rv[0] = fma_x(q, r, q);
        }
        workgroupBarrier();
        sp[i] = e * rv[0];
    } else {
        sp[i] = 1.0 / (1.0 + exp_acc(-x));
    }
    workgroupBarrier();
    let o = t * k;
    for (var j = 0u; j < k; j = j + 1u) {
        // Scores are >= 0: a taken one is set to -1. Experts that cannot be taken (taken,
        // or past n) stand as (-1, 0): what the serial scan gives where none is left.
        let ok = live && sp[i] > -1.0;
        rv[i] = select(-1.0, sp[i], ok);
        ri[i] = select(0u, i, ok);
        workgroupBarrier();
        for (var s = MAX_EXPERTS / 2u; s > 0u; s = s >> 1u) {
            if i < s {
                let b = rv[i + s];
                let ib = ri[i + s];
                if b > rv[i] || (b == rv[i] && ib < ri[i]) {
                    rv[i] = b;
                    ri[i] = ib;
                }
            }
            workgroupBarrier();
        }
        let best = ri[0];
        if i == 0u {
            b2[o + j] = f32(best);
            b3[o + j] = rv[0];
        }
        if i == best {
            sp[i] = -1.0;
        }
        workgroupBarrier();
    }
    if i == 0u {
        var wsum = vec2<f32>(0.0, 0.0);
        for (var j = 0u; j < k; j = j + 1u) {
            wsum = ff_add1(wsum, b3[o + j]);
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
