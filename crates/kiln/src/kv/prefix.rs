//! Prefix cache: full KV blocks indexed by the tokens that produced them, so a new turn or a
//! new sequence that starts with tokens already computed reuses their keys and values.
//!
//! A block is keyed by what its 32 positions hold and its parent block's key (a chain, as in
//! vLLM), so a lookup walks a sequence one block at a time and stops at the first miss: the
//! result is the longest cached prefix in whole blocks. A position is told apart by its
//! [`token_key`] or, where it was fed an input row instead of a token (an image row), its
//! [`row_key`]: the row's id with a hash of the row's values. Only full blocks are cached; a full block
//! is never written again by its sequence, which is what makes sharing safe without a copy.
//! The cache holds one reference on each block it names (the pool's reference counts);
//! eviction is least-recently-used, deepest blocks of a chain first.

use std::collections::HashMap;
use std::hash::{DefaultHasher, Hash, Hasher};

use super::BLOCK_SIZE;

/// Key of the empty prefix (the parent of a sequence's first block).
pub const ROOT: u64 = 0x6b69_6c6e_2d6b_7600;

/// The key of a position holding token `id`.
pub fn token_key(id: u32) -> u64 {
    id as u64
}

/// The key of a position fed `row` (an input row, not a token embedding) under `id`: the
/// id in the low 32 bits, a hash of the row's values above it. Image-row ids are derived
/// from 31 bits of their image's hash and may coincide for two images; with the row's hash
/// two different rows share a key only with odds of about 2^-63, so they never share
/// cached keys and values in practice. The low bits are the id (`key as u32`).
pub fn row_key(id: u32, row: &[f32]) -> u64 {
    let bytes: Vec<u8> = row.iter().flat_map(|v| v.to_bits().to_le_bytes()).collect();
    let mut h = DefaultHasher::new();
    h.write(&bytes);
    (h.finish() & !0xffff_ffff) | id as u64
}

struct CachedBlock {
    block: u32,
    parent: u64,
    keys: Box<[u64]>,
    /// Last use; smaller is older.
    tick: u64,
}

/// Maps block-chain keys to KV blocks. Pure bookkeeping: the caller moves the references.
pub struct PrefixCache {
    map: HashMap<u64, CachedBlock>,
    capacity: usize,
    clock: u64,
}

/// The key of a block whose positions hold `keys` after the prefix keyed `parent`.
pub fn block_key(parent: u64, keys: &[u64]) -> u64 {
    let mut h = DefaultHasher::new();
    parent.hash(&mut h);
    keys.hash(&mut h);
    h.finish()
}

impl PrefixCache {
    /// A cache naming at most `capacity` blocks (0 disables it).
    pub fn new(capacity: usize) -> Self {
        PrefixCache { map: HashMap::new(), capacity, clock: 0 }
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Blocks the cache names.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// The cached blocks holding the longest whole-block prefix of the positions `keys`, in
    /// order, and marks them used.
    pub fn lookup(&mut self, keys: &[u64]) -> Vec<u32> {
        let mut out = Vec::new();
        let mut found = Vec::new();
        let mut parent = ROOT;
        for chunk in keys.chunks_exact(BLOCK_SIZE) {
            let key = block_key(parent, chunk);
            match self.map.get(&key) {
                Some(c) if c.parent == parent && *c.keys == *chunk => {
                    out.push(c.block);
                    found.push(key);
                    parent = key;
                }
                _ => break,
            }
        }
        self.touch(&found);
        out
    }

    /// Marks a chain used; the deepest block gets the oldest tick so it is evicted first
    /// and no cached block outlives its parent for long.
    fn touch(&mut self, keys: &[u64]) {
        for key in keys.iter().rev() {
            self.clock += 1;
            if let Some(c) = self.map.get_mut(key) {
                c.tick = self.clock;
            }
        }
    }

    /// Whether a block with this key is cached.
    pub fn contains(&self, key: u64) -> bool {
        self.map.contains_key(&key)
    }

    /// Records `block` as holding the positions `keys` (one block's worth) after the prefix
    /// `parent`. Returns false when that key is already cached (the caller keeps its
    /// reference).
    pub fn insert(&mut self, parent: u64, keys: &[u64], block: u32) -> bool {
        if self.capacity == 0 || keys.len() != BLOCK_SIZE {
            return false;
        }
        let key = block_key(parent, keys);
        if self.map.contains_key(&key) {
            self.touch(&[key]);
            return false;
        }
        self.clock += 1;
        self.map.insert(key, CachedBlock { block, parent, keys: keys.into(), tick: self.clock });
        true
    }

    /// Removes the least recently used entry whose block passes `evictable` (the pool says
    /// whether freeing it would return memory) and returns its block, whose reference the
    /// caller then drops.
    pub fn evict(&mut self, evictable: impl Fn(u32) -> bool) -> Option<u32> {
        let key = self
            .map
            .iter()
            .filter(|(_, c)| evictable(c.block))
            .min_by_key(|(_, c)| c.tick)
            .map(|(k, _)| *k)?;
        self.map.remove(&key).map(|c| c.block)
    }

    /// Removes the entry naming `block`, if any (its contents are about to change); the
    /// caller then drops the cache's reference.
    pub fn forget(&mut self, block: u32) -> bool {
        let key = self.map.iter().find(|(_, c)| c.block == block).map(|(k, _)| *k);
        key.and_then(|k| self.map.remove(&k)).is_some()
    }

    /// The blocks the cache names.
    pub fn blocks(&self) -> impl Iterator<Item = u32> + '_ {
        self.map.values().map(|c| c.block)
    }

    /// Whether the cache holds more blocks than its capacity.
    pub fn over_capacity(&self) -> bool {
        self.map.len() > self.capacity
    }

    /// Removes every entry, returning their blocks.
    pub fn clear(&mut self) -> Vec<u32> {
        self.map.drain().map(|(_, c)| c.block).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn toks(n: usize, seed: u32) -> Vec<u64> {
        (0..n as u32).map(|i| token_key(i * 7 + seed)).collect()
    }

    #[test]
    fn longest_whole_block_prefix() {
        let mut c = PrefixCache::new(16);
        let t = toks(3 * BLOCK_SIZE + 5, 1);
        let mut parent = ROOT;
        for (i, chunk) in t.chunks_exact(BLOCK_SIZE).enumerate() {
            assert!(c.insert(parent, chunk, 10 + i as u32));
            parent = block_key(parent, chunk);
        }
        assert_eq!(c.lookup(&t), vec![10, 11, 12]);
        let mut other = t.clone();
        other[BLOCK_SIZE + 3] = token_key(99_999);
        assert_eq!(c.lookup(&other), vec![10]);
        assert_eq!(c.lookup(&t[..BLOCK_SIZE - 1]), Vec::<u32>::new());
        // The same tokens after a different parent are another block.
        assert!(c.lookup(&t[BLOCK_SIZE..]).is_empty());
    }

    #[test]
    fn lru_evicts_deepest_and_oldest_first() {
        let mut c = PrefixCache::new(16);
        let a = toks(2 * BLOCK_SIZE, 1);
        let b = toks(BLOCK_SIZE, 2);
        c.insert(ROOT, &a[..BLOCK_SIZE], 1);
        c.insert(block_key(ROOT, &a[..BLOCK_SIZE]), &a[BLOCK_SIZE..], 2);
        c.insert(ROOT, &b, 3);
        c.lookup(&a); // a's chain is now newer than b
        assert_eq!(c.evict(|_| true), Some(3));
        assert_eq!(c.evict(|_| true), Some(2));
        assert_eq!(c.evict(|b| b != 1), None);
        assert_eq!(c.evict(|_| true), Some(1));
    }

    #[test]
    fn rows_under_one_id_are_told_apart_by_their_values() {
        let (a, b) = ([0.5f32, -1.0, 2.0], [0.5f32, -1.0, 2.5]);
        let id = 0x8000_1234;
        assert_eq!(row_key(id, &a), row_key(id, &a));
        assert_ne!(row_key(id, &a), row_key(id, &b));
        assert_eq!(row_key(id, &a) as u32, id);
        assert_ne!(row_key(id, &a), token_key(id));
    }

    #[test]
    fn capacity_zero_disables() {
        let mut c = PrefixCache::new(0);
        assert!(!c.insert(ROOT, &toks(BLOCK_SIZE, 0), 1));
        assert!(c.is_empty());
    }
}
