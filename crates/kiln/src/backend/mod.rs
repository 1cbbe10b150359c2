//! The `Backend` trait: device buffers and the ops a forward needs. A backend never
//! contains a model; the model code (`model::forward`) is written once against this trait.

pub mod cpu;
#[cfg(feature = "gpu")]
pub mod wgpu;

use std::sync::Arc;

use crate::error::Result;
use crate::gguf::{GgufFile, TensorInfo};
use crate::quant::GgmlType;

/// The gated activation of the feed-forward block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Activation {
    /// SiLU(gate) * up (llama, qwen, granite).
    Silu,
    /// GELU-tanh(gate) * up (gemma; BERT's GEGLU).
    GeluTanh,
}

/// How a mixture-of-experts router turns its logits into expert scores.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Gating {
    /// Softmax over all experts (ggml's `soft_max`).
    Softmax,
    /// Each expert's logistic sigmoid on its own.
    Sigmoid,
}

/// Mixture-of-experts routing: each token goes to the `k` experts (of `n_expert`) with the
/// highest scores, weighted by their scores (divided by their sum where `norm`, then times
/// `scale`). Experts are ordered by score, highest first (the lowest index on ties); their
/// outputs are added in that order.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Routing {
    pub n_expert: usize,
    pub k: usize,
    pub gating: Gating,
    pub norm: bool,
    pub scale: f32,
}

/// Rotary embedding parameters of one layer (ggml's `rope_ext` arguments).
#[derive(Clone, Debug, PartialEq)]
pub struct RopeParams {
    /// Rotated dimensions (the first `n_rot` of each head).
    pub n_rot: usize,
    /// NEOX rotates the two halves of the rotated dims; NORM rotates adjacent pairs.
    pub neox: bool,
    pub freq_base: f32,
    pub freq_scale: f32,
    /// YaRN: 0 disables the ramp.
    pub ext_factor: f32,
    pub attn_factor: f32,
    pub beta_fast: f32,
    pub beta_slow: f32,
    pub n_ctx_orig: usize,
    /// Per-dimension-pair divisors of theta (llama-3 `rope_freqs`), `n_rot / 2` values.
    pub freq_factors: Option<Arc<Vec<f32>>>,
}

impl RopeParams {
    /// No dimension rotated: the identity (layers without RoPE).
    pub fn identity() -> Self {
        RopeParams {
            n_rot: 0,
            neox: false,
            freq_base: 10000.0,
            freq_scale: 1.0,
            ext_factor: 0.0,
            attn_factor: 1.0,
            beta_fast: 32.0,
            beta_slow: 1.0,
            n_ctx_orig: 0,
            freq_factors: None,
        }
    }
}

/// Which keys each query token of a batch attends to. Sequences are stored in the KV
/// pool as block tables; token `i` sits at position `pos[i]` of sequence `seq[i]` and sees
/// positions `pos[i] - window + 1 ..= pos[i]` of its own sequence (all earlier ones when
/// `window` is `None`); without causality (encoders, a causal model's bidirectional step such
/// as an image's rows), every position of its sequence below `seq_len` from the window's
/// start on.
#[derive(Clone, Debug)]
pub struct AttnPlan<'a> {
    pub pos: &'a [u32],
    pub seq: &'a [u32],
    /// Block table of each sequence named in `seq`.
    pub tables: &'a [&'a [u32]],
    pub block_size: usize,
    pub n_head: usize,
    pub n_head_kv: usize,
    pub head_dim: usize,
    /// Scale of q·k.
    pub scale: f32,
    /// Per query token, a multiplier of its query applied before the query is rounded to
    /// f16, where llama.cpp's graph scales q itself (phi3's and gemma2's attention scale,
    /// mistral3's temperature); empty: none.
    pub q_scale: &'a [f32],
    /// Soft-capping of the scores, `cap · tanh(score / cap)` (gemma2); 0: none.
    pub softcap: f32,
    pub window: Option<u32>,
    /// Non-causal attention (encoders; a causal model's bidirectional step): per sequence,
    /// the end of its positions in this batch, below which every query of that sequence sees
    /// all positions (within its window). `None`: causal.
    pub seq_len: Option<&'a [u32]>,
    /// ALiBi's maximum bias: each score gets `slope(head) * -|query pos - key pos|`, the
    /// slopes as ggml's `soft_max`/flash attention compute them. `None`: no bias.
    pub alibi: Option<f32>,
}

impl AttnPlan<'_> {
    /// The KV slot holding position `p` of sequence `s`.
    pub fn slot(&self, s: u32, p: u32) -> usize {
        let table = self.tables[s as usize];
        table[p as usize / self.block_size] as usize * self.block_size + p as usize % self.block_size
    }

    /// Token `i`'s query multiplier (`q_scale`).
    pub fn q_scale(&self, i: usize) -> f32 {
        self.q_scale.get(i).copied().unwrap_or(1.0)
    }

    /// The multiplier of q·k before soft-capping: ggml divides the scale by the cap.
    pub fn score_scale(&self) -> f32 {
        if self.softcap != 0.0 {
            self.scale / self.softcap
        } else {
            self.scale
        }
    }

    /// First position token `i` attends to.
    pub fn first_pos(&self, i: usize) -> u32 {
        match self.window {
            Some(w) => (self.pos[i] + 1).saturating_sub(w),
            None => 0,
        }
    }

    /// Last position token `i` attends to.
    pub fn last_pos(&self, i: usize) -> u32 {
        match self.seq_len {
            Some(n) => n[self.seq[i] as usize].saturating_sub(1),
            None => self.pos[i],
        }
    }

    /// ALiBi's bias of key position `p` for query `i` on head `h` (0 without ALiBi): the
    /// distance as an f16 mask value, times the head's slope, as ggml adds it.
    pub fn bias(&self, i: usize, h: usize, p: u32) -> f32 {
        match self.alibi {
            Some(max_bias) => {
                let d = self.pos[i].abs_diff(p) as f32;
                alibi_slope(max_bias, self.n_head, h) * half::f16::from_f32(-d).to_f32()
            }
            None => 0.0,
        }
    }
}

/// ALiBi's slope of head `h` of `n_head` (ggml's: `m0^(h+1)` for the first power-of-two
/// heads, odd powers of `m1` for the rest).
pub fn alibi_slope(max_bias: f32, n_head: usize, h: usize) -> f32 {
    let n_log2 = 1u32 << (n_head as u32).ilog2();
    let m0 = 2f32.powf(-max_bias / n_log2 as f32);
    let m1 = 2f32.powf(-(max_bias / 2.0) / n_log2 as f32);
    let h = h as u32;
    if h < n_log2 {
        m0.powf((h + 1) as f32)
    } else {
        m1.powf((2 * (h - n_log2) + 1) as f32)
    }
}

/// Where each token of a micro-batch finds the positions before it for a short
/// convolution (`Backend::short_conv`), and where its state goes. A state slot holds the
/// last `l_cache - 1` values of `B·x` of one sequence, oldest first, `l_cache - 1` rows of
/// the layer's width.
#[derive(Clone, Copy, Debug)]
pub struct ConvPlan<'a> {
    pub l_cache: usize,
    /// Per token: the batch's previous token of its sequence, or [`ConvPlan::NONE`].
    pub prev: &'a [u32],
    /// Per token without a previous one: the state slot holding the positions before it,
    /// or `NONE` (position 0: zeros).
    pub state_in: &'a [u32],
    /// Per token: the slot its state is written to after every token has read, or `NONE`.
    pub state_out: &'a [u32],
}

impl ConvPlan<'_> {
    pub const NONE: u32 = u32::MAX;

    /// Where token `i`'s window value `j` (`j` = 0 the oldest, `l_cache - 1` the token
    /// itself) comes from.
    pub fn source(&self, i: usize, j: usize) -> ConvSource {
        let mut t = i;
        let back = self.l_cache - 1 - j;
        for step in 0..back {
            match self.prev[t] {
                Self::NONE => {
                    return match self.state_in[t] {
                        Self::NONE => ConvSource::Zero,
                        slot => ConvSource::State { slot, row: self.l_cache - 1 - (back - step) },
                    };
                }
                p => t = p as usize,
            }
        }
        ConvSource::Token(t)
    }
}

/// One value of a convolution window: `B·x` of a token of the batch, a row of a state
/// slot, or zero (before position 0).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConvSource {
    Token(usize),
    State { slot: u32, row: usize },
    Zero,
}

/// A LayerNorm's parameters: its epsilon, and its element-wise affine transform (times
/// `w`, plus `b` where there is one).
#[derive(Debug)]
pub struct LayerNorm<'a, W> {
    pub eps: f32,
    pub w: &'a W,
    pub b: Option<&'a W>,
}

// (By hand: a derive would ask `W: Copy`.)
impl<W> Clone for LayerNorm<'_, W> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<W> Copy for LayerNorm<'_, W> {}

/// The input of an expert matmul (`Backend::matmul_id`): `x`, a row per token (or, where
/// `per_slot`, per slot), and the `k` experts each of `rows` tokens goes to (`moe_route`'s
/// ids, stored as f32).
#[derive(Debug)]
pub struct ExpertInput<'a, B> {
    pub x: &'a B,
    pub per_slot: bool,
    pub ids: &'a B,
    pub rows: usize,
    pub k: usize,
}

impl<B> Clone for ExpertInput<'_, B> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<B> Copy for ExpertInput<'_, B> {}

/// Greedy ids on their way from the device: `Ready` where they were computed at once,
/// `InFlight` (a backend's read slot) where `argmax_finish` still has to wait for them.
#[derive(Debug)]
pub enum IdsTicket {
    Ready(Vec<u32>),
    InFlight { slot: usize, n: usize },
}

/// Device memory and compute. Buffers hold f32 activations laid out as row-major
/// `[rows, dim]`; KV buffers hold `[slots, n_head_kv * head_dim]` as f16 or in a block
/// format (`alloc_kv_typed`).
pub trait Backend: Send + Sync + 'static {
    type Weight: Send + Sync;
    type Buf: Send + Sync;
    type Kv: Send + Sync;
    /// A stack of expert matrices of one shape (a 3-D tensor `[cols, rows, n_expert]`).
    type Experts: Send + Sync;

    /// A short description of the device.
    fn name(&self) -> String;

    /// Refuses, before any weight is read, a model whose attention heads of `head_dim`
    /// values this backend's kernels cannot run.
    fn check_head_dim(&self, head_dim: usize) -> Result<()> {
        let _ = head_dim;
        Ok(())
    }

    /// Makes a weight usable by the kernels (zero-copy on CPU, an upload on GPU).
    fn load_weight(&self, gguf: &Arc<GgufFile>, t: &TensorInfo) -> Result<Self::Weight>;
    /// Marks `w` as an encoder's: it only ever multiplies whole inputs (every call holds all
    /// of each input's tokens, never a decode step), so the backend may give it an
    /// arithmetic that is faster on many tokens and keeps each row's result independent of
    /// the batch, though not bit-equal to the one decoders' weights take (the CPU's AMX-BF16
    /// F16 matmul). Default: nothing changes.
    fn encoder_weight(&self, w: Self::Weight) -> Self::Weight {
        w
    }
    /// A draft model's output projection `t` (`output.weight`, or a tied `token_embd`), in a
    /// cheaper form where the backend has one: a draft's logits only propose tokens, which
    /// the target model then checks, so its output matrix (often the largest read of its
    /// step: 8-bit, a row per vocabulary entry) may be multiplied at lower precision without
    /// changing any output. `None`: the loaded weight serves. Default: `None`.
    fn draft_output(&self, gguf: &Arc<GgufFile>, t: &TensorInfo) -> Result<Option<Self::Weight>> {
        let _ = (gguf, t);
        Ok(None)
    }
    /// Loads weights a forward multiplies by one input (q/k/v; gate/up). A backend may place
    /// them together so `matmul_many` takes them in one kernel.
    fn load_weights(&self, gguf: &Arc<GgufFile>, ts: &[&TensorInfo]) -> Result<Vec<Self::Weight>> {
        ts.iter().map(|t| self.load_weight(gguf, t)).collect()
    }
    /// The 3-D expert tensor `t` (`[cols, n_expert * sum(parts)]` rows, ggml order) as
    /// stacks of `n_expert` matrices: each expert's rows split into `parts` (one part, or
    /// a fused gate and up), one stack per part, loaded together (weights of one input).
    fn load_experts(
        &self,
        gguf: &Arc<GgufFile>,
        t: &TensorInfo,
        n_expert: usize,
        parts: &[usize],
    ) -> Result<Vec<Self::Experts>>;
    /// 3-D expert tensors of one input (a separate gate and up), each as `load_experts`
    /// loads it with one part; a backend may upload them together (the GPU: one kernel
    /// multiplies both).
    fn load_experts_together(
        &self,
        gguf: &Arc<GgufFile>,
        ts: &[&TensorInfo],
        n_expert: usize,
    ) -> Result<Vec<Self::Experts>> {
        let rows = |t: &TensorInfo| t.rows_cols().0 / n_expert.max(1);
        ts.iter().map(|t| self.load_experts(gguf, t, n_expert, &[rows(t)]).map(|mut v| v.remove(0))).collect()
    }
    /// `rows`, `cols` of a loaded weight (`cols` = `dims[0]`).
    fn weight_shape(&self, w: &Self::Weight) -> (usize, usize);
    fn alloc(&self, len: usize) -> Result<Self::Buf>;
    fn alloc_kv(&self, len: usize) -> Result<Self::Kv>;
    /// A KV cache of `n_slots` rows of `dim` values stored as `ty`: F16, or a block type of
    /// [`crate::kv::CACHE_TYPES`], rows quantized as they are stored after a Walsh-Hadamard
    /// rotation of each group of `rot` values ([`crate::kv::KvTypes`] says which); the
    /// attention rotates q by a K cache's rotation and its output by a V cache's. A
    /// backend without quantized caches takes F16 alone.
    fn alloc_kv_typed(
        &self,
        n_slots: usize,
        dim: usize,
        ty: GgmlType,
        rot: Option<usize>,
    ) -> Result<Self::Kv> {
        match (ty, rot) {
            (GgmlType::F16, None) => self.alloc_kv(n_slots * dim),
            _ => Err(crate::error::KilnError::Backend(format!(
                "{} has no {} KV cache (use f16)",
                self.name(),
                crate::kv::cache_type_name(ty)
            ))),
        }
    }
    /// Copies `out.len()` values from the start of `buf` to the host.
    fn read(&self, buf: &Self::Buf, out: &mut [f32]);

    /// `out[i] = table[ids[i]] * scale`.
    fn embed(&self, table: &Self::Weight, ids: &[u32], scale: f32, out: &mut Self::Buf) -> Result<()>;
    /// Overwrites the start of `buf` with host values: input rows given as embeddings (an
    /// image's encoded rows) instead of looked up.
    fn write_rows(&self, buf: &mut Self::Buf, v: &[f32]);
    /// RMS-normalizes each of `rows` rows of `dim` values and multiplies by `w`.
    fn rms_norm(
        &self,
        x: &Self::Buf,
        w: &Self::Weight,
        eps: f32,
        rows: usize,
        dim: usize,
        out: &mut Self::Buf,
    );
    /// LayerNorm of each of `rows` rows of `x`, as wide as `norm.w`: `(x - mean) /
    /// sqrt(var + eps)`, then the affine transform.
    fn layer_norm(&self, x: &Self::Buf, norm: LayerNorm<Self::Weight>, rows: usize, out: &mut Self::Buf);
    /// The residual add then the next norm: `x += y * scale` over `rows * dim` values, then
    /// `out = rms_norm(x)`. One kernel where a backend fuses them (the GPU).
    #[allow(clippy::too_many_arguments)]
    fn add_rms_norm(
        &self,
        x: &mut Self::Buf,
        y: &Self::Buf,
        scale: f32,
        w: &Self::Weight,
        eps: f32,
        rows: usize,
        dim: usize,
        out: &mut Self::Buf,
    ) {
        self.add(x, y, scale, rows * dim);
        self.rms_norm(x, w, eps, rows, dim, out);
    }
    /// `out[rows, w.rows] = x[rows, w.cols] · wᵀ`.
    fn matmul(&self, w: &Self::Weight, x: &Self::Buf, rows: usize, out: &mut Self::Buf);
    /// `outs[i] = x · ws[i]ᵀ (+ biases[i])` for weights of one input (q/k/v; gate/up): one
    /// kernel where they were loaded together by `load_weights` (the GPU), biases added as
    /// the outputs are stored. `biases` is empty or has one entry per weight.
    fn matmul_many(
        &self,
        ws: &[&Self::Weight],
        biases: &[Option<&Self::Weight>],
        x: &Self::Buf,
        rows: usize,
        outs: &mut [&mut Self::Buf],
    ) {
        for (i, (w, out)) in ws.iter().zip(outs.iter_mut()).enumerate() {
            self.matmul(w, x, rows, out);
            if let Some(Some(b)) = biases.get(i) {
                self.add_bias(out, b, rows);
            }
        }
    }
    /// Adds the bias vector `b` to each of `rows` rows.
    fn add_bias(&self, x: &mut Self::Buf, b: &Self::Weight, rows: usize);
    /// Rotates `n_head` heads of `head_dim` in each row; row `i` is at position `pos[i]`.
    fn rope(&self, x: &mut Self::Buf, pos: &[u32], n_head: usize, head_dim: usize, rope: &RopeParams);
    /// Writes row `i` of `k`/`v` (f32, `dim` wide) to slot `slots[i]` of the caches (f16).
    fn kv_store(
        &self,
        k_cache: &mut Self::Kv,
        v_cache: &mut Self::Kv,
        k: &Self::Buf,
        v: &Self::Buf,
        slots: &[u32],
        dim: usize,
    );
    /// The step before attention: RoPE on `q` (`n_head` heads) and `k` (`n_head_kv`), then
    /// `k` and `v` stored to `slots`. `k` is left unspecified (attention reads the cache).
    /// One kernel where a backend fuses them (the GPU).
    #[allow(clippy::too_many_arguments)]
    fn rope_kv_store(
        &self,
        q: &mut Self::Buf,
        k: &mut Self::Buf,
        v: &Self::Buf,
        k_cache: &mut Self::Kv,
        v_cache: &mut Self::Kv,
        pos: &[u32],
        slots: &[u32],
        n_head: usize,
        n_head_kv: usize,
        head_dim: usize,
        rope: &RopeParams,
    ) {
        self.rope(q, pos, n_head, head_dim, rope);
        self.rope(k, pos, n_head_kv, head_dim, rope);
        self.kv_store(k_cache, v_cache, k, v, slots, n_head_kv * head_dim);
    }
    /// RMSNorm of `q` and `k` (`norms`: q's and k's weights, and eps; each norm as wide as
    /// its weight: a head, Qwen3's, or all of a token's heads, OLMoE's), then
    /// `rope_kv_store`; `tmp` is scratch as wide as q and k (swapped with them: `q` holds
    /// the normed, rotated q on return). One kernel where a backend fuses them (the GPU).
    #[allow(clippy::too_many_arguments)]
    fn norm_rope_kv_store(
        &self,
        q: &mut Self::Buf,
        k: &mut Self::Buf,
        v: &Self::Buf,
        tmp: (&mut Self::Buf, &mut Self::Buf),
        norms: (&Self::Weight, &Self::Weight, f32),
        k_cache: &mut Self::Kv,
        v_cache: &mut Self::Kv,
        pos: &[u32],
        slots: &[u32],
        n_head: usize,
        n_head_kv: usize,
        head_dim: usize,
        rope: &RopeParams,
    ) {
        self.head_norms(q, k, tmp, norms, pos.len(), (n_head, n_head_kv, head_dim));
        self.rope_kv_store(q, k, v, k_cache, v_cache, pos, slots, n_head, n_head_kv, head_dim, rope);
    }
    /// `norm_rope_kv_store`'s norms alone: RMSNorm of `n` tokens' `q` and `k` (`heads`:
    /// n_head, n_head_kv, head_dim) in rows as wide as their weights, through `tmp`
    /// (swapped with them).
    fn head_norms(
        &self,
        q: &mut Self::Buf,
        k: &mut Self::Buf,
        tmp: (&mut Self::Buf, &mut Self::Buf),
        norms: (&Self::Weight, &Self::Weight, f32),
        n: usize,
        heads: (usize, usize, usize),
    ) {
        let (qn, kn, eps) = norms;
        let (n_head, n_head_kv, head_dim) = heads;
        let width = |w: &Self::Weight| {
            let (rows, cols) = self.weight_shape(w);
            rows * cols
        };
        let (qw, kw) = (width(qn), width(kn));
        self.rms_norm(q, qn, eps, n * n_head * head_dim / qw, qw, tmp.0);
        std::mem::swap(q, tmp.0);
        self.rms_norm(k, kn, eps, n * n_head_kv * head_dim / kw, kw, tmp.1);
        std::mem::swap(k, tmp.1);
    }
    /// Causal attention of each query row over its sequence's cached keys and values.
    fn attention(
        &self,
        q: &Self::Buf,
        k_cache: &Self::Kv,
        v_cache: &Self::Kv,
        plan: &AttnPlan,
        out: &mut Self::Buf,
    );
    /// Bidirectional attention of one whole sequence of `n` rows held in plain buffers (a
    /// vision encoder's patches): each of `n_head` heads of `head_dim`, every query against
    /// every key, no mask, scores scaled by `scale`. `kv` is scratch of at least `n` rows of
    /// `n_head * head_dim` values each. By default K and V are stored to its slots `0..n` and
    /// `attention` runs a non-causal plan over them; the CPU takes the arithmetic of llama.cpp's
    /// CPU flash attention for such inputs instead (`cpu::attention::whole`).
    #[allow(clippy::too_many_arguments)]
    fn attention_whole(
        &self,
        q: &Self::Buf,
        k: &Self::Buf,
        v: &Self::Buf,
        kv: (&mut Self::Kv, &mut Self::Kv),
        n: usize,
        (n_head, head_dim): (usize, usize),
        scale: f32,
        out: &mut Self::Buf,
    ) {
        let slots: Vec<u32> = (0..n as u32).collect();
        self.kv_store(kv.0, kv.1, k, v, &slots, n_head * head_dim);
        let block_size = crate::kv::BLOCK_SIZE;
        let table: Vec<u32> = (0..n.div_ceil(block_size) as u32).collect();
        let seq = vec![0u32; n];
        let plan = AttnPlan {
            pos: &slots,
            seq: &seq,
            tables: &[&table],
            block_size,
            n_head,
            n_head_kv: n_head,
            head_dim,
            scale,
            q_scale: &[],
            softcap: 0.0,
            window: None,
            seq_len: Some(&[n as u32]),
            alibi: None,
        };
        self.attention(q, kv.0, kv.1, &plan, out);
    }
    /// Routes each of `rows` rows of router logits (`r.n_expert` wide): the chosen experts'
    /// ids to `ids` and their weights to `weights`, `r.k` per row, in routing order. Ids
    /// are stored as f32 (exact). With an expert-selection `bias` (`exp_probs_b`:
    /// LFM2-MoE; `r.n_expert` values, sigmoid gating) the experts are chosen by score plus
    /// bias and weighted by their scores alone.
    #[allow(clippy::too_many_arguments)]
    fn moe_route(
        &self,
        logits: &Self::Buf,
        rows: usize,
        r: &Routing,
        bias: Option<&[f32]>,
        ids: &mut Self::Buf,
        weights: &mut Self::Buf,
    );
    /// A mixture of experts' router on `rows` rows of `x`: `logits = x · routerᵀ`, then
    /// `moe_route` of them (with the layer's selection `bias`, if any) into
    /// (logits, ids, weights). `experts` are the first that `x` goes through, for a backend
    /// that prepares `x` for them as it makes it (the GPU quantizes it with the norm that
    /// writes it).
    #[allow(clippy::too_many_arguments)]
    fn moe_router(
        &self,
        router: &Self::Weight,
        experts: &Self::Experts,
        x: &Self::Buf,
        rows: usize,
        r: &Routing,
        bias: Option<&[f32]>,
        out: (&mut Self::Buf, &mut Self::Buf, &mut Self::Buf),
    ) {
        let _ = experts;
        let (logits, ids, weights) = out;
        self.matmul(router, x, rows, logits);
        self.moe_route(logits, rows, r, bias, ids, weights);
    }
    /// `outs[i][t * k + j] = x[t] · ws[i][ids[t * k + j]]ᵀ` for each of the input's `rows`
    /// tokens `t` and slots `j < k` (`x` row `t * k + j` where `per_slot`): experts of one
    /// input (gate and up, or down), each token's row through the same dot as a dense matmul's.
    fn matmul_id(&self, ws: &[&Self::Experts], input: ExpertInput<Self::Buf>, outs: &mut [&mut Self::Buf]);
    /// `out[t] = Σ_j weights[t * k + j] · y[t * k + j]` over rows of `dim`, each product
    /// rounded, then added in slot order (ggml's `mul` then `add`s).
    fn moe_sum(
        &self,
        y: &Self::Buf,
        weights: &Self::Buf,
        rows: usize,
        k: usize,
        dim: usize,
        out: &mut Self::Buf,
    );
    /// `x[t] += y[t] · σ(g[t])` over rows of `dim`, `σ(g)` as ggml's `silu(g) / g` (a
    /// shared expert's gate).
    fn add_sigmoid_gated(&self, x: &mut Self::Buf, y: &Self::Buf, g: &Self::Buf, rows: usize, dim: usize);
    /// LFM2's short convolution on `plan.prev.len()` tokens: `bcx` holds each token's B,
    /// C and x (`[n, 3 * dim]`); `out[t, c] = C[t, c] · Σ_j w[c, j] · window_j` where the
    /// window is `B·x` at the token's last `l_cache` positions (`plan.source`), summed
    /// oldest first with fused multiply-adds (ggml's `ssm_conv` as GCC compiles it). Then
    /// the states `plan.state_out` names are written (after every read), slot `s` at
    /// `state[s * (l_cache - 1) * dim..]`.
    fn short_conv(
        &self,
        bcx: &Self::Buf,
        w: &Self::Weight,
        state: &mut Self::Buf,
        plan: &ConvPlan,
        dim: usize,
        out: &mut Self::Buf,
    );
    /// `gate = act(gate) * up` over `len` values.
    fn glu(&self, gate: &mut Self::Buf, up: &Self::Buf, act: Activation, len: usize);
    /// `x = gelu(x)` over `len` values (GELU-tanh; BERT's feed-forward).
    fn gelu(&self, x: &mut Self::Buf, len: usize);
    /// `x += y * scale` over `len` values.
    fn add(&self, x: &mut Self::Buf, y: &Self::Buf, scale: f32, len: usize);
    /// `x *= s` over `len` values.
    fn scale(&self, x: &mut Self::Buf, s: f32, len: usize);
    /// Soft-capping, `x = cap · tanh(x · (1 / cap))` over `len` values (gemma2's logits),
    /// as ggml's scale, tanh, scale.
    fn softcap(&self, x: &mut Self::Buf, cap: f32, len: usize);
    /// The index of the largest value of each of `rows` rows of `n` (by `total_cmp`, the
    /// lowest on ties): greedy decoding reads back only these ids.
    fn argmax(&self, x: &Self::Buf, rows: usize, n: usize) -> Vec<u32> {
        let mut v = vec![0.0; rows * n];
        self.read(x, &mut v);
        v.chunks(n).map(crate::sample::argmax).collect()
    }
    /// `argmax`, split so the host may record more work (the next decode step, its tokens
    /// from `embed_last_argmax`) before the ids come back from `argmax_finish`.
    fn argmax_start(&self, x: &Self::Buf, rows: usize, n: usize) -> IdsTicket {
        IdsTicket::Ready(self.argmax(x, rows, n))
    }
    fn argmax_finish(&self, t: IdsTicket) -> Result<Vec<u32>> {
        match t {
            IdsTicket::Ready(ids) => Ok(ids),
            IdsTicket::InFlight { .. } => {
                Err(crate::error::KilnError::Backend("an id read of another backend".into()))
            }
        }
    }
    /// Whether `embed_last_argmax` works: a greedy decode's next step can then be recorded
    /// before the current one's id is read back (the GPU backend; not while profiling).
    fn embeds_last_argmax(&self) -> bool {
        false
    }
    /// `embed` of the ids the last `argmax_start` wrote (`n` of them), still on the device.
    fn embed_last_argmax(
        &self,
        _table: &Self::Weight,
        _n: usize,
        _scale: f32,
        _out: &mut Self::Buf,
    ) -> Result<()> {
        Err(crate::error::KilnError::Backend("this backend reads token ids from the host".into()))
    }
    /// `out[j] = x[rows[j]]` for rows of `dim` values.
    fn gather_rows(&self, x: &Self::Buf, rows: &[u32], dim: usize, out: &mut Self::Buf);
    /// Context shift: copies the cached rows at slots `src[i]` to slots `dst[i]` (the two
    /// sets disjoint), keys rotated by `delta` positions with `rope` (`n_head_kv` heads of
    /// `head_dim`), values unchanged.
    #[allow(clippy::too_many_arguments)]
    fn kv_shift(
        &self,
        k_cache: &mut Self::Kv,
        v_cache: &mut Self::Kv,
        src: &[u32],
        dst: &[u32],
        delta: i32,
        n_head_kv: usize,
        head_dim: usize,
        rope: &RopeParams,
    );
}
