//! GBNF, llama.cpp's grammar format, read as llama.cpp reads it (src/llama-grammar.cpp)
//! and written out as an llguidance Lark grammar that accepts the same strings.
//!
//! GBNF is a context-free grammar over characters with no lexer. llguidance lexes greedily
//! (a lexeme extends as long as it can), which would change the language where a shorter
//! match is needed (`("a" | "ab") "bc"` must accept `abc`). So every character-level item
//! becomes a one-character lexeme and the Earley parser does all the choosing; the one
//! exception is a grammar that is regular as a whole (no recursion, no tokens), which is
//! written as one terminal: a single regular expression, matched exactly.

use std::collections::HashMap;
use std::fmt::Write;

use crate::error::{KilnError, Result};

/// llama.cpp's bound on repetition counts: a minimum above it is an error, a maximum
/// above it means no maximum.
const MAX_REPETITION: u64 = 2000;
/// Deepest nesting of groups and repetitions accepted (the parser and the emitter recurse).
const MAX_DEPTH: usize = 128;

/// How `<[id]>` and `<name>` are checked against the vocabulary.
pub(crate) trait TokenLookup {
    fn n_vocab(&self) -> usize;
    /// The single token `text` (brackets included) tokenizes to.
    fn token_named(&self, text: &str) -> Option<u32>;
}

#[derive(Clone, Debug)]
enum Node {
    /// A literal's characters (empty: matches the empty string).
    Literal(Vec<char>),
    /// Inclusive code point ranges (already clamped to valid `char`s).
    Class {
        negated: bool,
        ranges: Vec<(char, char)>,
    },
    Any,
    Rule(usize),
    Token {
        id: u32,
        negated: bool,
    },
    Group(Vec<Vec<Node>>),
    Repeat {
        node: Box<Node>,
        min: u64,
        max: Option<u64>,
    },
}

struct Rule {
    name: String,
    /// Where the rule was first named (defined or referenced), for errors.
    at: usize,
    alts: Option<Vec<Vec<Node>>>,
}

struct Parser<'a> {
    src: &'a str,
    pos: usize,
    rules: Vec<Rule>,
    by_name: HashMap<String, usize>,
    tokens: &'a dyn TokenLookup,
    depth: usize,
}

/// Converts a GBNF grammar (start symbol `root`) to llguidance's Lark syntax.
pub(crate) fn gbnf_to_lark(src: &str, tokens: &dyn TokenLookup) -> Result<String> {
    let mut p = Parser { src, pos: 0, rules: Vec::new(), by_name: HashMap::new(), tokens, depth: 0 };
    p.parse()?;
    let root = *p.by_name.get("root").ok_or_else(|| KilnError::Grammar("GBNF: no `root` rule".into()))?;
    for r in &p.rules {
        if r.alts.is_none() {
            return Err(p.error_at(r.at, &format!("undefined rule `{}`", r.name)));
        }
    }
    Ok(Emitter::new(&p.rules).emit(root))
}

impl<'a> Parser<'a> {
    fn bytes(&self) -> &'a [u8] {
        self.src.as_bytes()
    }

    fn peek(&self) -> Option<u8> {
        self.bytes().get(self.pos).copied()
    }

    fn peek_at(&self, k: usize) -> Option<u8> {
        self.bytes().get(self.pos + k).copied()
    }

    fn error_at(&self, pos: usize, msg: &str) -> KilnError {
        let before = &self.src[..pos.min(self.src.len())];
        let line = before.matches('\n').count() + 1;
        let col = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
        KilnError::Grammar(format!("GBNF line {line}, column {col}: {msg}"))
    }

    fn error(&self, msg: &str) -> KilnError {
        self.error_at(self.pos, msg)
    }

    fn parse(&mut self) -> Result<()> {
        self.space(true);
        while self.pos < self.src.len() {
            self.rule()?;
        }
        Ok(())
    }

    /// Blanks, tabs and `#` comments; newlines too when `newline_ok`.
    fn space(&mut self, newline_ok: bool) {
        while let Some(c) = self.peek() {
            match c {
                b' ' | b'\t' => self.pos += 1,
                b'\r' | b'\n' if newline_ok => self.pos += 1,
                b'#' => {
                    while !matches!(self.peek(), None | Some(b'\r' | b'\n')) {
                        self.pos += 1;
                    }
                }
                _ => break,
            }
        }
    }

    fn is_word(c: u8) -> bool {
        c.is_ascii_alphanumeric() || c == b'-'
    }

    fn name(&mut self) -> Result<&'a str> {
        let start = self.pos;
        while self.peek().is_some_and(Self::is_word) {
            self.pos += 1;
        }
        if self.pos == start {
            return Err(self.error("expected a rule name"));
        }
        Ok(&self.src[start..self.pos])
    }

    fn rule_id(&mut self, name: &str, at: usize) -> usize {
        if let Some(&i) = self.by_name.get(name) {
            return i;
        }
        self.rules.push(Rule { name: name.to_string(), at, alts: None });
        self.by_name.insert(name.to_string(), self.rules.len() - 1);
        self.rules.len() - 1
    }

    fn rule(&mut self) -> Result<()> {
        let at = self.pos;
        let name = self.name()?;
        let id = self.rule_id(name, at);
        self.space(false);
        if !self.src[self.pos..].starts_with("::=") {
            return Err(self.error("expected `::=`"));
        }
        self.pos += 3;
        self.space(true);
        let alts = self.alternates(false)?;
        // As in llama.cpp, a later definition of the same name replaces the earlier one.
        self.rules[id].alts = Some(alts);
        match self.peek() {
            None => {}
            Some(b'\n') => self.pos += 1,
            Some(b'\r') => self.pos += if self.peek_at(1) == Some(b'\n') { 2 } else { 1 },
            Some(_) => return Err(self.error("expected a newline or the end of the grammar")),
        }
        self.space(true);
        Ok(())
    }

    fn alternates(&mut self, nested: bool) -> Result<Vec<Vec<Node>>> {
        let mut alts = vec![self.sequence(nested)?];
        while self.peek() == Some(b'|') {
            self.pos += 1;
            self.space(true);
            alts.push(self.sequence(nested)?);
        }
        Ok(alts)
    }

    fn sequence(&mut self, nested: bool) -> Result<Vec<Node>> {
        let mut seq: Vec<Node> = Vec::new();
        while let Some(c) = self.peek() {
            let item = match c {
                b'"' => {
                    self.pos += 1;
                    let mut chars = Vec::new();
                    loop {
                        match self.peek() {
                            None => return Err(self.error("unterminated string literal")),
                            Some(b'"') => break,
                            _ => {
                                let at = self.pos;
                                let cp = self.char_value()?;
                                let c = char::from_u32(cp).ok_or_else(|| {
                                    self.error_at(at, &format!("U+{cp:X} is not a character"))
                                })?;
                                chars.push(c);
                            }
                        }
                    }
                    self.pos += 1;
                    Some(Node::Literal(chars))
                }
                b'[' => Some(self.class()?),
                b'<' | b'!' => Some(self.token()?),
                b'(' => {
                    let at = self.pos;
                    self.pos += 1;
                    self.space(true);
                    self.enter(at)?;
                    let alts = self.alternates(true)?;
                    self.depth -= 1;
                    if self.peek() != Some(b')') {
                        return Err(self.error("expected `)`"));
                    }
                    self.pos += 1;
                    Some(Node::Group(alts))
                }
                b'.' => {
                    self.pos += 1;
                    Some(Node::Any)
                }
                b'*' | b'+' | b'?' | b'{' => {
                    let at = self.pos;
                    let (min, max) = self.repetition(nested)?;
                    let last =
                        seq.pop().ok_or_else(|| self.error_at(at, "a repetition needs an item before it"))?;
                    if nesting(&last) >= MAX_DEPTH {
                        return Err(self.error_at(at, "repetitions nested too deeply"));
                    }
                    seq.push(Node::Repeat { node: Box::new(last), min, max });
                    None
                }
                c if Self::is_word(c) => {
                    let at = self.pos;
                    let name = self.name()?;
                    Some(Node::Rule(self.rule_id(name, at)))
                }
                _ => break,
            };
            if let Some(item) = item {
                seq.push(item);
            }
            self.space(nested);
        }
        Ok(seq)
    }

    fn enter(&mut self, at: usize) -> Result<()> {
        self.depth += 1;
        if self.depth > MAX_DEPTH {
            return Err(self.error_at(at, "groups nested too deeply"));
        }
        Ok(())
    }

    /// `*`, `+`, `?`, `{m}`, `{m,}`, `{m,n}` (the cursor is on the operator).
    fn repetition(&mut self, nested: bool) -> Result<(u64, Option<u64>)> {
        let op = self.peek();
        self.pos += 1;
        match op {
            Some(b'*') => return Ok((0, None)),
            Some(b'+') => return Ok((1, None)),
            Some(b'?') => return Ok((0, Some(1))),
            _ => {}
        }
        self.space(nested);
        let min = self.int()?;
        self.space(nested);
        let max = match self.peek() {
            Some(b'}') => Some(min),
            Some(b',') => {
                self.pos += 1;
                self.space(nested);
                let max =
                    if self.peek().is_some_and(|c| c.is_ascii_digit()) { Some(self.int()?) } else { None };
                self.space(nested);
                if self.peek() != Some(b'}') {
                    return Err(self.error("expected `}`"));
                }
                max
            }
            _ => return Err(self.error("expected `,` or `}`")),
        };
        self.pos += 1;
        if min > MAX_REPETITION {
            return Err(self.error(&format!("a repetition minimum above {MAX_REPETITION}")));
        }
        if max.is_some_and(|m| m < min) {
            return Err(self.error("a repetition maximum below its minimum"));
        }
        Ok((min, max.filter(|&m| m <= MAX_REPETITION)))
    }

    fn int(&mut self) -> Result<u64> {
        let start = self.pos;
        while self.peek().is_some_and(|c| c.is_ascii_digit()) {
            self.pos += 1;
        }
        if self.pos == start {
            return Err(self.error("expected an integer"));
        }
        self.src[start..self.pos].parse().map_err(|_| self.error_at(start, "integer too large"))
    }

    /// One character of a literal or class: an escape or a UTF-8 character, as a code point.
    fn char_value(&mut self) -> Result<u32> {
        let at = self.pos;
        let rest = &self.src[self.pos..];
        let Some(c) = rest.chars().next() else {
            return Err(self.error("unexpected end of grammar"));
        };
        if c != '\\' {
            self.pos += c.len_utf8();
            return Ok(c as u32);
        }
        let esc = rest[1..].chars().next();
        self.pos += 1 + esc.map_or(0, char::len_utf8);
        let hex = |p: &mut Self, n: usize| -> Result<u32> {
            let digits = p.src.get(p.pos..p.pos + n).filter(|d| d.bytes().all(|b| b.is_ascii_hexdigit()));
            let d = digits.ok_or_else(|| p.error_at(at, &format!("expected {n} hex digits")))?;
            p.pos += n;
            u32::from_str_radix(d, 16).map_err(|_| p.error_at(at, "bad hex escape"))
        };
        match esc {
            Some('x') => hex(self, 2),
            Some('u') => hex(self, 4),
            Some('U') => hex(self, 8),
            Some('t') => Ok('\t' as u32),
            Some('r') => Ok('\r' as u32),
            Some('n') => Ok('\n' as u32),
            Some(c @ ('\\' | '"' | '[' | ']' | '-')) => Ok(c as u32),
            _ => Err(self.error_at(at, "unknown escape")),
        }
    }

    fn class(&mut self) -> Result<Node> {
        self.pos += 1;
        let negated = self.peek() == Some(b'^');
        if negated {
            self.pos += 1;
        }
        let mut ranges = Vec::new();
        let mut n_items = 0;
        loop {
            match self.peek() {
                None => return Err(self.error("unterminated character class")),
                Some(b']') => break,
                _ => n_items += 1,
            }
            let lo = self.char_value()?;
            let mut hi = lo;
            if self.peek() == Some(b'-') && self.peek_at(1) != Some(b']') {
                self.pos += 1;
                if self.peek().is_none() {
                    return Err(self.error("unterminated character class"));
                }
                hi = self.char_value()?;
            }
            push_range(&mut ranges, lo, hi);
        }
        self.pos += 1;
        if n_items == 0 {
            // llama.cpp reads `[]` and `[^]` as no element at all.
            return Ok(Node::Literal(Vec::new()));
        }
        Ok(Node::Class { negated, ranges })
    }

    /// `<[id]>`, `<text>` (one token of the vocabulary), or either negated with `!`.
    fn token(&mut self) -> Result<Node> {
        let at = self.pos;
        let negated = self.peek() == Some(b'!');
        if negated {
            self.pos += 1;
        }
        if self.peek() != Some(b'<') {
            return Err(self.error("expected `<` after `!`"));
        }
        let start = self.pos;
        let end = self.src[start..].find('>').map(|i| start + i).ok_or_else(|| self.error("expected `>`"))?;
        let text = &self.src[start..=end];
        let id = if let Some(num) = text.strip_prefix("<[").and_then(|t| t.strip_suffix("]>")) {
            if num.is_empty() || !num.bytes().all(|b| b.is_ascii_digit()) {
                return Err(self.error_at(at, "expected a token id in `<[...]>`"));
            }
            let id: u64 = num.parse().unwrap_or(u64::MAX);
            if id >= self.tokens.n_vocab() as u64 {
                return Err(self.error_at(
                    at,
                    &format!("token id {num} is outside the vocabulary ({} tokens)", self.tokens.n_vocab()),
                ));
            }
            id as u32
        } else {
            self.tokens
                .token_named(text)
                .ok_or_else(|| self.error_at(at, &format!("`{text}` is not one token of this vocabulary")))?
        };
        self.pos = end + 1;
        Ok(Node::Token { id, negated })
    }
}

/// Adds `lo..=hi` as valid `char`s: surrogates and values past U+10FFFF match nothing in
/// UTF-8 text, and a reversed range matches nothing, as in llama.cpp.
fn push_range(ranges: &mut Vec<(char, char)>, lo: u32, hi: u32) {
    for (a, b) in [(lo, hi.min(0xD7FF)), (lo.max(0xE000), hi.min(0x10FFFF))] {
        if let (Some(a), Some(b)) = (char::from_u32(a), char::from_u32(b)) {
            if a <= b {
                ranges.push((a, b));
            }
        }
    }
}

fn nesting(n: &Node) -> usize {
    match n {
        Node::Repeat { node, .. } => 1 + nesting(node),
        _ => 0,
    }
}

/// Writes the parsed rules as Lark.
struct Emitter<'r> {
    rules: &'r [Rule],
    names: Vec<String>,
}

impl<'r> Emitter<'r> {
    fn new(rules: &'r [Rule]) -> Self {
        Emitter { rules, names: Vec::new() }
    }

    /// Lark names from GBNF ones (lowercase for rules, uppercase for terminals; GBNF names
    /// are case-sensitive and may start with a digit, so clashes get a numeric suffix).
    fn assign_names(&mut self, terminal: bool) {
        let mut used: HashMap<String, ()> = HashMap::new();
        used.insert("start".into(), ());
        used.insert("START".into(), ());
        self.names = self
            .rules
            .iter()
            .map(|r| {
                let base = if terminal { r.name.to_uppercase() } else { r.name.to_lowercase() };
                let base = if base.starts_with(|c: char| c.is_ascii_alphabetic()) {
                    base
                } else {
                    format!("{}{base}", if terminal { "R" } else { "r" })
                };
                let mut name = base.clone();
                let mut k = 1;
                while used.contains_key(&name) {
                    k += 1;
                    name = format!("{base}-{k}");
                }
                used.insert(name.clone(), ());
                name
            })
            .collect();
    }

    /// The Lark grammar of the rules reachable from `root`.
    fn emit(mut self, root: usize) -> String {
        let regular = self.is_regular(root);
        self.assign_names(regular);
        let mut reachable = vec![false; self.rules.len()];
        let mut todo = vec![root];
        while let Some(r) = todo.pop() {
            if std::mem::replace(&mut reachable[r], true) {
                continue;
            }
            let mut tokens = false;
            for n in self.rules[r].alts.iter().flatten().flatten() {
                collect_refs(n, &mut todo, &mut tokens);
            }
        }
        let mut out = String::new();
        let _ = writeln!(out, "start: {}", self.names[root]);
        for (i, r) in self.rules.iter().enumerate() {
            let (true, Some(alts)) = (reachable[i], &r.alts) else { continue };
            let _ = write!(out, "{}: ", self.names[i]);
            self.alts(&mut out, alts, regular);
            out.push('\n');
        }
        out
    }

    /// Whether the rules reachable from `root` use no recursion and no tokens, so the whole
    /// language is one regular expression.
    fn is_regular(&self, root: usize) -> bool {
        // 0: unvisited, 1: on the stack, 2: done.
        let mut state = vec![0u8; self.rules.len()];
        self.acyclic(root, &mut state)
    }

    fn acyclic(&self, rule: usize, state: &mut [u8]) -> bool {
        match state[rule] {
            1 => return false,
            2 => return true,
            _ => {}
        }
        state[rule] = 1;
        let mut refs = Vec::new();
        let mut tokens = false;
        for seq in self.rules[rule].alts.iter().flatten() {
            for n in seq {
                collect_refs(n, &mut refs, &mut tokens);
            }
        }
        let ok = !tokens && refs.iter().all(|&r| self.acyclic(r, state));
        state[rule] = 2;
        ok
    }

    fn alts(&self, out: &mut String, alts: &[Vec<Node>], regular: bool) {
        for (k, seq) in alts.iter().enumerate() {
            if k > 0 {
                out.push_str(" | ");
            }
            if seq.is_empty() {
                out.push_str("\"\"");
            }
            for (j, n) in seq.iter().enumerate() {
                if j > 0 {
                    out.push(' ');
                }
                self.node(out, n, regular);
            }
        }
    }

    fn node(&self, out: &mut String, n: &Node, regular: bool) {
        match n {
            // In a terminal a literal is exact; in a rule, one lexeme per character.
            Node::Literal(chars) if chars.is_empty() => out.push_str("\"\""),
            Node::Literal(chars) if regular || chars.len() == 1 => {
                out.push('"');
                chars.iter().for_each(|&c| push_string_char(out, c));
                out.push('"');
            }
            Node::Literal(chars) => {
                out.push('(');
                for (i, &c) in chars.iter().enumerate() {
                    out.push_str(if i > 0 { " \"" } else { "\"" });
                    push_string_char(out, c);
                    out.push('"');
                }
                out.push(')');
            }
            Node::Class { negated, ranges } => push_class(out, *negated, ranges),
            Node::Any => out.push_str("/(?s:.)/"),
            Node::Rule(r) => out.push_str(&self.names[*r]),
            Node::Token { id, negated } => {
                let _ = write!(out, "<[{}{id}]>", if *negated { "^" } else { "" });
            }
            Node::Group(alts) => {
                out.push('(');
                self.alts(out, alts, regular);
                out.push(')');
            }
            Node::Repeat { node, min, max } => {
                out.push('(');
                self.node(out, node, regular);
                out.push(')');
                let _ = match (min, max) {
                    (0, None) => write!(out, "*"),
                    (1, None) => write!(out, "+"),
                    (0, Some(1)) => write!(out, "?"),
                    (m, None) => write!(out, "{{{m},}}"),
                    (m, Some(x)) => write!(out, "{{{m},{x}}}"),
                };
            }
        }
    }
}

fn collect_refs(n: &Node, refs: &mut Vec<usize>, tokens: &mut bool) {
    match n {
        Node::Rule(r) => refs.push(*r),
        Node::Token { .. } => *tokens = true,
        Node::Group(alts) => alts.iter().flatten().for_each(|n| collect_refs(n, refs, tokens)),
        Node::Repeat { node, .. } => collect_refs(node, refs, tokens),
        Node::Literal(_) | Node::Class { .. } | Node::Any => {}
    }
}

/// A character inside a Lark (JSON-syntax) string literal.
fn push_string_char(out: &mut String, c: char) {
    match c {
        '"' => out.push_str("\\\""),
        '\\' => out.push_str("\\\\"),
        c if (c as u32) < 0x20 || c == '\x7f' => {
            let _ = write!(out, "\\u{:04x}", c as u32);
        }
        c => out.push(c),
    }
}

/// A character class as a Lark regex; every character escaped as `\x{..}` but ASCII
/// letters and digits. A class left empty by invalid code points matches no character
/// (negated: any).
fn push_class(out: &mut String, negated: bool, ranges: &[(char, char)]) {
    if ranges.is_empty() {
        out.push_str(if negated { "/(?s:.)/" } else { "/[^\\x{0}-\\x{10FFFF}]/" });
        return;
    }
    out.push_str(if negated { "/[^" } else { "/[" });
    let one = |out: &mut String, c: char| {
        if c.is_ascii_alphanumeric() {
            out.push(c);
        } else {
            let _ = write!(out, "\\x{{{:x}}}", c as u32);
        }
    };
    for &(a, b) in ranges {
        one(out, a);
        if b != a {
            out.push('-');
            one(out, b);
        }
    }
    out.push_str("]/");
}
