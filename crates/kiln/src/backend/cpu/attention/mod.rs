//! Causal attention over the f16 KV cache with an online softmax per query, in the
//! arithmetic of ggml's one-chunk flash-attention path (llama.cpp's CPU default): queries
//! rounded to f16, the K dot summed in ggml's order, keys taken one at a time in ascending
//! position, and the output accumulated in f16 (rounded after every rescale and every
//! fused multiply-add), the sum of weights with an FMA. On short prompts this makes kiln's
//! hidden states bit-identical to llama.cpp's (tests/embed_oracle.rs); kiln uses it for
//! every batch size, so results do not depend on batching (batch invariance).
//!
//! Flash-style tiling: one task takes a KV head, some of the query heads that share it
//! (grouped-query attention), and a tile of consecutive queries of one sequence; its rows
//! share each load of the block's K tile (the K cache holds 16 slots per tile, `[dim][16]`:
//! `kv_buf.rs`) and of each V row. Keys go in blocks of one tile: each row's scores for
//! the block, 16 keys a vector, then the running maximum and every softmax weight of the
//! block in one vectorized libm-exact `expf` (`expf.rs`), then the walk that rescales and
//! accumulates in ascending position. Every row still sees its keys in ascending position with the
//! same arithmetic, so its result depends neither on the tile nor on the other rows.
//! Scratch is per thread: no allocation after the first call.
//!
//! Keys go in chunks of [`KV_CHUNK`] positions (aligned to absolute positions): a row's
//! accumulator, maximum and sum start afresh in every chunk, and the chunks are folded
//! together in ascending order in f32 ([`fold`]). A decode step's chunks can then go to
//! different threads, each taking all the query heads of its KV heads, so every cached key
//! is read once whatever the head counts, and the result is the same bits as a prompt's
//! walk through the chunks in order (the GPU's exact kernel folds the same way). Contexts
//! within one chunk give exactly ggml's one-chunk arithmetic (llama.cpp's CPU splits a long
//! decode over its threads too, so past a chunk neither matches the other bit for bit).
//!
//! The f16 primitives (dot, rescale, multiply-add with rounding) run 16 lanes wide where
//! the CPU has AVX-512 F, each lane with the arithmetic of the 8-lane AVX2 forms, so every
//! tier gives the same bits (~1.3x on gemma3-270m's pp512 attention).
//!
//! Two arithmetics, chosen per chunk ([`AttnArith`]): that one, and one that keeps the
//! accumulators in f32 and rescales them once per block of 16 keys (where the block raises
//! the row's maximum) instead of per key, as llama.cpp's tiled prompt path and its non-flash
//! path accumulate in f32: ~1.5x faster on prompts, ~1.2x on a decode step's attention at
//! depth 2048. By default (`Hybrid`) the first chunk takes ggml's and the others f32, so
//! kiln stays bit-identical to llama.cpp's CPU where that is possible at all; `Ggml` and
//! `F32` take one in every chunk (f32 logits move within llama.cpp's own flash-attention
//! on/off spread). Blocks are aligned to absolute positions, so the f32 result too depends
//! on nothing but the row's own keys.

use half::f16;

#[cfg(target_arch = "x86_64")]
mod heads;
mod quantized;
pub(crate) mod whole;
#[cfg(target_arch = "x86_64")]
pub(crate) mod whole_amx;

pub use quantized::{Blocks, Cache};

use super::expf::expf_slice;
use super::kv_buf::{k_index, K_TILE};
use super::ops::SyncPtr;
use super::pool::ThreadPool;
use crate::backend::AttnPlan;
use crate::quant::{self, GgmlType};

/// Queries per task in a prompt; their accumulators and a block of K/V rows stay in L1.
const Q_TILE: usize = 8;
/// Most (query, head) rows per task.
const MAX_ROWS: usize = 32;
/// Keys per block: one 16-lane `expf` gives a row's weights for the whole block; a block
/// is one tile of the K cache.
const K_BLOCK: usize = K_TILE;
/// Keys per chunk of the accumulation (see the module doc); a multiple of K_BLOCK. The
/// GPU's exact attention (attention.wgsl's CH) folds at the same positions.
pub const KV_CHUNK: u32 = 256;
/// How far ahead (in key blocks) the K/V rows are prefetched, into L2: six blocks of a
/// task's rows outgrow L1, where they would evict the block in use. The next block alone is
/// too close when the rows come from DRAM behind the weights' stream; 6 is as fast as
/// anything further.
const PREFETCH_BLOCKS: usize = 6;

/// How a row's softmax-weighted sum of values is accumulated (see the module doc).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum AttnArith {
    /// ggml's arithmetic in the first chunk of keys (positions below [`KV_CHUNK`]), where it
    /// makes kiln bit-identical to llama.cpp's CPU, and f32 past it, where llama.cpp's own
    /// split of a long decode over its threads already ends that identity; f32 past the
    /// first chunk makes decode attention at depth about 15% faster.
    #[default]
    Hybrid,
    /// ggml's one-chunk flash attention in every chunk: an f16 accumulator rounded after
    /// every key (the GPU's exact path, bit for bit, at any depth).
    Ggml,
    /// f32 accumulators, one rescale per block of keys: faster, not bit-identical.
    F32,
}

impl AttnArith {
    /// Whether the keys of chunk `c` (positions `c · KV_CHUNK..`) take ggml's f16 arithmetic.
    pub fn f16_in_chunk(self, c: u32) -> bool {
        match self {
            AttnArith::Hybrid => c == 0,
            AttnArith::Ggml => true,
            AttnArith::F32 => false,
        }
    }
}

/// Attention of the queries `q` (`[token, head, head_dim]`) over the caches `k` and `v`
/// into `out` (the same shape).
pub fn attention(
    pool: &ThreadPool,
    q: &[f32],
    k: Cache,
    v: Cache,
    plan: &AttnPlan,
    arith: AttnArith,
    out: &mut [f32],
) {
    let n_tok = plan.pos.len();
    if n_tok == 0 || plan.n_head_kv == 0 {
        return;
    }
    let n_kv = plan.n_head_kv;
    let group = plan.n_head / n_kv;
    let (c0, c1) = (plan.first_pos(0) / KV_CHUNK, plan.last_pos(0) / KV_CHUNK);
    let inp = Inputs { q, k, v, plan, arith };
    if n_tok == 1 && c1 > c0 && group <= MAX_ROWS {
        return split_decode(pool, inp, c0..c1 + 1, out);
    }
    let n_tiles = n_tok.div_ceil(Q_TILE);
    let hs = heads_per_task(n_tiles * n_kv, group, MAX_ROWS / Q_TILE.min(n_tok), pool.n_threads());
    let n_sub = group.div_ceil(hs);
    let op = SyncPtr(out.as_mut_ptr());
    pool.run(n_tiles * n_kv * n_sub, &|task| {
        // Head subsets vary fastest, then KV heads: a decode step's heads spread over the threads.
        let (tile, kvh, sub) = (task / (n_kv * n_sub), task / n_sub % n_kv, task % n_sub);
        let h0 = kvh * group + sub * hs;
        let heads = h0..(h0 + hs).min((kvh + 1) * group);
        let t0 = tile * Q_TILE;
        let t1 = (t0 + Q_TILE).min(n_tok);
        // Split the tile into runs of one sequence.
        let mut a = t0;
        while a < t1 {
            let mut b = a + 1;
            while b < t1 && plan.seq[b] == plan.seq[a] {
                b += 1;
            }
            let task = Task { inp, heads: heads.clone(), ts: a..b, keys: 0..u32::MAX, out: Sink::Out(op) };
            SCRATCH.with(|s| run_task(&task, &mut s.borrow_mut()));
            a = b;
        }
    });
}

/// One query over `chunks` (more than one): a task per chunk and some KV heads with all
/// their query heads, each writing its chunk's state; then the chunks folded in order.
/// Given enough chunks to keep the threads busy, a task takes every KV head: it reads each
/// block's K tile and its positions' values as contiguous spans, which the hardware
/// prefetchers stream; one KV head's slice of every row (a stride) streams from DRAM at
/// about a third of the rate.
fn split_decode(pool: &ThreadPool, inp: Inputs, chunks: std::ops::Range<u32>, out: &mut [f32]) {
    let plan = inp.plan;
    let (n_head, n_kv, hd) = (plan.n_head, plan.n_head_kv, plan.head_dim);
    let group = n_head / n_kv;
    let n_chunks = chunks.len();
    let per = if n_chunks >= 2 * pool.n_threads() && n_head <= MAX_ROWS { n_kv } else { 1 };
    let stride = n_head * (hd + 2);
    PARTIALS.with(|p| {
        let mut p = p.borrow_mut();
        if p.len() < n_chunks * stride {
            p.resize(n_chunks * stride, 0.0);
        }
        let pp = SyncPtr(p.as_mut_ptr());
        let kv_tasks = n_kv / per;
        pool.run(n_chunks * kv_tasks, &|task| {
            let (c, kvh) = (task / kv_tasks, task % kv_tasks * per);
            let k0 = (chunks.start + c as u32) * KV_CHUNK;
            // SAFETY: each task writes its own chunk's rows of the partials (its heads).
            let part = SyncPtr(unsafe { pp.get().add(c * stride) });
            let heads = kvh * group..(kvh + per) * group;
            let keys = k0..k0 + KV_CHUNK;
            let task = Task { inp, heads, ts: 0..1, keys, out: Sink::Partial(part) };
            SCRATCH.with(|s| run_task(&task, &mut s.borrow_mut()));
        });
        #[cfg(target_arch = "x86_64")]
        if quant::cpu_tier() >= quant::CpuTier::Avx2 {
            // SAFETY: the CPU has FMA.
            unsafe { merge_fma(&p, n_chunks, stride, hd, n_head, out) };
        } else {
            merge(&p, n_chunks, stride, hd, n_head, out);
        }
        #[cfg(not(target_arch = "x86_64"))]
        merge(&p, n_chunks, stride, hd, n_head, out);
        for o in out.chunks_exact_mut(hd).take(n_head) {
            quantized::unrotate(o, &inp.v);
        }
    });
}

/// Folds each head's chunk states in order into its output.
#[inline(always)]
fn merge(p: &[f32], n_chunks: usize, stride: usize, hd: usize, n_head: usize, out: &mut [f32]) {
    for (h, o) in out.chunks_exact_mut(hd).take(n_head).enumerate() {
        let (mut m, mut sum) = (f32::NEG_INFINITY, 0f32);
        for c in 0..n_chunks {
            let st = &p[c * stride + h * (hd + 2)..][..hd + 2];
            fold(&mut m, &mut sum, o, st[0], st[1], &st[2..]);
        }
        finish(o, sum);
    }
}

/// The same compiled with FMA, so `mul_add` is one instruction rather than a libm call
/// (the same bits: both are exact fused multiply-adds).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn merge_fma(p: &[f32], n_chunks: usize, stride: usize, hd: usize, n_head: usize, out: &mut [f32]) {
    merge(p, n_chunks, stride, hd, n_head, out)
}

/// Folds a chunk's state (maximum `m`, sum of weights, unnormalized `acc`) into the running
/// one (`mm`, `ss`, `aa`) in f32: each side weighed by `expf` of its maximum less the new
/// one. An empty chunk (`m` = -inf) changes nothing, and the first one is taken as it is.
#[inline(always)]
fn fold(mm: &mut f32, ss: &mut f32, aa: &mut [f32], m: f32, sum: f32, acc: &[f32]) {
    if m == f32::NEG_INFINITY {
        return;
    }
    if *mm == f32::NEG_INFINITY {
        (*mm, *ss) = (m, sum);
        aa.copy_from_slice(acc);
        return;
    }
    let mx = if m > *mm { m } else { *mm };
    let mut f = [*mm - mx, m - mx];
    expf_slice(&mut f);
    aa.iter_mut().zip(acc).for_each(|(a, &c)| *a = c.mul_add(f[1], *a * f[0]));
    *ss = sum.mul_add(f[1], *ss * f[0]);
    *mm = mx;
}

/// A row's output from its folded accumulator and sum of weights.
fn finish(o: &mut [f32], sum: f32) {
    let inv = if sum == 0.0 { 0.0 } else { 1.0 / sum };
    o.iter_mut().for_each(|o| *o *= inv);
}

/// Query heads per task: as many of a KV head's group as fit in `max_heads`, split further
/// until the tasks divide evenly over the threads (or are many), so no thread idles long.
fn heads_per_task(units: usize, group: usize, max_heads: usize, threads: usize) -> usize {
    let group = group.max(1);
    for n_sub in group.div_ceil(max_heads.max(1))..=group {
        let hs = group.div_ceil(n_sub);
        let tasks = units * group.div_ceil(hs);
        if tasks >= threads && (tasks.is_multiple_of(threads) || tasks >= 4 * threads) {
            return hs;
        }
    }
    1
}

thread_local! {
    static SCRATCH: std::cell::RefCell<Scratch> = Default::default();
    /// A split decode's chunk states, `[chunk][head][m, sum, acc...]` (the calling thread's).
    static PARTIALS: std::cell::RefCell<Vec<f32>> = Default::default();
}

#[derive(Default)]
struct Scratch {
    /// f16-rounded queries of the rows, `[rows, head_dim]`.
    q: Vec<f32>,
    /// Over a quantized K cache: the rows' queries quantized for its dot product.
    qq: Vec<u8>,
    /// Unnormalized outputs of the current chunk, `[rows, head_dim]`.
    acc: Vec<f32>,
    /// The chunks before it, folded (`fold`), `[rows, head_dim]`.
    folded: Vec<f32>,
    /// The current block's K tiles where they are not read in place (see
    /// [`super::kv_buf`]), `[KV head][head_dim][K_BLOCK]`, and widened for kernels of f32.
    k16: Vec<f16>,
    k32: Vec<f32>,
    /// The current block's V rows where the kernel does not read them in place,
    /// `[KV head][K_BLOCK][head_dim]`: widened for kernels of f32 rows, copied for f16.
    v32: Vec<f32>,
    v16: Vec<f16>,
}

/// A block's V rows of one KV head: row `i` at `data[i * stride..][..head_dim]`.
#[derive(Clone, Copy)]
struct Rows<'a, E> {
    data: &'a [E],
    stride: usize,
}

impl<'a, E> Rows<'a, E> {
    #[inline(always)]
    fn row(&self, i: usize, hd: usize) -> &'a [E] {
        &self.data[i * self.stride..i * self.stride + hd]
    }
}

/// What a kernel reads cached values as.
trait Elem: Copy + Default {
    /// The cache itself, where it can be read as this type (f16: in place).
    fn in_place(cache: &[f16]) -> Option<&[Self]>;
    /// Else this type's scratch, into which [`Self::gather`] copies a block's rows.
    fn scratch<'s>(s32: &'s mut Vec<f32>, s16: &'s mut Vec<f16>) -> &'s mut Vec<Self>;
    /// For each `(i, at)` of `spans` (see [`widen_rows`]), the task's KV heads at `at` of
    /// `src` to row `i` of each head's block in `dst`, `[KV head][K_BLOCK][hd]`.
    fn gather(src: &[f16], spans: impl Iterator<Item = (usize, usize)>, hd: usize, dst: &mut [Self]);
    /// A block's K tiles as this type: f16 as they are, f32 widened into `s32`.
    fn tiles<'s>(src: &'s [f16], s32: &'s mut Vec<f32>) -> &'s [Self];
    /// Blocks (`dst.len()` values) dequantized by `f` (their type's, as ggml's `to_float`).
    fn from_blocks(f: quant::DequantizeFn, src: &[u8], dst: &mut [Self]);
}

impl Elem for f32 {
    fn in_place(_: &[f16]) -> Option<&[f32]> {
        None
    }
    fn scratch<'s>(s32: &'s mut Vec<f32>, _: &'s mut Vec<f16>) -> &'s mut Vec<f32> {
        s32
    }
    #[inline(always)]
    fn gather(src: &[f16], spans: impl Iterator<Item = (usize, usize)>, hd: usize, dst: &mut [f32]) {
        widen_rows(src, spans, hd, dst)
    }
    fn tiles<'s>(src: &'s [f16], s32: &'s mut Vec<f32>) -> &'s [f32] {
        if s32.len() < src.len() {
            s32.resize(src.len(), 0.0);
        }
        widen(src, &mut s32[..src.len()]);
        &s32[..src.len()]
    }
    fn from_blocks(f: quant::DequantizeFn, src: &[u8], dst: &mut [f32]) {
        f(src, dst)
    }
}

impl Elem for f16 {
    fn in_place(cache: &[f16]) -> Option<&[f16]> {
        Some(cache)
    }
    fn scratch<'s>(_: &'s mut Vec<f32>, s16: &'s mut Vec<f16>) -> &'s mut Vec<f16> {
        s16
    }
    #[inline(always)]
    fn gather(src: &[f16], spans: impl Iterator<Item = (usize, usize)>, hd: usize, dst: &mut [f16]) {
        each_row(src, spans, hd, dst, |s, d| d.copy_from_slice(s))
    }
    fn tiles<'s>(src: &'s [f16], _: &'s mut Vec<f32>) -> &'s [f16] {
        src
    }
    fn from_blocks(f: quant::DequantizeFn, src: &[u8], dst: &mut [f16]) {
        // Block by block, widened then narrowed (no kernel reads quantized values as f16).
        let per = src.len() * 32 / dst.len().max(1);
        let mut x = [0f32; 32];
        for (b, d) in src.chunks_exact(per).zip(dst.chunks_exact_mut(32)) {
            f(b, &mut x);
            d.iter_mut().zip(&x).for_each(|(d, &x)| *d = f16::from_f32(x));
        }
    }
}

/// What an attention call reads: the queries `[token, head, head_dim]`, the caches, the
/// plan and the arithmetic.
#[derive(Clone, Copy)]
struct Inputs<'a> {
    q: &'a [f32],
    k: Cache<'a>,
    v: Cache<'a>,
    plan: &'a AttnPlan<'a>,
    arith: AttnArith,
}

/// One task: query heads `heads` (whole groups of one KV head or more, or part of one
/// group) for queries `ts` (all of one sequence).
struct Task<'a> {
    inp: Inputs<'a>,
    heads: std::ops::Range<usize>,
    ts: std::ops::Range<usize>,
    /// The key positions this task may take (a split decode's chunk; else all).
    keys: std::ops::Range<u32>,
    out: Sink,
}

/// Where a task's rows go.
#[derive(Clone, Copy)]
enum Sink {
    /// Normalized, into the output `[token, head, head_dim]`.
    Out(SyncPtr<f32>),
    /// As a chunk's states (a split decode's task): per head h, at `h · (head_dim + 2)`,
    /// the maximum, the sum of weights and the accumulator.
    Partial(SyncPtr<f32>),
}

impl Task<'_> {
    /// The KV heads the task's query heads read.
    fn kv_heads(&self) -> std::ops::Range<usize> {
        let group = self.inp.plan.n_head / self.inp.plan.n_head_kv;
        self.heads.start / group..(self.heads.end - 1) / group + 1
    }
}

fn run_task(t: &Task, s: &mut Scratch) {
    let hd = t.inp.plan.head_dim;
    let rows = t.ts.len() * t.heads.len();
    for v in [&mut s.q, &mut s.acc, &mut s.folded] {
        if v.len() < rows * hd {
            v.resize(rows * hd, 0.0);
        }
    }
    #[cfg(target_arch = "x86_64")]
    if quant::cpu_tier() >= quant::CpuTier::Avx512 {
        // SAFETY (all four): the CPU has AVX-512 F (and AVX2, FMA, F16C).
        return unsafe {
            match hd {
                64 => run_heads::<4>(t, s),
                128 => run_heads::<8>(t, s),
                256 => run_heads::<16>(t, s),
                _ => run_task_avx512::<AnyHead>(t, s),
            }
        };
    }
    #[cfg(target_arch = "x86_64")]
    if quant::cpu_tier() >= quant::CpuTier::Avx2 {
        // SAFETY: the CPU has AVX2, FMA and F16C.
        return unsafe { run_task_fma(t, s) };
    }
    run_task_body::<AnyHead>(t, s)
}

/// Most times a value row may be widened (once per [`Kernel::WALK_ROWS`] query rows that
/// read it) for the kernels to read the cache in place rather than widen each block once
/// into scratch: reading in place saves the scratch pass while a row is widened only a
/// few times (decode, a KV head's query heads), and loses once many query rows widen every
/// row again (a prompt's 8 queries a task).
const MAX_WIDENINGS: usize = 4;

/// The 16-lane kernels for heads of `16 · N` values, rows in place or widened.
///
/// # Safety
/// The CPU has AVX-512 F, AVX2, FMA and F16C.
#[cfg(target_arch = "x86_64")]
unsafe fn run_heads<const N: usize>(t: &Task, s: &mut Scratch) {
    use heads::Heads;
    let group = t.inp.plan.n_head / t.inp.plan.n_head_kv;
    let rows_per_kv = t.ts.len() * t.heads.len().min(group);
    // A quantized V cache is dequantized a block at a time: the f32 kernel reads that.
    let quantized_v = t.inp.v.blocks().is_some();
    if !quantized_v && rows_per_kv.div_ceil(<Heads<N, f16> as Kernel>::WALK_ROWS) <= MAX_WIDENINGS {
        run_task_avx512::<Heads<N, f16>>(t, s)
    } else {
        run_task_avx512::<Heads<N, f32>>(t, s)
    }
}

/// The same body compiled with FMA, so `mul_add` is one instruction rather than a call.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn run_task_fma(t: &Task, s: &mut Scratch) {
    run_task_body::<AnyHead>(t, s)
}

/// And with AVX-512 F, so the 16-lane kernels inline.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
unsafe fn run_task_avx512<K: Kernel>(t: &Task, s: &mut Scratch) {
    run_task_body::<K>(t, s)
}

/// One row's softmax weights for a block: `w[i]` for its keys `a..b`, after `expf`;
/// bit `i` of `raised` set where key `i` raised the running maximum (`w[i]` then rescales
/// the accumulator and the key's own weight is 1).
#[derive(Clone, Copy)]
struct Weights {
    w: [f32; K_BLOCK],
    raised: u32,
    a: usize,
    b: usize,
}

/// A row's arithmetic over a block of keys: any head size with the primitives below, or
/// specialized to one (`simd::wide::Heads`), with the same bits.
trait Kernel {
    /// How it reads cached values.
    type E: Elem;
    /// How it reads K tiles.
    type KE: Elem;
    /// `wt.w[i] = dot_f16(q, key i) * scale` for `i` in `wt.a..wt.b` (other lanes:
    /// anything), key `i` being column `i` of the KV head's tile `kt`, `[head_dim][K_BLOCK]`;
    /// returns their maximum (any order: the same value). The other columns may hold
    /// anything.
    fn scores(q: &[f32], kt: &[Self::KE], scale: f32, wt: &mut Weights) -> f32;
    /// Most rows [`Self::scores_rows`] takes at once.
    const SCORE_ROWS: usize = 1;
    /// [`Self::scores`] of rows that read the same keys (`wt.len()` of them, at most
    /// [`Self::SCORE_ROWS`], their queries one after another in `q`), the maxima into
    /// `max`: each vector of the tile loaded once for all of them.
    // Inlined, so compiled with the caller's target features (else `mul_add` is a libm
    // call, an order of magnitude slower).
    #[inline(always)]
    fn scores_rows(q: &[f32], kt: &[Self::KE], scale: f32, wt: &mut [Weights], max: &mut [f32]) {
        let hd = q.len() / wt.len().max(1);
        for (r, (wt, m)) in wt.iter_mut().zip(max).enumerate() {
            *m = Self::scores(&q[r * hd..(r + 1) * hd], kt, scale, wt);
        }
    }
    /// ggml's running maximum, key by key: turns the scores `w[a..b]` into each key's
    /// `expf` argument (`m - score` where the key raises the maximum, `score - m` else),
    /// returns those keys as bits, and leaves `m` the new maximum (`mb` is the block's).
    #[inline(always)]
    fn raises(w: &mut [f32; K_BLOCK], a: usize, b: usize, m: &mut f32, _mb: f32) -> u32 {
        let mut raised = 0;
        for (i, w) in w.iter_mut().enumerate().take(b).skip(a) {
            let score = *w;
            if score > *m {
                *w = *m - score;
                raised |= 1 << i;
                *m = score;
            } else {
                *w = score - *m;
            }
        }
        raised
    }
    /// `w[i] = expf(w[i])` for `i` in `a..b`.
    fn exp(w: &mut [f32; K_BLOCK], a: usize, b: usize);
    /// Rescales (at the keys that raised the maximum) and accumulates `acc` (and its sum of
    /// weights) over the block's keys, rounding to f16 after every step where `ROUND`
    /// (ggml's arithmetic over an f16 V cache).
    fn walk<const ROUND: bool>(acc: &mut [f32], vb: Rows<Self::E>, wt: &Weights, sum: &mut f32);
    /// Most rows [`Self::walk_rows`] takes at once.
    const WALK_ROWS: usize = 1;
    /// Rows with the same keys (`wt.len()` of them, at most [`Self::WALK_ROWS`], their
    /// accumulators one after another in `acc`): their independent chains interleaved.
    #[inline(always)]
    fn walk_rows<const ROUND: bool>(acc: &mut [f32], vb: Rows<Self::E>, wt: &[Weights], sum: &mut [f32]) {
        let hd = acc.len() / wt.len().max(1);
        for (r, wt) in wt.iter().enumerate() {
            Self::walk::<ROUND>(&mut acc[r * hd..(r + 1) * hd], vb, wt, &mut sum[r]);
        }
    }
}

/// Any head size: the scores from the widened tile, the walk one primitive call per key.
struct AnyHead;

impl Kernel for AnyHead {
    type E = f32;
    type KE = f32;

    #[inline(always)]
    fn scores(q: &[f32], kt: &[f32], scale: f32, wt: &mut Weights) -> f32 {
        let d = dots_tile(q, kt);
        let mut max = f32::NEG_INFINITY;
        for (o, &d) in wt.w.iter_mut().zip(&d).take(wt.b).skip(wt.a) {
            *o = d * scale;
            max = if *o > max { *o } else { max };
        }
        max
    }

    #[inline(always)]
    fn exp(w: &mut [f32; K_BLOCK], a: usize, b: usize) {
        expf_slice(&mut w[a..b]);
    }

    #[inline(always)]
    fn walk<const ROUND: bool>(acc: &mut [f32], vb: Rows<f32>, wt: &Weights, sum: &mut f32) {
        let hd = acc.len();
        for i in wt.a..wt.b {
            let (ms, vs) = if wt.raised >> i & 1 == 1 {
                if ROUND {
                    scale_f16(acc, wt.w[i]);
                } else {
                    acc.iter_mut().for_each(|a| *a *= wt.w[i]);
                }
                (wt.w[i], 1.0)
            } else {
                (1.0, wt.w[i])
            };
            let v = vb.row(i, hd);
            if ROUND {
                mad_f16(acc, v, vs);
            } else {
                acc.iter_mut().zip(v).for_each(|(a, &x)| *a = x.mul_add(vs, *a));
            }
            *sum = sum.mul_add(ms, vs); // GCC contracts ggml's `S*ms + vs`
        }
    }
}

#[inline(always)]
fn run_task_body<K: Kernel>(task: &Task, s: &mut Scratch) {
    let Task { inp: Inputs { q, k, v, plan, arith }, ref heads, ref ts, ref keys, out: sink } = *task;
    let (kc, vc) = (k.f16(), v.f16());
    let (n_head, hd) = (plan.n_head, plan.head_dim);
    let kv_dim = plan.n_head_kv * hd;
    let group = n_head / plan.n_head_kv;
    let kvs = task.kv_heads();
    let nh = heads.len();
    let rows = ts.len() * nh;
    // Row `r` is query `ts.start + r / nh` on head `heads.start + r % nh`.
    let row = |r: usize| (ts.start + r / nh, heads.start + r % nh);
    // Each row's query and KV head among the task's, from a table made once per task:
    // divisions in the blocks' loop would cost several percent of decode attention.
    let (mut t_of, mut kv_tab) = ([0usize; MAX_ROWS], [0usize; MAX_ROWS]);
    for r in 0..rows {
        let (t, h) = row(r);
        (t_of[r], kv_tab[r]) = (t, h / group - kvs.start);
    }
    let kv_of = |r: usize| kv_tab[r];
    let Scratch { q: qs, qq, acc, folded, k16, k32, v32, v16 } = s;
    let (qs, acc, folded) = (&mut qs[..rows * hd], &mut acc[..rows * hd], &mut folded[..rows * hd]);
    // A block's K tiles and V rows of the task's KV heads are as long.
    let kv_len = K_BLOCK * hd * kvs.len();
    let vb = <K::E as Elem>::scratch(v32, v16);
    if vb.len() < kv_len {
        vb.resize(kv_len, Default::default());
    }
    if k16.len() < kv_len {
        k16.resize(kv_len, f16::ZERO);
    }
    let (k16, vb) = (&mut k16[..kv_len], &mut vb[..kv_len]);
    let n_slots = kc.len() / kv_dim.max(1);
    let (k_bytes, v_bytes) = (k.bytes(), v.bytes());
    // The V cache, where the kernel reads it in place (f16).
    let v_cache = v.blocks().map_or(<K::E as Elem>::in_place(vc), |_| None);
    let v_blocks = v.blocks().map(|b| (b, quantized::Layout::new(b.ty, plan.n_head_kv, hd)));
    // A quantized K cache's queries, quantized for its dot product; else rounded to f16.
    let k_quant = k.blocks().map(|b| quantized::QuantKeys::new(b, plan.n_head_kv, hd));
    let q_row = k_quant.as_ref().map_or(0, |kq| kq.q_row());
    if qq.len() < (rows + quantized::QUERY_TILE) * q_row {
        qq.resize((rows + quantized::QUERY_TILE) * q_row, 0);
    }
    for r in 0..rows {
        let (t, h) = row(r);
        let dst = &mut qs[r * hd..(r + 1) * hd];
        dst.copy_from_slice(&q[(t * n_head + h) * hd..(t * n_head + h + 1) * hd]);
        let qs = plan.q_scale(t);
        if qs != 1.0 {
            dst.iter_mut().for_each(|x| *x *= qs);
        }
        match &k_quant {
            Some(kq) => kq.quantize_query(dst, &mut qq[r * q_row..(r + 1) * q_row]),
            None => round_f16(dst),
        }
    }
    acc.fill(0.0);
    folded.fill(0.0);
    let mut m = [f32::NEG_INFINITY; MAX_ROWS];
    let mut sum = [0.0f32; MAX_ROWS];
    // The chunks before the current one, folded.
    let (mut mm, mut ss) = ([f32::NEG_INFINITY; MAX_ROWS], [0.0f32; MAX_ROWS]);
    let mut wts = [Weights { w: [0.0; K_BLOCK], raised: 0, a: 0, b: 0 }; MAX_ROWS];
    let seq = plan.seq[ts.start];
    // The keys query `t` sees in this task.
    let first = |t: usize| plan.first_pos(t).max(keys.start);
    let last = |t: usize| plan.last_pos(t).min(keys.end - 1);
    let lo = ts.clone().map(first).min().unwrap_or(0);
    let hi = ts.clone().map(last).max().unwrap_or(0);
    // Blocks start at multiples of K_BLOCK, so a row's blocks depend only on its own keys.
    // Where KV blocks hold whole key blocks, a key block's slots are consecutive: one
    // block-table lookup per key block instead of a division per key.
    let runs = plan.block_size.is_multiple_of(K_BLOCK);
    let slots = |p0: u32| {
        let first = runs.then(|| plan.slot(seq, p0));
        move |i: usize| first.map_or_else(|| plan.slot(seq, p0 + i as u32), |s| s + i)
    };
    // Where the task's KV heads' part of the K tile starting at `slot0` lies, if that is a
    // whole tile of the cache holding the block's slots.
    let k_tile_at = |slot0: usize| {
        (runs && slot0 + K_BLOCK <= n_slots).then(|| slot0 * kv_dim + kvs.start * hd * K_BLOCK)
    };
    let start = lo - lo % K_BLOCK as u32;
    for p0 in (start..=hi).step_by(K_BLOCK) {
        if p0.is_multiple_of(KV_CHUNK) && p0 > start {
            for r in 0..rows {
                let at = r * hd..(r + 1) * hd;
                fold(&mut mm[r], &mut ss[r], &mut folded[at.clone()], m[r], sum[r], &acc[at]);
            }
            acc.fill(0.0);
            (m, sum) = ([f32::NEG_INFINITY; MAX_ROWS], [0.0; MAX_ROWS]);
        }
        let n = K_BLOCK.min((hi - p0) as usize + 1);
        // ggml's arithmetic in this chunk: a rescale wherever a key raises the maximum, and
        // over an f16 V cache an f16 accumulator.
        let ggml = arith.f16_in_chunk(p0 / KV_CHUNK);
        let round = ggml && v_blocks.is_none();
        let slot = slots(p0);
        let i0 = (lo.saturating_sub(p0) as usize).min(n);
        // The block's K tiles (an f16 cache): in place where its slots are one whole tile of
        // the cache (a KV block holds whole key blocks: then they are), else gathered key by
        // key.
        let kt: &[K::KE] = if k_quant.is_some() {
            &[]
        } else {
            let ktiles = match k_tile_at(slot(0)) {
                Some(at) => &kc[at..at + kv_len],
                None => {
                    for i in i0..n {
                        for (c, j) in (kvs.start * hd..kvs.end * hd).enumerate() {
                            k16[c * K_BLOCK + i] = kc[k_index(slot(i), j, kv_dim, n_slots)];
                        }
                    }
                    &*k16
                }
            };
            <K::KE as Elem>::tiles(ktiles, k32)
        };
        // Row `r`'s KV head's tile.
        let tile_of = |r: usize| &kt[kv_of(r) * hd * K_BLOCK..(kv_of(r) + 1) * hd * K_BLOCK];
        // The task's KV heads: one contiguous span of each position's V row, read in order.
        let spans = (i0..n).map(|i| (i, slot(i) * kv_dim + kvs.start * hd));
        // V in place where the block's slots are consecutive and its K_BLOCK rows inside
        // the cache; else gathered.
        let base = slot(0) * kv_dim + kvs.start * hd;
        let span = (K_BLOCK - 1) * kv_dim + kvs.len() * hd;
        let in_place = v_cache.filter(|v| runs && base + span <= v.len());
        match v_blocks {
            Some((b, layout)) => {
                quantized::gather_values(b, layout, kvs.clone(), (i0..n).map(|i| (i, slot(i))), hd, vb)
            }
            None if in_place.is_none() => <K::E as Elem>::gather(vc, spans, hd, vb),
            None => {}
        }
        // Row `r`'s KV head's V rows of the block.
        let v_rows = |r: usize| match in_place {
            Some(v) => {
                let at = base + kv_of(r) * hd;
                Rows { data: &v[at..at + (K_BLOCK - 1) * kv_dim + hd], stride: kv_dim }
            }
            None => {
                let at = kv_of(r) * K_BLOCK * hd;
                Rows { data: &vb[at..at + K_BLOCK * hd], stride: hd }
            }
        };
        // At depth the cache comes from memory: ask for a block a few ahead while this one
        // computes (at the start, for the blocks before that one too: a split decode's
        // task starts cold in every chunk).
        let ahead = (K_BLOCK * PREFETCH_BLOCKS) as u32;
        // Block `next`'s spans to ask for, of K and of V, each as its first byte, the
        // stride and length of a key's part and the count of keys: an f16 K tile (where a
        // whole tile of the cache) as 16 parts of it; a quantized K's and every V's rows
        // (where consecutive: a KV block holds whole key blocks) up to the last key.
        let spans_of = |next: u32| -> [Span; 2] {
            if next > hi {
                return [Span::default(); 2];
            }
            let s0 = slots(next)(0);
            let n_v = if runs { K_BLOCK.min((hi - next) as usize + 1) } else { 0 };
            let k = match &k_quant {
                Some(kq) => {
                    let (at, len) = kq.span(s0, &kvs);
                    Span { at, stride: kq.row_bytes(), len, n: n_v }
                }
                None => k_tile_at(s0).map_or(Span::default(), |at| {
                    let part = 2 * kv_len / K_BLOCK;
                    Span { at: 2 * at, stride: part, len: part, n: K_BLOCK }
                }),
            };
            let v = match v_blocks {
                Some((_, l)) => Span {
                    at: s0 * l.row + kvs.start * l.head,
                    stride: l.row,
                    len: kvs.len() * l.head,
                    n: n_v,
                },
                None => Span {
                    at: 2 * (s0 * kv_dim + kvs.start * hd),
                    stride: 2 * kv_dim,
                    len: 2 * kvs.len() * hd,
                    n: n_v,
                },
            };
            [k, v]
        };
        // Keys `range` (of K_BLOCK) of a block's spans of K (`c` = 0) or V (1).
        let fetch = |c: usize, spans: [Span; 2], range: std::ops::Range<usize>| {
            let (sp, data) = (spans[c], if c == 0 { k_bytes } else { v_bytes });
            for i in range.start..range.end.min(sp.n) {
                prefetch(&data[sp.at + i * sp.stride..][..sp.len]);
            }
        };
        if p0 == start {
            for next in (p0 + K_BLOCK as u32..p0 + ahead).step_by(K_BLOCK) {
                let spans = spans_of(next);
                fetch(0, spans, 0..K_BLOCK);
                fetch(1, spans, 0..K_BLOCK);
            }
        }
        let ahead_spans = spans_of(p0 + ahead);
        // The block `ahead` keys on is asked for a part at a time between the rows' steps
        // below (K during the scores, V during the walks): in one burst the prefetches
        // waited for miss buffers while no arithmetic ran, then the arithmetic ran while
        // no memory moved.
        let part = |r: usize| r * K_BLOCK / rows.max(1);
        // Scores, the running maximum, and each key's `expf` argument: `m - score` where
        // the key raises the maximum (the rescale factor), `score - m` otherwise. Each step
        // for every row before the next: the rows' chains are independent, and short loops
        // let the core overlap them (one loop over all three steps ran them row by row).
        let mut mbs = [f32::NEG_INFINITY; MAX_ROWS];
        for (r, wt) in wts[..rows].iter_mut().enumerate() {
            let t = t_of[r];
            // The keys of the block this query sees.
            wt.a = first(t).saturating_sub(p0) as usize;
            wt.b = ((last(t) + 1).saturating_sub(p0) as usize).min(n);
        }
        // The end of the run of at most `max` rows from `r` that see the same keys of one
        // KV head (a group's query heads in a decode step do).
        let run_end = |wts: &[Weights], r: usize, max: usize| {
            let same = |e: usize| (wts[e].a, wts[e].b, kv_of(e)) == (wts[r].a, wts[r].b, kv_of(r));
            (r + 1..rows.min(r + max)).find(|&e| !same(e)).unwrap_or(rows.min(r + max))
        };
        // Scores several rows at a time, a run split evenly (a group of 6: 3 and 3, not 4
        // and 2).
        let score_rows = if k_quant.is_some() { quantized::QUERY_TILE } else { K::SCORE_ROWS };
        let mut r = 0;
        while r < rows {
            let run = run_end(&wts, r, MAX_ROWS) - r;
            let e = r + run.div_ceil(run.div_ceil(score_rows));
            if wts[r].a < wts[r].b {
                match &k_quant {
                    Some(kq) => {
                        let kvh = kvs.start + kv_of(r);
                        let (q, scale) = (&qq[r * q_row..], plan.score_scale());
                        // Where the block's slots are consecutive, several rows at once.
                        if !(runs && kq.scores_tile(q, kvh, slot(0), scale, &mut wts[r..e], &mut mbs[r..e])) {
                            for j in r..e {
                                let (q, wt) = (&qq[j * q_row..(j + 1) * q_row], &mut wts[j]);
                                mbs[j] = kq.scores(q, kvh, slot, scale, &mut wt.w, wt.a, wt.b);
                            }
                        }
                    }
                    None => {
                        let q = &qs[r * hd..e * hd];
                        K::scores_rows(q, tile_of(r), plan.score_scale(), &mut wts[r..e], &mut mbs[r..e]);
                    }
                }
                if plan.softcap != 0.0 {
                    for (wt, mb) in wts[r..e].iter_mut().zip(&mut mbs[r..e]) {
                        *mb = softcap(&mut wt.w[wt.a..wt.b], plan.softcap);
                    }
                }
            }
            fetch(0, ahead_spans, part(r)..part(e));
            r = e;
        }
        if plan.alibi.is_some() {
            // ggml adds the bias after scaling the score; the block's maximum follows.
            for (r, wt) in wts[..rows].iter_mut().enumerate() {
                let (t, h) = row(r);
                let mut mb = f32::NEG_INFINITY;
                for i in wt.a..wt.b {
                    wt.w[i] += plan.bias(t, h, p0 + i as u32);
                    mb = if wt.w[i] > mb { wt.w[i] } else { mb };
                }
                mbs[r] = mb;
            }
        }
        for (r, wt) in wts[..rows].iter_mut().enumerate() {
            if wt.a >= wt.b {
                continue;
            }
            let mb = mbs[r];
            wt.raised = if ggml {
                K::raises(&mut wt.w, wt.a, wt.b, &mut m[r], mb)
            } else {
                // The block's maximum first: one rescale of the row, then every weight
                // `expf(score - m)` (the walk adds them as they come, in key order).
                if mb > m[r] {
                    if m[r] > f32::NEG_INFINITY {
                        let mut f = [m[r] - mb];
                        expf_slice(&mut f);
                        acc[r * hd..(r + 1) * hd].iter_mut().for_each(|a| *a *= f[0]);
                        sum[r] *= f[0];
                    }
                    m[r] = mb;
                }
                // All lanes (one vector; those outside `a..b` are ignored).
                wt.w.iter_mut().for_each(|w| *w -= m[r]);
                0
            };
        }
        for wt in wts[..rows].iter_mut().filter(|wt| wt.a < wt.b) {
            K::exp(&mut wt.w, wt.a, wt.b);
        }
        // The walks, several rows at a time where they see the same keys (a decode step's
        // do): their chains interleave (each key's multiply-add waits on the last's rounding).
        let mut r = 0;
        while r < rows {
            let wt = &wts[r];
            if wt.a >= wt.b {
                fetch(1, ahead_spans, part(r)..part(r + 1));
                r += 1;
                continue;
            }
            let e = run_end(&wts, r, K::WALK_ROWS);
            let vb = v_rows(r);
            if round {
                K::walk_rows::<true>(&mut acc[r * hd..e * hd], vb, &wts[r..e], &mut sum[r..e]);
            } else {
                K::walk_rows::<false>(&mut acc[r * hd..e * hd], vb, &wts[r..e], &mut sum[r..e]);
            }
            fetch(1, ahead_spans, part(r)..part(e));
            r = e;
        }
    }
    for r in 0..rows {
        let (t, h) = row(r);
        let at = r * hd..(r + 1) * hd;
        fold(&mut mm[r], &mut ss[r], &mut folded[at.clone()], m[r], sum[r], &acc[at.clone()]);
        match sink {
            Sink::Out(op) => {
                // SAFETY: each task writes its own (token, head) slices of `out`.
                let o = unsafe { std::slice::from_raw_parts_mut(op.get().add((t * n_head + h) * hd), hd) };
                o.copy_from_slice(&folded[at]);
                finish(o, ss[r]);
                quantized::unrotate(o, &v);
            }
            Sink::Partial(pp) => {
                // SAFETY: each task writes its own heads' states in its chunk's partials.
                let st = unsafe { std::slice::from_raw_parts_mut(pp.get().add(h * (hd + 2)), hd + 2) };
                (st[0], st[1]) = (mm[r], ss[r]);
                st[2..].copy_from_slice(&folded[at]);
            }
        }
    }
}

/// ggml's soft-capping of scaled scores, `cap · tanhf(s)` (libm's tanhf, as ggml's);
/// returns their maximum.
fn softcap(w: &mut [f32], cap: f32) -> f32 {
    w.iter_mut().fold(f32::NEG_INFINITY, |m, w| {
        *w = cap * w.tanh();
        if *w > m {
            *w
        } else {
            m
        }
    })
}

/// Where a block's keys lie in a cache, for [`prefetch`]: key `i`'s `len` bytes at
/// `at + i * stride`, for `n` keys.
#[derive(Clone, Copy, Default)]
struct Span {
    at: usize,
    stride: usize,
    len: usize,
    n: usize,
}

/// Asks for the cache lines of `row` in L2 (a hint; no effect on results).
#[inline(always)]
fn prefetch(row: &[u8]) {
    #[cfg(target_arch = "x86_64")]
    for i in (0..row.len()).step_by(64) {
        // SAFETY: prefetching is a hint and `i` is inside the slice.
        unsafe {
            std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T1 }>(row.as_ptr().add(i).cast())
        };
    }
}

/// f16 -> f32 (exact), with F16C where the CPU has it.
fn widen(src: &[f16], dst: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if quant::cpu_tier() >= quant::CpuTier::Avx512 {
        // SAFETY: the CPU has AVX-512 F; `dst` is as long as `src`.
        return unsafe { simd::wide::widen(src, dst) };
    }
    quant::dequantize_row(GgmlType::F16, bytemuck::cast_slice(src), dst).expect("sizes match");
}

/// Widens a block's cached rows: for each `(i, at)` in `spans`, the span at `at` of `src`
/// holds the task's KV heads one after another (`hd` values each); head `j`'s values go to
/// row `i` of its block in `dst`, `[KV head][K_BLOCK][hd]`. Spans in address order, each
/// read front to back, so the cache streams in (one call and tier check per block).
fn widen_rows(src: &[f16], spans: impl Iterator<Item = (usize, usize)>, hd: usize, dst: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if quant::cpu_tier() >= quant::CpuTier::Avx512 {
        // SAFETY: the CPU has AVX-512 F.
        return unsafe { simd::wide::widen_rows(src, spans, hd, dst) };
    }
    each_row(src, spans, hd, dst, widen)
}

/// `row(source row, destination row)` for each KV head's row of `spans` (see
/// [`widen_rows`]): the layout walk that the widen and the f16 copy share.
#[inline(always)]
fn each_row<E>(
    src: &[f16],
    spans: impl Iterator<Item = (usize, usize)>,
    hd: usize,
    dst: &mut [E],
    mut row: impl FnMut(&[f16], &mut [E]),
) {
    for (i, at) in spans {
        for (j, d) in dst.chunks_exact_mut(K_BLOCK * hd).enumerate() {
            row(&src[at + j * hd..at + (j + 1) * hd], &mut d[i * hd..(i + 1) * hd]);
        }
    }
}

/// Rounds every value to the nearest f16 (ties to even), as storing to f16 does.
fn round_f16(x: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if quant::cpu_tier() >= quant::CpuTier::Avx512 {
        // SAFETY: the CPU has AVX-512 F (and AVX2, FMA, F16C).
        return unsafe { simd::wide::round_f16(x) };
    }
    #[cfg(target_arch = "x86_64")]
    if quant::cpu_tier() >= quant::CpuTier::Avx2 {
        // SAFETY: the CPU has AVX2, FMA and F16C.
        return unsafe { simd::round_f16(x) };
    }
    x.iter_mut().for_each(|v| *v = f16::from_f32(*v).to_f32());
}

/// ggml's `ggml_vec_dot_f16` (see the tests' `dot_f16`) of `q` with each key of a K tile
/// (`[hd][K_BLOCK]`, widened): the same sums, each key in a lane of its own, so the loops
/// vectorize over the keys and no key needs a horizontal sum. `acc[16j + l]` is lane `l` of ggml's accumulator `j`; its first sum
/// adds to +0 as ggml's first multiply-add does.
#[inline(always)]
#[allow(clippy::needless_range_loop)] // l indexes several arrays at once
fn dots_tile(q: &[f32], kt: &[f32]) -> [f32; K_BLOCK] {
    let hd = q.len();
    let np = hd / 64 * 64;
    let mut acc = [[0f32; K_BLOCK]; 64];
    for i0 in (0..np).step_by(64) {
        for (c, a) in acc.iter_mut().enumerate() {
            let (qd, k) = (q[i0 + c], &kt[(i0 + c) * K_BLOCK..(i0 + c + 1) * K_BLOCK]);
            a.iter_mut().zip(k).for_each(|(a, &k)| *a += qd * k);
        }
    }
    // `reduce16`'s tree, lane by lane.
    let mut x = [[0f32; K_BLOCK]; 16];
    for l in 0..16 {
        for i in 0..K_BLOCK {
            x[l][i] = (acc[l][i] + acc[32 + l][i]) + (acc[16 + l][i] + acc[48 + l][i]);
        }
    }
    for w in [8, 4] {
        for l in 0..w {
            for i in 0..K_BLOCK {
                x[l][i] += x[l + w][i];
            }
        }
    }
    std::array::from_fn(|i| {
        let mut sum = ((x[0][i] + x[2][i]) + (x[1][i] + x[3][i])) as f64;
        for d in np..hd {
            sum += (q[d] * kt[d * K_BLOCK + i]) as f64;
        }
        sum as f32
    })
}

/// `acc = f16(acc * s)`: the f16 accumulator's rescale.
fn scale_f16(acc: &mut [f32], s: f32) {
    #[cfg(target_arch = "x86_64")]
    if quant::cpu_tier() >= quant::CpuTier::Avx512 {
        // SAFETY: the CPU has AVX-512 F (and AVX2, FMA, F16C).
        return unsafe { simd::wide::scale_f16(acc, s) };
    }
    #[cfg(target_arch = "x86_64")]
    if quant::cpu_tier() >= quant::CpuTier::Avx2 {
        // SAFETY: the CPU has AVX2, FMA and F16C.
        return unsafe { simd::scale_f16(acc, s) };
    }
    acc.iter_mut().for_each(|a| *a = f16::from_f32(*a * s).to_f32());
}

/// `acc = f16(fma(v, s, acc))`: one key's contribution to the f16 accumulator.
fn mad_f16(acc: &mut [f32], v: &[f32], s: f32) {
    #[cfg(target_arch = "x86_64")]
    if quant::cpu_tier() >= quant::CpuTier::Avx512 {
        // SAFETY: the CPU has AVX-512 F (and AVX2, FMA, F16C).
        return unsafe { simd::wide::mad_f16(acc, v, s) };
    }
    #[cfg(target_arch = "x86_64")]
    if quant::cpu_tier() >= quant::CpuTier::Avx2 {
        // SAFETY: the CPU has AVX2, FMA and F16C.
        return unsafe { simd::mad_f16(acc, v, s) };
    }
    acc.iter_mut().zip(v).for_each(|(a, &x)| *a = f16::from_f32(x.mul_add(s, *a)).to_f32());
}

#[cfg(target_arch = "x86_64")]
mod simd {
    use std::arch::x86_64::*;

    use half::f16;

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn round8(v: __m256) -> __m256 {
        _mm256_cvtph_ps(_mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(v))
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn round_f16(x: &mut [f32]) {
        let mut c = x.chunks_exact_mut(8);
        for c in &mut c {
            _mm256_storeu_ps(c.as_mut_ptr(), round8(_mm256_loadu_ps(c.as_ptr())));
        }
        c.into_remainder().iter_mut().for_each(|v| *v = f16::from_f32(*v).to_f32());
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn scale_f16(acc: &mut [f32], s: f32) {
        let vs = _mm256_set1_ps(s);
        let mut c = acc.chunks_exact_mut(8);
        for c in &mut c {
            let a = _mm256_mul_ps(_mm256_loadu_ps(c.as_ptr()), vs);
            _mm256_storeu_ps(c.as_mut_ptr(), round8(a));
        }
        c.into_remainder().iter_mut().for_each(|a| *a = f16::from_f32(*a * s).to_f32());
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn mad_f16(acc: &mut [f32], v: &[f32], s: f32) {
        let vs = _mm256_set1_ps(s);
        let mut c = acc.chunks_exact_mut(8);
        let mut x = v.chunks_exact(8);
        for (c, x) in (&mut c).zip(&mut x) {
            let a = _mm256_fmadd_ps(_mm256_loadu_ps(x.as_ptr()), vs, _mm256_loadu_ps(c.as_ptr()));
            _mm256_storeu_ps(c.as_mut_ptr(), round8(a));
        }
        for (a, &x) in c.into_remainder().iter_mut().zip(x.remainder()) {
            *a = f16::from_f32(x.mul_add(s, *a)).to_f32();
        }
    }
    /// The same operations on 16 lanes at a time (AVX-512 F): per lane the arithmetic of
    /// the 8-lane forms above, so the same bits, in half the instructions.
    pub mod wide {
        use std::arch::x86_64::*;

        use half::f16;

        #[inline]
        #[target_feature(enable = "avx512f,avx2,fma,f16c")]
        pub(in super::super) unsafe fn round16(v: __m512) -> __m512 {
            _mm512_cvtph_ps(_mm512_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(v))
        }

        #[target_feature(enable = "avx512f,avx2,fma,f16c")]
        pub unsafe fn widen_rows(
            src: &[f16],
            spans: impl Iterator<Item = (usize, usize)>,
            hd: usize,
            dst: &mut [f32],
        ) {
            for (i, at) in spans {
                for (j, d) in dst.chunks_exact_mut(super::super::K_BLOCK * hd).enumerate() {
                    widen(&src[at + j * hd..at + (j + 1) * hd], &mut d[i * hd..(i + 1) * hd]);
                }
            }
        }

        #[inline]
        #[target_feature(enable = "avx512f,avx2,fma,f16c")]
        pub unsafe fn widen(src: &[f16], dst: &mut [f32]) {
            let n = src.len().min(dst.len());
            let body = n / 16 * 16;
            for i in (0..body).step_by(16) {
                let h = _mm256_loadu_si256(src.as_ptr().add(i).cast());
                _mm512_storeu_ps(dst.as_mut_ptr().add(i), _mm512_cvtph_ps(h));
            }
            dst[body..n].iter_mut().zip(&src[body..n]).for_each(|(d, s)| *d = s.to_f32());
        }

        #[target_feature(enable = "avx512f,avx2,fma,f16c")]
        pub unsafe fn round_f16(x: &mut [f32]) {
            let body = x.len() / 16 * 16;
            for i in (0..body).step_by(16) {
                let p = x.as_mut_ptr().add(i);
                _mm512_storeu_ps(p, round16(_mm512_loadu_ps(p)));
            }
            x[body..].iter_mut().for_each(|v| *v = f16::from_f32(*v).to_f32());
        }

        #[target_feature(enable = "avx512f,avx2,fma,f16c")]
        pub unsafe fn scale_f16(acc: &mut [f32], s: f32) {
            let vs = _mm512_set1_ps(s);
            let body = acc.len() / 16 * 16;
            for i in (0..body).step_by(16) {
                let p = acc.as_mut_ptr().add(i);
                _mm512_storeu_ps(p, round16(_mm512_mul_ps(_mm512_loadu_ps(p), vs)));
            }
            acc[body..].iter_mut().for_each(|a| *a = f16::from_f32(*a * s).to_f32());
        }

        #[target_feature(enable = "avx512f,avx2,fma,f16c")]
        pub unsafe fn mad_f16(acc: &mut [f32], v: &[f32], s: f32) {
            let vs = _mm512_set1_ps(s);
            let n = acc.len().min(v.len());
            let body = n / 16 * 16;
            for i in (0..body).step_by(16) {
                let p = acc.as_mut_ptr().add(i);
                let a = _mm512_fmadd_ps(_mm512_loadu_ps(v.as_ptr().add(i)), vs, _mm512_loadu_ps(p));
                _mm512_storeu_ps(p, round16(a));
            }
            for (a, &x) in acc[body..n].iter_mut().zip(&v[body..n]) {
                *a = f16::from_f32(x.mul_add(s, *a)).to_f32();
            }
        }
    }
}

#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    use super::simd;
    use half::f16;

    fn values(n: usize, seed: u32) -> Vec<f32> {
        let mut s = seed;
        (0..n)
            .map(|_| {
                s = s.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
                f16::from_f32((s >> 8) as f32 / (1 << 24) as f32 * 8.0 - 4.0).to_f32()
            })
            .collect()
    }

    /// The 16-lane primitives give the bits of the 8-lane ones (and of the per-value
    /// rounding), for head sizes with and without tails.
    #[test]
    fn wide_primitives_match_the_avx2_ones() {
        if !(is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("avx2")) {
            eprintln!("skipped: no AVX-512 F on this CPU");
            return;
        }
        for n in [8, 64, 72, 80, 128, 200, 256] {
            let (q, k) = (values(n, 1), values(n, 2));
            // SAFETY (all calls): the CPU has AVX-512 F, AVX2, FMA and F16C (checked).
            let mut raw = values(n, 3);
            raw.iter_mut().for_each(|x| *x *= 1.001);
            let (mut r8, mut r16) = (raw.clone(), raw.clone());
            unsafe { (simd::round_f16(&mut r8), simd::wide::round_f16(&mut r16)) };
            let per_value: Vec<f32> = raw.iter().map(|&x| f16::from_f32(x).to_f32()).collect();
            assert_eq!(r8, per_value, "round, n = {n}");
            assert_eq!(r16, per_value, "round, n = {n}");
            let (mut s8, mut s16) = (q.clone(), q.clone());
            unsafe { (simd::scale_f16(&mut s8, 0.37), simd::wide::scale_f16(&mut s16, 0.37)) };
            assert_eq!(s8, s16, "scale, n = {n}");
            let (mut m8, mut m16) = (q.clone(), q.clone());
            unsafe { (simd::mad_f16(&mut m8, &k, 0.61), simd::wide::mad_f16(&mut m16, &k, 0.61)) };
            assert_eq!(m8, m16, "mad, n = {n}");
            let h: Vec<f16> = k.iter().map(|&x| f16::from_f32(x)).collect();
            let mut w = vec![0f32; n];
            unsafe { simd::wide::widen(&h, &mut w) };
            assert_eq!(w, k, "widen, n = {n}");
        }
    }
}

#[cfg(test)]
mod reference_tests {
    use super::super::kv_buf::KvBuf;
    use super::*;

    /// The dot product of f16 values (held as f32) summed in the order of ggml's
    /// `ggml_vec_dot_f16` on AVX-512: four 16-lane accumulators over blocks of 64, a fixed
    /// reduction tree, the tail added in f64. Products of f16 values are exact in f32.
    fn dot_f16(q: &[f32], k: &[f32]) -> f32 {
        let np = q.len() / 64 * 64;
        let mut acc = [[0f32; 16]; 4];
        for i in (0..np).step_by(64) {
            for (j, a) in acc.iter_mut().enumerate() {
                for (l, a) in a.iter_mut().enumerate() {
                    *a += q[i + j * 16 + l] * k[i + j * 16 + l];
                }
            }
        }
        let x: [f32; 16] = std::array::from_fn(|l| (acc[0][l] + acc[2][l]) + (acc[1][l] + acc[3][l]));
        reduce16(x, &q[np..], &k[np..])
    }

    /// `_mm512_reduce_add_ps` (halves, then quarters, then pairs), then the f64 tail.
    fn reduce16(x: [f32; 16], qt: &[f32], kt: &[f32]) -> f32 {
        let t1: [f32; 8] = std::array::from_fn(|l| x[l + 8] + x[l]);
        let t2: [f32; 4] = std::array::from_fn(|l| t1[l + 4] + t1[l]);
        let mut sum = ((t2[0] + t2[2]) + (t2[1] + t2[3])) as f64;
        for (&a, &b) in qt.iter().zip(kt) {
            sum += (a * b) as f64;
        }
        sum as f32
    }

    /// The arithmetic before tasks grouped heads and blocked keys: one (query, head) at a
    /// time, each chunk of KV_CHUNK keys on its own, then the chunks folded one after
    /// another; a chunk in ggml's arithmetic (`chunk_ggml`) or kiln's f32 one (`chunk_f32`)
    /// as `arith` says. The kernels must give its bits. Over quantized caches: the query
    /// rotated and quantized, each key's dot product of its blocks, values dequantized and
    /// the ggml chunks' accumulator in f32, the output rotated back.
    fn reference(q: &[f32], k: Cache, v: Cache, plan: &AttnPlan, arith: AttnArith) -> Vec<f32> {
        let (n_head, hd) = (plan.n_head, plan.head_dim);
        let kv_dim = plan.n_head_kv * hd;
        let krows = super::super::kv_buf::k_rows(k.f16(), kv_dim);
        let mut out = vec![0f32; q.len()];
        for t in 0..plan.pos.len() {
            for h in 0..n_head {
                let kvh = h / (n_head / plan.n_head_kv);
                let mut qr = q[(t * n_head + h) * hd..][..hd].to_vec();
                qr.iter_mut().for_each(|x| *x *= plan.q_scale(t));
                let mut qq = Vec::new();
                match k.blocks() {
                    Some(b) => {
                        if let Some(n) = b.rot {
                            crate::kv::hadamard(&mut qr, n);
                        }
                        let vdt = b.ty.vec_dot_type();
                        qq = vec![0u8; vdt.row_size(hd).unwrap()];
                        quant::quantize_activation(vdt, &qr, &mut qq).unwrap();
                    }
                    None => round_f16(&mut qr),
                }
                let row = |p: u32| plan.slot(plan.seq[t], p) * kv_dim + kvh * hd;
                // Head `kvh`'s values at position `p` of a cache, as f32.
                let values = |c: &Cache, rows: &[f16], p: u32| {
                    let mut x = vec![0f32; hd];
                    match c.blocks() {
                        Some(b) => {
                            let head = b.ty.row_size(hd).unwrap();
                            let at = plan.slot(plan.seq[t], p) * head * plan.n_head_kv + kvh * head;
                            quant::dequantize_row(b.ty, &b.data[at..at + head], &mut x).unwrap();
                        }
                        None => widen(&rows[row(p)..row(p) + hd], &mut x),
                    }
                    x
                };
                let score = |p: u32| {
                    let d = match k.blocks() {
                        Some(b) => {
                            let head = b.ty.row_size(hd).unwrap();
                            let at = plan.slot(plan.seq[t], p) * head * plan.n_head_kv + kvh * head;
                            quant::vec_dot_fn(b.ty)(&b.data[at..at + head], &qq, hd)
                        }
                        None => dot_f16(&qr, &values(&k, &krows, p)),
                    };
                    let s = d * plan.score_scale();
                    let s = if plan.softcap != 0.0 { plan.softcap * s.tanh() } else { s };
                    s + plan.bias(t, h, p)
                };
                let key = |p: u32| (score(p), values(&v, v.f16(), p));
                let round = v.blocks().is_none();
                let mut folded = vec![0f32; hd];
                let (mut mm, mut ss) = (f32::NEG_INFINITY, 0f32);
                let (first, last) = (plan.first_pos(t), plan.last_pos(t));
                for c in first / KV_CHUNK..=last / KV_CHUNK {
                    let keys = first.max(c * KV_CHUNK)..=last.min((c + 1) * KV_CHUNK - 1);
                    let (m, sum, acc) = if arith.f16_in_chunk(c) {
                        chunk_ggml(keys, hd, &key, round)
                    } else {
                        chunk_f32(keys, hd, &key)
                    };
                    fold(&mut mm, &mut ss, &mut folded, m, sum, &acc);
                }
                let inv = if ss == 0.0 { 0.0 } else { 1.0 / ss };
                let o = &mut out[(t * n_head + h) * hd..][..hd];
                o.iter_mut().zip(&folded).for_each(|(o, &a)| *o = a * inv);
                quantized::unrotate(o, &v);
            }
        }
        out
    }

    /// A chunk's (maximum, sum of weights, accumulator) in ggml's arithmetic: keys one at a
    /// time, libm's `expf` per key, the accumulator rounded to f16 after every step where
    /// `round` (an f16 V cache), else in f32.
    fn chunk_ggml(
        keys: std::ops::RangeInclusive<u32>,
        hd: usize,
        key: &dyn Fn(u32) -> (f32, Vec<f32>),
        round: bool,
    ) -> (f32, f32, Vec<f32>) {
        let mut acc = vec![0f32; hd];
        let (mut m, mut sum) = (f32::NEG_INFINITY, 0f32);
        for p in keys {
            let (score, v) = key(p);
            let (ms, vs);
            if score > m {
                ms = (m - score).exp();
                vs = 1.0;
                m = score;
                if round {
                    scale_f16(&mut acc, ms);
                } else {
                    acc.iter_mut().for_each(|a| *a *= ms);
                }
            } else {
                ms = 1.0;
                vs = (score - m).exp();
            }
            if round {
                mad_f16(&mut acc, &v, vs);
            } else {
                acc.iter_mut().zip(&v).for_each(|(a, &x)| *a = x.mul_add(vs, *a));
            }
            sum = sum.mul_add(ms, vs);
        }
        (m, sum, acc)
    }

    /// The same in kiln's f32 arithmetic, written plainly: keys in blocks aligned to
    /// multiples of K_BLOCK; the block's maximum rescales the row once; then each key's
    /// weight `expf(score - m)` added to the sum and multiplied into the f32 accumulator.
    fn chunk_f32(
        keys: std::ops::RangeInclusive<u32>,
        hd: usize,
        key: &dyn Fn(u32) -> (f32, Vec<f32>),
    ) -> (f32, f32, Vec<f32>) {
        let mut acc = vec![0f32; hd];
        let (mut m, mut sum) = (f32::NEG_INFINITY, 0f32);
        let (first, last) = (*keys.start(), *keys.end());
        let mut p0 = first - first % K_BLOCK as u32;
        while p0 <= last {
            let block: Vec<(f32, Vec<f32>)> =
                (p0.max(first)..=(p0 + K_BLOCK as u32 - 1).min(last)).map(key).collect();
            let mb = block.iter().fold(f32::NEG_INFINITY, |a, b| if b.0 > a { b.0 } else { a });
            if mb > m {
                if m > f32::NEG_INFINITY {
                    let f = (m - mb).exp();
                    acc.iter_mut().for_each(|a| *a *= f);
                    sum *= f;
                }
                m = mb;
            }
            for (s, v) in block {
                let w = (s - m).exp();
                acc.iter_mut().zip(&v).for_each(|(a, &x)| *a = x.mul_add(w, *a));
                sum += w;
            }
            p0 += K_BLOCK as u32;
        }
        (m, sum, acc)
    }

    struct Rng(u64);
    impl Rng {
        fn f(&mut self) -> f32 {
            self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            (self.0 >> 40) as f32 / (1u64 << 24) as f32 - 0.5
        }
    }

    /// Decode steps, batches of several sequences, prompts (causal tiles), a sliding
    /// window; head shapes with and without grouped queries, head sizes the 16-lane kernels
    /// take and one they do not; 1 to 3 threads; both arithmetics. Keys spread widely, so
    /// the maximum moves and some weights fall below `expf`'s underflow.
    /// The storages the kernels are checked over: f16, each quantized type for K and for
    /// V, and mixes.
    const CACHE_PAIRS: [(GgmlType, GgmlType); 7] = [
        (GgmlType::F16, GgmlType::F16),
        (GgmlType::Q8_0, GgmlType::Q8_0),
        (GgmlType::Q4_1, GgmlType::Q8_0),
        (GgmlType::Q4_0, GgmlType::F16),
        (GgmlType::F16, GgmlType::Q5_1),
        (GgmlType::IQ4_NL, GgmlType::Q4_1),
        (GgmlType::Q5_0, GgmlType::IQ4_NL),
    ];

    #[test]
    fn matches_the_references_bit_for_bit() {
        // Head sizes of the specialized kernels, with groups of 1 to 7 query heads (their
        // scores taken up to 3 rows at a time); and two of the generic one.
        let shapes = [
            (12, 2, 128),
            (6, 2, 128),
            (9, 3, 64),
            (14, 2, 64),
            (4, 1, 256),
            (3, 1, 256),
            (4, 4, 80),
            (6, 2, 192),
        ];
        let pools: Vec<ThreadPool> = (1..=3).map(ThreadPool::new).collect();
        let mut rng = Rng(7);
        // KV blocks smaller than a key block (a lookup per key, the rows gathered) and
        // holding two (as the engine's 32: the rows read in place).
        let blocks = [(4usize, 160u32), (32, 20)];
        // The whole product takes ~18 minutes on 2 cores: the fast tier takes every seventh
        // (shape, blocks, case, caches) combination, rotating so that each case meets every
        // cache pair over the shapes; KILN_FULL=1 takes them all.
        let full = std::env::var("KILN_FULL").is_ok_and(|v| v == "1");
        for (si, ((n_head, n_kv, hd), (block_size, n_blocks))) in
            shapes.into_iter().flat_map(|s| blocks.map(|b| (s, b))).enumerate()
        {
            let slots = block_size * n_blocks as usize;
            let kv_dim = n_kv * hd;
            let krows: Vec<f32> =
                (0..slots * kv_dim).map(|i| rng.f() * if (i / hd) % 7 == 0 { 60.0 } else { 6.0 }).collect();
            let vrows: Vec<f32> = (0..slots * kv_dim).map(|_| rng.f() * 2.0).collect();
            // The caches as each storage holds these rows (quantized ones for heads of whole
            // blocks: rotated where the head allows).
            let all: Vec<u32> = (0..slots as u32).collect();
            let caches: Vec<(KvBuf, KvBuf)> = CACHE_PAIRS
                .iter()
                .filter(|(k, v)| hd % 32 == 0 || (*k, *v) == (GgmlType::F16, GgmlType::F16))
                .map(|&(k, v)| {
                    let types = crate::kv::KvTypes { k, v };
                    let mut kc = KvBuf::typed(slots, kv_dim, k, types.k_rotation(hd)).unwrap();
                    let mut vc = KvBuf::typed(slots, kv_dim, v, types.v_rotation(hd)).unwrap();
                    super::super::kv_rows::store(&mut kc, true, &krows, &all, kv_dim);
                    super::super::kv_rows::store(&mut vc, false, &vrows, &all, kv_dim);
                    (kc, vc)
                })
                .collect();
            // Two sequences with scrambled block tables.
            let half = n_blocks / 2;
            let t0: Vec<u32> = (0..half).map(|b| (b * 37) % half).collect();
            let t1: Vec<u32> = (0..half).map(|b| half + (b * 13) % half).collect();
            let tables = [&t0[..], &t1[..]];
            // (pos, seq) lists.
            // 300: two chunks (a split decode; with a window of 100 too), 310 with a window of 40: one.
            let decode = vec![(300, 0)];
            let decode_late = vec![(310, 1)];
            let batch = vec![(17, 0), (250, 1), (5, 1)];
            let prompt: Vec<(u32, u32)> = (0..37).map(|p| (p + 3, 0)).chain((0..5).map(|p| (p, 1))).collect();
            // A prompt whose queries cross a chunk boundary.
            let long: Vec<(u32, u32)> = (250..262).map(|p| (p, 0)).collect();
            // Encoders: every query sees its whole sequence (40 and 300 positions), with
            // and without ALiBi.
            let encoder: Vec<(u32, u32)> = (0..40).map(|p| (p, 0)).chain((0..300).map(|p| (p, 1))).collect();
            let lens = [40u32, 300];
            // Plain, and with gemma2's soft-capping and queries scaled per token.
            let cases = [
                (decode.clone(), None, None, None),
                (decode, Some(100), None, None),
                (decode_late, Some(40), None, None),
                (batch.clone(), None, None, Some(8.0)),
                (prompt.clone(), None, None, None),
                (prompt, Some(5), None, None),
                (long, None, None, None),
                (encoder.clone(), None, Some(&lens[..]), None),
                (encoder, None, Some(&lens[..]), Some(8.0)),
            ];
            for (ci, ((toks, window, seq_len, alibi), capped)) in
                cases.into_iter().flat_map(|c| [(c.clone(), false), (c, true)]).enumerate()
            {
                let pos: Vec<u32> = toks.iter().map(|t| t.0).collect();
                let seq: Vec<u32> = toks.iter().map(|t| t.1).collect();
                let q_scale: Vec<f32> = pos.iter().map(|&p| 0.3 + p as f32 / 100.0).collect();
                let plan = AttnPlan {
                    pos: &pos,
                    seq: &seq,
                    tables: &tables,
                    block_size,
                    n_head,
                    n_head_kv: n_kv,
                    head_dim: hd,
                    scale: 1.0 / (hd as f32).sqrt(),
                    q_scale: if capped { &q_scale } else { &[] },
                    softcap: if capped { 5.0 } else { 0.0 },
                    window,
                    seq_len,
                    alibi,
                };
                let q: Vec<f32> = (0..pos.len() * n_head * hd).map(|_| rng.f() * 8.0).collect();
                for (ki, (kc, vc)) in caches.iter().enumerate() {
                    if !full && (si + ci + ki) % 7 != 0 {
                        continue;
                    }
                    let (k, v) = (super::super::kv_rows::cache(kc), super::super::kv_rows::cache(vc));
                    let types = (kc.ty(), vc.ty());
                    for arith in [AttnArith::Hybrid, AttnArith::Ggml, AttnArith::F32] {
                        let want = reference(&q, k, v, &plan, arith);
                        for pool in &pools {
                            let mut out = vec![f32::NAN; q.len()];
                            attention(pool, &q, k, v, &plan, arith, &mut out);
                            for (i, (a, b)) in out.iter().zip(&want).enumerate() {
                                assert_eq!(
                                    a.to_bits(),
                                    b.to_bits(),
                                    "{types:?} {arith:?}, heads {n_head}/{n_kv}x{hd}, {} tokens, window {window:?}, capped {capped}, \
                                     non-causal {seq_len:?}, alibi {alibi:?}, {} threads: value {i}",
                                    pos.len(),
                                    pool.n_threads()
                                );
                            }
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn hybrid_takes_ggml_arithmetic_in_the_first_chunk_alone() {
        let chunks = |a: AttnArith| (0..4).map(|c| a.f16_in_chunk(c)).collect::<Vec<_>>();
        assert_eq!(chunks(AttnArith::default()), [true, false, false, false]);
        assert_eq!(chunks(AttnArith::Ggml), [true; 4]);
        assert_eq!(chunks(AttnArith::F32), [false; 4]);
    }

    #[test]
    fn tasks_split_heads_to_keep_threads_busy() {
        // qwen2.5-1.5b decode: a task per KV head; smollm2: three groups of 3 over 2 threads.
        assert_eq!(heads_per_task(2, 6, 32, 2), 6);
        assert_eq!(heads_per_task(3, 3, 32, 2), 2);
        assert_eq!(heads_per_task(1, 4, 32, 2), 2);
        assert_eq!(heads_per_task(3, 3, 32, 1), 3);
        // A prompt: at most 4 heads of 8 queries per task.
        assert_eq!(heads_per_task(128, 6, 4, 2), 3);
    }
}
