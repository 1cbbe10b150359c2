//! The attention block: q, k, v projections (separate `attn_q/k/v` or one fused
//! `attn_qkv`, optional biases), optional RMSNorm of q and k, RoPE, attention over the KV
//! cache (causal, optionally within a sliding window, with soft-capped scores; or over the
//! whole sequence for encoders, optionally with ALiBi), the output projection
//! `attn_output` (optional bias).

use super::{blk, NormWeights, Norms};
use crate::backend::{AttnPlan, Backend, RopeParams};
use crate::error::Result;
use crate::kv::BLOCK_SIZE;
use crate::model::config::ModelConfig;
use crate::model::weights::Loader;

/// One layer's attention, as its architecture defines it.
#[derive(Clone, Debug)]
pub struct Attention {
    pub norms: Norms,
    pub qk_norm: QkNorm,
    /// The rotation of q and k; `None`: positions are not rotated (NoPE layers).
    pub rope: Option<RopeParams>,
    /// Each token sees only the last `window` positions (sliding-window layers).
    pub window: Option<u32>,
    /// Scale of q·k.
    pub scale: f32,
    /// `scale` multiplies the queries before attention instead of the scores, as
    /// llama.cpp's graph does for some architectures (phi3, gemma2): the same up to the
    /// rounding of the query to f16, which then matches theirs.
    pub scale_q: bool,
    /// Soft-capping of the scores, `cap · tanh(score / cap)` (gemma2).
    pub softcap: Option<f32>,
    /// Queries scaled by their position (llama-4's temperature tuning; mistral3).
    pub temperature: Option<Temperature>,
    /// ALiBi's maximum bias (jina-bert-v2): positions as a linear bias of the scores.
    pub alibi: Option<f32>,
}

/// Llama-4's attention temperature: the query at position `p` is multiplied by
/// `1 + scale · ln(⌊(p + offset) / floor⌋ + 1)`, 1 within the first `floor` positions.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Temperature {
    pub scale: f32,
    pub floor: f32,
    pub offset: f32,
}

impl Temperature {
    /// The multiplier at `pos`, in llama.cpp's float and double steps.
    pub fn at(&self, pos: u32) -> f32 {
        let f = ((pos as f32 + self.offset) / self.floor).floor() as f64;
        ((f + 1.0).ln() * self.scale as f64 + 1.0) as f32
    }
}

/// RMSNorm of q and k before RoPE (`attn_q_norm`, `attn_k_norm`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QkNorm {
    None,
    /// Each head on its own, one weight of `head_dim` shared by the heads (qwen3, gemma3).
    PerHead,
    /// All of a token's q (and of its k) as one vector, weights of `q_dim` and `kv_dim`
    /// (olmoe, olmo2).
    Whole,
}

impl Attention {
    /// Llama's attention: pre-norm, no q/k norm, `rope` at every position, full context.
    pub fn new(rope: RopeParams, scale: f32) -> Self {
        Attention {
            norms: Norms::PRE,
            qk_norm: QkNorm::None,
            rope: Some(rope),
            window: None,
            scale,
            scale_q: false,
            softcap: None,
            temperature: None,
            alibi: None,
        }
    }

    /// The multiplier of the query at `pos` where the query is scaled (`scale_q`,
    /// `temperature`), else `None`.
    pub fn q_scale(&self, pos: u32) -> Option<f32> {
        let s = if self.scale_q { self.scale } else { 1.0 };
        match self.temperature {
            Some(t) => Some(t.at(pos) * s),
            None => self.scale_q.then_some(s),
        }
    }

    /// The multipliers of the queries at `pos` into `out` (cleared first; left empty where
    /// queries are not scaled), without allocating where `out` has room for them.
    pub fn q_scales(&self, pos: &[u32], out: &mut Vec<f32>) {
        out.clear();
        out.extend(pos.iter().map_while(|&p| self.q_scale(p)));
    }
}

pub struct AttnWeights<W> {
    pub norms: NormWeights<W>,
    pub wq: W,
    pub wk: W,
    pub wv: W,
    pub bq: Option<W>,
    pub bk: Option<W>,
    pub bv: Option<W>,
    pub wo: W,
    pub bo: Option<W>,
    pub q_norm: Option<W>,
    pub k_norm: Option<W>,
}

impl<W> AttnWeights<W> {
    pub(crate) fn load<B: Backend<Weight = W>>(l: &Loader<B>, il: usize, a: &Attention) -> Result<Self> {
        let c = l.cfg;
        let (d, q, kv, hd) = (c.n_embd, c.q_dim(), c.kv_dim(), c.head_dim);
        let n = |s: &str| blk(il, s);
        let fused = l.split(&n("attn_qkv.weight"), d, [q, kv, kv])?;
        let [wq, wk, wv] = match fused {
            Some(w) => w,
            None => l.group([
                (n("attn_q.weight"), d, q),
                (n("attn_k.weight"), d, kv),
                (n("attn_v.weight"), d, kv),
            ])?,
        };
        let [bq, bk, bv] = match l.split_vector(&n("attn_qkv.bias"), [q, kv, kv])? {
            Some([bq, bk, bv]) => [Some(bq), Some(bk), Some(bv)],
            None => [
                l.opt(&n("attn_q.bias"), q, 1)?,
                l.opt(&n("attn_k.bias"), kv, 1)?,
                l.opt(&n("attn_v.bias"), kv, 1)?,
            ],
        };
        let (q_norm, k_norm) = match a.qk_norm {
            QkNorm::None => (None, None),
            QkNorm::PerHead => {
                (Some(l.get(&n("attn_q_norm.weight"), hd, 1)?), Some(l.get(&n("attn_k_norm.weight"), hd, 1)?))
            }
            QkNorm::Whole => {
                (Some(l.get(&n("attn_q_norm.weight"), q, 1)?), Some(l.get(&n("attn_k_norm.weight"), kv, 1)?))
            }
        };
        Ok(AttnWeights {
            norms: NormWeights::load(
                l,
                il,
                a.norms,
                ["attn_norm", "post_attention_norm", "attn_output_norm"],
            )?,
            wq,
            wk,
            wv,
            bq,
            bk,
            bv,
            wo: l.get(&n("attn_output.weight"), q, d)?,
            bo: l.opt(&n("attn_output.bias"), d, 1)?,
            q_norm,
            k_norm,
        })
    }
}

/// Where a micro-batch's tokens are: entry `i` is at position `pos[i]` of sequence
/// `seq[i]` (an index into `tables`), its K and V go to KV slot `slots[i]`.
pub struct Batch<'a> {
    pub pos: &'a [u32],
    pub seq: &'a [u32],
    pub slots: &'a [u32],
    pub tables: &'a [&'a [u32]],
    /// Non-causal attention (encoders, whose sequences are whole in the batch; a causal
    /// model's bidirectional step, an image's rows): per sequence, the end of its entries
    /// here, below which each of its queries sees every position.
    pub seq_len: Option<&'a [u32]>,
}

/// The attention block's activations, `n_ubatch` rows each.
pub struct AttnScratch<B: Backend> {
    q: B::Buf,
    k: B::Buf,
    /// A second K buffer for the k norm (in-place ops take distinct buffers).
    k_normed: B::Buf,
    v: B::Buf,
    att: B::Buf,
    /// Each token's query multiplier ([`Attention::q_scale`]), room for `n_ubatch` made
    /// once so that filling it never allocates.
    q_scale: Vec<f32>,
}

impl<B: Backend> AttnScratch<B> {
    pub fn new(b: &B, cfg: &ModelConfig, n: usize) -> Result<Self> {
        Ok(AttnScratch {
            q: b.alloc(n * cfg.q_dim())?,
            k: b.alloc(n * cfg.kv_dim())?,
            k_normed: b.alloc(n * cfg.kv_dim())?,
            v: b.alloc(n * cfg.kv_dim())?,
            att: b.alloc(n * cfg.q_dim())?,
            q_scale: Vec::with_capacity(n),
        })
    }
}

/// The block on `n` rows of `x` (already normed): K and V to the layer's cache, the
/// projected output to `out`. `rope` is `a.rope` with the file's frequency factors.
#[allow(clippy::too_many_arguments)]
pub fn forward<B: Backend>(
    b: &B,
    cfg: &ModelConfig,
    a: &Attention,
    w: &AttnWeights<B::Weight>,
    rope: Option<&RopeParams>,
    x: &B::Buf,
    batch: &Batch,
    (kc, vc): (&mut B::Kv, &mut B::Kv),
    s: &mut AttnScratch<B>,
    out: &mut B::Buf,
) {
    let n = batch.pos.len();
    let (n_head, n_head_kv, hd) = (cfg.n_head, cfg.n_head_kv, cfg.head_dim);
    let biases = [w.bq.as_ref(), w.bk.as_ref(), w.bv.as_ref()];
    b.matmul_many(&[&w.wq, &w.wk, &w.wv], &biases, x, n, &mut [&mut s.q, &mut s.k, &mut s.v]);
    let qk_norms = w.q_norm.as_ref().zip(w.k_norm.as_ref());
    match (qk_norms, rope) {
        // The norms (of each head, or of all heads) with the RoPE store.
        (Some((qn, kn)), Some(rope)) => b.norm_rope_kv_store(
            &mut s.q,
            &mut s.k,
            &s.v,
            (&mut s.att, &mut s.k_normed),
            (qn, kn, cfg.norm_eps),
            kc,
            vc,
            batch.pos,
            batch.slots,
            n_head,
            n_head_kv,
            hd,
            rope,
        ),
        _ => {
            if let Some((qn, kn)) = qk_norms {
                let tmp = (&mut s.att, &mut s.k_normed);
                b.head_norms(&mut s.q, &mut s.k, tmp, (qn, kn, cfg.norm_eps), n, (n_head, n_head_kv, hd));
            }
            match rope {
                Some(rope) => b.rope_kv_store(
                    &mut s.q,
                    &mut s.k,
                    &s.v,
                    kc,
                    vc,
                    batch.pos,
                    batch.slots,
                    n_head,
                    n_head_kv,
                    hd,
                    rope,
                ),
                None => b.kv_store(kc, vc, &s.k, &s.v, batch.slots, n_head_kv * hd),
            }
        }
    }
    a.q_scales(batch.pos, &mut s.q_scale);
    let plan = AttnPlan {
        pos: batch.pos,
        seq: batch.seq,
        tables: batch.tables,
        block_size: BLOCK_SIZE,
        n_head,
        n_head_kv,
        head_dim: hd,
        scale: if a.scale_q { 1.0 } else { a.scale },
        q_scale: &s.q_scale,
        softcap: a.softcap.unwrap_or(0.0),
        window: a.window,
        seq_len: batch.seq_len,
        alibi: a.alibi,
    };
    b.attention(&s.q, kc, vc, &plan, &mut s.att);
    match &w.bo {
        Some(bo) => b.matmul_many(&[&w.wo], &[Some(bo)], &s.att, n, &mut [out]),
        None => b.matmul(&w.wo, &s.att, n, out),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The query multipliers of a step fill the scratch's buffer in place: the values
    /// [`Attention::q_scale`] gives, none where queries are not scaled, and no
    /// reallocation from one step to the next.
    #[test]
    fn q_scales_fill_the_scratch_without_allocating() {
        let rope = RopeParams::identity();
        let plain = Attention::new(rope.clone(), 0.125);
        let scaled = Attention { scale_q: true, ..plain.clone() };
        let temperature = Temperature { scale: 0.1, floor: 16.0, offset: 0.0 };
        let tempered = Attention { temperature: Some(temperature), ..plain.clone() };
        let both = Attention { temperature: Some(temperature), ..scaled.clone() };
        let mut buf = Vec::with_capacity(64);
        let (ptr, cap) = (buf.as_ptr(), buf.capacity());
        for step in 0..40u32 {
            let pos: Vec<u32> = (0..1 + step % 64).map(|i| step * 7 + i).collect();
            plain.q_scales(&pos, &mut buf);
            assert!(buf.is_empty());
            scaled.q_scales(&pos, &mut buf);
            assert_eq!(buf, vec![0.125; pos.len()]);
            tempered.q_scales(&pos, &mut buf);
            assert_eq!(buf, pos.iter().map(|&p| temperature.at(p)).collect::<Vec<_>>());
            both.q_scales(&pos, &mut buf);
            assert_eq!(buf, pos.iter().map(|&p| temperature.at(p) * 0.125).collect::<Vec<_>>());
            assert_eq!((buf.as_ptr(), buf.capacity()), (ptr, cap), "step {step} reallocated");
        }
        assert!(temperature.at(40) > 1.0, "the positions reach past the temperature's floor");
    }
}
