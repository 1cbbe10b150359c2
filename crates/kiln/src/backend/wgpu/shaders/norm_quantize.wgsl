// The norm kernels' fused tail: the slice just normalized quantized for the matmul that
// reads it (quantize_core.wgsl), one dispatch instead of two. prm[5]: the mode.
@group(0) @binding(XQ) var<storage, read_write> xq: array<u32>;

fn norm_tail(w: u32, v: vec4<f32>, live: bool, lid: u32) {
    quantize_word(w, v, live, lid, prm[5], prm[0], prm[1]);
}
