//! WordPiece (`tokenizer.ggml.model = bert`) as llama.cpp runs it: BERT normalization
//! (lowercase, accents stripped, punctuation and CJK characters split off), then the
//! longest vocabulary match from the left of each word, which carries a `▁` prefix.

use super::unicode::{flags, nfd_first, to_lower, CONTROL, MARK, PUNCT, SYMBOL, WHITESPACE};
use super::vocab::Vocab;

pub(crate) fn encode(vocab: &Vocab, text: &str, out: &mut Vec<u32>) {
    let mut word = String::from("\u{2581}");
    for w in words(vocab, text) {
        word.truncate(3);
        word.push_str(&w);
        encode_word(vocab, word.as_bytes(), out);
    }
}

fn encode_word(vocab: &Vocab, w: &[u8], out: &mut Vec<u32>) {
    let n = w.len();
    let start_len = out.len();
    let mut i = 0;
    while i < n {
        let longest = (i + 1..=n.min(i + vocab.max_token_len + 1))
            .rev()
            .find_map(|j| vocab.id(&w[i..j]).map(|id| (j, id)));
        match longest {
            Some((j, id)) => {
                out.push(id);
                i = j;
            }
            None => {
                // One unmatched position discards the whole word.
                out.truncate(start_len);
                break;
            }
        }
    }
    if out.len() == start_len {
        if let Some(unk) = vocab.unk {
            out.push(unk);
        }
    }
}

fn is_chinese(c: char) -> bool {
    matches!(c as u32, 0x4E00..=0x9FFF | 0x3400..=0x4DBF | 0x20000..=0x2A6DF | 0x2A700..=0x2B73F
        | 0x2B740..=0x2B81F | 0x2B920..=0x2CEAF | 0xF900..=0xFAFF | 0x2F800..=0x2FA1F)
}

/// BERT's basic tokenization into words.
fn words(vocab: &Vocab, text: &str) -> Vec<String> {
    let mut words = Vec::new();
    let mut cur = String::new();
    for c in text.chars() {
        let c = if vocab.strip_accents { nfd_first(c) } else { c };
        let f = flags(c);
        if f & WHITESPACE != 0 {
            if !cur.is_empty() {
                words.push(std::mem::take(&mut cur));
            }
            continue;
        }
        if c == '\0' || c == '\u{FFFD}' || f & CONTROL != 0 || (vocab.strip_accents && f & MARK != 0) {
            continue;
        }
        let lc = if vocab.lowercase { to_lower(c) } else { c };
        if f & PUNCT != 0 || ((c as u32) < 0x7F && f & SYMBOL != 0) || is_chinese(c) {
            if !cur.is_empty() {
                words.push(std::mem::take(&mut cur));
            }
            words.push(lc.to_string());
        } else {
            cur.push(lc);
        }
    }
    if !cur.is_empty() {
        words.push(cur);
    }
    words
}
