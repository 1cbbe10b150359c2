// The tile matmul (matmul_coop.wgsl) through experts, for prompts: each workgroup takes one
// expert's next tile of up to BM slots (expert_group.wgsl's tile table, from the grid's x)
// by BN of that expert's weight rows (y), gathering each slot's activation row (its token's,
// or its own where each slot has one) and storing each result row to the slot. So an
// expert's weights are read once per tile of its slots, not once per slot.
// prm: as the dense tile matmul's (n_rows, k, -, row_size, out_stride, col0 0, -, -, first
// row within an expert, output boundary), then 11: rows per expert, 12: slots per token,
// 13: per-slot input, 14..15: the experts in this weight buffer, 16: where the groups' slot
// list starts, 17: where their tile table starts.
@group(0) @binding(GRP) var<storage, read> grp: array<u32>;

// Tile wid.x of the table: (its first list entry, the end of its expert's entries, its
// expert's first row in the buffer, its first weight row); no tokens where the table has no
// such tile or its expert lies in another buffer.
fn tile(wid: vec3<u32>) -> vec4<u32> {
    let at = prm[17] + 3u * wid.x;
    let e = grp[at];
    if e < prm[14] || e >= prm[15] {
        return vec4<u32>(1u, 0u, 0u, 0u);
    }
    return vec4<u32>(grp[at + 1u], grp[at + 2u], (e - prm[14]) * prm[11] + prm[8], wid.y * BN);
}

fn x_row(t: u32) -> u32 {
    let s = grp[prm[16] + t];
    return select(s / prm[12], s, prm[13] == 1u);
}

fn store(t: u32, r: u32, v: f32) {
    store_slot(grp[prm[16] + t], r, v);
}
