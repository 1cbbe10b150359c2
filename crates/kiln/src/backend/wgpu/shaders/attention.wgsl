// Causal attention over the f16 KV cache (GQA, sliding window, block tables): one
// workgroup per (token, head), keys in tiles of 64 with an online softmax (flash style).
// Queries are rounded to f16 before q·k, as on the CPU. head_dim <= 256.
// prm: n_tok, n_head, n_head_kv, head_dim, scale, block_size, tok_off, tab_off, quantize
// mode; per token at tok_off: pos, first_pos, table offset (into tab_off) of its sequence.
// `attn_tail` (kernels.rs) is empty, or quantizes the head's output for the next matmul.
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

fn kv_at(buf_is_v: bool, e: u32) -> f32 {
    var w: u32;
    if buf_is_v {
        w = vc[e >> 1u];
    } else {
        w = kc[e >> 1u];
    }
    return unpack2x16float(w >> ((e & 1u) * 16u)).x;
}

// One dim's accumulator past key j of the tile (value v); dims past head_dim are never
// stored.
fn acc_step(a: f32, v: f32, j: u32) -> f32 {
    var b = a;
    if pnew[j] != 0u {
        b = f16r(nc(b * pms[j]));
    }
    return f16r(fma_x(v, pvs[j], b));
}

// q·k summed in the CPU's order (ggml's AVX-512 ggml_vec_dot_f16): per lane l of 16,
// four accumulators over blocks of 64 combined as (a0 + a2) + (a1 + a3), then a halving
// tree. Products of f16 values are exact, so this reproduces the CPU's score.
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
    var s = (x[0] + x[2]) + (x[1] + x[3]);
    for (var e = np; e < hd; e = e + 1u) {
        s = s + q16[e] * kv_at(false, base + e);
    }
    return s;
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
    let ti = prm[6] + 3u * t;
    let pos = prm[ti];
    let first = prm[ti + 1u];
    let tab = prm[7] + prm[ti + 2u];
    for (var d = lid; d < hd; d = d + WG) {
        q16[d] = f16r(qs[th * hd + d]);
    }
    workgroupBarrier();
    // Scores are computed a tile at a time (one key per invocation), then each key's
    // softmax factors in parallel from the running max before it; the walk over the tile's
    // keys in order then only rescales and accumulates, rounded to f16 after every rescale
    // and every fused multiply-add, as kiln's CPU backend (and ggml's one-chunk flash
    // attention) does: the same order for every batch (batch invariance).
    var m = bitcast<f32>(0xff800000u);
    var ssum = 0.0;
    var a0 = 0.0;
    var a1 = 0.0;
    var a2 = 0.0;
    var a3 = 0.0;
    for (var p0 = first; p0 <= pos; p0 = p0 + WG) {
        let p = p0 + lid;
        if p <= pos {
            let slot = prm[tab + p / bs] * bs + p % bs;
            let base = slot * kv_dim + kvh * hd;
            pj[lid] = dot_ggml(base, hd) * scale;
            bj[lid] = base;
        }
        workgroupBarrier();
        let nv = min(WG, pos - p0 + 1u);
        // The max before key lid (every invocation walks the tile's scores, broadcast reads;
        // a constant bound, so the loads are all in flight).
        var before = m;
        for (var j = 0u; j < WG; j = j + 1u) {
            if j == lid {
                before = m;
            }
            let sc = pj[min(j, nv - 1u)];
            if j < nv && sc > m {
                m = sc;
            }
        }
        if lid < nv {
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
        // Eight keys' values loaded before their chains (the loads overlap); one
        // accumulator per dim this invocation owns (head_dim <= 4 WG).
        var j = 0u;
        for (; j < nv; j = j + 8u) {
            var v: array<vec4<f32>, 8>;
            for (var u = 0u; u < 8u; u = u + 1u) {
                let b = bj[min(j + u, nv - 1u)];
                v[u] = vec4<f32>(kv_at(true, b + min(lid, hd - 1u)), kv_at(true, b + min(lid + WG, hd - 1u)),
                    kv_at(true, b + min(lid + 2u * WG, hd - 1u)), kv_at(true, b + min(lid + 3u * WG, hd - 1u)));
            }
            for (var u = 0u; u < 8u; u = u + 1u) {
                if j + u < nv {
                    a0 = acc_step(a0, v[u].x, j + u);
                    a1 = acc_step(a1, v[u].y, j + u);
                    a2 = acc_step(a2, v[u].z, j + u);
                    a3 = acc_step(a3, v[u].w, j + u);
                    ssum = fma_x(ssum, pms[j + u], pvs[j + u]);
                }
            }
        }
        workgroupBarrier();
    }
    let inv = select(0.0, 1.0 / ssum, ssum != 0.0);
    let acc = array<f32, 4>(a0, a1, a2, a3);
    for (var i = 0u; i < 4u; i = i + 1u) {
        let d = lid + i * WG;
        if d < hd {
            ys[th * hd + d] = acc[i] * inv;
        }
    }
    attn_tail(th * hd / 4u + min(lid, hd / 4u - 1u), lid < hd / 4u, lid);
}
