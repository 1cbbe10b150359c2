//! Parity of every GPU kernel with the CPU backend (whose kernels are tested against the
//! scalar references), on both GPU paths: subgroups where the adapter has them, and the
//! forced portable fallback. Needs a Vulkan adapter; lavapipe (mesa-vulkan-drivers) does.
#![cfg(feature = "gpu")]

use std::sync::Arc;

use kiln::backend::cpu::{k_rows, AttnArith, CpuBackend, KvBuf};
use kiln::backend::wgpu::{AdapterPolicy, GpuBackend, GpuWeight, MatmulPath};
use kiln::backend::{Activation, AttnPlan, Backend, ExpertInput, Gating, LayerNorm, RopeParams, Routing};
use kiln::gguf::{GgufFile, GgufWriter};
use kiln::quant::{self, GgmlType};

const K: usize = 512;
const ROWS: usize = 37;
const TYPES: [GgmlType; 11] = [
    GgmlType::F32,
    GgmlType::F16,
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q8_0,
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
    // Read by no kernel: widened to F16 at upload.
    GgmlType::Q5_1,
    GgmlType::Q3_K,
];
/// Long-row weights (type, k) of LONG_ROWS rows: 64 invocations per row (Q6_K's wide
/// units), 128 (Q4_0's 32-value blocks; Q8_0's, k not a power of two).
const LONG: [(GgmlType, usize); 3] =
    [(GgmlType::Q6_K, 8192), (GgmlType::Q4_0, 16384), (GgmlType::Q8_0, 8960)];
const LONG_ROWS: usize = 5;
const GROUPED: [GgmlType; 3] = [GgmlType::Q8_0, GgmlType::Q4_K, GgmlType::F16];

#[path = "common/rng.rs"]
mod rng;
use rng::{nmse, Rng};

/// A GGUF holding one matrix of each type, inputs (as F32 tables fed through `embed`),
/// a norm weight and a bias.
fn model() -> Arc<GgufFile> {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let mut w = GgufWriter::new();
    for ty in TYPES {
        let v = rng.vec(ROWS * K);
        let mut data = vec![0u8; ty.row_size(K).unwrap() * ROWS];
        quant::quantize_row(ty, &v, &mut data).unwrap();
        w.add_tensor(format!("w.{}", ty.name()), ty, &[K as u64, ROWS as u64], data).unwrap();
    }
    // Weights of one input (as q/k/v and gate/up), loaded together on the GPU.
    for ty in GROUPED {
        for (i, rows) in [37usize, 13, 21].into_iter().enumerate() {
            let v = rng.vec(rows * K);
            let mut data = vec![0u8; ty.row_size(K).unwrap() * rows];
            quant::quantize_row(ty, &v, &mut data).unwrap();
            w.add_tensor(format!("grp.{}.{i}", ty.name()), ty, &[K as u64, rows as u64], data).unwrap();
        }
    }
    // q and k of one type, v of another (Q4_K_M's more-bits layers): q and k together.
    for (i, (ty, rows)) in
        [(GgmlType::Q4_K, 37usize), (GgmlType::Q4_K, 13), (GgmlType::Q6_K, 21)].into_iter().enumerate()
    {
        let v = rng.vec(rows * K);
        let mut data = vec![0u8; ty.row_size(K).unwrap() * rows];
        quant::quantize_row(ty, &v, &mut data).unwrap();
        w.add_tensor(format!("mix.{i}"), ty, &[K as u64, rows as u64], data).unwrap();
    }
    // q/k/v of 4 query and 2 KV heads of 64: one type, or v of another (two runs).
    for (group, types) in
        [("qkv", [GgmlType::Q4_0; 3]), ("qkvm", [GgmlType::Q4_K, GgmlType::Q4_K, GgmlType::Q6_K])]
    {
        for (i, (ty, rows)) in types.into_iter().zip([256usize, 128, 128]).enumerate() {
            let v = rng.vec(rows * K);
            let mut data = vec![0u8; ty.row_size(K).unwrap() * rows];
            quant::quantize_row(ty, &v, &mut data).unwrap();
            w.add_tensor(format!("{group}.{i}"), ty, &[K as u64, rows as u64], data).unwrap();
        }
    }
    for (i, rows) in [256usize, 128, 128].into_iter().enumerate() {
        w.add_f32(format!("qkvb.{i}"), &[rows as u64], &rng.vec(rows)).unwrap();
    }
    // Long rows: the vec matmul gives each 64 or 128 invocations (kernels::vec_shape_for).
    for (ty, k) in LONG {
        let v = rng.vec(LONG_ROWS * k);
        let mut data = vec![0u8; ty.row_size(k).unwrap() * LONG_ROWS];
        quant::quantize_row(ty, &v, &mut data).unwrap();
        w.add_tensor(format!("long.{}", ty.name()), ty, &[k as u64, LONG_ROWS as u64], data).unwrap();
        w.add_f32(format!("xlong.{}", ty.name()), &[k as u64, 3], &rng.vec(3 * k)).unwrap();
    }
    w.add_f32("x", &[K as u64, 16], &rng.vec(16 * K)).unwrap();
    w.add_f32("y", &[K as u64, 16], &rng.vec(16 * K)).unwrap();
    let gate: Vec<f32> = rng.vec(16 * K).iter().map(|v| v * 12.0).collect();
    w.add_f32("gate", &[K as u64, 16], &gate).unwrap();
    w.add_f32("norm", &[K as u64], &rng.vec(K)).unwrap();
    w.add_f32("norm4k", &[4096], &rng.vec(4096)).unwrap();
    w.add_f32("headnorm", &[64], &rng.vec(64)).unwrap();
    w.add_f32("bias", &[K as u64], &rng.vec(K)).unwrap();
    w.add_f32("norm40", &[40], &rng.vec(40)).unwrap();
    w.add_f32("bias40", &[40], &rng.vec(40)).unwrap();
    // LFM2's convolution filters: 3 taps for each of 128 channels.
    w.add_f32("conv", &[3, 128], &rng.vec(3 * 128)).unwrap();
    // Biases of the grouped weights (q/k/v's).
    for (i, rows) in [37usize, 13, 21].into_iter().enumerate() {
        w.add_f32(format!("bias.{i}"), &[rows as u64], &rng.vec(rows)).unwrap();
    }
    // A mixture of experts: an F32 router over 8 experts (as llama-quantize leaves it), and
    // gate and up experts of 32 rows each.
    w.add_f32("router", &[K as u64, 8], &rng.vec(8 * K)).unwrap();
    for ty in EXPERT_TYPES {
        for part in ["gate", "up"] {
            let v = rng.vec(8 * 32 * K);
            let mut data = vec![0u8; ty.row_size(K).unwrap() * 8 * 32];
            quant::quantize_row(ty, &v, &mut data).unwrap();
            w.add_tensor(format!("exps.{part}.{}", ty.name()), ty, &[K as u64, 32, 8], data).unwrap();
        }
    }
    // Down experts of 40 rows reading GLU rows of K.
    for ty in DOWN_TYPES {
        let v = rng.vec(8 * 40 * K);
        let mut data = vec![0u8; ty.row_size(K).unwrap() * 8 * 40];
        quant::quantize_row(ty, &v, &mut data).unwrap();
        w.add_tensor(format!("exps.down.{}", ty.name()), ty, &[K as u64, 40, 8], data).unwrap();
    }
    // Gate and up experts of 256 rows (whole blocks for the GLU tail) and down experts
    // reading them.
    for (part, k, rows, ty) in [
        ("gate", K, 256, GgmlType::Q4_K),
        ("up", K, 256, GgmlType::Q4_K),
        ("down", 256, 40, GgmlType::Q8_0),
        ("down", 256, 40, GgmlType::Q4_K),
    ] {
        let v = rng.vec(8 * rows * k);
        let mut data = vec![0u8; ty.row_size(k).unwrap() * 8 * rows];
        quant::quantize_row(ty, &v, &mut data).unwrap();
        let dims = [k as u64, rows as u64, 8];
        w.add_tensor(format!("exps256.{part}.{}", ty.name()), ty, &dims, data).unwrap();
    }
    Arc::new(GgufFile::from_bytes(w.to_bytes()).unwrap())
}

/// The down experts' types: 32-value blocks, and wide units (Q4_0, Q4_K, Q6_K).
const DOWN_TYPES: [GgmlType; 4] = [GgmlType::Q8_0, GgmlType::Q4_0, GgmlType::Q4_K, GgmlType::Q6_K];

/// The expert tensors' types: activations quantized to Q8_0 blocks and to Q8_K superblocks.
const EXPERT_TYPES: [GgmlType; 2] = [GgmlType::Q8_0, GgmlType::Q4_K];

/// Both reduction paths on the vec matmul path.
fn vec_gpus() -> Vec<GpuBackend> {
    let mut v = gpus();
    for g in &mut v {
        g.set_matmul_path(MatmulPath::Vec);
    }
    v
}

/// The batch-invariant kernels (the tile matmul of adapters with cooperative matrices has
/// its own tests: gpu_coop.rs), with subgroups and without.
fn gpus() -> Vec<GpuBackend> {
    let mut fast = GpuBackend::with_fallback(AdapterPolicy::AnyGpu, false)
        .expect("no Vulkan adapter: install mesa-vulkan-drivers (lavapipe) to run the GPU tests");
    let mut slow = GpuBackend::with_fallback(AdapterPolicy::AnyGpu, true).unwrap();
    assert!(!slow.subgroups());
    fast.set_batch_invariant(true);
    slow.set_batch_invariant(true);
    eprintln!("GPU paths: {} | {}", fast.name(), slow.name());
    vec![fast, slow]
}

fn weight<B: Backend>(b: &B, g: &Arc<GgufFile>, name: &str) -> B::Weight {
    b.load_weight(g, g.tensor(name).unwrap()).unwrap()
}

/// The first `n` rows of an F32 table, as a device buffer of `cap` values.
fn input<B: Backend>(b: &B, g: &Arc<GgufFile>, name: &str, n: usize, cap: usize) -> B::Buf {
    let mut buf = b.alloc(cap.max(n * K)).unwrap();
    let ids: Vec<u32> = (0..n as u32).collect();
    b.embed(&weight(b, g, name), &ids, 1.0, &mut buf).unwrap();
    buf
}

fn read<B: Backend>(b: &B, buf: &B::Buf, n: usize) -> Vec<f32> {
    let mut out = vec![0.0; n];
    b.read(buf, &mut out);
    out
}

/// Asserts `a` and `b` are the same bits, value for value.
fn assert_same_bits(what: &str, a: &[f32], b: &[f32]) {
    assert_eq!(a.len(), b.len(), "{what}: lengths");
    let differ = |(x, y): &(&f32, &f32)| x.to_bits() != y.to_bits();
    let Some(first) = a.iter().zip(b).position(|p| differ(&p)) else { return };
    let bad = a.iter().zip(b).filter(differ).count();
    let worst = a.iter().zip(b).map(|(x, y)| (x - y).abs() / y.abs().max(1e-6)).fold(0.0f32, f32::max);
    panic!("{what}: {bad} of {} values differ, the first at {first}, by at most {worst:e} relative", a.len());
}

/// Types no kernel reads are widened to F16 at upload: small differences are expected.
fn widened(ty: GgmlType) -> bool {
    matches!(ty, GgmlType::Q5_1 | GgmlType::Q3_K)
}

fn compare(what: &str, gpu: &[f32], cpu: &[f32], max_nmse: f64) {
    let e = nmse(gpu, cpu);
    assert!(e.is_finite() && e <= max_nmse, "{what}: NMSE {e:e} > {max_nmse:e}");
}

/// The NMSE the CPU-arithmetic kernels reach on hardware adapters, whose f32 division,
/// sqrt and exp are not IEEE-rounded (NVIDIA's; measured on the H200: 3e-8 to 5e-6), where
/// software ones (lavapipe, CI) give the CPU's bits.
const HW_NMSE: f64 = 1e-5;

/// `d` (from `gpu`) against the CPU's `c`: within `max_nmse` (0: the same bits) on a
/// software adapter, within HW_NMSE on a hardware one.
fn against_cpu(gpu: &GpuBackend, what: &str, d: &[f32], c: &[f32], max_nmse: f64) {
    let what = format!("{what} on {}", gpu.name());
    if !gpu.is_software() {
        compare(&what, d, c, max_nmse.max(HW_NMSE));
    } else if max_nmse == 0.0 {
        assert_same_bits(&format!("{what}, against the CPU"), d, c);
    } else {
        compare(&what, d, c, max_nmse);
    }
}

fn matmul_out<B: Backend>(b: &B, g: &Arc<GgufFile>, ty: GgmlType, n: usize) -> Vec<f32> {
    let w = weight(b, g, &format!("w.{}", ty.name()));
    let x = input(b, g, "x", n, 16 * K);
    let mut out = b.alloc(16 * ROWS).unwrap();
    b.matmul(&w, &x, n, &mut out);
    read(b, &out, n * ROWS)
}

#[test]
fn matmul_every_type_matches_cpu_and_is_batch_invariant() {
    let g = model();
    let cpu = CpuBackend::new(2);
    // Every matmul kernel (MatmulPath) on both reduction paths.
    let mut paths = Vec::new();
    for path in [MatmulPath::Rows, MatmulPath::Exact, MatmulPath::Vec] {
        for mut g in gpus() {
            g.set_matmul_path(path);
            paths.push(g);
        }
    }
    for gpu in paths {
        let exact = gpu.matmul_path() != MatmulPath::Vec;
        for ty in TYPES {
            for n in [1, 3, 11] {
                let c = matmul_out(&cpu, &g, ty, n);
                let d = matmul_out(&gpu, &g, ty, n);
                // Vec regroups the f32 sums: last-bit differences only.
                let tol = if widened(ty) {
                    1e-4
                } else if exact {
                    1e-6
                } else {
                    1e-11
                };
                let what = format!("matmul {ty} x{n} {:?}", gpu.matmul_path());
                // Exact: the same integer sums and f32 steps as the CPU, bit-identical.
                against_cpu(&gpu, &what, &d, &c, if !widened(ty) && exact { 0.0 } else { tol });
                // Row 0 alone and inside a batch: bit-identical.
                let alone = matmul_out(&gpu, &g, ty, 1);
                assert_eq!(alone[..ROWS], d[..ROWS], "matmul {ty}: batch of {n} changed row 0");
            }
        }
    }
}

/// A norm with the residual add, then three weights reading its output in two runs (q and
/// k of one type together, v of another): the runs' outputs, the norm's and the residual.
fn norm_then_mix<B: Backend>(b: &B, g: &Arc<GgufFile>) -> Vec<f32> {
    let ts: Vec<_> = (0..3).map(|i| g.tensor(&format!("mix.{i}")).unwrap()).collect();
    let ws = b.load_weights(g, &ts).unwrap();
    let mut x = input(b, g, "x", 1, K);
    let y = input(b, g, "y", 1, K);
    let mut h = b.alloc(K).unwrap();
    b.add_rms_norm(&mut x, &y, 0.5, &weight(b, g, "norm"), 1e-6, 1, K, &mut h);
    let mut outs: Vec<B::Buf> = (0..3).map(|_| b.alloc(37).unwrap()).collect();
    let wr: Vec<&B::Weight> = ws.iter().collect();
    let mut or: Vec<&mut B::Buf> = outs.iter_mut().collect();
    b.matmul_many(&wr, &[], &h, 1, &mut or);
    let mut v: Vec<f32> = ws.iter().zip(&outs).flat_map(|(w, o)| read(b, o, b.weight_shape(w).0)).collect();
    v.extend(read(b, &h, K));
    v.extend(read(b, &x, K));
    v
}

#[test]
fn a_norm_made_in_a_prologue_serves_every_run_of_the_op() {
    // The first run of a decode step makes the norm in its prologue, its workgroup 0
    // storing the norm's output and the new residual; the second run reads that output:
    // the norm's dispatch saved, the same bits as without prologues.
    let g = model();
    for mut gpu in vec_gpus() {
        let what = format!("norm then two runs on {}", gpu.name());
        let saved = prologue_saves(&mut gpu, &what, |b| norm_then_mix(b, &g));
        assert_eq!(saved, 1, "{what}: {saved} dispatches saved");
    }
}

#[test]
fn long_rows_match_cpu_and_are_batch_invariant() {
    // The vec matmul's rows of many units take more invocations each (more loads in
    // flight): still within NMSE 1e-11 of the CPU, and a token's outputs the same bits
    // alone or in a batch.
    let g = model();
    let cpu = CpuBackend::new(2);
    for gpu in vec_gpus() {
        for (ty, k) in LONG {
            let run = |n: usize| {
                let w = weight(&gpu, &g, &format!("long.{}", ty.name()));
                let x = input(&gpu, &g, &format!("xlong.{}", ty.name()), n, n * k);
                let mut y = gpu.alloc(n * LONG_ROWS).unwrap();
                gpu.matmul(&w, &x, n, &mut y);
                read(&gpu, &y, n * LONG_ROWS)
            };
            let w = weight(&cpu, &g, &format!("long.{}", ty.name()));
            let x = input(&cpu, &g, &format!("xlong.{}", ty.name()), 3, 3 * k);
            let mut y = cpu.alloc(3 * LONG_ROWS).unwrap();
            cpu.matmul(&w, &x, 3, &mut y);
            let what = format!("long rows {ty} k {k} on {}", gpu.name());
            let batch = run(3);
            against_cpu(&gpu, &what, &batch, &read(&cpu, &y, 3 * LONG_ROWS), 1e-11);
            assert_same_bits(&what, &run(1), &batch[..LONG_ROWS]);
        }
    }
}

/// `matmul_many` over 2 or 3 weights loaded with `load_weights`: each output as `n` rows.
fn matmul_many_out<B: Backend>(
    b: &B,
    g: &Arc<GgufFile>,
    group: &str,
    count: usize,
    n: usize,
    bias: bool,
) -> Vec<f32> {
    let names: Vec<String> = (0..count).map(|i| format!("{group}.{i}")).collect();
    let ts: Vec<_> = names.iter().map(|nm| g.tensor(nm).unwrap()).collect();
    let ws = b.load_weights(g, &ts).unwrap();
    let x = input(b, g, "x", n, 16 * K);
    let mut outs: Vec<B::Buf> = (0..count).map(|_| b.alloc(16 * 37).unwrap()).collect();
    let wr: Vec<&B::Weight> = ws.iter().collect();
    let mut or: Vec<&mut B::Buf> = outs.iter_mut().collect();
    let bs: Vec<B::Weight> =
        (0..count).filter(|_| bias).map(|i| weight(b, g, &format!("bias.{i}"))).collect();
    let br: Vec<Option<&B::Weight>> = bs.iter().map(Some).collect();
    b.matmul_many(&wr, &br, &x, n, &mut or);
    ws.iter().zip(&outs).flat_map(|(w, o)| read(b, o, n * b.weight_shape(w).0)).collect()
}

#[test]
fn weights_loaded_together_match_the_cpu_in_one_kernel() {
    let g = model();
    let cpu = CpuBackend::new(2);
    for path in [MatmulPath::Rows, MatmulPath::Exact, MatmulPath::Vec] {
        for mut gpu in gpus() {
            gpu.set_matmul_path(path);
            let groups =
                GROUPED.iter().map(|ty| (format!("grp.{}", ty.name()), 1)).chain([("mix".into(), 2)]);
            for (group, kernels) in groups {
                for (count, n, bias) in
                    [(3, 1, false), (2, 5, false), (3, 11, false), (3, 1, true), (3, 11, true)]
                {
                    let before = gpu.counts().get().1;
                    let d = matmul_many_out(&gpu, &g, &group, count, n, bias);
                    let c = matmul_many_out(&cpu, &g, &group, count, n, bias);
                    let what = format!("matmul_many {group} x{count} n={n} bias {bias} {path:?}");
                    against_cpu(&gpu, &what, &d, &c, if path == MatmulPath::Vec { 1e-11 } else { 0.0 });
                    // Input upload (embed), quantize, one matmul per run of one type
                    // (the mixed group's third weight is its own run, but on the vec
                    // path, whose kernel takes a last weight of another K format), biases
                    // added in it (batch invariance: no decode prologue quantizes for them,
                    // decode_matmul_prologues_match_the_separate_kernels tests those).
                    let dispatches = gpu.counts().get().1 - before;
                    let runs = if count == 3 && path != MatmulPath::Vec { kernels } else { 1 };
                    let expected = 2 + runs;
                    assert_eq!(dispatches, expected, "{what}: {dispatches} dispatches");
                }
            }
        }
    }
}

/// glu then a matmul of its output (the GPU fuses the glu into the matmul's quantize
/// unless `split` reads the glu's output first): the matmul's output, then the gate rows.
fn glu_matmul_out<B: Backend>(
    b: &B,
    g: &Arc<GgufFile>,
    ty: GgmlType,
    act: Activation,
    split: bool,
    n: usize,
) -> Vec<f32> {
    let w = weight(b, g, &format!("w.{}", ty.name()));
    let mut gate = input(b, g, "gate", n, 16 * K);
    let up = input(b, g, "y", n, 16 * K);
    let mut out = b.alloc(16 * ROWS).unwrap();
    b.glu(&mut gate, &up, act, n * K);
    if split {
        read(b, &gate, 1);
    }
    b.matmul(&w, &gate, n, &mut out);
    let mut v = read(b, &out, n * ROWS);
    v.extend(read(b, &gate, n * K));
    v
}

#[test]
fn glu_fused_into_the_next_matmul_matches_cpu() {
    let g = model();
    let cpu = CpuBackend::new(2);
    for mut gpu in gpus() {
        gpu.set_matmul_path(MatmulPath::Exact);
        for ty in [GgmlType::Q8_0, GgmlType::Q4_1, GgmlType::Q4_K, GgmlType::F16] {
            for act in [Activation::Silu, Activation::GeluTanh] {
                let what = format!("glu {act:?} then matmul {ty} on {}", gpu.name());
                let before = gpu.counts().get().1;
                let fused = glu_matmul_out(&gpu, &g, ty, act, false, 3);
                // Two input uploads, the fused quantize, the matmul.
                let dispatches = gpu.counts().get().1 - before;
                assert_eq!(dispatches, 4, "{what}: {dispatches} dispatches");
                let split = glu_matmul_out(&gpu, &g, ty, act, true, 3);
                assert_same_bits(&format!("{what}, against the unfused kernels"), &fused, &split);
                // GELU's tanh differs from the CPU's table in the last bits (as the glu op).
                let c = glu_matmul_out(&cpu, &g, ty, act, false, 3);
                against_cpu(&gpu, &what, &fused, &c, if act == Activation::Silu { 0.0 } else { 1e-10 });
            }
        }
    }
}

/// A norm (with the residual add first when `add`), then a matmul of its output; `split`
/// reads the norm's output first so the two run unfused. Returns the matmul's output, the
/// norm's output and the residual.
fn norm_matmul_out<B: Backend>(
    b: &B,
    g: &Arc<GgufFile>,
    ty: GgmlType,
    add: bool,
    split: bool,
    n: usize,
) -> Vec<f32> {
    let w = weight(b, g, &format!("w.{}", ty.name()));
    let mut x = input(b, g, "x", n, K);
    let y = input(b, g, "y", n, K);
    let mut h = b.alloc(n * K).unwrap();
    let mut out = b.alloc(n * ROWS).unwrap();
    let norm = weight(b, g, "norm");
    if add {
        b.add_rms_norm(&mut x, &y, 0.5, &norm, 1e-6, n, K, &mut h);
    } else {
        b.rms_norm(&x, &norm, 1e-6, n, K, &mut h);
    }
    if split {
        read(b, &h, 1);
    }
    b.matmul(&w, &h, n, &mut out);
    let mut v = read(b, &out, n * ROWS);
    v.extend(read(b, &h, n * K));
    v.extend(read(b, &x, n * K));
    v
}

#[test]
fn norm_fused_into_the_next_matmul_matches_cpu() {
    let g = model();
    let cpu = CpuBackend::new(2);
    for mut gpu in gpus() {
        gpu.set_matmul_path(MatmulPath::Exact);
        for ty in [GgmlType::Q8_0, GgmlType::Q4_1, GgmlType::Q4_K, GgmlType::F16] {
            for add in [false, true] {
                let what = format!("norm (add {add}) then matmul {ty} on {}", gpu.name());
                let before = gpu.counts().get().1;
                let fused = norm_matmul_out(&gpu, &g, ty, add, false, 3);
                // Two input uploads, the norm with its quantize, the matmul.
                let dispatches = gpu.counts().get().1 - before;
                assert_eq!(dispatches, 4, "{what}: {dispatches} dispatches");
                let split = norm_matmul_out(&gpu, &g, ty, add, true, 3);
                assert_same_bits(&format!("{what}, against the unfused kernels"), &fused, &split);
                against_cpu(&gpu, &what, &fused, &norm_matmul_out(&cpu, &g, ty, add, false, 3), 0.0);
            }
        }
    }
}

/// A matmul of `x` as it is (an f32 input, no op held back before it).
fn plain_matmul_out<B: Backend>(b: &B, g: &Arc<GgufFile>, ty: GgmlType, n: usize) -> Vec<f32> {
    let w = weight(b, g, &format!("w.{}", ty.name()));
    let x = input(b, g, "x", n, K);
    let mut out = b.alloc(n * ROWS).unwrap();
    b.matmul(&w, &x, n, &mut out);
    read(b, &out, n * ROWS)
}

/// `run` with the decode matmuls' prologues allowed, then with none: the same bits; returns
/// the dispatches the prologues saved. Prologues are a default-mode feature (batch
/// invariance leaves them off), so both runs are outside it.
fn prologue_saves(gpu: &mut GpuBackend, what: &str, run: impl Fn(&GpuBackend) -> Vec<f32>) -> u64 {
    let invariant = gpu.batch_invariant();
    gpu.set_batch_invariant(false);
    gpu.set_prologue_bytes(usize::MAX);
    let d0 = gpu.counts().get().1;
    let fused = run(gpu);
    let d1 = gpu.counts().get().1;
    gpu.set_prologue_bytes(0);
    let split = run(gpu);
    assert_same_bits(what, &fused, &split);
    gpu.set_batch_invariant(invariant);
    (gpu.counts().get().1 - d1) - (d1 - d0)
}

/// An op then a matmul of its output on a backend: the outputs read back.
type OpRun = Box<dyn Fn(&GpuBackend) -> Vec<f32>>;

#[test]
fn decode_matmul_prologues_match_the_separate_kernels() {
    // A vec matmul of one token makes its quantized activations itself (the norm, the
    // GLU, or the quantize of an f32 input): the same bits as the kernels run before it,
    // one dispatch fewer, and the op's own outputs (norm, residual, GLU) stored all the
    // same.
    let g = model();
    for mut gpu in vec_gpus() {
        for ty in [GgmlType::Q8_0, GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q4_K, GgmlType::Q6_K] {
            let mut runs: Vec<(String, OpRun)> = Vec::new();
            for add in [false, true] {
                let g = g.clone();
                runs.push((
                    format!("norm (add {add})"),
                    Box::new(move |b| norm_matmul_out(b, &g, ty, add, false, 1)),
                ));
            }
            for act in [Activation::Silu, Activation::GeluTanh] {
                let g = g.clone();
                runs.push((
                    format!("glu {act:?}"),
                    Box::new(move |b| glu_matmul_out(b, &g, ty, act, false, 1)),
                ));
            }
            let g2 = g.clone();
            runs.push(("f32 input".into(), Box::new(move |b| plain_matmul_out(b, &g2, ty, 1))));
            for (what, run) in &runs {
                let what = format!("{what} then matmul {ty} on {}", gpu.name());
                let saved = prologue_saves(&mut gpu, &what, run);
                assert_eq!(saved, 1, "{what}: {saved} dispatches saved");
            }
        }
    }
}

#[test]
fn weights_over_the_binding_limit_are_split_by_rows() {
    let g = model();
    let cpu = CpuBackend::new(2);
    for mut gpu in gpus() {
        gpu.set_max_binding(4096);
        for ty in [GgmlType::Q4_0, GgmlType::Q6_K, GgmlType::F32] {
            let c = matmul_out(&cpu, &g, ty, 3);
            let d = matmul_out(&gpu, &g, ty, 3);
            against_cpu(&gpu, &format!("split matmul {ty}"), &d, &c, 1e-6);
            let ids = [36u32, 0, 17, 5];
            let emb = |b: &dyn Fn(&mut Vec<f32>)| {
                let mut v = vec![0.0; 4 * K];
                b(&mut v);
                v
            };
            let c = emb(&|v| {
                let mut o = cpu.alloc(4 * K).unwrap();
                cpu.embed(&weight(&cpu, &g, &format!("w.{}", ty.name())), &ids, 0.5, &mut o).unwrap();
                cpu.read(&o, v);
            });
            let d = emb(&|v| {
                let mut o = gpu.alloc(4 * K).unwrap();
                gpu.embed(&weight(&gpu, &g, &format!("w.{}", ty.name())), &ids, 0.5, &mut o).unwrap();
                gpu.read(&o, v);
            });
            against_cpu(&gpu, &format!("split embed {ty}"), &d, &c, 0.0);
        }
    }
}

#[test]
fn embed_every_type_is_exact_and_rejects_bad_ids() {
    let g = model();
    let cpu = CpuBackend::new(1);
    let ids = [3u32, 0, 36, 3];
    for gpu in gpus() {
        for ty in TYPES {
            let name = format!("w.{}", ty.name());
            let run = |b: &dyn Fn(&mut Vec<f32>)| {
                let mut v = vec![0.0; 4 * K];
                b(&mut v);
                v
            };
            let c = run(&|v| {
                let mut o = cpu.alloc(4 * K).unwrap();
                cpu.embed(&weight(&cpu, &g, &name), &ids, 1.0, &mut o).unwrap();
                cpu.read(&o, v);
            });
            let d = run(&|v| {
                let mut o = gpu.alloc(4 * K).unwrap();
                gpu.embed(&weight(&gpu, &g, &name), &ids, 1.0, &mut o).unwrap();
                gpu.read(&o, v);
            });
            against_cpu(&gpu, &format!("embed {ty}"), &d, &c, if widened(ty) { 1e-6 } else { 0.0 });
        }
        let mut o = gpu.alloc(K).unwrap();
        assert!(gpu.embed(&weight(&gpu, &g, "w.Q4_0"), &[ROWS as u32], 1.0, &mut o).is_err());
    }
}

/// Element-wise ops and norms, chained, on `n` rows.
fn elementwise<B: Backend>(b: &B, g: &Arc<GgufFile>, n: usize) -> Vec<Vec<f32>> {
    let len = n * K;
    let mut outs = Vec::new();
    let x = input(b, g, "x", n, len);
    let y = input(b, g, "y", n, len);
    let mut h = b.alloc(len).unwrap();
    b.rms_norm(&x, &weight(b, g, "norm"), 1e-6, n, K, &mut h);
    outs.push(read(b, &h, len));
    // Per-head norm: rows of 64 with a 64-value weight.
    b.rms_norm(&x, &weight(b, g, "headnorm"), 1e-5, n * K / 64, 64, &mut h);
    outs.push(read(b, &h, len));
    b.add_bias(&mut h, &weight(b, g, "bias"), n);
    outs.push(read(b, &h, len));
    b.add(&mut h, &y, 1.0, len);
    outs.push(read(b, &h, len));
    b.add(&mut h, &y, 0.25, len - 7);
    outs.push(read(b, &h, len));
    b.scale(&mut h, -1.5, len);
    outs.push(read(b, &h, len));
    b.softcap(&mut h, 3.0, len);
    outs.push(read(b, &h, len));
    for act in [Activation::Silu, Activation::GeluTanh] {
        let mut gate = input(b, g, "gate", n, len);
        b.glu(&mut gate, &y, act, len);
        outs.push(read(b, &gate, len));
    }
    let mut o = b.alloc(3 * K).unwrap();
    b.gather_rows(&x, &[(n - 1) as u32, 0, (n / 2) as u32], K, &mut o);
    outs.push(read(b, &o, 3 * K));
    // The fused residual add + norm: both the updated residual and the norm.
    for scale in [1.0, 0.25] {
        let mut r = input(b, g, "x", n, len);
        b.add_rms_norm(&mut r, &y, scale, &weight(b, g, "norm"), 1e-6, n, K, &mut h);
        outs.push(read(b, &r, len));
        outs.push(read(b, &h, len));
    }
    outs
}

#[test]
fn norms_and_elementwise_ops_match_cpu() {
    let g = model();
    let cpu = CpuBackend::new(2);
    let c = elementwise(&cpu, &g, 5);
    let names = [
        "rms_norm",
        "head rms_norm",
        "add_bias",
        "add",
        "add scaled",
        "scale",
        "softcap",
        "silu",
        "gelu",
        "gather",
        "add_rms_norm residual",
        "add_rms_norm",
        "add_rms_norm residual scaled",
        "add_rms_norm scaled",
    ];
    assert_eq!(c.len(), names.len());
    for gpu in gpus() {
        let d = elementwise(&gpu, &g, 5);
        for ((c, d), name) in c.iter().zip(&d).zip(names) {
            against_cpu(&gpu, name, d, c, if name.starts_with("add_rms_norm") { 0.0 } else { 1e-10 });
        }
    }
}

/// The fused residual add + norm on rows of 4096 (a 7B model's width): residual, norm.
fn long_add_rms_norm<B: Backend>(b: &B, g: &Arc<GgufFile>) -> Vec<f32> {
    let len = 16 * K;
    let mut x = input(b, g, "x", 16, len);
    let y = input(b, g, "y", 16, len);
    let mut h = b.alloc(len).unwrap();
    b.add_rms_norm(&mut x, &y, 0.5, &weight(b, g, "norm4k"), 1e-5, len / 4096, 4096, &mut h);
    let mut out = read(b, &x, len);
    out.extend(read(b, &h, len));
    out
}

#[test]
fn add_rms_norm_of_long_rows_is_bit_identical() {
    let g = model();
    let c = long_add_rms_norm(&CpuBackend::new(2), &g);
    for gpu in gpus() {
        let d = long_add_rms_norm(&gpu, &g);
        against_cpu(&gpu, "add_rms_norm 2x4096", &d, &c, 0.0);
    }
}

fn rope_params(neox: bool, ff: bool, yarn: bool) -> RopeParams {
    RopeParams {
        n_rot: 48,
        neox,
        freq_base: 10000.0,
        freq_scale: if yarn { 0.25 } else { 1.0 },
        ext_factor: if yarn { 1.0 } else { 0.0 },
        attn_factor: 1.0,
        beta_fast: 32.0,
        beta_slow: 1.0,
        n_ctx_orig: 4096,
        freq_factors: ff.then(|| Arc::new((0..24).map(|i| 1.0 + i as f32 * 0.3).collect())),
    }
}

fn rope_out<B: Backend>(b: &B, g: &Arc<GgufFile>, r: &RopeParams) -> Vec<f32> {
    // 4 tokens of 8 heads of 64.
    let mut x = input(b, g, "x", 4, 4 * K);
    b.rope(&mut x, &[0, 7, 300, 4095], 8, 64, r);
    read(b, &x, 4 * K)
}

#[test]
fn rope_variants_match_cpu() {
    let g = model();
    let cpu = CpuBackend::new(1);
    for gpu in gpus() {
        for (neox, ff, yarn) in
            [(false, false, false), (true, false, false), (true, true, false), (false, false, true)]
        {
            let r = rope_params(neox, ff, yarn);
            let what = format!("rope neox={neox} ff={ff} yarn={yarn}");
            against_cpu(&gpu, &what, &rope_out(&gpu, &g, &r), &rope_out(&cpu, &g, &r), 1e-9);
        }
    }
}

/// The fused pre-attention step (RoPE on q and k, k and v to their slots): q after it,
/// and the two caches as f32 (4 tokens of 8 query heads and 2 KV heads of 64).
fn rope_kv_store_out<B: Backend>(
    b: &B,
    g: &Arc<GgufFile>,
    r: &RopeParams,
    read_kv: impl Fn(&B::Kv, usize, Option<usize>) -> Vec<half::f16>,
) -> Vec<f32> {
    let kv_dim = 2 * 64;
    let mut q = input(b, g, "x", 4, 4 * K);
    let mut k = input(b, g, "y", 1, K);
    let v = input(b, g, "gate", 1, K);
    let (mut kc, mut vc) = (b.alloc_kv(64 * kv_dim).unwrap(), b.alloc_kv(64 * kv_dim).unwrap());
    b.rope_kv_store(&mut q, &mut k, &v, &mut kc, &mut vc, &[0, 7, 300, 4095], &[5, 0, 40, 33], 8, 2, 64, r);
    let mut out = read(b, &q, 4 * K);
    for (c, k_dim) in [(&kc, Some(kv_dim)), (&vc, None)] {
        out.extend(read_kv(c, 64 * kv_dim, k_dim).iter().map(|h| h.to_f32()));
    }
    out
}

#[test]
fn fused_rope_and_kv_store_match_cpu() {
    let g = model();
    let cpu = CpuBackend::new(1);
    for gpu in gpus() {
        for (neox, n_rot) in [(false, 48), (true, 48), (true, 64), (false, 64)] {
            let r = RopeParams { n_rot, ..rope_params(neox, false, false) };
            // The CPU's K cache in slot rows (it is tiled, see `k_index`).
            let rows =
                |kv: &KvBuf, n, k_dim: Option<usize>| k_dim.map_or(kv[..n].to_vec(), |d| k_rows(&kv[..n], d));
            let c = rope_kv_store_out(&cpu, &g, &r, rows);
            let d = rope_kv_store_out(&gpu, &g, &r, |kv, n, _| gpu.read_kv(kv, n));
            against_cpu(&gpu, &format!("rope_kv_store neox {neox} n_rot {n_rot}"), &d, &c, 0.0);
        }
    }
}

/// The same with each head of q and k RMSNormed first (`norm_rope_kv_store`: Qwen3's q and
/// k norms), and the dispatches it took.
fn norm_rope_kv_store_out<B: Backend>(
    b: &B,
    g: &Arc<GgufFile>,
    r: &RopeParams,
    read_kv: impl Fn(&B::Kv, usize, Option<usize>) -> Vec<half::f16>,
    dispatches: impl Fn() -> u64,
) -> (Vec<f32>, u64) {
    let kv_dim = 2 * 64;
    let mut q = input(b, g, "x", 4, 4 * K);
    let mut k = input(b, g, "y", 1, K);
    let v = input(b, g, "gate", 1, K);
    let (mut q_tmp, mut k_tmp) = (b.alloc(4 * K).unwrap(), b.alloc(K).unwrap());
    // (One head-wide weight for both.)
    let qn = weight(b, g, "headnorm");
    let (mut kc, mut vc) = (b.alloc_kv(64 * kv_dim).unwrap(), b.alloc_kv(64 * kv_dim).unwrap());
    let d0 = dispatches();
    b.norm_rope_kv_store(
        &mut q,
        &mut k,
        &v,
        (&mut q_tmp, &mut k_tmp),
        (&qn, &qn, 1e-6),
        &mut kc,
        &mut vc,
        &[0, 7, 300, 4095],
        &[5, 0, 40, 33],
        8,
        2,
        64,
        r,
    );
    let mut out = read(b, &q, 4 * K);
    let n = dispatches() - d0;
    for (c, k_dim) in [(&kc, Some(kv_dim)), (&vc, None)] {
        out.extend(read_kv(c, 64 * kv_dim, k_dim).iter().map(|h| h.to_f32()));
    }
    (out, n)
}

/// Qwen3's per-head q and k norms in the RoPE store's kernel (one dispatch for the three
/// ops): the CPU's bits (the norms, then the RoPE store).
#[test]
fn per_head_norms_fused_into_the_rope_store_match_cpu() {
    let g = model();
    let cpu = CpuBackend::new(1);
    for gpu in gpus() {
        for (neox, n_rot) in [(false, 48), (true, 48), (true, 64), (false, 64)] {
            let r = RopeParams { n_rot, ..rope_params(neox, false, false) };
            let rows =
                |kv: &KvBuf, n, k_dim: Option<usize>| k_dim.map_or(kv[..n].to_vec(), |d| k_rows(&kv[..n], d));
            let (c, _) = norm_rope_kv_store_out(&cpu, &g, &r, rows, || 0);
            let (d, n) =
                norm_rope_kv_store_out(&gpu, &g, &r, |kv, n, _| gpu.read_kv(kv, n), || gpu.counts().get().1);
            let what = format!("norm_rope_kv_store neox {neox} n_rot {n_rot}");
            against_cpu(&gpu, &what, &d, &c, 0.0);
            assert_eq!(n, 1, "{what}: {n} dispatches");
        }
    }
}

/// A mixture of experts' weighted sum (`rows` tokens of `k` slots) then the residual add and
/// norm reading it: the norm's output, the new residual and the sum; and the dispatches.
fn moe_sum_add_norm_out<B: Backend>(
    b: &B,
    g: &Arc<GgufFile>,
    (rows, k): (usize, usize),
    scale: f32,
    dispatches: impl Fn() -> u64,
) -> (Vec<f32>, u64) {
    let y = input(b, g, "x", rows * k, rows * k * K);
    // The routing weights: the first values of a row.
    let w = input(b, g, "y", 1, K);
    let mut x = input(b, g, "gate", rows, rows * K);
    let (mut sum, mut h) = (b.alloc(rows * K).unwrap(), b.alloc(rows * K).unwrap());
    let d0 = dispatches();
    b.moe_sum(&y, &w, rows, k, K, &mut sum);
    b.add_rms_norm(&mut x, &sum, scale, &weight(b, g, "norm"), 1e-6, rows, K, &mut h);
    let mut out = read(b, &h, rows * K);
    let n = dispatches() - d0;
    out.extend(read(b, &x, rows * K));
    out.extend(read(b, &sum, rows * K));
    (out, n)
}

/// The weighted sum then the add and norm that read it (two dispatches): the CPU's bits, for
/// 3, 8 and 11 slots a token.
#[test]
fn moe_sum_then_the_next_add_and_norm_match_cpu() {
    let g = model();
    let cpu = CpuBackend::new(1);
    for gpu in gpus() {
        for (shape, scale) in [((2, 3), 1.0), ((2, 3), 0.5), ((2, 8), 1.0), ((1, 11), 0.5)] {
            let (c, _) = moe_sum_add_norm_out(&cpu, &g, shape, scale, || 0);
            let (d, n) = moe_sum_add_norm_out(&gpu, &g, shape, scale, || gpu.counts().get().1);
            let what = format!("moe_sum of {shape:?} then add_rms_norm, scale {scale}");
            against_cpu(&gpu, &what, &d, &c, 0.0);
            assert_eq!(n, 2, "{what}: {n} dispatches");
        }
    }
}

/// A mixture of experts' routing `r` (8 experts, 3 a token) of `n` tokens: the residual add
/// and norm, the router and the gate and up experts of `ty` reading the norm's output,
/// through `moe_router` (`fused`) or the router's matmul and `moe_route` as two ops: the
/// logits, ids, weights, gate and up outputs, the norm's output and the new residual.
fn router_then_experts<B: Backend>(
    b: &B,
    g: &Arc<GgufFile>,
    r: &Routing,
    ty: GgmlType,
    n: usize,
    fused: bool,
) -> Vec<f32> {
    let router = weight(b, g, "router");
    let ts: Vec<_> =
        ["gate", "up"].iter().map(|p| g.tensor(&format!("exps.{p}.{}", ty.name())).unwrap()).collect();
    let ex = b.load_experts_together(g, &ts, 8).unwrap();
    let mut x = input(b, g, "x", n, n * K);
    let y = input(b, g, "y", n, n * K);
    let mut h = b.alloc(n * K).unwrap();
    b.add_rms_norm(&mut x, &y, 0.5, &weight(b, g, "norm"), 1e-6, n, K, &mut h);
    let (mut logits, mut ids, mut wts) =
        (b.alloc(n * 8).unwrap(), b.alloc(n * 3).unwrap(), b.alloc(n * 3).unwrap());
    if fused {
        b.moe_router(&router, &ex[0], &h, n, r, None, (&mut logits, &mut ids, &mut wts));
    } else {
        b.matmul(&router, &h, n, &mut logits);
        b.moe_route(&logits, n, r, None, &mut ids, &mut wts);
    }
    let (mut go, mut uo) = (b.alloc(n * 3 * 32).unwrap(), b.alloc(n * 3 * 32).unwrap());
    let input = ExpertInput { x: &h, per_slot: false, ids: &ids, rows: n, k: 3 };
    b.matmul_id(&[&ex[0], &ex[1]], input, &mut [&mut go, &mut uo]);
    let mut v = read(b, &logits, n * 8);
    v.extend(read(b, &ids, n * 3));
    v.extend(read(b, &wts, n * 3));
    v.extend(read(b, &go, n * 3 * 32));
    v.extend(read(b, &uo, n * 3 * 32));
    v.extend(read(b, &h, n * K));
    v.extend(read(b, &x, n * K));
    v
}

/// `moe_router`: the norm before a mixture of experts' f32 router also quantizes its output
/// for the experts, and on the vec path the router matmul routes its tokens as its last
/// workgroup finishes (route.wgsl in the matmul): one dispatch fewer (the expert matmul's
/// quantize), two on vec (and the route's), than the router's matmul and `moe_route` as two
/// ops, the same bits, and the CPU's on the exact paths; softmax and sigmoid scores,
/// normalized and scaled, one token and several (the vec matmul's token groups).
#[test]
fn the_router_takes_the_experts_quantize_and_the_route() {
    let g = model();
    let cpu = CpuBackend::new(2);
    let mut paths = Vec::new();
    for path in [MatmulPath::Rows, MatmulPath::Exact, MatmulPath::Vec] {
        for mut gpu in gpus() {
            gpu.set_matmul_path(path);
            paths.push(gpu);
        }
    }
    let routings = [
        Routing { n_expert: 8, k: 3, gating: Gating::Softmax, norm: true, scale: 1.0 },
        Routing { n_expert: 8, k: 3, gating: Gating::Sigmoid, norm: false, scale: 2.5 },
    ];
    for gpu in paths {
        let vec = gpu.matmul_path() == MatmulPath::Vec;
        for (r, ty) in routings.iter().zip(EXPERT_TYPES) {
            for n in [1, 3, 11] {
                let what = format!("router {:?} then {ty} experts x{n} {:?}", r.gating, gpu.matmul_path());
                let d0 = gpu.counts().get().1;
                let split = router_then_experts(&gpu, &g, r, ty, n, false);
                let d1 = gpu.counts().get().1;
                let fused = router_then_experts(&gpu, &g, r, ty, n, true);
                let d2 = gpu.counts().get().1;
                assert_same_bits(&what, &fused, &split);
                let saved = (d1 - d0) - (d2 - d1);
                assert_eq!(saved, if vec { 2 } else { 1 }, "{what}: dispatches {} then {}", d1 - d0, d2 - d1);
                let c = router_then_experts(&cpu, &g, r, ty, n, true);
                against_cpu(&gpu, &what, &fused, &c, if vec { 1e-11 } else { 0.0 });
            }
        }
    }
}

/// A decode step's residual add and norm before an f32 router runs in the router's prologue
/// (`Input::ExpertNorm`), its first workgroup quantizing the norm for the experts and
/// storing the norm and the new residual: one dispatch fewer than the norm kernel with the
/// experts' quantize, the same bits (logits, ids, weights, gate and up experts, norm,
/// residual), softmax and sigmoid scores, Q8_0 and Q8_K activations.
#[test]
fn the_ffn_norm_in_the_routers_prologue_is_the_norm_kernels() {
    let g = model();
    let routings = [
        Routing { n_expert: 8, k: 3, gating: Gating::Softmax, norm: true, scale: 1.0 },
        Routing { n_expert: 8, k: 3, gating: Gating::Sigmoid, norm: false, scale: 2.5 },
    ];
    for mut gpu in vec_gpus() {
        for (r, ty) in routings.iter().zip(EXPERT_TYPES) {
            let what =
                format!("norm in the router's prologue {:?} then {ty} experts on {}", r.gating, gpu.name());
            let saved = prologue_saves(&mut gpu, &what, |b| router_then_experts(b, &g, r, ty, 1, true));
            assert_eq!(saved, 1, "{what}: {saved} dispatches saved");
        }
    }
}

/// `n` tokens' routing `r` of the logits in the "x" table's values, with the selection
/// `bias` (or none): the ids, then the weights.
fn route_out<B: Backend>(b: &B, g: &Arc<GgufFile>, r: &Routing, bias: Option<&[f32]>, n: usize) -> Vec<f32> {
    let logits = input(b, g, "x", (n * r.n_expert).div_ceil(K), n * r.n_expert);
    route_of(b, &logits, n, r, bias)
}

/// `moe_route` of `rows` tokens' logits in `logits`: the ids, then the weights.
fn route_of<B: Backend>(b: &B, logits: &B::Buf, rows: usize, r: &Routing, bias: Option<&[f32]>) -> Vec<f32> {
    let (mut ids, mut wts) = (b.alloc(rows * r.k).unwrap(), b.alloc(rows * r.k).unwrap());
    b.moe_route(logits, rows, r, bias, &mut ids, &mut wts);
    let mut v = read(b, &ids, rows * r.k);
    v.extend(read(b, &wts, rows * r.k));
    v
}

/// `moe_route` with a selection bias (LFM2-MoE's `exp_probs_b`): the CPU's ids and weights bit for bit on
/// a software adapter, with biases of either sign that change the choice of experts; a
/// zero bias routes as `moe_route`.
#[test]
fn the_selection_bias_routes_as_on_the_cpu() {
    let g = model();
    let cpu = CpuBackend::new(2);
    let routings = [
        Routing { n_expert: 8, k: 3, gating: Gating::Sigmoid, norm: false, scale: 2.5 },
        Routing { n_expert: 64, k: 6, gating: Gating::Sigmoid, norm: true, scale: 1.0 },
    ];
    for gpu in gpus() {
        for r in &routings {
            let bias: Vec<f32> = (0..r.n_expert).map(|e| ((e * 37 % 11) as f32 - 5.0) * 0.1).collect();
            let zero = vec![0.0; r.n_expert];
            for n in [1, 3, 11] {
                let what = format!("biased route of {} experts x{n}", r.n_expert);
                let c = route_out(&cpu, &g, r, Some(&bias), n);
                assert_ne!(c, route_out(&cpu, &g, r, None, n), "{what}: the bias changes nothing");
                against_cpu(&gpu, &what, &route_out(&gpu, &g, r, Some(&bias), n), &c, 0.0);
                let unbiased = route_out(&gpu, &g, r, None, n);
                assert_same_bits(
                    &format!("{what}, zero bias"),
                    &route_out(&gpu, &g, r, Some(&zero), n),
                    &unbiased,
                );
            }
        }
    }
}

/// `moe_route` of host logits: the ids, then the weights.
fn route_host<B: Backend>(b: &B, logits: &[f32], rows: usize, r: &Routing, bias: Option<&[f32]>) -> Vec<f32> {
    let mut l = b.alloc(logits.len()).unwrap();
    b.write_rows(&mut l, logits);
    route_of(b, &l, rows, r, bias)
}

/// The router's top-k on ties, as the CPU's `moe_route` (a stable sort: the lowest index
/// first among equal scores): 8 of 128 experts (Qwen3-30B-A3B's) and of 256, softmax and
/// sigmoid, rows of five distinct logits, of one, and (sigmoid) with infinities, without
/// and with a bias that ties others.
#[test]
fn the_route_breaks_ties_by_the_lowest_index() {
    let cpu = CpuBackend::new(2);
    for gpu in gpus() {
        for (n_expert, gating) in [(128, Gating::Softmax), (256, Gating::Sigmoid)] {
            let r = Routing { n_expert, k: 8, gating, norm: true, scale: 1.0 };
            let rows = 3;
            let mut logits: Vec<f32> = (0..rows * n_expert).map(|i| ((i * 7) % 5) as f32 * 0.25).collect();
            logits[n_expert..2 * n_expert].fill(0.5);
            if gating == Gating::Sigmoid {
                logits[2 * n_expert + 3] = f32::INFINITY;
                logits[2 * n_expert + 9] = f32::INFINITY;
                logits[2 * n_expert + 4] = f32::NEG_INFINITY;
            }
            let bias: Vec<f32> = (0..n_expert).map(|e| if e % 3 == 0 { 0.25 } else { 0.0 }).collect();
            for bias in [None, Some(&bias[..])] {
                let what = format!("route of {n_expert} {gating:?} ties, bias {}", bias.is_some());
                let c = route_host(&cpu, &logits, rows, &r, bias);
                if bias.is_none() {
                    // The first row's highest logit (1.0) is every fifth expert's from 2.
                    let top: Vec<f32> = (0..8).map(|j| (2 + 5 * j) as f32).collect();
                    assert_eq!(c[..8], top[..], "{what}: the CPU's picks");
                }
                against_cpu(&gpu, &what, &route_host(&gpu, &logits, rows, &r, bias), &c, 0.0);
            }
        }
    }
}

/// A mixture of experts' GLU over `n` tokens' 3 slots (gate rows from the gate table, up
/// from y; ids routed from the router's logits of x), then the down experts of `ty`
/// reading each slot's row: the down output, then the GLU's.
fn glu_then_down<B: Backend>(b: &B, g: &Arc<GgufFile>, ty: GgmlType, act: Activation, n: usize) -> Vec<f32> {
    let r = Routing { n_expert: 8, k: 3, gating: Gating::Softmax, norm: true, scale: 1.0 };
    let down = b.load_experts(g, g.tensor(&format!("exps.down.{}", ty.name())).unwrap(), 8, &[40]).unwrap();
    let x = input(b, g, "x", n, n * K);
    let (mut logits, mut ids, mut wts) =
        (b.alloc(n * 8).unwrap(), b.alloc(n * 3).unwrap(), b.alloc(n * 3).unwrap());
    b.matmul(&weight(b, g, "router"), &x, n, &mut logits);
    b.moe_route(&logits, n, &r, None, &mut ids, &mut wts);
    let mut gate = input(b, g, "gate", n * 3, n * 3 * K);
    let up = input(b, g, "y", n * 3, n * 3 * K);
    b.glu(&mut gate, &up, act, n * 3 * K);
    let mut y = b.alloc(n * 3 * 40).unwrap();
    let input = ExpertInput { x: &gate, per_slot: true, ids: &ids, rows: n, k: 3 };
    b.matmul_id(&[&down[0]], input, &mut [&mut y]);
    let mut v = read(b, &y, n * 3 * 40);
    v.extend(read(b, &gate, n * 3 * K));
    v
}

/// On the vec path the down experts after a GLU (its quantize held for the expert matmul,
/// one token or several): within the vec path's NMSE of the CPU, the GLU's output as the
/// CPU's.
#[test]
fn the_down_experts_after_the_glu_match_cpu() {
    let g = model();
    let cpu = CpuBackend::new(2);
    for gpu in vec_gpus() {
        for ty in DOWN_TYPES {
            for act in [Activation::Silu, Activation::GeluTanh] {
                for n in [1, 3] {
                    let what = format!("glu {act:?} then down {ty} x{n} on {}", gpu.name());
                    let d = glu_then_down(&gpu, &g, ty, act, n);
                    let c = glu_then_down(&cpu, &g, ty, act, n);
                    against_cpu(&gpu, &what, &d, &c, 1e-10);
                }
            }
        }
    }
}

/// On the vec path the weighted sum after the down experts runs in their tail (the last
/// of a token's slots to finish a block of rows sums it): one dispatch for both, and the
/// sum is the one the CPU makes of the GPU's own slot rows and weights, bit for bit, for 1
/// and 3 tokens of 3 slots.
#[test]
fn the_weighted_sum_in_the_down_experts_tail_is_the_cpus_of_their_rows() {
    let g = model();
    let cpu = CpuBackend::new(1);
    let r = Routing { n_expert: 8, k: 3, gating: Gating::Softmax, norm: true, scale: 1.0 };
    for gpu in vec_gpus() {
        let down = gpu
            .load_experts(&g, g.tensor(&format!("exps.down.{}", GgmlType::Q4_K.name())).unwrap(), 8, &[40])
            .unwrap();
        for n in [1, 3] {
            let what = format!("down then moe_sum x{n} on {}", gpu.name());
            let x = input(&gpu, &g, "x", n, n * K);
            let (mut logits, mut ids, mut wts) =
                (gpu.alloc(n * 8).unwrap(), gpu.alloc(n * 3).unwrap(), gpu.alloc(n * 3).unwrap());
            gpu.matmul(&weight(&gpu, &g, "router"), &x, n, &mut logits);
            gpu.moe_route(&logits, n, &r, None, &mut ids, &mut wts);
            let gate = input(&gpu, &g, "gate", n * 3, n * 3 * K);
            let (mut y, mut sum) = (gpu.alloc(n * 3 * 40).unwrap(), gpu.alloc(n * 40).unwrap());
            let input = ExpertInput { x: &gate, per_slot: true, ids: &ids, rows: n, k: 3 };
            gpu.matmul_id(&[&down[0]], input, &mut [&mut y]);
            let d0 = gpu.counts().get().1;
            gpu.moe_sum(&y, &wts, n, 3, 40, &mut sum);
            let fused = read(&gpu, &sum, n * 40);
            let dispatches = gpu.counts().get().1 - d0;
            assert_eq!(dispatches, 1, "{what}: {dispatches} dispatches for the down and the sum");
            let (yv, wv) = (read(&gpu, &y, n * 3 * 40), read(&gpu, &wts, n * 3));
            let (mut cy, mut cw, mut cs) =
                (cpu.alloc(n * 3 * 40).unwrap(), cpu.alloc(n * 3).unwrap(), cpu.alloc(n * 40).unwrap());
            cpu.write_rows(&mut cy, &yv);
            cpu.write_rows(&mut cw, &wv);
            cpu.moe_sum(&cy, &cw, n, 3, 40, &mut cs);
            assert_same_bits(&what, &fused, &read(&cpu, &cs, n * 40));
        }
    }
}

/// `n` tokens through gate and up experts of 256 rows loaded together, the GLU, and down
/// experts of `ty`: the down's output and the GLU's, and the dispatches from the gate
/// and up on. `split` reads `up` after the gate and up, so the GLU runs in its own kernel.
fn gate_up_glu_down(
    b: &GpuBackend,
    g: &Arc<GgufFile>,
    ty: GgmlType,
    act: Activation,
    n: usize,
    split: bool,
) -> (Vec<f32>, u64) {
    let r = Routing { n_expert: 8, k: 3, gating: Gating::Softmax, norm: true, scale: 1.0 };
    let ts: Vec<_> = ["gate", "up"].iter().map(|p| g.tensor(&format!("exps256.{p}.Q4_K")).unwrap()).collect();
    let gate_up = b.load_experts_together(g, &ts, 8).unwrap();
    let down =
        b.load_experts(g, g.tensor(&format!("exps256.down.{}", ty.name())).unwrap(), 8, &[40]).unwrap();
    let x = input(b, g, "x", n, n * K);
    let (mut logits, mut ids, mut wts) =
        (b.alloc(n * 8).unwrap(), b.alloc(n * 3).unwrap(), b.alloc(n * 3).unwrap());
    b.matmul(&weight(b, g, "router"), &x, n, &mut logits);
    b.moe_route(&logits, n, &r, None, &mut ids, &mut wts);
    read(b, &ids, 1);
    let (mut gate, mut up, mut y) =
        (b.alloc(n * 3 * 256).unwrap(), b.alloc(n * 3 * 256).unwrap(), b.alloc(n * 3 * 40).unwrap());
    let d0 = b.counts().get().1;
    let input = ExpertInput { x: &x, per_slot: false, ids: &ids, rows: n, k: 3 };
    b.matmul_id(&[&gate_up[0], &gate_up[1]], input, &mut [&mut gate, &mut up]);
    if split {
        read(b, &up, 1);
    }
    b.glu(&mut gate, &up, act, n * 3 * 256);
    let input = ExpertInput { x: &gate, per_slot: true, ids: &ids, rows: n, k: 3 };
    b.matmul_id(&[&down[0]], input, &mut [&mut y]);
    let mut v = read(b, &y, n * 3 * 40);
    v.extend(read(b, &gate, n * 3 * 256));
    (v, b.counts().get().1 - d0)
}

/// On the vec path the GLU after gate and up experts of rows in whole blocks of 256, and
/// its quantize for the down experts, run in the gate and up projection's tail (the last
/// of a block's workgroups to finish makes it): one dispatch fewer, and the GLU and the
/// down's output are those of the GLU's own kernel, bit for bit, for both activations,
/// 32- and 256-value blocks, 1 and 3 tokens of 3 slots.
#[test]
fn the_glu_in_the_gate_up_experts_tail_is_the_glu_kernels() {
    let g = model();
    for gpu in vec_gpus() {
        for ty in [GgmlType::Q8_0, GgmlType::Q4_K] {
            for act in [Activation::Silu, Activation::GeluTanh] {
                for n in [1, 3] {
                    let what = format!("gate and up, glu {act:?}, down {ty} x{n} on {}", gpu.name());
                    let (fused, df) = gate_up_glu_down(&gpu, &g, ty, act, n, false);
                    let (plain, dp) = gate_up_glu_down(&gpu, &g, ty, act, n, true);
                    // x's quantize, the gate and up (with the GLU), (the GLU,) the down.
                    assert_eq!((df, dp), (3, 4), "{what}: dispatches with the GLU tail and without");
                    assert_same_bits(&what, &fused, &plain);
                }
            }
        }
    }
}

/// q/k/v of `group` (matmul_many, `bias`: qkvb) of `n` tokens, then the RoPE store (with
/// `norm`, q's and k's norms first, the weights named: 4 q heads, 2 kv heads of 64): (with
/// norms) k, q after it and the two caches as f32. `split` reads k first, so the matmuls
/// and the store run unfused.
#[allow(clippy::too_many_arguments)]
fn qkv_rope_out(
    b: &GpuBackend,
    g: &Arc<GgufFile>,
    group: &str,
    bias: bool,
    n: usize,
    r: &RopeParams,
    split: bool,
    norm: Option<(&str, &str)>,
) -> Vec<f32> {
    let ts: Vec<_> = (0..3).map(|i| g.tensor(&format!("{group}.{i}")).unwrap()).collect();
    let ws = b.load_weights(g, &ts).unwrap();
    let bs: Vec<_> = (0..3).filter(|_| bias).map(|i| weight(b, g, &format!("qkvb.{i}"))).collect();
    let x = input(b, g, "x", n, n * K);
    let (mut q, mut k, mut v) =
        (b.alloc(n * 256).unwrap(), b.alloc(n * 128).unwrap(), b.alloc(n * 128).unwrap());
    let br: Vec<Option<&GpuWeight>> = bs.iter().map(Some).collect();
    b.matmul_many(&ws.iter().collect::<Vec<_>>(), &br, &x, n, &mut [&mut q, &mut k, &mut v]);
    if split {
        read(b, &k, 1);
    }
    let (mut kc, mut vc) = (b.alloc_kv(64 * 128).unwrap(), b.alloc_kv(64 * 128).unwrap());
    let pos: Vec<u32> = (0..n as u32).map(|t| 3 + 5 * t).collect();
    let slots: Vec<u32> = (0..n as u32).map(|t| (7 * t + 2) % 64).collect();
    let mut out = Vec::new();
    if let Some((qn, kn)) = norm {
        let (mut q_tmp, mut k_tmp) = (b.alloc(n * 256).unwrap(), b.alloc(n * 128).unwrap());
        let (qn, kn) = (weight(b, g, qn), weight(b, g, kn));
        let (tmp, norms) = ((&mut q_tmp, &mut k_tmp), (&qn, &kn, 1e-6));
        b.norm_rope_kv_store(&mut q, &mut k, &v, tmp, norms, &mut kc, &mut vc, &pos, &slots, 4, 2, 64, r);
        out.extend(read(b, &k, n * 128));
    } else {
        b.rope_kv_store(&mut q, &mut k, &v, &mut kc, &mut vc, &pos, &slots, 4, 2, 64, r);
    }
    out.extend(read(b, &q, n * 256));
    for c in [&kc, &vc] {
        out.extend(b.read_kv(c, 64 * 128).iter().map(|h| h.to_f32()));
    }
    out
}

#[test]
fn rope_store_fused_into_the_qkv_matmul_matches_the_unfused_kernels() {
    let g = model();
    for gpu in vec_gpus() {
        for (group, bias) in [("qkv", false), ("qkvm", true)] {
            // n_rot < head_dim is not fused (the store then runs on its own).
            for (neox, n_rot) in [(false, 64), (true, 64), (true, 48)] {
                let r = RopeParams { n_rot, ..rope_params(neox, false, false) };
                for n in [1, 3] {
                    let what =
                        format!("{group} bias {bias} neox {neox} n_rot {n_rot} x{n} on {}", gpu.name());
                    let d0 = gpu.counts().get().1;
                    let fused = qkv_rope_out(&gpu, &g, group, bias, n, &r, false, None);
                    let d1 = gpu.counts().get().1;
                    let split = qkv_rope_out(&gpu, &g, group, bias, n, &r, true, None);
                    let saved = (gpu.counts().get().1 - d1) - (d1 - d0);
                    assert_eq!(saved, u64::from(n_rot == 64), "{what}: {saved} dispatches saved");
                    assert_same_bits(&what, &fused, &split);
                }
            }
        }
    }
}

/// q and k norms and the RoPE store in the q/k/v matmul's tail (the last of each norm
/// group's workgroups to finish): Qwen3's per-head norms, the bits of rope_store.wgsl's
/// norm kernel after the matmul, one dispatch fewer; OLMoE's norms of all of q and all of
/// k, the bits of the two norm kernels and the RoPE store, three fewer. NORM and NEOX
/// pairs, whole and partial rotations, Q4_0 weights and Q4_K with a Q6_K v, one token and
/// three. (A default-mode fusion: batch invariance leaves it off, as the prologues.) On a
/// hardware adapter within HW_NMSE instead of the bits: NVIDIA's compiler rounds the tail's
/// norm otherwise than the norm kernel's (on an H100, 122 of 16,768 values differ, by at
/// most 1e-6 relative).
#[test]
fn q_and_k_norms_and_the_rope_store_in_the_qkv_matmuls_tail_are_the_norm_kernels() {
    let g = model();
    for mut gpu in vec_gpus() {
        gpu.set_batch_invariant(false);
        let norms = [(("headnorm", "headnorm"), 1), (("qkvb.0", "qkvb.1"), 3)];
        for (group, (norm, fewer)) in ["qkv", "qkvm"].into_iter().flat_map(|g| norms.map(|n| (g, n))) {
            for (neox, n_rot) in [(false, 64), (true, 64), (true, 48), (false, 48)] {
                let r = RopeParams { n_rot, ..rope_params(neox, false, false) };
                for n in [1, 3] {
                    let what =
                        format!("{group} norms {norm:?} neox {neox} n_rot {n_rot} x{n} on {}", gpu.name());
                    let d0 = gpu.counts().get().1;
                    let fused = qkv_rope_out(&gpu, &g, group, false, n, &r, false, Some(norm));
                    let d1 = gpu.counts().get().1;
                    let split = qkv_rope_out(&gpu, &g, group, false, n, &r, true, Some(norm));
                    let saved = (gpu.counts().get().1 - d1) - (d1 - d0);
                    assert_eq!(saved, fewer, "{what}: {saved} dispatches saved");
                    if gpu.is_software() {
                        assert_same_bits(&what, &fused, &split);
                    } else {
                        compare(&what, &fused, &split, HW_NMSE);
                    }
                }
            }
        }
    }
}

/// GQA 8:2 at head_dim 64 (n_head, n_head_kv, head_dim).
const GQA: (usize, usize, usize) = (8, 2, 64);

/// Two sequences in a block pool of 32-slot blocks, stored through `kv_store`, then
/// attended by a batch of query tokens from both (`heads`: n_head, n_head_kv, head_dim);
/// with `then` = (type, split), its output then goes through a matmul of that type
/// (`split` reads it first, so the two run unfused). `queries`: (position, sequence) of
/// each query token (q from rows of the gate table, at most 16). `extras`: `Some(cap)`
/// scales each token's query (`q_scale`) and soft-caps the scores at `cap` (0: not).
/// `encoder`: `Some(alibi)` makes it non-causal (every query sees its whole sequence),
/// with ALiBi's biases where `alibi` is `Some(max_bias)`.
#[allow(clippy::too_many_arguments)]
fn attention_out<B: Backend>(
    b: &B,
    g: &Arc<GgufFile>,
    heads: (usize, usize, usize),
    window: Option<u32>,
    then: Option<(GgmlType, bool)>,
    queries: &[(u32, u32)],
    extras: Option<f32>,
    encoder: Option<Option<f32>>,
) -> Vec<f32> {
    let (n_head, n_kv, hd) = heads;
    let kv_dim = n_kv * hd;
    let n_slots = 13 * 32;
    let mut kc = b.alloc_kv(n_slots * kv_dim).unwrap();
    let mut vc = b.alloc_kv(n_slots * kv_dim).unwrap();
    // The second sequence is longer than a chunk of the split attention (256 keys).
    let tables: [&[u32]; 2] = [&[4, 1], &[0, 5, 2, 6, 7, 8, 9, 10, 11, 12]];
    // Keys/values: rows of the x and y tables, kv_dim wide (several per 512-wide row).
    let lens = [40usize, 300];
    for (s, &len) in lens.iter().enumerate() {
        let slots: Vec<u32> = (0..len).map(|p| tables[s][p / 32] * 32 + (p % 32) as u32).collect();
        for chunk in slots.chunks(16 * K / kv_dim) {
            let k = input(b, g, "x", 16, 16 * K);
            let v = input(b, g, "y", 16, 16 * K);
            b.kv_store(&mut kc, &mut vc, &k, &v, chunk, kv_dim);
        }
    }
    let n = queries.len();
    let pos: Vec<u32> = queries.iter().map(|q| q.0).collect();
    let seq: Vec<u32> = queries.iter().map(|q| q.1).collect();
    let q = input(b, g, "gate", n, n * K);
    let q_scale: Vec<f32> = (0..n).map(|i| 0.7 + 0.3 * i as f32).collect();
    let plan = AttnPlan {
        pos: &pos,
        seq: &seq,
        tables: &tables,
        block_size: 32,
        n_head,
        n_head_kv: n_kv,
        head_dim: hd,
        scale: 0.125,
        q_scale: if extras.is_some() { &q_scale } else { &[] },
        softcap: extras.unwrap_or(0.0),
        window,
        seq_len: encoder.map(|_| &[40u32, 300][..]),
        alibi: encoder.flatten(),
    };
    let mut out = b.alloc(n * n_head * hd).unwrap();
    b.attention(&q, &kc, &vc, &plan, &mut out);
    let mut v = Vec::new();
    if let Some((ty, split)) = then {
        if split {
            read(b, &out, 1);
        }
        let mut y = b.alloc(n * ROWS).unwrap();
        b.matmul(&weight(b, g, &format!("w.{}", ty.name())), &out, n, &mut y);
        v = read(b, &y, n * ROWS);
    }
    v.extend(read(b, &out, n * n_head * hd));
    v
}

/// Five queries of the two sequences, the longest at position `top` (the split attention
/// takes 256 keys per chunk: 255 fits one, 299 needs two).
fn five(top: u32) -> [(u32, u32); 5] {
    [(39, 0), (10, 0), (top, 1), (0, 1), (33, 1)]
}

#[test]
fn vec_attention_is_batch_invariant() {
    let g = model();
    // Twelve queries, of which the first five and the first alone: the same bits.
    let mut queries = five(299).to_vec();
    queries.extend([(5, 0), (20, 0), (100, 1), (250, 1), (256, 1), (31, 0), (298, 1)]);
    for gpu in vec_gpus() {
        let all = attention_out(&gpu, &g, GQA, None, None, &queries, None, None);
        for n in [5, 1] {
            let part = attention_out(&gpu, &g, GQA, None, None, &queries[..n], None, None);
            assert_same_bits(&format!("{n} of 12 queries on {}", gpu.name()), &part, &all[..part.len()]);
        }
    }
}

#[test]
fn attention_fused_with_the_next_quantize_matches_cpu() {
    let g = model();
    let cpu = CpuBackend::new(2).with_attn_arith(AttnArith::Ggml);
    for mut gpu in gpus().into_iter().chain(vec_gpus()) {
        if gpu.matmul_path() != MatmulPath::Vec {
            gpu.set_matmul_path(MatmulPath::Exact);
        }
        let tol = if gpu.matmul_path() == MatmulPath::Vec { 1e-5 } else { 1e-9 };
        // Heads of 64: whole Q8_0/Q8_1 blocks (each head's workgroup quantizes its own), four
        // to a Q8_K superblock (Q4_K: the last of the four to finish quantizes it); heads of
        // 128, two to a superblock.
        let cases = [GgmlType::Q8_0, GgmlType::Q4_1, GgmlType::Q4_K, GgmlType::F16].map(|ty| (ty, GQA));
        for (ty, heads) in cases.into_iter().chain([(GgmlType::Q4_K, (4, 1, 128))]) {
            let what =
                format!("attention {heads:?} then matmul {ty} on {} {:?}", gpu.name(), gpu.matmul_path());
            let mut used = Vec::new();
            for top in [299, 255] {
                let what = format!("{what}, top position {top}");
                let d0 = gpu.counts().get().1;
                let fused = attention_out(&gpu, &g, heads, None, Some((ty, false)), &five(top), None, None);
                let d1 = gpu.counts().get().1;
                let split = attention_out(&gpu, &g, heads, None, Some((ty, true)), &five(top), None, None);
                let saved = (gpu.counts().get().1 - d1) - (d1 - d0);
                assert_eq!(saved, 1, "{what}: {saved} dispatches saved");
                assert_same_bits(&format!("{what}, against the unfused kernels"), &fused, &split);
                used.push(d1 - d0);
                let c = attention_out(&cpu, &g, heads, None, Some((ty, false)), &five(top), None, None);
                against_cpu(&gpu, &what, &fused, &c, tol);
            }
            // The vec path's keys in one chunk: no merge dispatch.
            let merge = u64::from(gpu.matmul_path() == MatmulPath::Vec);
            assert_eq!(used[0] - used[1], merge, "{what}: dispatches {used:?}");
        }
    }
}

#[test]
fn kv_store_and_attention_match_cpu() {
    let g = model();
    let cpu = CpuBackend::new(2).with_attn_arith(AttnArith::Ggml);
    let cpu_f32 = CpuBackend::new(2).with_attn_arith(AttnArith::F32);
    for gpu in gpus().into_iter().chain(vec_gpus()) {
        // The vec path's split attention sums in f32: against the CPU's f32 arithmetic.
        let cpu = if gpu.matmul_path() == MatmulPath::Vec { &cpu_f32 } else { &cpu };
        // head_dim 64, 128 and 256: a value pair per invocation, or two.
        for heads in [GQA, (4, 1, 128), (2, 1, 256)] {
            // Two chunks of keys (from the start, or a window across their boundary) and one
            // (the split attention's merge, or none; the exact kernel's chunk fold, or none).
            // Plain; queries scaled per token (phi3's, mistral3's); and soft-capped (gemma2's:
            // the GPU's tanh is a few ulp from libm's, so no longer the same bits).
            let cases = [(None, 299), (Some(16), 299), (Some(60), 299), (None, 255)].map(|c| (c, None));
            let extras = [((Some(16), 299), Some(0.0)), ((None, 299), Some(2.5))];
            for ((window, top), extras) in cases.into_iter().chain(extras) {
                let c = attention_out(cpu, &g, heads, window, None, &five(top), extras, None);
                let d = attention_out(&gpu, &g, heads, window, None, &five(top), extras, None);
                let what = format!(
                    "attention {heads:?} window {window:?} top {top} extras {extras:?} on {} {:?}",
                    gpu.name(),
                    gpu.matmul_path()
                );
                let exact = gpu.matmul_path() != MatmulPath::Vec && extras.unwrap_or(0.0) == 0.0;
                against_cpu(&gpu, &what, &d, &c, if exact { 0.0 } else { 1e-9 });
            }
        }
    }
}

/// Encoders' attention: every query sees its whole sequence (both key chunks of the
/// longer one), with ALiBi's biases or without; 6 heads take both of ALiBi's slope series,
/// head_dim 16 and 80 the dims past the blocks of 64 (summed in f64 on the CPU).
#[test]
fn non_causal_and_alibi_attention_match_cpu() {
    let g = model();
    let cpu = CpuBackend::new(2).with_attn_arith(AttnArith::Ggml);
    let cpu_f32 = CpuBackend::new(2).with_attn_arith(AttnArith::F32);
    for gpu in gpus().into_iter().chain(vec_gpus()) {
        let vec = gpu.matmul_path() == MatmulPath::Vec;
        let cpu = if vec { &cpu_f32 } else { &cpu };
        for heads in [GQA, (6, 2, 64), (2, 1, 256), (4, 2, 16), (2, 1, 80)] {
            for alibi in [None, Some(8.0)] {
                let c = attention_out(cpu, &g, heads, None, None, &five(299), None, Some(alibi));
                let d = attention_out(&gpu, &g, heads, None, None, &five(299), None, Some(alibi));
                let causal = attention_out(&gpu, &g, heads, None, None, &five(299), None, None);
                let what = format!(
                    "attention {heads:?} non-causal, alibi {alibi:?} on {} {:?}",
                    gpu.name(),
                    gpu.matmul_path()
                );
                against_cpu(&gpu, &what, &d, &c, if vec { 1e-9 } else { 0.0 });
                assert!(nmse(&d, &causal) > 1e-4, "{what}: the same as causal attention");
            }
        }
    }
}

/// LayerNorm (with its bias and without; rows of 512, and of 40: a tail past the sums of
/// sixteen) and GELU (gate values past ±10 too): the CPU's bits.
fn encoder_ops<B: Backend>(b: &B, g: &Arc<GgufFile>) -> Vec<Vec<f32>> {
    let len = 5 * K;
    let x = input(b, g, "x", 5, len);
    let mut h = b.alloc(len).unwrap();
    let mut outs = Vec::new();
    for (rows, dim, w, bias) in [(5, K, "norm", "bias"), (64, 40, "norm40", "bias40")] {
        let (w, bias) = (weight(b, g, w), weight(b, g, bias));
        for bias in [Some(&bias), None] {
            b.layer_norm(&x, LayerNorm { eps: 1e-12, w: &w, b: bias }, rows, &mut h);
            outs.push(read(b, &h, rows * dim));
        }
    }
    let mut gate = input(b, g, "gate", 5, len);
    b.gelu(&mut gate, len - 3);
    outs.push(read(b, &gate, len));
    outs
}

#[test]
fn layer_norm_and_gelu_match_cpu_bit_for_bit() {
    let g = model();
    let c = encoder_ops(&CpuBackend::new(2), &g);
    for gpu in gpus() {
        let d = encoder_ops(&gpu, &g);
        let names = [
            "layer_norm",
            "layer_norm without bias",
            "layer_norm of 40",
            "layer_norm of 40 without bias",
            "gelu",
        ];
        for ((c, d), name) in c.iter().zip(&d).zip(names) {
            against_cpu(&gpu, name, d, c, 0.0);
        }
    }
}

/// LFM2's short convolution (filters of 3, 128 channels) on eight tokens of two sequences,
/// interleaved: one continues from a state slot (and writes its new state to that same
/// slot, which every window must read first), one starts at position 0; three tokens
/// write states. The outputs, then the states.
fn short_conv_out<B: Backend>(b: &B, g: &Arc<GgufFile>) -> Vec<f32> {
    use kiln::backend::ConvPlan;
    const NONE: u32 = ConvPlan::NONE;
    let dim = 128;
    let bcx = input(b, g, "x", 6, 6 * K);
    let mut state = input(b, g, "y", 2, 2 * K);
    let plan = ConvPlan {
        l_cache: 3,
        prev: &[NONE, NONE, 0, 1, 2, 3, 4, 6],
        state_in: &[1, NONE, NONE, NONE, NONE, NONE, NONE, NONE],
        state_out: &[NONE, NONE, NONE, NONE, 1, 2, NONE, 3],
    };
    let mut out = b.alloc(8 * dim).unwrap();
    b.short_conv(&bcx, &weight(b, g, "conv"), &mut state, &plan, dim, &mut out);
    let mut v = read(b, &out, 8 * dim);
    v.extend(read(b, &state, 2 * K));
    v
}

#[test]
fn short_conv_matches_cpu_bit_for_bit() {
    let g = model();
    let c = short_conv_out(&CpuBackend::new(2), &g);
    for gpu in gpus() {
        let d = short_conv_out(&gpu, &g);
        against_cpu(&gpu, "short_conv", &d, &c, 0.0);
    }
}

#[test]
fn every_op_records_gpu_work() {
    let gpu = &gpus()[1];
    let g = model();
    let _ = elementwise(gpu, &g, 2);
    let _ = attention_out(gpu, &g, GQA, None, None, &five(299), None, None);
    let (ops, dispatches) = gpu.counts().get();
    assert!(ops > 20 && dispatches >= ops, "{ops} ops, {dispatches} dispatches");
}

/// Keys and values moved by a context shift (rotated by `delta`), read back through
/// attention over the destination slots.
fn shifted_attention_out<B: Backend>(b: &B, g: &Arc<GgufFile>, rope: &RopeParams) -> Vec<f32> {
    let (n_head, n_kv, hd) = (4, 2, 64);
    let kv_dim = n_kv * hd;
    let mut kc = b.alloc_kv(4 * 32 * kv_dim).unwrap();
    let mut vc = b.alloc_kv(4 * 32 * kv_dim).unwrap();
    // Sources in blocks 0-1, destinations in blocks 2-3: disjoint, as kv_shift requires
    // (overlapping sets would race on the GPU).
    let src: Vec<u32> = (0..40).collect();
    for chunk in src.chunks(16 * K / kv_dim) {
        let k = input(b, g, "x", 16, 16 * K);
        let v = input(b, g, "y", 16, 16 * K);
        b.kv_store(&mut kc, &mut vc, &k, &v, chunk, kv_dim);
    }
    // Positions 12..40 move down by 12 into blocks 2 and 3 (disjoint from the sources).
    let dst: Vec<u32> = (64..64 + 28).collect();
    b.kv_shift(&mut kc, &mut vc, &src[12..], &dst, -12, n_kv, hd, rope);
    let tables: [&[u32]; 1] = [&[2]];
    let pos = [27u32, 5];
    let q = input(b, g, "gate", 2, 2 * K);
    let plan = AttnPlan {
        pos: &pos,
        seq: &[0, 0],
        tables: &tables,
        block_size: 32,
        n_head,
        n_head_kv: n_kv,
        head_dim: hd,
        scale: 0.125,
        q_scale: &[],
        softcap: 0.0,
        window: None,
        seq_len: None,
        alibi: None,
    };
    let mut out = b.alloc(2 * n_head * hd).unwrap();
    b.attention(&q, &kc, &vc, &plan, &mut out);
    read(b, &out, 2 * n_head * hd)
}

#[test]
fn kv_shift_matches_cpu() {
    let g = model();
    let cpu = CpuBackend::new(2).with_attn_arith(AttnArith::Ggml);
    for gpu in gpus() {
        for (neox, n_rot) in [(false, 64), (true, 64), (true, 32)] {
            let rope = RopeParams { n_rot, ..rope_params(neox, false, false) };
            let c = shifted_attention_out(&cpu, &g, &rope);
            let d = shifted_attention_out(&gpu, &g, &rope);
            against_cpu(&gpu, &format!("kv_shift neox {neox} n_rot {n_rot}"), &d, &c, 1e-6);
        }
    }
}

#[test]
fn argmax_matches_the_greedy_sampler() {
    // Rows of random values, then ties (the lowest index wins), infinities and NaNs
    // (ordered as total_cmp orders them), across both reduction paths.
    let mut rng = Rng(7);
    let n = 1000;
    let mut rows: Vec<Vec<f32>> = (0..3).map(|_| rng.vec(n)).collect();
    let mut tie = vec![0.5f32; n];
    tie[17] = 2.0;
    tie[900] = 2.0;
    rows.push(tie);
    let mut inf = rng.vec(n);
    inf[3] = f32::INFINITY;
    inf[4] = f32::NAN;
    inf[5] = -f32::NAN;
    rows.push(inf);
    rows.push(vec![-1.0; n]);
    let flat: Vec<f32> = rows.concat();
    let want: Vec<u32> = rows.iter().map(|r| kiln::sample::argmax(r)).collect();
    assert_eq!(want[3], 17);
    for gpu in gpus() {
        let x = gpu.upload_f32(&flat).unwrap();
        assert_eq!(gpu.argmax(&x, rows.len(), n), want, "{}", gpu.name());
        // A row shorter than the workgroup.
        assert_eq!(gpu.argmax(&x, 1, 10), vec![kiln::sample::argmax(&flat[..10])]);
    }
    // Vocabulary-sized rows (several rounds of loads per invocation), the maximum and a
    // tie in the last partial round.
    let n = 151_937;
    let mut rows: Vec<Vec<f32>> = (0..2).map(|_| rng.vec(n)).collect();
    rows[0][n - 2] = 9.0;
    rows[1][n - 7] = 9.0;
    rows[1][70_000] = 9.0;
    let flat: Vec<f32> = rows.concat();
    let want: Vec<u32> = rows.iter().map(|r| kiln::sample::argmax(r)).collect();
    assert_eq!(want, [n as u32 - 2, 70_000]);
    for gpu in gpus() {
        let x = gpu.upload_f32(&flat).unwrap();
        assert_eq!(gpu.argmax(&x, rows.len(), n), want, "{}", gpu.name());
    }
}
