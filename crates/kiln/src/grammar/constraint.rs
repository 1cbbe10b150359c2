//! [`Constraint`]: one sequence's grammar state, and the one function every generation
//! loop (sessions, the server's batches) uses to pick a constrained token.

use std::sync::Arc;
use std::time::Instant;

use llguidance::toktrie::SimpleVob;
use llguidance::Matcher;
use regex::bytes::Regex;

use super::env::{grammar_err, GrammarEnv};
use super::Trigger;
use crate::error::{KilnError, Result};
use crate::sample::Sampler;

/// How much of the output a pattern trigger searches (its most recent bytes).
const PATTERN_WINDOW: usize = 64 << 10;

/// A compiled trigger.
#[derive(Debug)]
pub(crate) enum TriggerMatcher {
    Token(u32),
    /// A literal (escaped) or a pattern.
    Regex(Regex),
}

impl TriggerMatcher {
    pub(crate) fn new(t: &Trigger, n_vocab: usize) -> Result<Self> {
        Ok(match t {
            Trigger::Token(id) if (*id as usize) < n_vocab => TriggerMatcher::Token(*id),
            Trigger::Token(id) => {
                return Err(KilnError::Grammar(format!(
                    "trigger token {id} is outside the vocabulary ({n_vocab} tokens)"
                )))
            }
            Trigger::Text(s) if s.is_empty() => {
                return Err(KilnError::Grammar("an empty trigger text".into()))
            }
            Trigger::Text(s) => TriggerMatcher::Regex(Regex::new(&regex::escape(s)).map_err(grammar_err)?),
            Trigger::Pattern(p) => TriggerMatcher::Regex(
                Regex::new(p).map_err(|e| KilnError::Grammar(format!("trigger pattern {p:?}: {e}")))?,
            ),
        })
    }
}

/// Counters of a constraint's work.
#[non_exhaustive]
#[derive(Clone, Debug, Default)]
pub struct ConstraintStats {
    /// Constrained tokens sampled (after activation).
    pub n_sampled: usize,
    /// Of those, how many needed the full mask (the chain's first choice was rejected).
    pub n_masked: usize,
    /// Microseconds of grammar work (check, mask, advance) for each constrained token.
    pub grammar_us: Vec<f32>,
    /// Microseconds of each full mask computed.
    pub mask_us: Vec<f32>,
}

enum State {
    /// A lazy constraint before its trigger: the output so far (pieces with control
    /// tokens' text) and where each token's piece starts in it.
    Waiting {
        text: Vec<u8>,
        starts: Vec<(u32, usize)>,
    },
    Active(Box<Matcher>),
}

/// One sequence's grammar constraint. Per step: [`Constraint::sample`] picks the token
/// (through the sequence's [`Sampler`]), then [`Constraint::accept`] advances the grammar
/// (and [`Sampler::accept`] the penalties). [`Constraint::is_complete`] says the grammar
/// has matched and allows nothing more: generation ends there.
///
/// End-of-generation tokens are allowed exactly where the grammar could end.
pub struct Constraint {
    env: Arc<GrammarEnv>,
    template: Matcher,
    triggers: Arc<[TriggerMatcher]>,
    state: State,
    /// Tokens accepted before the one the constrained output starts in.
    activated_at: Option<usize>,
    masked: Vec<f32>,
    stats: ConstraintStats,
    /// Grammar time spent on the current token so far (sample, then accept).
    pending_us: f32,
    /// Compute the full mask before every draw instead of checking the chain's choice.
    mask_first: bool,
}

impl std::fmt::Debug for Constraint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Constraint").field("active", &self.is_active()).finish()
    }
}

impl Constraint {
    pub(crate) fn new(env: Arc<GrammarEnv>, template: Matcher, triggers: Arc<[TriggerMatcher]>) -> Self {
        let (state, activated_at) = if triggers.is_empty() {
            (State::Active(Box::new(template.clone())), Some(0))
        } else {
            (State::Waiting { text: Vec::new(), starts: Vec::new() }, None)
        };
        Constraint {
            env,
            template,
            triggers,
            state,
            activated_at,
            masked: Vec::new(),
            stats: ConstraintStats::default(),
            pending_us: 0.0,
            mask_first: false,
        }
    }

    /// Whether the grammar constrains the output now (always, without triggers).
    pub fn is_active(&self) -> bool {
        matches!(self.state, State::Active(_))
    }

    /// How many tokens were accepted before the one the constrained output starts in
    /// (`Some(0)` without triggers; `None` while waiting for a trigger).
    pub fn activated_at(&self) -> Option<usize> {
        self.activated_at
    }

    /// The grammar has matched and allows nothing more: generation should end.
    pub fn is_complete(&self) -> bool {
        match &self.state {
            State::Active(m) => m.is_stopped() && !m.is_error(),
            State::Waiting { .. } => false,
        }
    }

    /// Masks first: every draw is from the chain over the allowed tokens only (the exact
    /// masked distribution, as llama.cpp's `grammar_first`), at the cost of a full mask
    /// per token. Off by default: the chain's choice is checked and the mask computed only
    /// when it is rejected.
    pub fn set_mask_first(&mut self, yes: bool) {
        self.mask_first = yes;
    }

    /// Work counters (grammar time per token, full masks computed).
    pub fn stats(&self) -> &ConstraintStats {
        &self.stats
    }

    /// Picks the next token from `logits` with `sampler`'s chain under the grammar: the
    /// chain's choice when the grammar allows it (one token checked; under plain greedy
    /// settings the choice is the raw logits' argmax), else the chain over the logits of
    /// the allowed tokens only (greedy: the allowed token with the highest logit). Unconstrained while a lazy constraint waits for its trigger;
    /// after the grammar completes, only end-of-generation tokens are allowed.
    pub fn sample(&mut self, sampler: &mut Sampler, logits: &[f32]) -> Result<u32> {
        if !self.is_active() {
            return Ok(sampler.sample(logits));
        }
        // Grammar time: everything here but the chain's first draw, which an unconstrained
        // step pays too.
        let t0 = Instant::now();
        let mut chain = std::time::Duration::ZERO;
        let r = self.sample_active(sampler, logits, &mut chain);
        self.pending_us += t0.elapsed().saturating_sub(chain).as_secs_f32() * 1e6;
        self.stats.n_sampled += 1;
        r
    }

    fn sample_active(
        &mut self,
        sampler: &mut Sampler,
        logits: &[f32],
        chain: &mut std::time::Duration,
    ) -> Result<u32> {
        let State::Active(m) = &mut self.state else { unreachable!("checked by sample") };
        let n_vocab = self.env.n_vocab();
        let mask = if m.is_stopped() {
            if let Some(e) = m.get_error() {
                return Err(KilnError::Grammar(e));
            }
            let mut eog = SimpleVob::alloc(n_vocab);
            self.env
                .trie()
                .eos_tokens()
                .iter()
                .filter(|&&t| (t as usize) < n_vocab)
                .for_each(|&t| eog.allow_token(t));
            if eog.is_zero() {
                return Err(KilnError::Grammar(
                    "the grammar is complete and the model has no end token".into(),
                ));
            }
            eog
        } else {
            if !self.mask_first {
                let t = Instant::now();
                let id = sampler.sample(logits);
                *chain = t.elapsed();
                if (id as usize) < n_vocab && m.validate_tokens(&[id]).map_err(grammar_err)? == 1 {
                    return Ok(id);
                }
            }
            let t = Instant::now();
            let mask = m.compute_mask().map_err(grammar_err)?;
            self.stats.mask_us.push(t.elapsed().as_secs_f32() * 1e6);
            mask
        };
        self.stats.n_masked += 1;
        let n = logits.len().min(n_vocab);
        if sampler.params().is_plain_greedy() {
            // The chain over the masked logits would be their argmax: the best allowed token.
            return best_allowed(&mask, logits, n);
        }
        self.masked.clear();
        self.masked.resize(n, f32::NEG_INFINITY);
        mask.iter_set_entries(|i| {
            if i < n {
                self.masked[i] = logits[i];
            }
        });
        let t = Instant::now();
        let id = sampler.sample(&self.masked);
        if self.mask_first {
            *chain = t.elapsed(); // the step's one draw
        }
        if (id as usize) < n && mask.is_allowed(id) {
            return Ok(id);
        }
        // The chain can land on a banned token when every allowed logit is -inf (a bias
        // banned them all): take the best allowed one by its raw logit.
        best_allowed(&mask, logits, n)
    }

    /// Advances past the sampled (or forced) token `id`. Errors, leaving the constraint
    /// failed, when the grammar does not allow it.
    pub fn accept(&mut self, id: u32) -> Result<()> {
        if id as usize >= self.env.n_vocab() {
            return Err(KilnError::Grammar(format!("token {id} is outside the vocabulary")));
        }
        let t0 = Instant::now();
        let r = match &mut self.state {
            State::Active(m) => m.consume_token(id).map_err(grammar_err),
            State::Waiting { .. } => self.wait(id),
        };
        if self.is_active() {
            self.pending_us += t0.elapsed().as_secs_f32() * 1e6;
            self.stats.grammar_us.push(std::mem::take(&mut self.pending_us));
        }
        r
    }

    /// A token while waiting: activates on a trigger and feeds the grammar the output
    /// from the trigger's start.
    fn wait(&mut self, id: u32) -> Result<()> {
        let State::Waiting { text, starts } = &mut self.state else { return Ok(()) };
        let start = text.len();
        starts.push((id, start));
        let trie = self.env.trie();
        text.extend_from_slice(special_free(trie.token(id)));
        let by_token = self.triggers.iter().any(|t| matches!(t, TriggerMatcher::Token(x) if *x == id));
        let at = if by_token {
            Some(start)
        } else {
            let from = text.len().saturating_sub(PATTERN_WINDOW);
            self.triggers
                .iter()
                .filter_map(|t| match t {
                    TriggerMatcher::Regex(re) => {
                        let c = re.captures(&text[from..])?;
                        Some(from + c.get(1).or_else(|| c.get(0))?.start())
                    }
                    TriggerMatcher::Token(_) => None,
                })
                .min()
        };
        let Some(at) = at else { return Ok(()) };
        // The tokens from the trigger on: the one it starts in (cut at the trigger when it
        // starts mid-token, re-tokenized by bytes), then those after it.
        let i = starts.partition_point(|&(_, s)| s <= at) - 1;
        let (tok_i, start_i) = starts[i];
        let mut feed = if start_i == at {
            vec![tok_i]
        } else {
            let end = starts.get(i + 1).map_or(text.len(), |&(_, s)| s);
            trie.greedy_tokenize(&text[at..end])
        };
        feed.extend(starts[i + 1..].iter().map(|&(t, _)| t));
        let mut m = self.template.clone();
        let fed = m.consume_tokens(&feed).map_err(|e| {
            KilnError::Grammar(format!("the output after the trigger does not match the grammar: {e}"))
        });
        self.activated_at = Some(i);
        self.state = State::Active(Box::new(m));
        fed
    }
}

/// The allowed token (of the first `n`) with the highest raw logit by `total_cmp`, the
/// lowest id on ties: what greedy picks from logits with every other token at -inf.
fn best_allowed(mask: &SimpleVob, logits: &[f32], n: usize) -> Result<u32> {
    let mut best: Option<u32> = None;
    mask.iter_set_entries(|i| {
        if i < n && best.is_none_or(|b| logits[i].total_cmp(&logits[b as usize]).is_gt()) {
            best = Some(i as u32);
        }
    });
    best.ok_or_else(|| KilnError::Grammar("no token of the vocabulary continues the grammar".into()))
}

/// A token's bytes in the trie, without the special-token marker.
fn special_free(bytes: &[u8]) -> &[u8] {
    match bytes.first() {
        Some(&llguidance::toktrie::TokTrie::SPECIAL_TOKEN_MARKER) => &bytes[1..],
        _ => bytes,
    }
}
