//! BPE merging over pre-tokenized words, with a merge-rank hash map keyed by token ids.
//!
//! llama.cpp merges strings: a word starts as one symbol per (byte-encoded) character and
//! the adjacent pair with the lowest merge rank is merged first, leftmost on ties, whether
//! or not the merged string is a token. Here every string that takes part in a merge gets
//! an id (its token id, or a fresh id past the vocabulary), so merging is integer work.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use super::vocab::{FxMap, Vocab};
use crate::error::{KilnError, Result};
use crate::gguf::{Array, GgufFile};

/// A symbol id that takes part in no merge (a character missing from every merge).
const LONE: u32 = u32::MAX;

pub(crate) struct Bpe {
    /// (left id, right id) -> (rank, merged id).
    merges: FxMap<u64, (u32, u32)>,
    /// Ids of the strings of merges that are not tokens.
    extra_ids: FxMap<Box<[u8]>, u32>,
    /// Id of each byte's GPT-2 character (byte-encoded vocabularies).
    byte_sym: [u32; 256],
    n_vocab: u32,
    byte_encode: bool,
    ignore_merges: bool,
    /// gemma4: a word of newlines that is a token is emitted whole.
    newline_words: bool,
}

/// Reusable buffers for one encode call.
#[derive(Default)]
pub(crate) struct BpeScratch {
    syms: Vec<Sym>,
    heap: BinaryHeap<Reverse<(u32, u32)>>,
    encoded: Vec<u8>,
}

#[derive(Clone, Copy)]
struct Sym {
    id: u32,
    /// Byte range in the word (raw bytes, before byte encoding).
    start: u32,
    end: u32,
    prev: u32,
    next: u32,
}

const NIL: u32 = u32::MAX;
/// The id of a symbol merged into its left neighbour.
const DEAD: u32 = u32::MAX - 1;

const fn printable(b: u8) -> bool {
    matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF)
}

/// GPT-2's byte -> character table: printable bytes stand for themselves, the others are
/// numbered from U+0100 in byte order.
static BYTE_CHARS: [char; 256] = {
    let mut t = ['\0'; 256];
    let mut n = 0u32;
    let mut b = 0usize;
    while b < 256 {
        t[b] = if printable(b as u8) {
            b as u8 as char
        } else {
            n += 1;
            match char::from_u32(0x100 + n - 1) {
                Some(c) => c,
                None => '\0',
            }
        };
        b += 1;
    }
    t
};

#[inline]
pub(crate) fn byte_to_char(b: u8) -> char {
    BYTE_CHARS[b as usize]
}

/// The inverse of [`byte_to_char`].
pub(crate) fn char_to_byte(c: char) -> Option<u8> {
    let cp = c as u32;
    match cp {
        0..=0xFF if printable(cp as u8) => Some(cp as u8),
        0x100..=0x143 => (0..=255u8).filter(|&x| !printable(x)).nth((cp - 0x100) as usize),
        _ => None,
    }
}

fn encode_bytes(raw: &[u8], out: &mut Vec<u8>) {
    let mut buf = [0u8; 4];
    for &b in raw {
        out.extend_from_slice(byte_to_char(b).encode_utf8(&mut buf).as_bytes());
    }
}

#[inline]
fn pair(a: u32, b: u32) -> u64 {
    ((a as u64) << 32) | b as u64
}

impl Bpe {
    pub fn new(
        g: &GgufFile,
        vocab: &Vocab,
        byte_encode: bool,
        ignore_merges: bool,
        newline_words: bool,
    ) -> Result<Bpe> {
        let key = "tokenizer.ggml.merges";
        let lines = match g.get_array(key)? {
            Some(Array::String(v)) => v,
            Some(a) => {
                return Err(KilnError::Metadata(format!("{key} should be strings, found {}", a.elem_name())))
            }
            None => return Err(KilnError::Metadata(format!("{key} is missing"))),
        };
        let n_vocab = vocab.texts.len() as u32;
        let mut extra_ids: FxMap<Box<[u8]>, u32> = FxMap::default();
        let mut intern = |s: &[u8]| -> u32 {
            if let Some(id) = vocab.id(s) {
                return id;
            }
            if let Some(&id) = extra_ids.get(s) {
                return id;
            }
            let id = n_vocab + extra_ids.len() as u32;
            extra_ids.insert(s.into(), id);
            id
        };
        let mut merges: FxMap<u64, (u32, u32)> = FxMap::default();
        merges.reserve(lines.len());
        let mut joined = Vec::new();
        for (rank, line) in lines.iter().enumerate() {
            // Split at the first space after the first byte (a side may itself be " ").
            let Some(sp) = line.bytes().skip(1).position(|b| b == b' ').map(|p| p + 1) else { continue };
            let (l, r) = (&line.as_bytes()[..sp], &line.as_bytes()[sp + 1..]);
            let (li, ri) = (intern(l), intern(r));
            joined.clear();
            joined.extend_from_slice(l);
            joined.extend_from_slice(r);
            let m = intern(&joined);
            merges.entry(pair(li, ri)).or_insert((rank as u32, m));
        }
        let mut byte_sym = [LONE; 256];
        if byte_encode {
            let mut buf = [0u8; 4];
            for (b, slot) in byte_sym.iter_mut().enumerate() {
                let s = byte_to_char(b as u8).encode_utf8(&mut buf).as_bytes().to_vec();
                *slot = vocab.id(&s).or_else(|| extra_ids.get(s.as_slice()).copied()).unwrap_or(LONE);
            }
        }
        Ok(Bpe { merges, extra_ids, byte_sym, n_vocab, byte_encode, ignore_merges, newline_words })
    }

    /// Merges one word (raw bytes of a pre-tokenized piece) and appends its tokens.
    pub fn encode_word(&self, vocab: &Vocab, word: &[u8], s: &mut BpeScratch, out: &mut Vec<u32>) {
        if self.ignore_merges {
            s.encoded.clear();
            if self.byte_encode {
                encode_bytes(word, &mut s.encoded);
            } else {
                s.encoded.extend_from_slice(word);
            }
            if let Some(id) = vocab.id(&s.encoded) {
                out.push(id);
                return;
            }
        }
        if self.newline_words && word.iter().all(|&b| b == b'\n') {
            if let Some(id) = vocab.id(word) {
                out.push(id);
                return;
            }
        }
        let syms = &mut s.syms;
        syms.clear();
        if self.byte_encode {
            syms.extend(word.iter().enumerate().map(|(i, &b)| Sym {
                id: self.byte_sym[b as usize],
                start: i as u32,
                end: i as u32 + 1,
                prev: NIL,
                next: NIL,
            }));
        } else {
            let text = std::str::from_utf8(word).unwrap_or_default();
            let mut pos = 0u32;
            for c in text.chars() {
                let len = c.len_utf8() as u32;
                let bytes = &word[pos as usize..(pos + len) as usize];
                let id = vocab.id(bytes).or_else(|| self.extra_ids.get(bytes).copied()).unwrap_or(LONE);
                syms.push(Sym { id, start: pos, end: pos + len, prev: NIL, next: NIL });
                pos += len;
            }
        }
        let n = syms.len() as u32;
        for i in 0..n {
            let sym = &mut syms[i as usize];
            sym.prev = if i == 0 { NIL } else { i - 1 };
            sym.next = if i + 1 == n { NIL } else { i + 1 };
        }
        let heap = &mut s.heap;
        heap.clear();
        for i in 1..n as usize {
            if let Some(&(rank, _)) = self.merges.get(&pair(syms[i - 1].id, syms[i].id)) {
                heap.push(Reverse((rank, i as u32 - 1)));
            }
        }
        while let Some(Reverse((rank, left))) = heap.pop() {
            let l = syms[left as usize];
            if l.id == DEAD || l.next == NIL {
                continue;
            }
            let r = syms[l.next as usize];
            let Some(&(cur, merged)) = self.merges.get(&pair(l.id, r.id)) else { continue };
            if cur != rank {
                continue; // the pair changed since it was queued
            }
            let right = l.next;
            syms[right as usize].id = DEAD;
            let sym = &mut syms[left as usize];
            sym.id = merged;
            sym.end = r.end;
            sym.next = r.next;
            if r.next != NIL {
                syms[r.next as usize].prev = left;
            }
            let sym = syms[left as usize];
            if sym.prev != NIL {
                if let Some(&(rank, _)) = self.merges.get(&pair(syms[sym.prev as usize].id, sym.id)) {
                    heap.push(Reverse((rank, sym.prev)));
                }
            }
            if sym.next != NIL {
                if let Some(&(rank, _)) = self.merges.get(&pair(sym.id, syms[sym.next as usize].id)) {
                    heap.push(Reverse((rank, left)));
                }
            }
        }
        let mut i = if n == 0 { NIL } else { 0 };
        while i != NIL {
            let sym = syms[i as usize];
            i = sym.next;
            if sym.id < self.n_vocab {
                out.push(sym.id);
                continue;
            }
            // Not a token: llama.cpp falls back to the single bytes of the symbol's text.
            let raw = &word[sym.start as usize..sym.end as usize];
            if self.byte_encode {
                let mut enc = Vec::new();
                encode_bytes(raw, &mut enc);
                out.extend(enc.iter().filter_map(|&b| vocab.id(&[b])));
            } else {
                out.extend(raw.iter().filter_map(|&b| vocab.id(format!("<0x{b:02X}>").as_bytes())));
            }
        }
    }
}
