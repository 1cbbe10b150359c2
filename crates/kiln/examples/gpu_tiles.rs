//! The tile matmul's shapes on real hardware, for tuning `coop::shape` in one short run:
//!
//!     cargo run --release -p kiln --example gpu_tiles [SECONDS] [TYPES] [TOKENS] [AHEADS]
//!
//! For each weight type (TYPES, a comma list; default q4_k,q6_k,q4_0), weight shape of the
//! 7-8B models (rows x k: attention output, FFN gate/up, FFN down) and batch (TOKENS;
//! default 8,16,32,64,128,512): the batch-invariant vec kernel, the shape `coop::shape`
//! picks, and every tile shape that fits the adapter (tokens per workgroup near the batch's,
//! k split 1-16 ways; 128-4096 workgroups; with AHEADS, a comma list, the tiles of the
//! picked shape with each of those stages in flight instead, k split as above), each timed
//! over repeated calls in one submission. Prints µs per call and TFLOP/s of each, best tile
//! shapes first; stops starting new cases after SECONDS (60).
#[cfg(feature = "gpu")]
fn main() {
    use std::sync::Arc;
    use std::time::Instant;

    use kiln::backend::wgpu::coop::{self, CoopShape, Ops};
    use kiln::backend::wgpu::{AdapterPolicy, GpuBackend, GpuBuf, GpuWeight};
    use kiln::backend::Backend;
    use kiln::gguf::{GgufFile, GgufWriter};
    use kiln::quant::GgmlType;

    let arg = |i: usize| std::env::args().nth(i);
    let budget: f64 = arg(1).and_then(|s| s.parse().ok()).unwrap_or(60.0);
    let types: Vec<GgmlType> = arg(2)
        .unwrap_or_else(|| "q4_k,q6_k,q4_0".into())
        .split(',')
        .map(|n| GgmlType::from_name(&n.to_uppercase()).unwrap_or_else(|| panic!("unknown type {n}")))
        .collect();
    let tokens: Vec<usize> = arg(3)
        .unwrap_or_else(|| "8,16,32,64,128,512".into())
        .split(',')
        .map(|n| n.parse().expect("token counts"))
        .collect();
    let aheads: Vec<u32> = arg(4)
        .map_or_else(Vec::new, |a| a.split(',').map(|n| n.parse().expect("stages in flight")).collect());
    let shapes = [(4096usize, 4096usize), (28672, 4096), (4096, 14336)];
    let max_tok = *tokens.iter().max().unwrap();
    let mut w = GgufWriter::new();
    for &ty in &types {
        for &(rows, k) in &shapes {
            let data = kiln::model::synth::random_matrix(ty, k, rows, 0.05, 7)
                .unwrap_or_else(|| panic!("no random {} matrices", ty.name()));
            w.add_tensor(format!("{}.{rows}x{k}", ty.name()), ty, &[k as u64, rows as u64], data).unwrap();
        }
    }
    let g = Arc::new(GgufFile::from_bytes(w.to_bytes()).unwrap());
    let mut b = match GpuBackend::new(AdapterPolicy::AnyGpu) {
        Ok(b) => b,
        Err(e) => {
            eprintln!("error: {e}");
            std::process::exit(1);
        }
    };
    let Some(caps) = b.coop_caps() else {
        eprintln!("error: {} has no cooperative matrices", b.name());
        std::process::exit(1);
    };
    println!("{} ({caps:?})", b.name());
    let ops = if caps.emulated { Ops::Emulated } else { Ops::Coop };
    let x: Vec<f32> = (0..max_tok * 14336).map(|i| ((i * 7919) % 1000) as f32 / 500.0 - 1.0).collect();
    let name = |s: CoopShape| format!("{}x{} sg{}x{} ks{} a{}", s.fm, s.fn_, s.sgm, s.sgn, s.ks, s.ahead);

    // µs per call of `n` tokens with what `b` picks now (reps in one submission).
    let time = |b: &GpuBackend, wt: &GpuWeight, xs: &GpuBuf, n: usize, out: &mut GpuBuf| {
        let mut v = vec![0f32; 1];
        b.matmul(wt, xs, n, out);
        b.read(out, &mut v);
        let flop = 2.0 * (n * wt.rows * wt.cols) as f64;
        // Tens of milliseconds of work: the submission and read-back stay a small share.
        let reps = (6e11 / flop).clamp(10.0, 1000.0) as usize;
        let t0 = Instant::now();
        for _ in 0..reps {
            b.matmul(wt, xs, n, out);
        }
        b.read(out, &mut v);
        t0.elapsed().as_secs_f64() * 1e6 / reps as f64
    };
    let t_start = Instant::now();
    'cases: for &ty in &types {
        for &(rows, k) in &shapes {
            let t = g.tensor(&format!("{}.{rows}x{k}", ty.name())).unwrap();
            let wt = b.load_weight(&g, t).unwrap();
            let xs = b.upload_f32(&x[..max_tok * k]).unwrap();
            let mut out = b.alloc(max_tok * rows).unwrap();
            for &n in &tokens {
                if t_start.elapsed().as_secs_f64() > budget {
                    println!("(time budget spent)");
                    break 'cases;
                }
                let tflops = |us: f64| 2.0 * (n * rows * k) as f64 / us / 1e6;
                b.set_shape_choice(None);
                b.set_batch_invariant(true);
                let vec_us = time(&b, &wt, &xs, n, &mut out);
                b.set_batch_invariant(false);
                let default = coop::shape(&caps, n, rows, k);
                let mut results: Vec<(f64, CoopShape)> = Vec::new();
                let mut cands = Vec::new();
                for (sgm, sgn) in [(1u32, 2u32), (1, 4), (2, 2), (2, 4), (4, 2), (1, 8)] {
                    for fm in [1u32, 2, 4] {
                        for fn_ in [1u32, 2, 4] {
                            for ks in [1u32, 2, 4, 8, 16] {
                                let s =
                                    CoopShape { fm, fn_, sgm, sgn, sg: caps.max_subgroup, ks, ahead: 1, ops };
                                let s = CoopShape { ahead: coop::ahead(s, k), ..s };
                                let bm = s.bm() as usize;
                                let tiles = n.div_ceil(bm) * rows.div_ceil(s.bn() as usize);
                                let fits = s.storage() <= caps.workgroup_storage
                                    && sgm * sgn * caps.max_subgroup <= caps.max_invocations;
                                let bn = s.bn() as usize;
                                let sized =
                                    bm <= n.max(16) && bm >= n.min(128) / 2 && (32..=256).contains(&bn);
                                let split = ks == 1 || (tiles < 1024 && k / 32 / ks as usize >= 8);
                                let wgs = tiles * ks as usize;
                                let tiled_as_picked = default.is_some_and(|d| {
                                    (d.fm, d.fn_, d.sgm, d.sgn) == (s.fm, s.fn_, s.sgm, s.sgn)
                                });
                                if fits && sized && split && (128..=4096).contains(&wgs) {
                                    if aheads.is_empty() {
                                        cands.push(s);
                                    } else if tiled_as_picked {
                                        cands.extend(aheads.iter().map(|&ahead| CoopShape { ahead, ..s }));
                                    }
                                }
                            }
                        }
                    }
                }
                if let Some(d) = default {
                    cands.retain(|&c| c != d);
                    cands.insert(0, d);
                    // The default shape with every other number of stages in flight asked.
                    for &ahead in &aheads {
                        let a = CoopShape { ahead, ..d };
                        if !cands.contains(&a) {
                            cands.insert(1, a);
                        }
                    }
                }
                for s in cands {
                    if t_start.elapsed().as_secs_f64() > budget + 20.0 {
                        break;
                    }
                    b.set_shape_choice(Some(Arc::new(move |_, _, _| Some(s))));
                    results.push((time(&b, &wt, &xs, n, &mut out), s));
                }
                let def_us = default.map(|d| results.iter().find(|r| r.1 == d).map_or(f64::NAN, |r| r.0));
                results.sort_by(|a, b| a.0.total_cmp(&b.0));
                let best: Vec<String> = results
                    .iter()
                    .take(if aheads.is_empty() { 4 } else { 8 })
                    .map(|(us, s)| format!("{} {us:.1} us ({:.1})", name(*s), tflops(*us)))
                    .collect();
                println!(
                    "{:5} {rows:>5}x{k:<5} {n:>4} tok | vec {vec_us:8.1} us ({:5.1} TFLOP/s) | default {} | best: {}",
                    ty.name(),
                    tflops(vec_us),
                    match (default, def_us) {
                        (Some(d), Some(us)) => format!("{} {us:.1} us ({:.1})", name(d), tflops(us)),
                        _ => "-".into(),
                    },
                    best.join(", ")
                );
            }
        }
    }
    b.set_shape_choice(None);
}

#[cfg(not(feature = "gpu"))]
fn main() {
    eprintln!("built without the gpu feature");
}
