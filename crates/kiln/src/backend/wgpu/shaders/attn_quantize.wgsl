// The attention kernel's fused tail: the head's output (whole quantization blocks: head_dim
// is a multiple of the block) quantized for the matmul that reads it (quantize_core.wgsl),
// one dispatch instead of two. prm[8]: the mode.
@group(0) @binding(XQ) var<storage, read_write> xq: array<u32>;

fn attn_tail(w: u32, live: bool, lid: u32) {
    // Invocations read values other invocations of this workgroup stored.
    storageBarrier();
    let o = 4u * w;
    attn_tail_of(w, vec4<f32>(ys[o], ys[o + 1u], ys[o + 2u], ys[o + 3u]), live, lid);
}

// The same for word w's values `v` at hand (the split kernel passes them in workgroup
// memory rather than through the output buffer).
fn attn_tail_of(w: u32, v: vec4<f32>, live: bool, lid: u32) {
    quantize_word(w, v, live, lid, prm[8], prm[0], prm[1] * prm[3]);
}
