// The attention kernel's fused tail: the head's output (whole quantization blocks: head_dim
// is a multiple of the block) quantized for the matmul that reads it (quantize_core.wgsl),
// one dispatch instead of two. prm[8]: the mode.
@group(0) @binding(XQ) var<storage, read_write> xq: array<u32>;

fn attn_tail(w: u32, live: bool, lid: u32) {
    // Invocations read values other invocations of this workgroup stored.
    storageBarrier();
    let o = 4u * w;
    let v = vec4<f32>(ys[o], ys[o + 1u], ys[o + 2u], ys[o + 3u]);
    quantize_word(w, v, live, lid, prm[8], prm[0], prm[1] * prm[3]);
}
