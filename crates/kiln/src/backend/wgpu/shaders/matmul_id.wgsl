
// Expert-indexed matmul (appended to matmul.wgsl): out[s, r] = dot(w[e][r], x[t]) for each
// slot s (a token's j-th chosen expert) with e = ids[s] and t = s / k (the token), or
// t = s where each slot has its own input row (the down projection). Every slot's dot is
// the dense matmul's of the same row (row_dot, dot_wg), so a token's result does not
// depend on which other tokens share its experts. The experts live in `prm[9]`-row
// strides of the weight buffer (a 3-D tensor, its experts prm[12]..prm[13] in this
// buffer); this matrix's rows start at row prm[8] of each.
// prm: n_rows, k, n_slots, row_size, out_stride, (unused), x scales word, x sums word,
// first row within an expert, rows per expert, k (slots per token), per-slot input,
// first expert in the buffer, end of its experts, first slot of the dispatch.
@group(0) @binding(4) var<storage, read> ids: array<f32>;

// Slot `s`'s expert relative to the buffer (clamped into it) and whether it lies there.
fn slot_expert(s: u32) -> vec2<u32> {
    let e = u32(ids[s]);
    let inside = e >= prm[12] && e < prm[13];
    return vec2<u32>(select(0u, e - prm[12], inside), u32(inside));
}

fn slot_token(s: u32) -> u32 {
    return select(s / prm[10], s, prm[11] == 1u);
}

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
