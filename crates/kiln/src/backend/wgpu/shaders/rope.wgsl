// Rotary embedding with the cos/sin pairs of each token's position computed on the host
// exactly as the CPU backend's rope cache (libm cos/sin: the GPU's differ by ulps, which
// moves later Q8 roundings). One invocation per (token, head, rotated pair); one product
// is fused into an fma, as the CPU (and GCC's build of ggml) does.
// prm: n_tok, n_head, head_dim, n_rot, neox, then per token n_rot values (cos, sin)...
@group(0) @binding(0) var<storage, read> prm: array<u32>;
@group(0) @binding(1) var<storage, read_write> xa: array<f32>;

const CS: u32 = 5u;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let g = gidx(wid, nwg, lid);
    let n_head = prm[1];
    let hd = prm[2];
    let n_rot = prm[3];
    let half_rot = n_rot / 2u;
    if g >= prm[0] * n_head * half_rot {
        return;
    }
    let pair = g % half_rot;
    let th = g / half_rot;
    let t = th / n_head;
    let h = th % n_head;
    let cs = pf(CS + t * n_rot + 2u * pair);
    let sn = pf(CS + t * n_rot + 2u * pair + 1u);
    let base = (t * n_head + h) * hd;
    var i0 = base + 2u * pair;
    var i1 = i0 + 1u;
    if prm[4] != 0u {
        i0 = base + pair;
        i1 = i0 + half_rot;
    }
    let x0 = xa[i0];
    let x1 = xa[i1];
    xa[i0] = fma_x(x0, cs, -nc(x1 * sn));
    xa[i1] = fma_x(x0, sn, nc(x1 * cs));
}
