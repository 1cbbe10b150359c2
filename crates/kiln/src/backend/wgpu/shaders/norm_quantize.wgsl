// The norm kernels' fused tail: the rows just normalized (ys) quantized for the matmul
// that reads them (quantize_core.wgsl), one dispatch instead of two. prm[5]: the mode.
@group(0) @binding(XQ) var<storage, read_write> xq: array<u32>;

fn norm_tail(r: u32, lid: u32) {
    let dim = prm[1];
    let nw = dim / 4u;
    // Invocations read values other invocations of this workgroup stored.
    storageBarrier();
    for (var j0 = 0u; j0 < nw; j0 = j0 + NT) {
        let j = j0 + lid;
        let w = r * nw + min(j, nw - 1u);
        let o = 4u * w;
        let v = vec4<f32>(ys[o], ys[o + 1u], ys[o + 2u], ys[o + 3u]);
        quantize_word(w, v, j < nw, lid, prm[5], prm[0], dim);
    }
}
