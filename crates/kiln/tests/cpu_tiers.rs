//! CPU kernel tiers: `KILN_CPU` caps the tier that actually runs (checked in child
//! processes, since the tier is read once per process), and the matmul tile kernels of
//! every tier agree with the scalar reference, bit-identical across tile shapes and SIMD
//! tiers.

#![cfg(target_arch = "x86_64")]

use std::process::Command;

use kiln::quant::{
    cpu_tier, detected_cpu_tier, dot_f16_lanes, f16_amx_for, f16_gemm_for, quantize_activation, quantize_row,
    round_f16_rows, tile_kernels_for, vec_dot, CpuTier, F16Amx, F16Gemm, GgmlType, TILE,
};

const ALL: [CpuTier; 5] =
    [CpuTier::Scalar, CpuTier::Avx2, CpuTier::Avx512, CpuTier::Avx512Vnni, CpuTier::Amx];

/// Run by the parent test below in a child process with `KILN_CPU` set.
#[test]
fn child_reports_tier() {
    if std::env::var_os("KILN_TIER_CHILD").is_some() {
        println!("tier={}", cpu_tier().name());
    }
}

#[test]
fn kiln_cpu_caps_the_tier_that_runs() {
    let exe = std::env::current_exe().unwrap();
    for cap in ALL {
        let out = Command::new(&exe)
            .args(["--exact", "child_reports_tier", "--nocapture", "--test-threads=1"])
            .env("KILN_TIER_CHILD", "1")
            .env("KILN_CPU", cap.name())
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        let want = format!("tier={}", cap.min(detected_cpu_tier()).name());
        assert!(text.contains(&want), "KILN_CPU={}: want {want}, child said {text}", cap.name());
    }
}

struct Rng(u64);
impl Rng {
    fn f(&mut self) -> f32 {
        self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        ((self.0 >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 4.0
    }
}

#[test]
fn tile_kernels_match_scalar_and_each_other_on_every_tier() {
    let mut rng = Rng(7);
    for (ty, n) in [
        (GgmlType::Q4_1, 576),
        (GgmlType::Q8_0, 576),
        (GgmlType::Q5_0, 896),
        (GgmlType::Q4_K, 1536),
        (GgmlType::Q6_K, 1536),
    ] {
        let at = ty.vec_dot_type();
        let (wr, ar) = (ty.row_size(n).unwrap(), at.row_size(n).unwrap());
        let mut w = vec![0u8; wr * TILE];
        let mut a = vec![0u8; ar * TILE];
        for r in 0..TILE {
            let x: Vec<f32> = (0..n).map(|_| rng.f()).collect();
            quantize_row(ty, &x, &mut w[r * wr..(r + 1) * wr]).unwrap();
            let y: Vec<f32> = (0..n).map(|_| rng.f()).collect();
            quantize_activation(at, &y, &mut a[r * ar..(r + 1) * ar]).unwrap();
        }
        let reference: Vec<f32> = (0..TILE * TILE)
            .map(|i| vec_dot(ty, &w[(i / TILE) * wr..][..wr], &a[(i % TILE) * ar..][..ar], n))
            .collect();
        let mut tested = 0;
        let mut first_simd: Option<(CpuTier, [f32; TILE * TILE])> = None;
        for tier in ALL.into_iter().filter(|&t| t <= detected_cpu_tier()) {
            let Some(tk) = tile_kernels_for(ty, tier) else {
                assert_eq!(tier, CpuTier::Scalar, "{ty}: {tier:?} has no tile kernels");
                continue;
            };
            tested += 1;
            let mut got = [0f32; TILE * TILE];
            for r in 0..TILE {
                for t in 0..TILE {
                    got[r * TILE + t] = tk.one(&w[r * wr..][..wr], &a[t * ar..][..ar], n);
                }
            }
            let (num, den): (f64, f64) = got
                .iter()
                .zip(&reference)
                .map(|(&g, &e)| (((g - e) as f64).powi(2), (e as f64).powi(2)))
                .fold((0.0, 0.0), |(a, b), (x, y)| (a + x, b + y));
            assert!(num / den < 1e-10, "{ty} {tier:?}: NMSE {:e}", num / den);
            // The integer sums are exact whatever the instructions, and the float steps are
            // the same: every SIMD tier gives the same bits.
            match first_simd {
                None => first_simd = Some((tier, got)),
                Some((t0, g0)) => {
                    let same = g0.iter().zip(&got).all(|(a, b)| a.to_bits() == b.to_bits());
                    assert!(same, "{ty}: {tier:?} differs from {t0:?}");
                }
            }
            let mut v = [0f32; TILE];
            for (r, nt) in (0..TILE).flat_map(|r| (1..=TILE).map(move |nt| (r, nt))) {
                // The last nt tokens, so that a kernel reading past its count would be seen.
                tk.toks(&w[r * wr..][..wr], &a[(TILE - nt) * ar..], n, nt, &mut v);
                for t in 0..nt {
                    let want = got[r * TILE + TILE - nt + t];
                    assert_eq!(v[t].to_bits(), want.to_bits(), "{ty} {tier:?} toks {nt}");
                }
                assert!(v[nt..].iter().all(|x| x.is_nan()));
            }
            let mut v2 = [0f32; 2 * TILE];
            for r in [0, 2] {
                tk.rows2_toks4(&w[r * wr..][..2 * wr], &a, n, &mut v2);
                for i in 0..2 * TILE {
                    let want = got[(r + i / TILE) * TILE + i % TILE];
                    assert_eq!(v2[i].to_bits(), want.to_bits(), "{ty} {tier:?} rows2_toks4");
                }
            }
            // Rows 0 and 2, or 1 and 3, two rows apart (a cache's slots holding two heads).
            for r in [0, 1] {
                tk.rows2_toks4_strided(&w[r * wr..][..3 * wr], 2 * wr, &a, n, &mut v2);
                for i in 0..2 * TILE {
                    let want = got[(r + 2 * (i / TILE)) * TILE + i % TILE];
                    assert_eq!(v2[i].to_bits(), want.to_bits(), "{ty} {tier:?} rows2_toks4_strided");
                }
            }
            // Mis-sized input gives NaN, not a read out of bounds.
            assert!(tk.one(&w[..wr - 1], &a[..ar], n).is_nan());
            tk.toks(&w[..wr], &a[..3 * ar - 1], n, 3, &mut v);
            assert!(v.iter().all(|x| x.is_nan()), "three tokens' activations too short");
            tk.toks(&w[..wr], &a, n, TILE + 1, &mut v);
            assert!(v.iter().all(|x| x.is_nan()), "more tokens than a tile");
            tk.rows2_toks4_strided(&w[..3 * wr - 1], 2 * wr, &a, n, &mut v2);
            assert!(v2.iter().all(|x| x.is_nan()));
            tk.rows2_toks4_strided(&w, wr - 1, &a, n, &mut v2);
            assert!(v2.iter().all(|x| x.is_nan()), "rows overlapping");
        }
        if detected_cpu_tier() >= CpuTier::Avx2 {
            assert!(tested > 0);
        }
    }
}

/// The F16 matmul tiles give every (row, token) pair the bits of the scalar lane-order
/// reference `dot_f16_lanes` on every SIMD tier, whatever the number of rows and tokens
/// (every tile shape and remainder, and the few-token path) and wherever the pair sits in
/// its tile; the reference is within float rounding of ggml's f64-summed scalar dot.
#[test]
fn f16_gemm_equals_the_lane_reference() {
    let mut rng = Rng(11);
    let (rows, toks) = (11, 14);
    for n in [16, 768, 3072 + 48] {
        let mut w = vec![0u8; 2 * n * rows];
        let mut a16 = vec![0u8; 2 * n * toks];
        let mut a32 = vec![0u8; 4 * n * toks];
        for r in 0..rows {
            let x: Vec<f32> = (0..n).map(|_| rng.f()).collect();
            quantize_row(GgmlType::F16, &x, &mut w[r * 2 * n..(r + 1) * 2 * n]).unwrap();
        }
        for t in 0..toks {
            let y: Vec<f32> = (0..n).map(|_| rng.f() * 100.0).collect();
            quantize_activation(GgmlType::F16, &y, &mut a16[t * 2 * n..(t + 1) * 2 * n]).unwrap();
            round_f16_rows(&y, &mut a32[t * 4 * n..(t + 1) * 4 * n]);
        }
        let wr = |r: usize| &w[r * 2 * n..][..2 * n];
        let ar = |t: usize| -> Vec<f32> { bytemuck_f32(&a32[t * 4 * n..][..4 * n]) };
        let want: Vec<f32> =
            (0..rows * toks).map(|i| dot_f16_lanes(wr(i / toks), &ar(i % toks), n)).collect();
        for i in 0..rows * toks {
            let f64_sum = vec_dot(GgmlType::F16, wr(i / toks), &a16[(i % toks) * 2 * n..][..2 * n], n);
            let tol = 1e-5 * f64_sum.abs().max(n as f32);
            assert!((want[i] - f64_sum).abs() <= tol, "n {n}: lanes {} vs f64 {f64_sum}", want[i]);
        }
        let mut tested = 0;
        for tier in ALL.into_iter().filter(|&t| t <= detected_cpu_tier()) {
            let Some(g) = f16_gemm_for(tier) else {
                assert_eq!(tier, CpuTier::Scalar, "{tier:?} has no F16 tiles");
                continue;
            };
            tested += 1;
            assert!(F16Gemm::fits(n) && !F16Gemm::fits(n + 8));
            // Every token count from 1 (the few-token path) past two whole tiles, and
            // every row count, so each pair sits in several tile shapes and positions.
            for (nr, nt) in
                [(rows, toks), (rows, 1), (rows, 2), (rows, 3), (rows, 7), (5, toks), (1, 4), (3, 13)]
            {
                let mut got = vec![f32::NAN; rows * toks];
                let ok = g.dots(&w, 2 * n, nr, &a32, nt, n, |t, r, v| got[r * toks + t] = v);
                assert!(ok, "n {n} {tier:?}");
                for r in 0..nr {
                    for t in 0..nt {
                        let (g, e) = (got[r * toks + t], want[r * toks + t]);
                        assert_eq!(g.to_bits(), e.to_bits(), "n {n} {tier:?} {nr}x{nt}: row {r} token {t}");
                    }
                }
            }
            // Rows two apart (`ws` past the row's own bytes).
            let mut got = vec![f32::NAN; rows * toks];
            assert!(g.dots(&w, 4 * n, rows / 2, &a32, toks, n, |t, r, v| got[r * toks + t] = v));
            for r in 0..rows / 2 {
                for t in 0..toks {
                    assert_eq!(got[r * toks + t].to_bits(), want[2 * r * toks + t].to_bits(), "strided");
                }
            }
            // Mis-sized input calls nothing.
            let never = |_: usize, _: usize, _: f32| panic!("called on mis-sized input");
            assert!(!g.dots(&w[..2 * n * rows - 1], 2 * n, rows, &a32, toks, n, never));
            assert!(!g.dots(&w, 2 * n, rows, &a32[..4 * n * toks - 1], toks, n, never));
            assert!(!g.dots(&w, 2 * n - 2, rows, &a32, toks, n, never));
            assert!(!g.dots(&w, 2 * n + 16, rows, &a32, toks, n + 8, never));
        }
        if detected_cpu_tier() >= CpuTier::Avx2 {
            assert!(tested > 0);
        }
    }
}

/// The encoders' AMX-BF16 F16 kernel: every (row, token) pair within 2⁻²⁰ of the sum of
/// its |products| of ggml's f64-summed dot (exact products, f32 sums: measured ~2⁻²⁴), and
/// the same bits whatever else shares its panel or token tiles (a token alone, in a batch,
/// at another place; a row in a full or a partial panel).
#[test]
fn f16_amx_is_within_rounding_and_batch_invariant() {
    let Some(amx) = f16_amx_for(CpuTier::Amx) else {
        eprintln!("skipped: this CPU has no AMX-BF16");
        return;
    };
    let mut rng = Rng(12);
    let (rows, toks) = (21, 37);
    for n in [32, 768, 3072 + 32] {
        let tl = F16Amx::tile_len(n);
        let mut w = vec![0u8; 2 * n * rows];
        let mut a16 = vec![0u8; 2 * n * toks];
        for r in 0..rows {
            let x: Vec<f32> = (0..n).map(|_| rng.f()).collect();
            quantize_row(GgmlType::F16, &x, &mut w[r * 2 * n..(r + 1) * 2 * n]).unwrap();
        }
        let x: Vec<f32> = (0..n * toks).map(|_| rng.f() * 100.0).collect();
        for t in 0..toks {
            quantize_activation(GgmlType::F16, &x[t * n..(t + 1) * n], &mut a16[t * 2 * n..(t + 1) * 2 * n])
                .unwrap();
        }
        // Panels of 16 rows; token tiles of the tokens `t0..t1`.
        let panels: Vec<Vec<u8>> = (0..rows.div_ceil(16))
            .map(|p| {
                let mut d = vec![0u8; tl];
                assert!(amx.panel(&w[p * 16 * 2 * n..], 2 * n, 16.min(rows - 16 * p), n, &mut d));
                d
            })
            .collect();
        let acts = |t0: usize, t1: usize| -> Vec<u8> {
            let mut d = vec![0u8; (t1 - t0).div_ceil(16) * tl];
            for (j, dst) in d.chunks_exact_mut(tl).enumerate() {
                let (a, b) = (t0 + 16 * j, (t0 + 16 * (j + 1)).min(t1));
                assert!(amx.token_tile(&x[a * n..b * n], n, dst));
            }
            d
        };
        // [row][token], from the dots' [token][row].
        let run = |t0: usize, t1: usize| -> Vec<f32> {
            let mut got = vec![f32::NAN; rows * toks];
            let a = acts(t0, t1);
            let mut o = vec![f32::NAN; (t1 - t0) * rows];
            for (p, panel) in panels.iter().enumerate() {
                let nr = 16.min(rows - 16 * p);
                assert!(amx.dots(panel, &a, n, t1 - t0, nr, &mut o[16 * p..], rows));
            }
            for t in t0..t1 {
                for r in 0..rows {
                    got[r * toks + t] = o[(t - t0) * rows + r];
                }
            }
            got
        };
        let all = run(0, toks);
        let mut worst = 0f64;
        for r in 0..rows {
            for t in 0..toks {
                let wr = &w[r * 2 * n..][..2 * n];
                let exact = vec_dot(GgmlType::F16, wr, &a16[t * 2 * n..][..2 * n], n) as f64;
                let mut abs = vec![0f32; n];
                kiln::quant::dequantize_row(GgmlType::F16, wr, &mut abs).unwrap();
                let mut ys = vec![0f32; n];
                kiln::quant::dequantize_row(GgmlType::F16, &a16[t * 2 * n..][..2 * n], &mut ys).unwrap();
                let mag: f64 = abs.iter().zip(&ys).map(|(a, b)| (*a as f64 * *b as f64).abs()).sum();
                let got = all[r * toks + t] as f64;
                assert!(
                    (got - exact).abs() <= mag / (1 << 20) as f64,
                    "n {n} row {r} token {t}: {got} vs {exact}"
                );
                worst = worst.max((got - exact).abs() / mag);
            }
        }
        eprintln!("n {n}: worst error / sum of |products| {worst:.3e}");
        // The same bits for tokens alone, in other batches and places.
        for (t0, t1) in [(0, 1), (5, 6), (36, 37), (3, 20), (17, 37), (1, 34)] {
            let part = run(t0, t1);
            for r in 0..rows {
                for t in t0..t1 {
                    let (g, e) = (part[r * toks + t], all[r * toks + t]);
                    assert_eq!(g.to_bits(), e.to_bits(), "n {n} tokens {t0}..{t1}: row {r} token {t}");
                }
            }
        }
        // A row in a partial panel: the same bits as in a full one.
        let mut one = vec![0u8; tl];
        assert!(amx.panel(&w[3 * 2 * n..], 2 * n, 1, n, &mut one));
        let a = acts(0, toks);
        let mut o = vec![f32::NAN; toks * 16];
        assert!(amx.dots(&one, &a, n, toks, 16, &mut o, 16));
        for t in 0..toks {
            assert_eq!(o[t * 16].to_bits(), all[3 * toks + t].to_bits(), "n {n} partial panel: token {t}");
            assert!(o[t * 16 + 1..][..15].iter().all(|&v| v == 0.0), "rows past the panel's are zero");
        }
        // Mis-sized input writes nothing.
        let mut o = vec![7f32; toks * 16];
        assert!(!amx.dots(&panels[0][..tl - 1], &a, n, toks, 16, &mut o, 16));
        assert!(!amx.dots(&panels[0], &a[..a.len() - 1], n, toks, 16, &mut o, 16));
        assert!(!amx.dots(&panels[0], &a, n + 16, toks, 16, &mut o, 16));
        assert!(!amx.dots(&panels[0], &a, n, toks, 16, &mut o[..toks * 16 - 1], 16));
        assert!(!amx.dots(&panels[0], &a, n, toks, 16, &mut o, 15));
        assert!(!amx.dots(&panels[0], &a, n, toks, 17, &mut o, 17));
        assert!(o.iter().all(|&v| v == 7.0));
        let mut d = vec![7u8; tl];
        assert!(!amx.panel(&w, 2 * n, 17, n, &mut d));
        assert!(!amx.panel(&w[..2 * n - 1], 2 * n, 1, n, &mut d));
        assert!(!amx.token_tile(&x[..17 * n], n, &mut d));
        assert!(!amx.token_tile(&x[..n + 1], n, &mut d));
        assert!(!amx.token_tile(&x[..n], n, &mut d[..tl - 1]));
        assert!(d.iter().all(|&b| b == 7));
    }
}

fn bytemuck_f32(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()
}

/// The rows the F16 tiles read: each value rounded to F16 as the F16 activation quantizer
/// does, then widened, on every value class (normal, subnormal, ties, overflow, infinities;
/// NaN stays NaN), and any row length.
#[test]
fn round_f16_rows_equals_the_f16_quantizer() {
    let mut src: Vec<f32> = (0..70_000u32).map(|i| f32::from_bits(i.wrapping_mul(0x9e37_79b9))).collect();
    src.extend([
        0.0,
        -0.0,
        65504.0,
        65520.0,
        1e-8,
        -6e-8,
        2.98e-8,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
    ]);
    src.extend((0..2048).map(|i| 1.0 + i as f32 * 2f32.powi(-11) + 2f32.powi(-12)));
    for len in [src.len(), 7, 64, 65] {
        let s = &src[..len];
        let mut half = vec![0u8; 2 * len];
        quantize_activation(GgmlType::F16, s, &mut half).unwrap();
        let mut want = vec![0f32; len];
        kiln::quant::dequantize_row(GgmlType::F16, &half, &mut want).unwrap();
        let mut got = vec![0u8; 4 * len + 1];
        round_f16_rows(s, &mut got[1..]);
        for (i, (&w, g)) in want.iter().zip(bytemuck_f32(&got[1..])).enumerate() {
            assert!(w.to_bits() == g.to_bits() || (w.is_nan() && g.is_nan()), "{i}: {} -> {w} vs {g}", s[i]);
        }
    }
}

/// Q4_K×8 (eight rows interleaved at load) gives the row-major Q4_K tiles' bits on every
/// tier and token count, and unpacks back to the original rows.
#[test]
fn interleaved_q4_k_matches_the_row_major_tiles() {
    use kiln::quant::{q4_k_x8_kernels_for, Interleave, Q4K_X8_ROWS};
    let (ty, n, rows, toks) = (GgmlType::Q4_K, 1536, 16, 11);
    let (wr, ar) = (ty.row_size(n).unwrap(), GgmlType::Q8_K.row_size(n).unwrap());
    let (w, a) = q4_k_fixture(11, n, rows, toks);
    let mut packed = vec![0u8; w.len()];
    Interleave::Q4kX8.pack(&w, n, &mut packed).unwrap();
    assert_ne!(packed, w);
    let mut row = vec![0u8; wr];
    for r in 0..rows {
        Interleave::Q4kX8.unpack_row(&packed, n, r, &mut row).unwrap();
        assert_eq!(row, w[r * wr..(r + 1) * wr], "row {r} round trip");
    }
    assert!(
        Interleave::Q4kX8.pack(&w[..wr * 12], n, &mut packed[..wr * 12]).is_err(),
        "12 rows are not whole groups"
    );
    let mut tested = 0;
    // Both prompt step shapes (tokens in pairs on 512-bit steps or one per 256-bit step;
    // which one runs depends on the CPU) on every tier.
    let variants =
        ALL.into_iter().filter(|&t| t <= detected_cpu_tier()).flat_map(|t| [(t, false), (t, true)]);
    for (tier, pairs) in variants {
        let Some(k) = q4_k_x8_kernels_for(tier, pairs) else {
            assert_eq!(tier, CpuTier::Scalar);
            continue;
        };
        tested += 1;
        let tk = tile_kernels_for(ty, tier).unwrap();
        let group = wr * Q4K_X8_ROWS;
        for g in 0..rows / Q4K_X8_ROWS {
            for n_tok in 1..=8 {
                for t0 in [0, toks - n_tok] {
                    let mut out = vec![f32::NAN; 8 * 9];
                    let acts = &a[t0 * ar..(t0 + n_tok) * ar];
                    k.dots(&packed[g * group..(g + 1) * group], acts, n, n_tok, &mut out, 9);
                    for t in 0..n_tok {
                        for r in 0..Q4K_X8_ROWS {
                            let row = g * Q4K_X8_ROWS + r;
                            let want = tk.one(&w[row * wr..][..wr], &a[(t0 + t) * ar..][..ar], n);
                            let got = out[t * 9 + r];
                            assert_eq!(
                                got.to_bits(),
                                want.to_bits(),
                                "{tier:?} (pairs {pairs}) row {row} token {} of {n_tok}: {got} vs {want}",
                                t0 + t
                            );
                        }
                    }
                }
            }
        }
        let mut out = [0f32; 8];
        k.dots(&packed[..group - 1], &a[..ar], n, 1, &mut out, 8);
        assert!(out.iter().all(|v| v.is_nan()), "mis-sized weights give NaN");
    }
    if detected_cpu_tier() >= CpuTier::Avx2 {
        assert!(tested > 0);
    }
}

/// The AMX prompt kernel (16 rows × 16-token tiles) gives the row-major Q4_K tiles' bits for
/// any token count, partial last tile included.
#[test]
fn amx_q4_k_matches_the_row_major_tiles() {
    use kiln::quant::{q4_k_x8_amx_for, Interleave, Q4kX8Amx};
    let Some(amx) = q4_k_x8_amx_for(CpuTier::Amx) else {
        assert!(detected_cpu_tier() < CpuTier::Amx);
        println!("skip: no AMX tier on this CPU");
        return;
    };
    let (ty, n, rows, toks) = (GgmlType::Q4_K, 768, 32, 70);
    let (wr, ar) = (ty.row_size(n).unwrap(), GgmlType::Q8_K.row_size(n).unwrap());
    let (w, a) = q4_k_fixture(5, n, rows, toks);
    let mut packed = vec![0u8; w.len()];
    Interleave::Q4kX8.pack(&w, n, &mut packed).unwrap();
    let tk = tile_kernels_for(ty, CpuTier::Avx512Vnni).unwrap();
    let tile = wr * Q4kX8Amx::ROWS;
    for n_tok in [1, 16, 17, 37, 70] {
        let mut acts = vec![0xa5u8; Q4kX8Amx::acts_len(n, n_tok)];
        amx.prepare(&a[..n_tok * ar], n, n_tok, &mut acts);
        for g in 0..rows / Q4kX8Amx::ROWS {
            let mut out = vec![f32::NAN; n_tok * Q4kX8Amx::ROWS];
            amx.dots(&packed[g * tile..(g + 1) * tile], &acts, n, n_tok, &mut out);
            for t in 0..n_tok {
                for r in 0..Q4kX8Amx::ROWS {
                    let row = g * Q4kX8Amx::ROWS + r;
                    let want = tk.one(&w[row * wr..][..wr], &a[t * ar..][..ar], n);
                    let got = out[t * Q4kX8Amx::ROWS + r];
                    assert_eq!(
                        got.to_bits(),
                        want.to_bits(),
                        "row {row} token {t} of {n_tok}: {got} vs {want}"
                    );
                }
            }
        }
    }
    let mut out = [0f32; 16];
    amx.dots(&packed[..tile - 1], &[0u8; 8], n, 1, &mut out);
    assert!(out.iter().all(|v| v.is_nan()), "mis-sized input gives NaN");
}

/// Q5_0×16 and Q4_1×16 (sixteen rows interleaved at load, activations prepared for them)
/// give the row-major tiles' bits on every tier and token count (Q5_0: also the scalar
/// reference's, ggml's generic float steps), and unpack back to the original rows.
/// Row 0 and token 1 are the extremes of the AVX2 kernel's 16-bit partial sums (Q5_0
/// quants 31 × 127).
#[test]
fn interleaved_x16_matches_the_tiles_and_q5_0_the_scalar_reference() {
    use kiln::quant::{x16_kernels_for, Interleave, X16Kernels};
    for (ty, layout) in [(GgmlType::Q5_0, Interleave::Q5_0X16), (GgmlType::Q4_1, Interleave::Q4_1X16)] {
        let mut rng = Rng(13);
        let (n, rows, toks) = (896, 32, 11);
        let at = ty.vec_dot_type();
        let (wr, ar) = (ty.row_size(n).unwrap(), at.row_size(n).unwrap());
        let mut w = vec![0u8; wr * rows];
        for r in 0..rows {
            let x: Vec<f32> = (0..n)
                .map(|i| match (r, i % 32) {
                    (0, 0) => 1.0,
                    (0, _) => -0.9375,
                    _ => rng.f() * (0.1 + r as f32),
                })
                .collect();
            quantize_row(ty, &x, &mut w[r * wr..(r + 1) * wr]).unwrap();
        }
        let pr = X16Kernels::act_row_size(n);
        let (mut a, mut prepared) = (vec![0u8; ar * toks], vec![0u8; pr * toks]);
        for t in 0..toks {
            let y: Vec<f32> = (0..n)
                .map(|i| match t {
                    0 if i % 5 == 0 => -3.0,
                    0 | 1 => 3.0,
                    _ => rng.f(),
                })
                .collect();
            quantize_activation(at, &y, &mut a[t * ar..(t + 1) * ar]).unwrap();
            if let Some(k) = x16_kernels_for(ty, detected_cpu_tier()) {
                k.prepare(&y, &mut prepared[t * pr..(t + 1) * pr]).unwrap();
            }
        }
        let reference = |r: usize, t: usize| vec_dot(ty, &w[r * wr..][..wr], &a[t * ar..][..ar], n);
        let mut packed = vec![0u8; w.len()];
        layout.pack(&w, n, &mut packed).unwrap();
        assert_ne!(packed, w);
        let mut row = vec![0u8; wr];
        for r in 0..rows {
            layout.unpack_row(&packed, n, r, &mut row).unwrap();
            assert_eq!(row, w[r * wr..(r + 1) * wr], "{ty} row {r} round trip");
        }
        assert!(layout.pack(&w[..wr * 8], n, &mut packed[..wr * 8]).is_err(), "8 rows are no group");
        let mut tested = 0;
        for tier in ALL.into_iter().filter(|&t| t <= detected_cpu_tier()) {
            let Some(k) = x16_kernels_for(ty, tier) else {
                assert_eq!(tier, CpuTier::Scalar);
                continue;
            };
            tested += 1;
            let tk = tile_kernels_for(ty, tier).unwrap();
            for g in 0..rows / 16 {
                for n_tok in 1..=8 {
                    for t0 in [0, toks - n_tok] {
                        let os = 17;
                        let mut out = vec![f32::NAN; os * 8];
                        let pw = &packed[16 * g * wr..16 * (g + 1) * wr];
                        k.dots(pw, &prepared[t0 * pr..(t0 + n_tok) * pr], n, n_tok, &mut out, os);
                        for t in 0..n_tok {
                            for r in 0..16 {
                                let (row, tok) = (16 * g + r, t0 + t);
                                let got = out[t * os + r];
                                let want = tk.one(&w[row * wr..][..wr], &a[tok * ar..][..ar], n);
                                let at = format!("{ty} {tier:?} row {row} token {tok}");
                                assert_eq!(got.to_bits(), want.to_bits(), "{at}: {got} vs tile {want}");
                                if ty == GgmlType::Q5_0 {
                                    let scalar = reference(row, tok);
                                    assert_eq!(got.to_bits(), scalar.to_bits(), "{at}: {got} vs {scalar}");
                                }
                            }
                        }
                    }
                }
            }
            let mut out = [0f32; 16];
            k.dots(&packed[..16 * wr - 1], &prepared[..pr], n, 1, &mut out, 16);
            assert!(out.iter().all(|v| v.is_nan()), "mis-sized weights give NaN");
        }
        if detected_cpu_tier() >= CpuTier::Avx2 {
            assert!(tested > 0);
        }
    }
}

/// Q4_K rows whose scales and mins span their 6-bit range, and Q8_K activations whose first
/// token has quants at ±127 (bounding the kernels' 16-bit partial sums).
fn q4_k_fixture(seed: u64, n: usize, rows: usize, toks: usize) -> (Vec<u8>, Vec<u8>) {
    let mut rng = Rng(seed);
    let ty = GgmlType::Q4_K;
    let (wr, ar) = (ty.row_size(n).unwrap(), GgmlType::Q8_K.row_size(n).unwrap());
    let mut w = vec![0u8; wr * rows];
    for r in 0..rows {
        // Mixed magnitudes, so scales and mins span their 6-bit range.
        let s = 0.05 + 3.0 * (r % 5) as f32;
        let x: Vec<f32> = (0..n).map(|i| rng.f() * s + if i % 97 < 40 { 1.5 * s } else { 0.0 }).collect();
        quantize_row(ty, &x, &mut w[r * wr..(r + 1) * wr]).unwrap();
    }
    let mut a = vec![0u8; ar * toks];
    for t in 0..toks {
        // Extreme activations (quants at ±127) bound the 16-bit partial sums.
        let y: Vec<f32> = (0..n)
            .map(|i| {
                if t == 0 {
                    if i % 3 == 0 {
                        -8.0
                    } else {
                        8.0
                    }
                } else {
                    rng.f()
                }
            })
            .collect();
        quantize_activation(GgmlType::Q8_K, &y, &mut a[t * ar..(t + 1) * ar]).unwrap();
    }
    (w, a)
}
