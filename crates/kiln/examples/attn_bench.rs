//! The CPU attention alone, at the head shapes of our models: one decode step over DEPTH
//! cached positions, and a prompt of 512 tokens, per layer times the layer count:
//!
//!     cargo run --release -p kiln --example attn_bench [DEPTH] [THREADS]
//!
//! Prints the best and the median of several runs (ms per token for decode, per prompt for
//! prefill; RUNS=n decode runs, default 30) in wall-clock time (process CPU time advances
//! in scheduler ticks on a VM, too coarse for a few milliseconds). The cached keys and values
//! are random, a cache per layer (HOT=1: one for all, L2-resident, to see the arithmetic
//! without the memory traffic; SHAPE=name: that shape alone; DECODE=1: no prefill).

use half::f16;
use kiln::backend::cpu::CpuBackend;
use kiln::backend::{AttnPlan, Backend};

fn main() {
    let arg = |i: usize, d: usize| std::env::args().nth(i).and_then(|v| v.parse().ok()).unwrap_or(d);
    let (depth, threads) = (arg(1, 2048), arg(2, 2));
    let runs = std::env::var("RUNS").ok().and_then(|v| v.parse().ok()).unwrap_or(30usize).max(1);
    let be = CpuBackend::new(threads);
    let mut seed = 1u64;
    let mut next = move || {
        seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (seed >> 40) as f32 / (1u64 << 24) as f32 - 0.5
    };
    // (name, n_head, n_head_kv, head_dim, layers)
    let shapes = [
        ("qwen2.5-1.5b", 12, 2, 128, 28),
        ("qwen2.5-0.5b", 14, 2, 64, 24),
        ("smollm2-135m", 9, 3, 64, 30),
        ("gemma3-270m", 4, 1, 256, 18),
    ];
    let only = std::env::var("SHAPE").ok();
    for (name, n_head, n_kv, hd, layers) in shapes {
        if only.as_ref().is_some_and(|o| o != name) {
            continue;
        }
        let slots = depth + 512;
        // A cache per layer, as a model has: at depth they outgrow the caches.
        let row = slots * n_kv * hd;
        // HOT=1: one layer's cache for all, so it stays in L2 (the compute alone). Allocated
        // as the model's KV pool is.
        let n_caches = if std::env::var("HOT").is_ok() { 1 } else { layers };
        let alloc = || be.alloc_kv(row).expect("KV cache");
        let mut caches: Vec<_> = (0..n_caches).map(|_| (alloc(), alloc())).collect();
        for (kc, vc) in caches.iter_mut() {
            kc.iter_mut().for_each(|x| *x = f16::from_f32(next() * 4.0));
            vc.iter_mut().for_each(|x| *x = f16::from_f32(next()));
        }
        let table: Vec<u32> = (0..slots as u32).collect();
        let tables = [&table[..]];
        let mut time = |n_tok: usize, p0: usize| {
            let q: Vec<f32> = (0..n_tok * n_head * hd).map(|_| next() * 4.0).collect();
            let pos: Vec<u32> = (p0..p0 + n_tok).map(|p| p as u32).collect();
            let seq = vec![0u32; n_tok];
            let plan = AttnPlan {
                pos: &pos,
                seq: &seq,
                tables: &tables,
                block_size: kiln::kv::BLOCK_SIZE,
                n_head,
                n_head_kv: n_kv,
                head_dim: hd,
                scale: 1.0 / (hd as f32).sqrt(),
                q_scale: &[],
                softcap: 0.0,
                window: None,
                seq_len: None,
                alibi: None,
            };
            let mut out = vec![0f32; n_tok * n_head * hd];
            let mut ms: Vec<f64> = (0..if n_tok == 1 { runs } else { 5 })
                .map(|_| {
                    let t = std::time::Instant::now();
                    for l in 0..layers {
                        let (kc, vc) = &caches[l % n_caches];
                        be.attention(&q, kc, vc, &plan, &mut out);
                    }
                    t.elapsed().as_secs_f64() * 1e3
                })
                .collect();
            ms.sort_by(f64::total_cmp);
            (ms[0], ms[ms.len() / 2])
        };
        let (d, dm) = time(1, depth);
        let (p, pm) = if std::env::var("DECODE").is_ok() { (0.0, 0.0) } else { time(512, 0) };
        println!("{name:14} decode @ d{depth}: {d:6.2} ms/token (median {dm:6.2})   prefill 512: {p:7.1} ms (median {pm:7.1})");
    }
}
