// Attention split over key chunks (flash decoding), the vec path's for every batch:
// `partial` takes one chunk of CH keys of one (token, head), its scores and value sums in
// f32: a key per invocation for the scores, then four groups of 64 invocations summing every
// fourth run of 16 keys' values, their sums added in group order; `combine`
// (attention_combine.wgsl) merges a head's chunks. Not the CPU's order (the exact kernel,
// attention.wgsl, walks keys one by one), but each (token, head)'s arithmetic is fixed
// whatever the batch: batch invariant. head_dim a multiple of 8, at most 256.
// prm as attention.wgsl's (prm[9]: chunks per head); partials: per (token, head, chunk)
// the chunk's max score, its sum of exp(score - max), then head_dim value sums. DIRECT
// (every head's keys in one chunk): the normalized output itself, as `combine` would write
// it from one chunk (bit for bit), and `attn_tail`; no merge dispatch. KQ, VQ: quantized
// caches, as attention.wgsl's.
@group(0) @binding(0) var<storage, read> prm: array<u32>;
@group(0) @binding(1) var<storage, read> qs: array<f32>;
@group(0) @binding(2) var<storage, read> kc: array<vec4<u32>>;
@group(0) @binding(3) var<storage, read> vc: array<u32>;
// The partial sums, or (DIRECT) the output.
@group(0) @binding(4) var<storage, read_write> ys: array<f32>;

const CH: u32 = 256u;

var<workgroup> q16: array<vec4<f32>, 64>;
var<workgroup> sc: array<f32, 256>;
var<workgroup> bw: array<u32, 256>;
var<workgroup> rd: array<f32, 256>;
var<workgroup> pv: array<vec4<f32>, 256>;

// The workgroup's maximum (`is_max`) or sum of v, by a fixed halving tree.
fn tree(v: f32, lid: u32, is_max: bool) -> f32 {
    rd[lid] = v;
    workgroupBarrier();
    for (var h = CH / 2u; h > 0u; h = h >> 1u) {
        if lid < h {
            rd[lid] = select(rd[lid] + rd[lid + h], max(rd[lid], rd[lid + h]), is_max);
        }
        workgroupBarrier();
    }
    let r = rd[0];
    workgroupBarrier();
    return r;
}

// q·k of the key whose values start at f16 index `base` (a multiple of 8).
fn score(base: u32, hd: u32) -> f32 {
    var acc = vec4<f32>(0.0);
    let w0 = base >> 3u;
    for (var i = 0u; i < hd / 8u; i = i + 1u) {
        let w = kc[w0 + i];
        let lo = vec4<f32>(unpack2x16float(w.x), unpack2x16float(w.y));
        let hi = vec4<f32>(unpack2x16float(w.z), unpack2x16float(w.w));
        acc = fma(q16[2u * i], lo, acc);
        acc = fma(q16[2u * i + 1u], hi, acc);
    }
    return (acc.x + acc.y) + (acc.z + acc.w);
}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32 /*SG*/) {
    /*SGI*/
    // (token, head) over x and y (past 65535 heads of tokens), the chunk in z.
    let th = wid.y * nwg.x + wid.x;
    let chunk = wid.z;
    if th >= prm[0] * prm[1] {
        return;
    }
    let n_head = prm[1];
    let hd = prm[3];
    let kvh = (th % n_head) / (n_head / prm[2]);
    let kv_dim = prm[2] * hd;
    let scale = pf(4u);
    let bs = prm[5];
    let ti = prm[6] + 4u * (th / n_head);
    let pos = prm[ti];
    let k0 = prm[ti + 1u] + chunk * CH;
    let tab = prm[7] + prm[ti + 2u];
    let out = (th * prm[9] + chunk) * (hd + 2u);
    let neg_inf = bitcast<f32>(0xff800000u);
    if k0 > pos {
        // Past this token's keys: an empty chunk.
        if lid == 0u {
            ys[out] = neg_inf;
            ys[out + 1u] = 0.0;
        }
        return;
    }
    let nk = min(CH, pos - k0 + 1u);
    if lid < hd / 4u {
        let o = th * hd + 4u * lid;
        let qm = pf(ti + 3u);
        q16[lid] = unpack4x16(qs[o] * qm, qs[o + 1u] * qm, qs[o + 2u] * qm, qs[o + 3u] * qm);
    }
    workgroupBarrier();
    // Key lid's score (keys past the chunk's end: -inf, weight 0).
    let p = k0 + min(lid, nk - 1u);
    let slot = prm[tab + p / bs] * bs + p % bs;
    let kb = slot * kv_dim + kvh * hd;
    // A quantized cache's head: its row of blocks (attention_kv.wgsl).
    let head = slot * prm[2] + kvh;
    var qk: f32;
    if KQ {
        qk = k_score(head * (hd / 32u * K_BB), th, hd);
    } else {
        qk = score(kb, hd);
    }
    let biased = softcap_score(qk * scale, pf(10u)) + alibi_bias(th / n_head, th % n_head, p);
    let s = select(neg_inf, biased, lid < nk);
    bw[lid] = select(kb >> 1u, head * (hd / 32u * V_BB), VQ);
    let m = tree(s, lid, true);
    let e = exp(s - m);
    sc[lid] = e;
    // (The tree's barriers also publish sc and bw.)
    let l = tree(e, lid, false);
    // Value sums: group grp takes runs of 16 keys from 16 * grp, every 64 keys, sixteen
    // keys' loads at a time; its invocation ln holds value pairs ln and ln + 64 (head_dim
    // > 128).
    let grp = lid / 64u;
    let ln = lid % 64u;
    let np = hd / 2u;
    let two = np > 64u;
    let e0 = min(ln, np - 1u);
    let e1 = min(ln + 64u, np - 1u);
    var a0 = vec2<f32>(0.0);
    var a1 = vec2<f32>(0.0);
    for (var j = 16u * grp; j < nk && VQ; j = j + 64u) {
        // A quantized V cache's values, dequantized as they are read.
        for (var u = 0u; u < 16u; u = u + 1u) {
            if j + u < nk {
                let w = vec2<f32>(sc[j + u]);
                a0 = fma(v_pair(bw[j + u], 2u * e0), w, a0);
                if two {
                    a1 = fma(v_pair(bw[j + u], 2u * e1), w, a1);
                }
            }
        }
    }
    for (var j = 16u * grp; j < nk && !VQ; j = j + 64u) {
        var v: array<vec2<u32>, 16>;
        for (var u = 0u; u < 16u; u = u + 1u) {
            let b = bw[min(j + u, nk - 1u)];
            v[u].x = vc[b + e0];
            if two {
                v[u].y = vc[b + e1];
            }
        }
        for (var u = 0u; u < 16u; u = u + 1u) {
            let w = select(0.0, sc[min(j + u, CH - 1u)], j + u < nk);
            a0 = fma(unpack2x16float(v[u].x), vec2<f32>(w), a0);
            if two {
                a1 = fma(unpack2x16float(v[u].y), vec2<f32>(w), a1);
            }
        }
    }
    pv[lid] = vec4<f32>(a0, a1);
    workgroupBarrier();
    let t = ((pv[ln] + pv[ln + 64u]) + pv[ln + 128u]) + pv[ln + 192u];
    a0 = t.xy;
    a1 = t.zw;
    // Invocations 0..63 write the head's values.
    let wr = lid < 64u;
    if DIRECT {
        // The output, also kept in `sc` (its weights are spent) for the quantize tail.
        let inv = select(0.0, 1.0 / l, l != 0.0);
        if wr && lid < np {
            let o = a0 * inv;
            ys[th * hd + 2u * lid] = o.x;
            ys[th * hd + 2u * lid + 1u] = o.y;
            sc[2u * lid] = o.x;
            sc[2u * lid + 1u] = o.y;
        }
        if wr && two && lid + 64u < np {
            let o = a1 * inv;
            ys[th * hd + 2u * (lid + 64u)] = o.x;
            ys[th * hd + 2u * (lid + 64u) + 1u] = o.y;
            sc[2u * (lid + 64u)] = o.x;
            sc[2u * (lid + 64u) + 1u] = o.y;
        }
        workgroupBarrier();
        let w = min(lid, hd / 4u - 1u);
        let v = vec4<f32>(sc[4u * w], sc[4u * w + 1u], sc[4u * w + 2u], sc[4u * w + 3u]);
        attn_tail_of(th * hd / 4u + w, v, lid < hd / 4u, lid);
        return;
    }
    if lid == 0u {
        ys[out] = m;
        ys[out + 1u] = l;
    }
    if wr && lid < np {
        ys[out + 2u + 2u * lid] = a0.x;
        ys[out + 3u + 2u * lid] = a0.y;
    }
    if wr && two && lid + 64u < np {
        ys[out + 2u + 2u * (lid + 64u)] = a1.x;
        ys[out + 3u + 2u * (lid + 64u)] = a1.y;
    }
}

// Four query values rounded to f16, as the CPU rounds q before q·k.
fn unpack4x16(a: f32, b: f32, c: f32, d: f32) -> vec4<f32> {
    return vec4<f32>(unpack2x16float(pack2x16float(vec2<f32>(a, b))), unpack2x16float(pack2x16float(vec2<f32>(c, d))));
}
