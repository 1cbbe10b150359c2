//! Constrained sampling: output that must match a grammar — a JSON schema, any JSON
//! object, a regular expression, a Lark grammar or a GBNF grammar.
//!
//! The grammar engine is the `llguidance` crate (an Earley parser over derivative-based
//! lexers, walking a trie of the vocabulary's token bytes); kiln supplies its vocabulary
//! ([`GrammarEnv`], built once per engine), reads GBNF itself (written out as the
//! equivalent Lark grammar) and decides how the constraint meets the sampler chain
//! ([`Constraint`]): the chain samples first and only the chosen token is checked; the
//! full mask of allowed tokens is computed only when that token is rejected, and the
//! chain then runs again over the masked logits.
//!
//! A constraint can be lazy: inactive until a trigger (a token, a literal or a pattern in
//! the output) appears, then constraining the rest of the output from the trigger on —
//! the shape of a tool call inside free text.
//!
//! ```
//! use kiln::grammar::{Grammar, GrammarEnv};
//! // A vocabulary of the 256 single bytes, token 256 the end of generation.
//! let mut words: Vec<Vec<u8>> = (0..=255u8).map(|b| vec![b]).collect();
//! words.push(b"\xff<eos>".to_vec());
//! let env = std::sync::Arc::new(GrammarEnv::from_vocab(words, &[256])?);
//! let g = env.compile(&Grammar::Gbnf(r#"root ::= "yes" | "no""#.into()).into())?;
//! assert!(g.matches("yes") && !g.matches("maybe"));
//! # Ok::<(), kiln::KilnError>(())
//! ```

mod constraint;
mod env;
mod gbnf;
pub(crate) mod json;

pub use constraint::{Constraint, ConstraintStats};
pub use env::GrammarEnv;

use std::sync::Arc;

use llguidance::api::TopLevelGrammar;
use llguidance::Matcher;
use serde_json::{json, Value};

use crate::error::{KilnError, Result};

/// What the output must match.
#[derive(Clone, Debug, PartialEq)]
pub enum Grammar {
    /// A JSON schema (the draft 2020-12 keywords llguidance implements; any other keyword
    /// it knows of is an error naming it). Properties come in the schema's order; an object
    /// that lists `properties` without `additionalProperties` allows no others (as in
    /// llama.cpp); whitespace is bounded.
    JsonSchema(Value),
    /// Any JSON object.
    JsonObject,
    /// A regular expression (Rust `regex` syntax) the whole output must match.
    Regex(String),
    /// A grammar in llguidance's Lark dialect.
    Lark(String),
    /// A grammar in llama.cpp's GBNF (start symbol `root`).
    Gbnf(String),
}

impl Grammar {
    /// A JSON schema given as text.
    pub fn json_schema_str(text: &str) -> Result<Grammar> {
        let v: Value = serde_json::from_str(text)
            .map_err(|e| KilnError::Grammar(format!("JSON schema is not JSON: {e}")))?;
        Ok(Grammar::JsonSchema(v))
    }

    /// This grammar, inactive until one of `triggers` appears in the output.
    pub fn lazy(self, triggers: Vec<Trigger>) -> GrammarSpec {
        GrammarSpec { triggers, ..self.into() }
    }

    fn kind(&self) -> &'static str {
        match self {
            Grammar::JsonSchema(_) => "JSON schema",
            Grammar::JsonObject => "JSON object",
            Grammar::Regex(_) => "regex",
            Grammar::Lark(_) => "Lark grammar",
            Grammar::Gbnf(_) => "GBNF",
        }
    }
}

/// What starts a lazy constraint. The grammar then matches the output from the trigger's
/// start on, the trigger included (a grammar for `<tool_call>{...}</tool_call>` starts with
/// `"<tool_call>"`; for a control token, with its name: `<|python_tag|>` or `<[128010]>`).
#[derive(Clone, Debug, PartialEq)]
pub enum Trigger {
    /// This token id is sampled.
    Token(u32),
    /// This text appears in the output.
    Text(String),
    /// A match of this regular expression (Rust `regex` syntax) appears in the output
    /// (the last 64 KiB of it); the grammar starts at capture group 1 when the pattern
    /// has one, else at the match.
    Pattern(String),
}

/// A grammar and when it applies: from the first token (no triggers), or lazily.
#[non_exhaustive]
#[derive(Clone, Debug, PartialEq)]
pub struct GrammarSpec {
    pub grammar: Grammar,
    /// Empty: constrain from the first token. Otherwise: from the first trigger seen.
    pub triggers: Vec<Trigger>,
    /// Compute the full mask before every draw (see [`Constraint::set_mask_first`]).
    pub mask_first: bool,
}

impl GrammarSpec {
    /// Mask before every draw: the exact masked distribution, a full mask per token.
    pub fn with_mask_first(mut self, yes: bool) -> Self {
        self.mask_first = yes;
        self
    }
}

impl From<Grammar> for GrammarSpec {
    fn from(grammar: Grammar) -> Self {
        GrammarSpec { grammar, triggers: Vec::new(), mask_first: false }
    }
}

/// A compiled grammar, ready to start constraints (cheap: a copy of the parser's start
/// state). `Send + Sync`.
#[derive(Clone)]
pub struct CompiledGrammar {
    env: Arc<GrammarEnv>,
    matcher: Matcher,
    triggers: Arc<[constraint::TriggerMatcher]>,
    mask_first: bool,
}

impl std::fmt::Debug for CompiledGrammar {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CompiledGrammar").field("triggers", &self.triggers.len()).finish()
    }
}

impl GrammarEnv {
    /// Compiles `spec` against this vocabulary. Errors name the problem: a GBNF syntax error
    /// with its line and column, an unsupported JSON schema keyword, a bad regex...
    pub fn compile(self: &Arc<Self>, spec: &GrammarSpec) -> Result<CompiledGrammar> {
        let g = &spec.grammar;
        let what = g.kind();
        let top = match g {
            Grammar::JsonSchema(schema) => TopLevelGrammar::from_json_schema(json::with_defaults(schema)?),
            Grammar::JsonObject => {
                TopLevelGrammar::from_json_schema(json::with_defaults(&json!({"type": "object"}))?)
            }
            Grammar::Regex(rx) => {
                // llguidance reads some malformed patterns (a trailing `\`) as matching nothing.
                regex::Regex::new(rx)
                    .map_err(|e| KilnError::Grammar(format!("regex: invalid regex: {e}")))?;
                TopLevelGrammar::from_regex(rx)
            }
            Grammar::Lark(lark) => TopLevelGrammar::from_lark(lark.clone()),
            Grammar::Gbnf(src) => TopLevelGrammar::from_lark(gbnf::gbnf_to_lark(src, &**self)?),
        };
        let parser = self.factory.create_parser(top).map_err(|e| {
            let e = e.to_string();
            // A regex is compiled as the Lark rule `start: /REGEX/`; a position in that
            // rule means nothing to the caller.
            let e = match g {
                Grammar::Regex(_) => e.split_once("): ").map_or(e.as_str(), |(_, rest)| rest).to_string(),
                _ => e,
            };
            KilnError::Grammar(format!("{what}: {e}"))
        })?;
        let matcher = Matcher::new(Ok(parser));
        if let Some(e) = matcher.get_error() {
            return Err(KilnError::Grammar(format!("{what}: {e}")));
        }
        let triggers = spec
            .triggers
            .iter()
            .map(|t| constraint::TriggerMatcher::new(t, self.n_vocab()))
            .collect::<Result<Arc<[_]>>>()?;
        Ok(CompiledGrammar { env: self.clone(), matcher, triggers, mask_first: spec.mask_first })
    }
}

impl gbnf::TokenLookup for GrammarEnv {
    fn n_vocab(&self) -> usize {
        GrammarEnv::n_vocab(self)
    }
    fn token_named(&self, text: &str) -> Option<u32> {
        GrammarEnv::token_named(self, text)
    }
}

impl CompiledGrammar {
    /// A constraint for one sequence, at the start of its output.
    pub fn constraint(&self) -> Constraint {
        let mut c = Constraint::new(self.env.clone(), self.matcher.clone(), self.triggers.clone());
        c.set_mask_first(self.mask_first);
        c
    }

    /// Whether the whole of `text` matches the grammar (triggers ignored), checked byte by
    /// byte whatever the tokenization.
    pub fn matches(&self, text: &str) -> bool {
        let mut ids = Vec::new();
        for b in text.bytes() {
            match self.env.trie().token_id(&[b]) {
                Some(t) => ids.push(t),
                None => return self.matches_tokens(&self.env.trie().greedy_tokenize(text.as_bytes())),
            }
        }
        self.matches_tokens(&ids)
    }

    /// Whether the token sequence `ids` is a complete match of the grammar.
    pub fn matches_tokens(&self, ids: &[u32]) -> bool {
        let mut m = self.matcher.clone();
        if ids.iter().any(|&t| t as usize >= self.env.n_vocab()) {
            return false;
        }
        matches!(m.validate_tokens(ids), Ok(n) if n == ids.len())
            && m.consume_tokens(ids).is_ok()
            && m.is_accepting().unwrap_or(false)
    }
}

#[allow(dead_code)]
fn assert_send_sync() {
    fn is<T: Send + Sync>() {}
    is::<CompiledGrammar>();
    is::<GrammarEnv>();
    fn send<T: Send>() {}
    send::<Constraint>();
}
