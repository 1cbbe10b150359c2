//! Cutting special-token texts out of the input before the tokenizer model runs.
//!
//! llama.cpp takes the CONTROL, USER_DEFINED and UNKNOWN tokens longest first and, for
//! each, splits every remaining text fragment at its non-overlapping occurrences (left to
//! right). USER_DEFINED tokens are always cut out; CONTROL and UNKNOWN only when special
//! tokens are parsed. A trie pass first finds which of the (up to thousands of) special
//! texts occur at all, so only those are searched for.

use std::ops::Range;

use super::vocab::{attr, Vocab};

#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Frag {
    Text(Range<usize>),
    Token(u32),
}

const NONE: u32 = u32::MAX;

/// A byte trie over the special texts; values are indices into `Vocab::special`.
pub(crate) struct SpecialTrie {
    root: Box<[u32; 256]>,
    nodes: Vec<Node>,
}

struct Node {
    children: Vec<(u8, u32)>,
    /// Every special token with exactly this text (several can share one).
    values: Vec<u32>,
}

impl SpecialTrie {
    pub fn new(vocab: &Vocab) -> SpecialTrie {
        let mut t = SpecialTrie { root: Box::new([NONE; 256]), nodes: Vec::new() };
        for (k, &id) in vocab.special.iter().enumerate() {
            let text = vocab.texts[id as usize].as_bytes();
            let Some((&first, rest)) = text.split_first() else { continue };
            let mut node = match t.root[first as usize] {
                NONE => {
                    t.nodes.push(Node { children: Vec::new(), values: Vec::new() });
                    t.root[first as usize] = t.nodes.len() as u32 - 1;
                    t.nodes.len() as u32 - 1
                }
                n => n,
            };
            for &b in rest {
                node = match t.nodes[node as usize].children.iter().find(|c| c.0 == b) {
                    Some(&(_, n)) => n,
                    None => {
                        t.nodes.push(Node { children: Vec::new(), values: Vec::new() });
                        let n = t.nodes.len() as u32 - 1;
                        t.nodes[node as usize].children.push((b, n));
                        n
                    }
                };
            }
            t.nodes[node as usize].values.push(k as u32);
        }
        t
    }

    /// Indices (into `Vocab::special`, ascending = priority order) of texts occurring in `text`.
    fn present(&self, text: &[u8]) -> Vec<u32> {
        let mut found = Vec::new();
        for start in 0..text.len() {
            let mut node = self.root[text[start] as usize];
            let mut pos = start + 1;
            while node != NONE {
                let n = &self.nodes[node as usize];
                found.extend_from_slice(&n.values);
                let Some(&b) = text.get(pos) else { break };
                node = n.children.iter().find(|c| c.0 == b).map_or(NONE, |c| c.1);
                pos += 1;
            }
        }
        found.sort_unstable();
        found.dedup();
        found
    }
}

fn c_isspace(b: u8) -> bool {
    matches!(b, b' ' | b'\t'..=b'\r')
}

/// Splits `text` into raw-text fragments and special tokens.
pub(crate) fn partition(vocab: &Vocab, trie: &SpecialTrie, text: &str, parse_special: bool) -> Vec<Frag> {
    let mut frags = Vec::new();
    if text.is_empty() {
        return frags;
    }
    frags.push(Frag::Text(0..text.len()));
    let bytes = text.as_bytes();
    let mut next = Vec::new();
    for k in trie.present(bytes) {
        let id = vocab.special[k as usize];
        let a = vocab.attrs[id as usize];
        if !parse_special && a & (attr::CONTROL | attr::UNKNOWN) != 0 {
            continue;
        }
        let needle = vocab.texts[id as usize].as_str();
        next.clear();
        for f in frags.drain(..) {
            let Frag::Text(r) = f else {
                next.push(f);
                continue;
            };
            let (mut base, end) = (r.start, r.end);
            loop {
                let found = text.get(base..end).and_then(|s| s.find(needle)).map(|p| base + p);
                let Some(m) = found else {
                    if end > base {
                        next.push(Frag::Text(base..end));
                    }
                    break;
                };
                let mut left_end = m;
                if a & attr::LSTRIP != 0 {
                    while left_end > base && c_isspace(bytes[left_end - 1]) {
                        left_end -= 1;
                    }
                }
                if left_end > base {
                    next.push(Frag::Text(base..left_end));
                }
                next.push(Frag::Token(id));
                base = m + needle.len();
                if a & attr::RSTRIP != 0 {
                    while base < end && c_isspace(bytes[base]) {
                        base += 1;
                    }
                }
            }
        }
        std::mem::swap(&mut frags, &mut next);
    }
    frags
}
