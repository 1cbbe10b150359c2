//! Element-wise and matrix kernels of the CPU backend, with ggml's numerics where they
//! matter for near-ties (f64 sum in RMSNorm, activations quantized before matmuls).

use std::sync::OnceLock;

use half::f16;

use super::pool::ThreadPool;
use super::CpuWeight;
use crate::backend::{Activation, ConvPlan, ConvSource, RopeParams};
use crate::quant::{self, GgmlType};

/// A pointer that may be shared between pool tasks writing disjoint elements.
#[derive(Clone, Copy)]
pub(super) struct SyncPtr<T>(pub *mut T);
unsafe impl<T> Send for SyncPtr<T> {}
unsafe impl<T> Sync for SyncPtr<T> {}

impl<T> SyncPtr<T> {
    /// A method, not a field access, so closures capture the whole (Sync) wrapper.
    pub fn get(self) -> *mut T {
        self.0
    }
}

/// `out = x / sqrt(mean(x²) + eps) * w` per row of `dim` (ggml_rms_norm, its sum of squares
/// in f64, then the weight).
pub fn rms_norm(x: &[f32], w: &[f32], eps: f32, dim: usize, out: &mut [f32]) {
    for (xr, or) in x.chunks_exact(dim).zip(out.chunks_exact_mut(dim)) {
        let sum: f64 = xr.iter().map(|&v| (v * v) as f64).sum();
        let mean = (sum / dim as f64) as f32;
        let scale = 1.0 / (mean + eps).sqrt();
        // `w` has `dim` values, or one per head for per-head norms of the same width.
        for ((o, &v), &g) in or.iter_mut().zip(xr).zip(w.iter().cycle()) {
            *o = (v * scale) * g;
        }
    }
}

/// ggml's LayerNorm (`ggml_norm`, then the weight and the bias as two more ops): the mean
/// as an f64 sum, the variance of the centered values in lanes of 16 reduced as
/// `_mm512_reduce_add_ps` into an f64 sum (ggml's AVX-512 `ggml_vec_cvar_f32`), the tail
/// one value at a time.
pub fn layer_norm(x: &[f32], w: &[f32], b: Option<&[f32]>, eps: f32, dim: usize, out: &mut [f32]) {
    for (xr, or) in x.chunks_exact(dim).zip(out.chunks_exact_mut(dim)) {
        let mean = (xr.iter().map(|&v| v as f64).sum::<f64>() as f32) / dim as f32;
        let mut sum = 0f64;
        let body = dim / 16 * 16;
        for (xc, oc) in xr[..body].chunks_exact(16).zip(or[..body].chunks_exact_mut(16)) {
            let mut sq = [0f32; 16];
            for ((o, &v), s) in oc.iter_mut().zip(xc).zip(&mut sq) {
                *o = v - mean;
                *s = *o * *o;
            }
            let t1: [f32; 8] = std::array::from_fn(|l| sq[l + 8] + sq[l]);
            let t2: [f32; 4] = std::array::from_fn(|l| t1[l + 4] + t1[l]);
            sum += ((t2[0] + t2[2]) + (t2[1] + t2[3])) as f64;
        }
        for (o, &v) in or[body..].iter_mut().zip(&xr[body..]) {
            *o = v - mean;
            sum += (*o * *o) as f64;
        }
        let variance = (sum / dim as f64) as f32;
        let scale = 1.0 / (variance + eps).sqrt();
        match b {
            Some(b) => or.iter_mut().zip(w).zip(b).for_each(|((o, &g), &c)| *o = *o * scale * g + c),
            None => or.iter_mut().zip(w).for_each(|(o, &g)| *o = *o * scale * g),
        }
    }
}

/// `Backend::short_conv`: tasks take ranges of channels, each reading every token's window
/// of its channels, then writing the states of its channels (so no task reads a value
/// another has written).
pub fn short_conv(
    pool: &ThreadPool,
    bcx: &[f32],
    w: &[f32],
    state: &mut [f32],
    plan: &ConvPlan,
    dim: usize,
    out: &mut [f32],
) {
    let n = plan.prev.len();
    let l = plan.l_cache;
    let srcs: Vec<ConvSource> = (0..n).flat_map(|i| (0..l).map(move |j| plan.source(i, j))).collect();
    let src = |i: usize, j: usize| srcs[i * l + j];
    let row = (l - 1) * dim;
    let (op, sp) = (SyncPtr(out.as_mut_ptr()), SyncPtr(state.as_mut_ptr()));
    let state_ro = SyncPtr(state.as_mut_ptr());
    const CHANNELS: usize = 64;
    pool.run(dim.div_ceil(CHANNELS), &|task| {
        let cs = task * CHANNELS..((task + 1) * CHANNELS).min(dim);
        // B·x of channel `c` at window value `j` of token `i`.
        let value = |i: usize, j: usize, c: usize| match src(i, j) {
            ConvSource::Token(t) => bcx[t * 3 * dim + c] * bcx[t * 3 * dim + 2 * dim + c],
            // SAFETY: states are written only below, each task its own channels.
            ConvSource::State { slot, row: r } => unsafe {
                *state_ro.get().add(slot as usize * row + r * dim + c)
            },
            ConvSource::Zero => 0.0,
        };
        for i in 0..n {
            for c in cs.clone() {
                let mut sum = 0f32;
                for j in 0..l {
                    sum = value(i, j, c).mul_add(w[c * l + j], sum);
                }
                // SAFETY: each task writes its own channels of `out`.
                unsafe { *op.get().add(i * dim + c) = bcx[i * 3 * dim + dim + c] * sum };
            }
        }
        let mut new = Vec::new();
        for i in (0..n).filter(|&i| plan.state_out[i] != ConvPlan::NONE) {
            for r in 0..l - 1 {
                new.extend(cs.clone().map(|c| value(i, r + 1, c)));
            }
        }
        let mut vals = new.iter();
        for i in (0..n).filter(|&i| plan.state_out[i] != ConvPlan::NONE) {
            let at = plan.state_out[i] as usize * row;
            for r in 0..l - 1 {
                for c in cs.clone() {
                    // SAFETY: each task writes its own channels of the states.
                    unsafe { *sp.get().add(at + r * dim + c) = *vals.next().expect("one value each") };
                }
            }
        }
    });
}

/// Tokens whose quantized activations stay in L1 while a chunk of weight rows passes over
/// them (prefill); each weight row is then read from cache once per tile.
const TOKEN_TILE: usize = 8;

/// Weight rows per pool task: enough tasks per thread to balance load (and to absorb a
/// descheduled thread on a busy machine), few enough that claiming stays cheap, for a
/// 576-row projection and a 151,936-row vocabulary alike.
pub(super) fn rows_per_task(n_rows: usize, n_threads: usize) -> usize {
    if n_threads <= 1 {
        return n_rows.max(1);
    }
    (n_rows / (n_threads * 8)).clamp(4, 1024).next_multiple_of(4)
}

/// The `n_tok` rows of `k` values of `x`, each quantized by `quantize` into `row_bytes`
/// of `buf` (grown once and reused), on the pool where there is enough work.
pub(super) fn quantize_rows<'a>(
    pool: &ThreadPool,
    x: &[f32],
    n_tok: usize,
    k: usize,
    row_bytes: usize,
    buf: &'a mut Vec<u8>,
    quantize: &(dyn Fn(&[f32], &mut [u8]) + Sync),
) -> &'a [u8] {
    if buf.len() < row_bytes * n_tok {
        buf.resize(row_bytes * n_tok, 0);
    }
    let q = &mut buf[..row_bytes * n_tok];
    if n_tok * k <= 1 << 14 {
        for (src, dst) in x.chunks_exact(k).zip(q.chunks_exact_mut(row_bytes)) {
            quantize(src, dst);
        }
    } else {
        let qp = SyncPtr(q.as_mut_ptr());
        pool.run(n_tok, &|t| {
            // SAFETY: each task writes its own row of `q`.
            let dst = unsafe { std::slice::from_raw_parts_mut(qp.get().add(t * row_bytes), row_bytes) };
            quantize(&x[t * k..(t + 1) * k], dst);
        });
    }
    &buf[..row_bytes * n_tok]
}

/// How activations meet a plain (not interleaved) weight's rows: the F16 matmul tiles or
/// the tile kernels where its type has them for rows of its width (x86), else the type's
/// `vec_dot`; and the form of the activation rows those read.
#[derive(Clone, Copy)]
pub(super) struct PlainDot {
    #[cfg(target_arch = "x86_64")]
    pub f16: Option<quant::F16Gemm>,
    #[cfg(target_arch = "x86_64")]
    pub tiles: Option<quant::TileKernels>,
    dot: quant::VecDotFn,
    pub w_ty: GgmlType,
    /// The activation rows' type and bytes.
    pub act_type: GgmlType,
    pub act_row: usize,
}

impl PlainDot {
    pub fn of(w: &CpuWeight) -> Self {
        let k = w.cols;
        #[cfg(target_arch = "x86_64")]
        // tinyBLAS's order for rows of whole 16-value groups (llama.cpp's prompt matmuls on
        // them), for every token count (batch invariance); ggml_vec_dot_f16's otherwise.
        let f16 = (w.ty == GgmlType::F16 && quant::F16Gemm::fits(k)).then(quant::f16_gemm).flatten();
        #[cfg(target_arch = "x86_64")]
        let tiles = quant::tile_kernels(w.ty).filter(|tk| tk.fits(k));
        // The F16 tiles read f32 rows of F16 values (`prepare`).
        #[cfg(target_arch = "x86_64")]
        let act_type = if f16.is_some() { GgmlType::F32 } else { w.ty.vec_dot_type() };
        #[cfg(not(target_arch = "x86_64"))]
        let act_type = w.ty.vec_dot_type();
        let act_row = act_type.row_size(k).expect("weight rows are whole blocks");
        #[cfg(target_arch = "x86_64")]
        return PlainDot { f16, tiles, dot: quant::vec_dot_fn(w.ty), w_ty: w.ty, act_type, act_row };
        #[cfg(not(target_arch = "x86_64"))]
        PlainDot { dot: quant::vec_dot_fn(w.ty), w_ty: w.ty, act_type, act_row }
    }

    /// One activation row in the form the kernels read.
    pub fn prepare(&self, src: &[f32], dst: &mut [u8]) {
        if self.act_type == GgmlType::F32 && self.w_ty == GgmlType::F16 {
            // The F16 tiles: the F16-rounded activations, widened once here.
            quant::round_f16_rows(src, dst)
        } else {
            quant::quantize_activation(self.act_type, src, dst).expect("sizes match")
        }
    }

    /// `put(t, r, dot(w[r], act[t]))` for tokens `0..n_tok` and `rows` of the weight's
    /// bytes `wb` (`rs` a row, `k` columns), a row per call (the GEMV form: the weights
    /// stream from DRAM in one sequence, where rows side by side would be several streams
    /// a core, each its own DRAM pages, which is markedly slower); each row meets every
    /// token while it is in L1, so a few tokens read the weights once, not once each.
    #[allow(clippy::too_many_arguments)]
    pub fn gemv(
        &self,
        wb: &[u8],
        rs: usize,
        k: usize,
        rows: std::ops::Range<usize>,
        act: &[u8],
        n_tok: usize,
        put: &impl Fn(usize, usize, f32),
    ) {
        let a = |t: usize| &act[t * self.act_row..(t + 1) * self.act_row];
        #[cfg(target_arch = "x86_64")]
        if let Some(g) = self.f16 {
            // A row per call below 4 tokens (`F16Gemm::dots`).
            let done = g.dots(&wb[rows.start * rs..], rs, rows.len(), act, n_tok, k, |t, r, v| {
                put(t, rows.start + r, v)
            });
            assert!(done, "F16 rows of {k} values and {n_tok} activation rows");
            return;
        }
        #[cfg(target_arch = "x86_64")]
        if let Some(tk) = self.tiles {
            let mut v = [0f32; quant::TILE];
            for r in rows {
                for t0 in (0..n_tok).step_by(quant::TILE) {
                    let nt = (n_tok - t0).min(quant::TILE);
                    tk.toks(&wb[r * rs..(r + 1) * rs], &act[t0 * self.act_row..], k, nt, &mut v);
                    (0..nt).for_each(|t| put(t0 + t, r, v[t]));
                }
            }
            return;
        }
        for r in rows {
            for t in 0..n_tok {
                put(t, r, (self.dot)(&wb[r * rs..(r + 1) * rs], a(t), k));
            }
        }
    }
}

/// `out[t, r] = dot(w[r], x[t])` with `x` quantized to the weight's dot type first (into
/// `act_buf`, grown once and reused). Each `(t, r)` is one call of the same dot kernel, so
/// a row's result does not depend on the batch it is in.
pub fn matmul(
    pool: &ThreadPool,
    w: &CpuWeight,
    x: &[f32],
    n_tok: usize,
    out: &mut [f32],
    act_buf: &mut Vec<u8>,
) {
    #[cfg(target_arch = "x86_64")]
    if let Some((layout, packed)) = w.interleaved() {
        return super::interleaved::matmul(pool, w, layout, packed, x, n_tok, out, act_buf);
    }
    let k = w.cols;
    #[cfg(target_arch = "x86_64")]
    if w.encoder && w.ty == GgmlType::F16 && quant::F16Amx::fits(k) {
        if let Some(amx) = quant::f16_amx() {
            return super::f16_amx::matmul(pool, amx, w, x, n_tok, out, act_buf);
        }
    }
    let form = PlainDot::of(w);
    #[cfg(target_arch = "x86_64")]
    if let Some(g) = form.f16 {
        return f16_matmul(pool, g, &form, w, x, n_tok, out, act_buf);
    }
    #[cfg(target_arch = "x86_64")]
    let tiles = form.tiles;
    let act_row = form.act_row;
    let act: &[u8] = if form.act_type == GgmlType::F32 && w.ty != GgmlType::F16 {
        bytemuck::cast_slice(x)
    } else {
        quantize_rows(pool, x, n_tok, k, act_row, act_buf, &|src, dst| form.prepare(src, dst))
    };
    let n = w.rows;
    let op = SyncPtr(out.as_mut_ptr());
    let chunk = rows_per_task(n, pool.n_threads());
    let rs = w.row_size;
    let act_at = |t: usize, count: usize| &act[t * act_row..(t + count) * act_row];
    // SAFETY (both writers): element (t, r) is written by the task owning row r only.
    let put = |t: usize, r: usize, v: f32| unsafe { *op.get().add(t * n + r) = v };
    let wb = w.bytes().expect("only interleaved weights lack plain bytes");
    #[cfg(target_arch = "x86_64")]
    if let Some(tk) = tiles {
        use quant::TILE;
        pool.run(n.div_ceil(chunk), &|task| {
            let rows = task * chunk..((task + 1) * chunk).min(n);
            let mut v = [0f32; TILE];
            if n_tok < TILE {
                return form.gemv(wb, rs, k, rows, act, n_tok, &put);
            }
            // GEMM: each weight row meets TILE tokens per unpacking, two rows at a time so
            // the pair shares each activation block's loads.
            let mut v2 = [0f32; 2 * TILE];
            for t0 in (0..n_tok).step_by(TOKEN_TILE) {
                let t1 = (t0 + TOKEN_TILE).min(n_tok);
                let mut r = rows.start;
                while r < rows.end {
                    let nr = if r + 2 <= rows.end { 2 } else { 1 };
                    let wr = &wb[r * rs..(r + nr) * rs];
                    let mut t = t0;
                    while t + TILE <= t1 {
                        if nr == 2 {
                            tk.rows2_toks4(wr, act_at(t, TILE), k, &mut v2);
                            (0..2 * TILE).for_each(|i| put(t + i % TILE, r + i / TILE, v2[i]));
                        } else {
                            tk.toks(wr, act_at(t, TILE), k, TILE, &mut v);
                            (0..TILE).for_each(|i| put(t + i, r, v[i]));
                        }
                        t += TILE;
                    }
                    if t < t1 {
                        for i in 0..nr {
                            tk.toks(&wr[i * rs..(i + 1) * rs], act_at(t, t1 - t), k, t1 - t, &mut v);
                            (0..t1 - t).for_each(|j| put(t + j, r + i, v[j]));
                        }
                    }
                    r += nr;
                }
            }
        });
        return;
    }
    let dot = quant::vec_dot_fn(w.ty);
    pool.run(n.div_ceil(chunk), &|task| {
        let rows = task * chunk..((task + 1) * chunk).min(n);
        for t0 in (0..n_tok).step_by(TOKEN_TILE) {
            let tile = t0..(t0 + TOKEN_TILE).min(n_tok);
            for r in rows.clone() {
                let wr = &wb[r * rs..(r + 1) * rs];
                for t in tile.clone() {
                    put(t, r, dot(wr, act_at(t, 1), k));
                }
            }
        }
    });
}

/// [`matmul`] on F16 weights with the F16 tiles (`quant::F16Gemm`): the activations rounded
/// to F16 as ggml converts them and widened back, once (`quant::round_f16_rows`), then each
/// task takes a range of weight rows over every token. Each `(t, r)` has one fixed order of
/// operations (`quant::dot_f16_lanes`), so a row's result does not depend on the batch.
#[cfg(target_arch = "x86_64")]
#[allow(clippy::too_many_arguments)]
fn f16_matmul(
    pool: &ThreadPool,
    g: quant::F16Gemm,
    form: &PlainDot,
    w: &CpuWeight,
    x: &[f32],
    n_tok: usize,
    out: &mut [f32],
    act_buf: &mut Vec<u8>,
) {
    let (k, n, rs) = (w.cols, w.rows, w.row_size);
    let act = quantize_rows(pool, x, n_tok, k, form.act_row, act_buf, &|src, dst| form.prepare(src, dst));
    let wb = w.bytes().expect("only interleaved weights lack plain bytes");
    let op = SyncPtr(out.as_mut_ptr());
    let chunk = rows_per_task(n, pool.n_threads());
    pool.run(n.div_ceil(chunk), &|task| {
        let r0 = task * chunk;
        let rows = chunk.min(n - r0);
        // SAFETY: element (t, r) is written by the task owning row r only.
        let put = |t: usize, r: usize, v: f32| unsafe { *op.get().add(t * n + r0 + r) = v };
        let done = g.dots(&wb[r0 * rs..], rs, rows, act, n_tok, k, put);
        assert!(done, "F16 weights of {n} rows of {k} values and {n_tok} activation rows");
    });
}

/// ggml's `rope_yarn_corr_dims`: the dimension range over which YaRN ramps.
fn yarn_corr_dims(n_dims: usize, n_ctx_orig: usize, base: f32, beta_fast: f32, beta_slow: f32) -> [f32; 2] {
    let corr = |n_rot: f32| {
        n_dims as f32 * (n_ctx_orig as f32 / (n_rot * 2.0 * std::f32::consts::PI)).ln() / (2.0 * base.ln())
    };
    let start = corr(beta_fast).floor();
    let end = corr(beta_slow).ceil();
    [start.max(0.0), end.min(n_dims as f32 - 1.0)]
}

/// cos/sin pairs for one position, as ggml's `rope_cache_init`.
pub fn rope_cache(p: f32, r: &RopeParams, cache: &mut [f32]) {
    let theta_scale = r.freq_base.powf(-2.0 / r.n_rot as f32);
    let corr = yarn_corr_dims(r.n_rot, r.n_ctx_orig, r.freq_base, r.beta_fast, r.beta_slow);
    let mut theta = p;
    for i0 in (0..r.n_rot).step_by(2) {
        let ff = r.freq_factors.as_ref().map_or(1.0, |f| f[i0 / 2]);
        let theta_extrap = theta / ff;
        let theta_interp = r.freq_scale * theta_extrap;
        let mut th = theta_interp;
        let mut mscale = r.attn_factor;
        if r.ext_factor != 0.0 {
            let y = ((i0 / 2) as f32 - corr[0]) / (corr[1] - corr[0]).max(0.001);
            let ramp_mix = (1.0 - y.clamp(0.0, 1.0)) * r.ext_factor;
            th = theta_interp * (1.0 - ramp_mix) + theta_extrap * ramp_mix;
            mscale *= 1.0 + 0.1 * (1.0 / r.freq_scale).ln();
        }
        cache[i0] = th.cos() * mscale;
        cache[i0 + 1] = th.sin() * mscale;
        theta *= theta_scale;
    }
}

/// Rotates each head of every row; the rotation fuses one product into an FMA the way
/// GCC contracts ggml's `x0*cos - x1*sin` (llama.cpp's own build), so values match it.
pub fn rope<P: Copy + Into<f64>>(x: &mut [f32], pos: &[P], n_head: usize, head_dim: usize, r: &RopeParams) {
    #[cfg(target_arch = "x86_64")]
    if quant::cpu_tier() >= quant::CpuTier::Avx2 {
        // SAFETY: the CPU has FMA.
        return unsafe { rope_fma(x, pos, n_head, head_dim, r) };
    }
    rope_rows(x, pos, n_head, head_dim, r)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "fma")]
unsafe fn rope_fma<P: Copy + Into<f64>>(
    x: &mut [f32],
    pos: &[P],
    n_head: usize,
    head_dim: usize,
    r: &RopeParams,
) {
    rope_rows(x, pos, n_head, head_dim, r)
}

#[inline(always)]
fn rope_rows<P: Copy + Into<f64>>(x: &mut [f32], pos: &[P], n_head: usize, head_dim: usize, r: &RopeParams) {
    let mut stack = [0.0f32; 256];
    let mut heap = Vec::new();
    let cache: &mut [f32] = if r.n_rot <= stack.len() {
        &mut stack[..r.n_rot]
    } else {
        heap.resize(r.n_rot, 0.0);
        &mut heap
    };
    let row = n_head * head_dim;
    let offset = if r.neox { r.n_rot / 2 } else { 1 };
    for (t, &p) in pos.iter().enumerate() {
        rope_cache(p.into() as f32, r, cache);
        for h in 0..n_head {
            let head = &mut x[t * row + h * head_dim..t * row + (h + 1) * head_dim];
            for i0 in (0..r.n_rot).step_by(2) {
                // NORM pairs (i0, i0+1); NEOX pairs (i0/2, i0/2 + n_rot/2).
                let ic = if r.neox { i0 / 2 } else { i0 };
                let (c, s) = (cache[i0], cache[i0 + 1]);
                let (x0, x1) = (head[ic], head[ic + offset]);
                head[ic] = x0.mul_add(c, -(x1 * s));
                head[ic + offset] = x0.mul_add(s, x1 * c);
            }
        }
    }
}

/// [`crate::sample::argmax`] of each row of `n` values.
pub fn argmax_rows(x: &[f32], n: usize) -> Vec<u32> {
    x.chunks_exact(n.max(1)).map(crate::sample::argmax).collect()
}

/// GELU-tanh of every f16 value, as ggml's table (it evaluates GELU on f16-rounded inputs),
/// and one value of padding, so a 32-bit gather at any index stays inside.
pub(crate) fn gelu_table() -> &'static [f16] {
    static TABLE: OnceLock<Vec<f16>> = OnceLock::new();
    TABLE.get_or_init(|| {
        (0..=u16::MAX)
            .map(|bits| {
                let x = f16::from_bits(bits).to_f32();
                let g = 0.5 * x * (1.0 + (0.797_884_6 * x * (1.0 + 0.044715 * x * x)).tanh());
                f16::from_f32(g)
            })
            .chain([f16::ZERO])
            .collect()
    })
}

/// `gate = gelu(gate) * up` (ggml's `ggml_vec_geglu_f32`: the table below ±10).
fn geglu(gate: &mut [f32], up: &[f32]) {
    let table = gelu_table();
    #[cfg(target_arch = "x86_64")]
    if quant::cpu_tier() >= quant::CpuTier::Avx2 {
        // SAFETY: the CPU has AVX2 and F16C; the table has 65,537 entries.
        return unsafe { geglu_avx2(gate, up, table) };
    }
    geglu_scalar(gate, up, table);
}

fn geglu_scalar(gate: &mut [f32], up: &[f32], table: &[f16]) {
    for (o, &u) in gate.iter_mut().zip(up) {
        let g = *o;
        *o = if g <= -10.0 {
            0.0
        } else if g >= 10.0 {
            g * u
        } else {
            table[f16::from_f32(g).to_bits() as usize].to_f32() * u
        };
    }
}

/// [`geglu_scalar`] eight values at a time: F16C rounds to the table index (as
/// `f16::from_f32`), a gather reads the entries; the same values.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn geglu_avx2(gate: &mut [f32], up: &[f32], table: &[f16]) {
    use std::arch::x86_64::*;
    let n = gate.len().min(up.len());
    let body = n / 8 * 8;
    let base = table.as_ptr() as *const i32;
    let (lo, hi, low16) = (_mm256_set1_ps(-10.0), _mm256_set1_ps(10.0), _mm256_set1_epi32(0xffff));
    for i in (0..body).step_by(8) {
        let g = _mm256_loadu_ps(gate.as_ptr().add(i));
        let u = _mm256_loadu_ps(up.as_ptr().add(i));
        let idx = _mm256_cvtepu16_epi32(_mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(g));
        // Entry k is the low half of the 32 bits at byte 2k (index 65,535 reads the padding).
        let e = _mm256_and_si256(_mm256_i32gather_epi32::<2>(base, idx), low16);
        let t = _mm256_mul_ps(_mm256_cvtph_ps(low_halves(e)), u);
        let r = _mm256_blendv_ps(t, _mm256_mul_ps(g, u), _mm256_cmp_ps::<_CMP_GE_OQ>(g, hi));
        let r = _mm256_blendv_ps(r, _mm256_setzero_ps(), _mm256_cmp_ps::<_CMP_LE_OQ>(g, lo));
        _mm256_storeu_ps(gate.as_mut_ptr().add(i), r);
    }
    geglu_scalar(&mut gate[body..n], &up[body..n], table);
}

/// The low 16 bits of eight i32 lanes as eight packed u16.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn low_halves(v: std::arch::x86_64::__m256i) -> std::arch::x86_64::__m128i {
    use std::arch::x86_64::*;
    // Lanes are < 2^16, so the unsigned saturating pack is exact.
    let packed = _mm256_packus_epi32(v, v);
    _mm256_castsi256_si128(_mm256_permute4x64_epi64::<0b1000>(packed))
}

/// `x = gelu(x)` (ggml's `ggml_vec_gelu_f32`: the table below 10, the identity above).
pub fn gelu(x: &mut [f32]) {
    let table = gelu_table();
    for v in x {
        *v = if *v <= -10.0 {
            0.0
        } else if *v >= 10.0 {
            *v
        } else {
            table[f16::from_f32(*v).to_bits() as usize].to_f32()
        };
    }
}

pub fn glu(gate: &mut [f32], up: &[f32], act: Activation) {
    match act {
        Activation::Silu => super::vexp::swiglu(gate, up),
        Activation::GeluTanh => geglu(gate, up),
    }
}

#[cfg(test)]
mod tests {
    use super::argmax_rows;

    #[test]
    fn geglu_simd_matches_scalar() {
        let table = super::gelu_table();
        let n = 1000;
        let gate: Vec<f32> =
            (0..n).map(|i| (i as f32 - 500.0) * 0.031 + 1e-4).chain([f32::INFINITY, -11.0]).collect();
        let up: Vec<f32> = (0..gate.len()).map(|i| 1.0 - i as f32 * 0.0013).collect();
        let mut want = gate.clone();
        super::geglu_scalar(&mut want, &up, table);
        let mut got = gate.clone();
        super::geglu(&mut got, &up);
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&got), bits(&want));
        assert!(want.iter().any(|&v| v != 0.0) && want[n + 1] == 0.0);
    }

    #[test]
    fn argmax_rows_takes_each_rows_argmax() {
        let rows: [&[f32]; 3] = [&[1.0, 3.0, 2.0, 3.0], &[-3.0, -2.0, -1.0, -1.5], &[9.0, 0.0, 0.0, 0.0]];
        let flat: Vec<f32> = rows.iter().flat_map(|r| r.iter().copied()).collect();
        assert_eq!(argmax_rows(&flat, 4), [1, 2, 0]);
    }
}
