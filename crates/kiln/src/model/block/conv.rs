//! LFM2's gated short convolution: `in_proj` maps each token to B, C and x (`n_embd`
//! each); `B·x` goes through a depthwise causal convolution over the token's last
//! `l_cache` positions (`shortconv.conv`, one filter per channel); `C` gates the result;
//! `out_proj` maps it back.
//!
//! The positions before a micro-batch come from the sequence's recurrent state: the last
//! `l_cache - 1` values of `B·x`. The engine keeps states next to the KV blocks
//! ([`crate::kv::KvPool`]): two slots per block, the state after position `p` in slot
//! `2 · block(p) + p % 2`, written after the last token of each block and after a
//! sequence's last token in a batch. A full block's slot then holds the state at its
//! boundary, so a prefix-cache hit (whole blocks) restores the state at that position,
//! and the alternate slot means a step computed ahead and dropped (the GPU's greedy
//! look-ahead) never overwrites the state the sequence still stands on.

use super::{blk, NormWeights, Norms};
use crate::backend::{Backend, ConvPlan};
use crate::error::{KilnError, Result};
use crate::kv::BLOCK_SIZE;
use crate::model::config::ModelConfig;
use crate::model::weights::Loader;

/// One layer's short convolution, as its architecture defines it.
#[derive(Clone, Debug)]
pub struct ShortConv {
    pub norms: Norms,
    /// The filter length: the token itself and the `l_cache - 1` before it.
    pub l_cache: usize,
}

impl ShortConv {
    /// Values of one sequence's state: `l_cache - 1` rows of `n_embd`.
    pub fn state_len(&self, n_embd: usize) -> usize {
        (self.l_cache - 1) * n_embd
    }
}

pub struct ShortConvWeights<W> {
    pub norms: NormWeights<W>,
    pub in_proj: W,
    /// `[l_cache, n_embd]`: channel `c`'s filter, oldest position first.
    pub conv: W,
    pub out_proj: W,
}

impl<W> ShortConvWeights<W> {
    pub(crate) fn load<B: Backend<Weight = W>>(l: &Loader<B>, il: usize, c: &ShortConv) -> Result<Self> {
        let d = l.cfg.n_embd;
        let n = |s: &str| blk(il, s);
        let conv = n("shortconv.conv.weight");
        if l.g.tensor(&conv).is_some_and(|t| t.ty != crate::quant::GgmlType::F32) {
            return Err(KilnError::Tensor {
                name: conv,
                msg: "the convolution's filters must be F32".into(),
            });
        }
        Ok(ShortConvWeights {
            norms: NormWeights::load(
                l,
                il,
                c.norms,
                ["attn_norm", "post_attention_norm", "attn_output_norm"],
            )?,
            in_proj: l.get(&n("shortconv.in_proj.weight"), d, 3 * d)?,
            conv: l.get(&conv, c.l_cache, d)?,
            out_proj: l.get(&n("shortconv.out_proj.weight"), d, d)?,
        })
    }
}

/// The block's activations, `n_ubatch` rows each.
pub struct ConvScratch<B: Backend> {
    bcx: B::Buf,
    y: B::Buf,
}

impl<B: Backend> ConvScratch<B> {
    pub fn new(b: &B, cfg: &ModelConfig, n: usize) -> Result<Self> {
        let conv = cfg.layers.iter().any(|l| matches!(l.mixer, super::Mixer::ShortConv(_)));
        let d = if conv { cfg.n_embd } else { 0 };
        Ok(ConvScratch { bcx: b.alloc((n * 3 * d).max(1))?, y: b.alloc((n * d).max(1))? })
    }
}

/// Where a micro-batch's states come from and go (the same for every conv layer):
/// per entry, the previous entry of its sequence in the batch, the state slot its
/// sequence starts from (first entries), the slot its own state goes to.
pub struct ConvSlots {
    prev: Vec<u32>,
    state_in: Vec<u32>,
    state_out: Vec<u32>,
}

impl ConvSlots {
    /// For entries at `pos[i]` of sequence `seq[i]` (each sequence's entries in ascending
    /// consecutive positions) with the block tables `tables`.
    pub fn new(pos: &[u32], seq: &[u32], tables: &[&[u32]]) -> Self {
        let n = pos.len();
        let slot = |s: u32, p: u32| tables[s as usize][p as usize / BLOCK_SIZE] * 2 + p % 2;
        let (mut prev, mut state_in, mut state_out) =
            (vec![ConvPlan::NONE; n], vec![ConvPlan::NONE; n], vec![ConvPlan::NONE; n]);
        let mut last: Vec<Option<usize>> = vec![None; tables.len()];
        for i in 0..n {
            let (s, p) = (seq[i], pos[i]);
            match last[s as usize] {
                Some(j) => prev[i] = j as u32,
                None if p > 0 => state_in[i] = slot(s, p - 1),
                None => {}
            }
            last[s as usize] = Some(i);
            if p as usize % BLOCK_SIZE == BLOCK_SIZE - 1 {
                state_out[i] = slot(s, p);
            }
        }
        for (s, i) in last.iter().enumerate() {
            if let Some(i) = *i {
                state_out[i] = slot(s as u32, pos[i]);
            }
        }
        ConvSlots { prev, state_in, state_out }
    }

    pub fn plan(&self, l_cache: usize) -> ConvPlan<'_> {
        ConvPlan { l_cache, prev: &self.prev, state_in: &self.state_in, state_out: &self.state_out }
    }
}

/// The block on `n` rows of `x` (already normed), its output to `out`; reads and writes
/// the layer's `state` slots as `slots` says.
#[allow(clippy::too_many_arguments)]
pub fn forward<B: Backend>(
    b: &B,
    cfg: &ModelConfig,
    c: &ShortConv,
    w: &ShortConvWeights<B::Weight>,
    x: &B::Buf,
    n: usize,
    slots: &ConvSlots,
    state: &mut B::Buf,
    s: &mut ConvScratch<B>,
    out: &mut B::Buf,
) {
    b.matmul(&w.in_proj, x, n, &mut s.bcx);
    b.short_conv(&s.bcx, &w.conv, state, &slots.plan(c.l_cache), cfg.n_embd, &mut s.y);
    b.matmul(&w.out_proj, &s.y, n, out);
}
