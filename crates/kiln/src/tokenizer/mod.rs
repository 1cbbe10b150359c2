//! Tokenizers built from GGUF metadata alone, giving the token ids llama.cpp gives:
//! byte-level BPE with the pre-tokenizer named by `tokenizer.ggml.pre` (`gpt2`, and the
//! SentencePiece-style `gemma4` BPE), SentencePiece BPE with byte fallback (`llama`) and
//! WordPiece (`bert`).
//!
//! ```no_run
//! let g = kiln::gguf::GgufFile::open("model.gguf")?;
//! let tok = kiln::tokenizer::Tokenizer::from_gguf(&g)?;
//! let ids = tok.encode("Hello world", true, true)?;
//! assert_eq!(tok.decode(&ids, false), "Hello world");
//! # Ok::<(), kiln::KilnError>(())
//! ```

mod bpe;
mod detok;
mod pretok;
mod special;
mod spm;
mod unicode;
#[rustfmt::skip]
mod unicode_tables;
mod vocab;
mod wpm;

pub use detok::Detokenizer;

use bpe::{Bpe, BpeScratch};
use special::{Frag, SpecialTrie};
use spm::{Spm, SpmScratch};
use vocab::{attr, Kind, Vocab};

use crate::error::{KilnError, Result};
use crate::gguf::GgufFile;

enum Model {
    Spm(Box<Spm>),
    Bpe(Box<Bpe>),
    Wpm,
}

/// A tokenizer: text to token ids and back. `Send + Sync`; share it through an `Arc`.
pub struct Tokenizer {
    vocab: Vocab,
    model: Model,
    trie: SpecialTrie,
    /// Each token's output bytes (control tokens included), concatenated.
    pieces: Vec<u8>,
    piece_ends: Vec<u32>,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer").field("kind", &self.vocab.kind).field("n_vocab", &self.n_vocab()).finish()
    }
}

impl Tokenizer {
    /// Builds the tokenizer described by a GGUF file's `tokenizer.ggml.*` metadata.
    pub fn from_gguf(g: &GgufFile) -> Result<Tokenizer> {
        let vocab = Vocab::load(g)?;
        let model = match vocab.kind {
            Kind::Spm => Model::Spm(Box::new(Spm::new(&vocab))),
            Kind::Wpm => Model::Wpm,
            Kind::Bpe => {
                let pre = vocab
                    .pre
                    .as_ref()
                    .ok_or_else(|| KilnError::Tokenizer("BPE without pre-tokenizer".into()))?;
                let newline_words = !pre.byte_encode;
                Model::Bpe(Box::new(Bpe::new(g, &vocab, pre.byte_encode, pre.ignore_merges, newline_words)?))
            }
        };
        let trie = SpecialTrie::new(&vocab);
        let mut t = Tokenizer { vocab, model, trie, pieces: Vec::new(), piece_ends: Vec::new() };
        let mut pieces = Vec::new();
        let mut ends = Vec::with_capacity(t.vocab.texts.len());
        for id in 0..t.vocab.texts.len() {
            t.append_piece(id, &mut pieces);
            ends.push(pieces.len() as u32);
        }
        t.pieces = pieces;
        t.piece_ends = ends;
        Ok(t)
    }

    /// Number of tokens in the vocabulary.
    pub fn n_vocab(&self) -> usize {
        self.vocab.texts.len()
    }

    /// A rendered prompt (chat template output) as tokens: special tokens parsed, and BOS
    /// first when the model adds one and the text does not already begin with it
    /// (Hugging Face templates often write the BOS text themselves).
    pub fn encode_prompt(&self, text: &str) -> Result<Vec<u32>> {
        let mut ids = self.encode(text, false, true)?;
        if let Some(bos) = self.bos().filter(|_| self.add_bos()) {
            if ids.first() != Some(&bos) {
                ids.insert(0, bos);
            }
        }
        Ok(ids)
    }

    /// Token ids of `text`. With `add_special`, BOS is prepended iff [`Self::add_bos`] and EOS
    /// appended iff [`Self::add_eos`] (WordPiece: always CLS ... SEP, as llama.cpp does).
    /// With `parse_special`, texts of control tokens become those tokens; USER_DEFINED
    /// tokens are always matched whole.
    pub fn encode(&self, text: &str, add_special: bool, parse_special: bool) -> Result<Vec<u32>> {
        let v = &self.vocab;
        let frags = special::partition(v, &self.trie, text, parse_special);
        let mut out = Vec::with_capacity(text.len() / 3 + 2);
        let need = |id: Option<u32>, what: &str| {
            id.ok_or_else(|| KilnError::Tokenizer(format!("the vocabulary has no {what} token to add")))
        };
        let (add_bos, add_eos) = match v.kind {
            Kind::Wpm => (add_special, false),
            _ => (add_special && v.add_bos, add_special && v.add_eos),
        };
        if add_bos {
            out.push(need(v.bos, "BOS")?);
        }
        match &self.model {
            Model::Spm(spm) => {
                let mut scratch = SpmScratch::default();
                let mut prev_special = true;
                let mut buf = String::new();
                for f in &frags {
                    match f {
                        Frag::Text(r) => {
                            buf.clear();
                            if v.add_space_prefix && prev_special {
                                buf.push(' ');
                            }
                            buf.push_str(&text[r.clone()]);
                            let escaped = buf.replace(' ', "\u{2581}");
                            spm.encode(v, &escaped, &mut scratch, &mut out);
                            prev_special = false;
                        }
                        Frag::Token(id) => {
                            out.push(*id);
                            prev_special = true;
                        }
                    }
                }
            }
            Model::Bpe(bpe) => {
                let pre =
                    v.pre.as_ref().ok_or_else(|| KilnError::Tokenizer("BPE without pre-tokenizer".into()))?;
                let mut scratch = BpeScratch::default();
                let mut words = Vec::new();
                for f in &frags {
                    match f {
                        Frag::Text(r) => {
                            let escaped;
                            let t = if pre.escape_whitespace {
                                escaped = text[r.clone()].replace(' ', "\u{2581}");
                                escaped.as_str()
                            } else {
                                &text[r.clone()]
                            };
                            words.clear();
                            pretok::split(&pre.stages, t, &mut words);
                            for w in &words {
                                bpe.encode_word(v, &t.as_bytes()[w.clone()], &mut scratch, &mut out);
                            }
                        }
                        Frag::Token(id) => out.push(*id),
                    }
                }
            }
            Model::Wpm => {
                for f in &frags {
                    match f {
                        Frag::Text(r) => wpm::encode(v, &text[r.clone()], &mut out),
                        Frag::Token(id) => out.push(*id),
                    }
                }
                if add_special {
                    out.push(need(v.sep, "SEP")?);
                }
            }
        }
        if add_eos {
            out.push(need(v.eos, "EOS")?);
        }
        Ok(out)
    }

    /// The bytes token `id` contributes to output text. Control and unknown tokens give
    /// nothing unless `special`; then, like USER_DEFINED tokens, their text.
    pub fn token_to_piece(&self, id: u32, special: bool) -> &[u8] {
        let i = id as usize;
        let Some(&a) = self.vocab.attrs.get(i) else { return b"" };
        if !special && a & (attr::UNKNOWN | attr::CONTROL) != 0 {
            return b"";
        }
        let start = if i == 0 { 0 } else { self.piece_ends[i - 1] as usize };
        &self.pieces[start..self.piece_ends[i] as usize]
    }

    /// The text of `ids`: their pieces concatenated; invalid UTF-8 becomes U+FFFD.
    pub fn decode(&self, ids: &[u32], special: bool) -> String {
        let mut bytes = Vec::new();
        for &id in ids {
            bytes.extend_from_slice(self.token_to_piece(id, special));
        }
        match String::from_utf8(bytes) {
            Ok(s) => s,
            Err(e) => String::from_utf8_lossy(e.as_bytes()).into_owned(),
        }
    }

    /// A streaming decoder over this tokenizer.
    pub fn detokenizer(self: &std::sync::Arc<Self>, special: bool) -> Detokenizer {
        Detokenizer::new(self.clone(), special)
    }

    /// The vocabulary's kind as llama.cpp names it: `spm`, `bpe` or `wpm`.
    pub fn kind_name(&self) -> &'static str {
        match self.vocab.kind {
            Kind::Spm => "spm",
            Kind::Bpe => "bpe",
            Kind::Wpm => "wpm",
        }
    }

    /// The raw vocabulary entry of `id` ("" for an id outside the vocabulary).
    pub fn token_text(&self, id: u32) -> &str {
        self.vocab.texts.get(id as usize).map_or("", String::as_str)
    }

    /// The separator (WordPiece's `[SEP]`).
    pub fn sep(&self) -> Option<u32> {
        self.vocab.sep
    }
    pub fn bos(&self) -> Option<u32> {
        self.vocab.bos
    }
    pub fn eos(&self) -> Option<u32> {
        self.vocab.eos
    }
    pub fn add_bos(&self) -> bool {
        self.vocab.add_bos
    }
    pub fn add_eos(&self) -> bool {
        self.vocab.add_eos
    }

    /// End of generation: llama.cpp's set (EOS, EOT, EOM, FIM pad/repo/sep, and tokens
    /// such as `<|im_end|>`, `<end_of_turn>`, `</s>` found by their text).
    pub fn is_eog(&self, id: u32) -> bool {
        self.vocab.eog.binary_search(&id).is_ok()
    }

    /// The end-of-generation ids, ascending.
    pub fn eog_ids(&self) -> &[u32] {
        &self.vocab.eog
    }

    /// A CONTROL token (including tokens llama.cpp promotes to control by their text).
    pub fn is_control(&self, id: u32) -> bool {
        self.vocab.attrs.get(id as usize).is_some_and(|a| a & attr::CONTROL != 0)
    }

    fn append_piece(&self, id: usize, out: &mut Vec<u8>) {
        let v = &self.vocab;
        let (a, text) = (v.attrs[id], v.texts[id].as_str());
        if a & (attr::UNKNOWN | attr::CONTROL | attr::USER_DEFINED) != 0 {
            out.extend_from_slice(text.as_bytes());
        } else if a & attr::NORMAL != 0 {
            let sp_style = match &v.pre {
                Some(pre) => pre.escape_whitespace,
                None => true,
            };
            if sp_style {
                out.extend_from_slice(text.replace('\u{2581}', " ").as_bytes());
            } else {
                for c in text.chars() {
                    match bpe::char_to_byte(c) {
                        Some(b) => out.push(b),
                        None => {
                            // What llama.cpp writes for a character outside GPT-2's byte table.
                            out.extend_from_slice(b"[UNK_BYTE_0x");
                            let mut buf = [0u8; 4];
                            for b in c.encode_utf8(&mut buf).bytes() {
                                out.extend_from_slice(format!("{b:02x}").as_bytes());
                            }
                            out.extend_from_slice(text.as_bytes());
                            out.push(b']');
                        }
                    }
                }
            }
        } else if a & attr::BYTE != 0 {
            // "<0xNN>"
            let b = text.get(3..5).and_then(|h| u8::from_str_radix(h, 16).ok()).unwrap_or(0);
            out.push(b);
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn shareable_across_threads() {
        fn is_send_sync<T: Send + Sync>() {}
        is_send_sync::<super::Tokenizer>();
        is_send_sync::<super::Detokenizer>();
    }
}
