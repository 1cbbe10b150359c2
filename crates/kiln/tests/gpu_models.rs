//! The GPU backend end to end against the CPU backend on real models (lavapipe in CI):
//! logits close after every prompt token and decode step, greedy ids identical up to the
//! CPU's first near-tie (top-2 margin < 0.25), and no op of the forward on the CPU.
//!
//! The kernels mirror the CPU's arithmetic (layer 0 agrees to NMSE ~1e-14; attention sums
//! q·k in the CPU's order and accumulates in f16 like it), but the GPU's exp differs from
//! libm's by an ulp at times, and the subgroup matmul sums in another order; where that
//! moves an activation across a Q8 or f16 rounding boundary the difference grows through
//! the layers, to logits NMSE 1.5e-2 on smollm2's subgroup path (measured; the CPU's f16
//! attention accumulator, which makes it bit-identical to llama.cpp, amplifies such steps
//! more than the f32 one did). MAX_NMSE bounds that; the greedy ids are the sharp check.
#![cfg(feature = "gpu")]

mod support;

use std::sync::Arc;

use kiln::backend::wgpu::{AdapterPolicy, GpuBackend};
use kiln::engine::{Device, Engine, EngineOptions};
use kiln::gguf::GgufFile;
use kiln::model::{Entry, Model, ModelRunner, OutputKind, Runner};
use support::*;

const TAU: f32 = 0.25;
const MAX_NMSE: f64 = 3e-2;

fn engine(m: &RealModel, device: Device) -> Engine {
    let opts = EngineOptions::default().with_n_ctx(256).with_batch(64).with_threads(2).with_device(device);
    Engine::load(model(m.name).to_str().unwrap(), opts).unwrap()
}

fn nmse(a: &[f32], b: &[f32]) -> f64 {
    let num: f64 = a.iter().zip(b).map(|(&x, &y)| ((x - y) as f64).powi(2)).sum();
    let den: f64 = b.iter().map(|&y| (y as f64).powi(2)).sum();
    num / den.max(1e-30)
}

/// Top token and its margin over the runner-up.
fn top2(l: &[f32]) -> (u32, f32) {
    let (mut i1, mut v1, mut v2) = (0, f32::NEG_INFINITY, f32::NEG_INFINITY);
    for (i, &v) in l.iter().enumerate() {
        if v > v1 {
            (v2, v1, i1) = (v1, v, i);
        } else if v > v2 {
            v2 = v;
        }
    }
    (i1 as u32, v1 - v2)
}

fn parity(m: &RealModel, prompt: &str, steps: usize) {
    if !m.enabled() {
        return;
    }
    let cpu = engine(m, Device::Cpu);
    let gpu = engine(m, Device::Gpu);
    eprintln!("{}: {}", m.name, gpu.backend_name());
    let ids = cpu.tokenizer().encode(prompt, true, false).unwrap();
    let n_vocab = cpu.config().n_vocab;
    let (rc, rg) = (cpu.runner(), gpu.runner());
    let (sc, sg) = (rc.new_seq(), rg.new_seq());
    // Prefill: logits after every prompt token, in one batch.
    let entries = |seq, toks: &[u32]| -> Vec<Entry> {
        toks.iter().map(|&token| Entry { seq, token, output: true }).collect()
    };
    let lc = rc.decode(&entries(sc, &ids), OutputKind::Logits).unwrap();
    let lg = rg.decode(&entries(sg, &ids), OutputKind::Logits).unwrap();
    let mut worst = 0f64;
    for (i, (c, g)) in lc.chunks(n_vocab).zip(lg.chunks(n_vocab)).enumerate() {
        let e = nmse(g, c);
        worst = worst.max(e);
        assert!(e < MAX_NMSE, "{}: prompt token {i}: logits NMSE {e:e}", m.name);
    }
    // Decode one token at a time along the CPU's greedy path.
    let mut last = lc[lc.len() - n_vocab..].to_vec();
    let mut last_g = lg[lg.len() - n_vocab..].to_vec();
    let mut same = 0;
    for step in 0..steps {
        let (tc, margin) = top2(&last);
        let (tg, _) = top2(&last_g);
        if margin < TAU {
            eprintln!("  CPU near-tie at step {step} (margin {margin}): stop comparing ids");
            break;
        }
        assert_eq!(tg, tc, "{}: step {step}: GPU argmax {tg}, CPU {tc} (margin {margin})", m.name);
        same += 1;
        last = rc.decode(&entries(sc, &[tc]), OutputKind::Logits).unwrap();
        last_g = rg.decode(&entries(sg, &[tc]), OutputKind::Logits).unwrap();
        let e = nmse(&last_g, &last);
        worst = worst.max(e);
        assert!(e < MAX_NMSE, "{}: decode step {step}: logits NMSE {e:e}", m.name);
    }
    eprintln!(
        "  {} prompt rows and {same} greedy steps match the CPU; worst logits NMSE {worst:e}",
        ids.len()
    );
}

#[test]
fn smollm2_gpu_matches_cpu() {
    parity(&SMOLLM2, "The capital of France is", 8);
}

#[test]
fn gemma3_gpu_matches_cpu() {
    if full() {
        parity(&GEMMA3, "The capital of France is", 8);
    } else {
        eprintln!("skipping gemma3 on the GPU: set KILN_FULL=1");
    }
}

#[test]
fn qwen05_gpu_matches_cpu() {
    if full() {
        parity(&QWEN05, "def fibonacci(n):", 8);
    } else {
        eprintln!("skipping qwen2.5-coder-0.5b on the GPU: set KILN_FULL=1");
    }
}

#[test]
fn qwen15_gpu_matches_cpu() {
    parity(&QWEN15, "def fibonacci(n):", 8);
}

#[test]
fn smollm2_gpu_fallback_matches_cpu() {
    // The portable path (no subgroups), forced as KILN_GPU_FALLBACK=1 would.
    let gguf = Arc::new(GgufFile::open(model(SMOLLM2.name)).unwrap());
    let gpu = GpuBackend::with_fallback(AdapterPolicy::AnyGpu, true).unwrap();
    assert!(!gpu.subgroups());
    let cpu = engine(&SMOLLM2, Device::Cpu);
    let rg = ModelRunner::new(Model::load(&gguf, gpu).unwrap(), 256, 64).unwrap();
    let ids = cpu.tokenizer().encode("The capital of France is", true, false).unwrap();
    let (rc, sc, sg) = (cpu.runner(), cpu.runner().new_seq(), rg.new_seq());
    let e = |seq, t: &[u32]| t.iter().map(|&token| Entry { seq, token, output: true }).collect::<Vec<_>>();
    let lc = rc.decode(&e(sc, &ids), OutputKind::Logits).unwrap();
    let lg = rg.decode(&e(sg, &ids), OutputKind::Logits).unwrap();
    let n_vocab = cpu.config().n_vocab;
    for (c, g) in lc.chunks(n_vocab).zip(lg.chunks(n_vocab)) {
        assert!(nmse(g, c) < MAX_NMSE);
        let (tc, margin) = top2(c);
        if margin >= TAU {
            assert_eq!(top2(g).0, tc);
        }
    }
}

/// Every backend op of a forward records GPU dispatches (none has a CPU path).
#[test]
fn forward_runs_no_op_on_the_cpu() {
    let gguf = Arc::new(GgufFile::open(model(SMOLLM2.name)).unwrap());
    let gpu = GpuBackend::new(AdapterPolicy::AnyGpu).unwrap();
    let counts = gpu.counts();
    let runner = ModelRunner::new(Model::load(&gguf, gpu).unwrap(), 64, 8).unwrap();
    let seq = runner.new_seq();
    let before = counts.get();
    runner.decode(&[Entry { seq, token: 1, output: true }], OutputKind::Logits).unwrap();
    let (ops, dispatches) = counts.get();
    let (ops, dispatches) = (ops - before.0, dispatches - before.1);
    let n_layer = runner.config().n_layer as u64;
    assert!(ops >= 10 * n_layer, "{ops} ops for {n_layer} layers");
    assert!(dispatches >= ops, "{ops} ops but {dispatches} dispatches");
}
