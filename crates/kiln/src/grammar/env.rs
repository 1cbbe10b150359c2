//! The token environment llguidance constrains over: every token's bytes in a trie, the
//! end-of-generation set, and tokenization of forced text. Built once per engine.

use std::sync::Arc;

use llguidance::toktrie::{TokRxInfo, TokTrie, TokenId, TokenizerEnv, INVALID_TOKEN};
use llguidance::ParserFactory;

use crate::error::{KilnError, Result};
use crate::tokenizer::Tokenizer;

/// Marks a special (control) token's bytes in the trie, as llguidance expects: such tokens
/// match only where a grammar names them (`<|im_end|>`, `<[151645]>`), never as text.
const SPECIAL: u8 = TokTrie::SPECIAL_TOKEN_MARKER;

/// One model's vocabulary as llguidance sees it, and the parser factory over it (its
/// token-trie slices are computed once here, not per grammar).
pub struct GrammarEnv {
    pub(crate) factory: ParserFactory,
    pub(crate) tokenizer: Option<Arc<Tokenizer>>,
}

impl std::fmt::Debug for GrammarEnv {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GrammarEnv").field("n_vocab", &self.n_vocab()).finish()
    }
}

struct KilnTokEnv {
    trie: TokTrie,
    tokenizer: Option<Arc<Tokenizer>>,
}

impl TokenizerEnv for KilnTokEnv {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    /// The model's own tokenization of `s` when it gives back exactly these bytes (SPM's
    /// leading space would not), else a greedy walk of the trie.
    fn tokenize_bytes(&self, s: &[u8]) -> Vec<TokenId> {
        if let (Some(tok), Ok(text)) = (&self.tokenizer, std::str::from_utf8(s)) {
            if let Ok(ids) = tok.encode(text, false, false) {
                if self.trie.decode_raw(&ids) == s {
                    return ids;
                }
            }
        }
        self.trie.greedy_tokenize(s)
    }
}

impl GrammarEnv {
    /// The environment of a model's tokenizer: each token's output bytes; control and
    /// unknown tokens (which print nothing) as special tokens named by their text; the
    /// end-of-generation tokens as llguidance's EOS set.
    pub fn new(tokenizer: Arc<Tokenizer>) -> Result<GrammarEnv> {
        let words: Vec<Vec<u8>> = (0..tokenizer.n_vocab() as u32)
            .map(|id| {
                let piece = tokenizer.token_to_piece(id, false);
                if piece.is_empty() {
                    let mut w = vec![SPECIAL];
                    w.extend_from_slice(tokenizer.token_to_piece(id, true));
                    w
                } else {
                    piece.to_vec()
                }
            })
            .collect();
        let eog = tokenizer.eog_ids().to_vec();
        Self::build(words, &eog, Some(tokenizer))
    }

    /// An environment over an explicit vocabulary: token `i` is `words[i]` (a leading 0xFF
    /// byte makes it a special token), `eog` the end-of-generation ids. For tests and tools
    /// that check text against grammars without a model.
    pub fn from_vocab(words: Vec<Vec<u8>>, eog: &[u32]) -> Result<GrammarEnv> {
        Self::build(words, eog, None)
    }

    fn build(words: Vec<Vec<u8>>, eog: &[u32], tokenizer: Option<Arc<Tokenizer>>) -> Result<GrammarEnv> {
        let n = words.len();
        if n == 0 || n >= INVALID_TOKEN as usize {
            return Err(KilnError::Grammar(format!("a vocabulary of {n} tokens")));
        }
        if let Some(&bad) = eog.iter().find(|&&t| t as usize >= n) {
            return Err(KilnError::Grammar(format!(
                "end-of-generation token {bad} is outside the vocabulary"
            )));
        }
        let info = TokRxInfo::new(n as u32, eog.first().copied().unwrap_or(INVALID_TOKEN));
        let mut trie = TokTrie::from(&info, &words);
        if !eog.is_empty() {
            trie = trie.with_eos_tokens(eog);
        }
        let env = Arc::new(KilnTokEnv { trie, tokenizer: tokenizer.clone() });
        let mut factory =
            ParserFactory::new_simple(&(env as llguidance::toktrie::TokEnv)).map_err(grammar_err)?;
        factory.quiet();
        Ok(GrammarEnv { factory, tokenizer })
    }

    /// Tokens in the vocabulary.
    pub fn n_vocab(&self) -> usize {
        self.trie().vocab_size()
    }

    pub(crate) fn trie(&self) -> &TokTrie {
        self.factory.tok_env().tok_trie()
    }

    /// The one token `text` names (GBNF's `<name>`), as the model's tokenizer parses it with
    /// special tokens, or the special token of that text in an explicit vocabulary.
    pub(crate) fn token_named(&self, text: &str) -> Option<u32> {
        match &self.tokenizer {
            Some(tok) => match tok.encode(text, false, true) {
                Ok(ids) if ids.len() == 1 => Some(ids[0]),
                _ => None,
            },
            None => self.trie().get_special_token(text).or_else(|| self.trie().token_id(text.as_bytes())),
        }
    }
}

pub(crate) fn grammar_err(e: impl std::fmt::Display) -> KilnError {
    KilnError::Grammar(e.to_string())
}
