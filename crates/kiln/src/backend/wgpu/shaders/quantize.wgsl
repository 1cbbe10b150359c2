// Activations quantized for a matmul (quant_core.wgsl), one word per invocation.
// QuantizeGlu quantizes act(gate) * up, computed here and stored back to the gate rows
// (the deferred glu op; glu.wgsl).
// prm: mode (0 Q8_0, 1 Q8_K, 2 F16, 3 Q8_1), n_tok, k (, glu act).
@group(0) @binding(0) var<storage, read> prm: array<u32>;
@group(0) @binding(2) var<storage, read_write> xq: array<u32>;
//INPUT

fn q_mode() -> u32 {
    return prm[0];
}

fn q_ntok() -> u32 {
    return prm[1];
}

fn q_k() -> u32 {
    return prm[2];
}

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let w = gidx(wid, nwg, lid);
    quant_word(w, lid, w < prm[1] * prm[2] / 4u);
}
