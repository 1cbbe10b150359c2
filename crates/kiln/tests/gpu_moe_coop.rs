//! A prompt's expert matmuls on cooperative-matrix tiles, tokens grouped by expert
//! (backend/wgpu/moe_coop.rs): the grouping kernel against a host counting sort; the tile
//! expert matmul (gate and up in one dispatch, down with a row per slot) against an f64
//! product of its f16 operands and against the CPU backend's expert matmul, for several
//! formats, token counts and routings (experts with no tokens, every token on one expert);
//! the selection (batch invariance, short steps, no cooperative matrices: the old kernels);
//! and a mixture-of-experts model's prompt logits against the CPU's. On adapters without
//! cooperative matrices (lavapipe in CI) the tiles' matrix operations are emulated per
//! invocation (coop.rs `Ops::Emulated`).
#![cfg(feature = "gpu")]

use std::sync::Arc;

use half::f16;
use kiln::backend::cpu::CpuBackend;
use kiln::backend::wgpu::GpuBackend;
use kiln::backend::{Backend, ExpertInput};
use kiln::gguf::{GgufFile, GgufWriter};
use kiln::quant::{self, GgmlType};

mod support;
use support::rng::{nmse, Rng};
#[path = "common/tiles.rs"]
mod tiles;
use tiles::{full_tier, gpu, tile_gpu};

/// Row length of every expert matrix (a K-quant block).
const K: usize = 256;
/// Experts, and slots per token.
const N_EXPERT: usize = 8;
const SLOTS: usize = 2;
/// Rows of each gate and up expert (one partial 128-row tile) and of each down expert
/// (two, the last partial).
const GATE_ROWS: usize = 80;
const DOWN_ROWS: usize = 144;
const MAX_TOK: usize = 200;
const TYPES: [GgmlType; 4] = [GgmlType::Q4_K, GgmlType::Q6_K, GgmlType::Q8_0, GgmlType::F16];

/// How close the tiles come to the f64 product of their f16 operands, and to the CPU
/// backend (whose activations are 8-bit): gpu_coop.rs's bounds for the dense tiles.
const TILE_NMSE: f64 = 1e-9;
const TILE_VS_CPU_NMSE: f64 = 1e-4;

/// How each token's slots pick experts.
#[derive(Clone, Copy, Debug)]
enum Routing {
    /// Pseudo-random, never experts 2 and 5 (experts with no tokens).
    Sparse,
    /// Slot j of every token to expert (5 + j) % N_EXPERT: two experts take every token.
    OneExpert,
}

fn expert_ids(r: Routing, n: usize) -> Vec<f32> {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let mut ids = Vec::with_capacity(n * SLOTS);
    for _ in 0..n {
        let mut picked: Vec<usize> = Vec::new();
        for j in 0..SLOTS {
            let e = match r {
                Routing::OneExpert => (5 + j) % N_EXPERT,
                Routing::Sparse => loop {
                    let e = ((rng.f() + 1.0) * 4.0) as usize % N_EXPERT;
                    if e != 2 && e != 5 && !picked.contains(&e) {
                        break e;
                    }
                },
            };
            picked.push(e);
            ids.push(e as f32);
        }
    }
    ids
}

fn add_experts(w: &mut GgufWriter, rng: &mut Rng, name: &str, ty: GgmlType, rows: usize) {
    let v = rng.vec(N_EXPERT * rows * K);
    let mut data = vec![0u8; ty.row_size(K).unwrap() * rows * N_EXPERT];
    quant::quantize_row(ty, &v, &mut data).unwrap();
    w.add_tensor(name.to_string(), ty, &[K as u64, rows as u64, N_EXPERT as u64], data).unwrap();
}

/// Gate, up and down experts of each type, the activations (a row per slot, enough for the
/// down projection) and each routing's ids, as F32 tables.
fn model() -> Arc<GgufFile> {
    let mut rng = Rng(0x2545_f491_4f6c_dd1d);
    let mut w = GgufWriter::new();
    for ty in TYPES {
        add_experts(&mut w, &mut rng, &format!("gate.{}", ty.name()), ty, GATE_ROWS);
        add_experts(&mut w, &mut rng, &format!("up.{}", ty.name()), ty, GATE_ROWS);
        add_experts(&mut w, &mut rng, &format!("down.{}", ty.name()), ty, DOWN_ROWS);
    }
    let x: Vec<f32> = rng.vec(MAX_TOK * SLOTS * K).iter().map(|v| v * 3.0).collect();
    w.add_f32("x", &[K as u64, (MAX_TOK * SLOTS) as u64], &x).unwrap();
    for r in [Routing::Sparse, Routing::OneExpert] {
        w.add_f32(format!("ids.{r:?}"), &[SLOTS as u64, MAX_TOK as u64], &expert_ids(r, MAX_TOK)).unwrap();
    }
    Arc::new(GgufFile::from_bytes(w.to_bytes()).unwrap())
}

/// Rows `0..n` of the F32 table `name` on `b`.
fn table_rows<B: Backend>(b: &B, g: &Arc<GgufFile>, name: &str, n: usize) -> B::Buf {
    let t = b.load_weight(g, g.tensor(name).unwrap()).unwrap();
    let mut buf = b.alloc(n * b.weight_shape(&t).1).unwrap();
    let ids: Vec<u32> = (0..n as u32).collect();
    b.embed(&t, &ids, 1.0, &mut buf).unwrap();
    buf
}

fn read<B: Backend>(b: &B, buf: &B::Buf, n: usize) -> Vec<f32> {
    let mut out = vec![0.0; n];
    b.read(buf, &mut out);
    out
}

/// Gate and up (loaded together: one dispatch with two outputs on the tiles) of `n` tokens,
/// then down of their slots' rows: the three outputs, one after the other.
fn experts_out<B: Backend>(b: &B, g: &Arc<GgufFile>, ty: GgmlType, r: Routing, n: usize) -> Vec<f32> {
    let ts: Vec<_> =
        ["gate", "up"].iter().map(|p| g.tensor(&format!("{p}.{}", ty.name())).unwrap()).collect();
    let gu = b.load_experts_together(g, &ts, N_EXPERT).unwrap();
    let down =
        b.load_experts(g, g.tensor(&format!("down.{}", ty.name())).unwrap(), N_EXPERT, &[DOWN_ROWS]).unwrap();
    let mut ids = b.alloc(n * SLOTS).unwrap();
    b.write_rows(&mut ids, &expert_ids(r, n));
    let x = table_rows(b, g, "x", n * SLOTS);
    let ns = n * SLOTS;
    let (mut go, mut uo, mut dout) = (
        b.alloc(ns * GATE_ROWS).unwrap(),
        b.alloc(ns * GATE_ROWS).unwrap(),
        b.alloc(ns * DOWN_ROWS).unwrap(),
    );
    let input = ExpertInput { x: &x, per_slot: false, ids: &ids, rows: n, k: SLOTS };
    b.matmul_id(&[&gu[0], &gu[1]], input, &mut [&mut go, &mut uo]);
    let input = ExpertInput { x: &x, per_slot: true, ids: &ids, rows: n, k: SLOTS };
    b.matmul_id(&[&down[0]], input, &mut [&mut dout]);
    let mut v = read(b, &go, ns * GATE_ROWS);
    v.extend(read(b, &uo, ns * GATE_ROWS));
    v.extend(read(b, &dout, ns * DOWN_ROWS));
    v
}

fn f32_table(g: &Arc<GgufFile>, name: &str) -> Vec<f32> {
    let t = g.tensor(name).unwrap();
    bytemuck::cast_slice(&g.bytes()[(g.data_offset + t.offset) as usize..][..t.size as usize]).to_vec()
}

/// The same in f64 from the tiles' operands: each expert row dequantized and rounded to
/// f16, the activations rounded to f16.
fn f16_reference(g: &Arc<GgufFile>, ty: GgmlType, r: Routing, n: usize) -> Vec<f32> {
    let h = |v: f32| f16::from_f32(v).to_f64();
    let experts = |name: &str| -> Vec<Vec<f64>> {
        let t = g.tensor(&format!("{name}.{}", ty.name())).unwrap();
        let raw = &g.bytes()[(g.data_offset + t.offset) as usize..][..t.size as usize];
        let rs = ty.row_size(K).unwrap();
        let mut w = vec![0f32; K];
        (0..t.rows_cols().0)
            .map(|i| {
                quant::dequantize_row(ty, &raw[i * rs..(i + 1) * rs], &mut w).unwrap();
                w.iter().map(|&v| h(v)).collect()
            })
            .collect()
    };
    let x = f32_table(g, "x");
    let ids = f32_table(g, &format!("ids.{r:?}"));
    let xrow = |i: usize| -> Vec<f64> { x[i * K..(i + 1) * K].iter().map(|&v| h(v)).collect() };
    let mut out = Vec::new();
    for (name, rows, per_slot) in
        [("gate", GATE_ROWS, false), ("up", GATE_ROWS, false), ("down", DOWN_ROWS, true)]
    {
        let w = experts(name);
        for (s, &e) in ids[..n * SLOTS].iter().enumerate() {
            let xs = xrow(if per_slot { s } else { s / SLOTS });
            let e = e as usize;
            for row in &w[e * rows..(e + 1) * rows] {
                out.push(row.iter().zip(&xs).map(|(a, b)| a * b).sum::<f64>() as f32);
            }
        }
    }
    out
}

#[test]
fn expert_tiles_match_their_f16_reference_and_the_cpu() {
    let g = model();
    let gpu = tile_gpu();
    let cpu = CpuBackend::new(2);
    let cases =
        [(Routing::Sparse, 33), (Routing::Sparse, 100), (Routing::OneExpert, 100), (Routing::Sparse, 200)];
    for ty in TYPES {
        // The fast tier: every case on Q4_K, the others' block loads at one tile shape
        // (each type and shape is a kernel of its own to compile, slow on software adapters).
        let cases = if full_tier(&gpu) || ty == GgmlType::Q4_K { &cases[..] } else { &cases[1..2] };
        for &(r, n) in cases {
            let what = format!("{ty} {r:?} x{n}");
            let d = experts_out(&gpu, &g, ty, r, n);
            let e_ref = nmse(&d, &f16_reference(&g, ty, r, n));
            let e_cpu = nmse(&d, &experts_out(&cpu, &g, ty, r, n));
            eprintln!("{what}: NMSE {e_ref:.1e} against the f16 reference, {e_cpu:.1e} against the CPU");
            assert!(e_ref <= TILE_NMSE, "{what} on {}: NMSE {e_ref:e} against the f16 reference", gpu.name());
            assert!(e_cpu <= TILE_VS_CPU_NMSE, "{what} on {}: NMSE {e_cpu:e} against the CPU", gpu.name());
        }
    }
}

/// The host's counting sort of `ids` for tiles of `bm`: the words expert_group.wgsl writes,
/// each expert's slots in slot order.
fn host_groups(ids: &[f32], n_expert: usize, bm: usize) -> (Vec<u32>, Vec<Vec<u32>>, Vec<[u32; 3]>) {
    let mut per: Vec<Vec<u32>> = vec![Vec::new(); n_expert];
    for (s, &e) in ids.iter().enumerate() {
        per[e as usize].push(s as u32);
    }
    let counts: Vec<u32> = per.iter().map(|p| p.len() as u32).collect();
    let mut starts = vec![0u32; n_expert];
    for e in 1..n_expert {
        starts[e] = starts[e - 1] + counts[e - 1];
    }
    let mut tiles = Vec::new();
    for e in 0..n_expert {
        for j in 0..(counts[e] as usize).div_ceil(bm) {
            tiles.push([e as u32, starts[e] + (j * bm) as u32, starts[e] + counts[e]]);
        }
    }
    let mut head = counts;
    head.extend(starts);
    (head, per, tiles)
}

#[test]
fn slots_are_grouped_by_expert() {
    let gpu = tile_gpu();
    // (experts, tokens, slots a token, tile): a wide mixture's prompt (Qwen3-30B-A3B's 128
    // experts, 8 a token) with a quarter of the experts unused, the tiny ones with every
    // token on two experts, a single token.
    let mut rng = Rng(7);
    let cases: Vec<(usize, usize, usize, usize, Vec<f32>)> = vec![
        (128, 512, 8, 32, {
            let mut ids = Vec::new();
            for _ in 0..512 {
                let mut picked = Vec::new();
                while picked.len() < 8 {
                    let e = ((rng.f() + 1.0) * 48.0) as usize % 96;
                    if !picked.contains(&e) {
                        picked.push(e);
                    }
                }
                ids.extend(picked.iter().map(|&e| e as f32));
            }
            ids
        }),
        (N_EXPERT, 100, SLOTS, 64, expert_ids(Routing::OneExpert, 100)),
        (N_EXPERT, 200, SLOTS, 16, expert_ids(Routing::Sparse, 200)),
        (N_EXPERT, 1, SLOTS, 16, expert_ids(Routing::Sparse, 1)),
        (256, 64, 8, 128, (0..64 * 8).map(|s| (255 - s % 8 * 3) as f32).collect()),
    ];
    for (n_expert, tokens, k, bm, ids) in cases {
        let what = format!("{n_expert} experts, {tokens} tokens of {k}, tiles of {bm}");
        let ns = tokens * k;
        let mut buf = gpu.alloc(ns).unwrap();
        gpu.write_rows(&mut buf, &ids);
        let got = gpu.expert_groups(&buf, ns, n_expert, bm);
        let (head, per, tiles) = host_groups(&ids, n_expert, bm);
        assert_eq!(&got[..2 * n_expert], &head[..], "{what}: counts and starts");
        let list = &got[2 * n_expert..2 * n_expert + ns];
        for (e, slots) in per.iter().enumerate() {
            let start = head[n_expert + e] as usize;
            let mut run = list[start..start + slots.len()].to_vec();
            run.sort_unstable();
            assert_eq!(&run, slots, "{what}: expert {e}'s slots");
        }
        let table: Vec<[u32; 3]> = got[2 * n_expert + ns..].chunks(3).map(|c| [c[0], c[1], c[2]]).collect();
        assert!(table.len() >= tiles.len(), "{what}: a table of {} for {} tiles", table.len(), tiles.len());
        assert_eq!(&table[..tiles.len()], &tiles[..], "{what}: tiles");
        assert!(table[tiles.len()..].iter().all(|t| t[0] == u32::MAX), "{what}: past the last tile");
    }
}

#[test]
fn expert_tiles_run_only_where_chosen() {
    let g = model();
    let ty = GgmlType::Q4_K;
    let gate = |b: &GpuBackend| {
        let t = g.tensor(&format!("gate.{}", ty.name())).unwrap();
        b.load_experts(&g, t, N_EXPERT, &[GATE_ROWS]).unwrap().remove(0)
    };
    let min = kiln::backend::wgpu::coop::MIN_TOKENS;
    let tiles = tile_gpu();
    assert!(tiles.experts_on_tiles(&gate(&tiles), min, SLOTS));
    assert!(!tiles.experts_on_tiles(&gate(&tiles), min - 1, SLOTS), "a step under MIN_TOKENS");
    let mut invariant = tile_gpu();
    invariant.set_batch_invariant(true);
    assert!(!invariant.experts_on_tiles(&gate(&invariant), 100, SLOTS), "batch invariance asked for");
    let mut plain = gpu();
    plain.disable_coop();
    assert!(!plain.experts_on_tiles(&gate(&plain), 100, SLOTS), "no cooperative matrices");
    // Where not chosen the old kernels run: the vec path's bits (a slot's value is the same
    // in any batch, so a short step's are the first slots' of a longer one).
    let vec_bits = experts_out(&plain, &g, ty, Routing::Sparse, 100);
    assert_eq!(experts_out(&invariant, &g, ty, Routing::Sparse, 100), vec_bits, "batch invariant");
    let short = experts_out(&tiles, &g, ty, Routing::Sparse, min - 1);
    let n = (min - 1) * SLOTS;
    let (mut at, mut at_vec) = (0, 0);
    for rows in [GATE_ROWS, GATE_ROWS, DOWN_ROWS] {
        assert_eq!(short[at..at + n * rows], vec_bits[at_vec..at_vec + n * rows], "a short step");
        at += n * rows;
        at_vec += 100 * SLOTS * rows;
    }
    assert_ne!(experts_out(&tiles, &g, ty, Routing::Sparse, 100), vec_bits, "the tiles ran");
}

/// A mixture of experts' prompt (qwen3moe-tiny, olmoe-tiny) in one step on tiles, its
/// experts grouped by expert, against the CPU's logits: within the vec path's drift
/// (tests/moe.rs's bar for it), as the dense tiles' prompts are.
#[test]
fn moe_prompts_on_tiles_stay_close_to_the_cpu() {
    use kiln::engine::{Device, Engine, EngineOptions};
    use kiln::model::synth;
    use kiln::model::{Entry, OutputKind};
    // (The fast tier: Qwen3-MoE's; olmoe's q/k norms over whole rows in the full tier.)
    let presets: &[&str] =
        if full_tier(&gpu()) { &["qwen3moe-tiny", "olmoe-tiny"] } else { &["qwen3moe-tiny"] };
    for &preset in presets {
        let dir = std::env::temp_dir().join(format!("kiln-moe-coop-{}-{preset}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("m.gguf");
        synth::preset(preset).unwrap().build().unwrap().write_file(&path).unwrap();
        let path = path.to_str().unwrap();
        let opts = EngineOptions::default().with_n_ctx(128).with_batch(64).with_threads(2);
        let logits = |e: &Engine| {
            let r = e.runner();
            let seq = r.new_seq();
            let entries: Vec<Entry> =
                (0..48u32).map(|i| Entry { seq, token: 32 + (i * 37) % 95, output: true }).collect();
            let out = r.decode(&entries, OutputKind::Logits).unwrap();
            r.free_seq(seq);
            out
        };
        let cpu = logits(&Engine::load(path, opts.clone().with_device(Device::Cpu)).unwrap());
        let gpu = logits(&Engine::load_with_gpu(path, opts.with_device(Device::Gpu), tile_gpu()).unwrap());
        std::fs::remove_dir_all(&dir).ok();
        let n_vocab = cpu.len() / 48;
        let mut worst = 0f64;
        for (i, (c, d)) in cpu.chunks(n_vocab).zip(gpu.chunks(n_vocab)).enumerate() {
            let e = nmse(d, c);
            worst = worst.max(e);
            assert!(e < 2e-2, "{preset}: token {i}: logits NMSE {e:e} against the CPU");
        }
        eprintln!("{preset}: logits NMSE at most {worst:.1e} against the CPU");
    }
}
