//! Mixtures of experts on the CPU, beyond the logits against llama.cpp
//! (`synth_vs_llamacpp.rs`): batch invariance when sequences share experts, and files whose
//! expert tensors disagree with their metadata.

use kiln::engine::{Device, Engine, EngineOptions};
use kiln::gguf::{GgufWriter, Value};
use kiln::model::synth::{self, SynthSpec};
use kiln::model::{Entry, OutputKind};
use kiln::quant::GgmlType;
use kiln::KilnError;

/// Writes `w` and loads it on the CPU (2 threads, 3 sequences).
fn load(w: GgufWriter, tag: &str) -> kiln::Result<Engine> {
    load_on(w, tag, Device::Cpu)
}

/// On the GPU with `--batch-invariant`: hardware GPUs' default takes prompts of several
/// tokens through tensor-core tiles, whose results depend on the batch (the documented
/// trade); software adapters' exact kernels are the same either way.
fn load_on(w: GgufWriter, tag: &str, device: Device) -> kiln::Result<Engine> {
    load_with(w, tag, device, |path, opts| Engine::load(path, opts))
}

/// Writes `w` and loads it with `load` (the file's path and the options for `device`).
fn load_with(
    w: GgufWriter,
    tag: &str,
    device: Device,
    load: impl FnOnce(&str, EngineOptions) -> kiln::Result<Engine>,
) -> kiln::Result<Engine> {
    let dir = std::env::temp_dir().join(format!("kiln-moe-{}-{tag}-{device:?}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("m.gguf");
    w.write_file(&path).unwrap();
    let opts = EngineOptions::default().with_n_ctx(128).with_batch(64).with_n_seq(3).with_threads(2);
    let opts = opts.with_device(device).with_batch_invariant(device == Device::Gpu);
    let e = load(path.to_str().unwrap(), opts);
    std::fs::remove_dir_all(&dir).ok();
    e
}

const SEQS: usize = 3;
const LEN: usize = 40;

fn prompt(s: usize) -> Vec<u32> {
    (0..LEN as u32).map(|i| 32 + (i * 37 + s as u32 * 11) % 95).collect()
}

/// Every position's logits of three sequences, decoded in batches of `chunk` entries taken
/// round-robin from the sequences (1: each token alone).
fn logits(e: &Engine, chunk: usize) -> Vec<Vec<f32>> {
    let r = e.runner();
    let seqs: Vec<_> = (0..SEQS).map(|_| r.new_seq()).collect();
    let prompts: Vec<_> = (0..SEQS).map(prompt).collect();
    // Entries in the order (position, sequence): neighbours in a batch are other sequences.
    let order: Vec<(usize, usize)> = (0..LEN).flat_map(|i| (0..SEQS).map(move |s| (s, i))).collect();
    let n_vocab = e.config().n_vocab;
    let mut out = vec![Vec::new(); SEQS];
    for part in order.chunks(chunk) {
        let entries: Vec<Entry> =
            part.iter().map(|&(s, i)| Entry { seq: seqs[s], token: prompts[s][i], output: true }).collect();
        let got = r.decode(&entries, OutputKind::Logits).unwrap();
        for (&(s, _), row) in part.iter().zip(got.chunks_exact(n_vocab)) {
            out[s].extend_from_slice(row);
        }
    }
    seqs.into_iter().for_each(|s| r.free_seq(s));
    out
}

/// A token's logits do not depend on which tokens of other sequences share its experts in
/// a batch: three sequences' tokens one at a time, and together in batches of 7, 16 and 48
/// entries. Every batch of more than n_expert / k tokens has tokens sharing an expert (by
/// pigeonhole: 4 slots each over 16 experts), so the experts' row groups mix sequences.
fn check_batch_invariance(spec: SynthSpec, what: &str, device: Device) {
    check_engine_batch_invariance(&load_on(spec.build().unwrap(), what, device).unwrap(), what);
}

fn check_engine_batch_invariance(e: &Engine, what: &str) {
    eprintln!("{what}: {}", e.backend_name());
    let alone = logits(e, 1);
    for chunk in [7, 16, 48] {
        let got = logits(e, chunk);
        for (s, (a, g)) in alone.iter().zip(&got).enumerate() {
            let diff = a.iter().zip(g).filter(|(x, y)| x.to_bits() != y.to_bits()).count();
            assert_eq!(diff, 0, "{what}, batches of {chunk}: sequence {s}: {diff} logits differ from alone");
        }
    }
}

#[test]
fn f16_experts_do_not_depend_on_the_batch() {
    // olmoe-tiny: 16 experts, 4 a token.
    check_batch_invariance(synth::preset("olmoe-tiny").unwrap(), "olmoe-tiny", Device::Cpu);
}

/// Q4_K experts (the interleaved kernels: GEMV for an expert's few rows, GEMM from four) and
/// a gated shared expert.
#[test]
fn q4_k_experts_do_not_depend_on_the_batch() {
    check_batch_invariance(q4_k_spec(), "qwen2moe q4_k", Device::Cpu);
}

fn q4_k_spec() -> SynthSpec {
    let mut spec = synth::preset("qwen2moe-tiny").unwrap();
    spec.n_embd = 256;
    spec.matrix_type = GgmlType::Q4_K;
    let x = spec.experts.as_mut().unwrap();
    (x.n_expert, x.n_used, x.n_ff, x.shared_ff) = (16, 4, 256, Some(256));
    spec
}

/// The same on the GPU (lavapipe in CI): each slot's dot is its own (matmul_id.wgsl).
#[cfg(feature = "gpu")]
mod gpu {
    use super::*;

    #[test]
    fn f16_experts_do_not_depend_on_the_batch() {
        check_batch_invariance(synth::preset("olmoe-tiny").unwrap(), "olmoe-tiny", Device::Gpu);
    }

    #[test]
    fn q4_k_experts_do_not_depend_on_the_batch() {
        check_batch_invariance(q4_k_spec(), "qwen2moe q4_k", Device::Gpu);
    }

    /// On the vec path (hardware GPUs' default: matmul_id_vec.wgsl), with and without
    /// subgroups: a slot's sums are the same whichever slots share its expert and however
    /// many tokens the step has. Q4_K experts take the wide units, F16 ones the plain units.
    #[test]
    fn experts_on_the_vec_path_do_not_depend_on_the_batch() {
        use kiln::backend::wgpu::{AdapterPolicy, GpuBackend, MatmulPath};
        let specs = [(q4_k_spec(), "qwen2moe q4_k"), (synth::preset("olmoe-tiny").unwrap(), "olmoe-tiny")];
        for fallback in [false, true] {
            for (spec, what) in specs.clone() {
                let what = format!("{what} vec{}", if fallback { " fallback" } else { "" });
                let e = load_with(spec.build().unwrap(), &what, Device::Gpu, |path, opts| {
                    let mut gpu = GpuBackend::with_fallback(AdapterPolicy::AnyGpu, fallback)?;
                    gpu.set_matmul_path(MatmulPath::Vec);
                    gpu.set_batch_invariant(true);
                    Engine::load_with_gpu(path, opts, gpu)
                })
                .unwrap();
                check_engine_batch_invariance(&e, &what);
            }
        }
    }

    /// A Qwen3-MoE decode step on the vec path (hardware GPUs' default) records 7
    /// dispatches per layer (docs/gpu.md lists them), 6 where the experts' hidden width is
    /// whole blocks of 256 (the GLU then runs in the gate and up projection's tail): the
    /// difference between qwen3moe-tiny with 3 layers and with 2 (its matrices Q8_0, as a
    /// quantized model's: F16 activations are rounded by a dispatch of their own), a step of
    /// one token after a prompt. Under batch invariance no decode prologue runs (the
    /// attention's norm and the FFN's are dispatches of their own) and the head norms
    /// with the RoPE store are a kernel of their own: 10 and 9. OLMoE's norms of all of q
    /// and all of k take the same tail (7 and 6), and under batch invariance a dispatch
    /// each, then the RoPE store's (13 and 12).
    #[test]
    fn a_qwen3moe_decode_layer_on_the_vec_path_is_seven_dispatches_or_six() {
        use kiln::backend::wgpu::{AdapterPolicy, GpuBackend, MatmulPath};
        let step = |preset: &str, n_layer: usize, n_ff: usize, invariant: bool| {
            let mut spec = synth::preset(preset).unwrap();
            spec.n_layer = n_layer;
            spec.matrix_type = GgmlType::Q8_0;
            spec.experts.as_mut().unwrap().n_ff = n_ff;
            let mut counts = None;
            let name = format!("{preset}{n_layer}x{n_ff}{}", if invariant { "i" } else { "" });
            let e = load_with(spec.build().unwrap(), &name, Device::Gpu, |path, opts| {
                let mut gpu = GpuBackend::new(AdapterPolicy::AnyGpu)?;
                gpu.set_matmul_path(MatmulPath::Vec);
                gpu.set_batch_invariant(invariant);
                counts = Some(gpu.counts());
                Engine::load_with_gpu(path, opts, gpu)
            })
            .unwrap();
            let counts = counts.unwrap();
            let r = e.runner();
            let seq = r.new_seq();
            let entry = |token| Entry { seq, token, output: true };
            r.decode(&[entry(40), entry(41)], OutputKind::Logits).unwrap();
            let d0 = counts.get().1;
            r.decode(&[entry(42)], OutputKind::Logits).unwrap();
            counts.get().1 - d0
        };
        let counts = [
            ("qwen3moe-tiny", [(32, false, 7), (256, false, 6), (32, true, 10), (256, true, 9)]),
            ("olmoe-tiny", [(32, false, 7), (256, false, 6), (32, true, 13), (256, true, 12)]),
        ];
        for (preset, cases) in counts {
            for (n_ff, invariant, expected) in cases {
                let per_layer = step(preset, 3, n_ff, invariant) - step(preset, 2, n_ff, invariant);
                assert_eq!(
                    per_layer, expected,
                    "{preset}: {per_layer} dispatches per layer at an expert width of {n_ff} (batch invariant: {invariant})"
                );
            }
        }
    }

    /// The whole forward on the GPU against the CPU's: within gpu_models.rs's bars (the dense
    /// synthetic presets' logits differ in the last bits too, through ops other than the
    /// experts'; tests/gpu_mirror.rs checks the experts' ops bit for bit), the looser one on
    /// the vec path (hardware adapters' default, run here too), which regroups f32 sums.
    #[test]
    fn logits_match_the_cpu() {
        use kiln::backend::wgpu::{AdapterPolicy, GpuBackend, MatmulPath};
        let software = GpuBackend::new(AdapterPolicy::AnyGpu).unwrap().is_software();
        let presets = [
            "qwen3moe-tiny",
            "qwen2moe-tiny",
            "mixtral-tiny",
            "olmoe-tiny",
            "granitemoe-tiny",
            "lfm2moe-tiny",
        ];
        let specs = presets.iter().map(|p| (p.to_string(), synth::preset(p).unwrap()));
        for (what, spec) in specs.chain([("qwen2moe q4_k".to_string(), q4_k_spec())]) {
            let cpu = load_on(spec.build().unwrap(), &what, Device::Cpu).unwrap();
            let c = logits(&cpu, 16);
            for vec in [false, true] {
                let gpu = load_with(spec.build().unwrap(), &what, Device::Gpu, |path, opts| {
                    let mut gpu = GpuBackend::new(AdapterPolicy::AnyGpu)?;
                    if vec {
                        gpu.set_matmul_path(MatmulPath::Vec);
                    }
                    gpu.set_batch_invariant(true);
                    Engine::load_with_gpu(path, opts, gpu)
                })
                .unwrap();
                let bar = if vec || !software { 2e-2 } else { 1e-4 };
                let g = logits(&gpu, 16);
                for (s, (c, g)) in c.iter().zip(&g).enumerate() {
                    let num: f64 = c.iter().zip(g).map(|(&x, &y)| ((x - y) as f64).powi(2)).sum();
                    let den: f64 = c.iter().map(|&x| (x as f64).powi(2)).sum();
                    let differ = c.iter().zip(g).filter(|(x, y)| x.to_bits() != y.to_bits()).count();
                    eprintln!(
                        "{what}{}: sequence {s}: NMSE {:.3e}, {differ} of {} logits differ",
                        if vec { " (vec)" } else { "" },
                        num / den,
                        c.len()
                    );
                    assert!(num / den < bar, "{what}: sequence {s}: NMSE {}", num / den);
                }
            }
        }
    }
}

/// Loading `preset` after `edit` fails with a tensor error naming `tensor`.
#[track_caller]
fn load_error(preset: &str, tag: &str, tensor: &str, edit: impl FnOnce(&mut GgufWriter)) {
    let mut w = synth::preset(preset).unwrap().build().unwrap();
    edit(&mut w);
    match load(w, tag) {
        Ok(_) => panic!("{tag}: loaded"),
        Err(KilnError::Tensor { name, msg }) => {
            eprintln!("{tag}: tensor {name}: {msg}");
            assert_eq!(name, tensor, "{tag}: {msg}");
        }
        Err(e) => panic!("{tag}: {e}, expected an error naming {tensor}"),
    }
}

#[test]
fn expert_tensors_that_disagree_with_the_metadata_fail_to_load() {
    // qwen3moe-tiny: 8 experts of 32 (expert_feed_forward_length), n_embd 64.
    load_error("qwen3moe-tiny", "count", "blk.0.ffn_gate_exps.weight", |w| {
        w.set("qwen3moe.expert_count", Value::U32(6));
    });
    load_error("qwen3moe-tiny", "width", "blk.0.ffn_gate_exps.weight", |w| {
        w.set("qwen3moe.expert_feed_forward_length", Value::U32(48));
    });
    load_error("qwen3moe-tiny", "router", "blk.1.ffn_gate_inp.weight", |w| {
        assert!(w.remove_tensor("blk.1.ffn_gate_inp.weight"));
    });
    load_error("qwen3moe-tiny", "down", "blk.2.ffn_down_exps.weight", |w| {
        assert!(w.remove_tensor("blk.2.ffn_down_exps.weight"));
    });
    load_error("qwen2moe-tiny", "shared gate", "blk.0.ffn_gate_inp_shexp.weight", |w| {
        assert!(w.remove_tensor("blk.0.ffn_gate_inp_shexp.weight"));
    });
    // lfm2moe-tiny: experts from layer 1 on, each MoE layer with a selection bias of 8.
    load_error("lfm2moe-tiny", "no bias", "blk.2.exp_probs_b.bias", |w| {
        assert!(w.remove_tensor("blk.2.exp_probs_b.bias"));
    });
    load_error("lfm2moe-tiny", "bias length", "blk.1.exp_probs_b.bias", |w| {
        assert!(w.remove_tensor("blk.1.exp_probs_b.bias"));
        w.add_f32("blk.1.exp_probs_b.bias", &[6], &[0.0; 6]).unwrap();
    });
    load_error("lfm2moe-tiny", "lfm2moe count", "blk.1.ffn_gate_exps.weight", |w| {
        w.set("lfm2moe.expert_count", Value::U32(16));
    });
    // One more dense layer than the file has.
    load_error("lfm2moe-tiny", "dense layers", "blk.1.ffn_down.weight", |w| {
        w.set("lfm2moe.leading_dense_block_count", Value::U32(2));
    });
    // A 2-D tensor where the experts' 3-D one belongs.
    load_error("mixtral-tiny", "2-D", "blk.0.ffn_up_exps.weight", |w| {
        assert!(w.remove_tensor("blk.0.ffn_up_exps.weight"));
        let data = vec![0u8; 64 * 64 * 2 * 4];
        w.add_tensor("blk.0.ffn_up_exps.weight", GgmlType::F16, &[64, 256], data).unwrap();
    });
}
