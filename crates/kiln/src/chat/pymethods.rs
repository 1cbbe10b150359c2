//! The Python methods chat templates call on strings, dicts and lists (`.strip()`,
//! `.split()`, `.items()`, `.get()`, `.format()`...), with Python's semantics. Methods
//! that mutate (`append`, `pop`, `update`...) fail, as in the `ImmutableSandboxedEnvironment`
//! Hugging Face renders templates with.

use super::pyfmt::py_str;
use minijinja::value::{Value, ValueKind};
use minijinja::{Error, ErrorKind, State};

const MUTATORS: &[&str] = &[
    "append",
    "extend",
    "insert",
    "pop",
    "remove",
    "clear",
    "sort",
    "reverse",
    "update",
    "setdefault",
    "popitem",
    "add",
    "discard",
];

fn err(msg: impl Into<String>) -> Error {
    Error::new(ErrorKind::InvalidOperation, msg.into())
}

/// Positional arguments and keyword arguments (if the last one is a kwargs map).
fn split_args(args: &[Value]) -> (&[Value], Option<&Value>) {
    match args.last() {
        Some(last) if last.is_kwargs() => (&args[..args.len() - 1], Some(last)),
        _ => (args, None),
    }
}

/// Argument `i` by position or by keyword `name`; undefined/none count as absent.
fn arg<'a>(pos: &'a [Value], kw: Option<&'a Value>, i: usize, name: &str) -> Option<Value> {
    let v = pos.get(i).cloned().or_else(|| kw.and_then(|k| k.get_attr(name).ok()));
    v.filter(|v| !v.is_undefined() && !v.is_none())
}

fn arg_str(pos: &[Value], kw: Option<&Value>, i: usize, name: &str) -> Result<Option<String>, Error> {
    match arg(pos, kw, i, name) {
        None => Ok(None),
        Some(v) => match v.as_str() {
            Some(s) => Ok(Some(s.to_string())),
            None => Err(err(format!("{name} must be str, not {}", v.kind()))),
        },
    }
}

fn arg_int(pos: &[Value], kw: Option<&Value>, i: usize, name: &str, default: i64) -> Result<i64, Error> {
    match arg(pos, kw, i, name) {
        None => Ok(default),
        Some(v) => v.as_i64().ok_or_else(|| err(format!("{name} must be an integer"))),
    }
}

/// The unknown-method callback installed on the environment.
pub fn call_method(_state: &State, value: &Value, method: &str, args: &[Value]) -> Result<Value, Error> {
    let (pos, kw) = split_args(args);
    match value.kind() {
        ValueKind::String => str_method(value.as_str().unwrap_or_default(), method, pos, kw),
        ValueKind::Map => map_method(value, method, pos, kw),
        ValueKind::Seq | ValueKind::Iterable => seq_method(value, method, pos),
        _ => Err(Error::from(ErrorKind::UnknownMethod)),
    }
}

fn unsafe_call(method: &str, kind: &str) -> Error {
    err(format!("access to attribute '{method}' of '{kind}' object is unsafe."))
}

fn map_method(map: &Value, method: &str, pos: &[Value], kw: Option<&Value>) -> Result<Value, Error> {
    match method {
        "items" => {
            let keys = map.try_iter()?;
            Ok(Value::from(
                keys.map(|k| {
                    let v = map.get_item(&k).unwrap_or_default();
                    Value::from(vec![k, v])
                })
                .collect::<Vec<_>>(),
            ))
        }
        "keys" => Ok(Value::from(map.try_iter()?.collect::<Vec<_>>())),
        "values" => {
            Ok(Value::from(map.try_iter()?.map(|k| map.get_item(&k).unwrap_or_default()).collect::<Vec<_>>()))
        }
        "get" => {
            let key = pos.first().ok_or_else(|| err("get expected at least 1 argument, got 0"))?;
            let v = map.get_item(key)?;
            if v.is_undefined() {
                Ok(pos
                    .get(1)
                    .cloned()
                    .or_else(|| kw.and_then(|k| k.get_attr("default").ok()))
                    .unwrap_or(Value::from(())))
            } else {
                Ok(v)
            }
        }
        "copy" => Ok(map.clone()),
        m if MUTATORS.contains(&m) => Err(unsafe_call(m, "dict")),
        _ => Err(Error::from(ErrorKind::UnknownMethod)),
    }
}

fn seq_method(seq: &Value, method: &str, pos: &[Value]) -> Result<Value, Error> {
    match method {
        "index" => {
            let x = pos.first().ok_or_else(|| err("index expected 1 argument"))?;
            seq.try_iter()?.position(|v| &v == x).map(Value::from).ok_or_else(|| err("x not in list"))
        }
        "count" => {
            let x = pos.first().ok_or_else(|| err("count expected 1 argument"))?;
            Ok(Value::from(seq.try_iter()?.filter(|v| v == x).count()))
        }
        "copy" => Ok(seq.clone()),
        m if MUTATORS.contains(&m) => Err(unsafe_call(m, "list")),
        _ => Err(Error::from(ErrorKind::UnknownMethod)),
    }
}

fn is_py_space(c: char) -> bool {
    c.is_whitespace() || ('\u{1c}'..='\u{1f}').contains(&c)
}

fn strip<'a>(s: &'a str, chars: Option<&str>, left: bool, right: bool) -> &'a str {
    let pred = |c: char| match chars {
        Some(set) => set.contains(c),
        None => is_py_space(c),
    };
    let s = if left { s.trim_start_matches(pred) } else { s };
    if right {
        s.trim_end_matches(pred)
    } else {
        s
    }
}

/// `str.split` / `str.rsplit`.
fn split(s: &str, sep: Option<&str>, maxsplit: i64, from_right: bool) -> Result<Vec<String>, Error> {
    let max = if maxsplit < 0 { usize::MAX } else { maxsplit as usize };
    let parts: Vec<String> = match sep {
        Some("") => return Err(err("empty separator")),
        Some(sep) => {
            if from_right {
                let mut v: Vec<String> = s.rsplitn(max.saturating_add(1), sep).map(String::from).collect();
                v.reverse();
                v
            } else {
                s.splitn(max.saturating_add(1), sep).map(String::from).collect()
            }
        }
        None => {
            // Runs of whitespace separate; the unsplit remainder keeps its inner and
            // far-side whitespace, as in CPython.
            let mut runs = Vec::new();
            let mut start = None;
            for (i, c) in s.char_indices() {
                match (is_py_space(c), start) {
                    (false, None) => start = Some(i),
                    (true, Some(b)) => {
                        runs.push((b, i));
                        start = None;
                    }
                    _ => {}
                }
            }
            if let Some(b) = start {
                runs.push((b, s.len()));
            }
            if runs.len() <= max.saturating_add(1) {
                runs.iter().map(|&(a, b)| s[a..b].to_string()).collect()
            } else if from_right {
                let cut = runs.len() - max;
                let mut v = vec![s[..runs[cut - 1].1].to_string()];
                v.extend(runs[cut..].iter().map(|&(a, b)| s[a..b].to_string()));
                v
            } else {
                let mut v: Vec<String> = runs[..max].iter().map(|&(a, b)| s[a..b].to_string()).collect();
                v.push(s[runs[max].0..].to_string());
                v
            }
        }
    };
    Ok(parts)
}

/// Python's `str.splitlines` line boundaries.
fn is_line_break(c: char) -> bool {
    matches!(
        c,
        '\n' | '\r' | '\u{b}' | '\u{c}' | '\u{1c}' | '\u{1d}' | '\u{1e}' | '\u{85}' | '\u{2028}' | '\u{2029}'
    )
}

fn splitlines(s: &str, keepends: bool) -> Vec<String> {
    let mut out = Vec::new();
    let mut start = 0;
    let mut it = s.char_indices().peekable();
    while let Some((i, c)) = it.next() {
        if is_line_break(c) {
            let mut end = i + c.len_utf8();
            if c == '\r' {
                if let Some(&(_, '\n')) = it.peek() {
                    it.next();
                    end += 1;
                }
            }
            out.push(if keepends { &s[start..end] } else { &s[start..i] }.to_string());
            start = end;
        }
    }
    if start < s.len() {
        out.push(s[start..].to_string());
    }
    out
}

/// `str.startswith` / `endswith` with a str or a tuple/list of them.
fn affix(s: &str, what: Option<Value>, ends: bool) -> Result<bool, Error> {
    let what = what.ok_or_else(|| err("startswith/endswith expected an argument"))?;
    let test = |p: &str| if ends { s.ends_with(p) } else { s.starts_with(p) };
    if let Some(p) = what.as_str() {
        return Ok(test(p));
    }
    if matches!(what.kind(), ValueKind::Seq) {
        for p in what.try_iter()? {
            match p.as_str() {
                Some(p) if test(p) => return Ok(true),
                Some(_) => {}
                None => return Err(err("tuple for startswith/endswith must only contain str")),
            }
        }
        return Ok(false);
    }
    Err(err(format!("startswith/endswith first arg must be str or a tuple of str, not {}", what.kind())))
}

/// `str.format` with `{}`, `{0}`, `{name}` and `{{ }}` (no format specs).
fn format(s: &str, pos: &[Value], kw: Option<&Value>) -> Result<String, Error> {
    let mut out = String::new();
    let mut auto = 0usize;
    let mut chars = s.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '{' if chars.peek() == Some(&'{') => {
                chars.next();
                out.push('{');
            }
            '}' if chars.peek() == Some(&'}') => {
                chars.next();
                out.push('}');
            }
            '{' => {
                let mut field = String::new();
                loop {
                    match chars.next() {
                        Some('}') => break,
                        Some(c) => field.push(c),
                        None => return Err(err("Single '{' encountered in format string")),
                    }
                }
                if field.contains([':', '!', '.', '[']) {
                    return Err(err(format!("unsupported format field {{{field}}}")));
                }
                let v = if field.is_empty() {
                    auto += 1;
                    pos.get(auto - 1).cloned()
                } else if let Ok(i) = field.parse::<usize>() {
                    pos.get(i).cloned()
                } else {
                    kw.and_then(|k| k.get_attr(&field).ok()).filter(|v| !v.is_undefined())
                };
                let v = v.ok_or_else(|| err(format!("format: no argument for {{{field}}}")))?;
                out.push_str(&py_str(&v));
            }
            '}' => return Err(err("Single '}' encountered in format string")),
            c => out.push(c),
        }
    }
    Ok(out)
}

fn title(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut prev_cased = false;
    for c in s.chars() {
        if prev_cased {
            out.extend(c.to_lowercase());
        } else {
            out.extend(c.to_uppercase());
        }
        prev_cased = c.is_alphabetic();
    }
    out
}

fn str_method(s: &str, method: &str, pos: &[Value], kw: Option<&Value>) -> Result<Value, Error> {
    let str_arg = |i: usize, name: &str| arg_str(pos, kw, i, name);
    Ok(match method {
        "strip" => Value::from(strip(s, str_arg(0, "chars")?.as_deref(), true, true)),
        "lstrip" => Value::from(strip(s, str_arg(0, "chars")?.as_deref(), true, false)),
        "rstrip" => Value::from(strip(s, str_arg(0, "chars")?.as_deref(), false, true)),
        "split" | "rsplit" => {
            let sep = str_arg(0, "sep")?;
            let max = arg_int(pos, kw, 1, "maxsplit", -1)?;
            Value::from(split(s, sep.as_deref(), max, method == "rsplit")?)
        }
        "splitlines" => Value::from(splitlines(s, arg(pos, kw, 0, "keepends").is_some_and(|v| v.is_true()))),
        "startswith" => Value::from(affix(s, arg(pos, kw, 0, "prefix"), false)?),
        "endswith" => Value::from(affix(s, arg(pos, kw, 0, "suffix"), true)?),
        "replace" => {
            let old = str_arg(0, "old")?.ok_or_else(|| err("replace expected 2 arguments"))?;
            let new = str_arg(1, "new")?.ok_or_else(|| err("replace expected 2 arguments"))?;
            let count = arg_int(pos, kw, 2, "count", -1)?;
            Value::from(if count < 0 {
                s.replace(&old, &new)
            } else {
                s.replacen(&old, &new, count as usize)
            })
        }
        "upper" => Value::from(s.to_uppercase()),
        "lower" => Value::from(s.to_lowercase()),
        "title" => Value::from(title(s)),
        "capitalize" => {
            let mut c = s.chars();
            Value::from(match c.next() {
                Some(f) => f.to_uppercase().chain(c.flat_map(char::to_lowercase)).collect::<String>(),
                None => String::new(),
            })
        }
        "swapcase" => Value::from(
            s.chars()
                .flat_map(|c| {
                    if c.is_uppercase() {
                        c.to_lowercase().collect::<Vec<_>>()
                    } else {
                        c.to_uppercase().collect::<Vec<_>>()
                    }
                })
                .collect::<String>(),
        ),
        "find" | "rfind" | "index" | "rindex" => {
            let sub = str_arg(0, "sub")?.ok_or_else(|| err(format!("{method} expected an argument")))?;
            let at = if method.starts_with('r') { s.rfind(&sub) } else { s.find(&sub) };
            // Python counts characters, not bytes.
            match at {
                Some(b) => Value::from(s[..b].chars().count()),
                None if method.ends_with("index") => return Err(err("substring not found")),
                None => Value::from(-1),
            }
        }
        "count" => {
            let sub = str_arg(0, "sub")?.ok_or_else(|| err("count expected an argument"))?;
            Value::from(if sub.is_empty() { s.chars().count() + 1 } else { s.matches(&sub).count() })
        }
        "join" => {
            let items = pos.first().ok_or_else(|| err("join expected 1 argument"))?;
            let mut parts = Vec::new();
            for v in items.try_iter()? {
                match v.as_str() {
                    Some(p) => parts.push(p.to_string()),
                    None => {
                        return Err(err(format!("sequence item: expected str instance, {} found", v.kind())))
                    }
                }
            }
            Value::from(parts.join(s))
        }
        "format" => Value::from(format(s, pos, kw)?),
        "removeprefix" => {
            let p = str_arg(0, "prefix")?.unwrap_or_default();
            Value::from(s.strip_prefix(p.as_str()).unwrap_or(s))
        }
        "removesuffix" => {
            let p = str_arg(0, "suffix")?.unwrap_or_default();
            Value::from(s.strip_suffix(p.as_str()).unwrap_or(s))
        }
        "partition" | "rpartition" => {
            let sep = str_arg(0, "sep")?.ok_or_else(|| err("partition expected 1 argument"))?;
            let at = if method == "partition" { s.find(&sep) } else { s.rfind(&sep) };
            let parts: [&str; 3] = match at {
                Some(i) => [&s[..i], &sep, &s[i + sep.len()..]],
                None if method == "partition" => [s, "", ""],
                None => ["", "", s],
            };
            Value::from(parts.iter().map(|p| Value::from(*p)).collect::<Vec<_>>())
        }
        "isdigit" | "isnumeric" | "isdecimal" => {
            Value::from(!s.is_empty() && s.chars().all(|c| c.is_numeric() || c.is_ascii_digit()))
        }
        "isalpha" => Value::from(!s.is_empty() && s.chars().all(char::is_alphabetic)),
        "isalnum" => Value::from(!s.is_empty() && s.chars().all(char::is_alphanumeric)),
        "isspace" => Value::from(!s.is_empty() && s.chars().all(is_py_space)),
        "islower" => Value::from(s.chars().any(char::is_lowercase) && !s.chars().any(char::is_uppercase)),
        "isupper" => Value::from(s.chars().any(char::is_uppercase) && !s.chars().any(char::is_lowercase)),
        "zfill" => {
            let w = arg_int(pos, kw, 0, "width", 0)?.max(0) as usize;
            let n = s.chars().count();
            if n >= w {
                Value::from(s)
            } else {
                let (sign, rest) = match s.chars().next() {
                    Some(c @ ('+' | '-')) => (c.to_string(), &s[1..]),
                    _ => (String::new(), s),
                };
                Value::from(format!("{sign}{}{rest}", "0".repeat(w - n)))
            }
        }
        "center" | "ljust" | "rjust" => {
            let w = arg_int(pos, kw, 0, "width", 0)?.max(0) as usize;
            let fill = str_arg(1, "fillchar")?.and_then(|f| f.chars().next()).unwrap_or(' ');
            let n = s.chars().count();
            if n >= w {
                Value::from(s)
            } else {
                let total = w - n;
                let left = match method {
                    "ljust" => 0,
                    "rjust" => total,
                    // CPython: left = pad/2 + (pad & width & 1)
                    _ => total / 2 + (total & w & 1),
                };
                let f = |k: usize| std::iter::repeat_n(fill, k).collect::<String>();
                Value::from(format!("{}{s}{}", f(left), f(total - left)))
            }
        }
        _ => return Err(Error::from(ErrorKind::UnknownMethod)),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_like_python() {
        assert_eq!(split("  a  b c ", None, -1, false).unwrap(), ["a", "b", "c"]);
        assert_eq!(split("  a  b c ", None, 1, false).unwrap(), ["a", "b c "]);
        assert_eq!(split("  a  b c ", None, 1, true).unwrap(), ["  a  b", "c"]);
        assert_eq!(split("  a  b c ", None, 0, true).unwrap(), ["  a  b c"]);
        assert_eq!(split("  a  b c ", None, 0, false).unwrap(), ["a  b c "]);
        assert_eq!(split("a,b,,c", Some(","), -1, false).unwrap(), ["a", "b", "", "c"]);
        assert_eq!(split("a,b,c", Some(","), 1, true).unwrap(), ["a,b", "c"]);
        assert_eq!(split("", None, -1, false).unwrap(), Vec::<String>::new());
        assert_eq!(split("", Some(","), -1, false).unwrap(), [""]);
    }

    #[test]
    fn splitlines_like_python() {
        assert_eq!(splitlines("a\nb\r\nc\rd\n", false), ["a", "b", "c", "d"]);
        assert_eq!(splitlines("a\n\nb", true), ["a\n", "\n", "b"]);
    }

    #[test]
    fn misc() {
        assert_eq!(title("hello wORLD 2x"), "Hello World 2X");
        assert_eq!(
            format("{} {name} {{x}} {0}", &[Value::from(1)], None).unwrap_err().kind(),
            ErrorKind::InvalidOperation
        );
        assert_eq!(format("{} {{x}} {0}", &[Value::from(1)], None).unwrap(), "1 {x} 1");
        assert_eq!(strip("xxhixx", Some("x"), true, false), "hixx");
    }
}
