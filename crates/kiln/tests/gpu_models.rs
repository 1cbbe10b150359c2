//! The GPU backend end to end against the CPU backend on real models (lavapipe in CI):
//! logits close after every prompt token and decode step, greedy ids identical up to the
//! CPU's first near-tie (top-2 margin < 0.25), and no op of the forward on the CPU.
//!
//! On software adapters every GPU kernel repeats the CPU backend's arithmetic (integer dots
//! on the same Q8 activations, the same f32 steps in the same order, exact fma,
//! libm-faithful exp), so smollm2's logits come out bit-identical (NMSE 0, measured);
//! so does the opt-in exact matmul (tested here on lavapipe); the hardware GPUs' default
//! fast path regroups the f32 sums (tested with a looser bar). MAX_NMSE is the bar.
#![cfg(feature = "gpu")]

mod support;
use support::nmse;
use support::top2;

use std::sync::Arc;

use kiln::backend::wgpu::{AdapterPolicy, GpuBackend, MatmulPath};
use kiln::engine::{Device, Engine, EngineOptions};
use kiln::gguf::GgufFile;
use kiln::model::{Entry, Model, ModelRunner, OutputKind, Runner};
use kiln::AttnArith;
use support::*;

const TAU: f32 = 0.25;
const MAX_NMSE: f64 = 1e-4;
/// The bar on hardware adapters: their default is the vec path (its drift, measured on
/// lavapipe, is under 1.4e-2), and their f32 division, sqrt and exp are not IEEE-rounded
/// (NVIDIA's), so no path gives the CPU's bits there. Greedy ids must still agree.
const HW_NMSE: f64 = 2e-2;

/// Whether `--device gpu` takes a software adapter here (lavapipe, CI).
fn software_adapter() -> bool {
    static SOFT: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *SOFT.get_or_init(|| GpuBackend::new(AdapterPolicy::AnyGpu).unwrap().is_software())
}

fn engine(m: &RealModel, device: Device) -> Engine {
    // The GPU's exact kernels mirror ggml's attention arithmetic, so the CPU runs it too.
    engine_with(m, device, AttnArith::Ggml)
}

fn engine_with(m: &RealModel, device: Device, arith: AttnArith) -> Engine {
    let opts = EngineOptions::default().with_n_ctx(256).with_batch(64).with_threads(2).with_device(device);
    let opts = opts.with_attn_arith(arith);
    Engine::load(model(m.name).to_str().unwrap(), opts).unwrap()
}

fn parity(m: &RealModel, prompt: &str, steps: usize) {
    if !m.enabled() {
        return;
    }
    let cpu = engine(m, Device::Cpu);
    let gpu = engine(m, Device::Gpu);
    eprintln!("{}: {}", m.name, gpu.backend_name());
    let max_nmse = if software_adapter() { MAX_NMSE } else { HW_NMSE };
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
        assert!(e < max_nmse, "{}: prompt token {i}: logits NMSE {e:e}", m.name);
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
        assert!(e < max_nmse, "{}: decode step {step}: logits NMSE {e:e}", m.name);
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

/// smollm2's prompt logits on `gpu` (a backend set up for one path) against the CPU's:
/// within `max_nmse`, and the same top token wherever the CPU's margin is at least TAU.
fn prompt_parity(gpu: GpuBackend, arith: AttnArith, max_nmse: f64) {
    let max_nmse = if gpu.is_software() { max_nmse } else { max_nmse.max(HW_NMSE) };
    let gguf = Arc::new(GgufFile::open(model(SMOLLM2.name)).unwrap());
    let cpu = engine_with(&SMOLLM2, Device::Cpu, arith);
    let rg = ModelRunner::new(Model::load(&gguf, gpu).unwrap(), 256, 64).unwrap();
    let ids = cpu.tokenizer().encode("The capital of France is", true, false).unwrap();
    let (rc, sc, sg) = (cpu.runner(), cpu.runner().new_seq(), rg.new_seq());
    let e = |seq, t: &[u32]| t.iter().map(|&token| Entry { seq, token, output: true }).collect::<Vec<_>>();
    let lc = rc.decode(&e(sc, &ids), OutputKind::Logits).unwrap();
    let lg = rg.decode(&e(sg, &ids), OutputKind::Logits).unwrap();
    let n_vocab = cpu.config().n_vocab;
    for (c, g) in lc.chunks(n_vocab).zip(lg.chunks(n_vocab)) {
        let e = nmse(g, c);
        let (tc, margin) = top2(c);
        eprintln!("  logits NMSE {e:e} top {tc} {} margin {margin}", top2(g).0);
        assert!(e < max_nmse, "logits NMSE {e:e} over {max_nmse:e}");
        if margin >= TAU {
            assert_eq!(top2(g).0, tc);
        }
    }
}

#[test]
fn smollm2_gpu_fallback_matches_cpu() {
    // The portable path (no subgroups), forced.
    let gpu = GpuBackend::with_fallback(AdapterPolicy::AnyGpu, true).unwrap();
    assert!(!gpu.subgroups());
    prompt_parity(gpu, AttnArith::Ggml, MAX_NMSE);
}

#[test]
fn smollm2_gpu_vec_matmul_stays_close_to_cpu() {
    // The hardware GPUs' default path (f32 partial sums, f32 split attention) against the CPU running f32
    // attention: each matmul is within NMSE 1e-11 of the CPU's (gpu_ops), but a last-bit
    // difference that moves an activation across a Q8 rounding boundary changes it by a
    // quantization step, and such flips compound through smollm2's 30 layers: the logits
    // drift to NMSE ~5e-6 (first token) to ~1e-2 (measured), over the 1e-4 bar that the
    // software default meets (bit-identical). The greedy tokens must still agree.
    for fallback in [false, true] {
        let mut gpu = GpuBackend::with_fallback(AdapterPolicy::AnyGpu, fallback).unwrap();
        gpu.set_matmul_path(MatmulPath::Vec);
        prompt_parity(gpu, AttnArith::F32, 2e-2);
    }
}

#[test]
fn smollm2_gpu_exact_matmul_is_bit_identical() {
    // The hardware GPUs' opt-in exact matmul (MatmulPath::Exact), bit-identical on
    // software adapters (lavapipe in CI).
    let mut gpu = GpuBackend::with_fallback(AdapterPolicy::AnyGpu, false).unwrap();
    gpu.set_matmul_path(MatmulPath::Exact);
    prompt_parity(gpu, AttnArith::Ggml, 1e-30);
}

/// Every backend op of a forward records GPU dispatches (none has a CPU path).
#[test]
fn forward_runs_no_op_on_the_cpu() {
    let gguf = Arc::new(GgufFile::open(model(SMOLLM2.name)).unwrap());
    let mut gpu = GpuBackend::new(AdapterPolicy::AnyGpu).unwrap();
    // The exact path, where no op's work moves into another's kernel (the vec path's
    // decode matmuls take the norm and GLU into their prologue: fewer dispatches than ops).
    gpu.set_matmul_path(MatmulPath::Exact);
    let counts = gpu.counts();
    let runner = ModelRunner::new(Model::load(&gguf, gpu).unwrap(), 64, 8).unwrap();
    let seq = runner.new_seq();
    let before = counts.get();
    runner.decode(&[Entry { seq, token: 1, output: true }], OutputKind::Logits).unwrap();
    let (ops, dispatches) = counts.get();
    let (ops, dispatches) = (ops - before.0, dispatches - before.1);
    let n_layer = runner.config().n_layer as u64;
    // Fused ops (q/k/v and gate/up matmuls, RoPE with the KV store) count once.
    assert!(ops >= 8 * n_layer, "{ops} ops for {n_layer} layers");
    assert!(dispatches >= ops, "{ops} ops but {dispatches} dispatches");
}

/// `kiln run --device gpu --temp 0` on smollm2 (a session's incremental decode): the ids
/// equal llama.cpp's oracle up to its first near-tie (capped at 16 steps: lavapipe is slow).
/// The hardware default (`vec`) runs the same check in tests/gpu_vec.rs.
#[test]
fn smollm2_gpu_greedy_matches_llama_cpp() {
    session_greedy_matches_oracle(&engine(&SMOLLM2, Device::Gpu), &SMOLLM2, 16);
}

/// Greedy steps recorded ahead (the next step embeds the last id on the device before it is
/// read back) give the same ids, logits and sequence as steps recorded one at a time,
/// also where the caller then asks for another token (the step ahead is dropped) and
/// truncates.
#[test]
fn greedy_steps_recorded_ahead_change_nothing() {
    let gguf = Arc::new(GgufFile::open(model(SMOLLM2.name)).unwrap());
    let n_vocab = gguf.tensor("token_embd.weight").unwrap().rows_cols().0 as u32;
    let run = |ahead: bool| {
        let gpu = GpuBackend::new(AdapterPolicy::AnyGpu).unwrap();
        let counts = gpu.counts();
        let r = ModelRunner::new(Model::load(&gguf, gpu).unwrap(), 256, 64).unwrap().with_lookahead(ahead);
        let s = r.new_seq();
        let step =
            |token| r.decode(&[Entry { seq: s, token, output: true }], OutputKind::Argmax).unwrap()[0] as u32;
        let prompt = [1u32, 504, 3458, 282, 4649, 314];
        let e: Vec<Entry> = prompt.iter().map(|&token| Entry { seq: s, token, output: false }).collect();
        r.decode(&e, OutputKind::Logits).unwrap();
        let mut ids = vec![step(2)];
        for _ in 0..5 {
            ids.push(step(ids[ids.len() - 1]));
        }
        let other = (ids[ids.len() - 1] + 1) % n_vocab;
        let logits = r.decode(&[Entry { seq: s, token: other, output: true }], OutputKind::Logits).unwrap();
        r.truncate_seq(s, r.seq_len(s) - 3);
        let mut t = r.seq_tokens(s)[r.seq_len(s) - 1];
        for _ in 0..3 {
            t = step(t);
            ids.push(t);
        }
        r.free_seq(s);
        (ids, logits, r.seq_len(s), counts.get().1)
    };
    let (ahead, one_by_one) = (run(true), run(false));
    assert_eq!(ahead.0, one_by_one.0, "greedy ids");
    assert_eq!(ahead.2, one_by_one.2);
    let e = nmse(&ahead.1, &one_by_one.1);
    assert!(e <= if software_adapter() { 0.0 } else { 1e-10 }, "logits after a dropped step: NMSE {e:e}");
    // Each dropped step ran: more dispatches (no op counts the path taken otherwise).
    assert!(ahead.3 > one_by_one.3, "{} dispatches ahead, {} one by one", ahead.3, one_by_one.3);
}

/// A model whose heads are wider than the GPU's attention kernels take is refused at load
/// with the size named, and runs on the CPU.
#[test]
fn gpu_refuses_heads_wider_than_its_attention_takes() {
    let spec =
        kiln::model::synth::SynthSpec { n_head: 2, n_head_kv: 1, head_dim: Some(320), ..Default::default() };
    let path = std::env::temp_dir().join(format!("kiln-wide-heads-{}.gguf", std::process::id()));
    spec.build().unwrap().write_file(&path).unwrap();
    let load = |device| {
        Engine::load(path.to_string_lossy(), EngineOptions::default().with_threads(1).with_device(device))
    };
    let gpu = load(Device::Gpu);
    let cpu = load(Device::Cpu);
    let _ = std::fs::remove_file(&path);
    let err = gpu.err().expect("a 320-wide head loaded on the GPU").to_string();
    assert!(err.contains("head size on the GPU: 320"), "{err}");
    cpu.expect("the CPU runs any head size");
}
