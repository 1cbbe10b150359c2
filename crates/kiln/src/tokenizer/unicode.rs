//! Unicode properties the pre-tokenizers need: general-category class per code point,
//! whitespace, simple lowercase and first-NFD-code-point. Tables follow Unicode 15.1, the
//! version of llama.cpp's own tables, so the splits agree with it code point for code point.

use std::sync::OnceLock;

use super::unicode_tables::{CATEGORY_RANGES, LOWERCASE, NFD_FIRST};

/// Category flags (one per code point; 0 = unassigned) plus the whitespace bit.
pub const NUMBER: u8 = 1; // \p{N}
pub const LETTER: u8 = 2; // \p{L}
#[cfg(test)]
pub const SEPARATOR: u8 = 4; // \p{Z}
pub const MARK: u8 = 8; // \p{M}
pub const PUNCT: u8 = 16; // \p{P}
pub const SYMBOL: u8 = 32; // \p{S}
pub const CONTROL: u8 = 64; // \p{C}
pub const WHITESPACE: u8 = 128; // \s (Unicode White_Space)

const N_CODEPOINTS: usize = 0x110000;

/// The White_Space property, as llama.cpp lists it.
fn is_white_space(cp: u32) -> bool {
    matches!(cp, 0x09..=0x0D | 0x20 | 0x85 | 0xA0 | 0x1680 | 0x2000..=0x200A | 0x2028 | 0x2029
        | 0x202F | 0x205F | 0x3000)
}

fn table() -> &'static [u8] {
    static TABLE: OnceLock<Vec<u8>> = OnceLock::new();
    TABLE.get_or_init(|| {
        let mut t = vec![0u8; N_CODEPOINTS];
        for (i, &(start, f)) in CATEGORY_RANGES.iter().enumerate() {
            let end = CATEGORY_RANGES.get(i + 1).map_or(N_CODEPOINTS, |r| r.0 as usize);
            t[start as usize..end].fill(f);
        }
        for (cp, f) in t.iter_mut().enumerate() {
            if is_white_space(cp as u32) {
                *f |= WHITESPACE;
            }
        }
        t
    })
}

/// Flags of a code point (category bit | WHITESPACE).
#[inline]
pub fn flags(c: char) -> u8 {
    table()[c as usize]
}

/// Simple (one code point) lowercase mapping.
pub fn to_lower(c: char) -> char {
    if c.is_ascii() {
        return c.to_ascii_lowercase();
    }
    match LOWERCASE.binary_search_by_key(&(c as u32), |p| p.0) {
        Ok(i) => char::from_u32(LOWERCASE[i].1).unwrap_or(c),
        Err(_) => c,
    }
}

/// The first code point of the NFD decomposition (what llama.cpp's WordPiece keeps when
/// stripping accents; the combining marks that follow are dropped anyway).
pub fn nfd_first(c: char) -> char {
    let cp = c as u32;
    let i = NFD_FIRST.partition_point(|r| r.0 <= cp);
    if i > 0 {
        let (first, last, nfd) = NFD_FIRST[i - 1];
        if first <= cp && cp <= last {
            return char::from_u32(nfd).unwrap_or(c);
        }
    }
    c
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn categories() {
        assert_eq!(flags('a'), LETTER);
        assert_eq!(flags('7'), NUMBER);
        assert_eq!(flags(' '), SEPARATOR | WHITESPACE);
        assert_eq!(flags('\n'), CONTROL | WHITESPACE);
        assert_eq!(flags('$'), SYMBOL);
        assert_eq!(flags('_'), PUNCT);
        assert_eq!(flags('\u{301}'), MARK);
        assert_eq!(flags('\u{3000}'), SEPARATOR | WHITESPACE);
        assert_eq!(flags('\u{378}'), 0); // unassigned
        assert_eq!(flags('\u{2EBF0}'), LETTER); // CJK Ext. I, new in 15.1
    }

    #[test]
    fn lower_and_nfd() {
        assert_eq!(to_lower('Ä'), 'ä');
        assert_eq!(to_lower('\u{130}'), 'i');
        assert_eq!(nfd_first('é'), 'e');
        assert_eq!(nfd_first('a'), 'a');
    }
}
