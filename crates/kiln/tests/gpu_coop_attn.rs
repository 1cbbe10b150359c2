//! Prompt attention on cooperative matrices (backend/wgpu/coop_attn.rs,
//! attention_coop.wgsl): its WGSL compiles to SPIR-V for every head size it takes; its
//! results match the CPU backend's attention (causal, sliding window, GQA, head sizes 64
//! and 128, prompts continued after earlier tokens, soft-capped scores; workgroups sized
//! for larger subgroups than the adapter runs), with the output's quantize for the next
//! matmul fused, and in smollm2's forward within the vec path's drift from the CPU's
//! logits; and it runs only where chosen (enough tokens, batch invariance not asked for,
//! cooperative matrices, f16 caches, causal without ALiBi, a block of queries from one
//! sequence). On adapters without cooperative matrices (lavapipe in CI) the matrix
//! operations are emulated per invocation (coop.rs `Ops::Emulated`), which tests everything
//! around them.
#![cfg(feature = "gpu")]

use std::sync::Arc;

use kiln::backend::cpu::CpuBackend;
use kiln::backend::wgpu::coop::{CoopCaps, Ops};
use kiln::backend::wgpu::coop_attn;
use kiln::backend::wgpu::kernels::{self, Kernel};
use kiln::backend::wgpu::{GpuBackend, GpuKv};
use kiln::backend::{AttnPlan, Backend};
use kiln::gguf::{GgufFile, GgufWriter};
use kiln::model::{Entry, Model, ModelRunner, OutputKind, Runner};
use kiln::quant::{self, GgmlType};
use kiln::AttnArith;

use support::rng::{nmse, Rng};
#[path = "common/tiles.rs"]
mod tiles;
use tiles::{gpu, tile_gpu};

mod support;

/// How close the tiles come to the CPU backend: the weights rounded to f16 before they
/// multiply the values (the CPU's f32 arithmetic keeps them in f32), sums in another order
/// (gpu_coop.rs's bound for the tile matmul against the CPU).
const TILE_VS_CPU_NMSE: f64 = 1e-4;

/// Slots per block of the KV pool.
const BLOCK: usize = 16;

/// One attention call: heads (n_head, n_head_kv, head_dim), a sliding window, `prev`
/// positions cached before the `n` query tokens, and the scores' soft cap (0: none).
#[derive(Clone, Copy, Debug)]
struct Case {
    heads: (usize, usize, usize),
    window: Option<u32>,
    prev: usize,
    n: usize,
    softcap: f32,
}

fn read<B: Backend>(b: &B, buf: &B::Buf, n: usize) -> Vec<f32> {
    let mut out = vec![0.0; n];
    b.read(buf, &mut out);
    out
}

/// A weight of `rows` rows of k values of `ty`, for the matmul after the attention.
fn weight_file(k: usize, rows: usize, ty: GgmlType) -> Arc<GgufFile> {
    let mut rng = Rng(0x5eed_1234_abcd_0001);
    let mut w = GgufWriter::new();
    let mut data = vec![0u8; ty.row_size(k).unwrap() * rows];
    quant::quantize_row(ty, &rng.vec(rows * k), &mut data).unwrap();
    w.add_tensor("w".to_string(), ty, &[k as u64, rows as u64], data).unwrap();
    Arc::new(GgufFile::from_bytes(w.to_bytes()).unwrap())
}

/// The case's attention on `b`: keys and values of every position stored in a pool of
/// blocks in reverse order, queries of the last `n` positions (dimension 0 of every head
/// large, and of the keys growing with the position, so the scores' maximum climbs along
/// the keys and the kernel's rescales run); `seqs` the sequence of each query (all 0 where
/// empty; a second sequence has its own blocks). `check` sees the plan and the caches
/// before the call; `then`: the output through a matmul of this weight (`split`: read
/// first, so the two run unfused), returned before the attention's output.
fn attention_out<B: Backend>(
    b: &B,
    c: Case,
    seqs: &[u32],
    check: impl FnOnce(&AttnPlan, &B::Kv, &B::Kv),
    then: Option<(&Arc<GgufFile>, bool)>,
) -> Vec<f32> {
    let (n_head, n_kv, hd) = c.heads;
    let kv_dim = n_kv * hd;
    let total = c.prev + c.n;
    let n_blocks = total.div_ceil(BLOCK);
    let mut rng = Rng(0x2545_f491_4f6c_dd1d ^ (total * 31 + hd) as u64);
    // Sequence s's blocks: the pool's blocks from the end, after the previous sequence's.
    let tables: Vec<Vec<u32>> = (0..2)
        .map(|s| (0..n_blocks).map(|i| (2 * n_blocks - 1 - (s * n_blocks + i)) as u32).collect())
        .collect();
    let mut kc = b.alloc_kv(2 * n_blocks * BLOCK * kv_dim).unwrap();
    let mut vc = b.alloc_kv(2 * n_blocks * BLOCK * kv_dim).unwrap();
    for table in &tables {
        let mut k = rng.vec(total * kv_dim);
        for p in 0..total {
            for h in 0..n_kv {
                k[p * kv_dim + h * hd] = 0.05 * p as f32;
            }
        }
        let v = rng.vec(total * kv_dim);
        let (mut kb, mut vb) = (b.alloc(total * kv_dim).unwrap(), b.alloc(total * kv_dim).unwrap());
        b.write_rows(&mut kb, &k);
        b.write_rows(&mut vb, &v);
        let slots: Vec<u32> =
            (0..total).map(|p| table[p / BLOCK] * BLOCK as u32 + (p % BLOCK) as u32).collect();
        b.kv_store(&mut kc, &mut vc, &kb, &vb, &slots, kv_dim);
    }
    let mut q: Vec<f32> = rng.vec(c.n * n_head * hd).iter().map(|v| 6.0 * v).collect();
    for r in 0..c.n * n_head {
        q[r * hd] = 20.0;
    }
    let mut qb = b.alloc(q.len()).unwrap();
    b.write_rows(&mut qb, &q);
    let pos: Vec<u32> = (c.prev..total).map(|p| p as u32).collect();
    let seq: Vec<u32> = if seqs.is_empty() { vec![0; c.n] } else { seqs.to_vec() };
    let table_refs: Vec<&[u32]> = tables.iter().map(|t| &t[..]).collect();
    let q_scale: Vec<f32> = (0..c.n).map(|i| 0.9 + 0.01 * i as f32).collect();
    let plan = AttnPlan {
        pos: &pos,
        seq: &seq,
        tables: &table_refs,
        block_size: BLOCK,
        n_head,
        n_head_kv: n_kv,
        head_dim: hd,
        scale: 1.0 / (hd as f32).sqrt(),
        q_scale: &q_scale,
        softcap: c.softcap,
        window: c.window,
        seq_len: None,
        alibi: None,
    };
    check(&plan, &kc, &vc);
    let mut out = b.alloc(c.n * n_head * hd).unwrap();
    b.attention(&qb, &kc, &vc, &plan, &mut out);
    let mut res = Vec::new();
    if let Some((g, split)) = then {
        if split {
            read(b, &out, 1);
        }
        let w = b.load_weight(g, g.tensor("w").unwrap()).unwrap();
        let rows = b.weight_shape(&w).0;
        let mut y = b.alloc(c.n * rows).unwrap();
        b.matmul(&w, &out, c.n, &mut y);
        res = read(b, &y, c.n * rows);
    }
    res.extend(read(b, &out, c.n * n_head * hd));
    res
}

/// Asserts the tiles take the plan.
fn on_tiles(gpu: &GpuBackend) -> impl FnOnce(&AttnPlan, &GpuKv, &GpuKv) + '_ {
    move |plan, kc, vc| assert!(gpu.attention_tiles(plan, kc, vc).is_some(), "{plan:?} not on tiles")
}

/// Asserts the tiles do not take the plan.
fn off_tiles(gpu: &GpuBackend) -> impl FnOnce(&AttnPlan, &GpuKv, &GpuKv) + '_ {
    move |plan, kc, vc| assert!(gpu.attention_tiles(plan, kc, vc).is_none(), "{plan:?} on tiles")
}

#[test]
fn tile_attention_matches_the_cpu() {
    let cpu = CpuBackend::new(2);
    let gpu = tile_gpu();
    let case = |heads, window, prev, n, softcap| Case { heads, window, prev, n, softcap };
    let cases = [
        // Causal from position 0, a partial block of queries (head size 64, MHA).
        case((4, 4, 64), None, 0, 40, 0.0),
        // GQA 4:1, a prompt continued after 37 cached tokens (two blocks of queries).
        case((8, 2, 64), None, 37, 70, 0.0),
        // Sliding window across tiles of keys (head size 128, GQA 4:1), continued.
        case((4, 1, 128), Some(24), 21, 48, 0.0),
        // Head size 128, GQA 3:1, soft-capped scores (gemma2's).
        case((6, 2, 128), None, 5, 33, 30.0),
        // Head size 32 (padded rows of scores even in 32 KiB of workgroup memory), GQA 2:1.
        case((4, 2, 32), None, 10, 50, 0.0),
    ];
    for c in cases {
        let d = attention_out(&gpu, c, &[], on_tiles(&gpu), None);
        let r = attention_out(&cpu, c, &[], |_, _, _| {}, None);
        let e = nmse(&d, &r);
        eprintln!("{c:?}: tiles vs CPU {e:.1e}");
        assert!(e <= TILE_VS_CPU_NMSE, "{c:?} on {}: NMSE {e:e} against the CPU", gpu.name());
    }
}

#[test]
fn tile_attention_takes_subgroups_smaller_than_the_largest() {
    // An adapter may run subgroups smaller than its largest, which sizes the workgroup: the
    // workgroup then holds more subgroups than it has blocks of queries for (the extra ones
    // repeat the last block into a slot of their own and store nothing), and each row of
    // scores has fewer invocations than the kernel was written for. Workgroups sized for
    // subgroups of at least 32 while the adapter runs its own (8 on lavapipe).
    let cpu = CpuBackend::new(2);
    let mut gpu = tile_gpu();
    let sg = gpu.coop_caps().expect("tiles").max_subgroup;
    gpu.set_coop_max_subgroup((2 * sg).max(32));
    let case = |heads, window, prev, n| Case { heads, window, prev, n, softcap: 0.0 };
    for c in [case((8, 2, 64), None, 37, 70), case((4, 1, 128), Some(24), 21, 48)] {
        let d = attention_out(&gpu, c, &[], on_tiles(&gpu), None);
        let r = attention_out(&cpu, c, &[], |_, _, _| {}, None);
        let e = nmse(&d, &r);
        assert!(
            e <= TILE_VS_CPU_NMSE,
            "{c:?} on {} in larger workgroups: NMSE {e:e} against the CPU",
            gpu.name()
        );
    }
}

#[test]
fn tile_attention_quantizes_for_the_next_matmul() {
    // The output projection of a prompt chunk runs on tiles too (f16 activations, quantize
    // mode 4), made by the attention kernel's tail as it stores its output: the same bits
    // as the quantize on its own, one dispatch fewer.
    let c = Case { heads: (8, 2, 64), window: None, prev: 3, n: 40, softcap: 0.0 };
    let g = weight_file(8 * 64, 64, GgmlType::Q4_K);
    let gpu = tile_gpu();
    let d0 = gpu.counts().get().1;
    let fused = attention_out(&gpu, c, &[], on_tiles(&gpu), Some((&g, false)));
    let d1 = gpu.counts().get().1;
    let split = attention_out(&gpu, c, &[], on_tiles(&gpu), Some((&g, true)));
    let d2 = gpu.counts().get().1;
    assert_eq!((d2 - d1) - (d1 - d0), 1, "dispatches saved");
    let bad = fused.iter().zip(&split).filter(|(a, b)| a.to_bits() != b.to_bits()).count();
    assert_eq!(bad, 0, "{bad} values differ fused and unfused on {}", gpu.name());
    let cpu = CpuBackend::new(2);
    let r = attention_out(&cpu, c, &[], |_, _, _| {}, Some((&g, false)));
    let e = nmse(&fused, &r);
    assert!(e <= TILE_VS_CPU_NMSE, "attention then matmul on {}: NMSE {e:e} against the CPU", gpu.name());
}

#[test]
fn tile_attention_runs_only_where_chosen() {
    // Batch invariance asked for, or no cooperative matrices (the forced-off selection,
    // what lavapipe has): the portable kernels, the same bits either way; a chunk under
    // `coop::MIN_TOKENS`, a block of queries from two sequences, heads over
    // `coop_attn::MAX_HEAD_DIM`: not on tiles either.
    let c = Case { heads: (8, 2, 64), window: None, prev: 0, n: 40, softcap: 0.0 };
    let tiles = tile_gpu();
    let mut invariant = tile_gpu();
    invariant.set_batch_invariant(true);
    let mut no_tiles = gpu();
    no_tiles.disable_coop();
    assert!(!no_tiles.has_coop());
    let a = attention_out(&invariant, c, &[], off_tiles(&invariant), None);
    let b = attention_out(&no_tiles, c, &[], off_tiles(&no_tiles), None);
    let t = attention_out(&tiles, c, &[], on_tiles(&tiles), None);
    let bad = a.iter().zip(&b).filter(|(x, y)| x.to_bits() != y.to_bits()).count();
    assert_eq!(bad, 0, "batch invariant and without tiles: {bad} values differ");
    assert_ne!(a, t, "the tiles' rounding looks like the portable kernels'");
    let min = kiln::backend::wgpu::coop::MIN_TOKENS;
    let short = Case { n: min - 1, ..c };
    attention_out(&tiles, short, &[], off_tiles(&tiles), None);
    attention_out(&tiles, Case { n: min, ..c }, &[], on_tiles(&tiles), None);
    // Two sequences: the second starts inside the first block of queries.
    let mut seqs = vec![0u32; c.n];
    seqs[c.n - 5..].fill(1);
    attention_out(&tiles, c, &seqs, off_tiles(&tiles), None);
    let wide = Case { heads: (2, 1, 256), ..c };
    attention_out(&tiles, wide, &[], off_tiles(&tiles), None);
}

#[test]
fn tile_attention_compiles_for_cooperative_matrices() {
    // Every head size the kernel takes, with and without the quantizing tail, on
    // cooperative matrices and emulated: WGSL parsed and validated by naga with the
    // capabilities the tile path requests, then written as SPIR-V (what a Vulkan driver
    // receives), so a shader error shows here rather than on a GPU with the feature.
    // (48 KiB of workgroup memory: tiles of 32 keys; 32 KiB: of 16 keys for the larger heads.)
    for (emulated, storage) in [(false, 49152), (false, 32768), (true, 49152)] {
        let caps = CoopCaps { max_subgroup: 32, workgroup_storage: storage, max_invocations: 1024, emulated };
        for hd in (16..=coop_attn::MAX_HEAD_DIM).step_by(16) {
            let s = coop_attn::shape(&caps, hd).expect("fits");
            assert_eq!(s.ops, if emulated { Ops::Emulated } else { Ops::Coop });
            assert!(s.storage() <= storage, "{s:?}");
            if storage == 49152 {
                assert_eq!((s.bk, s.pad), (32, 4), "{s:?}");
            }
            for tail in [false, true] {
                let k = Kernel::AttnCoop(tail, s);
                let src = kernels::assemble(k, true, true);
                let what = format!("{k:?}");
                tiles::compiles_to_spirv(&src, &what);
            }
        }
        for hd in [8, 40, 256] {
            assert!(coop_attn::shape(&caps, hd).is_none(), "head size {hd} on tiles");
        }
    }
}

/// smollm2's logits for a 45-token prompt (one chunk), on `gpu` and on the CPU.
fn smollm2_prompt_logits(gpu: GpuBackend) -> (Vec<f32>, Vec<f32>, usize) {
    let path = support::model(support::SMOLLM2.name);
    let gguf = Arc::new(GgufFile::open(&path).unwrap());
    let opts = kiln::engine::EngineOptions::default().with_n_ctx(256).with_batch(64).with_threads(2);
    let cpu =
        kiln::engine::Engine::load(path.to_str().unwrap(), opts.with_attn_arith(AttnArith::F32)).unwrap();
    let rg = ModelRunner::new(Model::load(&gguf, gpu).unwrap(), 256, 64).unwrap();
    let text = "The quick brown fox jumps over the lazy dog, and then it runs into the forest where \
                the trees are tall and the river is cold. The capital of France is";
    let ids = cpu.tokenizer().encode(text, true, false).unwrap();
    assert!(ids.len() >= kiln::backend::wgpu::coop::MIN_TOKENS, "{} tokens", ids.len());
    let (rc, sc, sg) = (cpu.runner(), cpu.runner().new_seq(), rg.new_seq());
    let e = |seq, t: &[u32]| t.iter().map(|&token| Entry { seq, token, output: true }).collect::<Vec<_>>();
    let lc = rc.decode(&e(sc, &ids), OutputKind::Logits).unwrap();
    let lg = rg.decode(&e(sg, &ids), OutputKind::Logits).unwrap();
    (lg, lc, cpu.config().n_vocab)
}

/// The bar on one token's logits: the vec path's drift from the CPU through smollm2's 30
/// layers (Q8 roundings flipped by last-bit differences, compounding) reaches 2.4e-2 on
/// this prompt with the portable attention (measured on lavapipe; the tiles 3.1e-2, their
/// mean over the tokens 3e-3 against the portable kernels' 2.6e-3).
const DRIFT_NMSE: f64 = 5e-2;
const DRIFT_MEAN_NMSE: f64 = 1e-2;

#[test]
fn smollm2_prompt_with_tile_attention_stays_close_to_the_cpu() {
    // A real model's prompt chunk with its attention on tiles (GQA 3:1, head size 64; the
    // matmuls on the vec path) against the CPU's f32 attention: logits within the vec
    // path's drift, the same top token wherever the CPU's margin is at least 0.25, and not
    // the portable kernels' bits.
    let mut gpu = tile_gpu();
    gpu.set_shape_choice(Some(Arc::new(|_, _, _| None)));
    let (tiles, cpu, n_vocab) = smollm2_prompt_logits(gpu);
    let mut portable = self::gpu();
    portable.disable_coop();
    let (plain, _, _) = smollm2_prompt_logits(portable);
    assert_ne!(tiles, plain, "the same logits as the portable kernels: tiles not taken");
    let top = |l: &[f32]| {
        let mut v: Vec<(usize, f32)> = l.iter().copied().enumerate().collect();
        v.sort_by(|a, b| b.1.total_cmp(&a.1));
        (v[0].0, v[0].1 - v[1].1)
    };
    let mut sum = 0.0;
    let n = cpu.len() / n_vocab;
    for (i, (g, c)) in tiles.chunks(n_vocab).zip(cpu.chunks(n_vocab)).enumerate() {
        let e = nmse(g, c);
        sum += e;
        let (tc, margin) = top(c);
        assert!(e < DRIFT_NMSE, "token {i}: logits NMSE {e:e}");
        if margin >= 0.25 {
            assert_eq!(top(g).0, tc, "token {i}: top token (CPU margin {margin})");
        }
    }
    let mean = sum / n as f64;
    eprintln!("logits NMSE against the CPU, mean over {n} tokens: {mean:.1e}");
    assert!(mean < DRIFT_MEAN_NMSE, "mean logits NMSE {mean:e}");
}
