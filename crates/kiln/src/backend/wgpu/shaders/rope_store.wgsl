// The attention block's step before attention, in one dispatch: q rotated in place
// (rope_core.wgsl), and the rotated k with v stored to their KV slots (kv_store.wgsl's f16
// words). Each k word's two values are rotated from the unrotated k, which stays as it was
// (attention reads the cache), with rope.wgsl's expressions: bit-identical to rope + store.
// prm: n_tok, n_head, n_head_kv, head_dim, n_rot, neox, slots word, then per token n_rot
// values (cos, sin)..., then the slots (`norm`: then eps).
@group(0) @binding(0) var<storage, read> prm: array<u32>;
@group(0) @binding(1) var<storage, read_write> xa: array<f32>;
@group(0) @binding(2) var<storage, read_write> ks: array<f32>;
@group(0) @binding(3) var<storage, read> vs: array<f32>;
@group(0) @binding(4) var<storage, read_write> kc: array<u32>;
@group(0) @binding(5) var<storage, read_write> vc: array<u32>;

const CS: u32 = 7u;

// Value `d` of the head at `base` of k after the rotation of token `t`.
fn k_rot(base: u32, d: u32, t: u32) -> f32 {
    let n_rot = prm[4];
    let half_rot = n_rot / 2u;
    if d >= n_rot {
        return ks[base + d];
    }
    if prm[5] == 0u {
        let p = d / 2u;
        let cs = pf(CS + t * n_rot + 2u * p);
        let sn = pf(CS + t * n_rot + 2u * p + 1u);
        let r = rope_rot(ks[base + 2u * p], ks[base + 2u * p + 1u], cs, sn);
        return select(r.y, r.x, d % 2u == 0u);
    }
    let p = d % half_rot;
    let cs = pf(CS + t * n_rot + 2u * p);
    let sn = pf(CS + t * n_rot + 2u * p + 1u);
    let r = rope_rot(ks[base + p], ks[base + p + half_rot], cs, sn);
    return select(r.y, r.x, d < half_rot);
}

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let g = gidx(wid, nwg, lid);
    let n_tok = prm[0];
    let n_head = prm[1];
    let hd = prm[3];
    let n_rot = prm[4];
    let half_rot = n_rot / 2u;
    let n_q = n_tok * n_head * half_rot;
    if g < n_q {
        rope_pair(g, n_head, hd, n_rot, prm[5] != 0u, CS);
        return;
    }
    let dim = prm[2] * hd;
    let half_dim = dim / 2u;
    let w = g - n_q;
    if w >= n_tok * half_dim {
        return;
    }
    let t = w / half_dim;
    let j = w % half_dim;
    let src = t * dim + 2u * j;
    let base = t * dim + (2u * j) / hd * hd;
    let d = (2u * j) % hd;
    let dst = prm[prm[6] + t] * half_dim + j;
    kc[dst] = pack2x16float(vec2<f32>(k_rot(base, d, t), k_rot(base, d + 1u, t)));
    vc[dst] = pack2x16float(vec2<f32>(vs[src], vs[src + 1u]));
}

// The same with each head of q and k RMSNormed first (Qwen3's q and k norms: q's weight at
// wn, k's at wk, a head wide): a workgroup per head, q's heads then k's (each with its v
// head's store). A head's scale is rms_norm.wgsl's (ff_sum.wgsl: a float-float sum, its mean
// the same f32 in any order) and each value is normed by its expression, so the bits are
// those of the two norms' dispatches and `main` after them: each head's normed values are
// stored over it first, then q's pairs rotated in place, k's rotated into the cache.
@group(0) @binding(6) var<storage, read> wn: array<f32>;
@group(0) @binding(7) var<storage, read> wk: array<f32>;

@compute @workgroup_size(64)
fn norm(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let h = wid.y * nwg.x + wid.x;
    let n_tok = prm[0];
    let n_q = n_tok * prm[1];
    let n_kv = prm[2];
    let hd = prm[3];
    let n_rot = prm[4];
    if h >= n_q + n_tok * n_kv {
        return;
    }
    // The head's values at o, a word per invocation (a head is at most 64 words).
    let q = h < n_q;
    let kh = h - select(n_q, 0u, q);
    let o = select(kh, h, q) * hd;
    let nw = hd / 4u;
    let live = lid < nw;
    let i = o + 4u * min(lid, nw - 1u);
    var v: vec4<f32>;
    if q {
        v = vec4<f32>(xa[i], xa[i + 1u], xa[i + 2u], xa[i + 3u]);
    } else {
        v = vec4<f32>(ks[i], ks[i + 1u], ks[i + 2u], ks[i + 3u]);
    }
    var s = vec2<f32>(0.0, 0.0);
    if live {
        s = ff_squares(s, v);
    }
    let scale = rms_scale(ff_total(s, lid), hd, pf(prm[6] + n_tok));
    // The normed values stored over the head's.
    if live {
        var y: vec4<f32>;
        if q {
            y = rms_apply(v, scale, lid, hd);
        } else {
            for (var c = 0u; c < 4u; c = c + 1u) {
                y[c] = nc(v[c] * scale) * wk[4u * lid + c];
            }
        }
        for (var c = 0u; c < 4u; c = c + 1u) {
            if q {
                xa[i + c] = y[c];
            } else {
                ks[i + c] = y[c];
            }
        }
    }
    storageBarrier();
    if q {
        for (var p = lid; p < n_rot / 2u; p = p + 64u) {
            rope_pair(h * (n_rot / 2u) + p, prm[1], hd, n_rot, prm[5] != 0u, CS);
        }
        return;
    }
    let t = kh / n_kv;
    let half_dim = n_kv * hd / 2u;
    for (var e = lid; e < hd / 2u; e = e + 64u) {
        // Word j of the token's k and v rows.
        let j = (kh % n_kv) * hd / 2u + e;
        let src = o + 2u * e;
        let dst = prm[prm[6] + t] * half_dim + j;
        kc[dst] = pack2x16float(vec2<f32>(k_rot(o, 2u * e, t), k_rot(o, 2u * e + 1u, t)));
        vc[dst] = pack2x16float(vec2<f32>(vs[src], vs[src + 1u]));
    }
}

// The same over quantized caches (either or both; kv_quant.wgsl's type codes, 6: F16): a
// workgroup per 64 of q's pairs (rotated in place), then one per chunk of each token's k
// row (its values rotated by k_rot, then by the cache's Walsh-Hadamard transform, and
// quantized: kv_rows.wgsl's store of the roped row), then one per chunk of its v row. The
// host sends chunks of whole words only (64 values or more).
// prm: main's, then after the slots K's type, group, rotated, scale (f32 bits), chunk; V's.
@compute @workgroup_size(64)
fn quantized(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
             @builtin(local_invocation_index) lid: u32) {
    let wg = wid.y * nwg.x + wid.x;
    let n_tok = prm[0];
    let hd = prm[3];
    let n_rot = prm[4];
    let n_q = n_tok * prm[1] * (n_rot / 2u);
    let q_wg = (n_q + WG - 1u) / WG;
    if wg < q_wg {
        let g = wg * WG + lid;
        if g < n_q {
            rope_pair(g, prm[1], hd, n_rot, prm[5] != 0u, CS);
        }
        return;
    }
    let dim = prm[2] * hd;
    let e = prm[6] + n_tok;
    let k_chunks = n_tok * dim / prm[e + 4u];
    let is_k = wg - q_wg < k_chunks;
    let c = select(wg - q_wg - k_chunks, wg - q_wg, is_k);
    let at = select(e + 5u, e, is_k);
    let n = prm[at + 4u];
    let per = dim / n;
    let t = c / per;
    if t >= n_tok {
        return;
    }
    // The chunk's first value in the token's row.
    let c0 = (c % per) * n;
    for (var i = lid; i < n; i = i + WG) {
        let d = c0 + i;
        if is_k {
            wh[i] = k_rot(t * dim + d / hd * hd, d % hd, t);
        } else {
            wh[i] = vs[t * dim + d];
        }
    }
    if prm[at + 2u] != 0u {
        hadamard(prm[at + 1u], n, pf(at + 3u), lid);
    } else {
        workgroupBarrier();
    }
    let ty = prm[at];
    kv_quantize(ty, n, lid);
    let bb = kv_bb(ty);
    let o = (prm[prm[6] + t] * (dim / 32u * bb) + c0 / 32u * bb) / 4u;
    for (var w = lid; w < n / 32u * bb / 4u; w = w + WG) {
        let word = kv_word_at(ty, 4u * w);
        if is_k {
            kc[o + w] = word;
        } else {
            vc[o + w] = word;
        }
    }
}
