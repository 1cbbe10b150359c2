//! The GPU backend on wgpu: weights uploaded once in their quantized form, one WGSL kernel
//! per op, every op of a forward recorded into one submission that the read-back flushes.
//! Vulkan on Linux (lavapipe in CI), Metal and DX12 compile but are untested here.

mod context;
pub mod coop;
pub mod coop_attn;
pub mod kernels;
mod moe;
mod moe_coop;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use ::wgpu;

use super::{
    Activation, AttnPlan, Backend, ConvPlan, ConvSource, ExpertInput, IdsTicket, LayerNorm, RopeParams,
    Routing,
};
use crate::error::{KilnError, Result};
use crate::gguf::{GgufFile, TensorInfo};
use crate::quant::{self, GgmlType};
pub use context::AdapterPolicy;
use context::{Context, Recorder};
use kernels::{AttnKind, AttnTail, Input, Kernel, KvOp, Pipelines};
pub use moe::GpuExperts;

/// Rows of a weight stored in one buffer (weights over the binding limit are split).
struct Part {
    buf: wgpu::Buffer,
    row0: usize,
    rows: usize,
    /// Row of `buf` where this part starts (weights uploaded together share a buffer).
    first: usize,
}

/// A weight on the device, in its GGUF block format (F32 for vectors).
pub struct GpuWeight {
    parts: Vec<Part>,
    pub ty: GgmlType,
    pub rows: usize,
    pub cols: usize,
    row_size: usize,
}

/// f32 activations.
pub struct GpuBuf {
    buf: wgpu::Buffer,
    len: usize,
    /// The other buffer of an op's output written out of place (the fused add + norm's
    /// `x + y`, the GLU's output): the op's workgroups all read the old values, then the
    /// two swap.
    alt: Option<wgpu::Buffer>,
}

/// A KV cache: f16 values two per u32 word, or rows of blocks of a quantized cache type
/// (crate::kv::types; kv_rows.wgsl stores them, the attention kernels read them).
pub struct GpuKv {
    buf: wgpu::Buffer,
    ty: GgmlType,
    /// Values per Walsh-Hadamard group of the stored rows (`None`: not rotated).
    rot: Option<usize>,
}

/// A `KvRows` kernel's parameters (kv_rows.wgsl) for `n` rows of `dim` values of `kv` at `slots`.
fn kv_rows_prm(kv: &GpuKv, n: usize, dim: usize, slots: &[u32]) -> Vec<u32> {
    let mut prm = vec![n as u32, dim as u32];
    prm.extend(kv_rows_words(kv, dim));
    prm.extend_from_slice(slots);
    prm
}

/// A cache's rotation for kv_rows.wgsl (and the fused RoPE store): the group, whether it
/// is rotated, the scale, and the chunk of a row a workgroup takes.
fn kv_rows_words(kv: &GpuKv, dim: usize) -> [u32; 4] {
    let (group, rotated) = kv_group(kv);
    let scale = f(1.0 / (group as f32).sqrt());
    [group as u32, rotated as u32, scale, kv_chunk(kv, dim) as u32]
}

/// Values per rotation group: the cache's, or a block; and whether the group is rotated.
fn kv_group(kv: &GpuKv) -> (usize, bool) {
    match kv.rot {
        Some(n) => (n, true),
        None => (32, false),
    }
}

/// Values of a row a workgroup of kv_rows.wgsl stores or loads: whole groups, up to 256,
/// dividing the row (from 64 on, whole words of any type's blocks).
fn kv_chunk(kv: &GpuKv, dim: usize) -> usize {
    let g = kv_group(kv).0;
    [256, 128, 64].into_iter().find(|&c| c >= g && dim.is_multiple_of(c)).unwrap_or(g)
}

fn kv_rows_grid(kv: &GpuKv, n: usize, dim: usize) -> [u32; 3] {
    grid(n * dim / kv_chunk(kv, dim), 1)
}

/// Every backend op records at least one dispatch: no op of the forward has a CPU path.
#[derive(Debug, Default)]
pub struct OpCounts {
    pub ops: AtomicU64,
    pub dispatches: AtomicU64,
}

impl OpCounts {
    pub fn get(&self) -> (u64, u64) {
        (self.ops.load(Ordering::Relaxed), self.dispatches.load(Ordering::Relaxed))
    }
}

pub struct GpuBackend {
    ctx: Context,
    pipes: Pipelines,
    rec: Mutex<Recorder>,
    /// Activations rounded through the weight's dot type before a matmul (grown on demand).
    act: Mutex<Option<wgpu::Buffer>>,
    /// The down experts' activations where the GLU in the gate and up projection's tail
    /// makes them (that projection reads its own from `act` meanwhile).
    act_glu: Mutex<Option<wgpu::Buffer>>,
    /// What the activation scratch holds: (source buffer, mode, values). Matmuls of one
    /// input (q/k/v, gate/up) quantize it once; every other op clears this.
    act_src: Mutex<Option<(wgpu::Buffer, u32, usize)>>,
    /// An op not yet dispatched: the matmul reading its output runs it with the activation
    /// quantize in one kernel; any other op dispatches it first (`flush`).
    pending: Mutex<Option<Pending>>,
    /// Most bytes a decode matmul's workgroups may read between them for their prologue
    /// (kernels.rs `Input`; each reads the whole input row): more, and a dispatch before
    /// it is cheaper (`PROLOGUE_BYTES`; tests set 0: never).
    prologue_bytes: usize,
    /// The fewest invocations the vec matmul gives a short row (kernels.rs `vec_npr_min`).
    npr_min: usize,
    /// The argmax ids of the last greedy step (grown on demand).
    ids: Mutex<Option<wgpu::Buffer>>,
    /// The split attention's partial sums, the long argmax's per-part bests (grown on demand).
    part: Mutex<Option<wgpu::Buffer>>,
    /// The tile matmul's partial sums over splits of k (grown on demand).
    coop_part: Mutex<Option<wgpu::Buffer>>,
    /// A quantized KV cache's f32 rows: the rotated query, the attention's output before
    /// it is rotated back, a context shift's keys (grown on demand).
    kv_tmp: Mutex<Option<wgpu::Buffer>>,
    /// The query quantized for a quantized K cache's dot products (grown on demand).
    kv_q: Mutex<Option<wgpu::Buffer>>,
    /// The router matmul's count of finished workgroups per token group (its route tail:
    /// kernels.rs ROUTE_TAIL; zero between dispatches; grown on demand).
    route_counts: Mutex<Option<wgpu::Buffer>>,
    /// The attention block tail's counters (attn_block_quantize.wgsl).
    attn_counts: Mutex<Option<wgpu::Buffer>>,
    /// The expert down projection's sum tail's counters (kernels.rs SUM_TAIL).
    sum_counts: Mutex<Option<wgpu::Buffer>>,
    /// The expert gate and up projection's GLU tail's counters (kernels.rs GLU_TAIL).
    glu_counts: Mutex<Option<wgpu::Buffer>>,
    /// The q/k/v matmul's norm and RoPE tail's counters (norm_rope_tail.wgsl).
    head_counts: Mutex<Option<wgpu::Buffer>>,
    /// A prompt's expert slots grouped by expert for the expert tiles (moe_coop.rs; grown
    /// on demand).
    expert_groups_buf: Mutex<Option<wgpu::Buffer>>,
    counts: Arc<OpCounts>,
    /// GELU of every f16 value (the CPU's table, 128 KiB; glu.wgsl).
    gelu: wgpu::Buffer,
    /// Weights larger than this are split by rows (the binding limit).
    split_bytes: u64,
    matmul: MatmulPath,
    /// Cooperative matrices for the tile matmul, where the adapter has them (coop.rs).
    coop: Option<coop::CoopCaps>,
    /// Every matmul on the batch-invariant paths (no tiles): a sequence's results do not
    /// depend on what shares its batch.
    batch_invariant: bool,
    /// Replaces `coop::shape` (tuning tools: examples/gpu_tiles.rs).
    shape_override: Option<ShapeChoice>,
}

/// A tile shape for (tokens, weight rows, k), or None for the other paths.
pub type ShapeChoice = Arc<dyn Fn(usize, usize, usize) -> Option<coop::CoopShape> + Send + Sync>;

/// A decode matmul's prologue (`GpuBackend::prologue`): its kernel input, parameters, and
/// buffers from binding 2 on.
type Prologue = (Input, Vec<u32>, Vec<wgpu::Buffer>);

/// A dispatch recorded but not yet run.
struct Dispatch {
    kernel: Kernel,
    prm: Vec<u32>,
    bufs: Vec<wgpu::Buffer>,
    groups: [u32; 3],
}

/// An attention's kernel with the quantizing tail it is given.
type AttnKernel = Box<dyn Fn(AttnTail) -> Kernel + Send + Sync>;

/// A deferred op, taken by the quantize of the matmul that reads its output (or, for q/k/v,
/// by the RoPE store).
enum Pending {
    /// `out = act(gate) * up` over `len` values (QuantizeGlu; out of place, so a matmul's
    /// prologue may read the gate while its first workgroup stores `out`), after
    /// `gate_up`, the experts' matmul that writes gate and up where it is held for the GLU
    /// to run in its tail (moe.rs).
    Glu {
        gate: wgpu::Buffer,
        up: wgpu::Buffer,
        act: u32,
        len: usize,
        out: wgpu::Buffer,
        gate_up: Option<Dispatch>,
    },
    /// `out = rms_norm(x)` over `rows` rows of `dim`, after `x + y * scale` is stored to
    /// the new residual where `add` holds (y, scale, new residual).
    Norm {
        w: wgpu::Buffer,
        wlen: u32,
        x: wgpu::Buffer,
        add: Option<(wgpu::Buffer, f32, wgpu::Buffer)>,
        eps: f32,
        rows: usize,
        dim: usize,
        out: wgpu::Buffer,
    },
    /// Attention (`kernel`: the exact one, the split one's merge, or the one-chunk split
    /// kernel; its argument: how it quantizes), with `prm` and `bufs` as the kernel takes
    /// them (prm[8] the quantize mode; the output last), writing `len` values of heads of
    /// `head_dim`; `blocks`: whether the kernel takes the block tail (`AttnTail::Block`).
    Attention {
        kernel: AttnKernel,
        prm: Vec<u32>,
        bufs: Vec<wgpu::Buffer>,
        groups: [u32; 3],
        len: usize,
        head_dim: usize,
        blocks: bool,
    },
    /// The vec path's matmuls of weights uploaded together (one dispatch per run, with its
    /// outputs), held for `rope_kv_store` to run with its RoPE store (rope_epilogue.wgsl).
    Qkv { runs: Vec<(Dispatch, Vec<wgpu::Buffer>)> },
    /// A mixture of experts' down projection on the vec path, one dispatch of `rows`
    /// tokens' `k` slots of `dim` rows (its output bound at 2), held for the weighted sum
    /// after it to run in its tail (moe.rs).
    Down { d: Dispatch, rows: usize, k: usize, dim: usize },
    /// A mixture of experts' gate and up projection on the vec path, one dispatch writing
    /// `len` values to each of its outputs (bound at 2 and 3), held for the GLU after it
    /// to run in its tail (moe.rs).
    GateUp { d: Dispatch, len: usize },
}

impl Pending {
    /// The buffer it writes and how many values, where a quantize may take it (not q/k/v:
    /// the RoPE store takes them, or they run first).
    fn output(&self) -> Option<(&wgpu::Buffer, usize)> {
        match self {
            Pending::Glu { out, len, .. } => Some((out, *len)),
            Pending::Norm { out, rows, dim, .. } => Some((out, rows * dim)),
            Pending::Attention { bufs, len, .. } => Some((&bufs[bufs.len() - 1], *len)),
            Pending::Qkv { .. } | Pending::Down { .. } | Pending::GateUp { .. } => None,
        }
    }

    /// Whether its kernel can quantize its output in blocks of `bs` (attention: a head's
    /// output is whole blocks, or with the block tail, heads divide a block of 256).
    fn quantizes(&self, bs: usize) -> bool {
        match self {
            Pending::Attention { head_dim, blocks, .. } => {
                head_dim.is_multiple_of(bs) || (*blocks && bs == 256 && 256 % head_dim == 0)
            }
            _ => true,
        }
    }
}

/// Which matmul kernel runs: by default `rows` on software adapters, `vec` on hardware
/// (`GpuBackend::set_matmul_path` picks another).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MatmulPath {
    /// An invocation per weight row, the CPU's exact arithmetic: software adapters' default
    /// (lavapipe runs it far faster than the others).
    Rows,
    /// A workgroup per weight row (parallel integer sums, then the CPU's float chains):
    /// bit-identical to the CPU where the driver rounds f32 division, sqrt and exp as
    /// IEEE does (lavapipe; not NVIDIA's: gpu_ops measured NMSE 3e-8 to 5e-6 there).
    Exact,
    /// Rows split over a workgroup with f32 partial sums (wide units for Q4_0, Q4_K, Q6_K,
    /// dot_vec.wgsl), and attention split over key chunks in f32: hardware GPUs'
    /// default, 2-3x the exact path's decode on the H200 and far faster at depth, batch
    /// invariant, but not bit-identical to the CPU: smollm2's logits drift to NMSE ~1e-3
    /// to 1e-2 through its 30 layers (greedy equal).
    Vec,
}

impl MatmulPath {
    fn default_for(software: bool) -> MatmulPath {
        if software {
            MatmulPath::Rows
        } else {
            MatmulPath::Vec
        }
    }
}

/// Tokens from which the exact path takes the invocation-per-row kernel for 32-value block
/// formats (prompt processing; measured at 512).
const PREFILL_ROWS: usize = 32;

/// Keys per chunk of the split attention (attention_split.wgsl's CH).
const SPLIT_KEYS: u32 = 256;
/// The largest attention head the attention kernels take (attention.wgsl keeps a query
/// head in a workgroup array of 256).
const MAX_HEAD_DIM: usize = 256;
/// The vec path's attention is split for every batch (a token's attention is then the same
/// alone or in any batch) unless its partial sums would pass this many bytes (a long
/// prompt deep into a long context: 512 tokens of 32 heads at 7.5k keys), which take the
/// exact kernel.
const SPLIT_PARTIALS: usize = 256 << 20;

/// The default of `GpuBackend::prologue_bytes`, measured on an H200: smollm2's prologues
/// (at most 1.8 MiB with its short rows' 16 invocations) made its decode 8% faster;
/// Qwen2.5-1.5B's q/k/v norm at 3 MiB lost 1%, at 6 MiB 12%, and the 7-8B shapes' larger
/// ones lose more than the dispatches they replace.
const PROLOGUE_BYTES: usize = 2 << 20;

/// Values per workgroup of a long argmax row: one round of sixteen loads per invocation.
const ARGMAX_SPAN: usize = 16 * 256;

/// Workgroups for `n` items of 64, as a 2-D grid when over the 65535 per-dimension limit.
fn grid(n_items: usize, per_group: usize) -> [u32; 3] {
    let g = n_items.div_ceil(per_group).max(1) as u32;
    if g <= 65535 {
        [g, 1, 1]
    } else {
        [65535, g.div_ceil(65535), 1]
    }
}

/// A matrix's rows of `cols` values as the kernels read them: in its own format where a
/// kernel reads it, else widened to F16.
fn matrix_data(ty: GgmlType, cols: usize, raw: &[u8]) -> Result<(GgmlType, std::borrow::Cow<'_, [u8]>)> {
    if kernels::gpu_weight_type(ty) {
        return Ok((ty, raw.into()));
    }
    let mut v = vec![0f32; cols];
    let src_row = ty.row_size(cols)?;
    let mut out = Vec::with_capacity(raw.len() / src_row * cols * 2);
    for row in raw.chunks_exact(src_row) {
        quant::dequantize_row(ty, row, &mut v)?;
        out.extend(v.iter().flat_map(|&x| half::f16::from_f32(x).to_le_bytes()));
    }
    Ok((GgmlType::F16, out.into()))
}

/// How a weight of type `ty` takes its activations: quantized to its dot type (quantize.wgsl's
/// mode, and its block size), or as f32 (None).
fn dot_mode(ty: GgmlType) -> Option<(u32, usize)> {
    match ty.vec_dot_type() {
        GgmlType::Q8_0 => Some((0, 32)),
        GgmlType::Q8_1 => Some((3, 32)),
        GgmlType::Q8_K => Some((1, 256)),
        GgmlType::F16 => Some((2, 32)),
        _ => None,
    }
}

/// The words of quantized activations (`rows` rows of `k` in blocks of `bs`, quantize.wgsl)
/// where the block scales and the block sums start.
fn act_words(rows: usize, k: usize, bs: usize) -> (u32, u32) {
    let n = rows * k;
    ((n / 4) as u32, (n / 4 + rows * (k / bs)) as u32)
}

fn f(x: f32) -> u32 {
    x.to_bits()
}

impl GpuBackend {
    /// Opens a device.
    pub fn new(policy: AdapterPolicy) -> Result<GpuBackend> {
        Self::with_fallback(policy, false)
    }

    /// Opens a device; `force_fallback` disables subgroup kernels even where supported.
    pub fn with_fallback(policy: AdapterPolicy, force_fallback: bool) -> Result<GpuBackend> {
        Self::on(Context::new(policy, force_fallback)?)
    }

    /// A backend on the same device and queue with its own recorder and scratch, and this
    /// one's settings (matmul path, tiles, batch invariance): a vision encoder beside its
    /// language model, each recording its own steps.
    pub fn sibling(&self) -> Result<GpuBackend> {
        let mut b = Self::on(self.ctx.clone())?;
        b.prologue_bytes = self.prologue_bytes;
        b.split_bytes = self.split_bytes;
        b.matmul = self.matmul;
        b.coop = self.coop;
        b.batch_invariant = self.batch_invariant;
        b.shape_override = self.shape_override.clone();
        Ok(b)
    }

    fn on(ctx: Context) -> Result<GpuBackend> {
        let split_bytes = ctx.max_binding.min(ctx.max_buffer);
        let matmul = MatmulPath::default_for(ctx.info.device_type == wgpu::DeviceType::Cpu);
        let rec = Mutex::new(Recorder::new(&ctx));
        let table = crate::backend::cpu::gelu_table();
        let gelu = ctx.upload(bytemuck::cast_slice(&table[..1 << 16]), "kiln gelu")?;
        let coop = ctx.coop;
        let npr_min = kernels::vec_npr_min(ctx.info.subgroup_max_size);
        Ok(GpuBackend {
            ctx,
            pipes: Pipelines::default(),
            rec,
            act: Mutex::new(None),
            act_glu: Mutex::new(None),
            act_src: Mutex::new(None),
            pending: Mutex::new(None),
            prologue_bytes: PROLOGUE_BYTES,
            npr_min,
            ids: Mutex::new(None),
            part: Mutex::new(None),
            coop_part: Mutex::new(None),
            kv_tmp: Mutex::new(None),
            kv_q: Mutex::new(None),
            route_counts: Mutex::new(None),
            attn_counts: Mutex::new(None),
            sum_counts: Mutex::new(None),
            glu_counts: Mutex::new(None),
            head_counts: Mutex::new(None),
            expert_groups_buf: Mutex::new(None),
            counts: Arc::default(),
            gelu,
            split_bytes,
            matmul,
            coop,
            batch_invariant: false,
            shape_override: None,
        })
    }

    /// Prints where a step's time goes after each read-back (0: off, 1: host recording,
    /// submitting and waiting per step, 2: also each kernel's GPU time, where the adapter
    /// has timestamps inside passes).
    pub fn set_profile(&self, level: u8) {
        self.lock().set_profile(&self.ctx, level);
    }

    /// The fewest invocations the vec matmul gives a short row on this adapter.
    pub fn vec_npr_min(&self) -> usize {
        self.npr_min
    }

    /// Whether the subgroup kernels are in use.
    pub fn subgroups(&self) -> bool {
        self.ctx.subgroups
    }

    /// Keeps the driver's compiled pipelines on disk for the next start (where the
    /// adapter has a pipeline cache).
    pub fn save_pipeline_cache(&self) {
        self.ctx.save_pipeline_cache();
    }

    /// Whether the adapter is a software (CPU-type) one such as lavapipe.
    pub fn is_software(&self) -> bool {
        self.ctx.info.device_type == wgpu::DeviceType::Cpu
    }

    /// Counters of backend ops called and GPU dispatches recorded, shared (they stay
    /// readable after the backend moves into a model).
    pub fn counts(&self) -> Arc<OpCounts> {
        self.counts.clone()
    }

    /// Uploads f32 values as a weight vector (tests and callers with host data).
    pub fn upload_f32(&self, v: &[f32]) -> Result<GpuBuf> {
        let buf = self.ctx.upload(bytemuck::cast_slice(v), "kiln buf")?;
        Ok(GpuBuf { buf, len: v.len(), alt: None })
    }

    /// Overwrites the start of `buf` with host values (tests; flushed with the next submission).
    #[doc(hidden)]
    pub fn write(&self, buf: &GpuBuf, v: &[f32]) {
        assert!(v.len() <= buf.len);
        self.flush();
        *self.act_src.lock().unwrap_or_else(|e| e.into_inner()) = None;
        self.lock().submit(&self.ctx);
        self.ctx.queue.write_buffer(&buf.buf, 0, bytemuck::cast_slice(v));
    }

    /// Overwrites a KV buffer with host f16 values (an even count; tests).
    #[doc(hidden)]
    pub fn write_kv(&self, kv: &GpuKv, v: &[half::f16]) {
        self.flush();
        self.lock().submit(&self.ctx);
        self.ctx.queue.write_buffer(&kv.buf, 0, bytemuck::cast_slice(&v[..v.len() / 2 * 2]));
    }

    /// Reads a KV cache back as its bytes (`n` of them; tests).
    #[doc(hidden)]
    pub fn read_kv_bytes(&self, kv: &GpuKv, n: usize) -> Vec<u8> {
        let mut words = vec![0f32; n.div_ceil(4)];
        self.flush();
        self.lock().read(&self.ctx, &kv.buf, &mut words).expect("read-back");
        bytemuck::cast_slice::<f32, u8>(&words)[..n].to_vec()
    }

    /// Overwrites the start of a KV cache with bytes (a multiple of 4; tests).
    #[doc(hidden)]
    pub fn write_kv_bytes(&self, kv: &GpuKv, b: &[u8]) {
        self.flush();
        self.lock().submit(&self.ctx);
        self.ctx.queue.write_buffer(&kv.buf, 0, &b[..b.len() / 4 * 4]);
    }

    /// The quantizing store of `n` rows of `x` (`dim` values each) to `kv`'s slots.
    fn kv_rows_store(&self, kv: &GpuKv, x: &wgpu::Buffer, slots: &[u32], dim: usize) {
        let n = slots.len();
        let prm = kv_rows_prm(kv, n, dim, slots);
        self.run(Kernel::KvRows(KvOp::Store, kv.ty), &prm, &[&kv.buf, x], kv_rows_grid(kv, n, dim));
    }

    /// The parameters of kv_rotate.wgsl for rows of `x` rotated in groups of `rot` values,
    /// each token's rows (`rows / mult.len()` of them) first times its multiplier, and its
    /// workgroups (256 values each).
    fn kv_rotate_prm(rows: usize, len: usize, rot: Option<usize>, mult: &[f32]) -> (Vec<u32>, [u32; 3]) {
        let n = rot.unwrap_or(32);
        let mut prm = vec![
            rows as u32,
            len as u32,
            n as u32,
            rot.is_some() as u32,
            f(1.0 / (n as f32).sqrt()),
            (rows / mult.len().max(1)) as u32,
            0,
            0,
            0,
        ];
        prm.extend(mult.iter().map(|&m| f(m)));
        (prm, grid((rows * len).div_ceil(256), 1))
    }

    /// Attention over caches of which one at least is quantized: the query rotated by K's
    /// rotation and quantized to its dot type (a quantized K; one kernel), the attention
    /// kernel (`prm`, `split` and `chunks` as `attention` chose them; no quantize tail),
    /// then the output rotated back by V's rotation (deferred: the next matmul's quantize
    /// is its tail).
    #[allow(clippy::too_many_arguments)]
    fn attention_kv(
        &self,
        q: &GpuBuf,
        kc: &GpuKv,
        vc: &GpuKv,
        plan: &AttnPlan,
        out: &GpuBuf,
        prm: &[u32],
        split: bool,
        chunks: u32,
    ) {
        let (n_tok, hd) = (plan.pos.len(), plan.head_dim);
        let rows = n_tok * plan.n_head;
        let mut bufs = vec![q.buf.clone(), kc.buf.clone(), vc.buf.clone()];
        let tmp = self.scratch(&self.kv_tmp, rows * hd, "kiln kv rows");
        let target = if vc.rot.is_some() { tmp.clone() } else { out.buf.clone() };
        bufs.push(target.clone());
        if kc.ty != GgmlType::F16 {
            // The query rotated and quantized to K's dot type, in one kernel.
            let mult: Vec<f32> = (0..n_tok).map(|t| plan.q_scale(t)).collect();
            let (mut rp, g) = Self::kv_rotate_prm(rows, hd, kc.rot, &mult);
            rp[8] = if kc.ty.vec_dot_type() == GgmlType::Q8_1 { 3 } else { 0 };
            let qq = self.scratch(&self.kv_q, rows * hd / 4 + 2 * rows * hd / 32, "kiln kv query");
            self.run(Kernel::KvRotate(true), &rp, &[&q.buf, &tmp, &qq], g);
            bufs.push(qq);
        }
        let groups = grid(rows, 1);
        let kernel = |kind| Kernel::AttentionKv(kind, kc.ty, vc.ty);
        if !split || chunks == 1 {
            let kind = if split { AttnKind::Direct } else { AttnKind::Exact };
            self.run(kernel(kind), prm, &bufs.iter().collect::<Vec<_>>(), groups);
        } else {
            let part = self.scratch(&self.part, rows * chunks as usize * (hd + 2), "kiln partials");
            bufs[3] = part.clone();
            let g = [groups[0], groups[1], chunks];
            self.run(kernel(AttnKind::Partial), prm, &bufs.iter().collect::<Vec<_>>(), g);
            self.run(Kernel::AttnCombine(AttnTail::Off), prm, &[&part, &target], groups);
        }
        if let Some(n) = vc.rot {
            // The output rotated back, held for the matmul that reads it to quantize it in
            // the same kernel (as attention's tail: whole blocks of a row of heads).
            let (prm, groups) = Self::kv_rotate_prm(rows, hd, Some(n), &vec![1.0; n_tok]);
            let (len, head_dim) = (rows * hd, plan.n_head * hd);
            let bufs = vec![tmp, out.buf.clone()];
            let kernel = Box::new(|t| Kernel::KvRotate(t != AttnTail::Off));
            self.defer(Pending::Attention { kernel, prm, bufs, groups, len, head_dim, blocks: false });
        }
    }

    /// Reads a KV buffer back as f16 values (tests).
    #[doc(hidden)]
    pub fn read_kv(&self, kv: &GpuKv, n: usize) -> Vec<half::f16> {
        let mut words = vec![0f32; n.div_ceil(2)];
        self.flush();
        self.lock().read(&self.ctx, &kv.buf, &mut words).expect("read-back");
        let h: &[half::f16] = bytemuck::cast_slice(&words);
        h[..n].to_vec()
    }

    /// Keeps every matmul on the batch-invariant paths (`EngineOptions::batch_invariant`):
    /// no tile matmul, whose sums depend on the batch a token rides in.
    pub fn set_batch_invariant(&mut self, on: bool) {
        self.batch_invariant = on;
    }

    /// Whether every matmul stays on the batch-invariant paths (`set_batch_invariant`).
    pub fn batch_invariant(&self) -> bool {
        self.batch_invariant
    }

    /// Whether the tile matmul on cooperative matrices is available (and not turned off).
    pub fn has_coop(&self) -> bool {
        self.coop.is_some()
    }

    /// Whether the tile matmul runs on the adapter's cooperative matrices (not emulated).
    pub fn has_coop_hardware(&self) -> bool {
        self.coop.is_some_and(|c| !c.emulated)
    }

    /// Turns the tile matmul off, as on an adapter without cooperative matrices (tests of
    /// the selection).
    pub fn disable_coop(&mut self) {
        self.coop = None;
    }

    /// Runs the tile matmul, with its matrix operations emulated per invocation (coop.rs
    /// `Ops::Emulated`) where the adapter has subgroups and f16 but no cooperative
    /// matrices: tests of the tile kernels on software adapters. False where neither.
    pub fn emulate_coop(&mut self) -> bool {
        if self.coop.is_none() {
            self.coop = self.ctx.coop_emulation();
        }
        self.coop.is_some()
    }

    /// The adapter's capabilities for the tile kernels, where it runs them.
    pub fn coop_caps(&self) -> Option<coop::CoopCaps> {
        self.coop
    }

    /// Sizes the tile kernels' workgroups for subgroups of `max` invocations, as an adapter
    /// whose subgroups may run smaller than its largest has them: tests of the extra
    /// subgroups such a workgroup then holds.
    #[doc(hidden)]
    pub fn set_coop_max_subgroup(&mut self, max: u32) {
        if let Some(c) = &mut self.coop {
            c.max_subgroup = max;
        }
    }

    /// Lets `choice` pick every tile shape (any number of tokens) instead of `coop::shape`,
    /// None back to it: tuning tools compare shapes with it (examples/gpu_tiles.rs).
    #[doc(hidden)]
    pub fn set_shape_choice(&mut self, choice: Option<ShapeChoice>) {
        self.shape_override = choice;
    }

    /// The tile shape a matmul of `tokens` tokens of a `ty` weight of `rows` rows of `k`
    /// values takes, None where it stays on the other paths (batch invariance asked for,
    /// too few tokens, a type the tiles do not read, no cooperative matrices).
    fn coop_shape(&self, ty: GgmlType, tokens: usize, rows: usize, k: usize) -> Option<coop::CoopShape> {
        let caps = self.coop.as_ref()?;
        let on = !self.batch_invariant && self.matmul == MatmulPath::Vec && coop::coop_type(ty);
        match &self.shape_override {
            Some(choice) => on.then(|| choice(tokens, rows, k)).flatten(),
            None => (on && tokens >= coop::MIN_TOKENS).then(|| coop::shape(caps, tokens, rows, k)).flatten(),
        }
    }

    /// The shape prompt attention takes on cooperative matrices (coop_attn.rs), None where
    /// it stays on the portable kernels: batch invariance asked for, no cooperative
    /// matrices, a chunk of fewer than `coop::MIN_TOKENS` tokens, quantized caches, ALiBi,
    /// non-causal attention, heads the kernel does not take, or a block of its queries
    /// from two sequences.
    #[doc(hidden)]
    pub fn attention_tiles(&self, plan: &AttnPlan, kc: &GpuKv, vc: &GpuKv) -> Option<coop_attn::AttnShape> {
        let caps = self.coop.as_ref()?;
        let on = !self.batch_invariant
            && self.matmul == MatmulPath::Vec
            && plan.pos.len() >= coop::MIN_TOKENS
            && kc.ty == GgmlType::F16
            && vc.ty == GgmlType::F16
            && plan.alibi.is_none()
            && plan.seq_len.is_none()
            && plan.n_head_kv > 0
            && plan.n_head.is_multiple_of(plan.n_head_kv);
        let shape = on.then(|| coop_attn::shape(caps, plan.head_dim)).flatten()?;
        let one_sequence = |b: &[u32]| b.iter().all(|&s| s == b[0]);
        plan.seq.chunks(shape.bq() as usize).all(one_sequence).then_some(shape)
    }

    /// Picks the matmul kernel (tests, tuning).
    pub fn set_matmul_path(&mut self, path: MatmulPath) {
        self.matmul = path;
    }

    pub fn matmul_path(&self) -> MatmulPath {
        self.matmul
    }

    /// Lowers the size weights are split at (tests of the split path).
    pub fn set_max_binding(&mut self, bytes: u64) {
        self.split_bytes = self.split_bytes.min(bytes.max(256));
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Recorder> {
        self.rec.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn run(&self, k: Kernel, params: &[u32], bufs: &[&wgpu::Buffer], groups: [u32; 3]) {
        self.flush();
        self.counts.dispatches.fetch_add(1, Ordering::Relaxed);
        let pipe = self.pipes.get(&self.ctx, k);
        let mut rec = self.lock();
        if rec.timing_each() {
            rec.stamp(&self.ctx, format!("{k:?}"));
        }
        rec.dispatch(&self.ctx, &pipe, params, bufs, groups);
    }

    fn run_dispatch(&self, d: Dispatch) {
        self.run(d.kernel, &d.prm, &d.bufs.iter().collect::<Vec<_>>(), d.groups);
    }

    fn take_pending(&self) -> Option<Pending> {
        self.take_pending_if(|_| true)
    }

    /// The op held back, taken out where `f` says so.
    fn take_pending_if(&self, f: impl FnOnce(&Pending) -> bool) -> Option<Pending> {
        self.pending.lock().unwrap_or_else(|e| e.into_inner()).take_if(|p| f(p))
    }

    /// Dispatches a deferred op (before anything that could read or change its buffers).
    fn flush(&self) {
        if let Some(p) = self.take_pending() {
            self.run_pending(p);
        }
    }

    fn run_pending(&self, p: Pending) {
        match p {
            Pending::Glu { gate, up, act, len, out, gate_up } => {
                if let Some(d) = gate_up {
                    self.run_dispatch(d);
                }
                self.run(Kernel::Glu, &[len as u32, act], &[&gate, &up, &out, &self.gelu], grid(len, 64))
            }
            Pending::Attention { kernel, prm, bufs, groups, .. } => {
                self.run(kernel(AttnTail::Off), &prm, &bufs.iter().collect::<Vec<_>>(), groups)
            }
            Pending::Qkv { runs } => self.run_all(runs.into_iter().map(|r| r.0).collect()),
            Pending::Down { d, .. } | Pending::GateUp { d, .. } => self.run_dispatch(d),
            norm => self.run_norm(&norm, None),
        }
    }

    /// Holds `p` back for the next op (after dispatching one held before).
    fn defer(&self, p: Pending) {
        self.flush();
        *self.pending.lock().unwrap_or_else(|e| e.into_inner()) = Some(p);
    }

    /// A deferred norm, with its output also quantized to `quantize` (mode, buffer).
    fn run_norm(&self, p: &Pending, quantize: Option<(u32, &wgpu::Buffer)>) {
        let Pending::Norm { w, wlen, x, add, eps, rows, dim, out } = p else {
            unreachable!("run_norm takes a norm");
        };
        let scale = add.as_ref().map_or(1.0, |a| a.1);
        let prm = [*rows as u32, *dim as u32, f(*eps), *wlen, f(scale), quantize.map_or(0, |q| q.0)];
        let mut bufs = vec![w, x, out];
        if let Some((y, _, x_new)) = add {
            bufs.extend([y, x_new]);
        }
        bufs.extend(quantize.map(|q| q.1));
        let q = quantize.is_some();
        let k = if add.is_some() { Kernel::AddRmsNorm(q) } else { Kernel::RmsNorm(q) };
        // A workgroup per slice of 256 words (rms_norm.wgsl).
        let slices = dim.div_ceil(4 * 256);
        self.run(k, &prm, &bufs, grid(rows * slices, 1));
    }

    /// Makes `x.alt` (allocated on first use) the buffer `x` is written to, the old one its
    /// `alt`; returns the new one.
    fn swap(&self, x: &mut GpuBuf) -> wgpu::Buffer {
        let new = x.alt.take().unwrap_or_else(|| {
            self.ctx.storage(x.buf.size(), "kiln buf").expect("as large as x, which exists")
        });
        x.alt = Some(std::mem::replace(&mut x.buf, new.clone()));
        new
    }

    fn op(&self) {
        self.counts.ops.fetch_add(1, Ordering::Relaxed);
        *self.act_src.lock().unwrap_or_else(|e| e.into_inner()) = None;
    }

    /// Sets the bytes a decode matmul's prologue may read (0: never; tests, A/B runs).
    pub fn set_prologue_bytes(&mut self, bytes: usize) {
        self.prologue_bytes = bytes;
    }

    /// Uploads `data`, `n` units of `unit` bytes (rows, experts), in buffers of whole units
    /// under the binding limit: each buffer with its first unit and how many it holds.
    fn upload_split(
        &self,
        data: &[u8],
        unit: usize,
        n: usize,
        name: &str,
    ) -> Result<Vec<(wgpu::Buffer, usize, usize)>> {
        let per_buf = ((self.split_bytes as usize - 4) / unit).max(1);
        let mut bufs = Vec::new();
        for u0 in (0..n).step_by(per_buf) {
            let m = per_buf.min(n - u0);
            let buf = self.ctx.upload(&data[u0 * unit..(u0 + m) * unit], name)?;
            // Bound the staging memory of big models: let each buffer's copy go out.
            self.ctx.queue.submit([]);
            bufs.push((buf, u0, m));
        }
        Ok(bufs)
    }

    /// Uploads weights of one type and width into one buffer, each a run of its rows.
    fn upload_together(&self, gguf: &GgufFile, ts: &[&TensorInfo]) -> Result<Vec<GpuWeight>> {
        let mut data = Vec::with_capacity(ts.iter().map(|t| t.size as usize).sum());
        let mut ws = Vec::with_capacity(ts.len());
        for t in ts {
            let raw = gguf.tensor_data(t);
            let (rows, cols) = t.rows_cols();
            let row_size = t.ty.row_size(cols)?;
            // A weight starts at a whole row of its own format (padding where the format
            // changes: Q4_K_M's v), so `first` counts its rows for every kernel.
            data.resize(data.len().next_multiple_of(row_size), 0);
            let first = data.len() / row_size;
            data.extend_from_slice(raw);
            ws.push((t.ty, rows, cols, row_size, first));
        }
        let names: Vec<&str> = ts.iter().map(|t| t.name.as_str()).collect();
        let buf = self.ctx.upload(&data, &names.join("+"))?;
        self.ctx.queue.submit([]);
        Ok(ws
            .into_iter()
            .map(|(ty, rows, cols, row_size, first)| {
                let part = Part { buf: buf.clone(), row0: 0, rows, first };
                GpuWeight { parts: vec![part], ty, rows, cols, row_size }
            })
            .collect())
    }

    fn run_all(&self, ds: Vec<Dispatch>) {
        for d in ds {
            self.run_dispatch(d);
        }
    }

    /// The dispatches of `outs[i] = x · ws[i]ᵀ (+ biases[i])`, one per part, not run yet (the
    /// activation quantize before them does run): one weight (its parts one kernel each),
    /// or 2-3 weights that are consecutive runs of one buffer (one kernel, `store` routes
    /// each row's output); `biases` is empty or has one vector per weight.
    fn matmul_dispatches(
        &self,
        ws: &[&GpuWeight],
        biases: &[&wgpu::Buffer],
        x: &GpuBuf,
        rows: usize,
        outs: &[&wgpu::Buffer],
    ) -> Vec<Dispatch> {
        let w = ws[0];
        {
            // An output may be a later matmul's input: what it held is stale then.
            let mut held = self.act_src.lock().unwrap_or_else(|e| e.into_inner());
            if held.as_ref().is_some_and(|(b, _, _)| outs.contains(&b)) {
                *held = None;
            }
        }
        let k = w.cols;
        let all_rows = ws.iter().map(|w| w.rows).sum::<usize>();
        // The tiles take f16 activations (packed, mode 4).
        let tiles = self.coop_shape(w.ty, rows, all_rows, w.cols);
        // Activations quantized as the CPU does (quantize.wgsl), then exact integer dots.
        let (mode, bs) = match dot_mode(w.ty) {
            _ if tiles.is_some() => (Some(4u32), 32),
            Some((m, bs)) => (Some(m), bs),
            None => (None, 32),
        };
        let n = rows * k;
        let (xd, xs) = act_words(rows, k, bs);
        let mut shape = kernels::vec_shape_for(w.ty, all_rows, k, self.npr_min);
        if rows > 1 {
            shape.tt = kernels::VEC_TT;
        }
        // The activations: quantized (bound at 2), or made in the prologue.
        let mut input: Prologue = (Input::Quantized, Vec::new(), Vec::new());
        match mode {
            Some(mode) => {
                let act = self.act_buf(n);
                let mut held = self.act_src.lock().unwrap_or_else(|e| e.into_inner());
                if held.as_ref().is_none_or(|(b, m, len)| *b != x.buf || *m != mode || *len != n) {
                    let taken = self.take_writer(x, n, bs);
                    // A decode step's (one token) only.
                    let made = if rows == 1 {
                        self.prologue(&taken, &x.buf, mode, k, all_rows, shape)
                    } else {
                        None
                    };
                    match made {
                        Some(p) => {
                            input = p;
                            shape = self.prologue_shape(shape, k);
                        }
                        None => {
                            self.run_quantize(taken, x, mode, rows, k, &act);
                            *held = Some((x.buf.clone(), mode, n));
                        }
                    }
                }
                if input.0 == Input::Quantized {
                    input.2.push(act);
                }
            }
            None => input.2.push(x.buf.clone()),
        }
        // Weights uploaded together run as one part spanning all their rows.
        let joint;
        let parts: &[Part] = if ws.len() > 1 {
            let p = &w.parts[0];
            joint =
                [Part { buf: p.buf.clone(), row0: 0, rows: ws.iter().map(|w| w.rows).sum(), first: p.first }];
            &joint
        } else {
            &w.parts
        };
        // Row boundaries of the outputs (matmul_store), after the first.
        let mut bounds = [0u32; 2];
        let mut acc = 0;
        for (i, w) in ws.iter().take(ws.len() - 1).enumerate() {
            acc += w.rows;
            bounds[i] = acc as u32;
        }
        let mut dispatches = Vec::with_capacity(parts.len());
        for p in parts {
            let prm = [
                p.rows as u32,
                k as u32,
                rows as u32,
                w.row_size as u32,
                w.rows as u32,
                p.row0 as u32,
                xd,
                xs,
                p.first as u32,
                bounds[0],
                bounds[1],
            ];
            let last = ws[ws.len() - 1];
            let tail = if last.ty != w.ty { kernels::vec_fast(last.ty) as u8 } else { 0 };
            let outs_n =
                kernels::Outs { n: outs.len() as u8, bias: !biases.is_empty(), tail, ..kernels::ONE_OUT };
            // Both exact kernels give the same bits; for prompts of 32-value block formats
            // an invocation per row is faster on the H200 (pp512: smollm2 2.2x, 7B Q4_0
            // 1.3x; K formats 0.6x, so they keep the workgroup per row).
            let block32 = matches!(w.ty, GgmlType::Q4_0 | GgmlType::Q4_1 | GgmlType::Q5_0 | GgmlType::Q8_0);
            let path = match self.matmul {
                MatmulPath::Exact if block32 && rows >= PREFILL_ROWS => MatmulPath::Rows,
                path => path,
            };
            if let Some(cs) = tiles {
                // Token tiles along x: a weight tile's workgroups run together, so its
                // rows are read from memory once; k splits along z.
                let g =
                    [rows.div_ceil(cs.bm() as usize) as u32, p.rows.div_ceil(cs.bn() as usize) as u32, cs.ks];
                let mut sums: Vec<wgpu::Buffer> = outs.iter().map(|&b| b.clone()).collect();
                sums.extend(biases.iter().map(|&b| b.clone()));
                let mut prm = prm.to_vec();
                if cs.ks == 1 {
                    let mut bufs = vec![p.buf.clone(), input.2[0].clone()];
                    bufs.extend(sums);
                    let kernel = Kernel::MatmulCoop(w.ty, outs_n, cs);
                    dispatches.push(Dispatch { kernel, prm, bufs, groups: g });
                } else {
                    // The splits' partial sums, then their sum stored as the outputs.
                    prm[6] = cs.ks;
                    let part =
                        self.scratch(&self.coop_part, cs.ks as usize * rows * p.rows, "kiln tile sums");
                    let bufs = vec![p.buf.clone(), input.2[0].clone(), part.clone()];
                    let kernel = Kernel::MatmulCoop(w.ty, kernels::ONE_OUT, cs.kernel_key());
                    dispatches.push(Dispatch { kernel, prm: prm.clone(), bufs, groups: g });
                    let mut bufs = vec![part];
                    bufs.extend(sums);
                    let g = grid(rows * p.rows, 64);
                    dispatches.push(Dispatch { kernel: Kernel::CoopReduce(outs_n), prm, bufs, groups: g });
                }
                continue;
            }
            // Kernel, workgroups, tokens per workgroup (the kernel's TT).
            let (kernel, mut g, tt) = match path {
                MatmulPath::Rows => (Kernel::MatmulRows(w.ty, outs_n), grid(p.rows, 64), 8),
                MatmulPath::Exact => (Kernel::Matmul(w.ty, outs_n), grid(p.rows, kernels::EXACT_ROWS), 8),
                MatmulPath::Vec => {
                    // A prompt's slots take several rows where their units read the same
                    // activations (one format: no tail).
                    let mut shape = shape;
                    if rows > 1 && kernels::vec_fast(w.ty) != 0 && tail == 0 && input.0 == Input::Quantized {
                        shape.rr = kernels::VEC_RR;
                    }
                    let g = grid(p.rows, shape.rg * shape.rr);
                    (Kernel::MatmulVec(w.ty, outs_n, input.0, shape), g, shape.tt)
                }
            };
            g[2] = rows.div_ceil(tt) as u32;
            // Bindings (kernels.rs): the weights, the activations (or the prologue's first
            // input), the outputs and biases, (wide units) the activations and the weights
            // again, the prologue's other inputs.
            let mut bufs = vec![&p.buf, &input.2[0]];
            bufs.extend_from_slice(outs);
            bufs.extend_from_slice(biases);
            if matches!(kernel, Kernel::MatmulVec(..)) && kernels::vec_fast(w.ty) != 0 {
                if input.0 == Input::Quantized {
                    bufs.push(&input.2[0]);
                }
                bufs.push(&p.buf);
            }
            bufs.extend(&input.2[1..]);
            let bufs = bufs.into_iter().cloned().collect();
            let mut prm = prm.to_vec();
            prm.extend_from_slice(&input.1);
            dispatches.push(Dispatch { kernel, prm, bufs, groups: g });
        }
        dispatches
    }

    /// The op held back that writes `x` (`n` values), taken out where it can quantize its
    /// output in blocks of `bs` as it writes it.
    fn take_writer(&self, x: &GpuBuf, n: usize, bs: usize) -> Option<Pending> {
        self.take_pending_if(|p| p.output() == Some((&x.buf, n)) && p.quantizes(bs))
    }

    /// Quantizes `x` for a matmul into `act`, in one kernel with `taken` (the op that
    /// writes x, held back) where there is one.
    fn run_quantize(
        &self,
        taken: Option<Pending>,
        x: &GpuBuf,
        mode: u32,
        rows: usize,
        k: usize,
        act: &wgpu::Buffer,
    ) {
        let n = rows * k;
        match taken {
            Some(Pending::Glu { act: a, out, gate_up: Some(mut d), .. }) => {
                // In the gate and up projection's tail (kernels.rs GLU_TAIL).
                let Kernel::MatmulIdVec(ty, 2, kernels::IdTail::Off, shape) = d.kernel else {
                    unreachable!("a gate and up projection is held for the GLU");
                };
                d.kernel = Kernel::MatmulIdVec(ty, 2, kernels::IdTail::Glu, shape);
                d.prm.extend([mode, a]);
                let counts = self.scratch(&self.glu_counts, n / 256, "kiln expert GLU counts");
                d.bufs.extend([out, act.clone(), self.gelu.clone(), counts]);
                self.run_dispatch(d);
            }
            Some(Pending::Glu { gate, up, act: a, out, .. }) => {
                let prm = [mode, rows as u32, k as u32, a];
                let bufs = [&gate, act, &up, &self.gelu, &out];
                self.run(Kernel::QuantizeGlu, &prm, &bufs, grid(n / 4, 64));
            }
            Some(Pending::Attention { kernel, mut prm, bufs, groups, len, head_dim, .. }) => {
                prm[8] = mode;
                let mut bufs: Vec<&wgpu::Buffer> = bufs.iter().collect();
                bufs.push(act);
                // Heads part of a Q8_K superblock: a counter per block (`Pending::quantizes`).
                let counts;
                let tail = if mode == 1 && !head_dim.is_multiple_of(256) {
                    counts = self.scratch(&self.attn_counts, len / 256, "kiln attention counts");
                    bufs.push(&counts);
                    AttnTail::Block
                } else {
                    AttnTail::Head
                };
                self.run(kernel(tail), &prm, &bufs, groups);
            }
            Some(norm) => self.run_norm(&norm, Some((mode, act))),
            None => {
                let prm = [mode, rows as u32, k as u32];
                self.run(Kernel::Quantize, &prm, &[&x.buf, act], grid(n / 4, 64));
            }
        }
    }

    /// A decode matmul's (one token's) activations made in its own prologue (kernels.rs `Input`) from
    /// `taken` (the norm or GLU that writes `x`, held back) or from `x` itself, where the
    /// vec path runs, the workgroup memory has room, and the reads of the whole row by the
    /// workgroups of its `n_rows` weight rows stay under `prologue_bytes`. `x` holds one
    /// row of `k`.
    fn prologue(
        &self,
        taken: &Option<Pending>,
        x: &wgpu::Buffer,
        mode: u32,
        k: usize,
        n_rows: usize,
        shape: kernels::VecShape,
    ) -> Option<Prologue> {
        let nt = shape.rg * shape.npr;
        let n_groups = n_rows.div_ceil(shape.rg);
        // Not under batch invariance: on NVIDIA's Vulkan driver a prologue's norm came out a
        // few last bits from the norm kernel's that a step of several tokens runs (1-token
        // steps against 2-, 7- and 48-token ones, dense and MoE models alike; none without
        // prologues), so a decode step would not match the same tokens in a batch.
        let ok = !self.batch_invariant
            && self.matmul == MatmulPath::Vec
            // Quantized (F16's rounded activations stay a dispatch of their own).
            && mode != 2
            && nt.is_multiple_of(64)
            && k.is_multiple_of(32)
            && self.prologue_fits(k, nt, false);
        let reads = |per_value: usize| ok && n_groups * k * per_value <= self.prologue_bytes;
        let kk = k as u32;
        match taken {
            None if reads(4) => Some((Input::Quantize(kk), vec![mode], vec![x.clone()])),
            Some(Pending::Norm { w, wlen, x: xin, add, eps, rows: 1, dim, out })
                if *dim == k && reads(if add.is_some() { 8 } else { 4 }) =>
            {
                let scale = add.as_ref().map_or(1.0, |a| a.1);
                let prm = vec![mode, f(*eps), *wlen, f(scale)];
                let mut bufs = vec![xin.clone(), w.clone(), out.clone()];
                let input = match add {
                    None => Input::Norm(kk),
                    Some((y, _, x_new)) => {
                        bufs.extend([y.clone(), x_new.clone()]);
                        Input::AddNorm(kk)
                    }
                };
                Some((input, prm, bufs))
            }
            Some(Pending::Glu { gate, up, act, len, out, gate_up: None }) if *len == k && reads(8) => Some((
                Input::Glu(kk),
                vec![mode, *act, *len as u32],
                vec![gate.clone(), up.clone(), self.gelu.clone(), out.clone()],
            )),
            _ => None,
        }
    }

    /// The workgroup of a matmul that makes its activations in a prologue: twice the rows
    /// (up to 256 invocations), so half the workgroups repeat the op. Rows per workgroup
    /// leave each row's sums as they are.
    fn prologue_shape(&self, shape: kernels::VecShape, k: usize) -> kernels::VecShape {
        let wide = kernels::VecShape { rg: 2 * shape.rg, ..shape };
        let nt = wide.rg * wide.npr;
        if nt <= 256 && self.prologue_fits(k, nt, false) {
            wide
        } else {
            shape
        }
    }

    /// Whether a prologue of k values (kept in f32 where `f32_row`) fits a workgroup of `nt`
    /// invocations' memory: quantize_core's three arrays of 256, the norm's two of nt, the
    /// row sums' nt.
    fn prologue_fits(&self, k: usize, nt: usize, f32_row: bool) -> bool {
        4 * (Input::words(k, f32_row) + 3 * 256 + 3 * nt + 1) <= self.ctx.max_workgroup_storage as usize
    }

    /// The (cos, sin) pairs of each position as parameter words, from the CPU's rope cache.
    fn rope_caches(&self, pos: &[u32], r: &RopeParams) -> Vec<u32> {
        let mut cache = vec![0f32; r.n_rot];
        let mut words = Vec::with_capacity(pos.len() * r.n_rot);
        for &p in pos {
            crate::backend::cpu::rope_cache(p as f32, r, &mut cache);
            words.extend(cache.iter().map(|&v| f(v)));
        }
        words
    }

    /// rope_store.wgsl's parameters up to and including the slots (every entry's header).
    #[allow(clippy::too_many_arguments)]
    fn rope_store_prm(
        &self,
        pos: &[u32],
        slots: &[u32],
        n_head: usize,
        n_head_kv: usize,
        head_dim: usize,
        r: &RopeParams,
    ) -> Vec<u32> {
        let n_tok = pos.len();
        let mut prm = vec![
            n_tok as u32,
            n_head as u32,
            n_head_kv as u32,
            head_dim as u32,
            r.n_rot as u32,
            r.neox as u32,
            (7 + n_tok * r.n_rot) as u32,
        ];
        prm.extend(self.rope_caches(pos, r));
        prm.extend_from_slice(slots);
        prm
    }

    /// The embedding of `n` tokens whose ids are host values (`Ok`) or the words of a
    /// device buffer (`Err`: the last greedy step's, never read back first).
    fn embed_rows(
        &self,
        table: &GpuWeight,
        n: usize,
        ids: std::result::Result<&[u32], &wgpu::Buffer>,
        scale: f32,
        out: &mut GpuBuf,
    ) {
        self.op();
        let nc = table.cols / 32;
        for p in &table.parts {
            let mut prm = vec![
                n as u32,
                table.cols as u32,
                table.row_size as u32,
                p.row0 as u32,
                p.rows as u32,
                f(scale),
            ];
            let mut bufs = vec![&p.buf, &out.buf];
            match ids {
                Ok(ids) => prm.extend_from_slice(ids),
                Err(buf) => bufs.push(buf),
            }
            self.run(Kernel::Embed(table.ty, ids.is_err()), &prm, &bufs, grid(n * nc, 64));
        }
    }

    /// The activation scratch, at least `n` values.
    fn act_buf(&self, n: usize) -> wgpu::Buffer {
        self.scratch(&self.act, n, "kiln act")
    }

    /// The scratch buffer kept in `slot`, grown to at least `n` words.
    fn scratch(&self, slot: &Mutex<Option<wgpu::Buffer>>, n: usize, label: &str) -> wgpu::Buffer {
        let mut held = slot.lock().unwrap_or_else(|e| e.into_inner());
        if held.as_ref().is_none_or(|b| b.size() < (n * 4) as u64) {
            // No larger than the buffer it is made for, which exists.
            *held = Some(self.ctx.storage((n * 4) as u64, label).expect("scratch fits as its source does"));
        }
        held.clone().expect("set above")
    }
}

impl Backend for GpuBackend {
    type Weight = GpuWeight;
    type Buf = GpuBuf;
    type Kv = GpuKv;
    type Experts = GpuExperts;

    fn name(&self) -> String {
        let i = &self.ctx.info;
        let path = if self.ctx.subgroups { "subgroups" } else { "fallback" };
        let fma = if self.ctx.fused_fma { "fma" } else { "emulated fma" };
        format!("gpu ({}, {:?}, {path}, {fma})", i.name, i.backend)
    }

    fn check_head_dim(&self, head_dim: usize) -> Result<()> {
        if head_dim > MAX_HEAD_DIM {
            return Err(KilnError::unsupported(
                "head size on the GPU",
                format!("{head_dim} (its attention kernels take up to {MAX_HEAD_DIM}; run the model with --device cpu)"),
            ));
        }
        Ok(())
    }

    fn load_weight(&self, gguf: &Arc<GgufFile>, t: &TensorInfo) -> Result<GpuWeight> {
        let err = |msg: String| KilnError::Tensor { name: t.name.clone(), msg };
        if !t.ty.is_supported() {
            return Err(err(format!("unsupported tensor type {}", t.ty.name())));
        }
        let (rows, cols) = t.rows_cols();
        let raw = gguf.tensor_data(t);
        // Vectors go up as f32; matrices in their own format when a kernel reads it, else f16.
        let (ty, data): (GgmlType, std::borrow::Cow<[u8]>) = if rows == 1 && t.ty != GgmlType::F32 {
            let mut v = vec![0f32; cols];
            quant::dequantize_row(t.ty, raw, &mut v)?;
            (GgmlType::F32, bytemuck::cast_slice(&v).to_vec().into())
        } else {
            matrix_data(t.ty, cols, raw)?
        };
        // (F32 rows narrower than a block are convolution filters, read as plain floats.)
        if !cols.is_multiple_of(32) && rows > 1 && !(ty == GgmlType::F32 && cols < 32) {
            return Err(err(format!("row length {cols} is not a multiple of 32")));
        }
        let row_size = ty.row_size(cols)?;
        let parts = self.upload_split(&data, row_size, rows, &t.name)?;
        let parts = parts.into_iter().map(|(buf, row0, n)| Part { buf, row0, rows: n, first: 0 }).collect();
        Ok(GpuWeight { parts, ty, rows, cols, row_size })
    }

    fn load_experts(
        &self,
        gguf: &Arc<GgufFile>,
        t: &TensorInfo,
        n_expert: usize,
        parts: &[usize],
    ) -> Result<Vec<GpuExperts>> {
        self.load_experts_impl(gguf, t, n_expert, parts)
    }

    fn load_experts_together(
        &self,
        gguf: &Arc<GgufFile>,
        ts: &[&TensorInfo],
        n_expert: usize,
    ) -> Result<Vec<GpuExperts>> {
        self.load_experts_together_impl(gguf, ts, n_expert)
    }

    fn moe_router(
        &self,
        router: &GpuWeight,
        experts: &GpuExperts,
        x: &GpuBuf,
        rows: usize,
        r: &Routing,
        bias: Option<&[f32]>,
        out: (&mut GpuBuf, &mut GpuBuf, &mut GpuBuf),
    ) {
        self.moe_router_impl(router, experts, x, rows, r, bias, out);
    }

    fn moe_route(
        &self,
        logits: &GpuBuf,
        rows: usize,
        r: &Routing,
        bias: Option<&[f32]>,
        ids: &mut GpuBuf,
        weights: &mut GpuBuf,
    ) {
        self.moe_route_impl(logits, rows, r, bias, ids, weights);
    }

    fn matmul_id(&self, ws: &[&GpuExperts], input: ExpertInput<GpuBuf>, outs: &mut [&mut GpuBuf]) {
        self.matmul_id_impl(ws, input, outs);
    }

    fn moe_sum(&self, y: &GpuBuf, weights: &GpuBuf, rows: usize, k: usize, dim: usize, out: &mut GpuBuf) {
        self.moe_sum_impl(y, weights, rows, k, dim, out);
    }

    fn add_sigmoid_gated(&self, x: &mut GpuBuf, y: &GpuBuf, g: &GpuBuf, rows: usize, dim: usize) {
        self.add_sigmoid_gated_impl(x, y, g, rows, dim);
    }

    fn weight_shape(&self, w: &GpuWeight) -> (usize, usize) {
        (w.rows, w.cols)
    }

    fn alloc(&self, len: usize) -> Result<GpuBuf> {
        Ok(GpuBuf { buf: self.ctx.storage((len * 4) as u64, "kiln buf")?, len, alt: None })
    }

    fn alloc_kv(&self, len: usize) -> Result<GpuKv> {
        Ok(GpuKv {
            buf: self.ctx.storage(len.div_ceil(2) as u64 * 4, "kiln kv")?,
            ty: GgmlType::F16,
            rot: None,
        })
    }

    fn alloc_kv_typed(&self, n_slots: usize, dim: usize, ty: GgmlType, rot: Option<usize>) -> Result<GpuKv> {
        if !crate::kv::CACHE_TYPES.iter().any(|&(_, t)| t == ty) {
            return Err(KilnError::Backend(format!("{ty} is not a KV cache type")));
        }
        if rot.is_some_and(|n| !n.is_power_of_two() || n > MAX_HEAD_DIM || !dim.is_multiple_of(n)) {
            return Err(KilnError::Backend(format!(
                "a rotation of {rot:?} values does not fit rows of {dim}"
            )));
        }
        let row = ty.row_size(dim)?;
        let bytes = n_slots.checked_mul(row).ok_or_else(|| {
            KilnError::Backend(format!("a KV cache of {n_slots} rows of {row} bytes does not fit in memory"))
        })?;
        Ok(GpuKv { buf: self.ctx.storage(bytes as u64, "kiln kv")?, ty, rot })
    }

    fn read(&self, buf: &GpuBuf, out: &mut [f32]) {
        assert!(out.len() <= buf.len, "read of {} values from a buffer of {}", out.len(), buf.len);
        self.flush();
        self.lock().read(&self.ctx, &buf.buf, out).unwrap_or_else(|e| panic!("{e}"));
    }

    fn embed(&self, table: &GpuWeight, ids: &[u32], scale: f32, out: &mut GpuBuf) -> Result<()> {
        if let Some(&id) = ids.iter().find(|&&id| id as usize >= table.rows) {
            return Err(KilnError::invalid(format!(
                "token id {id} is outside the vocabulary ({})",
                table.rows
            )));
        }
        self.embed_rows(table, ids.len(), Ok(ids), scale, out);
        Ok(())
    }

    fn write_rows(&self, buf: &mut GpuBuf, v: &[f32]) {
        self.write(buf, v);
    }

    fn embeds_last_argmax(&self) -> bool {
        !self.lock().timing_each()
    }

    fn embed_last_argmax(&self, table: &GpuWeight, n: usize, scale: f32, out: &mut GpuBuf) -> Result<()> {
        let ids = self.scratch(&self.ids, n, "kiln ids");
        self.embed_rows(table, n, Err(&ids), scale, out);
        Ok(())
    }

    fn rms_norm(&self, x: &GpuBuf, w: &GpuWeight, eps: f32, rows: usize, dim: usize, out: &mut GpuBuf) {
        self.op();
        let (w, wlen) = (w.parts[0].buf.clone(), (w.rows * w.cols) as u32);
        let (x, out) = (x.buf.clone(), out.buf.clone());
        self.defer(Pending::Norm { w, wlen, x, add: None, eps, rows, dim, out });
    }

    fn add_rms_norm(
        &self,
        x: &mut GpuBuf,
        y: &GpuBuf,
        scale: f32,
        w: &GpuWeight,
        eps: f32,
        rows: usize,
        dim: usize,
        out: &mut GpuBuf,
    ) {
        self.op();
        let (w, wlen) = (w.parts[0].buf.clone(), (w.rows * w.cols) as u32);
        let x_new = self.swap(x);
        let add = Some((y.buf.clone(), scale, x_new));
        let x_old = x.alt.clone().expect("swap keeps it");
        let out = out.buf.clone();
        self.defer(Pending::Norm { w, wlen, x: x_old, add, eps, rows, dim, out });
    }

    fn matmul(&self, w: &GpuWeight, x: &GpuBuf, rows: usize, out: &mut GpuBuf) {
        self.counts.ops.fetch_add(1, Ordering::Relaxed);
        self.run_all(self.matmul_dispatches(&[w], &[], x, rows, &[&out.buf]));
    }

    fn load_weights(&self, gguf: &Arc<GgufFile>, ts: &[&TensorInfo]) -> Result<Vec<GpuWeight>> {
        // Runs of consecutive weights of one type and width share a buffer, the last of a
        // run possibly of another wide-unit K format (Q4_K_M's v of more bits under q and
        // k); matmul_many takes each run in one kernel (the vec path's mixed runs too).
        let fits = |run: &[&TensorInfo], t: &TensorInfo| {
            let (r0, t0) = (run[0], run[0].rows_cols());
            // (With the padding before a row of another format.)
            let pad = t.ty.row_size(t.rows_cols().1).unwrap_or(0) as u64;
            let size: u64 = run.iter().map(|t| t.size).sum::<u64>() + t.size + pad;
            let tail = kernels::vec_fast(r0.ty) >= 2 && kernels::vec_fast(t.ty) >= 2;
            kernels::gpu_weight_type(t.ty)
                && run.iter().all(|u| u.ty == r0.ty)
                && (t.ty == r0.ty || tail)
                && t.rows_cols().1 == t0.1
                && t0.1.is_multiple_of(32)
                && t0.0 > 1
                && t.rows_cols().0 > 1
                && size + 4 <= self.split_bytes
        };
        let mut out = Vec::with_capacity(ts.len());
        let mut i = 0;
        while i < ts.len() {
            let mut j = i + 1;
            while j < ts.len() && fits(&ts[i..j], ts[j]) {
                j += 1;
            }
            if j - i == 1 {
                out.push(self.load_weight(gguf, ts[i])?);
            } else {
                out.extend(self.upload_together(gguf, &ts[i..j])?);
            }
            i = j;
        }
        Ok(out)
    }

    fn matmul_many(
        &self,
        ws: &[&GpuWeight],
        biases: &[Option<&GpuWeight>],
        x: &GpuBuf,
        rows: usize,
        outs: &mut [&mut GpuBuf],
    ) {
        // Weights uploaded together are consecutive runs of one buffer: one kernel (and
        // one op, for the dispatch counter) per run, adding the run's biases as it stores
        // where every weight of the run has one.
        // The vec kernel also takes a last weight of another wide-unit K format (kernels.rs
        // Outs::tail), stored from its first whole row past the others (upload_together).
        let next = |a: &GpuWeight, b: &GpuWeight| {
            let (pa, pb) = (&a.parts, &b.parts);
            let tail = self.matmul == MatmulPath::Vec
                && kernels::vec_fast(a.ty) >= 2
                && kernels::vec_fast(b.ty) >= 2
                && self.coop_shape(a.ty, rows, a.rows, a.cols).is_none();
            let end = (pa[0].first + pa[0].rows) * a.row_size;
            pa.len() == 1
                && pb.len() == 1
                && pa[0].buf == pb[0].buf
                && (a.ty == b.ty || tail)
                && pb[0].first * b.row_size == end.next_multiple_of(b.row_size)
        };
        // The vec path holds q/k/v's kernels for rope_kv_store to run with its RoPE store
        // (three weights, a dispatch per run, biases added in the kernels).
        let hold = self.matmul == MatmulPath::Vec
            && self.coop_shape(ws[0].ty, rows, ws[0].rows, ws[0].cols).is_none()
            && ws.len() == 3
            && ws
                .iter()
                .all(|w| kernels::vec_shape_for(w.ty, w.rows, w.cols, self.npr_min).rg.is_multiple_of(4))
            && ws.iter().all(|w| w.parts.len() == 1)
            && (biases.iter().all(|b| b.is_some()) || biases.iter().all(|b| b.is_none()));
        let mut i = 0;
        while i < ws.len() {
            let mut j = i + 1;
            while j < ws.len()
                && j - i < 3
                && ws[i..j].iter().all(|w| w.ty == ws[i].ty)
                && next(ws[j - 1], ws[j])
            {
                j += 1;
            }
            self.counts.ops.fetch_add(1, Ordering::Relaxed);
            let bufs: Vec<&wgpu::Buffer> = outs[i..j].iter().map(|o| &o.buf).collect();
            let run = biases.get(i..j).unwrap_or_default();
            // The run's biases go into its kernel where each of its weights has one.
            let fused_bias = !run.is_empty() && run.iter().all(|b| b.is_some());
            let bs: Vec<&wgpu::Buffer> =
                run.iter().flatten().filter(|_| fused_bias).map(|b| &b.parts[0].buf).collect();
            let mut d = self.matmul_dispatches(&ws[i..j], &bs, x, rows, &bufs);
            if hold {
                // Runs held before (their quantize may have flushed them instead).
                let mut runs = match self.take_pending() {
                    Some(Pending::Qkv { runs }) => runs,
                    other => {
                        if let Some(p) = other {
                            self.run_pending(p);
                        }
                        Vec::new()
                    }
                };
                runs.push((d.remove(0), bufs.iter().map(|&b| b.clone()).collect()));
                *self.pending.lock().unwrap_or_else(|e| e.into_inner()) = Some(Pending::Qkv { runs });
            } else {
                self.run_all(d);
                for (b, out) in run.iter().zip(outs[i..j].iter_mut()).filter(|_| !fused_bias) {
                    if let Some(b) = b {
                        self.add_bias(out, b, rows);
                    }
                }
            }
            i = j;
        }
    }

    fn norm_rope_kv_store(
        &self,
        q: &mut GpuBuf,
        k: &mut GpuBuf,
        v: &GpuBuf,
        tmp: (&mut GpuBuf, &mut GpuBuf),
        norms: (&GpuWeight, &GpuWeight, f32),
        kc: &mut GpuKv,
        vc: &mut GpuKv,
        pos: &[u32],
        slots: &[u32],
        n_head: usize,
        n_head_kv: usize,
        head_dim: usize,
        r: &RopeParams,
    ) {
        let (qn, kn, eps) = norms;
        let n_tok = pos.len();
        // Each norm a head wide (Qwen3's) or as wide as all of a token's heads (OLMoE's).
        let width = |w: &GpuWeight, heads: usize| {
            let n = w.rows * w.cols;
            (w.parts.len() == 1 && (n == head_dim || n == heads * head_dim)).then_some(n)
        };
        let (gq, gk) = (width(qn, n_head), width(kn, n_head_kv));
        let f16 = kc.ty == GgmlType::F16 && vc.ty == GgmlType::F16 && head_dim.is_multiple_of(4);
        // After the q/k/v matmul held for it, in one dispatch: in its tail, the last of a
        // norm group's workgroups to finish (norm_rope_tail.wgsl).
        if let (true, Some(gq), Some(gk)) = (f16, gq, gk) {
            let held = self.take_pending_if(|p| {
                matches!(p, Pending::Qkv { runs } if runs.len() == 1 && runs[0].1.iter().eq([&q.buf, &k.buf, &v.buf]))
            });
            if let Some(Pending::Qkv { mut runs }) = held {
                let (mut d, _) = runs.remove(0);
                let Kernel::MatmulVec(ty, o, input, shape) = d.kernel else {
                    unreachable!("held by matmul_many")
                };
                // A workgroup's rows within one group, an invocation per word of a head. Not
                // under batch invariance, as no prologue (`prologue`): the step sizes whose
                // shape this does not take run the norm kernels, whose last bits the driver
                // may compile otherwise.
                let rows = shape.rg * shape.rr;
                let fits = gq.is_multiple_of(rows)
                    && gk.is_multiple_of(rows)
                    && head_dim <= 4 * (shape.rg * shape.npr).min(64);
                if fits && !self.batch_invariant {
                    self.op();
                    d.kernel = Kernel::MatmulVec(ty, kernels::Outs { norm_rope: true, ..o }, input, shape);
                    // The tail's words go at 11, the prologue's after them.
                    let prologue = d.prm.split_off(11);
                    let rope = self.rope_caches(pos, r);
                    let rope_at = (11 + kernels::NORM_ROPE_WORDS + prologue.len()) as u32;
                    d.prm.extend([
                        (n_head * head_dim) as u32,
                        (n_head_kv * head_dim) as u32,
                        head_dim as u32,
                        r.n_rot as u32,
                        r.neox as u32,
                        (n_head_kv * head_dim / 2) as u32,
                        rope_at,
                        rope_at + rope.len() as u32,
                        f(eps),
                        gq as u32,
                        gk as u32,
                    ]);
                    d.prm.extend(prologue);
                    d.prm.extend(rope);
                    d.prm.extend_from_slice(slots);
                    let groups = n_head * head_dim / gq + n_head_kv * head_dim / gk;
                    let counts =
                        self.scratch(&self.head_counts, d.groups[2] as usize * groups, "kiln head counts");
                    let weights = [&kc.buf, &vc.buf, &qn.parts[0].buf, &kn.parts[0].buf, &counts];
                    d.bufs.extend(weights.into_iter().cloned());
                    self.run_dispatch(d);
                    return;
                }
                self.run_dispatch(d);
            }
        }
        if !(f16 && gq == Some(head_dim) && gk == Some(head_dim)) {
            self.head_norms(q, k, tmp, norms, n_tok, (n_head, n_head_kv, head_dim));
            self.rope_kv_store(q, k, v, kc, vc, pos, slots, n_head, n_head_kv, head_dim, r);
            return;
        }
        self.op();
        // rope_store.wgsl `norm`: a workgroup per head, q normed and rotated in place.
        let mut prm = self.rope_store_prm(pos, slots, n_head, n_head_kv, head_dim, r);
        prm.push(f(eps));
        let bufs = [&q.buf, &k.buf, &v.buf, &kc.buf, &vc.buf, &qn.parts[0].buf, &kn.parts[0].buf];
        self.run(Kernel::RopeStoreNorm, &prm, &bufs, grid(n_tok * (n_head + n_head_kv), 1));
    }

    fn add_bias(&self, x: &mut GpuBuf, b: &GpuWeight, rows: usize) {
        self.op();
        let n = b.rows * b.cols;
        self.run(
            Kernel::AddBias,
            &[(rows * n) as u32, n as u32],
            &[&x.buf, &b.parts[0].buf],
            grid(rows * n, 64),
        );
    }

    fn rope(&self, x: &mut GpuBuf, pos: &[u32], n_head: usize, head_dim: usize, r: &RopeParams) {
        self.op();
        let n_rot = r.n_rot;
        let mut prm = vec![pos.len() as u32, n_head as u32, head_dim as u32, n_rot as u32, r.neox as u32];
        prm.extend(self.rope_caches(pos, r));
        self.run(Kernel::Rope, &prm, &[&x.buf], grid(pos.len() * n_head * n_rot / 2, 64));
    }

    fn kv_store(&self, kc: &mut GpuKv, vc: &mut GpuKv, k: &GpuBuf, v: &GpuBuf, slots: &[u32], dim: usize) {
        self.op();
        if kc.ty != GgmlType::F16 || vc.ty != GgmlType::F16 {
            self.kv_rows_store(kc, &k.buf, slots, dim);
            self.kv_rows_store(vc, &v.buf, slots, dim);
            return;
        }
        let mut prm = vec![slots.len() as u32, dim as u32];
        prm.extend_from_slice(slots);
        self.run(Kernel::KvStore, &prm, &[&k.buf, &v.buf, &kc.buf, &vc.buf], grid(slots.len() * dim / 2, 64));
    }

    fn rope_kv_store(
        &self,
        q: &mut GpuBuf,
        k: &mut GpuBuf,
        v: &GpuBuf,
        kc: &mut GpuKv,
        vc: &mut GpuKv,
        pos: &[u32],
        slots: &[u32],
        n_head: usize,
        n_head_kv: usize,
        head_dim: usize,
        r: &RopeParams,
    ) {
        self.op();
        if kc.ty != GgmlType::F16 || vc.ty != GgmlType::F16 {
            let dim = n_head_kv * head_dim;
            if kv_chunk(kc, dim) >= 64 && kv_chunk(vc, dim) >= 64 {
                // One dispatch (rope_store.wgsl `quantized`): q roped in place, k roped and
                // both stored as kv_rows.wgsl stores them, chunks of whole words.
                let n_tok = pos.len();
                let mut prm = self.rope_store_prm(pos, slots, n_head, n_head_kv, head_dim, r);
                let mut groups = (n_tok * n_head * r.n_rot / 2).div_ceil(64);
                for c in [&*kc, &*vc] {
                    prm.push(kernels::kv_code(c.ty).0);
                    prm.extend(kv_rows_words(c, dim));
                    groups += n_tok * dim / kv_chunk(c, dim);
                }
                let bufs = [&q.buf, &k.buf, &v.buf, &kc.buf, &vc.buf];
                self.run(Kernel::RopeStoreQ, &prm, &bufs, grid(groups, 1));
                return;
            }
            // Chunks of half words: RoPE, then the quantizing store.
            self.flush();
            self.rope(q, pos, n_head, head_dim, r);
            self.rope(k, pos, n_head_kv, head_dim, r);
            self.kv_store(kc, vc, k, v, slots, n_head_kv * head_dim);
            return;
        }
        let (n_tok, n_rot) = (pos.len(), r.n_rot);
        let held = {
            let mut pending = self.pending.lock().unwrap_or_else(|e| e.into_inner());
            let ours = |p: &mut Pending| match p {
                Pending::Qkv { runs } => runs.iter().flat_map(|r| &r.1).eq([&q.buf, &k.buf, &v.buf]),
                _ => false,
            };
            pending.take_if(ours)
        };
        if let Some(Pending::Qkv { runs }) = held {
            if n_rot == head_dim && head_dim.is_multiple_of(4) {
                // The matmuls store q rotated, k rotated and v to the KV slots themselves.
                let rope = self.rope_caches(pos, r);
                for (mut d, outs) in runs {
                    let Kernel::MatmulVec(ty, o, input, shape) = d.kernel else {
                        unreachable!("held by matmul_many")
                    };
                    // The RoPE store takes each of a slot's rows in turn (rope_epilogue.wgsl).
                    d.kernel = Kernel::MatmulVec(ty, kernels::Outs { rope: true, ..o }, input, shape);
                    // The RoPE store's words go at 11 (rope_epilogue.wgsl), the prologue's after them.
                    let prologue = d.prm.split_off(11);
                    let rows_of =
                        |b: &wgpu::Buffer, n: usize| if outs.contains(b) { (n * head_dim) as u32 } else { 0 };
                    let kv_words = (n_head_kv * head_dim / 2) as u32;
                    let rope_at = (d.prm.len() + 7 + prologue.len()) as u32;
                    d.prm.extend([
                        rows_of(&q.buf, n_head),
                        rows_of(&k.buf, n_head_kv),
                        head_dim as u32,
                        r.neox as u32,
                        kv_words,
                        rope_at,
                        rope_at + rope.len() as u32,
                    ]);
                    d.prm.extend(prologue);
                    d.prm.extend_from_slice(&rope);
                    d.prm.extend_from_slice(slots);
                    d.bufs.extend([kc.buf.clone(), vc.buf.clone()]);
                    self.run_dispatch(d);
                }
                return;
            }
            self.run_all(runs.into_iter().map(|r| r.0).collect());
        }
        let prm = self.rope_store_prm(pos, slots, n_head, n_head_kv, head_dim, r);
        let items = n_tok * (n_head * n_rot / 2 + n_head_kv * head_dim / 2);
        self.run(Kernel::RopeStore, &prm, &[&q.buf, &k.buf, &v.buf, &kc.buf, &vc.buf], grid(items, 64));
    }

    fn kv_shift(
        &self,
        kc: &mut GpuKv,
        vc: &mut GpuKv,
        src: &[u32],
        dst: &[u32],
        delta: i32,
        n_head_kv: usize,
        head_dim: usize,
        rope: &RopeParams,
    ) {
        self.op();
        let dim = n_head_kv * head_dim;
        let mut cache = vec![0f32; rope.n_rot];
        crate::backend::cpu::rope_cache(delta as f32, rope, &mut cache);
        if kc.ty != GgmlType::F16 || vc.ty != GgmlType::F16 {
            // As the CPU: keys loaded (dequantized, rotated back), roped, stored again
            // (rotated, quantized); values' blocks copied as they are.
            let n = src.len();
            if n == 0 {
                return;
            }
            let tmp = self.scratch(&self.kv_tmp, n * dim, "kiln kv rows");
            self.run(
                Kernel::KvRows(KvOp::Load, kc.ty),
                &kv_rows_prm(kc, n, dim, src),
                &[&kc.buf, &tmp],
                kv_rows_grid(kc, n, dim),
            );
            let mut prm =
                vec![n as u32, n_head_kv as u32, head_dim as u32, rope.n_rot as u32, rope.neox as u32];
            for _ in 0..n {
                prm.extend(cache.iter().map(|&v| f(v)));
            }
            self.run(Kernel::Rope, &prm, &[&tmp], grid(n * n_head_kv * rope.n_rot / 2, 64));
            self.run(
                Kernel::KvRows(KvOp::Store, kc.ty),
                &kv_rows_prm(kc, n, dim, dst),
                &[&kc.buf, &tmp],
                kv_rows_grid(kc, n, dim),
            );
            let mut prm = kv_rows_prm(vc, n, dim, src);
            prm.extend_from_slice(dst);
            let halves = vc.ty.row_size(dim).unwrap_or(0) / 2;
            self.run(Kernel::KvRows(KvOp::Copy, vc.ty), &prm, &[&vc.buf], grid(n * halves, 64));
            return;
        }
        let mut prm =
            vec![src.len() as u32, dim as u32, head_dim as u32, rope.n_rot as u32, rope.neox as u32];
        prm.extend(cache.iter().map(|&v| f(v)));
        prm.extend_from_slice(src);
        prm.extend_from_slice(dst);
        self.run(Kernel::KvShift, &prm, &[&kc.buf, &vc.buf], grid(src.len() * dim / 2, 64));
    }

    fn attention(&self, q: &GpuBuf, kc: &GpuKv, vc: &GpuKv, plan: &AttnPlan, out: &mut GpuBuf) {
        self.op();
        // Models are refused at load otherwise (check_head_dim; odd sizes by the config).
        assert!(plan.head_dim <= MAX_HEAD_DIM && plan.head_dim.is_multiple_of(2));
        let quantized = kc.ty != GgmlType::F16 || vc.ty != GgmlType::F16;
        let n_tok = plan.pos.len();
        let tok_off = 12u32;
        let tab_off = tok_off + 4 * n_tok as u32;
        let mut table_off = Vec::with_capacity(plan.tables.len());
        let mut tables = Vec::new();
        for t in plan.tables {
            table_off.push(tables.len() as u32);
            tables.extend_from_slice(t);
        }
        // The vec path splits keys into chunks of 256 (attention_split.wgsl).
        let keys = (0..n_tok).map(|i| plan.last_pos(i) - plan.first_pos(i) + 1).max().unwrap_or(1);
        let chunks = keys.div_ceil(SPLIT_KEYS);
        let partials = n_tok * plan.n_head * chunks as usize * (plan.head_dim + 2) * 4;
        let split = self.matmul == MatmulPath::Vec
            && plan.head_dim.is_multiple_of(8)
            && (chunks == 1 || partials <= SPLIT_PARTIALS.min(self.split_bytes as usize));
        let chunks = if split { chunks } else { 1 };
        let mut prm = vec![
            n_tok as u32,
            plan.n_head as u32,
            plan.n_head_kv as u32,
            plan.head_dim as u32,
            f(plan.score_scale()),
            plan.block_size as u32,
            tok_off,
            tab_off,
            0,
            chunks,
            f(plan.softcap),
            0,
        ];
        for i in 0..n_tok {
            let seq = table_off[plan.seq[i] as usize];
            prm.extend_from_slice(&[plan.last_pos(i), plan.first_pos(i), seq, f(plan.q_scale(i))]);
        }
        prm.extend_from_slice(&tables);
        if let Some(max_bias) = plan.alibi {
            // The heads' slopes, then the queries' positions (alibi.wgsl).
            prm[11] = prm.len() as u32;
            prm.extend((0..plan.n_head).map(|h| f(super::alibi_slope(max_bias, plan.n_head, h))));
            prm.extend_from_slice(plan.pos);
        }
        let groups = grid(n_tok * plan.n_head, 1);
        let (len, head_dim) = (n_tok * plan.n_head * plan.head_dim, plan.head_dim);
        if quantized {
            self.attention_kv(q, kc, vc, plan, out, &prm, split, chunks);
            return;
        }
        let bufs = vec![q.buf.clone(), kc.buf.clone(), vc.buf.clone(), out.buf.clone()];
        // (The tiles' kernel has no block tail.)
        let (kernel, bufs, groups, blocks): (AttnKernel, _, _, _) =
            match (self.attention_tiles(plan, kc, vc), split, chunks) {
                // A prompt chunk on the tensor cores: a workgroup per block of queries and head.
                (Some(shape), ..) => {
                    let g = [n_tok.div_ceil(shape.bq() as usize) as u32, plan.n_head as u32, 1];
                    (Box::new(move |t| Kernel::AttnCoop(t != AttnTail::Off, shape)), bufs, g, false)
                }
                (None, false, _) => (Box::new(Kernel::Attention), bufs, groups, true),
                // Every head's keys in one chunk: the split kernel writes the output itself.
                (None, true, 1) => (Box::new(Kernel::AttnDirect), bufs, groups, true),
                (None, true, _) => {
                    let n = n_tok * plan.n_head * chunks as usize * (plan.head_dim + 2);
                    let part = self.scratch(&self.part, n, "kiln partials");
                    let g = [groups[0], groups[1], chunks];
                    self.run(Kernel::AttnPartial, &prm, &[&bufs[0], &bufs[1], &bufs[2], &part], g);
                    (Box::new(Kernel::AttnCombine), vec![part, out.buf.clone()], groups, true)
                }
            };
        self.defer(Pending::Attention { kernel, prm, bufs, groups, len, head_dim, blocks });
    }

    fn layer_norm(&self, x: &GpuBuf, norm: LayerNorm<GpuWeight>, rows: usize, out: &mut GpuBuf) {
        self.op();
        let dim = norm.w.rows * norm.w.cols;
        let w = &norm.w.parts[0].buf;
        // Without a bias the weight is bound in its place, unread.
        let bias = norm.b.map_or(w, |b| &b.parts[0].buf);
        let prm = [rows as u32, dim as u32, f(norm.eps), norm.b.is_some() as u32];
        self.run(Kernel::LayerNorm, &prm, &[w, bias, &x.buf, &out.buf], grid(rows, 1));
    }

    fn gelu(&self, x: &mut GpuBuf, len: usize) {
        self.op();
        self.run(Kernel::Gelu, &[len as u32], &[&x.buf, &self.gelu], grid(len, 64));
    }

    fn short_conv(
        &self,
        bcx: &GpuBuf,
        w: &GpuWeight,
        state: &mut GpuBuf,
        plan: &ConvPlan,
        dim: usize,
        out: &mut GpuBuf,
    ) {
        self.op();
        let (n, l) = (plan.prev.len(), plan.l_cache);
        let mut prm = vec![n as u32, dim as u32, l as u32, 0];
        for i in 0..n {
            prm.extend((0..l).map(|j| match plan.source(i, j) {
                ConvSource::Token(t) => t as u32,
                ConvSource::State { slot, row } => (1 << 31) | (slot * (l as u32 - 1) + row as u32),
                ConvSource::Zero => u32::MAX,
            }));
        }
        let writers: Vec<u32> = plan.state_out.iter().copied().filter(|&s| s != ConvPlan::NONE).collect();
        let mut k = 0;
        for &s in plan.state_out {
            prm.push(if s == ConvPlan::NONE { u32::MAX } else { k });
            k += u32::from(s != ConvPlan::NONE);
        }
        prm[3] = writers.len() as u32;
        prm.extend_from_slice(&writers);
        let rows = writers.len() * (l - 1) * dim;
        let tmp = self.scratch(&self.part, rows.max(1), "kiln partials");
        let bufs = [&tmp, &state.buf, &bcx.buf, &w.parts[0].buf, &out.buf];
        self.run(Kernel::ShortConv, &prm, &bufs, grid(n * dim, 64));
        if rows > 0 {
            self.run(Kernel::ConvState, &prm, &[&tmp, &state.buf], grid(rows, 64));
        }
    }

    fn glu(&self, gate: &mut GpuBuf, up: &GpuBuf, act: Activation, len: usize) {
        self.op();
        let a = match act {
            Activation::Silu => 0,
            Activation::GeluTanh => 1,
        };
        let out = self.swap(gate);
        let gate = gate.alt.clone().expect("swap keeps it");
        // The experts' gate and up projection held for it runs it in its tail.
        let gate_up = match self.take_pending_if(|p| {
            matches!(p, Pending::GateUp { d, len: l } if d.bufs[2] == gate && d.bufs[3] == up.buf && *l == len)
        }) {
            Some(Pending::GateUp { d, .. }) => Some(d),
            _ => None,
        };
        self.defer(Pending::Glu { gate, up: up.buf.clone(), act: a, len, out, gate_up });
    }

    fn add(&self, x: &mut GpuBuf, y: &GpuBuf, scale: f32, len: usize) {
        self.op();
        self.run(Kernel::Add, &[len as u32, f(scale)], &[&x.buf, &y.buf], grid(len, 64));
    }

    fn scale(&self, x: &mut GpuBuf, s: f32, len: usize) {
        self.op();
        self.run(Kernel::Scale, &[len as u32, f(s)], &[&x.buf], grid(len, 64));
    }

    fn softcap(&self, x: &mut GpuBuf, cap: f32, len: usize) {
        self.op();
        self.run(Kernel::Softcap, &[len as u32, f(cap), f(1.0 / cap)], &[&x.buf], grid(len, 64));
    }

    fn argmax(&self, x: &GpuBuf, rows: usize, n: usize) -> Vec<u32> {
        let t = self.argmax_start(x, rows, n);
        self.argmax_finish(t).unwrap_or_else(|e| panic!("{e}"))
    }

    fn argmax_start(&self, x: &GpuBuf, rows: usize, n: usize) -> IdsTicket {
        self.op();
        let buf = self.scratch(&self.ids, rows, "kiln ids");
        // Long rows (vocabularies) in parts of a round of loads each, then their best.
        let parts = n.div_ceil(ARGMAX_SPAN).min(256);
        if parts < 4 {
            self.run(Kernel::Argmax, &[rows as u32, n as u32, 1], &[&x.buf, &buf], grid(rows, 1));
        } else {
            let pairs = self.scratch(&self.part, 2 * rows * parts, "kiln partials");
            self.run(
                Kernel::Argmax,
                &[rows as u32, n as u32, parts as u32],
                &[&x.buf, &pairs],
                grid(rows * parts, 1),
            );
            self.run(Kernel::ArgmaxCombine, &[rows as u32, parts as u32], &[&pairs, &buf], grid(rows, 1));
        }
        IdsTicket::InFlight { slot: self.lock().read_start(&self.ctx, &buf, rows), n: rows }
    }

    fn argmax_finish(&self, t: IdsTicket) -> Result<Vec<u32>> {
        match t {
            IdsTicket::Ready(ids) => Ok(ids),
            IdsTicket::InFlight { slot, n } => {
                let mut words = vec![0f32; n];
                self.lock().read_finish(&self.ctx, slot, &mut words)?;
                Ok(words.iter().map(|w| w.to_bits()).collect())
            }
        }
    }

    fn gather_rows(&self, x: &GpuBuf, rows: &[u32], dim: usize, out: &mut GpuBuf) {
        self.op();
        let mut prm = vec![(rows.len() * dim) as u32, dim as u32];
        prm.extend_from_slice(rows);
        self.run(Kernel::Gather, &prm, &[&out.buf, &x.buf], grid(rows.len() * dim, 64));
    }
}
