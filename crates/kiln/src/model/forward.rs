//! The one forward of the transformer families kiln supports, written once against the
//! `Backend` trait. It takes a batch of `(token, pos, seq)` entries: prompt prefill,
//! single-token decode and many sequences decoding together are the same path.

use std::sync::Arc;

use super::block::attention::{self, AttnScratch, Batch};
use super::block::conv::{self, ConvScratch, ConvSlots};
use super::block::ffn::{self, FfnScratch};
use super::block::{Mixer, MixerWeights, Norm};
use super::config::{ModelConfig, NormKind};
use super::weights::Weights;
use crate::backend::{Backend, IdsTicket, LayerNorm, RopeParams};
use crate::error::Result;
use crate::gguf::GgufFile;
use crate::kv::{KvPool, BLOCK_SIZE};

/// A model's config and weights on one backend.
pub struct Model<B: Backend> {
    pub cfg: ModelConfig,
    pub weights: Weights<B>,
    pub backend: B,
    /// Each layer's rotation with the file's frequency factors (`None`: not rotated).
    rope: Vec<Option<RopeParams>>,
}

/// One micro-batch: entry `i` is token `tokens[i]` at position `pos[i]` of sequence
/// `seq[i]` (an index into the block tables passed alongside).
pub struct UBatch<'a> {
    pub tokens: &'a [u32],
    pub pos: &'a [u32],
    pub seq: &'a [u32],
    /// Entries whose output (logits or hidden state) is wanted, ascending.
    pub outputs: &'a [u32],
    /// The entries' input rows (`n_embd` each), given instead of looked up from `tokens`
    /// (an image's encoded rows).
    pub embd: Option<&'a [f32]>,
    /// Each sequence's entries attend to each other whole (and to everything of the
    /// sequence before them), not causally: an image's rows where the family's language
    /// model reads an image so (gemma3). An encoder's batches always do.
    pub bidirectional: bool,
}

/// What the forward returns for the output rows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OutputKind {
    Logits,
    /// Each output row's greedy token (the logits' argmax), one value per row, as f32
    /// (exact: vocabularies are far below 2^24); only the ids leave the device.
    Argmax,
    /// Hidden states after the final norm (embeddings).
    Hidden,
}

/// Activation buffers for up to `n_ubatch` tokens, made once per runner.
pub struct Scratch<B: Backend> {
    n_ubatch: usize,
    /// The residual stream.
    x: B::Buf,
    /// A block's normed input (and the post-norm's output).
    h: B::Buf,
    /// A block's output.
    o: B::Buf,
    attn: AttnScratch<B>,
    conv: ConvScratch<B>,
    ffn: FfnScratch<B>,
    out_rows: B::Buf,
    /// Grown on demand: most calls want one row of logits, perplexity wants hundreds.
    logits: B::Buf,
    logits_rows: usize,
}

impl<B: Backend> Scratch<B> {
    pub fn new(b: &B, cfg: &ModelConfig, n_ubatch: usize) -> Result<Self> {
        let n = n_ubatch;
        Ok(Scratch {
            n_ubatch,
            x: b.alloc(n * cfg.n_embd)?,
            h: b.alloc(n * cfg.n_embd)?,
            o: b.alloc(n * cfg.n_embd.max(cfg.q_dim()))?,
            attn: AttnScratch::new(b, cfg, n)?,
            conv: ConvScratch::new(b, cfg, n)?,
            ffn: FfnScratch::new(b, cfg, n)?,
            out_rows: b.alloc(n * cfg.n_embd)?,
            logits: b.alloc(cfg.n_vocab)?,
            logits_rows: 1,
        })
    }

    pub fn n_ubatch(&self) -> usize {
        self.n_ubatch
    }
}

impl<B: Backend> Model<B> {
    /// Layer `il`'s RoPE as a pure rotation (no YaRN magnitude scaling), for moving cached
    /// keys to other positions in a context shift; no dimension rotated where the layer
    /// has no RoPE.
    pub fn shift_rope(&self, il: usize) -> RopeParams {
        let Some(mut r) = self.rope[il].clone() else { return RopeParams::identity() };
        r.attn_factor = if r.ext_factor != 0.0 { 1.0 / (1.0 + 0.1 * (1.0 / r.freq_scale).ln()) } else { 1.0 };
        r
    }

    /// Loads a model for sequences of at most its original training context (LongRoPE's
    /// short factors); [`Self::with_n_ctx`] says otherwise.
    pub fn load(gguf: &Arc<GgufFile>, backend: B) -> Result<Self> {
        Self::load_with(gguf, backend, None)
    }

    /// [`Self::load`], reporting the bytes of weights loaded as `stage` of `label`.
    pub fn load_with(
        gguf: &Arc<GgufFile>,
        backend: B,
        progress: Option<(&crate::progress::ProgressFn, crate::progress::Stage, &str)>,
    ) -> Result<Self> {
        let cfg = ModelConfig::from_gguf(gguf)?;
        backend.check_head_dim(cfg.head_dim)?;
        let weights = Weights::load(gguf, &cfg, &backend, progress)?;
        let mut m = Model { cfg, weights, backend, rope: Vec::new() };
        m.set_rope(0);
        Ok(m)
    }

    /// The model for sequences of up to `n_ctx` tokens: LongRoPE takes its long factors
    /// where the context is past the original training context
    /// (`rope.scaling.original_context_length`), as llama.cpp chooses by its per-sequence
    /// context, which it rounds up to a multiple of 256.
    pub fn with_n_ctx(mut self, n_ctx: usize) -> Self {
        self.set_rope(n_ctx.next_multiple_of(256));
        self
    }

    /// The model as another's draft (speculative decoding): its output projection in the
    /// backend's cheaper form where it has one (`Backend::draft_output`); the target model
    /// checks every token it proposes, so no output changes, only how many are accepted.
    pub fn into_draft(mut self, gguf: &Arc<GgufFile>) -> Result<Self> {
        let name = if self.weights.output.is_some() { "output.weight" } else { "token_embd.weight" };
        if let Some(t) = gguf.tensor(name) {
            if let Some(w) = self.backend.draft_output(gguf, t)? {
                self.weights.output = Some(w);
            }
        }
        Ok(self)
    }

    /// Each layer's rotation with the file's frequency factors for contexts of `n_ctx`.
    fn set_rope(&mut self, n_ctx: usize) {
        let w = &self.weights;
        let rope = |r: &RopeParams| {
            let longrope = if n_ctx > r.n_ctx_orig { &w.rope_long } else { &w.rope_short };
            RopeParams { freq_factors: w.rope_freqs.as_ref().or(longrope.as_ref()).cloned(), ..r.clone() }
        };
        self.rope = self
            .cfg
            .layers
            .iter()
            .map(|l| l.mixer.attention().and_then(|a| a.rope.as_ref()).map(rope))
            .collect();
    }

    /// Runs one micro-batch (at most `scratch.n_ubatch()` entries) and writes the outputs
    /// of the rows in `ub.outputs` to `out` (`[outputs.len(), n_vocab or n_embd]`). The
    /// caller has reserved KV blocks for every entry's position.
    pub fn forward(
        &self,
        ub: &UBatch,
        kv: &mut KvPool<B>,
        tables: &[&[u32]],
        s: &mut Scratch<B>,
        kind: OutputKind,
        out: &mut [f32],
    ) -> Result<()> {
        let (cfg, b) = (&self.cfg, &self.backend);
        self.hidden(ub, false, kv, tables, s)?;
        let n_out = ub.outputs.len();
        if n_out == 0 {
            return Ok(());
        }
        let d = cfg.n_embd;
        match kind {
            OutputKind::Hidden => b.read(&s.out_rows, &mut out[..n_out * d]),
            OutputKind::Logits | OutputKind::Argmax => {
                self.logits(s, n_out)?;
                // Dividing by a positive logit_scale keeps the argmax.
                if kind == OutputKind::Argmax && cfg.logit_scale > 0.0 {
                    let ids = b.argmax(&s.logits, n_out, cfg.n_vocab);
                    out.iter_mut().zip(ids).for_each(|(o, id)| *o = id as f32);
                    return Ok(());
                }
                let mut host = Vec::new();
                let logits = match kind {
                    OutputKind::Argmax => {
                        host.resize(n_out * cfg.n_vocab, 0.0);
                        &mut host[..]
                    }
                    _ => &mut out[..n_out * cfg.n_vocab],
                };
                b.read(&s.logits, logits);
                if cfg.logit_scale != 1.0 {
                    logits.iter_mut().for_each(|x| *x /= cfg.logit_scale);
                }
                if kind == OutputKind::Argmax {
                    for (o, row) in out.iter_mut().zip(host.chunks(cfg.n_vocab)) {
                        *o = crate::sample::argmax(row) as f32;
                    }
                }
            }
        }
        Ok(())
    }

    /// `forward` with `OutputKind::Argmax` for a model whose argmax the backend takes
    /// (`logit_scale` > 0), the ids left in flight so the host can record the next step
    /// before they come back. `last_argmax`: the batch's tokens are the ids the last greedy
    /// step left on the device (`ub.tokens` only counts them).
    pub fn forward_greedy(
        &self,
        ub: &UBatch,
        last_argmax: bool,
        kv: &mut KvPool<B>,
        tables: &[&[u32]],
        s: &mut Scratch<B>,
    ) -> Result<IdsTicket> {
        debug_assert!(self.cfg.logit_scale > 0.0);
        self.hidden(ub, last_argmax, kv, tables, s)?;
        let n_out = ub.outputs.len();
        self.logits(s, n_out)?;
        Ok(self.backend.argmax_start(&s.logits, n_out, self.cfg.n_vocab))
    }

    /// The output rows' logits, unscaled, into `s.logits`.
    fn logits(&self, s: &mut Scratch<B>, n_out: usize) -> Result<()> {
        let (cfg, w, b) = (&self.cfg, &self.weights, &self.backend);
        if s.logits_rows < n_out {
            s.logits = b.alloc(n_out * cfg.n_vocab)?;
            s.logits_rows = n_out;
        }
        if !cfg.causal {
            return Err(crate::error::KilnError::invalid("an encoder gives embeddings, not logits"));
        }
        b.matmul(w.output.as_ref().unwrap_or(&w.token_embd), &s.out_rows, n_out, &mut s.logits);
        if let Some(cap) = cfg.final_softcap {
            b.softcap(&mut s.logits, cap, n_out * cfg.n_vocab);
        }
        Ok(())
    }

    /// The layers, then the final norm of the output rows into `s.out_rows`.
    fn hidden(
        &self,
        ub: &UBatch,
        last_argmax: bool,
        kv: &mut KvPool<B>,
        tables: &[&[u32]],
        s: &mut Scratch<B>,
    ) -> Result<()> {
        let (cfg, w, b) = (&self.cfg, &self.weights, &self.backend);
        let n = ub.tokens.len();
        debug_assert!(n <= s.n_ubatch && n == ub.pos.len() && n == ub.seq.len());
        let d = cfg.n_embd;
        let slots: Vec<u32> = (0..n)
            .map(|i| {
                let t = tables[ub.seq[i] as usize];
                let p = ub.pos[i] as usize;
                t[p / BLOCK_SIZE] * BLOCK_SIZE as u32 + (p % BLOCK_SIZE) as u32
            })
            .collect();
        // Encoders: each sequence is whole in the batch, and every position sees all of it.
        // A bidirectional step of a causal model: each sequence's entries see up to the last
        // of them.
        let seq_len: Option<Vec<u32>> = (!cfg.causal || ub.bidirectional).then(|| {
            let mut len = vec![0u32; tables.len()];
            for (&q, &p) in ub.seq.iter().zip(ub.pos) {
                len[q as usize] = len[q as usize].max(p + 1);
            }
            len
        });
        let conv_slots = cfg.is_recurrent().then(|| ConvSlots::new(ub.pos, ub.seq, tables));

        if let Some(rows) = ub.embd {
            debug_assert_eq!(rows.len(), n * d);
            b.write_rows(&mut s.x, rows);
        } else if last_argmax {
            b.embed_last_argmax(&w.token_embd, n, cfg.embd_scale, &mut s.x)?;
        } else {
            b.embed(&w.token_embd, ub.tokens, cfg.embd_scale, &mut s.x)?;
        }
        if let Some(t) = &w.type_embd {
            b.add_bias(&mut s.x, t, n);
        }
        if let Some(pe) = &w.pos_embd {
            if let Some(&p) = ub.pos.iter().find(|&&p| p as usize >= cfg.n_ctx_train) {
                return Err(crate::error::KilnError::invalid(format!(
                    "position {p} is beyond the model's {} learned positions",
                    cfg.n_ctx_train
                )));
            }
            b.embed(pe, ub.pos, 1.0, &mut s.h)?;
            b.add(&mut s.x, &s.h, 1.0, n * d);
        }
        if let Some(norm) = &w.embd_norm {
            self.norm(&s.x, norm, n, &mut s.h);
            std::mem::swap(&mut s.x, &mut s.h);
        }
        let batch = Batch { pos: ub.pos, seq: ub.seq, slots: &slots, tables, seq_len: seq_len.as_deref() };
        if let Some(norm) = w.layers[0].mixer_pre_norm() {
            self.norm(&s.x, norm, n, &mut s.h);
        }
        for (il, (layer, lw)) in cfg.layers.iter().zip(&w.layers).enumerate() {
            // Each block reads its pre-norm's output (applied with the last residual add),
            // else the residual stream itself.
            let x = if layer.mixer.norms().pre { &s.h } else { &s.x };
            let cache = &mut kv.layers[il];
            match (&layer.mixer, &lw.mixer) {
                (Mixer::Attention(a), MixerWeights::Attention(aw)) => {
                    let rope = self.rope[il].as_ref();
                    let (kc, vc) = (&mut cache.k, &mut cache.v);
                    attention::forward(b, cfg, a, aw, rope, x, &batch, (kc, vc), &mut s.attn, &mut s.o);
                }
                (Mixer::ShortConv(c), MixerWeights::ShortConv(cw)) => {
                    let state = cache.state.as_mut().expect("a state for each conv layer");
                    let slots = conv_slots.as_ref().expect("made for recurrent models");
                    conv::forward(b, cfg, c, cw, x, n, slots, state, &mut s.conv, &mut s.o);
                }
                _ => unreachable!("weights are loaded for their spec"),
            }
            let norms = lw.mixer.norms();
            self.residual(s, n, norms.post.as_ref(), norms.after.as_ref(), lw.ffn.norms().pre.as_ref());
            let x = if layer.ffn.norms().pre { &s.h } else { &s.x };
            ffn::forward(b, &layer.ffn, &lw.ffn, x, n, &mut s.ffn, &mut s.o);
            let next = w.layers.get(il + 1).and_then(|l| l.mixer_pre_norm());
            let norms = lw.ffn.norms();
            self.residual(s, n, norms.post.as_ref(), norms.after.as_ref(), next);
        }

        let n_out = ub.outputs.len();
        if n_out == 0 {
            return Ok(());
        }
        match &w.output_norm {
            Some(norm) => {
                b.gather_rows(&s.x, ub.outputs, d, &mut s.h);
                self.norm(&s.h, norm, n_out, &mut s.out_rows);
            }
            None => b.gather_rows(&s.x, ub.outputs, d, &mut s.out_rows),
        }
        Ok(())
    }

    /// `out` = the norm of `rows` rows of `x`.
    fn norm(&self, x: &B::Buf, norm: &Norm<B::Weight>, rows: usize, out: &mut B::Buf) {
        let (cfg, b) = (&self.cfg, &self.backend);
        match cfg.norm {
            NormKind::Rms => b.rms_norm(x, &norm.w, cfg.norm_eps, rows, cfg.n_embd, out),
            NormKind::Layer => {
                let ln = LayerNorm { eps: cfg.norm_eps, w: &norm.w, b: norm.b.as_ref() };
                b.layer_norm(x, ln, rows, out)
            }
        }
    }

    /// A block's output `s.o` (after its post-norm, if any) added to the residual stream
    /// (then normed in place where the block has an `after` norm), then the next block's
    /// pre-norm of it (if any) into `s.h`.
    fn residual(
        &self,
        s: &mut Scratch<B>,
        n: usize,
        post: Option<&Norm<B::Weight>>,
        after: Option<&Norm<B::Weight>>,
        next: Option<&Norm<B::Weight>>,
    ) {
        let (cfg, b, d) = (&self.cfg, &self.backend, self.cfg.n_embd);
        if let Some(pn) = post {
            self.norm(&s.o, pn, n, &mut s.h);
            std::mem::swap(&mut s.o, &mut s.h);
        }
        match next {
            Some(norm) if cfg.norm == NormKind::Rms && after.is_none() => {
                b.add_rms_norm(&mut s.x, &s.o, cfg.residual_scale, &norm.w, cfg.norm_eps, n, d, &mut s.h)
            }
            _ => {
                b.add(&mut s.x, &s.o, cfg.residual_scale, n * d);
                if let Some(an) = after {
                    self.norm(&s.x, an, n, &mut s.h);
                    std::mem::swap(&mut s.x, &mut s.h);
                }
                if let Some(norm) = next {
                    self.norm(&s.x, norm, n, &mut s.h);
                }
            }
        }
    }
}
