// The attention kernels' fused tail where a head is part of a quantization block (a Q8_K
// superblock of 256 values over heads of 64 or 128: Q4_K's and Q6_K's activations): each
// (token, head)'s workgroup counts itself done in its block's counter (last_done.wgsl),
// and the last of the block's heads to finish quantizes the whole block
// (quantize_core.wgsl), reading the other heads' outputs from `ys`. A block never spans
// tokens (a row of heads is whole blocks). prm[3]: head_dim; prm[8]: the mode (Q8_K).
@group(0) @binding(XQ) var<storage, read_write> xq: array<u32>;

fn attn_tail(w: u32, live: bool, lid: u32) {
    attn_block(w, lid);
}

fn attn_tail_of(w: u32, v: vec4<f32>, live: bool, lid: u32) {
    attn_block(w, lid);
}

// w: a word of this workgroup's head (all of them lie in one block of 64 words). Every
// invocation of the workgroup (64 or more) calls it.
fn attn_block(w: u32, lid: u32) {
    let hd = prm[3];
    let blk = w / 64u;
    if !last_done(blk, 256u / hd, lid) {
        return;
    }
    let wq = 64u * blk + min(lid, 63u);
    let o = 4u * wq;
    let v = vec4<f32>(ys[o], ys[o + 1u], ys[o + 2u], ys[o + 3u]);
    quantize_word(wq, v, lid < 64u, lid, prm[8], prm[0], prm[1] * hd);
}
