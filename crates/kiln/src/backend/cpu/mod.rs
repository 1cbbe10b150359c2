//! The CPU backend: weights read in place from the mmap, kernels from `quant`, work spread
//! over a persistent thread pool.

mod arena;
mod attention;
mod expert_gemv;
pub(crate) mod expf;
#[cfg(target_arch = "x86_64")]
mod f16_amx;
#[cfg(target_arch = "x86_64")]
mod interleaved;
mod kv_buf;
mod kv_rows;
mod moe;
mod ops;
pub use attention::{AttnArith, Blocks, Cache};
pub(crate) use ops::gelu_table;
pub use ops::rope_cache;
pub mod pool;
mod vexp;
mod weight;
pub use kv_buf::{k_rows, set_k_rows, KvBuf};
pub use moe::CpuExperts;
pub use weight::CpuWeight;

use std::sync::Arc;

use super::{Activation, AttnPlan, Backend, ConvPlan, ExpertInput, LayerNorm, RopeParams, Routing};
use crate::error::{KilnError, Result};
use crate::gguf::{GgufFile, TensorInfo};
use crate::quant;
use pool::ThreadPool;

type VectorCache = std::collections::HashMap<(usize, usize), Arc<Vec<f32>>>;

pub struct CpuBackend {
    pool: Arc<ThreadPool>,
    /// Small f32 vectors (norm weights, biases) dequantized once at load, keyed by offset.
    vectors: std::sync::Mutex<VectorCache>,
    /// Quantized activations of the current matmul, grown to the largest batch once.
    act_buf: std::sync::Mutex<Vec<u8>>,
    /// The arena of repacked weights of each file loaded (keyed by the file's address).
    arenas: std::sync::Mutex<std::collections::HashMap<usize, std::sync::Weak<arena::Arena>>>,
    attn: AttnArith,
    /// Encoders' F16 matmuls on AMX-BF16 tiles where the CPU has them (the default).
    encoder_amx: bool,
}

impl CpuBackend {
    pub fn new(n_threads: usize) -> Self {
        CpuBackend {
            pool: Arc::new(ThreadPool::new(n_threads)),
            vectors: Default::default(),
            act_buf: Default::default(),
            arenas: Default::default(),
            attn: AttnArith::default(),
            encoder_amx: true,
        }
    }

    /// The attention's arithmetic (default [`AttnArith::Hybrid`]).
    pub fn with_attn_arith(mut self, arith: AttnArith) -> Self {
        self.attn = arith;
        self
    }

    /// Whether encoders' F16 matmuls run on AMX-BF16 tiles where the CPU has them (the
    /// default: about twice as fast, sums in the tile unit's order) or in tinyBLAS's order
    /// as decoders' do (llama.cpp's bits; `KILN_CPU=avx512vnni` does the same for a process).
    pub fn with_encoder_amx(mut self, on: bool) -> Self {
        self.encoder_amx = on;
        self
    }

    pub fn n_threads(&self) -> usize {
        self.pool.n_threads()
    }

    /// A backend on the same thread pool (a draft model's beside its model's: one set of
    /// threads takes turns at both, none spinning against the other's).
    pub fn sharing_threads(&self) -> Self {
        CpuBackend {
            pool: self.pool.clone(),
            vectors: Default::default(),
            act_buf: Default::default(),
            arenas: Default::default(),
            attn: self.attn,
            encoder_amx: self.encoder_amx,
        }
    }

    /// `gguf`'s arena, shared by all its weights, sized for all its tensors (a file's data
    /// are at most its size; slices are rounded up to cache lines); `None` where the
    /// address space cannot be reserved.
    fn arena(&self, gguf: &Arc<GgufFile>) -> Option<Arc<arena::Arena>> {
        let mut arenas = self.arenas.lock().unwrap_or_else(|e| e.into_inner());
        arenas.retain(|_, a| a.strong_count() > 0);
        let key = Arc::as_ptr(gguf) as usize;
        if let Some(a) = arenas.get(&key).and_then(|a| a.upgrade()) {
            return Some(a);
        }
        let cap = gguf.file_size() as usize + 64 * gguf.tensors.len();
        let a = Arc::new(arena::Arena::new(cap).ok()?);
        arenas.insert(key, Arc::downgrade(&a));
        Some(a)
    }

    fn vector(&self, w: &CpuWeight) -> Arc<Vec<f32>> {
        let mut cache = self.vectors.lock().unwrap_or_else(|e| e.into_inner());
        cache.entry(w.key()).or_insert_with(|| Arc::new(w.to_f32())).clone()
    }
}

/// Physical cores, the default thread count (hyperthreads add little to memory-bound work).
pub fn default_threads() -> usize {
    std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1)
}

impl Backend for CpuBackend {
    type Weight = CpuWeight;
    type Buf = Vec<f32>;
    type Kv = KvBuf;
    type Experts = CpuExperts;

    fn name(&self) -> String {
        format!("cpu ({} threads)", self.n_threads())
    }

    fn load_weight(&self, gguf: &Arc<GgufFile>, t: &TensorInfo) -> Result<CpuWeight> {
        if !t.ty.is_supported() {
            return Err(KilnError::Tensor {
                name: t.name.clone(),
                msg: format!("unsupported tensor type {}", t.ty.name()),
            });
        }
        CpuWeight::load(gguf, self.arena(gguf), t)
    }

    /// Rows wider than Q4_1 (five bits a weight: Q8_0, Q6_K, Q5_0, F16, ...) requantized to
    /// Q4_1 with sixteen rows interleaved: its decode kernel streams them near the bandwidth
    /// limit, where a Q8_0 matrix's row-at-a-time dots run at about a third of it
    /// (qwen2.5-coder-0.5b, its 136 MB Q8_0 output matrix: a draft step 2x faster).
    fn draft_output(&self, gguf: &Arc<GgufFile>, t: &TensorInfo) -> Result<Option<CpuWeight>> {
        use quant::GgmlType::Q4_1;
        let cols = t.rows_cols().1;
        let narrower = Q4_1.row_size(cols).is_ok_and(|q| t.ty.row_size(cols).is_ok_and(|r| q < r));
        if !narrower || !weight::interleaves(Q4_1) {
            return Ok(None);
        }
        Ok(self.load_weight(gguf, t)?.requantized(&self.pool, Q4_1))
    }

    fn encoder_weight(&self, mut w: CpuWeight) -> CpuWeight {
        w.encoder = self.encoder_amx;
        w
    }

    fn load_experts(
        &self,
        gguf: &Arc<GgufFile>,
        t: &TensorInfo,
        n_expert: usize,
        parts: &[usize],
    ) -> Result<Vec<CpuExperts>> {
        if !t.ty.is_supported() {
            return Err(KilnError::Tensor {
                name: t.name.clone(),
                msg: format!("unsupported tensor type {}", t.ty.name()),
            });
        }
        moe::load(gguf, self.arena(gguf), t, n_expert, parts)
    }

    fn weight_shape(&self, w: &CpuWeight) -> (usize, usize) {
        (w.rows, w.cols)
    }

    fn alloc(&self, len: usize) -> Result<Vec<f32>> {
        Ok(vec![0.0; len])
    }

    fn alloc_kv(&self, len: usize) -> Result<KvBuf> {
        KvBuf::zeroed(len)
    }

    fn alloc_kv_typed(
        &self,
        n_slots: usize,
        dim: usize,
        ty: quant::GgmlType,
        rot: Option<usize>,
    ) -> Result<KvBuf> {
        KvBuf::typed(n_slots, dim, ty, rot)
    }

    fn read(&self, buf: &Vec<f32>, out: &mut [f32]) {
        out.copy_from_slice(&buf[..out.len()]);
    }

    fn embed(&self, table: &CpuWeight, ids: &[u32], scale: f32, out: &mut Vec<f32>) -> Result<()> {
        let d = table.cols;
        for (i, &id) in ids.iter().enumerate() {
            if id as usize >= table.rows {
                return Err(KilnError::invalid(format!(
                    "token id {id} is outside the vocabulary ({})",
                    table.rows
                )));
            }
            let dst = &mut out[i * d..(i + 1) * d];
            quant::dequantize_row(table.ty, &table.row(id as usize)?, dst)?;
            if scale != 1.0 {
                dst.iter_mut().for_each(|x| *x *= scale);
            }
        }
        Ok(())
    }

    fn write_rows(&self, buf: &mut Vec<f32>, v: &[f32]) {
        buf[..v.len()].copy_from_slice(v);
    }

    fn rms_norm(&self, x: &Vec<f32>, w: &CpuWeight, eps: f32, rows: usize, dim: usize, out: &mut Vec<f32>) {
        let w = self.vector(w);
        // A row's sum of squares is one f64 chain (ggml's order): a prompt's rows go to the
        // threads in runs (gemma3-270m's pp512 spent 3.5% in one thread's norms).
        let run = rows.div_ceil(4 * self.pool.n_threads()).max(16);
        let op = ops::SyncPtr(out.as_mut_ptr());
        self.pool.run(rows.div_ceil(run), &|task| {
            let r = task * run..((task + 1) * run).min(rows);
            // SAFETY: each task writes its own rows of `out`.
            let o = unsafe { std::slice::from_raw_parts_mut(op.get().add(r.start * dim), r.len() * dim) };
            ops::rms_norm(&x[r.start * dim..r.end * dim], &w, eps, dim, o);
        });
    }

    fn layer_norm(&self, x: &Vec<f32>, norm: LayerNorm<CpuWeight>, rows: usize, out: &mut Vec<f32>) {
        let eps = norm.eps;
        let (w, b) = (self.vector(norm.w), norm.b.map(|b| self.vector(b)));
        let dim = w.len();
        let run = rows.div_ceil(4 * self.pool.n_threads()).max(16);
        let op = ops::SyncPtr(out.as_mut_ptr());
        self.pool.run(rows.div_ceil(run), &|task| {
            let r = task * run..((task + 1) * run).min(rows);
            // SAFETY: each task writes its own rows of `out`.
            let o = unsafe { std::slice::from_raw_parts_mut(op.get().add(r.start * dim), r.len() * dim) };
            ops::layer_norm(&x[r.start * dim..r.end * dim], &w, b.as_deref().map(|b| &b[..]), eps, dim, o);
        });
    }

    fn matmul(&self, w: &CpuWeight, x: &Vec<f32>, rows: usize, out: &mut Vec<f32>) {
        let mut act = self.act_buf.lock().unwrap_or_else(|e| e.into_inner());
        ops::matmul(&self.pool, w, &x[..rows * w.cols], rows, &mut out[..rows * w.rows], &mut act);
    }

    fn add_bias(&self, x: &mut Vec<f32>, b: &CpuWeight, rows: usize) {
        let b = self.vector(b);
        for row in x[..rows * b.len()].chunks_exact_mut(b.len()) {
            row.iter_mut().zip(b.iter()).for_each(|(x, b)| *x += b);
        }
    }

    fn rope(&self, x: &mut Vec<f32>, pos: &[u32], n_head: usize, head_dim: usize, rope: &RopeParams) {
        ops::rope(&mut x[..pos.len() * n_head * head_dim], pos, n_head, head_dim, rope);
    }

    fn kv_store(
        &self,
        kc: &mut KvBuf,
        vc: &mut KvBuf,
        k: &Vec<f32>,
        v: &Vec<f32>,
        slots: &[u32],
        dim: usize,
    ) {
        kv_rows::store(kc, true, k, slots, dim);
        kv_rows::store(vc, false, v, slots, dim);
    }

    fn attention(&self, q: &Vec<f32>, kc: &KvBuf, vc: &KvBuf, plan: &AttnPlan, out: &mut Vec<f32>) {
        attention::attention(&self.pool, q, kv_rows::cache(kc), kv_rows::cache(vc), plan, self.attn, out);
    }

    fn attention_whole(
        &self,
        q: &Vec<f32>,
        k: &Vec<f32>,
        v: &Vec<f32>,
        _kv: (&mut KvBuf, &mut KvBuf),
        n: usize,
        (n_head, head_dim): (usize, usize),
        scale: f32,
        out: &mut Vec<f32>,
    ) {
        #[cfg(target_arch = "x86_64")]
        if self.encoder_amx && quant::f16_amx().is_some() {
            let shape = (n, n_head, head_dim);
            return attention::whole_amx::attention(q, k, v, out, shape, scale, self.n_threads());
        }
        attention::whole::attention(q, k, v, out, n, n_head, head_dim, scale, self.n_threads());
    }

    fn moe_route(
        &self,
        logits: &Vec<f32>,
        rows: usize,
        r: &Routing,
        bias: Option<&[f32]>,
        ids: &mut Vec<f32>,
        weights: &mut Vec<f32>,
    ) {
        moe::route(logits, rows, r, bias, ids, weights);
    }

    fn matmul_id(&self, ws: &[&CpuExperts], input: ExpertInput<Vec<f32>>, outs: &mut [&mut Vec<f32>]) {
        let mut act = self.act_buf.lock().unwrap_or_else(|e| e.into_inner());
        moe::matmul_id(&self.pool, ws, input, outs, &mut act);
    }

    fn moe_sum(
        &self,
        y: &Vec<f32>,
        weights: &Vec<f32>,
        rows: usize,
        k: usize,
        dim: usize,
        out: &mut Vec<f32>,
    ) {
        moe::sum(&self.pool, y, weights, rows, k, dim, out);
    }

    fn add_sigmoid_gated(&self, x: &mut Vec<f32>, y: &Vec<f32>, g: &Vec<f32>, rows: usize, dim: usize) {
        moe::add_sigmoid_gated(x, y, g, rows, dim);
    }

    fn glu(&self, gate: &mut Vec<f32>, up: &Vec<f32>, act: Activation, len: usize) {
        ops::glu(&mut gate[..len], &up[..len], act);
    }

    fn short_conv(
        &self,
        bcx: &Vec<f32>,
        w: &CpuWeight,
        state: &mut Vec<f32>,
        plan: &ConvPlan,
        dim: usize,
        out: &mut Vec<f32>,
    ) {
        let w = self.vector(w);
        ops::short_conv(&self.pool, bcx, &w, state, plan, dim, out);
    }

    fn gelu(&self, x: &mut Vec<f32>, len: usize) {
        ops::gelu(&mut x[..len]);
    }

    fn add(&self, x: &mut Vec<f32>, y: &Vec<f32>, scale: f32, len: usize) {
        if scale == 1.0 {
            x[..len].iter_mut().zip(&y[..len]).for_each(|(x, y)| *x += y);
        } else {
            x[..len].iter_mut().zip(&y[..len]).for_each(|(x, y)| *x += y * scale);
        }
    }

    fn scale(&self, x: &mut Vec<f32>, s: f32, len: usize) {
        x[..len].iter_mut().for_each(|x| *x *= s);
    }

    fn softcap(&self, x: &mut Vec<f32>, cap: f32, len: usize) {
        let inv = 1.0 / cap;
        x[..len].iter_mut().for_each(|x| *x = (*x * inv).tanh() * cap);
    }

    fn argmax(&self, x: &Vec<f32>, rows: usize, n: usize) -> Vec<u32> {
        ops::argmax_rows(&x[..rows * n], n)
    }

    fn gather_rows(&self, x: &Vec<f32>, rows: &[u32], dim: usize, out: &mut Vec<f32>) {
        for (j, &r) in rows.iter().enumerate() {
            let r = r as usize;
            out[j * dim..(j + 1) * dim].copy_from_slice(&x[r * dim..(r + 1) * dim]);
        }
    }

    fn kv_shift(
        &self,
        kc: &mut KvBuf,
        vc: &mut KvBuf,
        src: &[u32],
        dst: &[u32],
        delta: i32,
        n_head_kv: usize,
        head_dim: usize,
        rope: &RopeParams,
    ) {
        let dim = n_head_kv * head_dim;
        let mut row = vec![0f32; dim];
        for (&s, &d) in src.iter().zip(dst) {
            let (s, d) = (s as usize, d as usize);
            // ggml rotates an f16 cache in place the same way (rope on f16 rows), and a
            // quantized one dequantized, rotated back, roped, rotated and quantized again.
            kv_rows::load(kc, true, s, &mut row);
            ops::rope(&mut row, &[delta], n_head_kv, head_dim, rope);
            kv_rows::store(kc, true, &row, &[d as u32], dim);
            kv_rows::copy(vc, s, d, dim);
        }
    }
}
