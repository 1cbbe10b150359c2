//! `Session`: one conversation's tokens and KV sequence on an engine; append text, tokens
//! or chat messages, then generate with streaming and cancellation.
//!
//! Prefix reuse: every append asks the runner for the longest prefix of the conversation
//! it already holds (the session's own cache, or whole blocks another session or an
//! earlier one computed, through the engine's prefix cache) and evaluates only the rest.
//! `append_chat` re-renders the whole history with the template, so a follow-up turn
//! evaluates only the tokens the model has not seen.
//!
//! Concurrency: a session is `Send` and holds only `Arc`s; many share one engine. The
//! runner's mutex serializes forwards, so sessions generating on different threads are
//! queued and interleave at the granularity of one forward (one token of decode, or one
//! micro-batch of prefill): all of them progress.

use std::collections::VecDeque;
use std::ops::ControlFlow;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use serde_json::json;

use crate::chat::tools::{
    compile_tool_grammar, render_chat, ChatTools, Parsed, ToolCall, ToolCallDelta, ToolCallParser,
};
use crate::chat::Message;
use crate::engine::Engine;
use crate::error::{KilnError, Result};
use crate::grammar::{ConstraintStats, GrammarSpec};
use crate::model::{Entry, OutputKind, SeqId};
use crate::progress::{report, ProgressFn, Stage};
use crate::sample::{Sampler, SamplerParams, StopMatcher};
use crate::spec::{verify, Drafted, Speculator};
use crate::tokenizer::Detokenizer;
use crate::vision::prompt::run_end;
use crate::vision::{EncodedImage, ImageRows, RgbImage, MEDIA_MARKER};

/// Version of the session file format `save` writes.
pub const SESSION_FORMAT_VERSION: u64 = 1;

/// How a session handles its context. `Default`: stop with `context_full` at `n_ctx`.
#[non_exhaustive]
#[derive(Clone, Debug, Default)]
pub struct SessionOptions {
    /// When generation reaches `n_ctx`: `None` stops with [`FinishReason::ContextFull`];
    /// `Some(n_keep)` shifts the context as llama.cpp does, keeping the first `n_keep`
    /// tokens and dropping half of the rest.
    pub context_shift: Option<usize>,
    /// Where progress of evaluating prompts goes (tokens, per micro-batch; none by default).
    pub progress: Option<ProgressFn>,
}

impl SessionOptions {
    /// Shift the context when it fills, keeping the first `n_keep` tokens.
    pub fn with_context_shift(mut self, n_keep: usize) -> Self {
        self.context_shift = Some(n_keep);
        self
    }
    /// Reports progress of evaluating prompts to `f`.
    pub fn with_progress(mut self, f: ProgressFn) -> Self {
        self.progress = Some(f);
        self
    }
}

/// How to generate. `Default`: llama.cpp's sampling defaults, until end of generation.
#[non_exhaustive]
#[derive(Clone, Debug, Default)]
pub struct GenerateOptions {
    /// Most tokens to generate (`None`: until an end-of-generation token or the context).
    pub max_tokens: Option<usize>,
    /// The sampler chain's settings.
    pub sampler: SamplerParams,
    /// Generation stops before any of these strings.
    pub stop: Vec<String>,
    /// Keep going past end-of-generation tokens.
    pub ignore_eos: bool,
    /// `Some(k)`: report each sampled token's log-probability under the model (raw
    /// logits, before sampling filters) and the `k` most likely tokens'.
    pub logprobs: Option<usize>,
    /// Constrain the output to a grammar (see [`crate::grammar`]).
    pub grammar: Option<GrammarSpec>,
}

impl GenerateOptions {
    /// Generate at most `n` tokens.
    pub fn with_max_tokens(mut self, n: usize) -> Self {
        self.max_tokens = Some(n);
        self
    }
    /// Sampling settings.
    pub fn with_sampler(mut self, s: SamplerParams) -> Self {
        self.sampler = s;
        self
    }
    /// Stop strings.
    pub fn with_stop(mut self, stop: Vec<String>) -> Self {
        self.stop = stop;
        self
    }
    /// Keep going past end-of-generation tokens.
    pub fn with_ignore_eos(mut self, yes: bool) -> Self {
        self.ignore_eos = yes;
        self
    }
    /// Report log-probabilities with the `top` most likely alternatives.
    pub fn with_logprobs(mut self, top: usize) -> Self {
        self.logprobs = Some(top);
        self
    }
    /// Constrain the output to a grammar: a [`crate::Grammar`] (from the first token) or
    /// a lazy [`GrammarSpec`] (from a trigger on).
    pub fn with_grammar(mut self, grammar: impl Into<GrammarSpec>) -> Self {
        self.grammar = Some(grammar.into());
        self
    }
}

/// Why generation ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FinishReason {
    /// The model produced an end-of-generation token, or the grammar is complete and
    /// allows nothing more.
    Eog,
    /// A stop string matched.
    Stop,
    /// `max_tokens` were generated.
    Length,
    /// The context is full (and context shift is off).
    ContextFull,
    /// `cancel()` was called, or the callback returned `Break`.
    Cancelled,
}

impl FinishReason {
    /// The name docs/cli.md and the server use.
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
/// empty while a character or a possible stop string is incomplete). After the last token,
/// one more event with `flush` set may release text held back until the end.
#[non_exhaustive]
#[derive(Debug)]
pub struct Event<'a> {
    /// The sampled token (with `flush`: the last one, already reported).
    pub token: u32,
    /// This event samples no token: it releases the text held back at the end (a partial
    /// stop string that never completed, or an incomplete character).
    pub flush: bool,
    /// Text released by this step.
    pub text: &'a str,
    /// Log-probability of `token` (with `GenerateOptions::logprobs`).
    pub logprob: Option<f32>,
    /// The most likely tokens and their log-probabilities, best first.
    pub top_logprobs: &'a [(u32, f32)],
    /// In a chat with tools: pieces of the calls this step completed (a call's id and
    /// name first, then its argument text). Call markup never reaches `text`.
    pub tool_calls: &'a [ToolCallDelta],
}

/// Where the time went. Prompt figures cover the appends since the previous `generate`.
#[non_exhaustive]
#[derive(Clone, Debug, Default)]
pub struct Timings {
    /// Prompt tokens evaluated.
    pub prompt_n: usize,
    /// Prompt tokens reused from the KV cache (not evaluated).
    pub prompt_cached: usize,
    /// Milliseconds evaluating the prompt.
    pub prompt_ms: f64,
    /// Tokens generated.
    pub gen_n: usize,
    /// Milliseconds generating: from the first sampled token to the last (drafting and
    /// verifying included).
    pub gen_ms: f64,
    /// Images encoded (the same pixels twice in a session: once).
    pub image_n: usize,
    /// Milliseconds encoding images (decoding the files not included).
    pub image_ms: f64,
    /// Speculative decoding: tokens drafted and verified, and how many of them the model
    /// accepted.
    pub draft_tokens: usize,
    pub accepted_tokens: usize,
}

/// The result of one `generate`.
#[non_exhaustive]
#[derive(Clone, Debug)]
pub struct Summary {
    /// Every sampled token, including a final end-of-generation token.
    pub ids: Vec<u32>,
    /// The generated text, without control tokens, cut before a matched stop string. In a
    /// chat with tools, the reply's content: its calls are in `tool_calls`.
    pub text: String,
    /// In a chat with tools: the calls the reply made, complete and in order.
    pub tool_calls: Vec<ToolCall>,
    /// Why generation ended.
    pub finish_reason: FinishReason,
    /// Prompt and generation timings.
    pub timings: Timings,
    /// The grammar constraint's work, when there was one.
    pub grammar: Option<ConstraintStats>,
}

/// Cancels a session's `append_*` or `generate` from any thread: the work stops at the
/// next forward boundary (one micro-batch of prefill, or one token).
#[derive(Clone, Debug)]
pub struct CancelHandle(Arc<AtomicBool>);

impl CancelHandle {
    /// Asks the session to stop. The request stays pending until a call consumes it.
    pub fn cancel(&self) {
        self.0.store(true, Ordering::SeqCst);
    }
    /// Withdraws a pending request.
    pub fn reset(&self) {
        self.0.store(false, Ordering::SeqCst);
    }
    /// Whether a request is pending.
    pub fn is_cancelled(&self) -> bool {
        self.0.load(Ordering::SeqCst)
    }
}

/// One conversation on an engine. See the module docs for prefix reuse and concurrency.
pub struct Session {
    engine: Engine,
    opts: SessionOptions,
    seq: SeqId,
    /// The conversation: every token appended or sampled. The KV sequence holds a prefix
    /// of it (all but a final sampled token, usually).
    tokens: Vec<u32>,
    /// Chat history, when the conversation is driven by `append_chat`.
    history: Vec<Message>,
    /// The chat's tools (`append_chat_with`).
    tools: ChatTools,
    /// Logits after the last token, when the KV holds all of `tokens`.
    logits: Option<Vec<f32>>,
    /// Instead of `logits` after a plain greedy step: only the next token's id was read
    /// back from the device (OutputKind::Argmax).
    next_id: Option<u32>,
    cancel: Arc<AtomicBool>,
    timings: Timings,
    n_evaluated: usize,
    /// The images encoded for this conversation: what its image-row ids stand for.
    images: ImageRows,
    /// The chat history's images, in the order of their markers.
    chat_images: Vec<Arc<EncodedImage>>,
    /// The draft model's sequence following this conversation, where the engine drafts
    /// with one.
    draft_seq: Option<SeqId>,
}

impl Session {
    pub(crate) fn new(engine: Engine, opts: SessionOptions) -> Result<Self> {
        let seq = engine.runner().new_seq();
        let draft_seq = engine.draft_runner().map(|r| r.new_seq());
        Ok(Session {
            engine,
            opts,
            seq,
            tokens: Vec::new(),
            history: Vec::new(),
            tools: ChatTools::default(),
            logits: None,
            next_id: None,
            cancel: Arc::new(AtomicBool::new(false)),
            timings: Timings::default(),
            n_evaluated: 0,
            images: ImageRows::default(),
            chat_images: Vec::new(),
            draft_seq,
        })
    }

    /// The engine this session runs on.
    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    /// Every token of the conversation so far.
    pub fn tokens(&self) -> Vec<u32> {
        self.tokens.clone()
    }

    /// The chat history (`append_chat` messages and the replies generated after them).
    pub fn history(&self) -> &[Message] {
        &self.history
    }

    /// Logits after the last evaluated token (None after a plain greedy `generate` step,
    /// which reads back only the next token's id).
    pub fn logits(&self) -> Option<&[f32]> {
        self.logits.as_deref()
    }

    /// Tokens this session has run through the model so far (prompt and generated; tokens
    /// reused from the KV or prefix cache are not counted).
    pub fn n_evaluated(&self) -> usize {
        self.n_evaluated
    }

    /// A handle that cancels this session's work from another thread.
    pub fn cancel_handle(&self) -> CancelHandle {
        CancelHandle(self.cancel.clone())
    }

    /// Cancels from this thread (see [`CancelHandle::cancel`]).
    pub fn cancel(&self) {
        self.cancel.store(true, Ordering::SeqCst);
    }

    /// Forgets the conversation (the prefix cache may still hold its blocks).
    pub fn reset(&mut self) {
        self.tokens.clear();
        self.history.clear();
        self.tools = ChatTools::default();
        self.images.clear();
        self.chat_images.clear();
        self.logits = None;
        self.next_id = None;
        self.engine.runner().truncate_seq(self.seq, 0);
        if let (Some(r), Some(d)) = (self.engine.draft_runner(), self.draft_seq) {
            r.truncate_seq(d, 0);
        }
    }

    /// Tokenizes `text` (special tokens parsed; BOS first when the model wants one and the
    /// session is empty), appends and evaluates it. Returns the new tokens.
    pub fn append_text(&mut self, text: &str) -> Result<Vec<u32>> {
        let ids = self.encode(text, self.tokens.is_empty())?;
        self.append_tokens(&ids)?;
        Ok(ids)
    }

    fn encode(&self, text: &str, at_start: bool) -> Result<Vec<u32>> {
        let tok = self.engine.tokenizer();
        if at_start {
            tok.encode_prompt(text)
        } else {
            tok.encode(text, false, true)
        }
    }

    /// Adds `messages` to the chat history, renders the whole history with the model's
    /// chat template (generation prompt added) and evaluates what the KV does not hold
    /// yet. Returns the tokens of the whole rendered conversation. The chat keeps the
    /// tools of the last [`append_chat_with`](Self::append_chat_with) (none at first).
    pub fn append_chat(&mut self, messages: &[Message]) -> Result<Vec<u32>> {
        let tools = self.tools.clone();
        self.chat(messages, &[], &tools)
    }

    /// [`append_chat`](Self::append_chat) with tools the model may call: they reach it
    /// through its own template, and the next `generate` parses its calls (into
    /// `Summary::tool_calls` and `Event::tool_calls`) in the template's format. Tool
    /// results go back as `Message::tool(..)` messages with a `tool_call_id`.
    pub fn append_chat_with(&mut self, messages: &[Message], tools: &ChatTools) -> Result<Vec<u32>> {
        self.chat(messages, &[], tools)
    }

    /// Like [`Session::append_chat`], with images: each message's text holds the marker
    /// [`MEDIA_MARKER`] where an image goes, and `images` are the new messages' images in
    /// order (the history's stay as they were). A user message that names no marker gets
    /// one per image in front of its text, as `llama-mtmd-cli` does.
    pub fn append_chat_with_images(&mut self, messages: &[Message], images: &[RgbImage]) -> Result<Vec<u32>> {
        let tools = self.tools.clone();
        self.chat(messages, images, &tools)
    }

    /// Encodes `img` with the engine's vision encoder and appends it as its family's span of
    /// marker tokens and image rows (as llama.cpp's mtmd places an image at its marker).
    /// Returns the span's ids (image rows have ids past the vocabulary).
    pub fn append_image(&mut self, img: &RgbImage) -> Result<Vec<u32>> {
        let enc = self.encode_image(img)?;
        let mut all = self.tokens.clone();
        all.extend_from_slice(&enc.ids);
        self.set_tokens(all)?;
        Ok(enc.ids.clone())
    }

    /// Adds `messages` (with `images` at their markers) to the history, renders it with the
    /// template and `tools`, and evaluates what the KV does not hold yet. With a vision
    /// encoder, the history's markers stand for its images.
    fn chat(&mut self, messages: &[Message], images: &[RgbImage], tools: &ChatTools) -> Result<Vec<u32>> {
        let tpl = self
            .engine
            .chat_template()
            .ok_or_else(|| KilnError::Template("the model has no chat template".into()))?;
        let mut history = self.history.clone();
        let mut new: Vec<Message> = messages.to_vec();
        let named: usize = new.iter().map(|m| m.content.matches(MEDIA_MARKER).count()).sum();
        if named == 0 && !images.is_empty() {
            if let Some(m) = new.iter_mut().rev().find(|m| m.role == "user") {
                m.content = MEDIA_MARKER.repeat(images.len()) + &m.content;
            }
        }
        history.extend(new);
        let json = serde_json::to_value(&history).map_err(|e| KilnError::Template(e.to_string()))?;
        let text = render_chat(tpl, &json, tools, true)?;
        let (ids, encoded) = if images.is_empty() && self.engine.vision().is_none() {
            (self.encode(&text, true)?, Vec::new())
        } else {
            let segments: Vec<&str> = text.split(MEDIA_MARKER).collect();
            if segments.len() - 1 != self.chat_images.len() + images.len() {
                return Err(KilnError::invalid(format!(
                    "{} image markers in the messages for {} images",
                    (segments.len() - 1).saturating_sub(self.chat_images.len()),
                    images.len()
                )));
            }
            let mut encoded = self.chat_images.clone();
            for img in images {
                encoded.push(self.encode_image(img)?);
            }
            let mut ids = self.encode(segments[0], true)?;
            for (seg, img) in segments[1..].iter().zip(&encoded) {
                ids.extend_from_slice(&img.ids);
                ids.extend(self.encode(seg, false)?);
            }
            (ids, encoded)
        };
        self.set_tokens(ids.clone())?;
        self.history = history;
        self.tools = tools.clone();
        self.chat_images = encoded;
        Ok(ids)
    }

    /// Encodes `img` (once per session for the same pixels) and registers its rows.
    fn encode_image(&mut self, img: &RgbImage) -> Result<Arc<EncodedImage>> {
        let enc = self.engine.vision().ok_or_else(|| {
            KilnError::invalid("the model takes no images: load its vision encoder (an mmproj file) with it")
        })?;
        let t0 = Instant::now();
        let n = self.images.len();
        let e = self.images.encode(enc, self.engine.tokenizer(), img)?;
        if self.images.len() > n {
            self.timings.image_n += 1;
            self.timings.image_ms += t0.elapsed().as_secs_f64() * 1e3;
        }
        Ok(e)
    }

    /// Appends `ids` to the conversation and evaluates them (in micro-batches), keeping
    /// the logits of the last one.
    pub fn append_tokens(&mut self, ids: &[u32]) -> Result<()> {
        let mut all = self.tokens.clone();
        all.extend_from_slice(ids);
        self.set_tokens(all)
    }

    /// Makes `target` the conversation, reusing the longest prefix the runner holds and
    /// evaluating the rest. A cancel request stops between micro-batches, leaving the
    /// conversation set and the request pending for `generate` to report.
    fn set_tokens(&mut self, target: Vec<u32>) -> Result<()> {
        let n_ctx = self.engine.n_ctx();
        if target.len() > n_ctx {
            return Err(KilnError::invalid(format!(
                "the prompt has {} tokens, more than the context ({n_ctx})",
                target.len()
            )));
        }
        let n_vocab = self.engine.config().n_vocab;
        if let Some(&bad) = target.iter().find(|&&t| t as usize >= n_vocab && !self.images.contains(t)) {
            return Err(KilnError::invalid(format!("token id {bad} is outside the vocabulary ({n_vocab})")));
        }
        if target.is_empty() {
            self.reset();
            return Ok(());
        }
        if target == self.tokens && self.logits.is_some() {
            return Ok(());
        }
        self.tokens = target;
        self.logits = None;
        self.next_id = None;
        self.prefill()
    }

    /// Evaluates the part of the conversation the KV sequence lacks.
    fn prefill(&mut self) -> Result<()> {
        let t0 = Instant::now();
        let runner = self.engine.runner();
        let n = self.tokens.len();
        let kept = runner.reuse_prefix(self.seq, &self.tokens[..n - 1], Some(&self.images));
        self.timings.prompt_cached += kept;
        let chunk = runner.n_ubatch();
        let mut at = kept;
        while at < n {
            if self.cancel.load(Ordering::SeqCst) {
                break;
            }
            // A run of text tokens, at most a micro-batch, or an image's rows, whole (the
            // runner splits them where it reads them causally; else they are one span).
            let image = self.images.contains(self.tokens[at]);
            let end = run_end(&self.tokens, at, if image { usize::MAX } else { chunk }, Some(&self.images));
            let out = if image {
                let rows = self.images.gather(&self.tokens[at..end], self.engine.config().n_embd)?;
                runner.decode_embd(self.seq, &self.tokens[at..end], &rows, end == n)?
            } else {
                let entries: Vec<Entry> = (at..end)
                    .map(|i| Entry { seq: self.seq, token: self.tokens[i], output: i + 1 == n })
                    .collect();
                runner.decode(&entries, OutputKind::Logits)?
            };
            self.n_evaluated += end - at;
            self.timings.prompt_n += end - at;
            report(
                self.opts.progress.as_ref(),
                Stage::Prompt,
                "prompt",
                (end - kept) as u64,
                (n - kept) as u64,
            );
            if end == n {
                self.logits = Some(out);
                self.next_id = None;
            }
            at = end;
        }
        // The draft model reads the prompt too, so that drafting starts from it.
        if let (Some(r), Some(d)) = (self.engine.draft_runner(), self.draft_seq) {
            if at == n && self.tokens.iter().all(|&t| (t as usize) < r.config().n_vocab) {
                let kept = r.reuse_prefix(d, &self.tokens, None);
                let entries: Vec<Entry> =
                    self.tokens[kept..].iter().map(|&token| Entry { seq: d, token, output: false }).collect();
                for chunk in entries.chunks(r.n_ubatch().max(1)) {
                    r.decode(chunk, OutputKind::Logits)?;
                }
            }
        }
        self.timings.prompt_ms += t0.elapsed().as_secs_f64() * 1e3;
        Ok(())
    }

    /// Drops half the tokens after the first `n_keep` (llama.cpp's context shift).
    fn shift(&mut self, n_keep: usize) -> Result<()> {
        let kv = self.engine.runner().seq_len(self.seq);
        let n_keep = n_keep.min(kv.saturating_sub(1));
        let n_discard = (kv - n_keep) / 2;
        if n_discard == 0 {
            return Err(KilnError::invalid("context shift: nothing to discard"));
        }
        self.engine.runner().shift_seq(self.seq, n_keep, n_discard)?;
        self.tokens.drain(n_keep..n_keep + n_discard);
        Ok(())
    }

    /// Samples up to `opts.max_tokens` tokens, calling `on_event` for each; the callback
    /// can stop early with `ControlFlow::Break`. In a chat (after `append_chat`), the reply
    /// joins the history as an assistant message.
    pub fn generate(
        &mut self,
        opts: &GenerateOptions,
        mut on_event: impl FnMut(&Event) -> ControlFlow<()>,
    ) -> Result<Summary> {
        let n_vocab = self.engine.config().n_vocab;
        let tok = self.engine.tokenizer().clone();
        let mut sampler = Sampler::new(opts.sampler.clone(), n_vocab)?;
        // A chat with tools: the reply is parsed for calls in the template's format, and
        // constrained by their grammar.
        let format = self.engine.chat_template().map(|t| t.tool_caps().format);
        let format = format.filter(|_| !self.history.is_empty() && self.tools.active());
        let mut constraint = match (&opts.grammar, format) {
            (Some(_), Some(_)) => {
                return Err(KilnError::invalid("a grammar cannot constrain a chat reply that may call tools"))
            }
            (Some(g), None) => Some(self.engine.compile_grammar(g)?.constraint()),
            (None, Some(f)) => compile_tool_grammar(&self.engine, f, &self.tools)?.map(|g| g.constraint()),
            (None, None) => None,
        };
        // Image rows are no tokens to penalize (llama.cpp's sampler never sees them).
        for &t in self.tokens.iter().filter(|&&t| (t as usize) < n_vocab) {
            sampler.accept(t);
        }
        // Plain greedy decoding needs only each step's argmax, computed on the device.
        let ids_only = opts.sampler.is_plain_greedy() && opts.logprobs.is_none() && constraint.is_none();
        let ready = self.logits.is_some() || (ids_only && self.next_id.is_some());
        if !ready && !self.tokens.is_empty() && !self.cancel.load(Ordering::SeqCst) {
            self.prefill()?;
        }
        let names = self.tools.callable().iter().map(|t| t.name.clone()).collect();
        let mut calls = format.map(|f| ToolCallParser::new(f).with_names(names));
        let shown = format.map(|f| f.marker_tokens(&tok)).unwrap_or_default();
        let mut detok = Detokenizer::new(tok.clone(), false).with_shown(shown);
        let mut parsed = Parsed::default();
        let mut stop = StopMatcher::new(opts.stop.clone());
        let mut timings = std::mem::take(&mut self.timings);
        // Speculation where the engine drafts, for plain sampling (no grammar, no logprobs).
        let mut spec = Speculator::new(&self.engine, self.draft_seq, &opts.sampler, n_vocab)?
            .filter(|_| constraint.is_none() && opts.logprobs.is_none());
        // Tokens a verified draft decided, not yet emitted: the accepted drafted tokens
        // (already in the KV) and the token after them (not).
        let mut queue: VecDeque<u32> = VecDeque::new();
        let mut t_first: Option<Instant> = None;
        let mut t_last = Instant::now();
        let mut ids = Vec::new();
        let mut text = String::new();
        let mut top = Vec::new();
        let n_ctx = self.engine.n_ctx();
        let engine = self.engine.clone();
        let runner = engine.runner();
        let finish = loop {
            if self.cancel.swap(false, Ordering::SeqCst) {
                break FinishReason::Cancelled;
            }
            if opts.max_tokens.is_some_and(|m| ids.len() >= m) {
                break FinishReason::Length;
            }
            // The next token goes to position `tokens.len()`. Like llama.cpp, a shifting
            // session shifts once that token would take the last free cell, so the same
            // greedy run gives the same text as llama.cpp's `--context-shift`.
            match self.opts.context_shift {
                // A draft never reaches a shift (`Speculator::room`): the queue is empty.
                Some(n_keep) if self.tokens.len() + 1 >= n_ctx => self.shift(n_keep)?,
                None if self.tokens.len() >= n_ctx => break FinishReason::ContextFull,
                _ => {}
            }
            let queued = queue.pop_front();
            let (id, logprob) = match queued.or(self.next_id.take().filter(|_| ids_only)) {
                Some(id) => (id, None),
                None => {
                    let logits = self
                        .logits
                        .as_deref()
                        .ok_or_else(|| KilnError::invalid("nothing to continue from"))?;
                    let lse = opts.logprobs.map(|k| log_probs(logits, k, &mut top));
                    let id = match &mut constraint {
                        Some(c) => c.sample(&mut sampler, logits)?,
                        None => sampler.sample(logits),
                    };
                    (id, lse.map(|lse| logits[id as usize] - lse))
                }
            };
            // A verified draft's tokens were accepted into the sampler as they were decided.
            if queued.is_none() {
                sampler.accept(id);
            }
            if let Some(c) = &mut constraint {
                c.accept(id)?;
            }
            t_last = Instant::now();
            t_first.get_or_insert(t_last);
            ids.push(id);
            self.tokens.push(id);
            self.logits = None;
            let complete = constraint.as_ref().is_some_and(|c| c.is_complete());
            if tok.is_eog(id) && (!opts.ignore_eos || complete) {
                break FinishReason::Eog;
            }
            let piece = detok.push(id);
            let (mut safe, matched) = stop.push(&piece);
            if let Some(p) = &mut calls {
                p.push(&safe, &mut parsed);
                safe = std::mem::take(&mut parsed.content);
            }
            text.push_str(&safe);
            let ev = Event {
                token: id,
                flush: false,
                text: &safe,
                logprob,
                top_logprobs: &top,
                tool_calls: &parsed.tool_calls,
            };
            let flow = on_event(&ev);
            parsed.tool_calls.clear();
            if matched {
                break FinishReason::Stop;
            }
            if flow.is_break() {
                break FinishReason::Cancelled;
            }
            if complete {
                break FinishReason::Eog;
            }
            let last = opts.max_tokens.is_some_and(|m| ids.len() >= m)
                || (self.tokens.len() >= n_ctx && self.opts.context_shift.is_none());
            if last || !queue.is_empty() {
                // Do not spend a forward on logits nobody will read; a queued token is
                // already decided (and this one in the KV).
                continue;
            }
            if let Some(sp) = &mut spec {
                let budget = opts.max_tokens.map_or(usize::MAX, |m| m - ids.len());
                let room = sp.room(self.tokens.len(), n_ctx, self.opts.context_shift.is_some(), budget);
                let drafted = sp.draft(&self.tokens, room, |t| tok.is_eog(t))?;
                if !drafted.is_empty() {
                    let v = self.verify(id, &drafted, ids_only, &mut sampler)?;
                    timings.draft_tokens += drafted.len();
                    timings.accepted_tokens += v.accepted;
                    queue.extend(drafted[..v.accepted].iter().map(|d| d.id));
                    queue.push_back(v.next);
                    continue;
                }
            }
            let kind = if ids_only { OutputKind::Argmax } else { OutputKind::Logits };
            let out = runner.decode(&[Entry { seq: self.seq, token: id, output: true }], kind)?;
            self.n_evaluated += 1;
            if ids_only {
                self.next_id = Some(out[0] as u32);
            } else {
                self.logits = Some(out);
            }
        };
        let mut flushed = String::new();
        if finish != FinishReason::Stop {
            flushed = stop.finish();
            flushed.push_str(&detok.finish());
        }
        let mut tool_calls = Vec::new();
        if let Some(p) = &mut calls {
            p.push(&flushed, &mut parsed);
            tool_calls = p.finish(&mut parsed).tool_calls;
            flushed = std::mem::take(&mut parsed.content);
        }
        if !flushed.is_empty() || !parsed.tool_calls.is_empty() {
            text.push_str(&flushed);
            let ev = Event {
                token: *ids.last().unwrap_or(&0),
                flush: true,
                text: &flushed,
                logprob: None,
                top_logprobs: &[],
                tool_calls: &parsed.tool_calls,
            };
            let _ = on_event(&ev);
        }
        if !self.history.is_empty() {
            let mut reply = Message::assistant(text.clone());
            if !tool_calls.is_empty() {
                reply = reply.with("tool_calls", tool_calls.iter().map(ToolCall::to_openai).collect());
            }
            self.history.push(reply);
        }
        timings.gen_n = ids.len();
        timings.gen_ms = t_first.map_or(0.0, |t| (t_last - t).as_secs_f64() * 1e3);
        let grammar = constraint.map(|c| c.stats().clone());
        Ok(Summary { ids, text, tool_calls, finish_reason: finish, timings, grammar })
    }

    /// Evaluates the last sampled token `id` (the conversation's last, not yet in the KV)
    /// with `draft` after it in one forward, decides how much of the draft the model
    /// accepts, and keeps those tokens' keys and values alone.
    fn verify(
        &mut self,
        id: u32,
        draft: &[Drafted],
        ids_only: bool,
        sampler: &mut Sampler,
    ) -> Result<verify::Verdict> {
        let runner = self.engine.runner();
        let seq = self.seq;
        let entries: Vec<Entry> = std::iter::once(id)
            .chain(draft.iter().map(|d| d.id))
            .map(|token| Entry { seq, token, output: true })
            .collect();
        let kind = if ids_only { OutputKind::Argmax } else { OutputKind::Logits };
        let out = runner.decode(&entries, kind)?;
        self.n_evaluated += entries.len();
        let v = verify::decide(sampler, draft, &out, ids_only, self.engine.config().n_vocab);
        self.n_evaluated += crate::spec::roll_back(runner, seq, &self.tokens, draft, v.accepted)?;
        Ok(v)
    }

    /// Writes the conversation (tokens and chat history) to `path`: a JSON file of format
    /// version [`SESSION_FORMAT_VERSION`], bound to the model file's sha256. The KV cache
    /// is not stored; `restore` recomputes it, bit-identical by batch invariance.
    pub fn save(&self, path: impl AsRef<Path>) -> Result<()> {
        let path = path.as_ref();
        if self.tokens.iter().any(|&t| self.images.contains(t)) {
            return Err(KilnError::invalid(
                "a conversation with images cannot be saved (the file holds tokens only)",
            ));
        }
        let doc = json!({
            "format": "kiln-session",
            "version": SESSION_FORMAT_VERSION,
            "model_sha256": self.engine.model_sha256()?,
            "tokens": self.tokens,
            "history": self.history,
        });
        let tmp = path.with_extension("tmp");
        std::fs::write(&tmp, format!("{doc}\n")).map_err(|e| KilnError::io(&tmp, e))?;
        std::fs::rename(&tmp, path).map_err(|e| KilnError::io(path, e))
    }

    /// Replaces this session's conversation with the one saved in `path` and evaluates it
    /// (reusing what the KV and prefix cache hold). Errors, changing nothing, when the file
    /// is not a session file of a known version or was saved with another model.
    pub fn restore(&mut self, path: impl AsRef<Path>) -> Result<()> {
        let path = path.as_ref();
        let bad = |msg: String| KilnError::invalid(format!("{}: {msg}", path.display()));
        let text = std::fs::read_to_string(path).map_err(|e| KilnError::io(path, e))?;
        let doc: serde_json::Value =
            serde_json::from_str(&text).map_err(|e| bad(format!("not a session file ({e})")))?;
        if doc["format"] != "kiln-session" {
            return Err(bad("not a kiln session file".into()));
        }
        let version = doc["version"].as_u64().unwrap_or(0);
        if version != SESSION_FORMAT_VERSION {
            return Err(bad(format!(
                "session format version {version}, this kiln reads {SESSION_FORMAT_VERSION}"
            )));
        }
        let want = doc["model_sha256"].as_str().unwrap_or("");
        let have = self.engine.model_sha256()?;
        if want != have {
            return Err(bad(format!("saved with model sha256 {want}, but this model is {have}")));
        }
        let tokens: Vec<u32> =
            serde_json::from_value(doc["tokens"].clone()).map_err(|e| bad(format!("tokens: {e}")))?;
        let history: Vec<Message> =
            serde_json::from_value(doc["history"].clone()).map_err(|e| bad(format!("history: {e}")))?;
        self.set_tokens(tokens)?;
        self.history = history;
        Ok(())
    }
}

/// Log-sum-exp of `logits`, and the `k` best tokens' log-probabilities into `top`.
fn log_probs(logits: &[f32], k: usize, top: &mut Vec<(u32, f32)>) -> f32 {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let sum: f64 = logits.iter().map(|&l| ((l - max) as f64).exp()).sum();
    let lse = max + sum.ln() as f32;
    top.clear();
    if k > 0 {
        let mut idx: Vec<u32> = (0..logits.len() as u32).collect();
        let k = k.min(idx.len());
        idx.select_nth_unstable_by(k - 1, |&a, &b| logits[b as usize].total_cmp(&logits[a as usize]));
        idx.truncate(k);
        idx.sort_by(|&a, &b| logits[b as usize].total_cmp(&logits[a as usize]).then(a.cmp(&b)));
        top.extend(idx.iter().map(|&i| (i, logits[i as usize] - lse)));
    }
    lse
}

impl Drop for Session {
    fn drop(&mut self) {
        self.engine.runner().free_seq(self.seq);
        if let (Some(r), Some(d)) = (self.engine.draft_runner(), self.draft_seq) {
            r.free_seq(d);
        }
    }
}
