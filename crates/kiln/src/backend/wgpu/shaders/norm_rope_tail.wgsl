// The q/k/v matmul's tail for q and k norms before RoPE (kernels.rs `Outs::norm_rope`): the
// norms' and the RoPE store's work, their dispatches saved. A norm group is a head
// (Qwen3's norms) or all of a token's q or k heads (OLMoE's). The matmul stores q, k and v
// (outputs 0, 1, 2, atomic words); each workgroup, its rows within one group, counts itself
// done in its (token group, norm group) counter (last_done.wgsl), a k group counting the
// workgroups of its k rows and of its v rows; the last to finish RMSNorms the group (its
// weight at HQ for q, HK for k), stores q's values rotated over q, k's normed over k and
// rotated into the KV slots at KC, and v's into the slots at VC (f16 words). The norm is
// rms_norm.wgsl's (a float-float sum: its mean the same f32 in any order), each value
// normed and rotated by rms_apply's and rope's expressions: the same bits.
// prm[11..]: q rows, k rows (of the dispatch), head_dim, n_rot, neox, KV words per token,
// rope words at, slots at, eps, q's and k's norm widths; then per token n_rot values
// (cos, sin)..., the slots.
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
    let r = rope_rot(x0, x1, pf(prm[17] + t * n_rot + 2u * p), pf(prm[17] + t * n_rot + 2u * p + 1u));
    return select(r.y, r.x, first);
}

// Norm group g (q's groups, then k's) of token t: a group is a head (Qwen3's norms) or all
// of the token's q or k heads (OLMoE's), as wide as its norm's weight. Its sum of squares
// first, then head by head: the head normed into `hv`, then stored. Every invocation calls
// it.
fn norm_rope_group(t: u32, g: u32, li: u32) {
    let nq = prm[11];
    let nk = prm[12];
    let hd = prm[13];
    let n_rot = prm[14];
    let gq = prm[20];
    let gk = prm[21];
    let q = g < nq / gq;
    let kg = g - nq / gq;
    let width = select(gk, gq, q);
    let o = select(t * nk + kg * gk, t * nq + g * gq, q);
    var s = vec2<f32>(0.0, 0.0);
    for (var w = li; w < width / 4u; w = w + RG * NPR) {
        var v: vec4<f32>;
        for (var c = 0u; c < 4u; c = c + 1u) {
            v[c] = out_load(q, o + 4u * w + c);
        }
        s = ff_squares(s, v);
    }
    let scale = rms_scale(ff_total(s, li), width, pf(prm[19]));
    for (var hh = 0u; hh < width / hd; hh = hh + 1u) {
        let ho = o + hh * hd;
        if li < hd / 4u {
            for (var c = 0u; c < 4u; c = c + 1u) {
                let i = 4u * li + c;
                hv[i] = nc(out_load(q, ho + i) * scale) * select(hk[hh * hd + i], hq[hh * hd + i], q);
            }
        }
        workgroupBarrier();
        if q {
            for (var d = li; d < hd; d = d + RG * NPR) {
                out_put(true, ho + d, select(hv[d], hv_rot(d, t), d < n_rot));
            }
        } else {
            let kh = kg * gk / hd + hh;
            let dst = prm[prm[18] + t] * prm[16] + kh * hd / 2u;
            for (var e = li; e < hd / 2u; e = e + RG * NPR) {
                let d = 2u * e;
                out_put(false, ho + d, hv[d]);
                out_put(false, ho + d + 1u, hv[d + 1u]);
                let k0 = select(hv[d], hv_rot(d, t), d < n_rot);
                let k1 = select(hv[d + 1u], hv_rot(d + 1u, t), d + 1u < n_rot);
                kc[dst + e] = pack2x16float(vec2<f32>(k0, k1));
                let vo = t * nk + kh * hd + d;
                vc[dst + e] = pack2x16float(vec2<f32>(bitcast<f32>(atomicLoad(&ys2[vo])), bitcast<f32>(atomicLoad(&ys2[vo + 1u]))));
            }
        }
        workgroupBarrier();
    }
}

fn matmul_tail(wid: vec3<u32>, nwg: vec3<u32>, li: u32, t0: u32, tt: u32) {
    let nq = prm[11];
    let nk = prm[12];
    let gq = prm[20];
    let gk = prm[21];
    let r0 = (wid.y * nwg.x + wid.x) * RG * RR;
    // (Workgroups past the rows, where the grid is two-dimensional, count in no group.)
    if r0 >= prm[0] {
        return;
    }
    // The workgroup's norm group, and how many workgroups finish it.
    var g = r0 / gq;
    var n = gq / (RG * RR);
    if r0 >= nq {
        g = nq / gq + (r0 - nq) % nk / gk;
        n = 2u * gk / (RG * RR);
    }
    if !last_done(wid.z * (nq / gq + nk / gk) + g, n, li) {
        return;
    }
    for (var j = 0u; j < tt; j = j + 1u) {
        norm_rope_group(t0 + j, g, li);
    }
}
