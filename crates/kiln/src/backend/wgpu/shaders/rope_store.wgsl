// The attention block's step before attention, in one dispatch: q rotated in place
// (rope_core.wgsl), and the rotated k with v stored to their KV slots (kv_store.wgsl's f16
// words). Each k word's two values are rotated from the unrotated k, which stays as it was
// (attention reads the cache), with rope.wgsl's expressions: bit-identical to rope + store.
// prm: n_tok, n_head, n_head_kv, head_dim, n_rot, neox, slots word, then per token n_rot
// values (cos, sin)..., then the slots.
@group(0) @binding(0) var<storage, read> prm: array<u32>;
@group(0) @binding(1) var<storage, read_write> xa: array<f32>;
@group(0) @binding(2) var<storage, read> ks: array<f32>;
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
        let x0 = ks[base + 2u * p];
        let x1 = ks[base + 2u * p + 1u];
        if d % 2u == 0u {
            return fma_x(x0, cs, -nc(x1 * sn));
        }
        return fma_x(x0, sn, nc(x1 * cs));
    }
    let p = d % half_rot;
    let cs = pf(CS + t * n_rot + 2u * p);
    let sn = pf(CS + t * n_rot + 2u * p + 1u);
    let x0 = ks[base + p];
    let x1 = ks[base + p + half_rot];
    if d < half_rot {
        return fma_x(x0, cs, -nc(x1 * sn));
    }
    return fma_x(x0, sn, nc(x1 * cs));
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
