// Rotary embedding as ggml's rope_ext (NORM/NEOX, frequency factors, YaRN ramp), one
// invocation per (token, head, rotated pair). theta is stepped by repeated multiplication
// like ggml's rope cache. prm: n_tok, n_head, head_dim, n_rot, neox, theta_scale,
// freq_scale, ext_factor, attn_factor, corr0, corr1, ff_off (0 = none), pos...
@group(0) @binding(0) var<storage, read> prm: array<u32>;
@group(0) @binding(1) var<storage, read_write> xa: array<f32>;

const POS: u32 = 12u;

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
    let theta_scale = pf(5u);
    var theta = f32(prm[POS + t]);
    for (var i = 0u; i < pair; i = i + 1u) {
        theta = theta * theta_scale;
    }
    var ff = 1.0;
    if prm[11] != 0u {
        ff = pf(prm[11] + pair);
    }
    let freq_scale = pf(6u);
    let ext = pf(7u);
    let theta_extrap = theta / ff;
    let theta_interp = freq_scale * theta_extrap;
    var a = theta_interp;
    var mscale = pf(8u);
    if ext != 0.0 {
        let y = (f32(pair) - pf(9u)) / max(0.001, pf(10u) - pf(9u));
        let ramp_mix = (1.0 - clamp(y, 0.0, 1.0)) * ext;
        a = theta_interp * (1.0 - ramp_mix) + theta_extrap * ramp_mix;
        mscale = mscale * (1.0 + 0.1 * log(1.0 / freq_scale));
    }
    let cs = cos(a) * mscale;
    let sn = sin(a) * mscale;
    let base = (t * n_head + h) * hd;
    var i0 = base + 2u * pair;
    var i1 = i0 + 1u;
    if prm[4] != 0u {
        i0 = base + pair;
        i1 = i0 + half_rot;
    }
    let x0 = xa[i0];
    let x1 = xa[i1];
    xa[i0] = x0 * cs - x1 * sn;
    xa[i1] = x0 * sn + x1 * cs;
}
