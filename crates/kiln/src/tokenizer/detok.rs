//! Streaming detokenization: text comes out only in whole UTF-8 characters, so a token
//! that ends inside a character (byte-fallback pieces, byte-level BPE) is held back until
//! the character completes. The concatenated output equals [`Tokenizer::decode`] of all
//! ids at once: invalid bytes become U+FFFD exactly as `String::from_utf8_lossy` does.

use std::sync::Arc;

use super::Tokenizer;

pub struct Detokenizer {
    tok: Arc<Tokenizer>,
    special: bool,
    /// Control tokens whose text is rendered even when `special` is off.
    shown: Vec<u32>,
    pending: Vec<u8>,
}

impl Detokenizer {
    /// `special`: render control tokens' text (as [`Tokenizer::token_to_piece`]).
    pub fn new(tok: Arc<Tokenizer>, special: bool) -> Detokenizer {
        Detokenizer { tok, special, shown: Vec::new(), pending: Vec::new() }
    }

    /// Also renders these control tokens' text (tool-call markers such as Mistral's
    /// `[TOOL_CALLS]`, which a reply's parser must see).
    pub fn with_shown(mut self, ids: Vec<u32>) -> Detokenizer {
        self.shown = ids;
        self
    }

    /// Adds a token; returns the text completed by it (possibly empty).
    pub fn push(&mut self, id: u32) -> String {
        let special = self.special || self.shown.contains(&id);
        self.pending.extend_from_slice(self.tok.token_to_piece(id, special));
        let mut out = String::new();
        let mut start = 0;
        loop {
            match std::str::from_utf8(&self.pending[start..]) {
                Ok(s) => {
                    out.push_str(s);
                    start = self.pending.len();
                    break;
                }
                Err(e) => {
                    let valid = start + e.valid_up_to();
                    // Safe: from_utf8 just checked these bytes.
                    out.push_str(std::str::from_utf8(&self.pending[start..valid]).unwrap_or_default());
                    match e.error_len() {
                        Some(n) => {
                            out.push('\u{FFFD}');
                            start = valid + n;
                        }
                        // An incomplete character at the end: wait for more bytes.
                        None => {
                            start = valid;
                            break;
                        }
                    }
                }
            }
        }
        self.pending.drain(..start);
        out
    }

    /// Ends the stream: whatever is held back, with U+FFFD for an unfinished character.
    pub fn finish(&mut self) -> String {
        let out = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        out
    }

    /// Bytes held back waiting for the rest of a character.
    pub fn pending(&self) -> &[u8] {
        &self.pending
    }
}
