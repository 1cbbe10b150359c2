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

#[inline(always)]
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
/// row's arithmetic is the same whatever the split, and on every CPU tier: the AVX2 build
/// of [`head`] vectorizes its lanes without reordering a sum, and the softmax's `expf` is
/// libm's bits sixteen at a time (`backend::cpu::expf`).
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
    attention_with(q, k, v, out, (n, n_head, head_dim), scale, n_threads, simd_head())
}

/// One head's attention (`head`'s arguments, its `expf` chosen).
type HeadFn = fn(&[f32], &[f32], &[f32], usize, usize, f32, &mut [f32]);

/// `x[i] = expf(x[i])`: libm's bits, sixteen at a time where the CPU has AVX-512.
fn expf_simd(x: &mut [f32]) {
    crate::backend::cpu::expf::expf_slice(x)
}

/// [`head`] built for this CPU's vector units where kiln has a build for them.
fn simd_head() -> HeadFn {
    #[cfg(target_arch = "x86_64")]
    if crate::quant::cpu_tier() >= crate::quant::CpuTier::Avx2 {
        return |q, k, v, n, hd, scale, o| {
            // SAFETY: the CPU has AVX2.
            unsafe { head_avx2(q, k, v, n, hd, scale, o) }
        };
    }
    |q, k, v, n, hd, scale, o| head(q, k, v, n, hd, scale, o, expf_simd)
}

#[allow(clippy::too_many_arguments)]
fn attention_with(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    out: &mut [f32],
    (n, n_head, head_dim): (usize, usize, usize),
    scale: f32,
    n_threads: usize,
    head_fn: HeadFn,
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
                for (hi, o) in chunk.iter_mut().enumerate() {
                    let h = first + hi;
                    *o = vec![0f32; n * head_dim];
                    head_fn(&qh[h], &kh[h], &vh[h], n, head_dim, scale, o);
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

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
#[allow(clippy::too_many_arguments)]
unsafe fn head_avx2(q: &[f32], k: &[f32], v: &[f32], n: usize, hd: usize, scale: f32, o: &mut [f32]) {
    head(q, k, v, n, hd, scale, o, expf_simd)
}

/// One head: `q`, `k`, `v` and `o` are `[n, hd]`, `o` zeroed; `exp` takes `expf` of a
/// slice. Each value's arithmetic is written out in order (Rust neither fuses nor reorders
/// float operations), so any build of it gives the same bits.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn head(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    n: usize,
    hd: usize,
    scale: f32,
    o: &mut [f32],
    exp: fn(&mut [f32]),
) {
    let mut scores = vec![0f32; n];
    for i in 0..n {
        let qi = &q[i * hd..(i + 1) * hd];
        let mut max = f32::NEG_INFINITY;
        for (j, sc) in scores.iter_mut().enumerate() {
            *sc = scale * dot(qi, &k[j * hd..(j + 1) * hd]);
            max = max.max(*sc);
        }
        scores.iter_mut().for_each(|sc| *sc -= max);
        exp(&mut scores);
        let mut sum = 0f32;
        for &sc in scores.iter() {
            sum += sc;
        }
        let oi = &mut o[i * hd..(i + 1) * hd];
        for (j, &p) in scores.iter().enumerate() {
            let vj = &v[j * hd..(j + 1) * hd];
            oi.iter_mut().zip(vj).for_each(|(o, v)| *o += p * v);
        }
        let inv = 1.0 / sum;
        oi.iter_mut().for_each(|o| *o *= inv);
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

#[cfg(test)]
mod tests {
    /// The attention of this CPU's tier gives the bits of the portable build with libm's
    /// scalar `expf` (scores spread widely, so the softmax's `expf` meets large negative
    /// arguments and underflow), on a head size with a tail past the 8-lane chunks and one
    /// without, on one thread and two.
    #[test]
    fn simd_attention_equals_the_portable_build() {
        let mut seed = 5u64;
        let mut next = move || {
            seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((seed >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 8.0
        };
        for (n, n_head, hd) in [(37, 3, 64), (20, 2, 36)] {
            let len = n * n_head * hd;
            let (q, k, v): (Vec<f32>, Vec<f32>, Vec<f32>) = (
                (0..len).map(|_| next()).collect(),
                (0..len).map(|_| next()).collect(),
                (0..len).map(|_| next()).collect(),
            );
            let mut want = vec![0f32; len];
            let scalar: super::HeadFn = |q, k, v, n, hd, scale, o| {
                super::head(q, k, v, n, hd, scale, o, |x| x.iter_mut().for_each(|v| *v = v.exp()))
            };
            super::attention_with(&q, &k, &v, &mut want, (n, n_head, hd), 0.9, 1, scalar);
            for threads in [1, 2] {
                let mut got = vec![0f32; len];
                super::attention(&q, &k, &v, &mut got, n, n_head, hd, 0.9, threads);
                let bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&got), bits(&want), "n {n} heads {n_head} hd {hd} threads {threads}");
            }
            assert!(want.iter().all(|x| x.is_finite()) && want.iter().any(|&x| x != 0.0));
        }
    }
}
