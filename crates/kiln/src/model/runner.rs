//! `Runner`: a model bound to one backend, its KV block pool and scratch, behind an
//! object-safe trait so the engine, sessions and server need not know the backend type.

use std::sync::Mutex;

use super::forward::{Model, OutputKind, Scratch, UBatch};
use super::ModelConfig;
use crate::backend::Backend;
use crate::error::{KilnError, Result};
use crate::kv::{BlockTable, KvPool};

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
    /// Forgets positions `n..` of `seq`.
    fn truncate_seq(&self, seq: SeqId, n: usize);
    /// Appends `entries` to their sequences (in order) and runs the forward over them,
    /// `n_ubatch` at a time. Returns the outputs of the entries marked `output`, in order,
    /// each `n_vocab` (logits) or `n_embd` (hidden) wide. On error nothing is appended.
    fn decode(&self, entries: &[Entry], kind: OutputKind) -> Result<Vec<f32>>;
    /// Fraction of KV blocks in use.
    fn kv_usage(&self) -> f32;
}

struct State<B: Backend> {
    kv: KvPool<B>,
    scratch: Scratch<B>,
    seqs: Vec<Option<BlockTable>>,
}

pub struct ModelRunner<B: Backend> {
    model: Model<B>,
    n_slots: usize,
    state: Mutex<State<B>>,
}

impl<B: Backend> ModelRunner<B> {
    pub fn new(model: Model<B>, n_slots: usize, n_ubatch: usize) -> Result<Self> {
        let cfg = &model.cfg;
        let kv = KvPool::new(&model.backend, cfg.n_layer, cfg.kv_dim(), n_slots)?;
        let scratch = Scratch::new(&model.backend, cfg, n_ubatch.max(1))?;
        Ok(ModelRunner { model, n_slots, state: Mutex::new(State { kv, scratch, seqs: Vec::new() }) })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State<B>> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
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
                st.seqs[i] = Some(BlockTable::default());
                i as SeqId
            }
            None => {
                st.seqs.push(Some(BlockTable::default()));
                (st.seqs.len() - 1) as SeqId
            }
        }
    }

    fn free_seq(&self, seq: SeqId) {
        let st = &mut *self.lock();
        if let Some(mut t) = st.seqs.get_mut(seq as usize).and_then(Option::take) {
            st.kv.release(&mut t);
        }
    }

    fn seq_len(&self, seq: SeqId) -> usize {
        self.lock().seqs.get(seq as usize).and_then(Option::as_ref).map_or(0, |t| t.n_tokens)
    }

    fn truncate_seq(&self, seq: SeqId, n: usize) {
        let st = &mut *self.lock();
        if let Some(t) = st.seqs.get_mut(seq as usize).and_then(Option::as_mut) {
            st.kv.truncate(t, n);
        }
    }

    fn kv_usage(&self) -> f32 {
        self.lock().kv.usage()
    }

    fn decode(&self, entries: &[Entry], kind: OutputKind) -> Result<Vec<f32>> {
        let cfg = &self.model.cfg;
        let st = &mut *self.lock();
        // Validate everything and count new positions per sequence before changing anything.
        let mut new_len: Vec<usize> = st.seqs.iter().map(|t| t.as_ref().map_or(0, |t| t.n_tokens)).collect();
        let mut pos = Vec::with_capacity(entries.len());
        for e in entries {
            let s = e.seq as usize;
            if st.seqs.get(s).and_then(Option::as_ref).is_none() {
                return Err(KilnError::invalid(format!("unknown sequence {s}")));
            }
            if e.token as usize >= cfg.n_vocab {
                return Err(KilnError::invalid(format!(
                    "token id {} is outside the vocabulary ({})",
                    e.token, cfg.n_vocab
                )));
            }
            pos.push(new_len[s] as u32);
            new_len[s] += 1;
        }
        let need: usize = st
            .seqs
            .iter()
            .zip(&new_len)
            .filter_map(|(t, &n)| {
                t.as_ref().map(|t| n.div_ceil(crate::kv::BLOCK_SIZE).saturating_sub(t.blocks.len()))
            })
            .sum();
        if need > st.kv.n_free_blocks() {
            return Err(KilnError::invalid(format!(
                "KV cache full: {need} more blocks needed, {} free",
                st.kv.n_free_blocks()
            )));
        }
        for (t, &n) in st.seqs.iter_mut().zip(&new_len) {
            if let Some(t) = t {
                st.kv.reserve(t, n)?;
            }
        }

        let width = match kind {
            OutputKind::Logits => cfg.n_vocab,
            OutputKind::Hidden => cfg.n_embd,
        };
        let n_out_total = entries.iter().filter(|e| e.output).count();
        let mut out = vec![0.0f32; n_out_total * width];
        let mut written = 0;
        let n_ub = st.scratch.n_ubatch();
        let tokens: Vec<u32> = entries.iter().map(|e| e.token).collect();
        let seqs: Vec<u32> = entries.iter().map(|e| e.seq).collect();
        let result = (|| {
            for start in (0..entries.len()).step_by(n_ub) {
                let end = (start + n_ub).min(entries.len());
                let outputs: Vec<u32> =
                    (start..end).filter(|&i| entries[i].output).map(|i| (i - start) as u32).collect();
                let tables: Vec<&[u32]> =
                    st.seqs.iter().map(|t| t.as_ref().map_or(&[][..], |t| &t.blocks[..])).collect();
                let ub = UBatch {
                    tokens: &tokens[start..end],
                    pos: &pos[start..end],
                    seq: &seqs[start..end],
                    outputs: &outputs,
                };
                let dst = &mut out[written * width..(written + outputs.len()) * width];
                self.model.forward(&ub, &mut st.kv, &tables, &mut st.scratch, kind, dst)?;
                written += outputs.len();
            }
            Ok(())
        })();
        match result {
            Ok(()) => {
                for (t, &n) in st.seqs.iter_mut().zip(&new_len) {
                    if let Some(t) = t {
                        t.n_tokens = n;
                    }
                }
                Ok(out)
            }
            Err(e) => {
                for t in st.seqs.iter_mut().flatten() {
                    let n = t.n_tokens;
                    st.kv.truncate(t, n);
                }
                Err(e)
            }
        }
    }
}
