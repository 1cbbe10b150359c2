// Rotary embedding with the cos/sin pairs of each token's position computed on the host
// exactly as the CPU backend's rope cache (libm cos/sin: the GPU's differ by ulps, which
// moves later Q8 roundings). One invocation per (token, head, rotated pair) (rope_core.wgsl).
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
    rope_pair(g, n_head, hd, n_rot, prm[4] != 0u, CS);
}
