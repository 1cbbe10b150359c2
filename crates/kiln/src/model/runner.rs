//! `Runner`: a model bound to one backend, its KV block pool and scratch, behind an
//! object-safe trait so the engine, sessions and server need not know the backend type.

use std::sync::Mutex;

use super::forward::{Model, OutputKind, Scratch, UBatch};
use super::ModelConfig;
use crate::backend::{Backend, IdsTicket};
use crate::error::{KilnError, Result};
use crate::kv::{prefix, PrefixCache, BLOCK_SIZE};
use crate::kv::{BlockTable, KvPool, KvTypes};
use crate::vision::ImageRows;

/// A sequence in the runner's KV pool.
pub type SeqId = u32;

/// One token appended to a sequence; `output` asks for its logits (or hidden state).
#[derive(Clone, Copy, Debug)]
pub struct Entry {
    pub seq: SeqId,
    pub token: u32,
    pub output: bool,
}

pub trait Runner: Send + Sync {
    fn config(&self) -> &ModelConfig;
    fn backend_name(&self) -> String;
    /// Largest micro-batch the forward takes at once.
    fn n_ubatch(&self) -> usize;
    /// Total KV slots.
    fn n_slots(&self) -> usize;
    fn new_seq(&self) -> SeqId;
    fn free_seq(&self, seq: SeqId);
    /// Positions held by `seq`.
    fn seq_len(&self, seq: SeqId) -> usize;
    /// The tokens whose keys and values `seq` holds.
    fn seq_tokens(&self, seq: SeqId) -> Vec<u32>;
    /// Forgets positions `n..` of `seq`. When position `n` falls inside a block another
    /// sequence or the prefix cache shares, that block is dropped too (copy-on-write by
    /// recomputation), so `seq_len` may end up below `n`.
    fn truncate_seq(&self, seq: SeqId, n: usize);
    /// Makes `seq` hold the longest prefix of `tokens` available without computing: its
    /// own common prefix with `tokens`, or a longer whole-block prefix from the prefix
    /// cache. Image-row ids of `images` are matched by their rows' values
    /// ([`prefix::row_key`]), other ids as tokens. Returns the positions kept; the caller
    /// evaluates `tokens[kept..]`.
    fn reuse_prefix(&self, seq: SeqId, tokens: &[u32], images: Option<&ImageRows>) -> usize;
    /// Context shift: drops positions `n_keep..n_keep + n_discard` of `seq` and moves the
    /// later ones down, their cached keys rotated to the new positions (as llama.cpp does:
    /// nothing is recomputed, so those keys and values still reflect the dropped tokens).
    fn shift_seq(&self, seq: SeqId, n_keep: usize, n_discard: usize) -> Result<()>;
    /// Appends `entries` to their sequences (in order) and runs the forward over them,
    /// `n_ubatch` at a time. Returns the outputs of the entries marked `output`, in order,
    /// each `n_vocab` (logits) or `n_embd` (hidden) wide. On error nothing is appended.
    fn decode(&self, entries: &[Entry], kind: OutputKind) -> Result<Vec<f32>>;
    /// Appends positions to `seq` whose inputs are the rows of `embd` (`ids.len()` rows of
    /// `n_embd`: an image's encoded rows) instead of token embeddings. `ids` name the
    /// positions (any values; images use ids past the vocabulary derived from their pixels'
    /// hash); prefix reuse tells them apart by id and row values ([`prefix::row_key`]).
    /// Returns the last row's logits when `output`, else nothing.
    /// Where the runner reads input rows bidirectionally
    /// ([`ModelRunner::with_bidirectional_embd`]), the rows of one call are one span that
    /// attends to itself whole, in one micro-batch (an error when it exceeds `n_ubatch`):
    /// a call holds one image's rows (or the rest of them after a reused prefix).
    /// On error nothing is appended.
    fn decode_embd(&self, seq: SeqId, ids: &[u32], embd: &[f32], output: bool) -> Result<Vec<f32>>;
    /// Fraction of KV blocks in use (blocks held only by the prefix cache count as used).
    fn kv_usage(&self) -> f32;
    /// Blocks the prefix cache names now, and the most it may name.
    fn prefix_cache_blocks(&self) -> (usize, usize);
    /// How the KV cache stores keys and values.
    fn kv_types(&self) -> KvTypes;
    /// Checks the KV bookkeeping (for tests): every block's references are its sequences'
    /// and the prefix cache's, the free list holds exactly the unreferenced blocks, and each
    /// sequence holds blocks for its tokens and no more.
    fn check_kv(&self) -> std::result::Result<(), String>;
    /// Bytes of KV cache one token takes (all layers, K and V).
    fn kv_bytes_per_token(&self) -> usize {
        self.kv_types().bytes_per_token(self.config().n_layer, self.config().kv_dim())
    }
}

/// One sequence: its block table, what its positions hold (their prefix-cache keys: a
/// token's id, or an input row's id and hash), and the keys of its full blocks as the prefix
/// cache knows them.
#[derive(Default)]
struct Seq {
    table: BlockTable,
    keys: Vec<u64>,
    /// `chain[i]`: prefix-cache key of full block `i` (computed up to `n_tokens / 32`).
    chain: Vec<u64>,
    /// Blocks from this index on hold shifted keys and values, which depend on dropped
    /// tokens: they are never offered to the prefix cache.
    shifted_from: Option<usize>,
}

struct State<B: Backend> {
    kv: KvPool<B>,
    scratch: Scratch<B>,
    seqs: Vec<Option<Seq>>,
    cache: PrefixCache,
    /// A greedy step recorded ahead of the caller's asking for it.
    lookahead: Option<Lookahead>,
    /// The model's attention is causal (else blocks are never shared).
    causal: bool,
    /// The model keeps convolution states, which exist only at block ends and after each
    /// sequence's last decoded position (`model::block::conv`).
    recurrent: bool,
}

/// The next greedy step of `seq`, recorded and submitted before the caller had the token
/// it embeds (the last step's id, on the device): taken when the caller then asks for
/// exactly that token at `pos`, else dropped. Its KV reservation is beyond `n_tokens`.
struct Lookahead {
    seq: SeqId,
    pos: usize,
    token: u32,
    ids: IdsTicket,
}

impl<B: Backend> State<B> {
    fn seq_mut(&mut self, seq: SeqId) -> Option<&mut Seq> {
        self.seqs.get_mut(seq as usize).and_then(Option::as_mut)
    }

    /// Truncates with copy-on-write by recomputation: a kept partial block that another
    /// sequence also references is dropped rather than written into later. One only the
    /// prefix cache holds beside this sequence (which filled it, then rolled back into it:
    /// a rejected draft) leaves the cache instead, and is kept without a copy. A recurrent
    /// model keeps whole blocks only (its state inside a block is gone once later positions
    /// ran).
    fn truncate(&mut self, seq: SeqId, n: usize) {
        let Some(s) = self.seqs.get_mut(seq as usize).and_then(Option::as_mut) else { return };
        let mut n = n.min(s.table.n_tokens);
        if n % BLOCK_SIZE != 0 {
            if self.recurrent && n < s.table.n_tokens {
                n -= n % BLOCK_SIZE;
            } else {
                let b = s.table.blocks[n / BLOCK_SIZE];
                if self.kv.ref_count(b) == 2 && self.cache.forget(b) {
                    self.kv.release_block(b);
                }
                if self.kv.ref_count(b) > 1 {
                    n -= n % BLOCK_SIZE;
                }
            }
        }
        self.kv.truncate(&mut s.table, n);
        s.table.n_tokens = n;
        s.keys.truncate(n);
        s.chain.truncate(n / BLOCK_SIZE);
        if s.shifted_from.is_some_and(|b| n <= b * BLOCK_SIZE) {
            s.shifted_from = None;
        }
    }

    /// Offers the sequence's newly completed blocks to the prefix cache, then trims the
    /// cache to its capacity.
    fn register(&mut self, seq: SeqId) {
        if !self.causal {
            // An encoder's keys at a position depend on the positions after it.
            return;
        }
        let Some(s) = self.seqs.get_mut(seq as usize).and_then(Option::as_mut) else { return };
        let full = (s.table.n_tokens / BLOCK_SIZE).min(s.shifted_from.unwrap_or(usize::MAX));
        while s.chain.len() < full {
            let i = s.chain.len();
            let parent = s.chain.last().copied().unwrap_or(prefix::ROOT);
            let chunk = &s.keys[i * BLOCK_SIZE..(i + 1) * BLOCK_SIZE];
            let block = s.table.blocks[i];
            if self.cache.insert(parent, chunk, block) {
                self.kv.retain_block(block);
            }
            s.chain.push(prefix::block_key(parent, chunk));
        }
        while self.cache.over_capacity() {
            match self.cache.evict(|_| true) {
                Some(b) => self.kv.release_block(b),
                None => break,
            }
        }
    }

    /// Frees `need` blocks (evicting cached ones), or says the pool is full.
    fn room_for(&mut self, need: usize) -> Result<()> {
        self.make_room(need);
        if need > self.kv.n_free_blocks() {
            return Err(KilnError::invalid(format!(
                "KV cache full: {need} more blocks needed, {} free",
                self.kv.n_free_blocks()
            )));
        }
        Ok(())
    }

    /// The tokens `seq` holds, after checking that it exists and `token` is in a vocabulary
    /// of `n_vocab`.
    fn check_entry(&self, seq: SeqId, token: u32, n_vocab: usize) -> Result<usize> {
        let Some(s) = self.seqs.get(seq as usize).and_then(Option::as_ref) else {
            return Err(KilnError::invalid(format!("unknown sequence {seq}")));
        };
        if token as usize >= n_vocab {
            return Err(KilnError::invalid(format!(
                "token id {token} is outside the vocabulary ({n_vocab})"
            )));
        }
        Ok(s.table.n_tokens)
    }

    /// Reserves KV blocks for `seq` to hold `n` tokens (evicting cached blocks as needed).
    fn reserve(&mut self, seq: SeqId, n: usize) -> Result<()> {
        let have = self.seq_mut(seq).map_or(0, |s| s.table.blocks.len());
        self.room_for(n.div_ceil(BLOCK_SIZE).saturating_sub(have))?;
        let s = self.seqs[seq as usize].as_mut().expect("a live sequence");
        self.kv.reserve(&mut s.table, n)
    }

    /// Drops the blocks reserved beyond `seq`'s tokens.
    fn unreserve(&mut self, seq: SeqId) {
        if let Some(s) = self.seqs.get_mut(seq as usize).and_then(Option::as_mut) {
            let n = s.table.n_tokens;
            self.kv.truncate(&mut s.table, n);
        }
    }

    /// Evicts cached blocks that nothing else holds until `need` blocks are free.
    fn make_room(&mut self, need: usize) {
        while self.kv.n_free_blocks() < need {
            let kv = &self.kv;
            match self.cache.evict(|b| kv.ref_count(b) == 1) {
                Some(b) => self.kv.release_block(b),
                None => break,
            }
        }
    }
}

pub struct ModelRunner<B: Backend> {
    model: Model<B>,
    n_slots: usize,
    /// Whether greedy steps are recorded ahead where the backend can (`with_lookahead`).
    lookahead: bool,
    /// Whether the rows of a `decode_embd` call attend to each other bidirectionally
    /// (`with_bidirectional_embd`).
    bidirectional_embd: bool,
    state: Mutex<State<B>>,
}

impl<B: Backend> ModelRunner<B> {
    /// A runner with a pool of `n_slots` KV slots and a prefix cache that may name every
    /// block of it (cached blocks nobody uses are evicted, oldest first, when the pool
    /// runs short).
    pub fn new(model: Model<B>, n_slots: usize, n_ubatch: usize) -> Result<Self> {
        Self::with_kv_types(model, n_slots, n_ubatch, KvTypes::default())
    }

    /// [`Self::new`] with the KV cache stored as `types` says.
    pub fn with_kv_types(model: Model<B>, n_slots: usize, n_ubatch: usize, types: KvTypes) -> Result<Self> {
        let cfg = &model.cfg;
        let kv = KvPool::new(&model.backend, cfg, n_slots, types)?;
        let scratch = Scratch::new(&model.backend, cfg, n_ubatch.max(1))?;
        let cache = PrefixCache::new(kv.n_blocks);
        let (causal, recurrent) = (cfg.causal, cfg.is_recurrent());
        Ok(ModelRunner {
            model,
            n_slots,
            lookahead: true,
            bidirectional_embd: false,
            state: Mutex::new(State {
                kv,
                scratch,
                seqs: Vec::new(),
                cache,
                lookahead: None,
                causal,
                recurrent,
            }),
        })
    }

    /// The backend the model runs on.
    pub fn backend(&self) -> &B {
        &self.model.backend
    }

    /// Runs once each kind of step a model's use meets, on scratch sequences, so every
    /// pipeline and bind group they need is made now instead of in the first request: a
    /// prompt chunk past the first 256 positions (the split attention's second chunk),
    /// greedy and sampled decode steps there, and batches of 2 to 128 tokens (the tile
    /// matmul's shapes). Leaves the pool as it was: the sequences are freed and no block
    /// stays in the prefix cache.
    pub fn warm_up(&self) -> Result<()> {
        let (n_ubatch, causal) = {
            let st = self.lock();
            (st.scratch.n_ubatch(), st.causal)
        };
        // An encoder takes each input whole, in one micro-batch; its steps give hidden
        // states (every row) and it has no decode steps.
        let room = self.n_slots.min(if causal { n_ubatch * 4 } else { n_ubatch });
        let entries = |seq, n: usize, all: bool| -> Vec<Entry> {
            (0..n).map(|i| Entry { seq, token: 0, output: all || i + 1 == n }).collect()
        };
        let batch_kind = if causal { OutputKind::Argmax } else { OutputKind::Hidden };
        let run = || -> Result<()> {
            let seq = self.new_seq();
            let prompt = room.saturating_sub(4).min(300);
            let steps = (|| {
                if prompt > 0 && !causal {
                    self.decode(&entries(seq, prompt, true), OutputKind::Hidden)?;
                } else if prompt > 0 {
                    self.decode(&entries(seq, prompt, false), OutputKind::Logits)?;
                    for kind in [OutputKind::Argmax, OutputKind::Argmax, OutputKind::Logits] {
                        self.decode(&entries(seq, 1, true), kind)?;
                    }
                }
                Ok(())
            })();
            self.free_seq(seq);
            steps?;
            for n in [2, 8, 16, 32, 64, 128] {
                if n > room {
                    break;
                }
                let seq = self.new_seq();
                let step = self.decode(&entries(seq, n, true), batch_kind);
                self.free_seq(seq);
                step?;
            }
            Ok(())
        };
        let result = run();
        let st = &mut *self.lock();
        for b in st.cache.clear() {
            st.kv.release_block(b);
        }
        result
    }

    /// Bounds the prefix cache to `blocks` blocks of `BLOCK_SIZE` tokens (0 disables it).
    pub fn with_prefix_cache(self, blocks: usize) -> Self {
        {
            let st = &mut *self.lock();
            for b in st.cache.clear() {
                st.kv.release_block(b);
            }
            st.cache = PrefixCache::new(blocks);
        }
        self
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State<B>> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The state, with any step recorded ahead dropped first (for everything but the next
    /// greedy step).
    fn lock_settled(&self) -> std::sync::MutexGuard<'_, State<B>> {
        let mut st = self.lock();
        self.drop_lookahead(&mut st);
        st
    }

    fn drop_lookahead(&self, st: &mut State<B>) {
        if let Some(la) = st.lookahead.take() {
            // Waited for, so its read-back buffer is free again; its KV writes lie beyond
            // the sequence's tokens.
            let _ = self.model.backend.argmax_finish(la.ids);
            st.unreserve(la.seq);
        }
    }

    /// Records single-sequence greedy steps ahead (`decode_greedy`) where the backend can
    /// (on by default; [`crate::EngineOptions::greedy_lookahead`]).
    pub fn with_lookahead(mut self, on: bool) -> Self {
        self.lookahead = on;
        self
    }

    /// Reads the rows of each `decode_embd` call with bidirectional attention among them
    /// (each sees everything of its sequence before the call and every row of it), as
    /// llama.cpp decodes a gemma3 image with causal attention off
    /// ([`crate::vision::Projector::rows_attend_bidirectionally`]). Off by default.
    pub fn with_bidirectional_embd(mut self, on: bool) -> Self {
        self.bidirectional_embd = on;
        self
    }

    fn looks_ahead(&self) -> bool {
        self.lookahead && self.model.backend.embeds_last_argmax() && self.model.cfg.logit_scale > 0.0
    }

    /// One greedy step of one sequence: the host records the step after it (its token
    /// this step's id, on the device) before waiting for this one, so the device never
    /// waits for the host between steps; the caller's next call takes that step when it
    /// asks for the token this one returns.
    fn decode_greedy(&self, st: &mut State<B>, e: Entry) -> Result<Vec<f32>> {
        let n = st.check_entry(e.seq, e.token, self.model.cfg.n_vocab)?;
        let ids = match st.lookahead.take() {
            Some(la) if la.seq == e.seq && la.pos == n && la.token == e.token => la.ids,
            other => {
                st.lookahead = other;
                self.drop_lookahead(st);
                st.reserve(e.seq, n + 1)?;
                self.forward_greedy(st, e.seq, e.token, n, false).inspect_err(|_| st.unreserve(e.seq))?
            }
        };
        let s = st.seq_mut(e.seq).expect("checked above");
        s.keys.push(prefix::token_key(e.token));
        s.table.n_tokens = n + 1;
        st.register(e.seq);
        // The next step, if the pool has room for it (else the caller's next call runs it).
        let next = st.reserve(e.seq, n + 2).and_then(|()| self.forward_greedy(st, e.seq, 0, n + 1, true));
        if next.is_err() {
            st.unreserve(e.seq);
        }
        let id = self.model.backend.argmax_finish(ids);
        match (id, next) {
            (Ok(id), Ok(ids)) => {
                st.lookahead = Some(Lookahead { seq: e.seq, pos: n + 1, token: id[0], ids });
                Ok(vec![id[0] as f32])
            }
            (id, next) => {
                if let Ok(ids) = next {
                    st.lookahead = Some(Lookahead { seq: e.seq, pos: n + 1, token: u32::MAX, ids });
                    self.drop_lookahead(st);
                }
                Ok(vec![id?[0] as f32])
            }
        }
    }

    /// The micro-batches of `entries` (at positions `pos`), as `[start, end)` ranges of at
    /// most `n_ubatch`: consecutive runs, or for an encoder whole sequences (each new,
    /// its entries together), since every position sees all the others; a bidirectional
    /// span (`bidirectional`) is one micro-batch.
    fn ubatches(
        &self,
        st: &State<B>,
        entries: &[Entry],
        pos: &[u32],
        bidirectional: bool,
    ) -> Result<Vec<(usize, usize)>> {
        let n_ub = st.scratch.n_ubatch();
        if bidirectional {
            if entries.len() > n_ub {
                return Err(KilnError::invalid(format!(
                    "an image of {} rows is read whole (bidirectional attention), in one micro-batch: \
                     the batch size ({n_ub}) must be at least that",
                    entries.len()
                )));
            }
            return Ok((!entries.is_empty()).then_some((0, entries.len())).into_iter().collect());
        }
        if self.model.cfg.causal {
            return Ok((0..entries.len())
                .step_by(n_ub)
                .map(|s| (s, (s + n_ub).min(entries.len())))
                .collect());
        }
        let mut out: Vec<(usize, usize)> = Vec::new();
        let mut start = 0;
        while start < entries.len() {
            let seq = entries[start].seq;
            let end = start + entries[start..].iter().take_while(|e| e.seq == seq).count();
            if pos[start] != 0
                || pos[end - 1] as usize + 1 != end - start
                || entries[end..].iter().any(|e| e.seq == seq)
            {
                return Err(KilnError::invalid(
                    "an encoder evaluates each sequence whole: its tokens together, in one call, from position 0",
                ));
            }
            if end - start > n_ub {
                return Err(KilnError::invalid(format!(
                    "an input of {} tokens exceeds the micro-batch ({n_ub})",
                    end - start
                )));
            }
            match out.last_mut() {
                Some(last) if end - last.0 <= n_ub => last.1 = end,
                _ => out.push((start, end)),
            }
            start = end;
        }
        Ok(out)
    }

    /// Records the greedy step of `token` (`last_argmax`: the device's last id) at `pos`.
    fn forward_greedy(
        &self,
        st: &mut State<B>,
        seq: SeqId,
        token: u32,
        pos: usize,
        last_argmax: bool,
    ) -> Result<IdsTicket> {
        let tables: Vec<&[u32]> =
            st.seqs.iter().map(|s| s.as_ref().map_or(&[][..], |s| &s.table.blocks[..])).collect();
        let ub = UBatch {
            tokens: &[token],
            pos: &[pos as u32],
            seq: &[seq],
            outputs: &[0],
            embd: None,
            bidirectional: false,
        };
        self.model.forward_greedy(&ub, last_argmax, &mut st.kv, &tables, &mut st.scratch)
    }
}

impl<B: Backend> Runner for ModelRunner<B> {
    fn config(&self) -> &ModelConfig {
        &self.model.cfg
    }

    fn backend_name(&self) -> String {
        self.model.backend.name()
    }

    fn n_ubatch(&self) -> usize {
        self.lock().scratch.n_ubatch()
    }

    fn n_slots(&self) -> usize {
        self.n_slots
    }

    fn new_seq(&self) -> SeqId {
        let mut st = self.lock();
        match st.seqs.iter().position(Option::is_none) {
            Some(i) => {
                st.seqs[i] = Some(Seq::default());
                i as SeqId
            }
            None => {
                st.seqs.push(Some(Seq::default()));
                (st.seqs.len() - 1) as SeqId
            }
        }
    }

    fn free_seq(&self, seq: SeqId) {
        let st = &mut *self.lock_settled();
        if let Some(mut s) = st.seqs.get_mut(seq as usize).and_then(Option::take) {
            st.kv.release(&mut s.table);
        }
    }

    fn seq_len(&self, seq: SeqId) -> usize {
        self.lock().seqs.get(seq as usize).and_then(Option::as_ref).map_or(0, |s| s.table.n_tokens)
    }

    fn seq_tokens(&self, seq: SeqId) -> Vec<u32> {
        self.lock()
            .seqs
            .get(seq as usize)
            .and_then(Option::as_ref)
            .map_or(Vec::new(), |s| s.keys.iter().map(|&k| k as u32).collect())
    }

    fn truncate_seq(&self, seq: SeqId, n: usize) {
        self.lock_settled().truncate(seq, n);
    }

    fn reuse_prefix(&self, seq: SeqId, tokens: &[u32], images: Option<&ImageRows>) -> usize {
        let keys: Vec<u64> = match images {
            Some(images) => images.keys(tokens),
            None => tokens.iter().map(|&t| prefix::token_key(t)).collect(),
        };
        let st = &mut *self.lock_settled();
        let Some(s) = st.seq_mut(seq) else { return 0 };
        let own = s.keys.iter().zip(&keys).take_while(|(a, b)| a == b).count();
        let cached = st.cache.lookup(&keys);
        if cached.len() * BLOCK_SIZE > own {
            let s = st.seqs[seq as usize].as_mut().expect("checked above");
            st.kv.release(&mut s.table);
            for &b in &cached {
                st.kv.retain_block(b);
            }
            let n = cached.len() * BLOCK_SIZE;
            s.table = BlockTable { blocks: cached, n_tokens: n };
            s.keys = keys[..n].to_vec();
            s.chain.clear();
            st.register(seq);
            n
        } else {
            st.truncate(seq, own);
            st.seqs[seq as usize].as_ref().map_or(0, |s| s.table.n_tokens)
        }
    }

    fn shift_seq(&self, seq: SeqId, n_keep: usize, n_discard: usize) -> Result<()> {
        let st = &mut *self.lock_settled();
        let n = st.seq_mut(seq).map_or(0, |s| s.table.n_tokens);
        if n_keep + n_discard > n {
            return Err(KilnError::invalid(format!(
                "context shift: keeping {n_keep} and discarding {n_discard} of {n} tokens"
            )));
        }
        if n_discard == 0 {
            return Ok(());
        }
        if st.recurrent {
            // A convolution state holds the dropped tokens; no shift can take them out.
            return Err(KilnError::invalid(
                "context shift is not possible for a model with convolution states (lfm2): the context is full",
            ));
        }
        let (new_len, first) = (n - n_discard, n_keep / BLOCK_SIZE);
        // Blocks about to be rewritten leave the prefix cache; a block another sequence
        // still shares is replaced by a fresh one (copy-on-write).
        let old = st.seqs[seq as usize].as_ref().expect("checked above").table.clone();
        let mut table = old.clone();
        table.blocks.truncate(new_len.div_ceil(BLOCK_SIZE));
        for i in first..table.blocks.len() {
            let b = table.blocks[i];
            if st.kv.ref_count(b) > 1 && st.cache.forget(b) {
                st.kv.release_block(b);
            }
            if st.kv.ref_count(b) > 1 {
                st.make_room(1);
                let mut fresh = BlockTable::default();
                st.kv.reserve(&mut fresh, BLOCK_SIZE)?;
                table.blocks[i] = fresh.blocks[0];
            }
        }
        // Rounds of `n_discard` positions: a round writes slots the next round reads from,
        // and reads only slots no earlier round wrote.
        let cfg = &self.model.cfg;
        let b = &self.model.backend;
        let copy: Vec<(u32, u32)> = (first * BLOCK_SIZE..n_keep)
            .map(|q| (old.slot(q), table.slot(q)))
            .filter(|(s, d)| s != d)
            .collect();
        let mut rounds = vec![(copy, 0)];
        for r0 in (n_keep..new_len).step_by(n_discard) {
            let moves = (r0..(r0 + n_discard).min(new_len)).map(|q| (old.slot(q + n_discard), table.slot(q)));
            rounds.push((moves.collect(), -(n_discard as i32)));
        }
        for (il, cache) in st.kv.layers.iter_mut().enumerate() {
            let (kc, vc) = (&mut cache.k, &mut cache.v);
            let rope = self.model.shift_rope(il);
            for (moves, delta) in &rounds {
                if !moves.is_empty() {
                    let (src, dst): (Vec<u32>, Vec<u32>) = moves.iter().copied().unzip();
                    b.kv_shift(kc, vc, &src, &dst, *delta, cfg.n_head_kv, cfg.head_dim, &rope);
                }
            }
        }
        for (i, &ob) in old.blocks.iter().enumerate() {
            if table.blocks.get(i) != Some(&ob) {
                st.kv.release_block(ob);
            }
        }
        let s = st.seq_mut(seq).expect("checked above");
        table.n_tokens = new_len;
        s.table = table;
        s.keys.drain(n_keep..n_keep + n_discard);
        s.chain.truncate(first);
        s.shifted_from = Some(first);
        Ok(())
    }

    fn kv_usage(&self) -> f32 {
        self.lock().kv.usage()
    }

    fn prefix_cache_blocks(&self) -> (usize, usize) {
        let st = self.lock();
        (st.cache.len(), st.cache.capacity())
    }

    fn kv_types(&self) -> KvTypes {
        self.lock().kv.types
    }

    fn check_kv(&self) -> std::result::Result<(), String> {
        let st = self.lock_settled();
        for (i, s) in st.seqs.iter().enumerate() {
            let Some(s) = s else { continue };
            let t = &s.table;
            if t.blocks.len() != t.n_tokens.div_ceil(BLOCK_SIZE) || s.keys.len() != t.n_tokens {
                return Err(format!(
                    "sequence {i}: {} tokens, {} blocks, {} token ids",
                    t.n_tokens,
                    t.blocks.len(),
                    s.keys.len()
                ));
            }
            if s.chain.len() > t.n_tokens / BLOCK_SIZE {
                return Err(format!("sequence {i}: {} chain keys for {} tokens", s.chain.len(), t.n_tokens));
            }
        }
        let holders = st.seqs.iter().flatten().flat_map(|s| s.table.blocks.iter().copied());
        st.kv.check(holders.chain(st.cache.blocks()))
    }

    fn decode(&self, entries: &[Entry], kind: OutputKind) -> Result<Vec<f32>> {
        let st = &mut *self.lock();
        if let [e] = entries {
            if e.output && kind == OutputKind::Argmax && self.looks_ahead() {
                return self.decode_greedy(st, *e);
            }
        }
        self.decode_entries(st, entries, None, false, kind)
    }

    fn decode_embd(&self, seq: SeqId, ids: &[u32], embd: &[f32], output: bool) -> Result<Vec<f32>> {
        let d = self.model.cfg.n_embd;
        if embd.len() != ids.len() * d {
            return Err(KilnError::invalid(format!(
                "{} embedding values for {} rows of {d}",
                embd.len(),
                ids.len()
            )));
        }
        let n = ids.len();
        let entries: Vec<Entry> = ids
            .iter()
            .enumerate()
            .map(|(i, &token)| Entry { seq, token, output: output && i + 1 == n })
            .collect();
        let st = &mut *self.lock();
        self.decode_entries(st, &entries, Some(embd), self.bidirectional_embd, OutputKind::Logits)
    }
}

impl<B: Backend> ModelRunner<B> {
    /// `decode` without the greedy lookahead: `embd`, when given, holds the entries' input
    /// rows (their tokens then need not be in the vocabulary); `bidirectional`: the entries
    /// (of one sequence) attend to each other whole, in one micro-batch.
    fn decode_entries(
        &self,
        st: &mut State<B>,
        entries: &[Entry],
        embd: Option<&[f32]>,
        bidirectional: bool,
        kind: OutputKind,
    ) -> Result<Vec<f32>> {
        let cfg = &self.model.cfg;
        let n_vocab = if embd.is_some() { usize::MAX } else { cfg.n_vocab };
        self.drop_lookahead(st);
        // Validate everything and count new positions per sequence before changing anything.
        let mut new_len: Vec<usize> =
            st.seqs.iter().map(|s| s.as_ref().map_or(0, |s| s.table.n_tokens)).collect();
        let mut pos = Vec::with_capacity(entries.len());
        for e in entries {
            st.check_entry(e.seq, e.token, n_vocab)?;
            let s = e.seq as usize;
            pos.push(new_len[s] as u32);
            new_len[s] += 1;
        }
        let ubatches = self.ubatches(st, entries, &pos, bidirectional)?;
        let need: usize = st
            .seqs
            .iter()
            .zip(&new_len)
            .filter_map(|(s, &n)| {
                s.as_ref().map(|s| n.div_ceil(BLOCK_SIZE).saturating_sub(s.table.blocks.len()))
            })
            .sum();
        st.room_for(need)?;
        for (s, &n) in st.seqs.iter_mut().zip(&new_len) {
            if let Some(s) = s {
                st.kv.reserve(&mut s.table, n)?;
            }
        }

        let width = match kind {
            OutputKind::Logits => cfg.n_vocab,
            OutputKind::Argmax => 1,
            OutputKind::Hidden => cfg.n_embd,
        };
        let n_out_total = entries.iter().filter(|e| e.output).count();
        let mut out = vec![0.0f32; n_out_total * width];
        let mut written = 0;
        let tokens: Vec<u32> = entries.iter().map(|e| e.token).collect();
        let seqs: Vec<u32> = entries.iter().map(|e| e.seq).collect();
        let result = (|| {
            for &(start, end) in &ubatches {
                let outputs: Vec<u32> =
                    (start..end).filter(|&i| entries[i].output).map(|i| (i - start) as u32).collect();
                let tables: Vec<&[u32]> =
                    st.seqs.iter().map(|s| s.as_ref().map_or(&[][..], |s| &s.table.blocks[..])).collect();
                let ub = UBatch {
                    tokens: &tokens[start..end],
                    pos: &pos[start..end],
                    seq: &seqs[start..end],
                    outputs: &outputs,
                    embd: embd.map(|e| &e[start * cfg.n_embd..end * cfg.n_embd]),
                    bidirectional,
                };
                let dst = &mut out[written * width..(written + outputs.len()) * width];
                self.model.forward(&ub, &mut st.kv, &tables, &mut st.scratch, kind, dst)?;
                written += outputs.len();
            }
            Ok(())
        })();
        match result {
            Ok(()) => {
                for (i, e) in entries.iter().enumerate() {
                    let key = match embd {
                        Some(rows) => prefix::row_key(e.token, &rows[i * cfg.n_embd..(i + 1) * cfg.n_embd]),
                        None => prefix::token_key(e.token),
                    };
                    if let Some(s) = st.seq_mut(e.seq) {
                        s.keys.push(key);
                    }
                }
                let mut touched: Vec<SeqId> = Vec::new();
                for (i, (s, &n)) in st.seqs.iter_mut().zip(&new_len).enumerate() {
                    if let Some(s) = s {
                        if s.table.n_tokens != n {
                            s.table.n_tokens = n;
                            touched.push(i as SeqId);
                        }
                    }
                }
                for seq in touched {
                    st.register(seq);
                }
                Ok(out)
            }
            Err(e) => {
                for s in st.seqs.iter_mut().flatten() {
                    let n = s.table.n_tokens;
                    st.kv.truncate(&mut s.table, n);
                }
                if st.recurrent {
                    // The micro-batches that ran wrote states into the sequences' last
                    // blocks: keep only the blocks before them.
                    let mut seqs: Vec<SeqId> = entries.iter().map(|e| e.seq).collect();
                    seqs.dedup();
                    for seq in seqs {
                        let n = st.seqs[seq as usize].as_ref().map_or(0, |s| s.table.n_tokens);
                        st.truncate(seq, n - n % BLOCK_SIZE);
                    }
                }
                Err(e)
            }
        }
    }
}
