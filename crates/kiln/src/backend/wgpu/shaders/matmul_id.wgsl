// Expert-indexed matmul (appended to matmul.wgsl, with expert_slots.wgsl): out[s, r] =
// dot(w[e][r], x[t]) for each slot s through its expert e. Every slot's dot is the dense
// matmul's of the same row (row_dot, dot_wg), so a token's result does not depend on
// which other tokens share its experts.

// An invocation per row (software adapters), a slot per workgroup row of the grid's z.
@compute @workgroup_size(64)
fn by_id_rows(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
              @builtin(local_invocation_index) lid: u32) {
    let r = (wid.y * nwg.x + wid.x) * WG + lid;
    let s = prm[14] + wid.z;
    let e = slot_expert(s);
    if r >= prm[0] || e.y == 0u {
        return;
    }
    let v = row_dot((e.x * prm[9] + prm[8] + r) * prm[3], slot_token(s), prm[1]);
    ys[s * prm[4] + r] = v;
}

// A workgroup per RG rows, as matmul.wgsl's main; every invocation reaches every barrier.
@compute @workgroup_size(256)
fn by_id_exact(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
               @builtin(local_invocation_index) li: u32) {
    let row = wg_row(wid, nwg, li);
    let s = prm[14] + wid.z;
    let e = slot_expert(s);
    let v = dot_wg((e.x * prm[9] + prm[8] + row.rr) * prm[3], slot_token(s), prm[1], row.lid);
    if row.lid == 0u && row.r < prm[0] && e.y == 1u {
        ys[s * prm[4] + row.r] = v;
    }
}
