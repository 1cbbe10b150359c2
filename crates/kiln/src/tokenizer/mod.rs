//! Placeholder until the tokenizer module lands (interface only).
#![allow(dead_code, unused_variables)]
use crate::error::{KilnError, Result};
use crate::gguf::GgufFile;
use std::sync::Arc;
pub struct Tokenizer {
    n_vocab: usize,
}
impl Tokenizer {
    pub fn from_gguf(g: &GgufFile) -> Result<Tokenizer> {
        Ok(Tokenizer { n_vocab: g.get_array("tokenizer.ggml.tokens")?.map_or(0, |a| a.len()) })
    }
    pub fn n_vocab(&self) -> usize {
        self.n_vocab
    }
    pub fn encode(&self, text: &str, add_special: bool, parse_special: bool) -> Result<Vec<u32>> {
        Err(KilnError::Tokenizer("not yet".into()))
    }
    pub fn bos(&self) -> Option<u32> {
        None
    }
    pub fn add_bos(&self) -> bool {
        false
    }
    pub fn is_eog(&self, id: u32) -> bool {
        false
    }
}
pub struct Detokenizer {
    t: Arc<Tokenizer>,
}
impl Detokenizer {
    pub fn new(t: Arc<Tokenizer>) -> Self {
        Detokenizer { t }
    }
    pub fn push(&mut self, id: u32) -> String {
        String::new()
    }
    pub fn finish(&mut self) -> String {
        String::new()
    }
}
