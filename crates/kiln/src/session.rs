//! `Session`: one conversation's tokens and KV sequence on an engine; append text, tokens
//! or chat messages, then generate with streaming and cancellation.

use std::ops::ControlFlow;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use crate::chat::Message;
use crate::engine::Engine;
use crate::error::{KilnError, Result};
use crate::model::{Entry, OutputKind, SeqId};
use crate::sample::{Sampler, SamplerParams, StopMatcher};
use crate::tokenizer::Detokenizer;

#[non_exhaustive]
#[derive(Clone, Debug, Default)]
pub struct SessionOptions {}

/// How to generate. `Default`: llama.cpp's sampling defaults, until end of generation.
#[non_exhaustive]
#[derive(Clone, Debug, Default)]
pub struct GenerateOptions {
    /// Most tokens to generate (`None`: until an end-of-generation token or the context).
    pub max_tokens: Option<usize>,
    pub sampler: SamplerParams,
    /// Generation stops before any of these strings.
    pub stop: Vec<String>,
    /// Keep going past end-of-generation tokens.
    pub ignore_eos: bool,
}

impl GenerateOptions {
    pub fn with_max_tokens(mut self, n: usize) -> Self {
        self.max_tokens = Some(n);
        self
    }
    pub fn with_sampler(mut self, s: SamplerParams) -> Self {
        self.sampler = s;
        self
    }
    pub fn with_stop(mut self, stop: Vec<String>) -> Self {
        self.stop = stop;
        self
    }
    pub fn with_ignore_eos(mut self, yes: bool) -> Self {
        self.ignore_eos = yes;
        self
    }
}

/// Why generation ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FinishReason {
    Eog,
    Stop,
    Length,
    ContextFull,
    Cancelled,
}

impl FinishReason {
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Eog => "eog",
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
            FinishReason::ContextFull => "context_full",
            FinishReason::Cancelled => "cancelled",
        }
    }
}

/// One streamed step: the sampled token and the text it completes (valid UTF-8, possibly
/// empty while a character or a possible stop string is incomplete).
#[derive(Debug)]
pub struct Event<'a> {
    pub token: u32,
    pub text: &'a str,
}

#[derive(Clone, Debug, Default)]
pub struct Timings {
    pub prompt_n: usize,
    pub prompt_ms: f64,
    pub gen_n: usize,
    pub gen_ms: f64,
}

#[derive(Clone, Debug)]
pub struct Summary {
    /// Every sampled token, including a final end-of-generation token.
    pub ids: Vec<u32>,
    /// The generated text, without control tokens, cut before a matched stop string.
    pub text: String,
    pub finish_reason: FinishReason,
    pub timings: Timings,
}

pub struct Session {
    engine: Engine,
    seq: SeqId,
    /// Tokens whose keys and values are in the KV cache.
    tokens: Vec<u32>,
    /// Sampled tokens not yet evaluated (the last one of a finished generation).
    pending: Vec<u32>,
    logits: Option<Vec<f32>>,
    cancel: Arc<AtomicBool>,
    prompt_timing: (usize, f64),
}

impl Session {
    pub(crate) fn new(engine: Engine, _opts: SessionOptions) -> Result<Self> {
        let seq = engine.runner().new_seq();
        Ok(Session {
            engine,
            seq,
            tokens: Vec::new(),
            pending: Vec::new(),
            logits: None,
            cancel: Arc::new(AtomicBool::new(false)),
            prompt_timing: (0, 0.0),
        })
    }

    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    /// Every token of the conversation so far.
    pub fn tokens(&self) -> Vec<u32> {
        let mut t = self.tokens.clone();
        t.extend(&self.pending);
        t
    }

    /// Logits after the last evaluated token.
    pub fn logits(&self) -> Option<&[f32]> {
        self.logits.as_deref()
    }

    /// A flag that, set from any thread, stops `append_*` and `generate` at the next step.
    pub fn cancel_handle(&self) -> Arc<AtomicBool> {
        self.cancel.clone()
    }

    /// Tokenizes `text` (special tokens parsed; BOS first when the model wants one and the
    /// session is empty) and evaluates it.
    pub fn append_text(&mut self, text: &str) -> Result<Vec<u32>> {
        let tok = self.engine.tokenizer().clone();
        let at_start = self.tokens.is_empty() && self.pending.is_empty();
        let mut ids = tok.encode(text, false, true)?;
        if at_start && tok.add_bos() {
            if let Some(bos) = tok.bos() {
                if ids.first() != Some(&bos) {
                    ids.insert(0, bos);
                }
            }
        }
        self.append_tokens(&ids)?;
        Ok(ids)
    }

    /// Renders `messages` with the model's chat template (generation prompt added) and
    /// evaluates them.
    pub fn append_chat(&mut self, messages: &[Message]) -> Result<Vec<u32>> {
        let tpl = self
            .engine
            .chat_template()
            .ok_or_else(|| KilnError::Template("the model has no chat template".into()))?;
        let text = tpl.render(messages, true, None)?;
        self.append_text(&text)
    }

    /// Evaluates `ids` after the conversation so far (in `n_batch` chunks), keeping the
    /// logits of the last one.
    pub fn append_tokens(&mut self, ids: &[u32]) -> Result<()> {
        let mut all = std::mem::take(&mut self.pending);
        all.extend_from_slice(ids);
        if all.is_empty() {
            return Ok(());
        }
        let n_ctx = self.engine.n_ctx();
        if self.tokens.len() + all.len() > n_ctx {
            self.pending = all[..all.len() - ids.len()].to_vec();
            return Err(KilnError::invalid(format!(
                "prompt of {} tokens does not fit the context ({} used of {n_ctx})",
                all.len(),
                self.tokens.len()
            )));
        }
        let t0 = Instant::now();
        let runner = self.engine.runner();
        let chunk = runner.n_ubatch();
        for (ci, part) in all.chunks(chunk).enumerate() {
            if self.cancel.load(Ordering::Relaxed) {
                return Err(KilnError::invalid("cancelled"));
            }
            let last_chunk = (ci + 1) * chunk >= all.len();
            let entries: Vec<Entry> = part
                .iter()
                .enumerate()
                .map(|(i, &t)| Entry { seq: self.seq, token: t, output: last_chunk && i + 1 == part.len() })
                .collect();
            let out = runner.decode(&entries, OutputKind::Logits)?;
            self.tokens.extend_from_slice(part);
            if last_chunk {
                self.logits = Some(out);
            }
        }
        self.prompt_timing = (all.len(), t0.elapsed().as_secs_f64() * 1e3);
        Ok(())
    }

    /// Samples up to `opts.max_tokens` tokens, calling `on_event` for each; the callback
    /// can stop early with `ControlFlow::Break`.
    pub fn generate(
        &mut self,
        opts: &GenerateOptions,
        mut on_event: impl FnMut(&Event) -> ControlFlow<()>,
    ) -> Result<Summary> {
        let n_vocab = self.engine.config().n_vocab;
        let tok = self.engine.tokenizer().clone();
        let mut sampler = Sampler::new(opts.sampler.clone(), n_vocab)?;
        for &t in self.tokens.iter().chain(&self.pending) {
            sampler.accept(t);
        }
        if self.logits.is_none() || !self.pending.is_empty() {
            self.append_tokens(&[])?;
        }
        let mut detok = Detokenizer::new(tok.clone(), false);
        let mut stop = StopMatcher::new(opts.stop.clone());
        let (prompt_n, prompt_ms) = std::mem::take(&mut self.prompt_timing);
        let t0 = Instant::now();
        let mut ids = Vec::new();
        let mut text = String::new();
        let n_ctx = self.engine.n_ctx();
        let finish = loop {
            if opts.max_tokens.is_some_and(|m| ids.len() >= m) {
                break FinishReason::Length;
            }
            if self.cancel.swap(false, Ordering::Relaxed) {
                break FinishReason::Cancelled;
            }
            if self.tokens.len() + self.pending.len() >= n_ctx {
                break FinishReason::ContextFull;
            }
            let logits =
                self.logits.as_deref().ok_or_else(|| KilnError::invalid("nothing to continue from"))?;
            let id = sampler.sample(logits);
            sampler.accept(id);
            ids.push(id);
            if tok.is_eog(id) && !opts.ignore_eos {
                self.pending.push(id);
                break FinishReason::Eog;
            }
            let piece = detok.push(id);
            let (safe, matched) = stop.push(&piece);
            text.push_str(&safe);
            let flow = on_event(&Event { token: id, text: &safe });
            if matched {
                self.pending.push(id);
                break FinishReason::Stop;
            }
            if flow.is_break() {
                self.pending.push(id);
                break FinishReason::Cancelled;
            }
            if opts.max_tokens.is_some_and(|m| ids.len() >= m) || self.tokens.len() + 1 >= n_ctx {
                // Do not spend a forward on logits nobody will read.
                self.pending.push(id);
                continue;
            }
            let out = self
                .engine
                .runner()
                .decode(&[Entry { seq: self.seq, token: id, output: true }], OutputKind::Logits)?;
            self.tokens.push(id);
            self.logits = Some(out);
        };
        if finish != FinishReason::Stop {
            let rest = stop.finish();
            let tail = detok.finish();
            let mut flushed = rest;
            flushed.push_str(&tail);
            if !flushed.is_empty() {
                text.push_str(&flushed);
                let _ = on_event(&Event { token: *ids.last().unwrap_or(&0), text: &flushed });
            }
        }
        let gen_ms = t0.elapsed().as_secs_f64() * 1e3;
        Ok(Summary {
            ids: ids.clone(),
            text,
            finish_reason: finish,
            timings: Timings { prompt_n, prompt_ms, gen_n: ids.len(), gen_ms },
        })
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        self.engine.runner().free_seq(self.seq);
    }
}
