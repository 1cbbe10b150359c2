//! Bidirectional attention of one whole sequence held in plain `[n, n_head * head_dim]`
//! buffers (a vision encoder's patches: every query against every key, no mask, no cache),
//! in the arithmetic of llama.cpp's CPU flash attention for such inputs: the CPU backend's
//! `attention_whole`.

use half::f16;

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
/// flash attention casts them. Below [`FA_TILE_Q`] patches the arithmetic is ggml's one-chunk
/// path's ([`head_one_chunk`], llama.cpp's for so few queries); from there on sums are f32
/// ([`head`]: llama.cpp's tiled path also keeps f32, in an order kiln does not copy). Heads are
/// spread over `n_threads` threads; each row's arithmetic is the same whatever the split, and
/// on every CPU tier: the AVX2 build of [`head`] vectorizes its lanes without reordering a
/// sum, and the softmax's `expf` is libm's bits sixteen at a time (`backend::cpu::expf`).
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
    let head_fn = if n < FA_TILE_Q { head_one_chunk } else { simd_head() };
    attention_with(q, k, v, out, (n, n_head, head_dim), scale, n_threads, head_fn)
}

/// Queries per tile of ggml's tiled CPU flash attention (`GGML_FA_TILE_Q`): with fewer
/// queries llama.cpp takes its one-chunk path ([`head_one_chunk`]).
const FA_TILE_Q: usize = 64;

/// `ggml_vec_dot_f16` of two rows of f16 values (widened) on an AVX-512 build: four
/// accumulators of sixteen lanes over whole steps of 64 (fused multiply-adds), summed as
/// `GGML_F32x16_REDUCE`, then the leftovers one at a time in f64.
fn dot_f16_ggml(x: &[f32], y: &[f32]) -> f32 {
    let n = x.len();
    let np = n / 64 * 64;
    let mut acc = [[0f32; 16]; 4];
    for i0 in (0..np).step_by(64) {
        for (j, a) in acc.iter_mut().enumerate() {
            for (l, a) in a.iter_mut().enumerate() {
                let i = i0 + 16 * j + l;
                *a = x[i].mul_add(y[i], *a);
            }
        }
    }
    let r: [f32; 16] = std::array::from_fn(|l| (acc[0][l] + acc[2][l]) + (acc[1][l] + acc[3][l]));
    let h: [f32; 8] = std::array::from_fn(|l| r[l] + r[l + 8]);
    let q: [f32; 4] = std::array::from_fn(|l| h[l] + h[l + 4]);
    let mut sum = ((q[0] + q[2]) + (q[1] + q[3])) as f64;
    for i in np..n {
        sum += (x[i] * y[i]) as f64;
    }
    sum as f32
}

/// One head as ggml's one-chunk flash attention (`ggml_compute_forward_flash_attn_ext_f16_one_chunk`)
/// computes it with f16 K and V: per query, keys in order, the score `dot · scale`, an
/// online softmax whose output accumulator is f16 (rounded after every rescale and every
/// fused multiply-add), the sum of weights with an FMA, and the output scaled by `1 / sum`.
/// `q`, `k`, `v` hold f16 values (widened).
fn head_one_chunk(q: &[f32], k: &[f32], v: &[f32], n: usize, hd: usize, scale: f32, o: &mut [f32]) {
    let r16 = |x: f32| f16::from_f32(x).to_f32();
    let mut acc = vec![0f32; hd];
    for i in 0..n {
        let qi = &q[i * hd..(i + 1) * hd];
        let (mut m, mut sum) = (f32::NEG_INFINITY, 0f32);
        acc.iter_mut().for_each(|a| *a = 0.0);
        for j in 0..n {
            let s = dot_f16_ggml(&k[j * hd..(j + 1) * hd], qi) * scale;
            let (mut ms, mut vs) = (1f32, 1f32);
            if s > m {
                let old = m;
                m = s;
                ms = (old - m).exp();
                acc.iter_mut().for_each(|a| *a = r16(*a * ms));
            } else {
                vs = (s - m).exp();
            }
            let vj = &v[j * hd..(j + 1) * hd];
            acc.iter_mut().zip(vj).for_each(|(a, &x)| *a = r16(x.mul_add(vs, *a)));
            sum = sum.mul_add(ms, vs);
        }
        let inv = if sum == 0.0 { 0.0 } else { 1.0 / sum };
        o[i * hd..(i + 1) * hd].iter_mut().zip(&acc).for_each(|(o, &a)| *o = a * inv);
    }
}

/// One head's attention (`head`'s arguments, its `expf` chosen).
pub(super) type HeadFn = fn(&[f32], &[f32], &[f32], usize, usize, f32, &mut [f32]);

/// `x[i] = expf(x[i])`: libm's bits, sixteen at a time where the CPU has AVX-512.
fn expf_simd(x: &mut [f32]) {
    crate::backend::cpu::expf::expf_slice(x)
}

/// [`head`] built for this CPU's vector units where kiln has a build for them.
fn simd_head() -> HeadFn {
    #[cfg(target_arch = "x86_64")]
    {
        use crate::quant::{cpu_tier, CpuTier};
        if cpu_tier() >= CpuTier::Avx512 {
            return |q, k, v, n, hd, scale, o| {
                // SAFETY: the CPU has AVX-512 F.
                unsafe { head_avx512(q, k, v, n, hd, scale, o) }
            };
        }
        if cpu_tier() >= CpuTier::Avx2 {
            return |q, k, v, n, hd, scale, o| {
                // SAFETY: the CPU has AVX2.
                unsafe { head_avx2(q, k, v, n, hd, scale, o) }
            };
        }
    }
    |q, k, v, n, hd, scale, o| head_plain(q, k, v, n, hd, scale, o, expf_simd)
}

/// [`head`] with the plain score and sum steps ([`scores`], [`weighted_sum`]): the portable
/// build and the AVX2 one (which vectorizes their lanes).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn head_plain(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    n: usize,
    hd: usize,
    scale: f32,
    o: &mut [f32],
    exp: fn(&mut [f32]),
) {
    head(q, v, n, hd, o, exp, |qi, s| scores(qi, k, hd, scale, s), weighted_sum)
}

/// One query's scores against all keys, [`dot`] by [`dot`].
fn scores(qi: &[f32], k: &[f32], hd: usize, scale: f32, scores: &mut [f32]) {
    for (j, sc) in scores.iter_mut().enumerate() {
        *sc = scale * dot(qi, &k[j * hd..(j + 1) * hd]);
    }
}

/// `o += p_j · v_j` over the keys in order (`o` zeroed, `v` of rows of `o.len()`).
#[inline(always)]
fn weighted_sum(p: &[f32], v: &[f32], o: &mut [f32]) {
    let hd = o.len();
    for (j, &p) in p.iter().enumerate() {
        let vj = &v[j * hd..(j + 1) * hd];
        o.iter_mut().zip(vj).for_each(|(o, v)| *o += p * v);
    }
}

#[allow(clippy::too_many_arguments)]
pub(super) fn attention_with(
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
    // Per head, contiguous [n, head_dim] copies, f16-rounded (as the F16 quantizer rounds).
    let per_head = |src: &[f32]| -> Vec<Vec<f32>> {
        (0..n_head)
            .map(|h| {
                let mut raw = Vec::with_capacity(n * head_dim);
                for j in 0..n {
                    raw.extend_from_slice(&src[j * d + h * head_dim..][..head_dim]);
                }
                let mut head = vec![0f32; n * head_dim];
                crate::quant::round_f16_rows(&raw, bytemuck::cast_slice_mut(&mut head));
                head
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
    head_plain(q, k, v, n, hd, scale, o, expf_simd)
}

/// [`head`] on AVX-512 registers, the same bits: sixteen keys' scores a vector
/// ([`scores_avx512`]) and, for head sizes up to 128, the weighted sum of values held in
/// registers across the keys instead of in memory.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
#[allow(clippy::too_many_arguments)]
unsafe fn head_avx512(q: &[f32], k: &[f32], v: &[f32], n: usize, hd: usize, scale: f32, o: &mut [f32]) {
    let kt = keys_by_sixteen(k, n, hd);
    let score_row = |qi: &[f32], s: &mut [f32]| {
        // SAFETY: the CPU has AVX-512 F (this function's own feature).
        unsafe { scores_avx512(qi, k, &kt, hd, scale, s) }
    };
    if hd <= 128 {
        head(q, v, n, hd, o, expf_simd, score_row, |p, v, o| {
            // SAFETY: as above; o fits eight vectors.
            unsafe { weighted_sum_avx512(p, v, o) }
        })
    } else {
        head(q, v, n, hd, o, expf_simd, score_row, weighted_sum)
    }
}

/// The keys of whole groups of sixteen, each group transposed (`[n / 16][hd][16]`): a
/// value's sixteen keys side by side, for [`scores_avx512`].
#[cfg(target_arch = "x86_64")]
fn keys_by_sixteen(k: &[f32], n: usize, hd: usize) -> Vec<f32> {
    let mut kt = vec![0f32; n / 16 * hd * 16];
    for (g, block) in kt.chunks_exact_mut(hd * 16).enumerate() {
        for key in 0..16 {
            let row = &k[(16 * g + key) * hd..(16 * g + key + 1) * hd];
            for (c, &x) in row.iter().enumerate() {
                block[c * 16 + key] = x;
            }
        }
    }
    kt
}

/// One query's scores against all keys, sixteen keys a vector: lane `key` of accumulator
/// `l` is [`dot`]'s lane `l` for that key, and the eight accumulators are summed in
/// [`dot`]'s order, then its tail, so every score has [`dot`]'s bits (keys past the last
/// group of sixteen take [`dot`] itself).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn scores_avx512(qi: &[f32], k: &[f32], kt: &[f32], hd: usize, scale: f32, scores: &mut [f32]) {
    use std::arch::x86_64::*;
    let np = hd / 8 * 8;
    let groups = kt.len() / (hd * 16);
    for (g, block) in kt.chunks_exact(hd * 16).enumerate() {
        let mut acc = [_mm512_setzero_ps(); 8];
        for (q8, k8) in qi[..np].chunks_exact(8).zip(block.chunks_exact(128)) {
            for l in 0..8 {
                // SAFETY: k8 holds 128 values, lane l's sixteen from 16 l.
                let kc = unsafe { _mm512_loadu_ps(k8.as_ptr().add(16 * l)) };
                acc[l] = _mm512_add_ps(acc[l], _mm512_mul_ps(_mm512_set1_ps(q8[l]), kc));
            }
        }
        let mut sum = _mm512_set1_ps(-0.0);
        for a in acc {
            sum = _mm512_add_ps(sum, a);
        }
        let mut s = [0f32; 16];
        // SAFETY: s holds sixteen values.
        unsafe { _mm512_storeu_ps(s.as_mut_ptr(), sum) };
        for (key, s) in s.iter().enumerate() {
            let j = 16 * g + key;
            let tail: f32 = qi[np..].iter().zip(&k[j * hd + np..(j + 1) * hd]).map(|(x, y)| x * y).sum();
            scores[j] = scale * (s + tail);
        }
    }
    for (j, sc) in scores.iter_mut().enumerate().skip(16 * groups) {
        *sc = scale * dot(qi, &k[j * hd..(j + 1) * hd]);
    }
}

/// [`weighted_sum`] with `o` (at most eight 16-lane vectors, the last one masked where
/// `o.len()` is not a multiple of 16) held in registers across the keys: each value's sum
/// in the same order, the same bits.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn weighted_sum_avx512(p: &[f32], v: &[f32], o: &mut [f32]) {
    use std::arch::x86_64::*;
    let hd = o.len();
    let nv = hd.div_ceil(16);
    // Lanes of each vector inside the row, worked out once.
    let masks: [__mmask16; 8] =
        std::array::from_fn(|c| (((1u32 << hd.saturating_sub(16 * c).min(16)) - 1) & 0xffff) as __mmask16);
    let mut acc = [_mm512_setzero_ps(); 8];
    for (j, &pj) in p.iter().enumerate() {
        let pv = _mm512_set1_ps(pj);
        let vj = &v[j * hd..(j + 1) * hd];
        for (c, a) in acc.iter_mut().enumerate().take(nv) {
            // SAFETY: the mask keeps the load inside vj.
            let x = unsafe { _mm512_maskz_loadu_ps(masks[c], vj.as_ptr().add(16 * c)) };
            *a = _mm512_add_ps(*a, _mm512_mul_ps(pv, x));
        }
    }
    for (c, a) in acc.iter().enumerate().take(nv) {
        // SAFETY: the mask keeps the store inside o.
        unsafe { _mm512_mask_storeu_ps(o.as_mut_ptr().add(16 * c), masks[c], *a) };
    }
}

/// One head: `q`, `v` and `o` are `[n, hd]`, `o` zeroed; `exp` takes `expf` of a slice;
/// `score_row` writes a query's scores against every key, each `scale · dot` ([`scores`]),
/// and `sum_row` a row of `o` from the weights ([`weighted_sum`]); the vector builds of both
/// give the same bits. Each value's arithmetic is written out in order (Rust neither fuses
/// nor reorders float operations), so any build of it gives the same bits.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn head(
    q: &[f32],
    v: &[f32],
    n: usize,
    hd: usize,
    o: &mut [f32],
    exp: fn(&mut [f32]),
    score_row: impl Fn(&[f32], &mut [f32]),
    sum_row: impl Fn(&[f32], &[f32], &mut [f32]),
) {
    let mut scores = vec![0f32; n];
    for i in 0..n {
        let qi = &q[i * hd..(i + 1) * hd];
        score_row(qi, &mut scores);
        let max = scores.iter().fold(f32::NEG_INFINITY, |m, &sc| m.max(sc));
        scores.iter_mut().for_each(|sc| *sc -= max);
        exp(&mut scores);
        let mut sum = 0f32;
        for &sc in scores.iter() {
            sum += sc;
        }
        let oi = &mut o[i * hd..(i + 1) * hd];
        sum_row(&scores, v, oi);
        let inv = 1.0 / sum;
        oi.iter_mut().for_each(|o| *o *= inv);
    }
}

/// The tests' reference: the softmax-weighted sums of the F16-rounded values in f64, rows of
/// `n_head · hd` as `attention` writes them.
#[cfg(test)]
pub(super) fn exact(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    (n, n_head, hd): (usize, usize, usize),
    scale: f32,
) -> Vec<f64> {
    let d = n_head * hd;
    let r16 = |x: f32| f16::from_f32(x).to_f32() as f64;
    let mut out = vec![0f64; n * d];
    for h in 0..n_head {
        let at = |x: &[f32], j: usize, c: usize| r16(x[j * d + h * hd + c]);
        for i in 0..n {
            let s: Vec<f64> = (0..n)
                .map(|j| (0..hd).map(|c| at(q, i, c) * at(k, j, c)).sum::<f64>() * scale as f64)
                .collect();
            let m = s.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let w: Vec<f64> = s.iter().map(|x| (x - m).exp()).collect();
            let z: f64 = w.iter().sum();
            for c in 0..hd {
                out[i * d + h * hd + c] = (0..n).map(|j| w[j] * at(v, j, c)).sum::<f64>() / z;
            }
        }
    }
    out
}

/// The tests' inputs: q, k and v of `len` values each, uniform in ±`amp`/2 from `seed`.
#[cfg(test)]
pub(super) fn random_qkv(seed: u64, len: usize, amp: f32) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let mut seed = seed;
    let mut next = move || {
        seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        ((seed >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * amp
    };
    let mut v = || (0..len).map(|_| next()).collect::<Vec<f32>>();
    (v(), v(), v())
}

#[cfg(test)]
mod tests {
    /// The attention of this CPU's tier gives the bits of the portable build with libm's
    /// scalar `expf` (scores spread widely, so the softmax's `expf` meets large negative
    /// arguments and underflow), on head sizes with a tail past the 8-lane chunks, of whole
    /// 16-lane vectors and between (SigLIP's 72), key counts past the last group of sixteen,
    /// on one thread and two.
    #[test]
    fn simd_attention_equals_the_portable_build() {
        // From FA_TILE_Q patches up, where `attention` takes `head`.
        for (n, n_head, hd) in [(67, 3, 64), (64, 2, 36), (70, 2, 72)] {
            let len = n * n_head * hd;
            let (q, k, v) = super::random_qkv(5 + len as u64, len, 8.0);
            let mut want = vec![0f32; len];
            let scalar: super::HeadFn = |q, k, v, n, hd, scale, o| {
                super::head_plain(q, k, v, n, hd, scale, o, |x| x.iter_mut().for_each(|v| *v = v.exp()))
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

    /// ggml's one-chunk arithmetic (below FA_TILE_Q patches) stays within f16 accumulation
    /// error of the exact softmax-weighted sum of the same f16 values, on head sizes with
    /// and without whole steps of 64, on one thread and two (the same bits).
    #[test]
    fn one_chunk_attention_is_attention() {
        for (n, n_head, hd) in [(16, 4, 16), (63, 2, 80)] {
            let d = n_head * hd;
            let len = n * d;
            let (q, k, v) = super::random_qkv(9 + len as u64, len, 4.0);
            let scale = 1.0 / (hd as f32).sqrt();
            let mut one = vec![0f32; len];
            super::attention(&q, &k, &v, &mut one, n, n_head, hd, scale, 1);
            let mut two = vec![0f32; len];
            super::attention(&q, &k, &v, &mut two, n, n_head, hd, scale, 2);
            assert_eq!(one, two);
            let want = super::exact(&q, &k, &v, (n, n_head, hd), scale);
            for (i, (&got, &want)) in one.iter().zip(&want).enumerate() {
                let (row, h, c) = (i / d, i % d / hd, i % hd);
                assert!(
                    (got as f64 - want).abs() < 2e-2,
                    "n {n} hd {hd} head {h} row {row} col {c}: {got} vs {want}"
                );
            }
        }
    }
}
