// A router's top-k with the CPU backend's arithmetic (backend/cpu/moe.rs), for the route
// kernel (moe.wgsl) and the router matmul that routes as its last workgroup finishes
// (matmul_vec.wgsl's matmul_tail, kernels.rs ROUTE_TAIL).
// The most experts a router scores (a workgroup's invocations, one expert each).
const MAX_EXPERTS: u32 = 256u;
// A token's scores, the reductions' values, the selection keys, the softmax's group sums.
var<workgroup> sp: array<f32, MAX_EXPERTS>;
var<workgroup> rv: array<f32, MAX_EXPERTS>;
var<workgroup> rk: array<u32, MAX_EXPERTS>;
var<workgroup> gs: array<f32, 16>;
// The chosen experts and their weights, in routing order.
var<workgroup> kid: array<u32, MAX_EXPERTS>;
var<workgroup> kw: array<f32, MAX_EXPERTS>;

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

// route_token: token t's routing by a workgroup of MAX_EXPERTS invocations (i), an expert
// per invocation. Scores of the row's n experts
// (softmax: ggml's vector expf sixteen at a time, each group's sum reduced in f32, the
// groups and the libm tail summed in f64 in order, every value times 1 / sum; or each its
// sigmoid), then the top k, highest first (the lowest index on ties: each expert's rank),
// their weights divided by their f64 sum (at least the least normal f16) where `norm`,
// then times `scale`. With an expert-selection bias the top k are chosen by
// score plus route_bias(i) (f32 adds, as the CPU's), weighted by their scores alone.
// Every invocation reaches every barrier.
// route_prm(0..6): n_expert, k, gating (0 softmax, 1 sigmoid), norm, scale, biased; the
// logits read by route_logit(i), the bias by route_bias(i), slot o's id (as f32) and
// weight stored by route_out(o, id, w) (the including kernel's).
fn route_token(t: u32, i: u32) {
    let n = route_prm(0u);
    let k = route_prm(1u);
    let live = i < n;
    let x = route_logit(t * n + min(i, n - 1u));
    if route_prm(2u) == 0u {
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
    var sel = sp[i];
    if route_prm(5u) == 1u && live {
        sel = sel + route_bias(i);
    }
    let o = t * k;
    // The top k, highest first, the lowest index on ties (the CPU's stable sort by
    // f32::total_cmp, here on each score's bits mapped to an unsigned key of that order):
    // each expert's rank in that order counted over all the others in one pass (every
    // invocation reading the same key at a time), the first k writing their places.
    let bits = bitcast<u32>(sel);
    let key = select(bits ^ 0x80000000u, ~bits, bits >= 0x80000000u);
    rk[i] = key;
    workgroupBarrier();
    if live {
        var rank = 0u;
        for (var j = 0u; j < n; j = j + 1u) {
            let b = rk[j];
            rank = rank + u32(b > key || (b == key && j < i));
        }
        if rank < k {
            kid[rank] = i;
            kw[rank] = sp[i];
        }
    }
    workgroupBarrier();
    if i == 0u {
        var wsum = vec2<f32>(0.0, 0.0);
        for (var j = 0u; j < k; j = j + 1u) {
            wsum = ff_add1(wsum, kw[j]);
        }
        if route_prm(3u) == 1u {
            let s = max(wsum.x + wsum.y, 6.1035156e-5);
            for (var j = 0u; j < k; j = j + 1u) {
                kw[j] = kw[j] / s;
            }
        }
        let scale = bitcast<f32>(route_prm(4u));
        if scale != 0.0 && scale != 1.0 {
            for (var j = 0u; j < k; j = j + 1u) {
                kw[j] = kw[j] * scale;
            }
        }
        for (var j = 0u; j < k; j = j + 1u) {
            route_out(o + j, f32(kid[j]), kw[j]);
        }
    }
}

