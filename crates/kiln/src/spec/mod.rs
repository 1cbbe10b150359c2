//! Speculative decoding: cheap drafts of the next tokens, verified by the model in one
//! batched forward, so a step that reads the weights once can yield several tokens.
//!
//! A session generating with speculation takes its last sampled token and a draft of up to
//! `draft_max` tokens after it, from a draft model ([`draft`]: a second, smaller model of
//! the same vocabulary, one token at a time from its own distribution) or from the context
//! itself ([`lookup`]: the tokens that followed the earlier occurrence of its last n-gram
//! that matches the longest run of its last tokens, as many as matched). The model evaluates the token and the draft in one forward, each row's output
//! wanted; [`verify`] then walks the draft: greedy, a drafted token is accepted while it is
//! the model's argmax; sampling, it is accepted with probability `min(1, p/q)` (the model's
//! and the draft's probabilities of it) and the first rejected one is replaced by a draw
//! from `max(0, p - q)`, so every token emitted is distributed as the model alone would
//! give it (Leviathan et al., Chen et al.). After the accepted tokens comes one more from
//! the model's own row: the correction, or past a fully accepted draft the next token. The
//! keys and values of the rejected tokens are dropped by truncating the sequence
//! (`Runner::truncate_seq`: block tables and the prefix cache, no copy).
//!
//! Batch invariance makes greedy speculation exact: the model's rows for the draft are the
//! bits it would compute one token at a time, so greedy output with or without a draft is
//! identical.

pub mod draft;
pub mod lookup;
pub mod verify;

use crate::model::{Entry, OutputKind, Runner, SeqId};
use crate::sample::{Sampler, SamplerParams};

/// How a session speculates. `Default`: no speculation until a draft model or lookup is
/// given, then drafts of up to 16 tokens.
#[non_exhaustive]
#[derive(Clone, Debug, PartialEq)]
pub struct SpecOptions {
    /// A smaller model of the same vocabulary that drafts tokens (a `.gguf` path or a
    /// catalog or Hub name; llama.cpp's `-md`). It runs on the engine's device and threads,
    /// with a KV pool of its own as large as the engine's.
    pub draft_model: Option<String>,
    /// Prompt lookup (no second model): drafts the tokens that followed an earlier
    /// occurrence of the context's last `n` tokens, the one preceded by the longest run of
    /// tokens that also precede the context's end, as many tokens as that run is long.
    pub lookup_ngram: Option<usize>,
    /// Most tokens per draft.
    pub draft_max: usize,
    /// Drafts shorter than this are not verified (the step decodes one token).
    pub draft_min: usize,
    /// A draft model stops drafting at a token whose probability under it (the softmax of
    /// its logits) is below this.
    pub draft_p_min: f32,
}

impl Default for SpecOptions {
    fn default() -> Self {
        SpecOptions { draft_model: None, lookup_ngram: None, draft_max: 16, draft_min: 0, draft_p_min: 0.75 }
    }
}

impl SpecOptions {
    /// Whether a session speculates at all.
    pub fn enabled(&self) -> bool {
        (self.draft_model.is_some() || self.lookup_ngram.is_some()) && self.draft_max > 0
    }

    /// Rejects settings that cannot work with a context of `n_ctx` tokens (the lengths only
    /// where something drafts).
    pub fn validate(&self, n_ctx: usize) -> crate::Result<()> {
        let bad = |m: String| Err(crate::KilnError::invalid(m));
        if self.draft_model.is_some() && self.lookup_ngram.is_some() {
            return bad("a draft model and prompt lookup cannot both draft (pick one)".into());
        }
        if self.lookup_ngram == Some(0) {
            return bad("--lookup-ngram must be at least 1".into());
        }
        if !self.enabled() {
            return Ok(());
        }
        if self.draft_max >= n_ctx {
            return bad(format!(
                "a draft of up to {} tokens does not fit in the context ({n_ctx})",
                self.draft_max
            ));
        }
        if self.draft_min > self.draft_max {
            return bad(format!("--draft-min {} is above --draft-max {}", self.draft_min, self.draft_max));
        }
        if !(0.0..=1.0).contains(&self.draft_p_min) {
            return bad(format!("--draft-p-min {} is not in [0, 1]", self.draft_p_min));
        }
        Ok(())
    }
}

/// One drafted token and the distribution it was drawn from (`None`: drawn with
/// certainty, as a lookup's or a greedy draft's).
#[derive(Clone, Debug)]
pub struct Drafted {
    pub id: u32,
    pub q: Option<Vec<crate::sample::Candidate>>,
}

/// One sequence's drafting (a session's `generate` call, a server request): the engine's
/// draft source, and for a draft model its sequence and sampler (the sequence's chain
/// without penalties, a seed of its own).
pub struct Speculator {
    engine: crate::Engine,
    source: Source,
    sampler: Sampler,
    n_vocab: usize,
}

#[derive(Clone, Copy)]
enum Source {
    Model(SeqId),
    Lookup(usize),
}

impl Speculator {
    /// The engine's speculation for a session (`draft_seq`: its draft model's sequence),
    /// `None` where the engine does not speculate.
    pub fn new(
        engine: &crate::Engine,
        draft_seq: Option<SeqId>,
        params: &SamplerParams,
        n_vocab: usize,
    ) -> crate::Result<Option<Speculator>> {
        let opts = engine.spec();
        if !opts.enabled() {
            return Ok(None);
        }
        let source = match (opts.lookup_ngram, draft_seq) {
            (Some(n), _) => Source::Lookup(n),
            (None, Some(seq)) => Source::Model(seq),
            (None, None) => return Ok(None),
        };
        let chain = SamplerParams {
            repeat_last_n: 0,
            seed: params.seed.map(|s| s ^ 0x6472_6166_7400_0000),
            ..params.clone()
        };
        let sampler = Sampler::new(chain, n_vocab)?;
        Ok(Some(Speculator { engine: engine.clone(), source, sampler, n_vocab }))
    }

    /// The most tokens a draft may have after the conversation's `n` tokens (its last not
    /// yet evaluated) so that its forward stays inside the context of `n_ctx`, every token
    /// it may decide comes where generation would take it without a shift (`shifting`: a
    /// session that shifts does so before the last free position) or the context full, and
    /// at most `budget` tokens (the one being evaluated included) are decided.
    pub fn room(&self, n: usize, n_ctx: usize, shifting: bool, budget: usize) -> usize {
        let ctx = n_ctx.saturating_sub(n + if shifting { 2 } else { 1 });
        ctx.min(budget.saturating_sub(1)).min(self.engine.spec().draft_max)
    }

    /// A draft of at most `room` tokens after `context`; empty where there is none of at
    /// least `draft_min` tokens.
    pub fn draft(
        &mut self,
        context: &[u32],
        room: usize,
        is_eog: impl Fn(u32) -> bool,
    ) -> crate::Result<Vec<Drafted>> {
        Ok(Speculator::draft_all(&mut [(self, context, room)], is_eog)?.pop().unwrap_or_default())
    }

    /// [`Self::draft`] for several sequences of one engine at once (`(speculator, context,
    /// room)` each): lookups from their contexts, draft-model drafts through one batched
    /// forward per drafted position ([`draft::draft_batch`]). The drafts come back in order.
    pub fn draft_all(
        batch: &mut [(&mut Speculator, &[u32], usize)],
        is_eog: impl Fn(u32) -> bool,
    ) -> crate::Result<Vec<Vec<Drafted>>> {
        let mut out = vec![Vec::new(); batch.len()];
        let Some(first) = batch.first() else { return Ok(out) };
        let (engine, n_vocab) = (first.0.engine.clone(), first.0.n_vocab);
        let opts = engine.spec();
        let mut model = Vec::new();
        let mut model_at = Vec::new();
        for (i, (sp, context, room)) in batch.iter_mut().enumerate() {
            if *room == 0 || *room < opts.draft_min {
                continue;
            }
            match sp.source {
                Source::Lookup(n) => {
                    out[i] = lookup::draft(context, n, *room)
                        .into_iter()
                        .map(|id| Drafted { id, q: None })
                        .collect()
                }
                Source::Model(seq) => {
                    model.push(draft::Request { seq, context, max: *room, sampler: &mut sp.sampler });
                    model_at.push(i);
                }
            }
        }
        if let (false, Some(r)) = (model.is_empty(), engine.draft_runner()) {
            let drafts = draft::draft_batch(r, &mut model, opts.draft_p_min, n_vocab, is_eog)?;
            for (i, d) in model_at.into_iter().zip(drafts) {
                out[i] = d;
            }
        }
        for d in &mut out {
            if d.len() < opts.draft_min.max(1) {
                d.clear();
            }
        }
        Ok(out)
    }
}

/// Rolls sequence `seq` back after a verify forward of `context`'s last token and `draft`:
/// its KV keeps `context` and the first `accepted` drafted tokens. Truncation may drop a
/// block shared since the forward (`Runner::truncate_seq`); what it held is evaluated
/// again. Returns the positions evaluated again.
pub fn roll_back(
    runner: &dyn Runner,
    seq: SeqId,
    context: &[u32],
    draft: &[Drafted],
    accepted: usize,
) -> crate::Result<usize> {
    let keep = context.len() + accepted;
    runner.truncate_seq(seq, keep);
    let have = runner.seq_len(seq);
    if have >= keep {
        return Ok(0);
    }
    let token = |i: usize| if i < context.len() { context[i] } else { draft[i - context.len()].id };
    let entries: Vec<Entry> = (have..keep).map(|i| Entry { seq, token: token(i), output: false }).collect();
    runner.decode(&entries, OutputKind::Logits)?;
    Ok(entries.len())
}
