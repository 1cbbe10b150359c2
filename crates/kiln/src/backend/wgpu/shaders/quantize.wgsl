// Activations quantized to the weight's dot type (quantize_core.wgsl), a workgroup of 64
// invocations taking 256 values. QuantizeGlu quantizes act(gate) * up, computed here and
// stored back to the gate rows (the deferred glu op; glu.wgsl).
// prm: mode (0 Q8_0, 1 Q8_K, 2 F16, 3 Q8_1, 4 F16 packed), n_tok, k (, glu act).
@group(0) @binding(0) var<storage, read> prm: array<u32>;
@group(0) @binding(2) var<storage, read_write> xq: array<u32>;
//INPUT

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let w = gidx(wid, nwg, lid);
    let n_words = prm[1] * prm[2] / 4u;
    let live = w < n_words;
    let v = x4(4u * min(w, n_words - 1u), live);
    quantize_word(min(w, n_words - 1u), v, live, lid, prm[0], prm[1], prm[2]);
}
