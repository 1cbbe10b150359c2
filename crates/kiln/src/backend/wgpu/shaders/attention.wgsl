// Attention over the KV cache (GQA, sliding window, block tables): one
// workgroup per (token, head), keys in tiles of 64 with an online softmax (flash style).
// Queries are rounded to f16 before q·k, as on the CPU. head_dim <= 256. Tiles are aligned
// to absolute positions, and keys go in chunks of CH positions, folded in f32 as the CPU's
// (attention/mod.rs `fold`, KV_CHUNK).
// prm: n_tok, n_head, n_head_kv, head_dim, score scale (AttnPlan::score_scale), block_size,
// tok_off, tab_off, quantize mode, (split kernels) chunks, soft-cap (0: none), ALiBi
// (alibi.wgsl); per token at tok_off: the last and first positions it sees (its own and
// the window's start; an encoder's last is its sequence's), table offset (into tab_off) of
// its sequence, q multiplier.
// `attn_tail` (kernels.rs) is empty, or quantizes the head's output for the next matmul.
// KQ, VQ (kernels.rs): the K, V cache holds quantized blocks (attention_kv.wgsl): scores
// are the K type's dot products with the quantized query, values dequantized as read.
@group(0) @binding(0) var<storage, read> prm: array<u32>;
@group(0) @binding(1) var<storage, read> qs: array<f32>;
@group(0) @binding(2) var<storage, read> kc: array<u32>;
@group(0) @binding(3) var<storage, read> vc: array<u32>;
@group(0) @binding(4) var<storage, read_write> ys: array<f32>;

var<workgroup> q16: array<f32, 256>;
var<workgroup> pj: array<f32, 64>;
var<workgroup> bj: array<u32, 64>;
// Per key of a tile: the softmax rescale of the accumulator, the value's weight, and
// whether the key raised the running max.
var<workgroup> pms: array<f32, 64>;
var<workgroup> pvs: array<f32, 64>;
var<workgroup> pnew: array<u32, 64>;
// The tile's inclusive prefix max of scores.
var<workgroup> pmx: array<f32, 64>;

// Keys per chunk (the CPU's KV_CHUNK; a multiple of WG).
const CH: u32 = 256u;

// The chunks before the current one, folded: max, sum, this invocation's accumulators.
struct Folded {
    m: f32,
    s: f32,
    a0: vec2<f32>,
    a1: vec2<f32>,
}

// The CPU's `fold`: a chunk's (m, s, a0, a1) into f, each weighed by exp of its max less
// the new max; an empty chunk changes nothing, the first is taken as it is.
fn fold(f: Folded, m: f32, s: f32, a0: vec2<f32>, a1: vec2<f32>) -> Folded {
    let neg_inf = bitcast<f32>(0xff800000u);
    if m == neg_inf {
        return f;
    }
    if f.m == neg_inf {
        return Folded(m, s, a0, a1);
    }
    let mx = select(f.m, m, m > f.m);
    let f0 = exp_acc(f.m - mx);
    let f1 = exp_acc(m - mx);
    let b0 = vec2<f32>(fma_x(a0.x, f1, nc(f.a0.x * f0)), fma_x(a0.y, f1, nc(f.a0.y * f0)));
    let b1 = vec2<f32>(fma_x(a1.x, f1, nc(f.a1.x * f0)), fma_x(a1.y, f1, nc(f.a1.y * f0)));
    return Folded(mx, fma_x(s, f1, nc(f.s * f0)), b0, b1);
}

fn kv_at(buf_is_v: bool, e: u32) -> f32 {
    var w: u32;
    if buf_is_v {
        w = vc[e >> 1u];
    } else {
        w = kc[e >> 1u];
    }
    return unpack2x16float(w >> ((e & 1u) * 16u)).x;
}

// Two dims' accumulators past a key (values v; `raised`: the key raised the running max,
// pm rescales the accumulators first), rounded to f16 after each step.
fn acc2(a: vec2<f32>, v: vec2<f32>, pm: f32, pv: f32, raised: bool) -> vec2<f32> {
    var b = a;
    if raised {
        b = unpack2x16float(pack2x16float(vec2<f32>(nc(b.x * pm), nc(b.y * pm))));
    }
    return unpack2x16float(pack2x16float(vec2<f32>(fma_x(v.x, pv, b.x), fma_x(v.y, pv, b.y))));
}

// acc2 with f32 accumulators (a quantized V cache: ggml accumulates in f32).
fn acc2_f32(a: vec2<f32>, v: vec2<f32>, pm: f32, pv: f32, raised: bool) -> vec2<f32> {
    var b = a;
    if raised {
        b = vec2<f32>(nc(b.x * pm), nc(b.y * pm));
    }
    return vec2<f32>(fma_x(v.x, pv, b.x), fma_x(v.y, pv, b.y));
}

// q·k summed in the CPU's order (ggml's AVX-512 ggml_vec_dot_f16): per lane l of 16,
// four accumulators over blocks of 64 combined as (a0 + a2) + (a1 + a3), then a halving
// tree, then the dims past the last block of 64. Products of f16 values are exact, so this reproduces the CPU's score.
fn dot_ggml(base: u32, hd: u32) -> f32 {
    let np = hd / 64u * 64u;
    // acc[4 l + j]: lane l's accumulator j. Each 64-value chunk's 32 words are loaded
    // together (constant-bound loops: registers, all loads in flight), then folded in.
    var acc: array<f32, 64>;
    for (var i = 0u; i < 64u; i = i + 1u) {
        acc[i] = 0.0;
    }
    for (var c = 0u; c < np; c = c + 64u) {
        var w: array<u32, 32>;
        for (var i = 0u; i < 32u; i = i + 1u) {
            w[i] = kc[((base + c) >> 1u) + i];
        }
        // Word i holds values e = 2i and 2i + 1: lanes e % 16, accumulator e / 16.
        for (var i = 0u; i < 32u; i = i + 1u) {
            let kv = unpack2x16float(w[i]);
            let e = 2u * i;
            let l = e % 16u;
            let j = e / 16u;
            acc[4u * l + j] = fma_x(q16[c + e], kv.x, acc[4u * l + j]);
            acc[4u * l + 4u + j] = fma_x(q16[c + e + 1u], kv.y, acc[4u * l + 4u + j]);
        }
    }
    var x: array<f32, 16>;
    for (var l = 0u; l < 16u; l = l + 1u) {
        x[l] = (acc[4u * l] + acc[4u * l + 2u]) + (acc[4u * l + 1u] + acc[4u * l + 3u]);
    }
    for (var l = 0u; l < 8u; l = l + 1u) {
        x[l] = x[l + 8u] + x[l];
    }
    for (var l = 0u; l < 4u; l = l + 1u) {
        x[l] = x[l + 4u] + x[l];
    }
    // The tail's products (exact) summed in f64 on the CPU: here as a float-float sum,
    // rounded to f32 at the end.
    var s = vec2<f32>((x[0] + x[2]) + (x[1] + x[3]), 0.0);
    for (var e = np; e < hd; e = e + 1u) {
        let t = two_sum(s.x, nc(q16[e] * kv_at(false, base + e)));
        s = vec2<f32>(t.x, s.y + t.y);
    }
    return s.x + s.y;
}

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32 /*SG*/) {
    /*SGI*/
    let th = wid.y * nwg.x + wid.x;
    let n_head = prm[1];
    if th >= prm[0] * n_head {
        return;
    }
    let t = th / n_head;
    let h = th % n_head;
    let hd = prm[3];
    let kvh = h / (n_head / prm[2]);
    let kv_dim = prm[2] * hd;
    let scale = pf(4u);
    let bs = prm[5];
    let ti = prm[6] + 4u * t;
    let pos = prm[ti];
    let first = prm[ti + 1u];
    let tab = prm[7] + prm[ti + 2u];
    for (var d = lid; d < hd; d = d + WG) {
        q16[d] = f16r(qs[th * hd + d] * pf(ti + 3u));
    }
    workgroupBarrier();
    // Scores are computed a tile at a time (one key per invocation), then each key's
    // softmax factors in parallel from the running max before it; the walk over the tile's
    // keys in order then only rescales and accumulates, rounded to f16 after every rescale
    // and every fused multiply-add, as kiln's CPU backend (and ggml's one-chunk flash
    // attention) does: the same order for every batch (batch invariance).
    let neg_inf = bitcast<f32>(0xff800000u);
    var m = neg_inf;
    var ssum = 0.0;
    // This invocation's dims: the f16 pairs (words) lid and, for head_dim > 128, lid + WG.
    let np = hd / 2u;
    let two = np > WG;
    let e0 = min(lid, np - 1u);
    let e1 = min(lid + WG, np - 1u);
    var a0 = vec2<f32>(0.0);
    var a1 = vec2<f32>(0.0);
    var fd = Folded(neg_inf, 0.0, vec2<f32>(0.0), vec2<f32>(0.0));
    let start = first - first % WG;
    for (var p0 = start; p0 <= pos; p0 = p0 + WG) {
        if p0 % CH == 0u && p0 > start {
            fd = fold(fd, m, ssum, a0, a1);
            m = neg_inf;
            ssum = 0.0;
            a0 = vec2<f32>(0.0);
            a1 = vec2<f32>(0.0);
        }
        let p = p0 + lid;
        // Keys before `first` (the aligned tile's head) are skipped, as past `pos`.
        let live = p >= first && p <= pos;
        bj[lid] = 0u;
        if live {
            let slot = prm[tab + p / bs] * bs + p % bs;
            let base = slot * kv_dim + kvh * hd;
            // A quantized cache's head: its row of blocks (attention_kv.wgsl).
            let head = slot * prm[2] + kvh;
            var qk: f32;
            if KQ {
                qk = k_score(head * (hd / 32u * K_BB), th, hd);
            } else {
                qk = dot_ggml(base, hd);
            }
            pj[lid] = softcap_score(qk * scale, pf(10u)) + alibi_bias(t, h, p);
            bj[lid] = select(base >> 1u, head * (hd / 32u * V_BB), VQ);
        }
        let nv = min(WG, pos - p0 + 1u);
        // The max before each key: an inclusive prefix max over the tile (six doubling
        // steps), after the running max of the tiles before.
        workgroupBarrier();
        var run = select(neg_inf, pj[lid], live);
        for (var s = 1u; s < WG; s = s << 1u) {
            pmx[lid] = run;
            workgroupBarrier();
            if lid >= s {
                run = max(run, pmx[lid - s]);
            }
            workgroupBarrier();
        }
        pmx[lid] = run;
        workgroupBarrier();
        let before = select(m, max(m, pmx[max(lid, 1u) - 1u]), lid > 0u);
        m = max(m, pmx[nv - 1u]);
        if live {
            let sc = pj[lid];
            var ms = 1.0;
            var vs = 1.0;
            if sc > before {
                ms = exp_acc(before - sc);
            } else {
                vs = exp_acc(sc - before);
            }
            pms[lid] = ms;
            pvs[lid] = vs;
            pnew[lid] = u32(sc > before);
        }
        workgroupBarrier();
        if VQ {
            // Values of a quantized cache, dequantized as they are read, accumulated in
            // f32 (the CPU's ggml arithmetic over such a cache).
            for (var j = 0u; j < nv; j = j + 1u) {
                if p0 + j >= first {
                    let pm = pms[j];
                    let pv = pvs[j];
                    let raised = pnew[j] != 0u;
                    a0 = acc2_f32(a0, v_pair(bj[j], 2u * e0), pm, pv, raised);
                    if two {
                        a1 = acc2_f32(a1, v_pair(bj[j], 2u * e1), pm, pv, raised);
                    }
                    ssum = fma_x(ssum, pm, pv);
                }
            }
            workgroupBarrier();
            continue;
        }
        // The walk over the keys in order, sixteen keys' values loaded ahead of the chains
        // that use them (the next batch's loads overlap this batch's arithmetic).
        var vn: array<vec2<u32>, 16>;
        for (var u = 0u; u < 16u; u = u + 1u) {
            let b = bj[min(u, nv - 1u)];
            vn[u].x = vc[b + e0];
            if two {
                vn[u].y = vc[b + e1];
            }
        }
        for (var j = 0u; j < nv; j = j + 16u) {
            let v = vn;
            for (var u = 0u; u < 16u; u = u + 1u) {
                let b = bj[min(j + 16u + u, nv - 1u)];
                vn[u].x = vc[b + e0];
                if two {
                    vn[u].y = vc[b + e1];
                }
            }
            for (var u = 0u; u < 16u; u = u + 1u) {
                if j + u < nv && p0 + j + u >= first {
                    let pm = pms[j + u];
                    let pv = pvs[j + u];
                    let raised = pnew[j + u] != 0u;
                    a0 = acc2(a0, unpack2x16float(v[u].x), pm, pv, raised);
                    if two {
                        a1 = acc2(a1, unpack2x16float(v[u].y), pm, pv, raised);
                    }
                    ssum = fma_x(ssum, pm, pv);
                }
            }
        }
        workgroupBarrier();
    }
    fd = fold(fd, m, ssum, a0, a1);
    let inv = select(0.0, 1.0 / fd.s, fd.s != 0.0);
    if lid < np {
        ys[th * hd + 2u * lid] = fd.a0.x * inv;
        ys[th * hd + 2u * lid + 1u] = fd.a0.y * inv;
    }
    if two && lid + WG < np {
        ys[th * hd + 2u * (lid + WG)] = fd.a1.x * inv;
        ys[th * hd + 2u * (lid + WG) + 1u] = fd.a1.y * inv;
    }
    attn_tail(th * hd / 4u + min(lid, hd / 4u - 1u), lid < hd / 4u, lid);
}
