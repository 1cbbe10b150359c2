//! The tile matmul on cooperative matrices (backend/wgpu/coop.rs): its WGSL compiles to
//! SPIR-V for every weight type and shape; its results match an f64 reference of the same
//! f16 operands and the CPU backend; it runs only where chosen (enough tokens, batch
//! invariance not asked for, an adapter with cooperative matrices) and the paths it
//! replaces stay batch invariant. On adapters without cooperative matrices (lavapipe in CI)
//! the kernels run with their matrix operations emulated per invocation (coop.rs
//! `Ops::Emulated`): everything around the tensor cores is tested there too.
#![cfg(feature = "gpu")]

use std::sync::Arc;

use half::f16;
use kiln::backend::cpu::CpuBackend;
use kiln::backend::wgpu::coop::{self, CoopCaps, CoopShape, Ops};
use kiln::backend::wgpu::kernels::{self, Kernel, Outs, ONE_OUT};
use kiln::backend::wgpu::GpuBackend;
use kiln::backend::Backend;
use kiln::gguf::{GgufFile, GgufWriter};
use kiln::quant::{self, GgmlType};

const K: usize = 512;
const TYPES: [GgmlType; 8] = [
    GgmlType::F16,
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q8_0,
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
];
/// Rows of each test weight: more than one 128-row tile, the last one partial.
const ROWS: usize = 150;
/// Token counts: one of each tile shape (16, 32, 64 and 128 tokens a tile), partial tiles.
const TOKENS: [usize; 4] = [16, 20, 40, 131];
const MAX_TOK: usize = 131;

#[path = "common/rng.rs"]
mod rng;
use rng::{nmse, Rng};
#[path = "common/tiles.rs"]
mod tiles;
use tiles::{full_tier, gpu, tile_gpu};

fn add_weight(w: &mut GgufWriter, rng: &mut Rng, name: &str, ty: GgmlType, rows: usize) {
    let v = rng.vec(rows * K);
    let mut data = vec![0u8; ty.row_size(K).unwrap() * rows];
    quant::quantize_row(ty, &v, &mut data).unwrap();
    w.add_tensor(name.to_string(), ty, &[K as u64, rows as u64], data).unwrap();
}

/// One weight of each type, q/k/v with biases (one type), q and k of one type with v of
/// another (Q4_K_M's layers), and the activations as an F32 table.
fn model() -> Arc<GgufFile> {
    let mut rng = Rng(0x2545_f491_4f6c_dd1d);
    let mut w = GgufWriter::new();
    for ty in TYPES {
        add_weight(&mut w, &mut rng, &format!("w.{}", ty.name()), ty, ROWS);
    }
    for (i, rows) in [256usize, 128, 128].into_iter().enumerate() {
        add_weight(&mut w, &mut rng, &format!("qkv.{i}"), GgmlType::Q8_0, rows);
        w.add_f32(format!("qkvb.{i}"), &[rows as u64], &rng.vec(rows)).unwrap();
    }
    for (i, (ty, rows)) in
        [(GgmlType::Q4_K, 256usize), (GgmlType::Q4_K, 128), (GgmlType::Q6_K, 128)].into_iter().enumerate()
    {
        add_weight(&mut w, &mut rng, &format!("mix.{i}"), ty, rows);
    }
    // Activations of the size a normed hidden state has (a few larger values).
    let x: Vec<f32> = rng.vec(MAX_TOK * K).iter().map(|v| v * 3.0).collect();
    w.add_f32("x", &[K as u64, MAX_TOK as u64], &x).unwrap();
    Arc::new(GgufFile::from_bytes(w.to_bytes()).unwrap())
}

/// A GPU whose matmuls of any batch run on the tiles `coop::shape` picks (those of
/// batches under `MIN_TOKENS` too: every shape is tested whatever the threshold).
fn every_shape_gpu() -> GpuBackend {
    let mut g = tile_gpu();
    let caps = g.coop_caps().expect("tiles");
    g.set_shape_choice(Some(Arc::new(move |tokens, rows, k| coop::shape(&caps, tokens, rows, k))));
    g
}

fn weight<B: Backend>(b: &B, g: &Arc<GgufFile>, name: &str) -> B::Weight {
    b.load_weight(g, g.tensor(name).unwrap()).unwrap()
}

fn input<B: Backend>(b: &B, g: &Arc<GgufFile>, n: usize) -> B::Buf {
    let mut buf = b.alloc(MAX_TOK * K).unwrap();
    let ids: Vec<u32> = (0..n as u32).collect();
    b.embed(&weight(b, g, "x"), &ids, 1.0, &mut buf).unwrap();
    buf
}

fn read<B: Backend>(b: &B, buf: &B::Buf, n: usize) -> Vec<f32> {
    let mut out = vec![0.0; n];
    b.read(buf, &mut out);
    out
}

fn matmul_out<B: Backend>(b: &B, g: &Arc<GgufFile>, name: &str, n: usize) -> Vec<f32> {
    let w = weight(b, g, name);
    let rows = b.weight_shape(&w).0;
    let x = input(b, g, n);
    let mut out = b.alloc(MAX_TOK * rows).unwrap();
    b.matmul(&w, &x, n, &mut out);
    read(b, &out, n * rows)
}

/// The product of the tiles' operands in f64: the weight dequantized and rounded to f16,
/// the activations rounded to f16.
fn f16_reference(g: &Arc<GgufFile>, name: &str, n: usize) -> Vec<f32> {
    let t = g.tensor(name).unwrap();
    let (rows, k) = t.rows_cols();
    let raw = &g.bytes()[(g.data_offset + t.offset) as usize..][..t.size as usize];
    let rs = t.ty.row_size(k).unwrap();
    let h = |v: f32| f16::from_f32(v).to_f64();
    let mut w = vec![0f32; k];
    let mut wr = vec![vec![0f64; k]; rows];
    for (r, out) in wr.iter_mut().enumerate() {
        quant::dequantize_row(t.ty, &raw[r * rs..(r + 1) * rs], &mut w).unwrap();
        *out = w.iter().map(|&v| h(v)).collect();
    }
    let xt = g.tensor("x").unwrap();
    let xs: &[f32] =
        bytemuck::cast_slice(&g.bytes()[(g.data_offset + xt.offset) as usize..][..xt.size as usize]);
    let mut out = Vec::with_capacity(n * rows);
    for tok in 0..n {
        let x: Vec<f64> = xs[tok * k..(tok + 1) * k].iter().map(|&v| h(v)).collect();
        out.extend(wr.iter().map(|w| w.iter().zip(&x).map(|(a, b)| a * b).sum::<f64>() as f32));
    }
    out
}

/// How close the tiles come to the f64 product of their operands: f32 sums of exact f16
/// products (on tensor cores, in their order).
const TILE_NMSE: f64 = 1e-9;
/// How close they come to the CPU backend, whose activations are 8-bit (Q8_0, Q8_1, Q8_K)
/// where the tiles' are f16: the CPU's own rounding of the activations is most of it
/// (gpu_ops.rs's hardware bound, 1e-5, is for paths with the CPU's 8-bit activations).
const TILE_VS_CPU_NMSE: f64 = 1e-4;

#[test]
fn tile_matmul_matches_its_f16_reference_and_the_cpu() {
    let g = model();
    let cpu = CpuBackend::new(2);
    let gpu = every_shape_gpu();
    // Each type at one batch size (all sizes over the types). Emulated tiles are slow on
    // software adapters: CI's tier takes three types.
    let full = full_tier(&gpu);
    let cases: Vec<(GgmlType, usize)> = if full {
        TYPES.into_iter().zip(TOKENS.into_iter().cycle()).collect()
    } else {
        vec![(GgmlType::Q4_0, MAX_TOK), (GgmlType::Q4_K, 20), (GgmlType::Q6_K, 40)]
    };
    for (ty, n) in cases {
        let name = format!("w.{}", ty.name());
        {
            let d = matmul_out(&gpu, &g, &name, n);
            let r = f16_reference(&g, &name, n);
            let c = matmul_out(&cpu, &g, &name, n);
            let (e_ref, e_cpu, cpu_ref) = (nmse(&d, &r), nmse(&d, &c), nmse(&c, &r));
            eprintln!("{ty} x{n}: tiles vs f16 reference {e_ref:.1e}, vs CPU {e_cpu:.1e} (CPU vs reference {cpu_ref:.1e})");
            assert!(
                e_ref <= TILE_NMSE,
                "{ty} x{n} on {}: NMSE {e_ref:e} against the f16 reference",
                gpu.name()
            );
            assert!(e_cpu <= TILE_VS_CPU_NMSE, "{ty} x{n} on {}: NMSE {e_cpu:e} against the CPU", gpu.name());
        }
    }
}

#[test]
fn any_number_of_splits_of_k_and_stages_in_flight_adds_up() {
    // One pipeline serves every split count (a parameter): counts that divide k's 16
    // chunks unevenly (3: 6 + 6 + 4) or leave a split one chunk (15) give the product too,
    // with any number of stages' loads in flight (the kernel's loop then runs 2, 4 or 6
    // stages an iteration and leaves it after any of them).
    let g = model();
    let name = &format!("w.{}", GgmlType::Q4_K.name());
    let n = 20;
    let r = f16_reference(&g, name, n);
    for (ks, ahead) in [(1u32, 1u32), (3, 2), (15, 3), (2, 3), (1, 4)] {
        let mut gpu = every_shape_gpu();
        let caps = gpu.coop_caps().expect("tiles");
        gpu.set_shape_choice(Some(Arc::new(move |tokens, rows, k| {
            coop::shape(&caps, tokens, rows, k).map(|s| CoopShape { ks, ahead, ..s })
        })));
        let e = nmse(&matmul_out(&gpu, &g, name, n), &r);
        assert!(
            e <= TILE_NMSE,
            "k in {ks} splits, {ahead} stages ahead, on {}: NMSE {e:e} against the f16 reference",
            gpu.name()
        );
    }
}

#[test]
fn weights_loaded_together_and_split_run_on_tiles() {
    // q/k/v with biases in one buffer (one kernel, outputs routed by row), Q4_K q and k
    // with a Q6_K v (a kernel per type), and a weight split by rows over buffers.
    let g = model();
    let cpu = CpuBackend::new(2);
    let n = 40;
    let run = |gpu: &GpuBackend, names: &[&str], bias: bool| -> Vec<f32> {
        let ts: Vec<_> = names.iter().map(|nm| g.tensor(nm).unwrap()).collect();
        let ws = gpu.load_weights(&g, &ts).unwrap();
        let x = input(gpu, &g, n);
        let mut outs: Vec<_> = ws.iter().map(|w| gpu.alloc(n * gpu.weight_shape(w).0).unwrap()).collect();
        let bs: Vec<_> =
            (0..names.len()).filter(|_| bias).map(|i| weight(gpu, &g, &format!("qkvb.{i}"))).collect();
        let br: Vec<Option<&_>> = bs.iter().map(Some).collect();
        let wr: Vec<&_> = ws.iter().collect();
        let mut or: Vec<&mut _> = outs.iter_mut().collect();
        gpu.matmul_many(&wr, &br, &x, n, &mut or);
        ws.iter().zip(&outs).flat_map(|(w, o)| read(gpu, o, n * gpu.weight_shape(w).0)).collect()
    };
    let run_cpu = |names: &[&str], bias: bool| -> Vec<f32> {
        let mut v = Vec::new();
        for (i, nm) in names.iter().enumerate() {
            let w = weight(&cpu, &g, nm);
            let rows = cpu.weight_shape(&w).0;
            let x = input(&cpu, &g, n);
            let mut o = cpu.alloc(n * rows).unwrap();
            cpu.matmul(&w, &x, n, &mut o);
            if bias {
                cpu.add_bias(&mut o, &weight(&cpu, &g, &format!("qkvb.{i}")), n);
            }
            v.extend(read(&cpu, &o, n * rows));
        }
        v
    };
    let gpu = every_shape_gpu();
    let groups = [(&["qkv.0", "qkv.1", "qkv.2"][..], true), (&["mix.0", "mix.1", "mix.2"][..], false)];
    // (Emulated tiles are slow: CI's tier takes the first group.)
    let n_groups = if full_tier(&gpu) { 2 } else { 1 };
    for (names, bias) in groups.into_iter().take(n_groups) {
        let d = run(&gpu, names, bias);
        let c = run_cpu(names, bias);
        let e = nmse(&d, &c);
        eprintln!("{names:?}: tiles vs CPU {e:.1e}");
        assert!(e <= TILE_VS_CPU_NMSE, "{names:?} on {}: NMSE {e:e}", gpu.name());
    }
    let mut split = every_shape_gpu();
    let row_bytes = GgmlType::Q4_K.row_size(K).unwrap() as u64;
    split.set_max_binding(40 * row_bytes);
    let name = &format!("w.{}", GgmlType::Q4_K.name());
    let (d, r) = (matmul_out(&split, &g, name, n), f16_reference(&g, name, n));
    assert!(nmse(&d, &r) <= TILE_NMSE, "split weight on tiles: NMSE {:e}", nmse(&d, &r));
}

#[test]
fn tiles_run_only_where_chosen_and_the_rest_stays_batch_invariant() {
    // Batch invariance asked for, or no cooperative matrices (the forced-off selection,
    // what lavapipe has): a token's outputs are the same bits alone and in a batch of
    // each size the tiles would take. Tiles on: the batch's outputs are the tiles'
    // (within the f16 reference's bound, which the 8-bit activations of the other paths
    // miss), a single token's are not.
    let g = model();
    let name = &format!("w.{}", GgmlType::Q4_K.name());
    let mut invariant = every_shape_gpu();
    invariant.set_batch_invariant(true);
    let mut no_tiles = gpu();
    no_tiles.disable_coop();
    assert!(!no_tiles.has_coop());
    for b in [&invariant, &no_tiles] {
        let alone = matmul_out(b, &g, name, 1);
        for n in [TOKENS[0], MAX_TOK] {
            let batch = matmul_out(b, &g, name, n);
            let bad = alone.iter().zip(&batch).filter(|(a, c)| a.to_bits() != c.to_bits()).count();
            assert_eq!(bad, 0, "x{n} on {}: {bad} of token 0's outputs changed with its batch", b.name());
            let e = nmse(&batch, &f16_reference(&g, name, n));
            assert!(
                e > TILE_NMSE,
                "x{n} on {}: the integer path's NMSE {e:e} looks like the tiles'",
                b.name()
            );
        }
    }
    let tiles = tile_gpu();
    for n in [coop_min_tokens() - 1, coop_min_tokens()] {
        let e = nmse(&matmul_out(&tiles, &g, name, n), &f16_reference(&g, name, n));
        assert_eq!(e <= TILE_NMSE, n >= coop_min_tokens(), "x{n}: NMSE {e:e} against the f16 reference");
    }
}

/// Every case: on real cooperative matrices, or with KILN_FULL=1.
fn coop_min_tokens() -> usize {
    kiln::backend::wgpu::coop::MIN_TOKENS
}

#[test]
fn tile_kernels_compile_for_cooperative_matrices() {
    // Every type, shape and output variant: WGSL parsed and validated by naga with the
    // capabilities the tile path requests, then written as SPIR-V (what a Vulkan driver
    // receives), so a shader error shows here rather than on a GPU with the feature.
    let caps =
        CoopCaps { max_subgroup: 32, workgroup_storage: 49152, max_invocations: 1024, emulated: false };
    let mut shapes = Vec::new();
    for tokens in [8, 16, 17, 32, 33, 64, 95, 96, 512] {
        for (rows, k) in [(896, 4864), (4096, 4096), (14336, 4096), (4096, 14336)] {
            let s: CoopShape = coop::shape(&caps, tokens, rows, k).expect("fits 48 KiB").kernel_key();
            assert_eq!(s.ops, Ops::Coop);
            assert!(s.storage() <= 49152, "{s:?}");
            if !shapes.contains(&s) {
                shapes.push(s);
            }
        }
    }
    let outs = [ONE_OUT, Outs { n: 2, ..ONE_OUT }, Outs { n: 3, bias: true, ..ONE_OUT }];
    for ty in TYPES {
        for &s in &shapes {
            // The dense kernels with each output variant and their sum of splits, and the
            // expert tiles (backend/wgpu/moe_coop.rs: one output or gate and up, k not split).
            let mut each: Vec<Kernel> = Vec::new();
            for o in outs {
                each.extend([Kernel::MatmulCoop(ty, o, s), Kernel::CoopReduce(o)]);
            }
            each.extend([1, 2].map(|n| Kernel::MatmulIdCoop(ty, n, CoopShape { ks: 1, ..s })));
            for kernel in each {
                let (src, what) = (kernels::assemble(kernel, true, true), format!("{kernel:?}"));
                tiles::compiles_to_spirv(&src, &what);
            }
        }
    }
}
