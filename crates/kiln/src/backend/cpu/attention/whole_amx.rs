//! Whole-sequence attention (vision encoders) on AMX-BF16 tiles, as two F16 matmuls a head
//! (`quant::F16Amx`, exact products of F16 values, f32 sums): per block of 64 queries, the
//! scores against every key (the keys as weight rows, the queries as token tiles), a softmax
//! per query in f32 (libm's `expf`), then the weighted sum of the values (the values
//! transposed as weight rows, the probabilities rounded to F16 as token tiles, as ggml's
//! flash attention rounds them before its f16 accumulation), divided by the sum of those
//! rounded probabilities. Queries, keys and values are F16-rounded as in `whole.rs`; rows
//! shorter than a tile step are padded with zeros.
//!
//! Each query's scores, softmax and sum are one sequence of operations whatever the other
//! queries, so a row does not depend on the batch; the bits differ from `whole.rs`'s (ggml's
//! orders) by float rounding. Taken with the encoders' AMX matmuls
//! (`CpuBackend::with_encoder_amx`).

use crate::backend::cpu::expf::expf_slice;
use crate::quant::{self, F16Amx, GgmlType};

/// Queries per block: their scores against every key are held at once.
const Q_BLOCK: usize = 64;

/// Steps of a row of `n` values: `n` rounded up to whole tile steps.
fn padded(n: usize) -> usize {
    n.next_multiple_of(32)
}

/// Rows of `src` (`rows` of `n` f32, F16-valued, `stride` apart, from `at`) as F16 bytes,
/// each padded with zeros to `padded(n)` values.
fn f16_rows(src: &[f32], rows: usize, n: usize, stride: usize, at: usize) -> Vec<u8> {
    let np = padded(n);
    let mut out = vec![0u8; rows * np * 2];
    for r in 0..rows {
        let row = &src[at + r * stride..][..n];
        quant::quantize_activation(GgmlType::F16, row, &mut out[r * np * 2..][..n * 2]).expect("F16 rows");
    }
    out
}

/// Panels of 16 of the `rows` F16 rows of `bytes` (`padded(n)` values each).
fn panels(amx: F16Amx, bytes: &[u8], rows: usize, n: usize) -> Vec<Vec<u8>> {
    let (np, tl) = (padded(n), F16Amx::tile_len(padded(n)));
    (0..rows.div_ceil(F16Amx::ROWS))
        .map(|p| {
            let mut d = vec![0u8; tl];
            let r0 = p * F16Amx::ROWS;
            let ok = amx.panel(&bytes[r0 * np * 2..], np * 2, F16Amx::ROWS.min(rows - r0), np, &mut d);
            assert!(ok, "a panel of rows of {np} values");
            d
        })
        .collect()
}

/// Token tiles of the `rows` rows of `x` (`padded(n)` f32 each).
fn token_tiles(amx: F16Amx, x: &[f32], rows: usize, n: usize) -> Vec<u8> {
    let (np, tl) = (padded(n), F16Amx::tile_len(padded(n)));
    let tiles = rows.div_ceil(F16Amx::TOKENS);
    let mut d = vec![0u8; tiles * tl];
    for (j, dst) in d.chunks_exact_mut(tl).enumerate() {
        let t1 = (F16Amx::TOKENS * (j + 1)).min(rows);
        assert!(amx.token_tile(&x[F16Amx::TOKENS * j * np..t1 * np], np, dst), "a token tile");
    }
    d
}

/// `out[i, h·hd + c]` for every query `i` and head `h` (rows of `n_head · head_dim` values;
/// `scale` multiplies the scores): `whole.rs`'s per-head split with this file's head.
pub fn attention(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    out: &mut [f32],
    shape: (usize, usize, usize),
    scale: f32,
    n_threads: usize,
) {
    super::whole::attention_with(q, k, v, out, shape, scale, n_threads, head)
}

/// One head (`whole::HeadFn`): contiguous `[n, hd]` rows of F16 values to `out`. Only
/// handed to `attention_with` where the CPU has the AMX kernel.
fn head(q: &[f32], k: &[f32], v: &[f32], n: usize, hd: usize, scale: f32, out: &mut [f32]) {
    let amx = quant::f16_amx().expect("the AMX attention runs where the CPU has AMX-BF16");
    let (hp, np) = (padded(hd), padded(n));
    let key_panels = panels(amx, &f16_rows(k, n, hd, hd, 0), n, hd);
    // The values transposed: a row per dimension, over the keys.
    let vt: Vec<f32> = (0..hd).flat_map(|c| (0..n).map(move |j| v[j * hd + c])).collect();
    let value_panels = panels(amx, &f16_rows(&vt, hd, n, n, 0), hd, n);
    let mut qs = vec![0f32; Q_BLOCK * hp];
    let mut scores = vec![0f32; Q_BLOCK * np];
    let mut probs = vec![0f32; Q_BLOCK * np];
    let mut sums = [0f32; Q_BLOCK];
    for q0 in (0..n).step_by(Q_BLOCK) {
        let nq = Q_BLOCK.min(n - q0);
        for i in 0..nq {
            qs[i * hp..][..hd].copy_from_slice(&q[(q0 + i) * hd..][..hd]);
        }
        let tiles = token_tiles(amx, &qs, nq, hd);
        for (p, panel) in key_panels.iter().enumerate() {
            let j0 = p * F16Amx::ROWS;
            let ok = amx.dots(panel, &tiles, hp, nq, F16Amx::ROWS.min(n - j0), &mut scores[j0..], np);
            assert!(ok, "scores of rows of {hp} values");
        }
        for (i, sum) in sums.iter_mut().enumerate().take(nq) {
            let row = &mut scores[i * np..][..n];
            row.iter_mut().for_each(|s| *s *= scale);
            let m = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            row.iter_mut().for_each(|s| *s -= m);
            expf_slice(row);
            let p = &mut probs[i * np..][..n];
            quant::round_f16_rows(row, bytemuck::cast_slice_mut(p));
            *sum = p.iter().sum();
        }
        let tiles = token_tiles(amx, &probs, nq, n);
        let o = &mut out[q0 * hd..];
        for (p, panel) in value_panels.iter().enumerate() {
            let c0 = p * F16Amx::ROWS;
            let ok = amx.dots(panel, &tiles, np, nq, F16Amx::ROWS.min(hd - c0), &mut o[c0..], hd);
            assert!(ok, "weighted sums of rows of {np} values");
        }
        for (t, sum) in sums.iter().enumerate().take(nq) {
            o[t * hd..][..hd].iter_mut().for_each(|x| *x /= sum);
        }
    }
}

#[cfg(test)]
mod tests {
    /// Within the rounding of the probabilities to F16 of the exact softmax-weighted sum of
    /// the same F16 values (f64), on head sizes of whole tile steps and padded ones
    /// (SigLIP's 72), query counts over several blocks and key counts past the last panel;
    /// the same bits on one thread and two.
    #[test]
    fn amx_attention_is_attention() {
        if crate::quant::f16_amx().is_none() {
            eprintln!("skipped: this CPU has no AMX-BF16");
            return;
        }
        for (n, n_head, hd) in [(16, 2, 64), (130, 2, 72), (70, 3, 32)] {
            let d = n_head * hd;
            let len = n * d;
            let (q, k, v) = super::super::whole::random_qkv(3 + len as u64, len, 4.0);
            let scale = 1.0 / (hd as f32).sqrt();
            let mut one = vec![f32::NAN; len];
            super::attention(&q, &k, &v, &mut one, (n, n_head, hd), scale, 1);
            let mut two = vec![f32::NAN; len];
            super::attention(&q, &k, &v, &mut two, (n, n_head, hd), scale, 2);
            let bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&one), bits(&two), "n {n} hd {hd}: one thread and two");
            let want = super::super::whole::exact(&q, &k, &v, (n, n_head, hd), scale);
            for (i, (&got, &want)) in one.iter().zip(&want).enumerate() {
                let (row, h, c) = (i / d, i % d / hd, i % hd);
                assert!(
                    (got as f64 - want).abs() < 2e-3,
                    "n {n} hd {hd} head {h} row {row} col {c}: {got} vs {want}"
                );
            }
        }
    }
}
