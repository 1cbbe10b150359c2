//! Python's text forms of template values: `str()`, `repr()` and `json.dumps`, so that
//! what a template prints matches what jinja2 prints (`None`, `True`, `['a', 1]`, ...).

use minijinja::value::{Enumerator, Object, ObjectRepr, Value, ValueKind};
use minijinja::{Error, ErrorKind};
use std::fmt::Write;
use std::sync::Arc;

/// What jinja2's `map`, `select`, `selectattr`... return: a generator. It iterates, but
/// has no `len()` and is not JSON serializable; `|list` makes it a list.
#[derive(Debug)]
pub struct Generator(pub Vec<Value>);

impl Object for Generator {
    fn repr(self: &Arc<Self>) -> ObjectRepr {
        ObjectRepr::Iterable
    }
    fn enumerate(self: &Arc<Self>) -> Enumerator {
        Enumerator::Values(self.0.clone())
    }
}

pub fn is_generator(v: &Value) -> bool {
    v.downcast_object_ref::<Generator>().is_some()
}

/// Python `str(x)`: strings as they are, everything else as `repr`.
pub fn py_str(v: &Value) -> String {
    match v.kind() {
        ValueKind::String => v.as_str().unwrap_or_default().to_string(),
        ValueKind::Undefined => String::new(),
        _ => py_repr(v),
    }
}

/// Python `repr(x)` for the values templates see.
pub fn py_repr(v: &Value) -> String {
    let mut out = String::new();
    write_repr(&mut out, v);
    out
}

fn write_repr(out: &mut String, v: &Value) {
    match v.kind() {
        ValueKind::Undefined => {}
        ValueKind::None => out.push_str("None"),
        ValueKind::Bool => out.push_str(if v.is_true() { "True" } else { "False" }),
        ValueKind::Number => out.push_str(&py_number(v)),
        ValueKind::String => repr_str(out, v.as_str().unwrap_or_default()),
        ValueKind::Iterable if is_generator(v) => out.push_str("<generator object>"),
        ValueKind::Seq | ValueKind::Iterable => {
            out.push('[');
            if let Ok(it) = v.try_iter() {
                for (i, x) in it.enumerate() {
                    if i > 0 {
                        out.push_str(", ");
                    }
                    write_repr(out, &x);
                }
            }
            out.push(']');
        }
        ValueKind::Map => {
            out.push('{');
            if let Ok(it) = v.try_iter() {
                for (i, k) in it.enumerate() {
                    if i > 0 {
                        out.push_str(", ");
                    }
                    write_repr(out, &k);
                    out.push_str(": ");
                    write_repr(out, &v.get_item(&k).unwrap_or_default());
                }
            }
            out.push('}');
        }
        _ => out.push_str(&v.to_string()),
    }
}

/// Python's string repr: single quotes unless the text has one and no double quote.
fn repr_str(out: &mut String, s: &str) {
    let q = if s.contains('\'') && !s.contains('"') { '"' } else { '\'' };
    out.push(q);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c == q => {
                out.push('\\');
                out.push(c);
            }
            c if (c as u32) < 0x20 || c as u32 == 0x7f => {
                let _ = write!(out, "\\x{:02x}", c as u32);
            }
            c if (0x80..0xa0).contains(&(c as u32)) => {
                let _ = write!(out, "\\x{:02x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push(q);
}

/// A number as Python prints it: ints plainly, floats by `float.__repr__`.
pub fn py_number(v: &Value) -> String {
    if v.is_integer() {
        return v.to_string();
    }
    match f64::try_from(v.clone()) {
        Ok(f) => py_float(f),
        Err(_) => v.to_string(),
    }
}

/// `float.__repr__`: the shortest round-trip digits, positional for 1e-4 <= |x| < 1e16,
/// scientific (`1e+16`, `1.5e-05`) otherwise.
pub fn py_float(f: f64) -> String {
    if f.is_nan() {
        return "nan".into();
    }
    if f.is_infinite() {
        return if f > 0.0 { "inf".into() } else { "-inf".into() };
    }
    if f == 0.0 {
        return if f.is_sign_negative() { "-0.0".into() } else { "0.0".into() };
    }
    // Rust's `{:e}` gives the same shortest digits: "d.ddde±x".
    let sci = format!("{:e}", f);
    let (mant, exp) = sci.split_once('e').unwrap_or((&sci, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let (neg, mant) = match mant.strip_prefix('-') {
        Some(m) => (true, m),
        None => (false, mant),
    };
    let digits: String = mant.chars().filter(|c| c.is_ascii_digit()).collect();
    let mut s = String::new();
    if neg {
        s.push('-');
    }
    if (-4..16).contains(&exp) {
        let point = exp + 1; // digits before the decimal point
        if point <= 0 {
            s.push_str("0.");
            s.extend(std::iter::repeat_n('0', (-point) as usize));
            s.push_str(&digits);
        } else if point as usize >= digits.len() {
            s.push_str(&digits);
            s.extend(std::iter::repeat_n('0', point as usize - digits.len()));
            s.push_str(".0");
        } else {
            s.push_str(&digits[..point as usize]);
            s.push('.');
            s.push_str(&digits[point as usize..]);
        }
    } else {
        s.push_str(&digits[..1]);
        if digits.len() > 1 {
            s.push('.');
            s.push_str(&digits[1..]);
        }
        let _ = write!(s, "e{}{:02}", if exp < 0 { '-' } else { '+' }, exp.abs());
    }
    s
}

/// Options of Python's `json.dumps` that HF's `tojson` passes through.
#[derive(Clone, Debug, Default)]
pub struct JsonOpts {
    pub ensure_ascii: bool,
    /// `None`: one line; `Some(s)`: newline per item, indented by `s` per level.
    pub indent: Option<String>,
    pub item_sep: Option<String>,
    pub key_sep: Option<String>,
    pub sort_keys: bool,
}

/// Python's `json.dumps(v, ...)`.
pub fn json_dumps(v: &Value, o: &JsonOpts) -> Result<String, Error> {
    let item_sep = o.item_sep.clone().unwrap_or_else(|| if o.indent.is_some() { "," } else { ", " }.into());
    let key_sep = o.key_sep.clone().unwrap_or_else(|| ": ".into());
    let mut out = String::new();
    let mut w = JsonWriter { o, item_sep: &item_sep, key_sep: &key_sep, out: &mut out };
    w.value(v, 0)?;
    Ok(out)
}

struct JsonWriter<'a> {
    o: &'a JsonOpts,
    item_sep: &'a str,
    key_sep: &'a str,
    out: &'a mut String,
}

impl JsonWriter<'_> {
    fn newline(&mut self, depth: usize) {
        if let Some(ind) = &self.o.indent {
            self.out.push('\n');
            for _ in 0..depth {
                self.out.push_str(ind);
            }
        }
    }

    fn value(&mut self, v: &Value, depth: usize) -> Result<(), Error> {
        match v.kind() {
            ValueKind::None => self.out.push_str("null"),
            ValueKind::Bool => self.out.push_str(if v.is_true() { "true" } else { "false" }),
            ValueKind::Number => {
                if v.is_integer() {
                    self.out.push_str(&v.to_string());
                } else {
                    let f = f64::try_from(v.clone()).unwrap_or(f64::NAN);
                    self.out.push_str(&match f {
                        f if f.is_nan() => "NaN".into(),
                        f if f == f64::INFINITY => "Infinity".into(),
                        f if f == f64::NEG_INFINITY => "-Infinity".into(),
                        f => py_float(f),
                    });
                }
            }
            ValueKind::String => self.string(v.as_str().unwrap_or_default()),
            ValueKind::Seq | ValueKind::Iterable if !is_generator(v) => {
                let items: Vec<Value> = v.try_iter()?.collect();
                if items.is_empty() {
                    self.out.push_str("[]");
                    return Ok(());
                }
                self.out.push('[');
                for (i, x) in items.iter().enumerate() {
                    if i > 0 {
                        self.out.push_str(self.item_sep);
                    }
                    self.newline(depth + 1);
                    self.value(x, depth + 1)?;
                }
                self.newline(depth);
                self.out.push(']');
            }
            ValueKind::Map => {
                let mut keys: Vec<Value> = v.try_iter()?.collect();
                if keys.is_empty() {
                    self.out.push_str("{}");
                    return Ok(());
                }
                if self.o.sort_keys {
                    keys.sort_by_key(|a| json_key(a).unwrap_or_default());
                }
                self.out.push('{');
                for (i, k) in keys.iter().enumerate() {
                    if i > 0 {
                        self.out.push_str(self.item_sep);
                    }
                    self.newline(depth + 1);
                    let key = json_key(k)?;
                    self.string(&key);
                    self.out.push_str(self.key_sep);
                    self.value(&v.get_item(k)?, depth + 1)?;
                }
                self.newline(depth);
                self.out.push('}');
            }
            _ => {
                let what = match v.kind() {
                    ValueKind::Undefined => "Undefined".to_string(),
                    _ if is_generator(v) => "generator".to_string(),
                    k => k.to_string(),
                };
                return Err(Error::new(
                    ErrorKind::InvalidOperation,
                    format!("Object of type {what} is not JSON serializable"),
                ));
            }
        }
        Ok(())
    }

    fn string(&mut self, s: &str) {
        let out = &mut *self.out;
        out.push('"');
        for c in s.chars() {
            match c {
                '"' => out.push_str("\\\""),
                '\\' => out.push_str("\\\\"),
                '\n' => out.push_str("\\n"),
                '\r' => out.push_str("\\r"),
                '\t' => out.push_str("\\t"),
                '\u{8}' => out.push_str("\\b"),
                '\u{c}' => out.push_str("\\f"),
                c if (c as u32) < 0x20 => {
                    let _ = write!(out, "\\u{:04x}", c as u32);
                }
                c if self.o.ensure_ascii && (c as u32) > 0x7e => {
                    let mut buf = [0u16; 2];
                    for u in c.encode_utf16(&mut buf) {
                        let _ = write!(out, "\\u{:04x}", u);
                    }
                }
                c => out.push(c),
            }
        }
        out.push('"');
    }
}

/// JSON object keys as Python converts them: strings as they are, scalars by their
/// JSON text.
fn json_key(k: &Value) -> Result<String, Error> {
    Ok(match k.kind() {
        ValueKind::String => k.as_str().unwrap_or_default().to_string(),
        ValueKind::None => "null".into(),
        ValueKind::Bool => if k.is_true() { "true" } else { "false" }.into(),
        ValueKind::Number => py_number(k),
        _ => {
            return Err(Error::new(
                ErrorKind::InvalidOperation,
                format!("keys must be str, int, float, bool or None, not {}", k.kind()),
            ))
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn floats_like_python() {
        for (f, s) in [
            (1.0, "1.0"),
            (0.1, "0.1"),
            (22.5, "22.5"),
            (1e16, "1e+16"),
            (1.5e-5, "1.5e-05"),
            (0.0001, "0.0001"),
            (123456789.0, "123456789.0"),
            (-2.5e100, "-2.5e+100"),
            (1e15, "1000000000000000.0"),
        ] {
            assert_eq!(py_float(f), s);
        }
    }

    #[test]
    fn repr_like_python() {
        let v =
            Value::from_serialize(serde_json::json!({"a": [1, "x'y", null, true, 2.5], "b": "it's \"q\""}));
        assert_eq!(py_repr(&v), r#"{'a': [1, "x'y", None, True, 2.5], 'b': 'it\'s "q"'}"#);
    }

    #[test]
    fn dumps_like_python() {
        let v = Value::from_serialize(serde_json::json!({"b": [1, {"c": "é\n"}], "a": {}}));
        let o = JsonOpts::default();
        assert_eq!(json_dumps(&v, &o).unwrap(), r#"{"b": [1, {"c": "é\n"}], "a": {}}"#);
        let o = JsonOpts { indent: Some("  ".into()), sort_keys: true, ..Default::default() };
        assert_eq!(
            json_dumps(&v, &o).unwrap(),
            "{\n  \"a\": {},\n  \"b\": [\n    1,\n    {\n      \"c\": \"é\\n\"\n    }\n  ]\n}"
        );
        let o = JsonOpts { ensure_ascii: true, ..Default::default() };
        assert_eq!(json_dumps(&Value::from("é😀"), &o).unwrap(), r#""\u00e9\ud83d\ude00""#);
    }
}
