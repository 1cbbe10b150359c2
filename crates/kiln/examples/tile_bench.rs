//! Matmul tile kernels, AVX2 tier against AVX-512 VNNI tier, interleaved in short bursts and
//! keeping each one's best time, so the comparison holds on a busy machine:
//!
//!     cargo run --release -p kiln --example tile_bench [ROWS]
//!
//! Prints ns per (weight row × token × block) for the prefill tile (2 rows × 4 tokens) and
//! per (weight row × block) for decode (a row per call), rows of 1536 values;
//! then the same for the interleaved layouts the CPU backend repacks Q4_K, Q5_0 and Q4_1 into
//! (8 tokens per prefill call), to compare with the row-major lines above; and the F16
//! matmul tiles (`F16Gemm`) per tier, 48 tokens and one, and the encoders' AMX-BF16 kernel
//! (`F16Amx`) where the CPU has it.

#[cfg(target_arch = "x86_64")]
fn main() {
    use kiln::quant::{quantize_activation, quantize_row, tile_kernels_for, CpuTier, GgmlType, TILE};
    use std::time::Instant;

    let n = 1536;
    let rows: usize = std::env::args().nth(1).and_then(|v| v.parse().ok()).unwrap_or(64).max(4) / 4 * 4;
    let mut seed = 1u64;
    let mut next = move || {
        seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (seed >> 40) as f32 / (1u64 << 24) as f32 - 0.5
    };
    let tiers = [CpuTier::Avx2, CpuTier::Avx512Vnni];
    for ty in [GgmlType::Q4_K, GgmlType::Q6_K, GgmlType::Q5_0, GgmlType::Q8_0, GgmlType::Q4_1] {
        let at = ty.vec_dot_type();
        let (wr, ar) = (ty.row_size(n).unwrap(), at.row_size(n).unwrap());
        let (mut w, mut a) = (vec![0u8; wr * rows], vec![0u8; ar * TILE]);
        for r in 0..rows {
            let x: Vec<f32> = (0..n).map(|_| next()).collect();
            quantize_row(ty, &x, &mut w[r * wr..(r + 1) * wr]).unwrap();
        }
        for t in 0..TILE {
            let x: Vec<f32> = (0..n).map(|_| next()).collect();
            quantize_activation(at, &x, &mut a[t * ar..(t + 1) * ar]).unwrap();
        }
        let blocks = n / ty.block_size();
        let reps = (1280 / rows).max(1);
        let (mut gemm, mut gemv) = ([f64::MAX; 2], [f64::MAX; 2]);
        let mut sink = 0f32;
        for _ in 0..200 {
            for (i, &tier) in tiers.iter().enumerate() {
                let Some(tk) = tile_kernels_for(ty, tier) else { continue };
                let t0 = Instant::now();
                for _ in 0..reps {
                    for r in (0..rows).step_by(2) {
                        let mut v = [0f32; 2 * TILE];
                        tk.rows2_toks4(&w[r * wr..(r + 2) * wr], &a, n, &mut v);
                        sink += v[0];
                    }
                }
                let per = (reps * rows * TILE * blocks) as f64;
                gemm[i] = gemm[i].min(t0.elapsed().as_secs_f64() * 1e9 / per);
                let t0 = Instant::now();
                for _ in 0..reps {
                    for r in 0..rows {
                        sink += tk.one(&w[r * wr..(r + 1) * wr], &a[..ar], n);
                    }
                }
                gemv[i] = gemv[i].min(t0.elapsed().as_secs_f64() * 1e9 / (reps * rows * blocks) as f64);
            }
        }
        println!(
            "{ty:5} ({}-value blocks): prefill {:.2} / {:.2} ns, decode {:.2} / {:.2} ns (avx2 / avx512vnni){}",
            ty.block_size(),
            gemm[0],
            gemm[1],
            gemv[0],
            gemv[1],
            if sink.is_nan() { " NaN!" } else { "" }
        );
    }
    f16(rows, &mut next);
    q4_k_x8(rows, &mut next);
    q4_k_amx(rows, &mut next);
    for (ty, layout) in [
        (GgmlType::Q5_0, kiln::quant::Interleave::Q5_0X16),
        (GgmlType::Q4_1, kiln::quant::Interleave::Q4_1X16),
    ] {
        x16(ty, layout, rows, &mut next);
    }
}

/// F16 weights (rows of 768 values, as nomic-embed-text's): the matmul tiles of each tier
/// over `rows` rows × 48 tokens (prompt) and × 1 token (decode), ns per row × token ×
/// 32 values.
#[cfg(target_arch = "x86_64")]
fn f16(rows: usize, next: &mut impl FnMut() -> f32) {
    use kiln::quant::{f16_gemm_for, quantize_row, round_f16_rows, CpuTier, GgmlType};
    use std::time::Instant;
    let (n, toks) = (768, 48);
    let (wr, ar) = (2 * n, 4 * n);
    let (mut w, mut a) = (vec![0u8; wr * rows], vec![0u8; ar * toks]);
    for r in 0..rows {
        let x: Vec<f32> = (0..n).map(|_| next()).collect();
        quantize_row(GgmlType::F16, &x, &mut w[r * wr..(r + 1) * wr]).unwrap();
    }
    for t in 0..toks {
        let x: Vec<f32> = (0..n).map(|_| next()).collect();
        round_f16_rows(&x, &mut a[t * ar..(t + 1) * ar]);
    }
    let per = (rows * n / 32) as f64;
    let mut sink = 0f32;
    for tier in [CpuTier::Avx2, CpuTier::Avx512Vnni] {
        let Some(g) = f16_gemm_for(tier) else { continue };
        let (mut gemm, mut gemv) = (f64::MAX, f64::MAX);
        for _ in 0..100 {
            let t0 = Instant::now();
            g.dots(&w, wr, rows, &a, toks, n, |_, _, v| sink += v);
            gemm = gemm.min(t0.elapsed().as_secs_f64() * 1e9 / (per * toks as f64));
            let t0 = Instant::now();
            g.dots(&w, wr, rows, &a, 1, n, |_, _, v| sink += v);
            gemv = gemv.min(t0.elapsed().as_secs_f64() * 1e9 / per);
        }
        let (mr, nr) = g.tile();
        println!(
            "F16 {} ({mr}×{nr} tiles): prefill {gemm:.2} ns, decode {gemv:.2} ns{}",
            tier.name(),
            if sink.is_nan() { " NaN!" } else { "" }
        );
    }
    // The encoders' AMX-BF16 kernel: panels made once, then as the FMA tiles above, and
    // with each panel's layout counted in (a matmul lays out each panel once).
    let Some(amx) = kiln::quant::f16_amx() else { return };
    use kiln::quant::F16Amx;
    let tl = F16Amx::tile_len(n);
    let mut acts = vec![0u8; toks.div_ceil(16) * tl];
    let x: Vec<f32> = a.chunks_exact(4).map(|b| f32::from_le_bytes(b.try_into().unwrap())).collect();
    for (j, dst) in acts.chunks_exact_mut(tl).enumerate() {
        let t1 = (16 * (j + 1)).min(toks);
        assert!(amx.token_tile(&x[16 * j * n..t1 * n], n, dst));
    }
    let mut panels = vec![0u8; rows.div_ceil(16) * tl];
    let mut out = vec![0f32; toks * 16];
    let (mut gemm, mut with_panels) = (f64::MAX, f64::MAX);
    for _ in 0..100 {
        let t0 = Instant::now();
        for (p, dst) in panels.chunks_exact_mut(tl).enumerate() {
            assert!(amx.panel(&w[16 * p * wr..], wr, 16.min(rows - 16 * p), n, dst));
        }
        let t1 = Instant::now();
        for p in panels.chunks_exact(tl) {
            assert!(amx.dots(p, &acts, n, toks, 16, &mut out, 16));
            sink += out[0];
        }
        gemm = gemm.min(t1.elapsed().as_secs_f64() * 1e9 / (per * toks as f64));
        with_panels = with_panels.min(t0.elapsed().as_secs_f64() * 1e9 / (per * toks as f64));
    }
    println!(
        "F16 amx-bf16 (16 rows × 4×16 tokens): prefill {gemm:.3} ns, with panel layout {with_panels:.3} ns{}",
        if sink.is_nan() { " NaN!" } else { "" }
    );
}

/// Q4_K interleaved eight rows (what the CPU backend repacks Q4_K into) against the
/// row-major tiles, the same interleaved bursts: prefill as 8 rows × 8 tokens per call,
/// decode as 8 rows × 1 token.
#[cfg(target_arch = "x86_64")]
fn q4_k_x8(rows: usize, next: &mut impl FnMut() -> f32) {
    use kiln::quant::{q4_k_x8_kernels_for, CpuTier, Q4K_X8_ROWS};
    use std::time::Instant;
    let (n, toks) = (1536, 8);
    let rows = rows.next_multiple_of(Q4K_X8_ROWS);
    let (wr, a, packed) = q4_k_x8_inputs(n, rows, toks, next);
    let blocks = n / 256;
    let reps = (1280 / rows).max(1);
    let group = wr * Q4K_X8_ROWS;
    let mut sink = 0f32;
    for (tier, pairs) in [(CpuTier::Avx2, false), (CpuTier::Avx512Vnni, false), (CpuTier::Avx512Vnni, true)] {
        let Some(k) = q4_k_x8_kernels_for(tier, pairs) else { continue };
        let (mut gemm, mut gemv) = (f64::MAX, f64::MAX);
        for _ in 0..200 {
            let mut out = [0f32; 64];
            let t0 = Instant::now();
            for _ in 0..reps {
                for g in 0..rows / Q4K_X8_ROWS {
                    k.dots(&packed[g * group..(g + 1) * group], &a, n, toks, &mut out, 8);
                    sink += out[0];
                }
            }
            gemm = gemm.min(t0.elapsed().as_secs_f64() * 1e9 / (reps * rows * toks * blocks) as f64);
            let t0 = Instant::now();
            for _ in 0..reps {
                for g in 0..rows / Q4K_X8_ROWS {
                    k.dots(&packed[g * group..(g + 1) * group], &a[..a.len() / toks], n, 1, &mut out, 8);
                    sink += out[0];
                }
            }
            gemv = gemv.min(t0.elapsed().as_secs_f64() * 1e9 / (reps * rows * blocks) as f64);
        }
        println!(
            "Q4_K×8 {}{}: prefill {gemm:.2} ns, decode {gemv:.2} ns{}",
            tier.name(),
            if pairs { " (token pairs)" } else { "" },
            if sink.is_nan() { " NaN!" } else { "" }
        );
    }
}

/// Random Q4_K rows interleaved eight at a time (`rows` of `n`), and `toks` Q8_K
/// activation rows: (bytes per Q4_K row, activations, packed weights).
#[cfg(target_arch = "x86_64")]
fn q4_k_x8_inputs(
    n: usize,
    rows: usize,
    toks: usize,
    next: &mut impl FnMut() -> f32,
) -> (usize, Vec<u8>, Vec<u8>) {
    use kiln::quant::{quantize_activation, quantize_row, GgmlType, Interleave};
    let (wr, ar) = (GgmlType::Q4_K.row_size(n).unwrap(), GgmlType::Q8_K.row_size(n).unwrap());
    let (mut w, mut a) = (vec![0u8; wr * rows], vec![0u8; ar * toks]);
    for r in 0..rows {
        let x: Vec<f32> = (0..n).map(|_| next()).collect();
        quantize_row(GgmlType::Q4_K, &x, &mut w[r * wr..(r + 1) * wr]).unwrap();
    }
    for t in 0..toks {
        let x: Vec<f32> = (0..n).map(|_| next()).collect();
        quantize_activation(GgmlType::Q8_K, &x, &mut a[t * ar..(t + 1) * ar]).unwrap();
    }
    let mut packed = vec![0u8; w.len()];
    Interleave::Q4kX8.pack(&w, n, &mut packed).unwrap();
    (wr, a, packed)
}

/// Q4_K×8 on AMX tiles: 16 rows × 512 tokens per call (ns per row × token × superblock).
#[cfg(target_arch = "x86_64")]
fn q4_k_amx(rows: usize, next: &mut impl FnMut() -> f32) {
    use kiln::quant::{q4_k_x8_amx, Q4kX8Amx};
    use std::time::Instant;
    let Some(amx) = q4_k_x8_amx() else { return };
    let (n, toks, rows) = (1536, 512, rows.next_multiple_of(16));
    let (wr, a, packed) = q4_k_x8_inputs(n, rows, toks, next);
    let mut acts = vec![0u8; Q4kX8Amx::acts_len(n, toks)];
    amx.prepare(&a, n, toks, &mut acts);
    let (tile, mut out, mut best) = (wr * Q4kX8Amx::ROWS, vec![0f32; toks * Q4kX8Amx::ROWS], f64::MAX);
    for _ in 0..50 {
        let t0 = Instant::now();
        for g in 0..rows / Q4kX8Amx::ROWS {
            amx.dots(&packed[g * tile..(g + 1) * tile], &acts, n, toks, &mut out);
        }
        best = best.min(t0.elapsed().as_secs_f64() * 1e9 / (rows * toks * (n / 256)) as f64);
    }
    println!("Q4_K×8 amx: prefill {best:.2} ns{}", if out[0].is_nan() { " NaN!" } else { "" });
}

/// Q5_0 and Q4_1 interleaved sixteen rows, the same way: prefill as 16 rows × 8 tokens per
/// call, decode as 16 rows × 1 token (ns per row × token × 32-value block).
#[cfg(target_arch = "x86_64")]
fn x16(
    ty: kiln::quant::GgmlType,
    layout: kiln::quant::Interleave,
    rows: usize,
    next: &mut impl FnMut() -> f32,
) {
    use kiln::quant::{quantize_row, x16_kernels_for, CpuTier, X16Kernels};
    use std::time::Instant;
    let (n, toks) = (1536, 8);
    let wr = ty.row_size(n).unwrap();
    let ar = X16Kernels::act_row_size(n);
    let (mut w, mut a) = (vec![0u8; wr * rows], vec![0u8; ar * toks]);
    for r in 0..rows {
        let x: Vec<f32> = (0..n).map(|_| next()).collect();
        quantize_row(ty, &x, &mut w[r * wr..(r + 1) * wr]).unwrap();
    }
    for t in 0..toks {
        let x: Vec<f32> = (0..n).map(|_| next()).collect();
        if let Some(k) = x16_kernels_for(ty, CpuTier::Avx2) {
            k.prepare(&x, &mut a[t * ar..(t + 1) * ar]).unwrap();
        }
    }
    let mut packed = vec![0u8; w.len()];
    layout.pack(&w, n, &mut packed).unwrap();
    let blocks = n / 32;
    let reps = (1280 / rows).max(1);
    let mut sink = 0f32;
    for tier in [CpuTier::Avx2, CpuTier::Avx512Vnni] {
        let Some(k) = x16_kernels_for(ty, tier) else { continue };
        let (mut gemm, mut gemv) = (f64::MAX, f64::MAX);
        for _ in 0..200 {
            let mut out = [0f32; 128];
            let t0 = Instant::now();
            for _ in 0..reps {
                for g in 0..rows / 16 {
                    k.dots(&packed[16 * g * wr..16 * (g + 1) * wr], &a, n, toks, &mut out, 16);
                    sink += out[0];
                }
            }
            gemm = gemm.min(t0.elapsed().as_secs_f64() * 1e9 / (reps * rows * toks * blocks) as f64);
            let t0 = Instant::now();
            for _ in 0..reps {
                for g in 0..rows / 16 {
                    k.dots(&packed[16 * g * wr..16 * (g + 1) * wr], &a[..ar], n, 1, &mut out, 16);
                    sink += out[0];
                }
            }
            gemv = gemv.min(t0.elapsed().as_secs_f64() * 1e9 / (reps * rows * blocks) as f64);
        }
        println!(
            "{ty}×16 {}: prefill {gemm:.2} ns, decode {gemv:.2} ns{}",
            tier.name(),
            if sink.is_nan() { " NaN!" } else { "" }
        );
    }
}

#[cfg(not(target_arch = "x86_64"))]
fn main() {
    eprintln!("tile_bench: the tile kernels are x86-64 only");
}
