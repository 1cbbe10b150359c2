//! The vision encoder's own operations on row-major `[rows, dim]` f32 buffers: LayerNorm
//! (sums in f64, as ggml's), bidirectional multi-head attention (every query against every
//! key, no mask), and the projectors' reshuffles (pixel shuffle, average pooling). RMSNorm
//! and GELU are the CPU backend's.

use half::f16;

/// Adds `b` to every row (rows of `b.len()`).
pub fn add_rows(x: &mut [f32], b: &[f32]) {
    for row in x.chunks_exact_mut(b.len()) {
        row.iter_mut().zip(b).for_each(|(x, b)| *x += b);
    }
}

/// `out = (x - mean) / sqrt(var + eps) * w + b` per row of `dim` (ggml_norm, then the
/// weight and bias).
pub fn layer_norm(x: &[f32], out: &mut [f32], dim: usize, w: &[f32], b: Option<&[f32]>, eps: f32) {
    for (xr, yr) in x.chunks_exact(dim).zip(out.chunks_exact_mut(dim)) {
        let mean = (xr.iter().map(|&v| v as f64).sum::<f64>() / dim as f64) as f32;
        let mut var = 0f64;
        for (y, &v) in yr.iter_mut().zip(xr) {
            *y = v - mean;
            var += (*y * *y) as f64;
        }
        let scale = 1.0 / ((var / dim as f64) as f32 + eps).sqrt();
        for (i, y) in yr.iter_mut().enumerate() {
            *y = *y * scale * w[i] + b.map_or(0.0, |b| b[i]);
        }
    }
}

fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for i in 0..8 {
            acc[i] += x[i] * y[i];
        }
    }
    let tail: f32 = ra.iter().zip(rb).map(|(x, y)| x * y).sum();
    acc.iter().sum::<f32>() + tail
}

/// Bidirectional attention: for each head, every one of the `n` queries against all `n`
/// keys, softmax of `scale · q·k`, the weighted sum of values. `q`, `k`, `v` and `out` are
/// `[n, n_head * head_dim]`. Queries, keys and values are rounded to f16 first, as llama.cpp's
/// flash attention casts them; sums are f32. Heads are spread over `n_threads` threads; each
/// row's arithmetic is the same whatever the split.
#[allow(clippy::too_many_arguments)]
pub fn attention(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    out: &mut [f32],
    n: usize,
    n_head: usize,
    head_dim: usize,
    scale: f32,
    n_threads: usize,
) {
    let d = n_head * head_dim;
    let r16 = |x: f32| f16::from_f32(x).to_f32();
    // Per head, contiguous [n, head_dim] copies (f16-rounded).
    let per_head = |src: &[f32]| -> Vec<Vec<f32>> {
        (0..n_head)
            .map(|h| {
                (0..n)
                    .flat_map(|j| {
                        src[j * d + h * head_dim..j * d + (h + 1) * head_dim].iter().map(|&x| r16(x))
                    })
                    .collect()
            })
            .collect()
    };
    let (qh, kh, vh) = (per_head(q), per_head(k), per_head(v));
    let mut outs: Vec<Vec<f32>> = vec![Vec::new(); n_head];
    let threads = n_threads.clamp(1, n_head);
    std::thread::scope(|s| {
        for (t, chunk) in outs.chunks_mut(n_head.div_ceil(threads)).enumerate() {
            let (qh, kh, vh) = (&qh, &kh, &vh);
            s.spawn(move || {
                let first = t * n_head.div_ceil(threads);
                let mut scores = vec![0f32; n];
                for (hi, o) in chunk.iter_mut().enumerate() {
                    let h = first + hi;
                    *o = vec![0f32; n * head_dim];
                    for i in 0..n {
                        let qi = &qh[h][i * head_dim..(i + 1) * head_dim];
                        let mut max = f32::NEG_INFINITY;
                        for (j, sc) in scores.iter_mut().enumerate() {
                            *sc = scale * dot(qi, &kh[h][j * head_dim..(j + 1) * head_dim]);
                            max = max.max(*sc);
                        }
                        let mut sum = 0f32;
                        for sc in scores.iter_mut() {
                            *sc = (*sc - max).exp();
                            sum += *sc;
                        }
                        let oi = &mut o[i * head_dim..(i + 1) * head_dim];
                        for (j, &p) in scores.iter().enumerate() {
                            let vj = &vh[h][j * head_dim..(j + 1) * head_dim];
                            oi.iter_mut().zip(vj).for_each(|(o, v)| *o += p * v);
                        }
                        let inv = 1.0 / sum;
                        oi.iter_mut().for_each(|o| *o *= inv);
                    }
                }
            });
        }
    });
    for (h, o) in outs.iter().enumerate() {
        for i in 0..n {
            out[i * d + h * head_dim..i * d + (h + 1) * head_dim]
                .copy_from_slice(&o[i * head_dim..(i + 1) * head_dim]);
        }
    }
}

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
