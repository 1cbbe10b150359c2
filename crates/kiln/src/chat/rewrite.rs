//! Source rewrites that close the gaps between minijinja and jinja2 which no filter or
//! callback can reach:
//!
//! - transformers' `{% generation %}…{% endgeneration %}` tag (it marks assistant text
//!   for training masks and renders its body) becomes `{% if true %}…{% endif %}`;
//! - `{% for x in EXPR %}` becomes `{% for x in (EXPR)|__py_iter %}`, because jinja2
//!   fails on iterating `None` ("'NoneType' object is not iterable") where minijinja
//!   iterates nothing; templates rely on that failure surfacing (tools=None).
//!
//! Whitespace-control markers (`-`, `+`) are kept, so trimming is unchanged.

/// The filter the `for` rewrite inserts.
pub const ITER_FILTER: &str = "__py_iter";

/// Applies the rewrites. Text outside tags, comments and `{% raw %}` blocks is copied
/// untouched.
pub fn rewrite(src: &str) -> String {
    let b = src.as_bytes();
    let mut out = String::with_capacity(src.len() + 64);
    let mut i = 0;
    let mut copied = 0;
    while i + 1 < b.len() {
        if b[i] != b'{' {
            i += 1;
            continue;
        }
        match b[i + 1] {
            b'#' => {
                i = src[i + 2..].find("#}").map_or(b.len(), |e| i + 2 + e + 2);
            }
            b'{' => {
                i = tag_end(src, i + 2, "}}");
            }
            b'%' => {
                let end = tag_end(src, i + 2, "%}");
                let tag = &src[i..end];
                let (lead, body, trail) = split_markers(tag);
                let word = body.split_whitespace().next().unwrap_or("");
                let replacement = match word {
                    "raw" => {
                        // Copy through to the end of the raw block unchanged.
                        let close = src[end..].find("endraw").map_or(b.len(), |e| end + e);
                        i = tag_end(src, close, "%}");
                        continue;
                    }
                    "generation" if body.trim() == "generation" => {
                        Some(format!("{{%{lead} if true {trail}%}}"))
                    }
                    "endgeneration" if body.trim() == "endgeneration" => {
                        Some(format!("{{%{lead} endif {trail}%}}"))
                    }
                    "for" => rewrite_for(body).map(|b| format!("{{%{lead}{b}{trail}%}}")),
                    _ => None,
                };
                if let Some(r) = replacement {
                    out.push_str(&src[copied..i]);
                    out.push_str(&r);
                    copied = end;
                }
                i = end;
            }
            _ => i += 1,
        }
    }
    out.push_str(&src[copied.min(src.len())..]);
    out
}

/// The index just past the `close` delimiter of a tag whose body starts at `from`,
/// skipping string literals; the end of the source if unterminated.
fn tag_end(src: &str, from: usize, close: &str) -> usize {
    let b = src.as_bytes();
    let mut i = from;
    while i < b.len() {
        match b[i] {
            b'\'' | b'"' => i = string_end(b, i),
            // Bytes, not `str`: `i` steps through multi-byte characters.
            _ if b[i..].starts_with(close.as_bytes()) => return i + close.len(),
            _ => i += 1,
        }
    }
    b.len()
}

/// The index just past the string literal opening at `b[at]` (a quote), backslash escapes
/// skipped; past the end of `b` if unterminated.
fn string_end(b: &[u8], at: usize) -> usize {
    let q = b[at];
    let mut i = at + 1;
    while i < b.len() && b[i] != q {
        i += if b[i] == b'\\' { 2 } else { 1 };
    }
    i + 1
}

/// `{%- body +%}` → ("-", " body ", "+").
fn split_markers(tag: &str) -> (&str, &str, &str) {
    let inner = tag.strip_prefix("{%").unwrap_or(tag);
    let inner = inner.strip_suffix("%}").unwrap_or(inner);
    let (lead, inner) = match inner.as_bytes().first() {
        Some(b'-' | b'+') => inner.split_at(1),
        _ => ("", inner),
    };
    let (inner, trail) = match inner.as_bytes().last() {
        Some(b'-' | b'+') => inner.split_at(inner.len() - 1),
        _ => (inner, ""),
    };
    (lead, inner, trail)
}

/// `for TARGET in EXPR [if COND] [recursive]` → `for TARGET in (EXPR)|__py_iter ...`.
fn rewrite_for(body: &str) -> Option<String> {
    let words = top_level_words(body);
    let in_at = words.iter().find(|(_, w)| *w == "in")?.0;
    let expr_start = in_at + 2;
    let expr_end = words
        .iter()
        .find(|(at, w)| *at > in_at && (*w == "if" || *w == "recursive"))
        .map_or(body.len(), |(at, _)| *at);
    let expr = body[expr_start..expr_end].trim();
    if expr.is_empty() {
        return None;
    }
    let trailing_ws = &body[expr_start + body[expr_start..expr_end].trim_end().len()..expr_end];
    Some(format!(
        "{} ({expr})|{ITER_FILTER}{}{}",
        &body[..expr_start],
        if trailing_ws.is_empty() { " " } else { trailing_ws },
        &body[expr_end..]
    ))
}

/// Identifier-like words outside strings and brackets, with their byte offsets.
fn top_level_words(s: &str) -> Vec<(usize, &str)> {
    let b = s.as_bytes();
    let mut words = Vec::new();
    let (mut i, mut depth) = (0usize, 0i32);
    while i < b.len() {
        match b[i] {
            b'\'' | b'"' => i = string_end(b, i),
            b'(' | b'[' | b'{' => {
                depth += 1;
                i += 1;
            }
            b')' | b']' | b'}' => {
                depth -= 1;
                i += 1;
            }
            c if c.is_ascii_alphabetic() || c == b'_' => {
                let start = i;
                while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'_') {
                    i += 1;
                }
                // A word preceded by '.' is an attribute, not a keyword.
                if depth == 0 && (start == 0 || b[start - 1] != b'.') {
                    words.push((start, &s[start..i]));
                }
            }
            _ => i += 1,
        }
    }
    words
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generation() {
        assert_eq!(
            rewrite("a{%- generation -%}b{% endgeneration %}c{% if x %}"),
            "a{%- if true -%}b{% endif %}c{% if x %}"
        );
    }

    #[test]
    fn for_loops() {
        assert_eq!(rewrite("{% for m in messages %}"), "{% for m in (messages)|__py_iter %}");
        assert_eq!(
            rewrite("{%- for k, v in d.items() if k != 'in' -%}x{% endfor %}"),
            "{%- for k, v in (d.items())|__py_iter if k != 'in' -%}x{% endfor %}"
        );
        assert_eq!(
            rewrite("{% for x in a[1:] + [\"%}\"] recursive %}"),
            "{% for x in (a[1:] + [\"%}\"])|__py_iter recursive %}"
        );
        // Comments, raw blocks and expressions are left alone.
        let s = "{# {% for a in b %} #}{% raw %}{% for a in b %}{% endraw %}{{ '{% for a in b %}' }}";
        assert_eq!(rewrite(s), s);
    }

    /// Multi-byte characters inside tags and expressions, outside strings (a panic the
    /// `chat_template` fuzz target found: the delimiter search sliced mid-character).
    #[test]
    fn multibyte_text_in_tags() {
        for s in ["{% é %}", "{{ x·y }}", "{% for é in 😀 %}", "{%- if ä -%}", "{{ '\\é' ~ ü }}", "{% é"]
        {
            let _ = rewrite(s);
        }
        assert_eq!(rewrite("{% for é in xs %}"), "{% for é in (xs)|__py_iter %}");
    }
}
