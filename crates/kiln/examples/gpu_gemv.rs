//! Throughput of the GPU matmul kernels alone, for tuning them on real hardware in one
//! short run: `cargo run --release --example gpu_gemv [REPS]`. For each weight type and
//! shape (Llama-2-7B / Llama-3-8B rows x cols; `[REPS [N_SHAPES]]` takes the first N), one
//! decode row is multiplied REPS times in
//! one submission, per kernel variant (MatmulPath Vec, the default, and Exact); prints µs per call and GB/s of weights read.
#[cfg(feature = "gpu")]
fn main() {
    use std::sync::Arc;
    use std::time::Instant;

    use kiln::backend::wgpu::{AdapterPolicy, GpuBackend, MatmulPath};
    use kiln::backend::Backend;
    use kiln::gguf::{GgufFile, GgufWriter};
    use kiln::quant::GgmlType::{self, *};

    let reps: usize = std::env::args().nth(1).and_then(|s| s.parse().ok()).unwrap_or(100);
    let all =
        [(4096usize, 4096usize), (11008, 4096), (4096, 11008), (14336, 4096), (32000, 4096), (64, 4096)];
    // The last shape is tiny: its time is the per-dispatch floor.
    let n_shapes: usize = std::env::args().nth(2).and_then(|s| s.parse().ok()).unwrap_or(all.len());
    let shapes = &all[..n_shapes.clamp(1, all.len())];
    let types: [GgmlType; 5] = [Q4_0, Q8_0, Q4_K, Q5_K, Q6_K];
    let mut w = GgufWriter::new();
    for ty in types {
        for &(rows, cols) in shapes {
            let data = kiln::model::synth::random_matrix(ty, cols, rows, 0.05, 7)
                .unwrap_or_else(|| panic!("no random {} matrices", ty.name()));
            w.add_tensor(format!("{}.{rows}x{cols}", ty.name()), ty, &[cols as u64, rows as u64], data)
                .unwrap();
        }
    }
    let x: Vec<f32> = (0..11008).map(|i| ((i * 7919) % 1000) as f32 / 500.0 - 1.0).collect();
    w.add_f32("x", &[11008], &x).unwrap();
    let g = Arc::new(GgufFile::from_bytes(w.to_bytes()).unwrap());
    for path in [MatmulPath::Vec, MatmulPath::Exact] {
        let mut b = match GpuBackend::new(AdapterPolicy::AnyGpu) {
            Ok(b) => b,
            Err(e) => {
                eprintln!("error: {e}");
                std::process::exit(1);
            }
        };
        b.set_matmul_path(path);
        println!("{} ({path:?})", b.name());
        for t in g.tensors.iter().filter(|t| t.name != "x") {
            let wt = b.load_weight(&g, t).unwrap();
            let (rows, cols) = b.weight_shape(&wt);
            let xs = b.upload_f32(&x[..cols]).unwrap();
            let mut out = b.alloc(rows).unwrap();
            let mut v = vec![0f32; 1];
            b.matmul(&wt, &xs, 1, &mut out);
            b.read(&out, &mut v);
            let t0 = Instant::now();
            for _ in 0..reps {
                b.matmul(&wt, &xs, 1, &mut out);
            }
            b.read(&out, &mut v);
            let us = t0.elapsed().as_secs_f64() * 1e6 / reps as f64;
            let bytes = t.size as f64;
            println!("  {:<18} {:9.1} us  {:8.1} GB/s", t.name, us, bytes / us / 1e3);
        }
        if path == MatmulPath::Vec {
            // The per-dispatch floor: a 64-value add, each reading the last's output (a
            // barrier between them), or rotating over 8 buffers (no dependence).
            let y = b.upload_f32(&x[..64]).unwrap();
            let mut xs: Vec<_> = (0..8).map(|_| b.upload_f32(&x[..64]).unwrap()).collect();
            let mut v = vec![0f32; 1];
            // ring 0: each add reads the other buffer's last output (a chain through two).
            for (what, ring) in [("in place", 1), ("ping-pong", 0), ("independent", 8)] {
                let t0 = Instant::now();
                for i in 0..reps {
                    if ring == 0 {
                        let (a, c) = xs.split_at_mut(1);
                        let (dst, src) = if i % 2 == 0 { (&mut a[0], &c[0]) } else { (&mut c[0], &a[0]) };
                        b.add(dst, src, 1.0, 64);
                    } else {
                        b.add(&mut xs[i % ring], &y, 1.0, 64);
                    }
                }
                b.read(&xs[0], &mut v);
                let us = t0.elapsed().as_secs_f64() * 1e6 / reps as f64;
                println!("  dispatch floor, {what:<12} {us:9.1} us");
            }
        }
    }
}

#[cfg(not(feature = "gpu"))]
fn main() {
    eprintln!("built without the gpu feature");
}
