// The expert-indexed matmuls' slots (matmul_id.wgsl, matmul_id_vec.wgsl): slot s is a
// token's j-th chosen expert, e = ids[s], its input row t = s / k (the token), or t = s
// where each slot has its own input row (the down projection). The experts live in
// `prm[9]`-row strides of the weight buffer (a 3-D tensor, its experts prm[12]..prm[13] in
// this buffer); this matrix's rows start at row prm[8] of each. The ids are bound at IDS.
// prm: n_rows, k, n_slots, row_size, out_stride, (unused), x scales word, x sums word,
// first row within an expert, rows per expert, k (slots per token), per-slot input,
// first expert in the buffer, end of its experts, first slot of the dispatch.
@group(0) @binding(IDS) var<storage, read> ids: array<f32>;

// Slot `s`'s expert relative to the buffer (clamped into it) and whether it lies there.
fn slot_expert(s: u32) -> vec2<u32> {
    let e = u32(ids[s]);
    let inside = e >= prm[12] && e < prm[13];
    return vec2<u32>(select(0u, e - prm[12], inside), u32(inside));
}

fn slot_token(s: u32) -> u32 {
    return select(s / prm[10], s, prm[11] == 1u);
}
