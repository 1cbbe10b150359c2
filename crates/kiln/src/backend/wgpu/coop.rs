//! The cooperative-matrix (tensor core) matmul: which adapters run it, its tile shapes,
//! and the WGSL statements of its matrix operations (shaders/matmul_coop.wgsl).

use crate::quant::GgmlType;

/// What an adapter offers the tile kernels: 16x16x16 f16 products with f32 accumulators,
/// f16 in shaders, subgroups (their largest size sizes the workgroup), and workgroup memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CoopCaps {
    pub max_subgroup: u32,
    pub workgroup_storage: u32,
    pub max_invocations: u32,
    /// The matrix operations written out on each invocation instead (`Ops::Emulated`).
    pub emulated: bool,
}

/// How a tile kernel's subgroup matrix operations are written: on cooperative matrices,
/// or (tests on adapters without them, such as lavapipe) emulated: every invocation of a
/// subgroup holds and computes the subgroup's whole 16x16 tiles in private memory. The
/// emulation takes the same tiles from the same workgroup memory, so it tests everything
/// around the matrix operations (staging, dequantization, indexing, stores).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Ops {
    Coop,
    Emulated,
}

/// A tile kernel's shape: each of SGM x SGN subgroups computes FM x FN tiles of 16 tokens
/// by 16 weight rows; the workgroup has NSG = SGM x SGN subgroups of up to `sg`
/// invocations; the loads of `ahead` stages are in flight; k is split over `ks` workgroups
/// (1: not split), whose partial sums `Kernel::CoopReduce` adds. The kernel reads the
/// number of splits from its parameters: one pipeline serves every split count
/// (`kernel_key`), so a batch size met for the first time never waits for a driver compile.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct CoopShape {
    pub fm: u32,
    pub fn_: u32,
    pub sgm: u32,
    pub sgn: u32,
    pub sg: u32,
    pub ks: u32,
    pub ahead: u32,
    pub ops: Ops,
}

impl CoopShape {
    /// Tokens per workgroup.
    pub fn bm(self) -> u32 {
        16 * self.fm * self.sgm
    }
    /// Weight rows per workgroup.
    pub fn bn(self) -> u32 {
        16 * self.fn_ * self.sgn
    }
    /// The shape a pipeline is built for: split or not (the count is a parameter).
    pub fn kernel_key(self) -> CoopShape {
        CoopShape { ks: self.ks.min(2), ..self }
    }
    /// Weight rows each invocation stages (the workgroup may have fewer invocations than
    /// the tile has rows).
    pub fn rows_per_invocation(self) -> u32 {
        self.bn().div_ceil(self.wgs())
    }
    fn nsg(self) -> u32 {
        self.sgm * self.sgn
    }
    fn wgs(self) -> u32 {
        self.nsg() * self.sg
    }
    /// Stages a loop iteration of the kernel runs: a multiple of both the two buffers and
    /// the `ahead` register sets, so every index into them is static.
    fn unroll(self) -> u32 {
        if self.ahead.is_multiple_of(2) {
            self.ahead
        } else {
            2 * self.ahead
        }
    }
    /// Workgroup memory in bytes: two stages of f16 rows (80 bytes each), a result tile
    /// per subgroup and the workgroup's tile (16 bytes).
    pub fn storage(self) -> u32 {
        2 * (self.bm() + self.bn()) * 80 + self.nsg() * 1024 + 256 + 16
    }
}

/// Weight types the tile kernel dequantizes (the rest stay on the vec path).
pub fn coop_type(ty: GgmlType) -> bool {
    use GgmlType::*;
    matches!(ty, F16 | Q4_0 | Q4_1 | Q5_0 | Q8_0 | Q4_K | Q5_K | Q6_K)
}

/// Tokens from which a matmul runs on the tiles (below, the vec path's integer dots, which
/// are batch invariant). On an H100 (Llama-3-8B Q4_K_M, steps of 16 tokens) the tiles ran
/// 846 tok/s against the vec path's 923; from 32 tokens they win (a 4096 x 4096 Q4_K weight
/// at 32 tokens: 30.6 us against 77.8).
pub const MIN_TOKENS: usize = 32;

/// Weight-row tiles under which a narrower tile (half the rows) is taken so more
/// workgroups share the weight reads of a small batch.
const MIN_ROW_TILES: usize = 64;

/// Workgroups a matmul should have at least: fewer, and k is split. Tiles of up to 64 tokens
/// wait on memory more than on their products and want several workgroups per
/// multiprocessor in flight; 128-token tiles are busy with their products, and a split only
/// adds its partial sums' traffic. (examples/gpu_tiles, 4096 x 4096 Q4_K: on an H200 at 512
/// tokens 242 us whole, 311 us in 4 splits; on an H100 at 32 tokens 30.6 us in 4 splits,
/// 32.9 us in 8.)
const MIN_WORKGROUPS: usize = 1024;
const MIN_WORKGROUPS_WIDE: usize = 128;

/// Stages whose loads are in flight for a tile of shape `s` on weights of `k` values a row
/// (its workgroups each take `s.ks`'s share of k's 32-value stages): two for 128-token
/// tiles, whose products are long enough for the second set's registers to pay; for
/// smaller tiles four where a workgroup runs many stages and holds few accumulators (the
/// extra loads at a split's start and end then cost less than the overlap gains, and the
/// registers suffice), else one. The sweep behind it: docs/benchmarks.md.
pub fn ahead(s: CoopShape, k: usize) -> u32 {
    let stages = (k / 32).div_ceil(s.ks as usize);
    if s.bm() >= 128 {
        2
    } else if s.fm * s.fn_ <= 4 && stages >= LONG_SPLIT {
        4
    } else {
        1
    }
}

/// Stages a workgroup runs from which small tiles load four ahead.
const LONG_SPLIT: usize = 64;

/// Most splits of k, and the fewest 32-value chunks a split takes.
const MAX_SPLITS: usize = 4;
const MIN_SPLIT_CHUNKS: usize = 8;

/// The shape for `tokens` tokens of a weight of `rows` rows of `k` values: 128 x 128 tiles
/// (4 x 4 tiles a subgroup) for prompts, fewer tokens a tile for decode batches (down to
/// 16), narrower row tiles where the rows would give few workgroups, the first of these
/// whose workgroup the adapter can hold (memory, invocations; None if none fits); and k
/// split where the tiles alone give fewer than `MIN_WORKGROUPS` workgroups.
pub fn shape(caps: &CoopCaps, tokens: usize, rows: usize, k: usize) -> Option<CoopShape> {
    let ops = if caps.emulated { Ops::Emulated } else { Ops::Coop };
    let sg = caps.max_subgroup;
    let s = |fm, fn_, sgm, sgn| CoopShape { fm, fn_, sgm, sgn, sg, ks: 1, ahead: 1, ops };
    let candidates = match tokens {
        96.. => [s(4, 4, 2, 2), s(4, 2, 2, 2), s(2, 2, 2, 2)],
        33..=95 => [s(4, 2, 1, 4), s(4, 1, 1, 4), s(2, 1, 1, 4)],
        17..=32 => [s(2, 2, 1, 4), s(2, 1, 1, 4), s(1, 1, 1, 4)],
        _ => [s(1, 2, 1, 4), s(1, 1, 1, 4), s(1, 1, 1, 2)],
    };
    let mut c = candidates
        .into_iter()
        .map(|mut c| {
            if c.sgm == 1 && c.fn_ > 1 && rows.div_ceil(c.bn() as usize) < MIN_ROW_TILES {
                c.fn_ /= 2;
            }
            c
        })
        .find(|c| c.storage() <= caps.workgroup_storage && c.wgs() <= caps.max_invocations)?;
    let tiles = tokens.div_ceil(c.bm() as usize) * rows.div_ceil(c.bn() as usize);
    let min_workgroups = if c.bm() >= 128 { MIN_WORKGROUPS_WIDE } else { MIN_WORKGROUPS };
    let ks = min_workgroups.div_ceil(tiles).min(MAX_SPLITS).min(k / 32 / MIN_SPLIT_CHUNKS).max(1);
    // Splits of whole chunks, none empty.
    c.ks = (k / 32).div_ceil((k / 32).div_ceil(ks)) as u32;
    c.ahead = ahead(c, k);
    Some(c)
}

/// The kernel's source after the shared parts: its constants, the emulated operations
/// where asked, and the body with its matrix statements written out.
pub fn source(s: CoopShape, body: &str) -> String {
    let (nsg, wgs) = (s.nsg(), s.wgs());
    let mut out = format!(
        "const BM: u32 = {}u;\nconst BN: u32 = {}u;\nconst FM: u32 = {}u;\nconst FN: u32 = {}u;\n\
         const SGM: u32 = {}u;\nconst NSG: u32 = {nsg}u;\nconst WGS: u32 = {wgs}u;\n\
         const NW: u32 = {}u;\nconst NX: u32 = {}u;\nconst AHEAD: u32 = {}u;\n",
        s.bm(),
        s.bn(),
        s.fm,
        s.fn_,
        s.sgm,
        s.rows_per_invocation(),
        (4 * s.bm()).div_ceil(wgs),
        s.ahead,
    );
    // The number of splits of k: the dispatch's (parameter 6) where k is split.
    out.push_str(if s.ks > 1 {
        "fn n_splits() -> u32 {\n    return prm[6];\n}\n"
    } else {
        "fn n_splits() -> u32 {\n    return 1u;\n}\n"
    });
    if s.ops == Ops::Emulated {
        out.push_str(EMULATED);
    }
    let (init, mma, store) = match s.ops {
        Ops::Coop => coop_statements(s),
        Ops::Emulated => (EMU_INIT.to_string(), EMU_MMA.to_string(), EMU_STORE.to_string()),
    };
    let body = body
        .replace("//STAGES\n", &stages(s, &init, &mma))
        .replace("//STORE\n", &store)
        .replace("@workgroup_size(WGS)", &format!("@workgroup_size({wgs})"));
    out.push_str(&body);
    out
}

/// The kernel's stages after the first (matmul_coop.wgsl `//STAGES`): the loads of stages
/// 1..ahead issued, the accumulators started (`init`), then a loop of `unroll()` stages,
/// stage u of an iteration in buffer u % 2 with its words in register set u % ahead: it
/// issues the loads of the stage `ahead` after it into that set, runs its products (`mma`),
/// dequantizes the next stage into the other buffer and waits at the barrier.
fn stages(s: CoopShape, init: &str, mma: &str) -> String {
    let a = s.ahead;
    let mut out = String::new();
    for j in 1..a {
        out.push_str(&format!("    fetch(c0 + min({j}u, ns - 1u), li, r0, {j}u);\n"));
    }
    out.push_str(init);
    let u_n = s.unroll();
    out.push_str(&format!("    for (var s = 0u; s < ns; s = s + {u_n}u) {{\n"));
    for u in 0..u_n {
        let (b, nb) = (u % 2, (u + 1) % 2);
        out.push_str(&format!(
            "        fetch(c0 + min(s + {}u, ns - 1u), li, r0, {}u);\n        {{\n            \
             let xb = ({b}u * BM + bm) * SV;\n            let wb = ({b}u * BN + bn) * SV;\n{mma}        }}\n\
             \x20       put(c0 + min(s + {}u, ns - 1u), {nb}u, li, {}u);\n        workgroupBarrier();\n",
            u + a,
            u % a,
            u + 1,
            (u + 1) % a,
        ));
        if u + 1 < u_n {
            out.push_str(&format!("        if s + {}u >= ns {{\n            break;\n        }}\n", u + 1));
        }
    }
    out.push_str("    }\n");
    out
}

/// The enable directives a kernel's text starts with.
pub fn enables(s: CoopShape) -> &'static str {
    match s.ops {
        Ops::Coop => "enable f16;\nenable wgpu_cooperative_matrix;\n",
        Ops::Emulated => "enable f16;\n",
    }
}

/// The statements of the subgroup's matrix operations on cooperative matrices, written out
/// (no arrays of matrices, no loops: every index static): the accumulators `c_i_j` started
/// from the zeros in `cs` (filled before the first barrier); per 16-value step of a
/// 32-value stage, its FM tiles of tokens `a_i` (row-major: a token's values contiguous)
/// and FN tiles of weight rows `b_j` (column-major: a row's values contiguous) loaded once,
/// then their FM x FN products; at the end each result tile, row-major (a token's 16 rows
/// contiguous), through the subgroup's `cs` tile to `store`.
fn coop_statements(s: CoopShape) -> (String, String, String) {
    let (mut init, mut mma, mut store) = (String::new(), String::new(), String::new());
    for i in 0..s.fm {
        for j in 0..s.fn_ {
            init.push_str(&format!("    var c_{i}_{j} = coopLoadT<coop_mat16x16<f32, C>>(&cs[0], 16u);\n"));
        }
    }
    for kk in 0..2 {
        mma.push_str("        {\n");
        for i in 0..s.fm {
            let at = 16 * i * 10 + 4 * kk;
            mma.push_str(&format!(
                "            let a{i} = coopLoadT<coop_mat16x16<f16, A>>(&xs[xb + {at}u], SV);\n"
            ));
        }
        for j in 0..s.fn_ {
            let at = 16 * j * 10 + 4 * kk;
            mma.push_str(&format!(
                "            let b{j} = coopLoad<coop_mat16x16<f16, B>>(&ws[wb + {at}u], SV);\n"
            ));
        }
        for i in 0..s.fm {
            for j in 0..s.fn_ {
                mma.push_str(&format!("            c_{i}_{j} = coopMultiplyAdd(a{i}, b{j}, c_{i}_{j});\n"));
            }
        }
        mma.push_str("        }\n");
    }
    for i in 0..s.fm {
        for j in 0..s.fn_ {
            store.push_str(&format!("    coopStoreT(c_{i}_{j}, &cs[co], 16u);\n"));
            store.push_str(
                &STORE_TILE.replace("TI", &format!("{}u", 16 * i)).replace("TJ", &format!("{}u", 16 * j)),
            );
        }
    }
    (init, mma, store)
}

/// A result tile in `cs` to `store`, by the subgroup's invocations in turn (TI, TJ: its
/// first token and row in the subgroup's block).
const STORE_TILE: &str = "    workgroupBarrier();
    for (var e = sgi; e < 256u; e = e + sgn) {
        let t = t0 + bm + TI + e / 16u;
        let r = r0 + bn + TJ + e % 16u;
        if live && t < n_tok && r < n_rows {
            store(t, r, cs[co + e]);
        }
    }
    workgroupBarrier();
";

/// The emulated statements, in loops (one call site each: quick to compile on software
/// adapters).
const EMU_INIT: &str = "    for (var c = 0u; c < FM * FN; c = c + 1u) {
        emu_zero(c);
    }
";
const EMU_MMA: &str = "        for (var kk = 0u; kk < 2u; kk = kk + 1u) {
            for (var i = 0u; i < FM; i = i + 1u) {
                emu_load_a(i, xb + 16u * i * SV + 4u * kk);
            }
            for (var j = 0u; j < FN; j = j + 1u) {
                emu_load_b(j, wb + 16u * j * SV + 4u * kk);
            }
            for (var c = 0u; c < FM * FN; c = c + 1u) {
                emu_mma(c / FN, c % FN, c);
            }
        }
";
const EMU_STORE: &str = "    for (var c = 0u; c < FM * FN; c = c + 1u) {
        emu_store(c, co, sgi);
        workgroupBarrier();
        for (var e = sgi; e < 256u; e = e + sgn) {
            let t = t0 + bm + 16u * (c / FN) + e / 16u;
            let r = r0 + bn + 16u * (c % FN) + e % 16u;
            if live && t < n_tok && r < n_rows {
                store(t, r, cs[co + e]);
            }
        }
        workgroupBarrier();
    }
";

/// The matrix operations on 16x16 tiles held whole by every invocation, in private
/// arrays (f16 values are exact in f32; each product summed in order of k).
const EMULATED: &str = "var<private> emu_a: array<array<f32, 256>, FM>;
var<private> emu_b: array<array<f32, 256>, FN>;
var<private> emu_c: array<array<f32, 256>, FM * FN>;

fn emu_zero(c: u32) {
    for (var e = 0u; e < 256u; e = e + 1u) {
        emu_c[c][e] = 0.0;
    }
}

fn emu_load_a(i: u32, at: u32) {
    for (var r = 0u; r < 16u; r = r + 1u) {
        for (var c = 0u; c < 16u; c = c + 1u) {
            emu_a[i][16u * r + c] = f32(xs[at + r * SV + c / 4u][c % 4u]);
        }
    }
}

fn emu_load_b(j: u32, at: u32) {
    for (var n = 0u; n < 16u; n = n + 1u) {
        for (var r = 0u; r < 16u; r = r + 1u) {
            emu_b[j][16u * r + n] = f32(ws[at + n * SV + r / 4u][r % 4u]);
        }
    }
}

fn emu_mma(i: u32, j: u32, c: u32) {
    for (var m = 0u; m < 16u; m = m + 1u) {
        for (var n = 0u; n < 16u; n = n + 1u) {
            var s = emu_c[c][16u * m + n];
            for (var r = 0u; r < 16u; r = r + 1u) {
                s = s + emu_a[i][16u * m + r] * emu_b[j][16u * r + n];
            }
            emu_c[c][16u * m + n] = s;
        }
    }
}

fn emu_store(c: u32, at: u32, lane: u32) {
    if lane == 0u {
        for (var e = 0u; e < 256u; e = e + 1u) {
            cs[at + e] = emu_c[c][e];
        }
    }
}
";
