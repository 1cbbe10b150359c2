//! The hardware GPUs' default path (`MatmulPath::Vec`: f32 partial sums, split decode
//! attention) run end to end on lavapipe: greedy decoding of smollm2 gives llama.cpp's
//! greedy ids up to the oracle's first near-tie; and the vec matmul's rows of 8
//! invocations (lavapipe's subgroups hold 8).
#![cfg(feature = "gpu")]

mod support;
use support::nmse;

use std::sync::Arc;

use kiln::backend::cpu::CpuBackend;
use kiln::backend::wgpu::{kernels, AdapterPolicy, GpuBackend, MatmulPath};
use kiln::backend::Backend;
use kiln::engine::{Engine, EngineOptions};
use kiln::gguf::{GgufFile, GgufWriter};
use kiln::quant::{self, GgmlType};
use support::*;

#[test]
fn smollm2_gpu_vec_greedy_matches_llama_cpp() {
    let opts = EngineOptions::default().with_n_ctx(256).with_batch(64).with_threads(2);
    let mut gpu = GpuBackend::with_fallback(AdapterPolicy::AnyGpu, false).expect("a Vulkan adapter");
    gpu.set_matmul_path(MatmulPath::Vec);
    let e = Engine::load_with_gpu(model(SMOLLM2.name).to_str().unwrap(), opts, gpu).unwrap();
    // lavapipe runs the vec kernels at ~1 token/s: 8 steps per case.
    session_greedy_matches_oracle(&e, &SMOLLM2, 8);
}

#[test]
fn short_rows_summed_in_a_subgroup_are_the_trees_bits() {
    // A row of 8 units on 8 invocations: on a GPU whose subgroups hold a whole row, its
    // partials are summed by a subgroup butterfly, which must give the portable tree's
    // bits; both within NMSE 1e-11 of the CPU (1e-5 on hardware), and batch invariant.
    const ROWS: usize = 37;
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    let mut vec = |n: usize| -> Vec<f32> {
        (0..n)
            .map(|_| {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                (seed >> 40) as f32 / (1u64 << 23) as f32 - 1.0
            })
            .collect()
    };
    let cases = [(GgmlType::Q4_0, 256usize), (GgmlType::Q4_1, 256), (GgmlType::Q4_K, 512)];
    let mut w = GgufWriter::new();
    for (ty, k) in cases {
        let mut data = vec![0u8; ty.row_size(k).unwrap() * ROWS];
        quant::quantize_row(ty, &vec(ROWS * k), &mut data).unwrap();
        w.add_tensor(format!("w.{}", ty.name()), ty, &[k as u64, ROWS as u64], data).unwrap();
        w.add_f32(format!("x.{}", ty.name()), &[k as u64, 3], &vec(3 * k)).unwrap();
        assert_eq!(kernels::vec_shape_for(ty, ROWS, k, 8).npr, 8, "{ty}");
    }
    let g = Arc::new(GgufFile::from_bytes(w.to_bytes()).unwrap());
    let run = |b: &dyn Fn(&str, &str, usize) -> Vec<f32>, ty: GgmlType, n: usize| {
        b(&format!("w.{}", ty.name()), &format!("x.{}", ty.name()), n)
    };
    fn out<B: Backend>(b: &B, g: &Arc<GgufFile>, w: &str, x: &str, n: usize) -> Vec<f32> {
        let w = b.load_weight(g, g.tensor(w).unwrap()).unwrap();
        let t = b.load_weight(g, g.tensor(x).unwrap()).unwrap();
        let k = b.weight_shape(&t).1;
        let mut xb = b.alloc(3 * k).unwrap();
        b.embed(&t, &(0..n as u32).collect::<Vec<_>>(), 1.0, &mut xb).unwrap();
        let mut y = b.alloc(3 * b.weight_shape(&w).0).unwrap();
        b.matmul(&w, &xb, n, &mut y);
        let mut v = vec![0.0; n * b.weight_shape(&w).0];
        b.read(&y, &mut v);
        v
    }
    let cpu = CpuBackend::new(2);
    let gpus: Vec<GpuBackend> = [false, true]
        .into_iter()
        .map(|fallback| {
            let mut g = GpuBackend::with_fallback(AdapterPolicy::AnyGpu, fallback).expect("a Vulkan adapter");
            g.set_matmul_path(MatmulPath::Vec);
            g
        })
        .collect();
    // Short rows on 8 invocations where the adapter's subgroups hold 8 (lavapipe's).
    if gpus[0].is_software() {
        assert_eq!(gpus[0].vec_npr_min(), 8, "{}", gpus[0].name());
    }
    for (ty, _) in cases {
        let c = run(&|w, x, n| out(&cpu, &g, w, x, n), ty, 3);
        let mut bits = Vec::new();
        for gpu in &gpus {
            let batch = run(&|w, x, n| out(gpu, &g, w, x, n), ty, 3);
            let what = format!("{ty} on {}", gpu.name());
            // Hardware adapters' f32 division and rounding are not IEEE's (NVIDIA's: the
            // activations' scales), as in gpu_ops.rs.
            let (e, tol) = (nmse(&batch, &c), if gpu.is_software() { 1e-11 } else { 1e-5 });
            assert!(e <= tol, "{what}: NMSE {e:e} against the CPU");
            let one = run(&|w, x, n| out(gpu, &g, w, x, n), ty, 1);
            assert!(one.iter().zip(&batch).all(|(a, b)| a.to_bits() == b.to_bits()), "{what}: batch variant");
            bits.push(batch);
        }
        let same = bits[0].iter().zip(&bits[1]).all(|(a, b)| a.to_bits() == b.to_bits());
        assert!(same, "{ty}: the subgroup path's sums differ from the tree's");
    }
}
