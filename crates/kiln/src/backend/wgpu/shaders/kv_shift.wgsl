// Context shift: K/V rows move from slot src[i] to slot dst[i]; keys are rotated by the
// shift (the (cos, sin) pairs come from the host, as the CPU computes them), values copied.
// One invocation per (row, packed f16 pair). prm: n, dim, head_dim, n_rot, neox,
// cache[n_rot], src[n], dst[n]
@group(0) @binding(0) var<storage, read> prm: array<u32>;
@group(0) @binding(1) var<storage, read_write> kc: array<u32>;
@group(0) @binding(2) var<storage, read_write> vc: array<u32>;

const CACHE: u32 = 5u;

fn k_at(base: u32, el: u32) -> f32 {
    return unpack2x16float(kc[base + el / 2u])[el % 2u];
}

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let g = gidx(wid, nwg, lid);
    let n = prm[0];
    let half_dim = prm[1] / 2u;
    if g >= n * half_dim {
        return;
    }
    let hd = prm[2];
    let n_rot = prm[3];
    let half_rot = n_rot / 2u;
    let i = g / half_dim;
    let w = g % half_dim;
    let src_off = CACHE + n_rot;
    let s = prm[src_off + i] * half_dim;
    let d = prm[src_off + n + i] * half_dim;
    vc[d + w] = vc[s + w];
    var out = vec2<f32>(0.0, 0.0);
    for (var e = 0u; e < 2u; e = e + 1u) {
        let el = 2u * w + e;
        let head = el - el % hd;
        let j = el % hd;
        if j >= n_rot {
            out[e] = k_at(s, el);
            continue;
        }
        // j is the first (x0) or second (x1) member of pair p, as ggml pairs them.
        var p = j / 2u;
        var first = j % 2u == 0u;
        var partner = el + 1u;
        if prm[4] != 0u {
            first = j < half_rot;
            p = select(j - half_rot, j, first);
            partner = select(el - half_rot, el + half_rot, first);
        } else if !first {
            partner = el - 1u;
        }
        let c = pf(CACHE + 2u * p);
        let sn = pf(CACHE + 2u * p + 1u);
        if first {
            out[e] = fma(k_at(s, el), c, -(k_at(s, partner) * sn));
        } else {
            out[e] = fma(k_at(s, partner), sn, k_at(s, el) * c);
        }
    }
    kc[d + w] = pack2x16float(out);
}
