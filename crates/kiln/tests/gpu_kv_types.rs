//! Quantized KV caches on the GPU (crate::kv::types) against the CPU backend, whose caches
//! are tested against llama.cpp (tests/kv_types.rs): rows stored (rotated, quantized) to the
//! same bytes, attention over them (the query rotated and quantized, scores from the blocks,
//! values dequantized as read, the output rotated back) to the same bits on the exact
//! kernel and within f32 regrouping on the split one, a context shift of quantized keys to
//! the same bytes, and smollm2 greedy with q8_0 keys and values on the CPU's tokens.
//! On software adapters (lavapipe, CI) the kernels give the CPU's bits; hardware adapters'
//! f32 division and exp are not IEEE-rounded, so there they are held to an NMSE bar.
#![cfg(feature = "gpu")]

mod support;

use kiln::backend::cpu::{AttnArith, CpuBackend, KvBuf};
use kiln::backend::wgpu::{AdapterPolicy, GpuBackend, GpuKv, MatmulPath};
use kiln::backend::{AttnPlan, Backend, RopeParams};
use kiln::engine::{Device, Engine, EngineOptions};
use kiln::kv::{KvTypes, CACHE_TYPES};
use kiln::quant::GgmlType;

use support::rng::{nmse, Rng};

/// The quantized cache types (every one of CACHE_TYPES but f16).
fn quantized() -> Vec<GgmlType> {
    CACHE_TYPES.iter().map(|&(_, t)| t).filter(|&t| t != GgmlType::F16).collect()
}

fn gpu() -> GpuBackend {
    let mut g = GpuBackend::new(AdapterPolicy::AnyGpu)
        .expect("no Vulkan adapter: install mesa-vulkan-drivers (lavapipe) to run the GPU tests");
    g.set_batch_invariant(true);
    g
}

fn upload<B: Backend>(b: &B, v: &[f32]) -> B::Buf {
    let mut buf = b.alloc(v.len()).unwrap();
    b.write_rows(&mut buf, v);
    buf
}

fn read<B: Backend>(b: &B, buf: &B::Buf, n: usize) -> Vec<f32> {
    let mut out = vec![0.0; n];
    b.read(buf, &mut out);
    out
}

/// Test rows: values in [-1, 1) with an outlier every 37 values (what the rotation spreads).
fn rows(rng: &mut Rng, n: usize) -> Vec<f32> {
    let mut v = rng.vec(n);
    v.iter_mut().skip(5).step_by(37).for_each(|x| *x *= 9.0);
    v
}

/// The caches' bytes on both backends: `(cpu, gpu)`.
fn bytes(gpu: &GpuBackend, c: &KvBuf, g: &GpuKv) -> (Vec<u8>, Vec<u8>) {
    (c.bytes().to_vec(), gpu.read_kv_bytes(g, c.bytes().len()))
}

/// The exact kernel's output against the CPU's (its ggml arithmetic). On a software adapter
/// nearly every value is the same bits; a few, in some cases with a quantized V, are an ulp
/// or two off (NMSE under 1e-14; measured: up to 44 of 960 values with Q4_0 keys, 0 for
/// q8_0, q5_1, q5_0, q4_1, iq4_nl): the GPU's exp rounds like the CPU's expf in all but
/// rare near-midpoint cases (exp.wgsl), and a quantized V's accumulators stay in f32, where
/// an f16 V's rounding after every key absorbs such an ulp. Hardware adapters' division and
/// exp are not IEEE-rounded: an NMSE of 1e-5 there.
fn close(gpu: &GpuBackend, what: &str, g: &[f32], c: &[f32]) {
    let e = nmse(g, c);
    if gpu.is_software() {
        let bad = g.iter().zip(c).filter(|(a, b)| a.to_bits() != b.to_bits()).count();
        assert!(e < 1e-14 && bad * 10 < c.len(), "{what}: {bad} of {} values differ, NMSE {e:e}", c.len());
    } else {
        assert!(e < 1e-5, "{what}: NMSE {e:e}");
    }
}

/// Every cache type stores rows to the CPU's bytes: rotated in groups of 64 and 128 (and
/// not rotated: heads of 96), to slots of both word alignments.
#[test]
fn stored_rows_are_the_cpus_bytes() {
    let gpu = gpu();
    let cpu = CpuBackend::new(2);
    let mut rng = Rng(0x5eed_0001);
    for ty in quantized() {
        for (n_kv, hd) in [(2usize, 64usize), (1, 128), (3, 96)] {
            let dim = n_kv * hd;
            let rot = KvTypes { k: ty, v: ty }.k_rotation(hd);
            let k = rows(&mut rng, 5 * dim);
            let v = rows(&mut rng, 5 * dim);
            let slots = [3u32, 0, 7, 4, 9];
            let (mut ck, mut cv) = (
                cpu.alloc_kv_typed(10, dim, ty, rot).unwrap(),
                cpu.alloc_kv_typed(10, dim, ty, None).unwrap(),
            );
            let (mut gk, mut gv) = (
                gpu.alloc_kv_typed(10, dim, ty, rot).unwrap(),
                gpu.alloc_kv_typed(10, dim, ty, None).unwrap(),
            );
            cpu.kv_store(&mut ck, &mut cv, &upload(&cpu, &k), &upload(&cpu, &v), &slots, dim);
            gpu.kv_store(&mut gk, &mut gv, &upload(&gpu, &k), &upload(&gpu, &v), &slots, dim);
            for (what, c, g) in [("K", &ck, &gk), ("V", &cv, &gv)] {
                let (c, g) = bytes(&gpu, c, g);
                let bad = c.iter().zip(&g).filter(|(a, b)| a != b).count();
                if gpu.is_software() {
                    assert_eq!(
                        bad, 0,
                        "{ty} {what} rows of {n_kv}x{hd} (rotation {rot:?}): {bad} bytes differ"
                    );
                } else {
                    // Hardware division may move a scale by an ulp: a few blocks.
                    assert!(bad * 50 < c.len(), "{ty} {what}: {bad} of {} bytes differ", c.len());
                }
            }
        }
    }
}

/// RoPE with the store to quantized caches (one kernel on the GPU where each chunk of a row
/// is whole words, the unfused ops otherwise) gives the CPU's rope of q and stored bytes:
/// heads of 64 and 128 (rotated), of 96 in pairs (unrotated chunks of 64) and threes
/// (blocks at half words), NEOX and NORM, K and V of each type and mixed with f16.
#[test]
fn rope_store_to_quantized_caches_is_the_cpus() {
    let gpu = gpu();
    let cpu = CpuBackend::new(2);
    let mut rng = Rng(0x5eed_0003);
    let mut cases: Vec<KvTypes> = quantized().into_iter().map(|t| KvTypes { k: t, v: t }).collect();
    cases.push(KvTypes { k: GgmlType::Q8_0, v: GgmlType::F16 });
    cases.push(KvTypes { k: GgmlType::F16, v: GgmlType::Q4_0 });
    for types in cases {
        for (n_head, n_kv, hd, neox) in
            [(4usize, 2usize, 64usize, true), (2, 1, 128, false), (4, 2, 96, true), (3, 3, 96, false)]
        {
            let dim = n_kv * hd;
            let rope = RopeParams { n_rot: hd, neox, ..RopeParams::identity() };
            let (kr, vr) = (types.k_rotation(hd), types.v_rotation(hd));
            let n = 3;
            let (q, k, v) =
                (rows(&mut rng, n * n_head * hd), rows(&mut rng, n * dim), rows(&mut rng, n * dim));
            let (pos, slots) = ([5u32, 17, 40], [3u32, 0, 7]);
            let what = format!("{types:?} heads {n_head}/{n_kv}x{hd}");
            let mut ck = cpu.alloc_kv_typed(8, dim, types.k, kr).unwrap();
            let mut cv = cpu.alloc_kv_typed(8, dim, types.v, vr).unwrap();
            let mut gk = gpu.alloc_kv_typed(8, dim, types.k, kr).unwrap();
            let mut gv = gpu.alloc_kv_typed(8, dim, types.v, vr).unwrap();
            let (mut cq, mut ckb) = (upload(&cpu, &q), upload(&cpu, &k));
            let (mut gq, mut gkb) = (upload(&gpu, &q), upload(&gpu, &k));
            cpu.rope_kv_store(
                &mut cq,
                &mut ckb,
                &upload(&cpu, &v),
                &mut ck,
                &mut cv,
                &pos,
                &slots,
                n_head,
                n_kv,
                hd,
                &rope,
            );
            gpu.rope_kv_store(
                &mut gq,
                &mut gkb,
                &upload(&gpu, &v),
                &mut gk,
                &mut gv,
                &pos,
                &slots,
                n_head,
                n_kv,
                hd,
                &rope,
            );
            let (cqv, gqv) = (read(&cpu, &cq, q.len()), read(&gpu, &gq, q.len()));
            assert!(cqv.iter().zip(&gqv).all(|(a, b)| a.to_bits() == b.to_bits()), "{what}: q differs");
            for (which, c, g, ty) in [("K", &ck, &gk, types.k), ("V", &cv, &gv, types.v)] {
                if ty == GgmlType::F16 {
                    // (The CPU's f16 K cache is tiled: gpu_ops tests the f16 store.)
                    continue;
                }
                let (c, g) = bytes(&gpu, c, g);
                let bad = c.iter().zip(&g).filter(|(a, b)| a != b).count();
                if gpu.is_software() {
                    assert_eq!(bad, 0, "{what} {which}: {bad} bytes differ");
                } else {
                    assert!(bad * 50 < c.len(), "{what} {which}: {bad} of {} bytes differ", c.len());
                }
            }
        }
    }
}

/// A backend's caches of `types` over two sequences (one past a chunk of 256 keys), its
/// attention's output for `queries` (position, sequence).
fn attention_out<B: Backend>(
    b: &B,
    types: KvTypes,
    (n_head, n_kv, hd): (usize, usize, usize),
    queries: &[(u32, u32)],
    rng_seed: u64,
) -> Vec<f32> {
    let mut rng = Rng(rng_seed);
    let dim = n_kv * hd;
    let n_slots = 13 * 32;
    let mut kc = b.alloc_kv_typed(n_slots, dim, types.k, types.k_rotation(hd)).unwrap();
    let mut vc = b.alloc_kv_typed(n_slots, dim, types.v, types.v_rotation(hd)).unwrap();
    let tables: [&[u32]; 2] = [&[4, 1], &[0, 5, 2, 6, 7, 8, 9, 10, 11, 12]];
    for (s, len) in [40usize, 300].into_iter().enumerate() {
        let slots: Vec<u32> = (0..len).map(|p| tables[s][p / 32] * 32 + (p % 32) as u32).collect();
        let (k, v) = (rows(&mut rng, len * dim), rows(&mut rng, len * dim));
        b.kv_store(&mut kc, &mut vc, &upload(b, &k), &upload(b, &v), &slots, dim);
    }
    let n = queries.len();
    let pos: Vec<u32> = queries.iter().map(|q| q.0).collect();
    let seq: Vec<u32> = queries.iter().map(|q| q.1).collect();
    let q = upload(b, &rows(&mut rng, n * n_head * hd));
    let q_scale: Vec<f32> = (0..n).map(|i| 0.7 + 0.3 * i as f32).collect();
    let plan = AttnPlan {
        pos: &pos,
        seq: &seq,
        tables: &tables,
        block_size: 32,
        n_head,
        n_head_kv: n_kv,
        head_dim: hd,
        scale: 1.0 / (hd as f32).sqrt(),
        q_scale: &q_scale,
        softcap: 0.0,
        window: None,
        seq_len: None,
        alibi: None,
    };
    let mut out = b.alloc(n * n_head * hd).unwrap();
    b.attention(&q, &kc, &vc, &plan, &mut out);
    read(b, &out, n * n_head * hd)
}

/// Queries of both sequences: the longest sees 300 keys (two chunks of 256).
const QUERIES: [(u32, u32); 5] = [(39, 0), (10, 0), (299, 1), (0, 1), (200, 1)];

/// Attention over every cache type (K and V alike, and mixed with f16) on the exact
/// kernel: the CPU's bits (its ggml arithmetic, which the exact kernel mirrors). On the
/// split kernel (hardware GPUs' default): the f32 sums regrouped, an NMSE bar.
#[test]
fn attention_over_quantized_caches_matches_cpu() {
    let cpu = CpuBackend::new(2).with_attn_arith(AttnArith::Ggml);
    let cpu_f32 = CpuBackend::new(2).with_attn_arith(AttnArith::F32);
    let exact = gpu();
    let mut split = gpu();
    split.set_matmul_path(MatmulPath::Vec);
    let mut cases: Vec<KvTypes> = quantized().into_iter().map(|t| KvTypes { k: t, v: t }).collect();
    cases.push(KvTypes { k: GgmlType::Q8_0, v: GgmlType::F16 });
    cases.push(KvTypes { k: GgmlType::F16, v: GgmlType::Q4_0 });
    cases.push(KvTypes { k: GgmlType::Q4_0, v: GgmlType::Q8_0 });
    for types in cases {
        // Heads of 64 (rotated in 64s), of 128 (K rotated in 128s), and of 96 (not rotated).
        for heads in [(4usize, 2usize, 64usize), (2, 1, 128), (2, 2, 96)] {
            let what = format!("{types:?} heads {heads:?}");
            let c = attention_out(&cpu, types, heads, &QUERIES, 7);
            let g = attention_out(&exact, types, heads, &QUERIES, 7);
            close(&exact, &format!("{what}, exact kernel"), &g, &c);
            let c = attention_out(&cpu_f32, types, heads, &QUERIES, 7);
            let s = attention_out(&split, types, heads, &QUERIES, 7);
            let e = nmse(&s, &c);
            assert!(e < 1e-8, "{what}, split kernel: NMSE {e:e} against the CPU's f32 arithmetic");
        }
    }
}

/// A context shift over quantized keys (loaded, rotated back, roped, rotated, quantized
/// again) and values (blocks copied) gives the CPU's bytes.
#[test]
fn context_shift_of_quantized_keys_is_the_cpus() {
    let gpu = gpu();
    let cpu = CpuBackend::new(2);
    let mut rng = Rng(0x5eed_0002);
    let (n_kv, hd) = (2usize, 64usize);
    let dim = n_kv * hd;
    let rope = RopeParams { n_rot: hd, neox: true, ..RopeParams::identity() };
    for types in [
        KvTypes { k: GgmlType::Q8_0, v: GgmlType::F16 },
        KvTypes { k: GgmlType::Q4_0, v: GgmlType::Q5_1 },
        KvTypes { k: GgmlType::F16, v: GgmlType::IQ4_NL },
    ] {
        let (k, v) = (rows(&mut rng, 8 * dim), rows(&mut rng, 8 * dim));
        let slots: Vec<u32> = (0..8).collect();
        let (kr, vr) = (types.k_rotation(hd), types.v_rotation(hd));
        let mut ck = cpu.alloc_kv_typed(16, dim, types.k, kr).unwrap();
        let mut cv = cpu.alloc_kv_typed(16, dim, types.v, vr).unwrap();
        let mut gk = gpu.alloc_kv_typed(16, dim, types.k, kr).unwrap();
        let mut gv = gpu.alloc_kv_typed(16, dim, types.v, vr).unwrap();
        cpu.kv_store(&mut ck, &mut cv, &upload(&cpu, &k), &upload(&cpu, &v), &slots, dim);
        gpu.kv_store(&mut gk, &mut gv, &upload(&gpu, &k), &upload(&gpu, &v), &slots, dim);
        let (src, dst) = ([4u32, 5, 6, 7], [9u32, 10, 11, 12]);
        cpu.kv_shift(&mut ck, &mut cv, &src, &dst, -3, n_kv, hd, &rope);
        gpu.kv_shift(&mut gk, &mut gv, &src, &dst, -3, n_kv, hd, &rope);
        // The f16 K cache's layout differs between the backends (the CPU's tiles): its
        // shift is gpu_ops' test; here the quantized caches' bytes.
        for (what, c, g, ty) in [("K", &ck, &gk, types.k), ("V", &cv, &gv, types.v)] {
            if ty == GgmlType::F16 {
                continue;
            }
            let (c, g) = bytes(&gpu, c, g);
            let bad = c.iter().zip(&g).filter(|(a, b)| a != b).count();
            if gpu.is_software() {
                assert_eq!(bad, 0, "{types:?} {what} after the shift: {bad} bytes differ");
            } else {
                assert!(bad * 50 < c.len(), "{types:?} {what} after the shift: {bad} bytes differ");
            }
        }
    }
}

/// Types a cache cannot take are refused with a clear error.
#[test]
fn caches_the_gpu_cannot_hold_are_refused() {
    let gpu = gpu();
    let e =
        gpu.alloc_kv_typed(64, 128, GgmlType::Q4_K, None).err().expect("Q4_K is no cache type").to_string();
    assert!(e.contains("not a KV cache type"), "{e}");
    let e = gpu
        .alloc_kv_typed(64, 96, GgmlType::Q8_0, Some(64))
        .err()
        .expect("rows of 96 in groups of 64")
        .to_string();
    assert!(e.contains("rotation"), "{e}");
}

/// smollm2's greedy ids with `k`/`v` caches on the CPU and on `gpu` (None: the engine's
/// own GPU backend, the matmul path the adapter picks): prompt and `n` decode steps through
/// the quantized caches must be the same tokens.
fn smollm2_greedy_matches_cpu(k: GgmlType, v: GgmlType, gpu: Option<GpuBackend>, n: usize) {
    use kiln::sample::SamplerParams;
    use kiln::session::{GenerateOptions, SessionOptions};
    let opts = |device: Device| {
        EngineOptions::default()
            .with_n_ctx(128)
            .with_batch(32)
            .with_threads(2)
            .with_device(device)
            .with_attn_arith(AttnArith::Ggml)
            .with_kv_types(k, v)
    };
    let path = support::model(support::SMOLLM2.name);
    let path = path.to_str().unwrap();
    let cpu = Engine::load(path, opts(Device::Cpu)).unwrap();
    let gpu = match gpu {
        Some(g) => Engine::load_with_gpu(path, opts(Device::Gpu), g).unwrap(),
        None => Engine::load(path, opts(Device::Gpu)).unwrap(),
    };
    assert_eq!(gpu.runner().kv_bytes_per_token(), cpu.runner().kv_bytes_per_token());
    let prompt = "The capital of France is";
    let mut got = Vec::new();
    for e in [&cpu, &gpu] {
        let mut s = e.session(SessionOptions::default()).unwrap();
        s.append_text(prompt).unwrap();
        let opts = GenerateOptions::default()
            .with_max_tokens(n)
            .with_sampler(SamplerParams::greedy())
            .with_ignore_eos(true);
        got.push(s.generate(&opts, |_| std::ops::ControlFlow::Continue(())).unwrap().ids);
    }
    assert_eq!(got[1], got[0], "greedy ids on {} against the CPU", gpu.backend_name());
    eprintln!("  {n} greedy ids with {k:?} K and {v:?} V caches on {}: the CPU's", gpu.backend_name());
}

/// smollm2 with q8_0 keys and values: the GPU's greedy tokens are the CPU's.
#[test]
fn smollm2_greedy_with_q8_0_caches_matches_cpu() {
    smollm2_greedy_matches_cpu(GgmlType::Q8_0, GgmlType::Q8_0, None, 12);
}

/// The same on the hardware GPUs' default path (`MatmulPath::Vec`: q/k/v held for the
/// fused RoPE and quantizing store, split attention, the output's rotation back as the
/// o-projection's tail), which lavapipe otherwise never takes; q8_0 keys, q4_0 values.
#[test]
fn smollm2_greedy_with_quantized_caches_on_the_vec_path_matches_cpu() {
    let mut g = GpuBackend::with_fallback(AdapterPolicy::AnyGpu, false).expect("a Vulkan adapter");
    g.set_matmul_path(MatmulPath::Vec);
    // lavapipe runs the vec kernels at ~1 token/s.
    smollm2_greedy_matches_cpu(GgmlType::Q8_0, GgmlType::Q4_0, Some(g), 6);
}

/// Greedy through two context shifts with q8_0 keys on the GPU gives llama-completion's
/// text with `-ctk q8_0` (tests/kv_types.rs's fixture): the shift re-ropes quantized keys.
/// 400 tokens take lavapipe about 100 s: under KILN_FULL=1 (the shift's kernels are tested
/// against the CPU above in the fast tier).
#[test]
fn smollm2_context_shift_with_q8_0_keys_matches_llama_cpp() {
    if !support::full() {
        eprintln!("skipping the GPU context shift through 400 tokens: set KILN_FULL=1");
        return;
    }
    let fx = support::fixture_json("shift/smollm2_ctk_q8_0.json");
    let opts = EngineOptions::default()
        .with_n_ctx(fx["n_ctx"].as_u64().unwrap() as usize)
        .with_threads(2)
        .with_device(Device::Gpu)
        .with_kv_types(GgmlType::Q8_0, GgmlType::F16);
    let e = Engine::load(support::model(support::SMOLLM2.name).to_str().unwrap(), opts).unwrap();
    support::shifted_completion_matches(&e, &fx);
}
