//! Continuous batching. One thread owns the model's runner (the forward is CPU-bound and
//! blocking); requests arrive over a bounded channel (its capacity is the waiting queue).
//! Each step builds ONE `decode` call across every active sequence: one token for each
//! running request plus chunks of new prompts up to the step's token budget (`-b`); then
//! it samples, streams the pieces back over per-request channels, and admits or retires
//! requests. Every kernel of the forward computes a token's row the same way whatever the
//! batch (DESIGN.md), so a step may be any size and greedy outputs stay batch invariant.
//! A finished sequence stays in the KV pool as a cached prefix until its place is needed.
//!
//! Where the engine speculates (a draft model or prompt lookup), every decoding request
//! that may (no grammar, no logprobs, no images) first gets a draft: all of them drafted
//! together (one batched draft-model forward per drafted position), then each one's last
//! token and draft join the step's forward beside the others' single tokens, every row
//! wanted. `kiln::spec` decides what each request accepts and rolls its KV back to it.

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::mpsc::{Receiver, RecvTimeoutError, TryRecvError};
use std::sync::Arc;
use std::time::{Duration, Instant};

use kiln::embed::{embed_batch, group_end, normalize, Pooling};
use kiln::engine::Engine;
use kiln::grammar::{CompiledGrammar, Constraint};
use kiln::model::{Entry, OutputKind, SeqId};
use kiln::sample::{Sampler, SamplerParams, StopMatcher};
use kiln::spec::{verify, Drafted, Speculator};
use kiln::tokenizer::Detokenizer;
use kiln::vision::prompt::run_end;
use kiln::vision::ImageRows;
use tokio::sync::{mpsc::UnboundedSender, oneshot};

use crate::state::Shared;

/// How long a drain lets running requests finish before cancelling them (SIGTERM must
/// end within 5 s).
const DRAIN_GRACE: Duration = Duration::from_millis(3500);

pub struct GenJob {
    pub prompt: Arc<Vec<u32>>,
    /// What the prompt's image-row ids stand for.
    pub images: Option<Arc<ImageRows>>,
    pub max_tokens: usize,
    pub params: SamplerParams,
    pub stop: Vec<String>,
    pub ignore_eos: bool,
    /// Alternatives to report per token; `None`: no logprobs.
    pub logprobs: Option<usize>,
    /// Control tokens whose text the reply shows (tool-call markers its parser needs).
    pub shown: Vec<u32>,
    /// What the output must match (`response_format`, `grammar`, tool calls).
    pub grammar: Option<CompiledGrammar>,
    /// Choice index within the request.
    pub index: usize,
    pub events: UnboundedSender<Event>,
    pub enqueued: Instant,
}

pub struct EmbedJob {
    pub inputs: Vec<Vec<u32>>,
    /// How rows are pooled (`Rank`: each input's classification scores).
    pub pooling: Pooling,
    /// Scale each vector to unit length (embeddings; never a reranker's scores).
    pub normalize: bool,
    pub reply: oneshot::Sender<Result<Vec<Vec<f32>>, String>>,
}

pub enum Job {
    Gen(Box<GenJob>),
    Embed(EmbedJob),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Finish {
    /// End-of-generation token or stop string.
    Stop,
    /// `max_tokens` or the context.
    Length,
}

impl Finish {
    pub fn as_openai(self) -> &'static str {
        match self {
            Finish::Stop => "stop",
            Finish::Length => "length",
        }
    }
}

#[derive(Clone, Debug)]
pub struct Logprob {
    pub token: u32,
    pub logprob: f32,
    pub top: Vec<(u32, f32)>,
}

#[derive(Debug)]
pub enum Event {
    /// Text that is now safe to emit (may be empty), and the sampled token's logprob.
    Token {
        index: usize,
        text: String,
        logprob: Option<Logprob>,
    },
    Done {
        index: usize,
        finish: Finish,
        prompt_tokens: usize,
        completion_tokens: usize,
        /// Tokens drafted for this choice, and how many of them the model accepted.
        draft_tokens: usize,
        accepted_tokens: usize,
    },
    Error {
        index: usize,
        message: String,
    },
}

struct Slot {
    job: GenJob,
    seq: SeqId,
    /// Prompt plus sampled tokens; `tokens[..n_eval]` are in the KV cache.
    tokens: Vec<u32>,
    n_eval: usize,
    n_gen: usize,
    sampler: Sampler,
    /// The grammar's state, when the output is constrained (the same function picks the
    /// token as in `Session::generate`).
    constraint: Option<Constraint>,
    /// The sampler would only take the argmax (`SamplerParams::is_plain_greedy`) and no
    /// grammar checks it: the device's argmax is the token, only the id leaves it.
    argmax: bool,
    detok: Detokenizer,
    stop: StopMatcher,
    first_token: bool,
    /// Entries this slot contributes to the current step.
    feeding: usize,
    /// The draft model's sequence following this one's (kept with it while idle).
    draft_seq: Option<SeqId>,
    /// How this request drafts; `None`: it decodes one token a step.
    spec: Option<Speculator>,
    /// This step's draft, verified after `tokens`' last token.
    draft: Vec<Drafted>,
    n_drafted: usize,
    n_accepted: usize,
}

struct EmbedWork {
    job: EmbedJob,
    done: Vec<Vec<f32>>,
}

/// A finished sequence whose KV entries are kept for prefix reuse.
struct Idle {
    seq: SeqId,
    draft_seq: Option<SeqId>,
    tokens: Vec<u32>,
    last_used: u64,
}

pub struct Scheduler {
    engine: Engine,
    rx: Receiver<Job>,
    shared: Arc<Shared>,
    parallel: usize,
    n_ctx: usize,
    /// Most entries in one step: every running request's decode token, then prompt chunks.
    /// At least `parallel`, so every running request decodes each step and every prompt
    /// being evaluated gets at least one token.
    step_tokens: usize,
    slots: Vec<Slot>,
    embeds: VecDeque<EmbedWork>,
    idle: Vec<Idle>,
    clock: u64,
}

impl Scheduler {
    pub fn new(
        engine: Engine,
        rx: Receiver<Job>,
        shared: Arc<Shared>,
        parallel: usize,
        n_ctx: usize,
        step_tokens: usize,
    ) -> Self {
        Scheduler {
            engine,
            rx,
            shared,
            parallel,
            n_ctx,
            step_tokens: step_tokens.max(parallel).max(1),
            slots: Vec::new(),
            embeds: VecDeque::new(),
            idle: Vec::new(),
            clock: 0,
        }
    }

    fn active(&self) -> usize {
        self.slots.len() + self.embeds.len()
    }

    /// Runs until the channel closes, or a drain has finished.
    pub fn run(mut self) {
        let mut drain_started: Option<Instant> = None;
        loop {
            let draining = self.shared.draining.load(Ordering::SeqCst);
            if draining {
                let t0 = *drain_started.get_or_insert_with(Instant::now);
                self.reject_queued();
                if t0.elapsed() >= DRAIN_GRACE {
                    self.cancel_all("the server is shutting down");
                }
                if self.active() == 0 {
                    break;
                }
            } else {
                // Admit while there is room; block briefly only when there is nothing to do.
                while self.active() < self.parallel {
                    let job = if self.active() == 0 {
                        match self.rx.recv_timeout(Duration::from_millis(50)) {
                            Ok(j) => j,
                            Err(RecvTimeoutError::Timeout) => break,
                            Err(RecvTimeoutError::Disconnected) => return self.shutdown(),
                        }
                    } else {
                        match self.rx.try_recv() {
                            Ok(j) => j,
                            Err(TryRecvError::Empty) => break,
                            Err(TryRecvError::Disconnected) => return self.shutdown(),
                        }
                    };
                    self.shared.metrics.waiting.fetch_sub(1, Ordering::Relaxed);
                    self.admit(job);
                }
            }
            self.retire_cancelled();
            self.shared.metrics.running.store(self.active(), Ordering::Relaxed);
            if !self.slots.is_empty() {
                self.step();
            }
            if !self.embeds.is_empty() {
                self.embed_step();
            }
            let kv = self.engine.runner().kv_usage();
            self.shared.metrics.kv_usage.store(kv.to_bits(), Ordering::Relaxed);
        }
        self.shutdown();
    }

    fn shutdown(mut self) {
        self.cancel_all("the server is shutting down");
        for i in std::mem::take(&mut self.idle) {
            self.release(i.seq, i.draft_seq);
        }
        self.shared.metrics.running.store(0, Ordering::Relaxed);
    }

    fn reject_queued(&mut self) {
        while let Ok(job) = self.rx.try_recv() {
            self.shared.metrics.waiting.fetch_sub(1, Ordering::Relaxed);
            match job {
                Job::Gen(j) => {
                    let _ = j
                        .events
                        .send(Event::Error { index: j.index, message: "the server is shutting down".into() });
                }
                Job::Embed(j) => {
                    let _ = j.reply.send(Err("the server is shutting down".into()));
                }
            }
        }
    }

    fn cancel_all(&mut self, why: &str) {
        for s in std::mem::take(&mut self.slots) {
            let _ = s.job.events.send(Event::Error { index: s.job.index, message: why.into() });
            self.release(s.seq, s.draft_seq);
        }
        for e in std::mem::take(&mut self.embeds) {
            let _ = e.job.reply.send(Err(why.into()));
        }
    }

    /// Makes room for one more live sequence by freeing the least recently used idle one.
    fn evict_if_full(&mut self) {
        if self.slots.len() + self.embeds.len() + self.idle.len() >= self.parallel {
            if let Some(i) = (0..self.idle.len()).min_by_key(|&i| self.idle[i].last_used) {
                let idle = self.idle.swap_remove(i);
                self.release(idle.seq, idle.draft_seq);
            }
        }
    }

    /// Frees a sequence and the draft model's sequence following it.
    fn release(&self, seq: SeqId, draft_seq: Option<SeqId>) {
        self.engine.runner().free_seq(seq);
        if let (Some(r), Some(d)) = (self.engine.draft_runner(), draft_seq) {
            r.free_seq(d);
        }
    }

    fn admit(&mut self, job: Job) {
        let job = match job {
            Job::Gen(j) => *j,
            Job::Embed(job) => {
                self.evict_if_full();
                self.embeds.push_back(EmbedWork { done: Vec::with_capacity(job.inputs.len()), job });
                return;
            }
        };
        if job.events.is_closed() {
            return;
        }
        let n_vocab = self.engine.config().n_vocab;
        let mut sampler = match Sampler::new(job.params.clone(), n_vocab) {
            Ok(s) => s,
            Err(e) => {
                let _ = job.events.send(Event::Error { index: job.index, message: e.to_string() });
                return;
            }
        };
        // Image rows are no tokens to penalize.
        for &t in job.prompt.iter().filter(|&&t| (t as usize) < n_vocab) {
            sampler.accept(t);
        }
        // Prefix reuse: continue the idle sequence sharing the longest prefix (token
        // granularity), else a new one; the runner may offer a longer whole-block prefix
        // from its prefix cache. The last prompt token is always evaluated, for its logits.
        let best = self
            .idle
            .iter()
            .enumerate()
            .map(|(i, idle)| (common_prefix(&idle.tokens, &job.prompt), i))
            .max_by_key(|&(n, i)| (n, std::cmp::Reverse(i)));
        let (seq, mut draft_seq) = match best {
            Some((n, i)) if n > 0 => {
                let idle = self.idle.swap_remove(i);
                (idle.seq, idle.draft_seq)
            }
            _ => {
                self.evict_if_full();
                (self.engine.runner().new_seq(), None)
            }
        };
        // Speculation where its outputs are the plain decode's (grammar and logprobs need
        // each token's logits before the next is chosen; image rows are no tokens to draft).
        let speculates = job.grammar.is_none() && job.logprobs.is_none() && job.images.is_none();
        if speculates && draft_seq.is_none() {
            draft_seq = self.engine.draft_runner().map(|r| r.new_seq());
        }
        let spec = match speculates {
            true => match Speculator::new(&self.engine, draft_seq, &job.params, n_vocab) {
                Ok(s) => s,
                Err(e) => {
                    let _ = job.events.send(Event::Error { index: job.index, message: e.to_string() });
                    self.release(seq, draft_seq);
                    return;
                }
            },
            false => None,
        };
        let runner = self.engine.runner();
        let kept = runner.reuse_prefix(seq, &job.prompt, job.images.as_deref());
        if kept >= job.prompt.len() {
            runner.truncate_seq(seq, job.prompt.len() - 1);
        }
        // Truncation may drop a shared partial block (copy-on-write by recomputation).
        let n_eval = runner.seq_len(seq);
        self.shared.metrics.prompt_tokens_cached.fetch_add(n_eval as u64, Ordering::Relaxed);
        self.shared.metrics.prompt_tokens.fetch_add(job.prompt.len() as u64, Ordering::Relaxed);
        let tok = self.engine.tokenizer().clone();
        self.slots.push(Slot {
            tokens: job.prompt.to_vec(),
            seq,
            n_eval,
            n_gen: 0,
            argmax: job.params.is_plain_greedy() && job.grammar.is_none(),
            constraint: job.grammar.as_ref().map(CompiledGrammar::constraint),
            sampler,
            detok: Detokenizer::new(tok, false).with_shown(job.shown.clone()),
            stop: StopMatcher::new(job.stop.clone()),
            first_token: true,
            feeding: 0,
            draft_seq,
            spec,
            draft: Vec::new(),
            n_drafted: 0,
            n_accepted: 0,
            job,
        });
    }

    fn retire_cancelled(&mut self) {
        let mut i = 0;
        while i < self.slots.len() {
            if self.slots[i].job.events.is_closed() {
                let s = self.slots.swap_remove(i);
                self.keep_idle(&s);
            } else {
                i += 1;
            }
        }
        self.embeds.retain(|e| !e.job.reply.is_closed());
    }

    /// Keeps a finished slot's sequences for prefix reuse. Its KV may hold more than its
    /// tokens (a verified draft past a stop): prefix reuse goes by what the KV holds.
    fn keep_idle(&mut self, s: &Slot) {
        self.clock += 1;
        let tokens = s.tokens[..s.n_eval.min(s.tokens.len())].to_vec();
        self.idle.push(Idle { seq: s.seq, draft_seq: s.draft_seq, tokens, last_used: self.clock });
    }

    /// Evaluates the image rows next in each prompt, one image run per slot (each its own
    /// forward: the rows are inputs, not tokens); a slot whose forward fails is dropped with
    /// an error.
    fn feed_images(&mut self) {
        let runner = self.engine.runner();
        let d = self.engine.config().n_embd;
        let mut i = 0;
        while i < self.slots.len() {
            let s = &mut self.slots[i];
            let Some(images) = s.job.images.clone() else {
                i += 1;
                continue;
            };
            let mut failed = None;
            while s.n_eval < s.tokens.len() && images.contains(s.tokens[s.n_eval]) {
                let end = run_end(&s.tokens, s.n_eval, usize::MAX, Some(&images));
                let ids = &s.tokens[s.n_eval..end];
                let r = images.gather(ids, d).and_then(|rows| runner.decode_embd(s.seq, ids, &rows, false));
                match r {
                    Ok(_) => s.n_eval = end,
                    Err(e) => {
                        failed = Some(e);
                        break;
                    }
                }
            }
            if let Some(e) = failed {
                let s = self.slots.swap_remove(i);
                let _ = s
                    .job
                    .events
                    .send(Event::Error { index: s.job.index, message: format!("decode failed: {e}") });
                self.release(s.seq, s.draft_seq);
            } else {
                i += 1;
            }
        }
    }

    /// Drafts for every slot that decodes this step and speculates, all together; each
    /// draft fits the slot's context and `max_tokens`, and all of them the step's budget
    /// beside one token per decoding slot. A failed draft forward drafts nothing (the
    /// step decodes one token per slot instead: drafts only ever save time).
    fn draft(&mut self) {
        let n_ctx = self.n_ctx;
        let decoding = |s: &Slot| s.tokens.len() - s.n_eval == 1;
        let mut spare = self.step_tokens.saturating_sub(self.slots.iter().filter(|s| decoding(s)).count());
        let mut batch = Vec::new();
        let mut at = Vec::new();
        for (i, s) in self.slots.iter_mut().enumerate() {
            s.draft.clear();
            if !decoding(s) {
                continue;
            }
            let Some(sp) = &mut s.spec else { continue };
            let room = sp.room(s.tokens.len(), n_ctx, false, s.job.max_tokens - s.n_gen).min(spare);
            spare -= room;
            batch.push((sp, &s.tokens[..], room));
            at.push(i);
        }
        if batch.is_empty() {
            return;
        }
        let tok = self.engine.tokenizer().clone();
        match Speculator::draft_all(&mut batch, |t| tok.is_eog(t)) {
            Ok(drafts) => {
                for (i, d) in at.into_iter().zip(drafts) {
                    self.slots[i].draft = d;
                }
            }
            Err(e) => eprintln!("kiln: drafting failed, decoding without drafts this step: {e}"),
        }
    }

    /// One batched forward over every active generation.
    fn step(&mut self) {
        self.feed_images();
        let t0 = Instant::now();
        self.draft();
        let t_draft = Instant::now();
        // Decode tokens (and drafts) first, then prompt chunks in arrival order with what
        // the budget leaves.
        let budget = self.step_tokens;
        let n = self.slots.len();
        let mut order: Vec<usize> = (0..n).collect();
        order.sort_by_key(|&i| {
            let s = &self.slots[i];
            let prompt = s.tokens.len() - s.n_eval > 1;
            (prompt, prompt.then_some(s.job.enqueued))
        });
        let mut entries = Vec::with_capacity(budget.min(n + 64));
        // Each slot with outputs this step, and how many rows it gets.
        let mut owners = Vec::with_capacity(n);
        for &i in &order {
            let s = &mut self.slots[i];
            // Up to the next image rows (fed by the next step's `feed_images`).
            let room = budget - entries.len();
            let take = match (&s.job.images, s.n_eval < s.tokens.len()) {
                (Some(images), true) => run_end(&s.tokens, s.n_eval, room, Some(images)) - s.n_eval,
                _ => (s.tokens.len() - s.n_eval).min(room),
            };
            s.feeding = take;
            for pos in s.n_eval..s.n_eval + take {
                let output = pos + 1 == s.tokens.len();
                entries.push(Entry { seq: s.seq, token: s.tokens[pos], output });
                if output {
                    owners.push((i, 1 + s.draft.len()));
                }
            }
            if take > 0 && s.n_eval + take == s.tokens.len() {
                entries.extend(s.draft.iter().map(|d| Entry { seq: s.seq, token: d.id, output: true }));
                s.feeding += s.draft.len();
            } else {
                s.draft.clear();
            }
        }
        if entries.is_empty() {
            return;
        }
        let runner = self.engine.runner();
        self.shared.metrics.observe_batch(self.slots.iter().filter(|s| s.feeding > 0).count());
        let t_fwd = Instant::now();
        // Plain greedy rows without logprobs need only their ids back from the device.
        let ids_only =
            owners.iter().all(|&(i, _)| self.slots[i].argmax && self.slots[i].job.logprobs.is_none());
        let kind = if ids_only { OutputKind::Argmax } else { OutputKind::Logits };
        let out = match runner.decode(&entries, kind) {
            Ok(out) => out,
            Err(e) => {
                // Not the clients' fault: fail the requests of this step, keep the others.
                let msg = format!("decode failed: {e}");
                let mut i = 0;
                while i < self.slots.len() {
                    if self.slots[i].feeding > 0 {
                        let s = self.slots.swap_remove(i);
                        let _ = s.job.events.send(Event::Error { index: s.job.index, message: msg.clone() });
                        self.release(s.seq, s.draft_seq);
                    } else {
                        i += 1;
                    }
                }
                return;
            }
        };
        let t_sample = Instant::now();
        for s in &mut self.slots {
            s.n_eval += s.feeding;
            s.feeding = 0;
        }
        let n_vocab = self.engine.config().n_vocab;
        let width = if ids_only { 1 } else { n_vocab };
        let mut finished = Vec::new();
        let mut row = 0;
        for &(i, rows) in &owners {
            let out = &out[row * width..(row + rows) * width];
            row += rows;
            let done = if rows > 1 {
                self.accept_draft(i, out, ids_only)
            } else if ids_only {
                self.sample_one(i, &[], Some(out[0] as u32))
            } else {
                self.sample_one(i, out, None)
            };
            if done {
                finished.push(i);
            }
        }
        finished.sort_unstable_by(|a, b| b.cmp(a));
        for i in finished {
            let s = self.slots.swap_remove(i);
            self.keep_idle(&s);
        }
        let end = Instant::now();
        let phases = [t_fwd - t_draft, t_draft - t0, t_sample - t_fwd, end - t_sample];
        self.shared.metrics.observe_step(entries.len(), phases);
    }

    /// Decides slot `i`'s verified draft from its rows `out` (the last token's and each
    /// drafted token's: ids or logits), rolls its KV back to the accepted tokens and streams
    /// them and the token after them; true when it finished.
    fn accept_draft(&mut self, i: usize, out: &[f32], ids: bool) -> bool {
        let n_vocab = self.engine.config().n_vocab;
        let runner = self.engine.runner();
        let s = &mut self.slots[i];
        let draft = std::mem::take(&mut s.draft);
        let v = verify::decide(&mut s.sampler, &draft, out, ids, n_vocab);
        // The KV held the context before this step, the last token and the whole draft.
        s.n_eval -= draft.len();
        if let Err(e) = kiln::spec::roll_back(runner, s.seq, &s.tokens, &draft, v.accepted) {
            let _ = s
                .job
                .events
                .send(Event::Error { index: s.job.index, message: format!("decode failed: {e}") });
            return true;
        }
        s.n_eval += v.accepted;
        s.n_drafted += draft.len();
        s.n_accepted += v.accepted;
        let m = &self.shared.metrics;
        m.draft_tokens.fetch_add(draft.len() as u64, Ordering::Relaxed);
        m.accepted_tokens.fetch_add(v.accepted as u64, Ordering::Relaxed);
        let decided = draft[..v.accepted].iter().map(|d| d.id).chain(std::iter::once(v.next));
        decided.into_iter().any(|id| self.emit(i, id, None))
    }

    /// Samples slot `i`'s next token from `logits` (or takes `id`, the device's argmax) and
    /// streams it; true when it finished.
    fn sample_one(&mut self, i: usize, logits: &[f32], id: Option<u32>) -> bool {
        let s = &mut self.slots[i];
        let lp = s.job.logprobs.map(|n| logprob(logits, n));
        let picked = match (id, &mut s.constraint) {
            (Some(id), _) => Ok(id),
            // Plain greedy samplers take the argmax of the logits (`kiln::sample::argmax`), a
            // grammar then checks that one token.
            (None, Some(c)) => c.sample(&mut s.sampler, logits),
            (None, None) => Ok(s.sampler.sample(logits)),
        };
        let picked = picked.and_then(|id| s.constraint.as_mut().map_or(Ok(()), |c| c.accept(id)).map(|_| id));
        let id = match picked {
            Ok(id) => id,
            Err(e) => {
                let _ = s.job.events.send(Event::Error { index: s.job.index, message: e.to_string() });
                return true;
            }
        };
        s.sampler.accept(id);
        let lp = lp.map(|(lse, top)| Logprob { token: id, logprob: logits[id as usize] - lse, top });
        self.emit(i, id, lp)
    }

    /// Streams slot `i`'s next token `id` (already accepted into its sampler and grammar);
    /// true when it finished.
    fn emit(&mut self, i: usize, id: u32, lp: Option<Logprob>) -> bool {
        let n_ctx = self.n_ctx;
        let tok = self.engine.tokenizer().clone();
        let s = &mut self.slots[i];
        if s.first_token {
            s.first_token = false;
            self.shared.metrics.observe_ttft(s.job.enqueued.elapsed().as_secs_f64());
        }
        // A complete grammar allows nothing more: the reply ends here.
        let complete = s.constraint.as_ref().is_some_and(Constraint::is_complete);
        s.n_gen += 1;
        self.shared.metrics.generation_tokens.fetch_add(1, Ordering::Relaxed);
        let index = s.job.index;
        let finish = if tok.is_eog(id) && (!s.job.ignore_eos || complete) {
            Some(Finish::Stop)
        } else {
            let piece = s.detok.push(id);
            let (text, matched) = s.stop.push(&piece);
            let _ = s.job.events.send(Event::Token { index, text, logprob: lp });
            if matched || complete {
                Some(Finish::Stop)
            } else if s.n_gen >= s.job.max_tokens || s.tokens.len() + 1 > n_ctx {
                Some(Finish::Length)
            } else {
                s.tokens.push(id);
                None
            }
        };
        let Some(finish) = finish else { return false };
        if !s.stop.matched() {
            let mut rest = s.stop.finish();
            rest.push_str(&s.detok.finish());
            if !rest.is_empty() {
                let _ = s.job.events.send(Event::Token { index, text: rest, logprob: None });
            }
        }
        let _ = s.job.events.send(Event::Done {
            index,
            finish,
            prompt_tokens: s.job.prompt.len(),
            completion_tokens: s.n_gen,
            draft_tokens: s.n_drafted,
            accepted_tokens: s.n_accepted,
        });
        true
    }

    /// Embeds the next inputs of the oldest embedding request: as many whole inputs as one
    /// forward takes (`embed::group_end`), so long batches do not stall the streams.
    fn embed_step(&mut self) {
        let Some(work) = self.embeds.front_mut() else { return };
        let start = work.done.len();
        let end = group_end(self.engine.runner(), &work.job.inputs, start);
        let inputs: Vec<&[u32]> = work.job.inputs[start..end].iter().map(Vec::as_slice).collect();
        let n: usize = inputs.iter().map(|i| i.len()).sum();
        // The library's pooling, so the vectors equal `kiln embed` / `kiln rerank`'s.
        let res = embed_batch(&self.engine, &inputs, work.job.pooling);
        self.shared.metrics.prompt_tokens.fetch_add(n as u64, Ordering::Relaxed);
        match res {
            Ok(rows) => {
                for mut v in rows.into_iter().map(|r| r.into_iter().next().unwrap_or_default()) {
                    if work.job.normalize {
                        normalize(&mut v);
                    }
                    work.done.push(v);
                }
            }
            Err(e) => {
                if let Some(w) = self.embeds.pop_front() {
                    let _ = w.job.reply.send(Err(format!("embedding failed: {e}")));
                }
                return;
            }
        }
        if work.done.len() == work.job.inputs.len() {
            if let Some(w) = self.embeds.pop_front() {
                let _ = w.job.reply.send(Ok(w.done));
            }
        }
    }
}

fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

/// Log-softmax of the raw logits (as OpenAI reports them, before sampling filters): the
/// log-sum-exp and the `n` most likely tokens with their logprobs.
fn logprob(logits: &[f32], n: usize) -> (f32, Vec<(u32, f32)>) {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let sum: f64 = logits.iter().map(|&l| ((l - max) as f64).exp()).sum();
    let lse = max as f64 + sum.ln();
    let mut idx: Vec<u32> = (0..logits.len() as u32).collect();
    let n = n.min(idx.len());
    let by_logit = |a: &u32, b: &u32| logits[*b as usize].total_cmp(&logits[*a as usize]).then(a.cmp(b));
    if n > 0 && n < idx.len() {
        idx.select_nth_unstable_by(n - 1, by_logit);
    }
    idx.truncate(n);
    idx.sort_by(by_logit);
    let top = idx.into_iter().map(|i| (i, (logits[i as usize] as f64 - lse) as f32)).collect();
    (lse as f32, top)
}
