//! Incremental JSON helpers for the streaming tool-call parser: where a value ends in text
//! that arrives piece by piece, and a string's decoded text as far as it is known. Only
//! the delimiting structure is tracked here; whole values are validated by serde_json.

/// What a piece of text did to a value being scanned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Scan {
    /// The value ends after this many bytes of the piece.
    End(usize),
    /// The whole piece belongs to the value.
    More,
    /// The piece cannot continue a JSON value.
    Bad,
}

/// Finds where one JSON value ends. Feed it the value's text from its first byte (no
/// leading whitespace).
#[derive(Clone, Debug, Default)]
pub(crate) struct ValueScan {
    depth: u32,
    in_string: bool,
    escape: bool,
    started: bool,
    /// A bare number, `true`, `false` or `null`: it ends at the first byte that cannot
    /// belong to it.
    scalar: bool,
    string: bool,
}

impl ValueScan {
    /// Whether the value is a string (known from its first byte).
    pub fn is_string(&self) -> bool {
        self.string
    }

    pub fn feed(&mut self, s: &str) -> Scan {
        // Bytewise: every byte that matters is ASCII, and UTF-8 continuation bytes are not.
        for (i, b) in s.bytes().enumerate() {
            if !self.started {
                self.started = true;
                match b {
                    b'{' | b'[' => self.depth = 1,
                    b'"' => {
                        self.in_string = true;
                        self.string = true;
                    }
                    b'-' | b'0'..=b'9' | b't' | b'f' | b'n' => self.scalar = true,
                    _ => return Scan::Bad,
                }
                continue;
            }
            if self.in_string {
                if self.escape {
                    self.escape = false;
                } else if b == b'\\' {
                    self.escape = true;
                } else if b == b'"' {
                    self.in_string = false;
                    if self.depth == 0 {
                        return Scan::End(i + 1);
                    }
                }
                continue;
            }
            if self.scalar {
                if b.is_ascii_alphanumeric() || matches!(b, b'.' | b'+' | b'-') {
                    continue;
                }
                return Scan::End(i);
            }
            match b {
                b'{' | b'[' => self.depth += 1,
                b'}' | b']' => {
                    self.depth -= 1;
                    if self.depth == 0 {
                        return Scan::End(i + 1);
                    }
                }
                b'"' => self.in_string = true,
                _ => {}
            }
        }
        Scan::More
    }

    /// Whether the text may end here with the value complete (a bare scalar needs no
    /// delimiter at the very end).
    pub fn complete_at_end(&self) -> bool {
        self.started && self.scalar
    }
}

/// Decodes a JSON string's contents as they arrive (the text after the opening quote),
/// holding back an escape sequence until it is whole.
#[derive(Clone, Debug, Default)]
pub(crate) struct StringDecode {
    pending: String,
}

impl StringDecode {
    /// Adds raw string text (without the closing quote); returns what can be decoded now.
    /// `None`: the text is not a valid JSON string body.
    pub fn push(&mut self, raw: &str) -> Option<String> {
        self.pending.push_str(raw);
        let cut = safe_cut(&self.pending);
        let ready: String = self.pending.drain(..cut).collect();
        if ready.is_empty() {
            return Some(String::new());
        }
        serde_json::from_str::<String>(&format!("\"{ready}\"")).ok()
    }

    /// The rest, at the closing quote.
    pub fn finish(&mut self) -> Option<String> {
        let rest = std::mem::take(&mut self.pending);
        serde_json::from_str::<String>(&format!("\"{rest}\"")).ok()
    }
}

/// The longest prefix of `s` that ends outside an escape sequence (a `\u` high surrogate
/// waits for its low half).
fn safe_cut(s: &str) -> usize {
    let b = s.as_bytes();
    let mut i = 0;
    let mut cut = 0;
    while i < b.len() {
        if b[i] != b'\\' {
            i += 1;
            cut = i;
            continue;
        }
        let Some(&e) = b.get(i + 1) else { return cut };
        if e != b'u' {
            i += 2;
            cut = i;
            continue;
        }
        if b.len() < i + 6 {
            return cut;
        }
        let hex = std::str::from_utf8(&b[i + 2..i + 6]).ok().and_then(|h| u16::from_str_radix(h, 16).ok());
        let high = hex.is_some_and(|u| (0xD800..0xDC00).contains(&u));
        if high {
            if b.len() < i + 12 {
                return cut;
            }
            i += 12;
        } else {
            i += 6;
        }
        cut = i;
    }
    cut
}

#[cfg(test)]
mod tests {
    use super::*;

    fn end_of(text: &str, pieces: usize) -> Option<usize> {
        let mut s = ValueScan::default();
        let step = text.len().div_ceil(pieces).max(1);
        let mut at = 0;
        while at < text.len() {
            let mut end = (at + step).min(text.len());
            while !text.is_char_boundary(end) {
                end += 1;
            }
            match s.feed(&text[at..end]) {
                Scan::End(n) => return Some(at + n),
                Scan::More => at = end,
                Scan::Bad => return None,
            }
        }
        None
    }

    #[test]
    fn value_ends_are_found_whatever_the_pieces() {
        let cases = [
            (r#"{"a": [1, {"b": "}]"}], "c": "\"}"} tail"#, Some(35)),
            (r#""x\\" rest"#, Some(5)),
            ("123, 4", Some(3)),
            ("true}", Some(4)),
            (r#"{"é": "ü"}x"#, Some(12)),
            ("[1, 2", None),
        ];
        for (text, want) in cases {
            for pieces in [1, 2, 3, 7, 40] {
                assert_eq!(end_of(text, pieces), want, "{text:?} in {pieces} pieces");
            }
        }
        assert_eq!(ValueScan::default().feed("}"), Scan::Bad);
    }

    #[test]
    fn strings_decode_across_split_escapes() {
        let raw = r#"a\"b\\c\n\u00e9\ud83d\ude00 end"#;
        let want = "a\"b\\c\né😀 end";
        for split in 0..=raw.len() {
            let mut d = StringDecode::default();
            let mut got = d.push(&raw[..split]).unwrap();
            got += &d.push(&raw[split..]).unwrap();
            got += &d.finish().unwrap();
            assert_eq!(got, want, "split at {split}");
        }
        assert!(StringDecode::default().push("bad\\x").is_none());
    }
}
