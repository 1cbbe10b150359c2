//! Pre-tokenizers of byte-level BPE: split text into words before merging, per
//! `tokenizer.ggml.pre`. Each pre-tokenizer is a list of stages applied in turn to every
//! piece the previous stage left (what llama.cpp does with its list of regexes); the text
//! between matches stays a piece of its own.
//!
//! The GPT-2 family of patterns needs look-ahead (`\s+(?!\S)`), so each stage is written
//! by hand over Unicode categories. Where llama.cpp evaluates a pattern with `std::regex`
//! it first maps every non-ASCII code point to one byte per category (whitespace to
//! `\v`), so `\p{L}` there means "ASCII letter or any non-ASCII letter", `\s` means ASCII
//! whitespace or any non-ASCII White_Space, and explicit ranges see non-ASCII whitespace
//! as `\v`. The classes below follow that exactly.

use std::ops::Range;

use super::unicode::{flags, LETTER, MARK, NUMBER, PUNCT, WHITESPACE};

/// What a `tokenizer.ggml.pre` name implies, besides its stages.
pub(crate) struct PreInfo {
    pub stages: Vec<Stage>,
    /// Words are GPT-2 byte-encoded before merging (false for SentencePiece-style BPE).
    pub byte_encode: bool,
    /// A word that is itself a token is emitted without merging.
    pub ignore_merges: bool,
    /// llama.cpp's default for add_bos when the GGUF has no key.
    pub add_bos: bool,
    /// Spaces become U+2581 before splitting (SentencePiece-style BPE).
    pub escape_whitespace: bool,
    /// The family has no BOS token by default.
    pub no_bos: bool,
}

#[derive(Clone, Copy, Debug)]
pub(crate) enum Stage {
    /// `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`
    Gpt2,
    /// `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
    /// and its variants: `\p{N}` digits one at a time (qwen2), letters taking marks (qwen35).
    Llama3 { max_digits: usize, marks: bool },
    /// `[^\n]+|[\n]+`
    Newlines,
    /// `C+`
    Run(Class),
    /// `C`
    Single(Class),
    /// `CCC`
    Triples(Class),
    /// `\s?C+`
    SpaceRun(Class),
    /// `\s+$`
    TrailingSpace,
}

/// A character class, evaluated as llama.cpp's `std::regex` fallback sees code points.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Class {
    /// `[\p{P}\$\+<=>\^~\|]`
    PunctOrOps,
    /// `\p{N}`
    Number,
    /// `\p{L}`
    Letter,
    /// `\p{P}`
    Punct,
    /// `[0-9]`
    Digit,
    /// `[\r\n]`
    CrLf,
    /// Explicit code point ranges (a bracket expression without categories).
    Ranges(&'static [(u32, u32)]),
}

/// ASCII punctuation (`\p{P}` below 128).
fn ascii_punct(c: u8) -> bool {
    matches!(c, b'!'..=b'#' | b'%'..=b'*' | b','..=b'/' | b':' | b';' | b'?' | b'@' | b'['..=b']' | b'_'
        | b'{' | b'}')
}

/// `\s` as `std::regex` sees it after llama.cpp's mapping.
#[inline]
fn regex_space(c: char) -> bool {
    if c.is_ascii() {
        matches!(c, '\t'..='\r' | ' ')
    } else {
        flags(c) & WHITESPACE != 0
    }
}

impl Class {
    #[inline]
    fn has(self, c: char) -> bool {
        if c.is_ascii() {
            let b = c as u8;
            return match self {
                Class::PunctOrOps => ascii_punct(b) || b"$+<=>^~|".contains(&b),
                Class::Number | Class::Digit => b.is_ascii_digit(),
                Class::Letter => b.is_ascii_alphabetic(),
                Class::Punct => ascii_punct(b),
                Class::CrLf => b == b'\r' || b == b'\n',
                Class::Ranges(r) => in_ranges(r, c as u32),
            };
        }
        let f = flags(c);
        if f & WHITESPACE != 0 {
            // Mapped to '\v', which no class here contains.
            return false;
        }
        match self {
            Class::PunctOrOps | Class::Punct => f & PUNCT != 0,
            Class::Number => f & NUMBER != 0,
            Class::Letter => f & LETTER != 0,
            Class::Digit | Class::CrLf => false,
            Class::Ranges(r) => in_ranges(r, c as u32),
        }
    }
}

fn in_ranges(r: &[(u32, u32)], cp: u32) -> bool {
    r.iter().any(|&(a, b)| a <= cp && cp <= b)
}

/// deepseek-llm's letter class.
static DEEPSEEK_LETTERS: &[(u32, u32)] = &[
    (0x41, 0x5A),
    (0x61, 0x7A),
    (0xB5, 0xB5),
    (0xC0, 0xD6),
    (0xD8, 0xF6),
    (0xF8, 0x1BA),
    (0x1BC, 0x1BF),
    (0x1C4, 0x293),
    (0x295, 0x2AF),
    (0x370, 0x373),
    (0x376, 0x377),
    (0x37B, 0x37D),
    (0x37F, 0x37F),
    (0x386, 0x386),
    (0x388, 0x38A),
    (0x38C, 0x38C),
    (0x38E, 0x3A1),
    (0x3A3, 0x3F5),
    (0x3F7, 0x481),
    (0x48A, 0x52F),
    (0x531, 0x556),
    (0x10A0, 0x10C5),
    (0x13A0, 0x13F5),
    (0x13F8, 0x13FD),
    (0x1C90, 0x1CBA),
    (0x1CBD, 0x1CBF),
    (0x1D00, 0x1D2B),
    (0x1D6B, 0x1D77),
    (0x1D79, 0x1D9A),
    (0x1E00, 0x1F15),
    (0x1F18, 0x1F1D),
    (0x1F20, 0x1F45),
    (0x1F48, 0x1F4D),
    (0x1F50, 0x1F57),
    (0x1F59, 0x1F59),
    (0x1F5B, 0x1F5B),
    (0x1F5D, 0x1F5D),
    (0x1F5F, 0x1F7D),
    (0x1F80, 0x1FB4),
    (0x1FB6, 0x1FBC),
    (0x1FBE, 0x1FBE),
    (0x1FC2, 0x1FC4),
    (0x1FC6, 0x1FCC),
    (0x1FD0, 0x1FD3),
    (0x1FD6, 0x1FDB),
    (0x1FE0, 0x1FEC),
    (0x1FF2, 0x1FF4),
    (0x1FF6, 0x1FFC),
    (0x2102, 0x2102),
    (0x2107, 0x2107),
    (0x210A, 0x2113),
    (0x2115, 0x2115),
    (0x2119, 0x211D),
    (0x2124, 0x2124),
    (0x2126, 0x2126),
    (0x2128, 0x2128),
    (0x212A, 0x212D),
    (0x212F, 0x2134),
    (0x2139, 0x2139),
    (0x213C, 0x213F),
    (0x2145, 0x2149),
    (0x214E, 0x214E),
    (0x2183, 0x2184),
    (0x2C00, 0x2C7B),
    (0x2C7E, 0x2CE4),
    (0x2CEB, 0x2CEE),
    (0x2CF2, 0x2CF3),
    (0xA640, 0xA66D),
    (0xA680, 0xA69B),
    (0xA722, 0xA76F),
    (0xA771, 0xA787),
    (0xA78B, 0xA78E),
    (0xAB70, 0xABBF),
    (0xFB00, 0xFB06),
    (0xFB13, 0xFB17),
    (0xFF21, 0xFF3A),
    (0xFF41, 0xFF5A),
    (0x10400, 0x1044F),
    (0x104B0, 0x104D3),
    (0x104D8, 0x104FB),
    (0x10C80, 0x10CB2),
    (0x10CC0, 0x10CF2),
    (0x118A0, 0x118DF),
    (0x1E900, 0x1E943),
];
/// deepseek-llm's punctuation class: `[!-/:-~！-／：-～‘-‟　-。]`.
static DEEPSEEK_PUNCT: &[(u32, u32)] =
    &[(0x21, 0x2F), (0x3A, 0x7E), (0xFF01, 0xFF0F), (0xFF1A, 0xFF5E), (0x2018, 0x201F), (0x3000, 0x3002)];
/// deepseek's CJK class: `[一-龥ࠀ-一가-퟿]`.
static DEEPSEEK_CJK: &[(u32, u32)] = &[(0x4E00, 0x9FA5), (0x800, 0x4E00), (0xAC00, 0xD7FF)];

/// The stages and defaults for a `tokenizer.ggml.pre` name, or None if kiln lacks it.
pub(crate) fn lookup(pre: &str) -> Option<PreInfo> {
    use Stage::*;
    let llama3 = Llama3 { max_digits: 3, marks: false };
    let info = |stages: Vec<Stage>| PreInfo {
        stages,
        byte_encode: true,
        ignore_merges: false,
        add_bos: false,
        escape_whitespace: false,
        no_bos: false,
    };
    Some(match pre {
        "" | "default" => info(vec![Run(Class::PunctOrOps), Gpt2, Run(Class::Number), Triples(Class::Digit)]),
        "llama3" | "llama-v3" | "llama-bpe" | "falcon3" | "falcon-h1" | "pixtral" | "midm-2.0" | "lfm2"
        | "jina-v5-nano" => PreInfo { ignore_merges: true, add_bos: true, ..info(vec![llama3]) },
        "dbrx" | "smaug-bpe" => info(vec![llama3]),
        "chatglm-bpe" => PreInfo { no_bos: true, ..info(vec![llama3]) },
        "glm4" | "glm5" => PreInfo { no_bos: true, ignore_merges: true, ..info(vec![llama3]) },
        "deepseek-llm" => info(vec![
            Single(Class::CrLf),
            SpaceRun(Class::Ranges(DEEPSEEK_LETTERS)),
            SpaceRun(Class::Ranges(DEEPSEEK_PUNCT)),
            TrailingSpace,
            Run(Class::Ranges(DEEPSEEK_CJK)),
            Run(Class::Number),
        ]),
        "deepseek-coder" => info(vec![
            Single(Class::CrLf),
            SpaceRun(Class::Letter),
            SpaceRun(Class::Punct),
            Run(Class::Ranges(DEEPSEEK_CJK)),
            Single(Class::Number),
        ]),
        "falcon" => info(vec![Run(Class::PunctOrOps), Gpt2, Triples(Class::Digit)]),
        "starcoder" | "refact" | "command-r" | "smollm" | "codeshell" | "exaone" | "minerva-7b"
        | "mellum2" => info(vec![Single(Class::Number), Gpt2]),
        "gpt-2" | "phi-2" | "jina-es" | "jina-de" | "gigachat" | "jina-v2-es" | "jina-v2-de" | "a.x-4.0"
        | "mellum" | "modern-bert" | "mpt" | "olmo" | "jais" | "trillion" | "granite-docling" | "exaone4"
        | "jina-v1-en" | "jina-v2-code" | "roberta-bpe" => info(vec![Gpt2]),
        "qwen2" | "deepseek-r1-qwen" | "kormo" | "f2llmv2" | "stablelm2" | "megrez" | "hunyuan"
        | "solar-open" => info(vec![Llama3 { max_digits: 1, marks: false }]),
        "qwen35" => info(vec![Llama3 { max_digits: 1, marks: true }]),
        "gemma4" | "granite-embed-multi-311m" => {
            PreInfo { byte_encode: false, escape_whitespace: true, add_bos: true, ..info(vec![Newlines]) }
        }
        _ => return None,
    })
}

/// Splits `text` into words (byte ranges), running `stages` in order.
pub(crate) fn split(stages: &[Stage], text: &str, words: &mut Vec<Range<usize>>) {
    let cps: Vec<char> = text.chars().collect();
    let mut pieces = vec![cps.len()];
    let mut next = Vec::new();
    for stage in stages {
        next.clear();
        let mut start = 0;
        for &len in &pieces {
            let end = start + len;
            let n0 = next.len();
            stage.split(&cps, start, end, &mut next);
            debug_assert_eq!(next[n0..].iter().sum::<usize>(), len);
            start = end;
        }
        std::mem::swap(&mut pieces, &mut next);
    }
    let mut pos = 0;
    let mut ci = 0;
    for len in pieces {
        let start = pos;
        pos += cps[ci..ci + len].iter().map(|c| c.len_utf8()).sum::<usize>();
        ci += len;
        if len > 0 {
            words.push(start..pos);
        }
    }
}

impl Stage {
    /// Splits `cps[ini..end]`, pushing piece lengths (code points) that sum to its length.
    fn split(&self, cps: &[char], ini: usize, end: usize, out: &mut Vec<usize>) {
        match *self {
            Stage::Gpt2 => split_gpt2(cps, ini, end, out),
            Stage::Llama3 { max_digits, marks } => split_llama3(cps, ini, end, max_digits, marks, out),
            Stage::Newlines => {
                let mut pos = ini;
                while pos < end {
                    let nl = cps[pos] == '\n';
                    let start = pos;
                    while pos < end && (cps[pos] == '\n') == nl {
                        pos += 1;
                    }
                    out.push(pos - start);
                }
            }
            Stage::TrailingSpace => {
                // The only match is the whitespace at the end (found without rescanning).
                let mut s = end;
                while s > ini && regex_space(cps[s - 1]) {
                    s -= 1;
                }
                out.extend([s - ini, end - s].into_iter().filter(|&n| n > 0));
            }
            _ => self.split_matches(cps, ini, end, out),
        }
    }

    /// Patterns without look-around: find leftmost matches, keep the gaps as pieces.
    fn split_matches(&self, cps: &[char], ini: usize, end: usize, out: &mut Vec<usize>) {
        let mut prev = ini;
        let mut pos = ini;
        while pos < end {
            match self.match_at(cps, pos, end) {
                Some(m) => {
                    if pos > prev {
                        out.push(pos - prev);
                    }
                    out.push(m - pos);
                    pos = m;
                    prev = m;
                }
                None => pos += 1,
            }
        }
        if end > prev {
            out.push(end - prev);
        }
    }

    /// End of the match starting at `pos`, if one does.
    fn match_at(&self, cps: &[char], pos: usize, end: usize) -> Option<usize> {
        let run = |cls: Class, mut p: usize| {
            while p < end && cls.has(cps[p]) {
                p += 1;
            }
            p
        };
        match *self {
            Stage::Run(cls) => Some(run(cls, pos)).filter(|&e| e > pos),
            Stage::Single(cls) => cls.has(cps[pos]).then_some(pos + 1),
            Stage::Triples(cls) => {
                (pos + 3 <= end && cps[pos..pos + 3].iter().all(|&c| cls.has(c))).then_some(pos + 3)
            }
            Stage::SpaceRun(cls) => {
                if regex_space(cps[pos]) && pos + 1 < end && cls.has(cps[pos + 1]) {
                    Some(run(cls, pos + 1))
                } else {
                    Some(run(cls, pos)).filter(|&e| e > pos)
                }
            }
            Stage::Gpt2 | Stage::Llama3 { .. } | Stage::Newlines | Stage::TrailingSpace => None,
        }
    }
}

/// Flags of `cps[p]` with bit 8 set when `p` lies inside the piece (0 outside): the
/// hand-written patterns treat the piece's end like the end of the text.
const IN: u16 = 0x100;

struct Piece<'a> {
    cps: &'a [char],
    end: usize,
}

impl Piece<'_> {
    #[inline]
    fn f(&self, p: usize) -> u16 {
        if p < self.end {
            flags(self.cps[p]) as u16 | IN
        } else {
            0
        }
    }
    #[inline]
    fn c(&self, p: usize) -> Option<char> {
        (p < self.end).then(|| self.cps[p])
    }
}

const WS: u16 = WHITESPACE as u16;
const L: u16 = LETTER as u16;
const N: u16 = NUMBER as u16;
const M: u16 = MARK as u16;

/// `'s|'t|'m|'d` (2 code points) or `'re|'ve|'ll` (3) at `pos`, if present.
fn contraction(p: &Piece, pos: usize, fold_case: bool) -> Option<usize> {
    let lower = |c: Option<char>| c.map(|c| if fold_case { c.to_ascii_lowercase() } else { c });
    if p.c(pos) != Some('\'') || pos + 1 >= p.end {
        return None;
    }
    let a = lower(p.c(pos + 1));
    if matches!(a, Some('s' | 't' | 'm' | 'd')) {
        return Some(2);
    }
    if pos + 2 < p.end {
        let b = lower(p.c(pos + 2));
        if matches!((a, b), (Some('r'), Some('e')) | (Some('v'), Some('e')) | (Some('l'), Some('l'))) {
            return Some(3);
        }
    }
    None
}

/// Where the whitespace at `pos` ends as a piece of `\s+(?!\S)|\s+`, and the end of the
/// run's last `\r`/`\n` (0 if none).
fn space_run(p: &Piece, pos: usize) -> (usize, usize) {
    let mut n = 0;
    let mut last_nl = 0;
    while p.f(pos + n) & WS != 0 {
        if matches!(p.cps[pos + n], '\r' | '\n') {
            last_nl = pos + n + 1;
        }
        n += 1;
    }
    // \s+(?!\S) leaves the last space to the word after it; \s+ takes a run that ends the
    // piece; with no run, one character.
    let stop = if n > 1 && pos + n < p.end { pos + n - 1 } else { pos + n.max(1) };
    (stop, last_nl)
}

fn split_gpt2(cps: &[char], ini: usize, end: usize, out: &mut Vec<usize>) {
    let p = Piece { cps, end };
    let mut pos = ini;
    while pos < end {
        let start = pos;
        let c = cps[pos];
        if let Some(n) = contraction(&p, pos, false) {
            pos += n;
        } else {
            let f = p.f(pos);
            let f2 = if c == ' ' { p.f(pos + 1) } else { f };
            let other = |f: u16| f & (WS | L | N) == 0 && f != 0;
            let class = if f2 & L != 0 {
                Some(L)
            } else if f2 & N != 0 {
                Some(N)
            } else if other(f2) {
                Some(0)
            } else {
                None
            };
            if let Some(k) = class {
                pos += (c == ' ') as usize;
                while if k == 0 { other(p.f(pos)) } else { p.f(pos) & k != 0 } {
                    pos += 1;
                }
            } else {
                pos = space_run(&p, pos).0;
            }
        }
        out.push(pos - start);
    }
}

fn split_llama3(cps: &[char], ini: usize, end: usize, max_digits: usize, marks: bool, out: &mut Vec<usize>) {
    let p = Piece { cps, end };
    let word = if marks { L | M } else { L };
    let mut pos = ini;
    while pos < end {
        let start = pos;
        let c = cps[pos];
        let f = p.f(pos);
        if let Some(n) = contraction(&p, pos, true) {
            pos += n;
            out.push(pos - start);
            continue;
        }
        // [^\r\n\p{L}\p{N}]?\p{L}+
        if !(c == '\r' || c == '\n' || f & N != 0) && (f & word != 0 || p.f(pos + 1) & word != 0) {
            pos += 1;
            while p.f(pos) & word != 0 {
                pos += 1;
            }
            out.push(pos - start);
            continue;
        }
        // \p{N}{1,max_digits}
        if f & N != 0 {
            let mut ini = pos;
            while p.f(pos) & N != 0 {
                pos += 1;
                if pos - ini >= max_digits {
                    out.push(pos - ini);
                    ini = pos;
                }
            }
            if pos > ini {
                out.push(pos - ini);
            }
            continue;
        }
        // ' ?[^\s\p{L}\p{N}]+[\r\n]*' (the first test looks at `f`, not `f2`, as llama.cpp does)
        let stop = WS | word | N;
        let f2 = if c == ' ' { p.f(pos + 1) } else { f };
        if f2 & stop == 0 && f != 0 {
            pos += (c == ' ') as usize;
            let mut f2 = f2;
            while f2 & stop == 0 && f2 != 0 {
                pos += 1;
                f2 = p.f(pos);
            }
            while matches!(p.c(pos), Some('\r' | '\n')) {
                pos += 1;
            }
            out.push(pos - start);
            continue;
        }
        let (stop, last_nl) = space_run(&p, pos);
        pos = if last_nl > 0 { last_nl } else { stop }; // \s*[\r\n]+ first
        out.push(pos - start);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(pre: &str, text: &str) -> Vec<String> {
        let info = lookup(pre).unwrap();
        let mut w = Vec::new();
        split(&info.stages, text, &mut w);
        w.into_iter().map(|r| text[r].to_string()).collect()
    }

    #[test]
    fn gpt2_lookahead() {
        assert_eq!(words("gpt-2", "Hello  world\n\n x"), ["Hello", " ", " world", "\n\n", " x"]);
        assert_eq!(words("gpt-2", "it's 12.5$"), ["it", "'s", " 12", ".", "5", "$"]);
        assert_eq!(words("gpt-2", "a   "), ["a", "   "]);
    }

    #[test]
    fn llama3_and_qwen2() {
        assert_eq!(
            words("llama-bpe", "I'M 12345 ok!\n\n  x"),
            ["I", "'M", " ", "123", "45", " ok", "!\n\n", " ", " x"]
        );
        assert_eq!(words("qwen2", "ab 123"), ["ab", " ", "1", "2", "3"]);
    }

    #[test]
    fn default_stages() {
        assert_eq!(words("default", "a+b 12345"), ["a", "+", "b", " ", "123", "45"]);
    }
}
