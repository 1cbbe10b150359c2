// The vec matmul (matmul_vec.wgsl) through experts, for hardware GPUs: a workgroup takes
// RG rows of one expert slot (expert_slots.wgsl; TT is 1), each slot's row read at the
// dense vec kernel's bandwidth and summed with its arithmetic, so a slot's value is the
// dense vec matmul's of its expert's row, whatever else is in the batch. Slots whose
// expert lies in another buffer of the tensor compute a clamped row, not stored.

fn first_token(z: u32) -> u32 {
    return prm[14] + z;
}

fn first_row(s: u32) -> u32 {
    return slot_expert(s).x * prm[9] + prm[8];
}

// The slot's activation row (per token, or per slot where each slot has its own).
fn x_row(s: u32) -> u32 {
    return slot_token(s);
}

// (No prologue: the expert matmuls' input is quantized before them.)
fn in_row(s: u32) -> u32 {
    return slot_token(s);
}

// (`store_out`, kernels.rs: to the output that holds row r, rows of prm[4] each.)
fn store(s: u32, r: u32, v: f32) {
    if slot_expert(s).y == 1u {
        store_out(s, r, v);
    }
}

// (Read only by the RoPE store, which these matmuls do not take.)
fn biased(r: u32, v: f32) -> f32 {
    return v;
}
