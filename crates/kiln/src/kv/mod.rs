//! The KV block pool the engine owns: fixed-size blocks of KV slots for every attention
//! layer (and two recurrent-state slots per block for every short-convolution layer:
//! `model::block::conv`), a free list, and reference counts so that sequences can share
//! prefix blocks.

pub mod prefix;
mod types;

pub use prefix::PrefixCache;
pub use types::{cache_type, cache_type_name, hadamard, KvTypes, CACHE_TYPES};

use crate::backend::Backend;
use crate::error::{KilnError, Result};
use crate::model::{Mixer, ModelConfig};

/// Token slots per block.
pub const BLOCK_SIZE: usize = 32;

/// One sequence's view of the pool: the blocks holding its positions, in order.
#[derive(Clone, Debug, Default)]
pub struct BlockTable {
    pub blocks: Vec<u32>,
    /// Positions 0..n_tokens hold valid keys and values.
    pub n_tokens: usize,
}

impl BlockTable {
    pub fn capacity(&self) -> usize {
        self.blocks.len() * BLOCK_SIZE
    }

    /// The slot of position `p`.
    pub fn slot(&self, p: usize) -> u32 {
        self.blocks[p / BLOCK_SIZE] * BLOCK_SIZE as u32 + (p % BLOCK_SIZE) as u32
    }
}

/// One layer's memory: K and V caches (`[n_blocks * BLOCK_SIZE, kv_dim]` f16) for
/// attention, states (`[n_blocks * 2, state_len]` f32) for a short convolution.
pub struct LayerCache<B: Backend> {
    pub k: B::Kv,
    pub v: B::Kv,
    pub state: Option<B::Buf>,
}

/// The caches of every layer, carved into blocks.
pub struct KvPool<B: Backend> {
    pub layers: Vec<LayerCache<B>>,
    pub kv_dim: usize,
    /// How the rows are stored.
    pub types: KvTypes,
    pub n_blocks: usize,
    free: Vec<u32>,
    refs: Vec<u32>,
}

impl<B: Backend> KvPool<B> {
    /// A pool of `n_slots` token slots (rounded up to whole blocks) for `cfg`'s layers,
    /// K and V rows stored as `types` says.
    pub fn new(backend: &B, cfg: &ModelConfig, n_slots: usize, types: KvTypes) -> Result<Self> {
        let (kv_dim, head_dim) = (cfg.kv_dim(), cfg.head_dim);
        types.check(head_dim)?;
        let n_blocks = n_slots.div_ceil(BLOCK_SIZE);
        let rows = n_blocks * BLOCK_SIZE;
        let (k_rot, v_rot) = (types.k_rotation(head_dim), types.v_rotation(head_dim));
        let layers = cfg
            .layers
            .iter()
            .map(|l| match &l.mixer {
                Mixer::Attention(_) => Ok(LayerCache {
                    k: backend.alloc_kv_typed(rows, kv_dim, types.k, k_rot)?,
                    v: backend.alloc_kv_typed(rows, kv_dim, types.v, v_rot)?,
                    state: None,
                }),
                Mixer::ShortConv(c) => Ok(LayerCache {
                    k: backend.alloc_kv(2)?,
                    v: backend.alloc_kv(2)?,
                    state: Some(backend.alloc(n_blocks * 2 * c.state_len(cfg.n_embd))?),
                }),
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(KvPool {
            layers,
            kv_dim,
            types,
            n_blocks,
            free: (0..n_blocks as u32).rev().collect(),
            refs: vec![0; n_blocks],
        })
    }

    pub fn n_free_blocks(&self) -> usize {
        self.free.len()
    }

    /// Fraction of blocks in use.
    pub fn usage(&self) -> f32 {
        1.0 - self.free.len() as f32 / self.n_blocks.max(1) as f32
    }

    /// Grows `table` so it can hold `n_tokens` positions; on failure nothing changes.
    pub fn reserve(&mut self, table: &mut BlockTable, n_tokens: usize) -> Result<()> {
        let need = n_tokens.div_ceil(BLOCK_SIZE).saturating_sub(table.blocks.len());
        if need > self.free.len() {
            return Err(KilnError::invalid(format!(
                "KV cache full: {n_tokens} positions need {need} more blocks of {BLOCK_SIZE}, {} free",
                self.free.len()
            )));
        }
        for _ in 0..need {
            let b = self.free.pop().expect("checked above");
            self.refs[b as usize] = 1;
            table.blocks.push(b);
        }
        Ok(())
    }

    /// References held on block `b` (0: free).
    pub fn ref_count(&self, b: u32) -> u32 {
        self.refs[b as usize]
    }

    /// Adds a reference to one block (the prefix cache, or a sequence sharing it).
    pub fn retain_block(&mut self, b: u32) {
        self.refs[b as usize] += 1;
    }

    /// Drops one reference to a block; it returns to the free list when none is left.
    pub fn release_block(&mut self, b: u32) {
        let r = &mut self.refs[b as usize];
        *r = r.saturating_sub(1);
        if *r == 0 {
            self.free.push(b);
        }
    }

    /// Adds a reference to every block of `table` (a sharer of its prefix).
    pub fn retain(&mut self, table: &BlockTable) {
        for &b in &table.blocks {
            self.refs[b as usize] += 1;
        }
    }

    /// Drops the table's references; blocks no one holds return to the free list.
    pub fn release(&mut self, table: &mut BlockTable) {
        for b in table.blocks.drain(..) {
            let r = &mut self.refs[b as usize];
            *r -= 1;
            if *r == 0 {
                self.free.push(b);
            }
        }
        table.n_tokens = 0;
    }

    /// Checks the reference counts against `holders` (every block each holder names, once
    /// per holder) and the free list against them.
    pub fn check(&self, holders: impl Iterator<Item = u32>) -> std::result::Result<(), String> {
        let mut want = vec![0u32; self.n_blocks];
        for b in holders {
            *want.get_mut(b as usize).ok_or(format!("block {b} is outside the pool"))? += 1;
        }
        if want != self.refs {
            let b = (0..self.n_blocks).find(|&b| want[b] != self.refs[b]).unwrap_or(0);
            return Err(format!("block {b}: {} references counted, {} held", self.refs[b], want[b]));
        }
        let mut free = self.free.clone();
        free.sort_unstable();
        let unheld: Vec<u32> = (0..self.n_blocks as u32).filter(|&b| want[b as usize] == 0).collect();
        if free != unheld {
            return Err(format!("free list {free:?}, unreferenced blocks {unheld:?}"));
        }
        Ok(())
    }

    /// Keeps the first `n_tokens` positions, returning blocks past them.
    pub fn truncate(&mut self, table: &mut BlockTable, n_tokens: usize) {
        let keep = n_tokens.div_ceil(BLOCK_SIZE);
        for b in table.blocks.drain(keep.min(table.blocks.len())..) {
            let r = &mut self.refs[b as usize];
            *r -= 1;
            if *r == 0 {
                self.free.push(b);
            }
        }
        table.n_tokens = table.n_tokens.min(n_tokens);
    }
}
