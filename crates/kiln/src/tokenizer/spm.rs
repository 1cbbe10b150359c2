//! SentencePiece BPE (`tokenizer.ggml.model = llama`): merge the adjacent pair whose
//! merged text is the token with the highest score (leftmost on ties), until none is a
//! token; characters left over become byte-fallback tokens `<0xNN>`.

use std::cmp::Ordering;
use std::collections::BinaryHeap;

use super::vocab::{FxMap, Vocab};

pub(crate) struct Spm {
    /// Token for each byte (`<0xNN>`, else the one-byte text), if the vocabulary has one.
    byte_tokens: [Option<u32>; 256],
    /// Characters that some token has right before a `▁`. Before any other character a
    /// `▁` starts a stretch no token crosses, so stretches merge independently (same
    /// result, far smaller queues).
    glue: FxMap<char, ()>,
}

#[derive(Default)]
pub(crate) struct SpmScratch {
    syms: Vec<Sym>,
    heap: BinaryHeap<Bigram>,
}

#[derive(Clone, Copy)]
struct Sym {
    start: u32,
    len: u32,
    prev: u32,
    next: u32,
}

const NIL: u32 = u32::MAX;

struct Bigram {
    score: f32,
    left: u32,
    right: u32,
    len: u32,
}

impl PartialEq for Bigram {
    fn eq(&self, o: &Self) -> bool {
        self.cmp(o) == Ordering::Equal
    }
}
impl Eq for Bigram {}
impl PartialOrd for Bigram {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Bigram {
    /// Max-heap order: higher score first, then the leftmost pair.
    fn cmp(&self, o: &Self) -> Ordering {
        self.score.total_cmp(&o.score).then(o.left.cmp(&self.left))
    }
}

impl Spm {
    pub fn new(vocab: &Vocab) -> Spm {
        let mut byte_tokens = [None; 256];
        for (b, slot) in byte_tokens.iter_mut().enumerate() {
            *slot = vocab.id(format!("<0x{b:02X}>").as_bytes()).or_else(|| vocab.id(&[b as u8]));
        }
        let mut glue = FxMap::default();
        for t in &vocab.texts {
            let mut prev = None;
            for c in t.chars() {
                if let (Some(p), '\u{2581}') = (prev, c) {
                    glue.insert(p, ());
                }
                prev = Some(c);
            }
        }
        Spm { byte_tokens, glue }
    }

    /// Tokenizes `text` (spaces already escaped to U+2581).
    pub fn encode(&self, vocab: &Vocab, text: &str, s: &mut SpmScratch, out: &mut Vec<u32>) {
        let mut start = 0;
        let mut prev = None;
        for (i, c) in text.char_indices() {
            if c == '\u{2581}' && prev.is_some_and(|p| !self.glue.contains_key(&p)) {
                self.encode_stretch(vocab, &text[start..i], s, out);
                start = i;
            }
            prev = Some(c);
        }
        self.encode_stretch(vocab, &text[start..], s, out);
    }

    fn encode_stretch(&self, vocab: &Vocab, text: &str, s: &mut SpmScratch, out: &mut Vec<u32>) {
        let bytes = text.as_bytes();
        let syms = &mut s.syms;
        syms.clear();
        for (i, c) in text.char_indices() {
            let n = syms.len() as u32;
            syms.push(Sym {
                start: i as u32,
                len: c.len_utf8() as u32,
                prev: n.wrapping_sub(1),
                next: n + 1,
            });
        }
        if let Some(last) = syms.last_mut() {
            last.next = NIL;
        } else {
            return;
        }
        let heap = &mut s.heap;
        heap.clear();
        let try_add = |syms: &[Sym], heap: &mut BinaryHeap<Bigram>, left: u32, right: u32| {
            if left == NIL || right == NIL {
                return;
            }
            let (l, r) = (syms[left as usize], syms[right as usize]);
            let start = l.start as usize;
            let len = (l.len + r.len) as usize;
            if let Some(id) = vocab.id(&bytes[start..start + len]) {
                heap.push(Bigram { score: vocab.scores[id as usize], left, right, len: len as u32 });
            }
        };
        for i in 1..syms.len() as u32 {
            try_add(syms, heap, i - 1, i);
        }
        while let Some(b) = heap.pop() {
            let (l, r) = (syms[b.left as usize], syms[b.right as usize]);
            // Symbols only grow, so a changed size means a stale pair.
            if l.len == 0 || r.len == 0 || l.len + r.len != b.len {
                continue;
            }
            syms[b.left as usize].len += r.len;
            syms[b.right as usize].len = 0;
            syms[b.left as usize].next = r.next;
            if r.next != NIL {
                syms[r.next as usize].prev = b.left;
            }
            try_add(syms, heap, l.prev, b.left);
            try_add(syms, heap, b.left, r.next);
        }
        let mut i = 0;
        while i != NIL {
            let sym = syms[i as usize];
            i = sym.next;
            let piece = &bytes[sym.start as usize..(sym.start + sym.len) as usize];
            match vocab.id(piece) {
                Some(id) => out.push(id),
                // Only single characters can be missing: every merge made a token.
                None => {
                    for &b in piece {
                        if let Some(id) = self.byte_tokens[b as usize].or(vocab.unk) {
                            out.push(id);
                        }
                    }
                }
            }
        }
    }
}
