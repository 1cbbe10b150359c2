// The q/k/v matmul's tail for Qwen3's per-head q and k norms (kernels.rs `Outs::norm_rope`):
// rope_store.wgsl `norm`'s work, one dispatch fewer. The matmul stores q, k and v
// (outputs 0, 1, 2, atomic words); each workgroup, its rows within one head, counts itself
// done in its (token group, head) counter (last_done.wgsl), a kv head counting the
// workgroups of its k rows and of its v rows; the last to finish RMSNorms the head (its
// weight at HQ for q, HK for k, a head wide), stores q's values rotated over q, k's normed
// over k and rotated into its KV slot at KC, and v's into its slot at VC (f16 words). The
// norm is rms_norm.wgsl's (a float-float sum: its mean the same f32 in any order), each
// value normed and rotated by rope_store.wgsl's expressions: the same bits.
// prm[11..]: q rows, k rows (of the dispatch), head_dim, n_rot, neox, KV words per token,
// rope words at, slots at, eps; then per token n_rot values (cos, sin)..., the slots.
@group(0) @binding(KC) var<storage, read_write> kc: array<u32>;
@group(0) @binding(VC) var<storage, read_write> vc: array<u32>;
@group(0) @binding(HQ) var<storage, read> hq: array<f32>;
@group(0) @binding(HK) var<storage, read> hk: array<f32>;

// A head's normed values (at most 256).
var<workgroup> hv: array<f32, 256>;

fn out_load(q: bool, i: u32) -> f32 {
    if q {
        return bitcast<f32>(atomicLoad(&ys[i]));
    }
    return bitcast<f32>(atomicLoad(&ys1[i]));
}

fn out_put(q: bool, i: u32, v: f32) {
    if q {
        atomicStore(&ys[i], bitcast<u32>(v));
    } else {
        atomicStore(&ys1[i], bitcast<u32>(v));
    }
}

// Value d of the normed head in `hv` after token t's rotation (d < n_rot).
fn hv_rot(d: u32, t: u32) -> f32 {
    let n_rot = prm[14];
    let half_rot = n_rot / 2u;
    var p = d / 2u;
    var x0 = hv[2u * p];
    var x1 = hv[2u * p + 1u];
    var first = d % 2u == 0u;
    if prm[15] != 0u {
        p = d % half_rot;
        x0 = hv[p];
        x1 = hv[p + half_rot];
        first = d < half_rot;
    }
    let cs = pf(prm[17] + t * n_rot + 2u * p);
    let sn = pf(prm[17] + t * n_rot + 2u * p + 1u);
    if first {
        return fma_x(x0, cs, -nc(x1 * sn));
    }
    return fma_x(x0, sn, nc(x1 * cs));
}

// Head `h` (q's heads, then the kv heads) of token t. Every invocation calls it.
fn norm_rope_head(t: u32, h: u32, li: u32) {
    let nq = prm[11];
    let nk = prm[12];
    let hd = prm[13];
    let n_rot = prm[14];
    let q = h < nq / hd;
    let kh = h - nq / hd;
    let o = select(t * nk + kh * hd, t * nq + h * hd, q);
    let nw = hd / 4u;
    let live = li < nw;
    let w = min(li, nw - 1u);
    var v: vec4<f32>;
    for (var c = 0u; c < 4u; c = c + 1u) {
        v[c] = out_load(q, o + 4u * w + c);
    }
    var s = vec2<f32>(0.0, 0.0);
    if live {
        s = ff_squares(s, v);
    }
    let scale = rms_scale(ff_total(s, li), hd, pf(prm[19]));
    if live {
        for (var c = 0u; c < 4u; c = c + 1u) {
            let i = 4u * w + c;
            hv[i] = nc(v[c] * scale) * select(hk[i], hq[i], q);
        }
    }
    workgroupBarrier();
    if q {
        for (var d = li; d < hd; d = d + RG * NPR) {
            out_put(true, o + d, select(hv[d], hv_rot(d, t), d < n_rot));
        }
    } else {
        let dst = prm[prm[18] + t] * prm[16] + kh * hd / 2u;
        for (var e = li; e < hd / 2u; e = e + RG * NPR) {
            let d = 2u * e;
            out_put(false, o + d, hv[d]);
            out_put(false, o + d + 1u, hv[d + 1u]);
            let k0 = select(hv[d], hv_rot(d, t), d < n_rot);
            let k1 = select(hv[d + 1u], hv_rot(d + 1u, t), d + 1u < n_rot);
            kc[dst + e] = pack2x16float(vec2<f32>(k0, k1));
            let vo = t * nk + kh * hd + d;
            vc[dst + e] = pack2x16float(vec2<f32>(bitcast<f32>(atomicLoad(&ys2[vo])), bitcast<f32>(atomicLoad(&ys2[vo + 1u]))));
        }
    }
    workgroupBarrier();
}

fn matmul_tail(wid: vec3<u32>, nwg: vec3<u32>, li: u32, t0: u32, tt: u32) {
    let nq = prm[11];
    let nk = prm[12];
    let hd = prm[13];
    let r0 = (wid.y * nwg.x + wid.x) * RG * RR;
    // (Workgroups past the rows, where the grid is two-dimensional, count in no head.)
    if r0 >= prm[0] {
        return;
    }
    // The workgroup's head, and how many workgroups finish it.
    var h = r0 / hd;
    var n = hd / (RG * RR);
    if r0 >= nq {
        h = nq / hd + (r0 - nq) % nk / hd;
        n = 2u * n;
    }
    if !last_done(wid.z * ((nq + nk) / hd) + h, n, li) {
        return;
    }
    for (var j = 0u; j < tt; j = j + 1u) {
        norm_rope_head(t0 + j, h, li);
    }
}
