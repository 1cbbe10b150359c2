//! The projectors' reshuffles on row-major `[rows, dim]` f32 buffers (pixel shuffle, average
//! pooling), done on the host between the encoder's backend ops.

/// Idefics3's pixel shuffle: the `side` × `side` grid of `dim`-wide rows becomes a
/// `side/s` × `side/s` grid whose rows hold the `s` × `s` block's rows side by side (block
/// row by block row), as llama.cpp's `build_patch_merge_permute`.
pub fn pixel_shuffle(x: &[f32], side: usize, dim: usize, s: usize) -> Vec<f32> {
    let so = side / s;
    let mut out = vec![0f32; x.len()];
    for oy in 0..so {
        for ox in 0..so {
            for i in 0..s {
                for j in 0..s {
                    let src = ((oy * s + i) * side + ox * s + j) * dim;
                    let dst = (oy * so + ox) * s * s * dim + (i * s + j) * dim;
                    out[dst..dst + dim].copy_from_slice(&x[src..src + dim]);
                }
            }
        }
    }
    out
}

/// `s` × `s` average pooling (stride `s`) of a `side` × `side` grid of `dim`-wide rows, summed
/// in ggml's order (kernel rows, then columns) and divided once.
pub fn avg_pool(x: &[f32], side: usize, dim: usize, s: usize) -> Vec<f32> {
    let so = side / s;
    let mut out = vec![0f32; so * so * dim];
    for oy in 0..so {
        for ox in 0..so {
            let o = &mut out[(oy * so + ox) * dim..(oy * so + ox + 1) * dim];
            for ky in 0..s {
                for kx in 0..s {
                    let src = ((oy * s + ky) * side + ox * s + kx) * dim;
                    o.iter_mut().zip(&x[src..src + dim]).for_each(|(o, v)| *o += v);
                }
            }
            let ka = (s * s) as f32;
            o.iter_mut().for_each(|o| *o /= ka);
        }
    }
    out
}
