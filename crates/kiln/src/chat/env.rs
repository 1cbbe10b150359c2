//! The minijinja environment configured like Hugging Face's chat-template environment
//! (transformers' `_compile_jinja_template`): jinja2's `ImmutableSandboxedEnvironment`
//! with `trim_blocks`, `lstrip_blocks`, loop controls, its `tojson` override,
//! `raise_exception` and `strftime_now`, plus Python's printing of values.

use super::pyfmt::{is_generator, json_dumps, py_str, Generator, JsonOpts};
use super::pymethods::call_method;
use super::rewrite::ITER_FILTER;
use super::strftime::{strftime, Tm};
use minijinja::filters;
use minijinja::value::{Rest, Value, ValueKind};
use minijinja::{Environment, Error, ErrorKind, State, UndefinedBehavior};
use std::borrow::Cow;

pub const TEMPLATE_NAME: &str = "chat_template";

/// HF's `tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False)`,
/// i.e. `json.dumps` with those arguments, positional or by keyword.
fn tojson(value: &Value, args: Rest<Value>) -> Result<Value, Error> {
    let (pos, kw) = match args.last() {
        Some(last) if last.is_kwargs() => (&args[..args.len() - 1], Some(last)),
        _ => (&args[..], None),
    };
    let get = |i: usize, name: &str| -> Option<Value> {
        pos.get(i).cloned().or_else(|| kw.and_then(|k| k.get_attr(name).ok())).filter(|v| !v.is_undefined())
    };
    if let Some(k) = kw {
        for key in k.try_iter()? {
            let key = key.as_str().unwrap_or_default().to_string();
            if !["ensure_ascii", "indent", "separators", "sort_keys"].contains(&key.as_str()) {
                return Err(Error::new(
                    ErrorKind::TooManyArguments,
                    format!("tojson() got an unexpected keyword argument '{key}'"),
                ));
            }
        }
    }
    let mut o =
        JsonOpts { ensure_ascii: get(0, "ensure_ascii").is_some_and(|v| v.is_true()), ..Default::default() };
    o.indent = match get(1, "indent") {
        None => None,
        Some(v) if v.is_none() => None,
        Some(v) if v.kind() == ValueKind::String => Some(v.as_str().unwrap_or_default().to_string()),
        Some(v) => Some(" ".repeat(v.as_i64().unwrap_or(0).max(0) as usize)),
    };
    if let Some(sep) = get(2, "separators").filter(|v| !v.is_none()) {
        let parts: Vec<Value> = sep.try_iter()?.collect();
        match parts.as_slice() {
            [a, b] => {
                o.item_sep = Some(py_str(a));
                o.key_sep = Some(py_str(b));
            }
            _ => return Err(Error::new(ErrorKind::InvalidOperation, "separators must be a pair")),
        }
    }
    o.sort_keys = get(3, "sort_keys").is_some_and(|v| v.is_true());
    Ok(Value::from(json_dumps(value, &o)?))
}

fn raise_exception(msg: Value) -> Result<Value, Error> {
    Err(Error::new(ErrorKind::InvalidOperation, py_str(&msg)))
}

/// `|string`: Python's `str()`.
fn string_filter(value: &Value) -> Value {
    if value.kind() == ValueKind::String {
        value.clone()
    } else {
        Value::from(py_str(value))
    }
}

/// `|join`: items joined through `str()`, or an attribute of each (`attribute=`).
fn join_filter(state: &State, value: &Value, args: Rest<Value>) -> Result<Value, Error> {
    let (pos, kw) = match args.last() {
        Some(last) if last.is_kwargs() => (&args[..args.len() - 1], Some(last)),
        _ => (&args[..], None),
    };
    let sep =
        pos.first().cloned().or_else(|| kw.and_then(|k| k.get_attr("d").ok()).filter(|v| !v.is_undefined()));
    let sep = sep.map(|s| py_str(&s)).unwrap_or_default();
    let attr = kw.and_then(|k| k.get_attr("attribute").ok()).filter(|v| !v.is_undefined());
    if value.kind() == ValueKind::String {
        let s = value.as_str().unwrap_or_default();
        return Ok(Value::from(s.chars().map(String::from).collect::<Vec<_>>().join(&sep)));
    }
    if value.is_undefined() || value.is_none() {
        return if value.is_none() {
            Err(Error::new(ErrorKind::InvalidOperation, "'NoneType' object is not iterable"))
        } else {
            Ok(Value::from(""))
        };
    }
    let mut parts = Vec::new();
    for item in value.try_iter()? {
        let item = match &attr {
            Some(a) => state.apply_filter("attr", &[item, a.clone()]).unwrap_or_default(),
            None => item,
        };
        parts.push(py_str(&item));
    }
    Ok(Value::from(parts.join(&sep)))
}

/// jinja2's `Undefined` has a length of 0; minijinja would refuse.
fn length_filter(value: &Value) -> Result<Value, Error> {
    if value.is_undefined() {
        return Ok(Value::from(0));
    }
    let len = if is_generator(value) { None } else { value.len() };
    len.map(Value::from).ok_or_else(|| {
        let what = match value.kind() {
            ValueKind::None => "NoneType".to_string(),
            ValueKind::Bool => "bool".into(),
            _ if is_generator(value) => "generator".into(),
            ValueKind::Number => if value.is_integer() { "int" } else { "float" }.into(),
            k => k.to_string(),
        };
        Error::new(ErrorKind::InvalidOperation, format!("object of type '{what}' has no len()"))
    })
}

/// `|trim`: Python's `str(x).strip(chars)`.
fn trim_filter(value: &Value, chars: Option<String>) -> Value {
    let s = py_str(value);
    Value::from(match chars {
        Some(c) => s.trim_matches(|x| c.contains(x)).to_string(),
        None => s.trim().to_string(),
    })
}

/// The `for` rewrite's filter: jinja2 cannot iterate `None`.
fn py_iter(value: Value) -> Result<Value, Error> {
    if value.is_none() {
        return Err(Error::new(ErrorKind::InvalidOperation, "'NoneType' object is not iterable"));
    }
    Ok(value)
}

/// jinja2's `map`, `select`... return generators: iterable once, no `len`, not JSON
/// serializable. Lazy iterables mirror that.
fn generator(items: Vec<Value>) -> Value {
    Value::from_object(Generator(items))
}

fn is_iterable(v: &Value) -> bool {
    !v.is_none() && v.try_iter().is_ok()
}

/// jinja2: anything with `len()` and `__getitem__` (str, list, dict, Undefined).
fn is_sequence(v: &Value) -> bool {
    match v.kind() {
        ValueKind::String | ValueKind::Seq | ValueKind::Map | ValueKind::Undefined => true,
        ValueKind::Iterable => !is_generator(v),
        _ => false,
    }
}

/// Template instructions one render may run. A template comes with the model file, so a
/// loop of 10^10 steps must fail (`KilnError::Template`, "ran out of fuel") rather than
/// hang `kiln serve`. Every render of `tests/chat_templates.rs` (72 templates, tools and
/// tool calls included) runs within 20,000: this is a thousand times that.
pub const TEMPLATE_FUEL: u64 = 20_000_000;

pub fn build(source: String, now: Option<i64>) -> Result<Environment<'static>, Error> {
    let mut env = Environment::new();
    env.set_fuel(Some(TEMPLATE_FUEL));
    env.set_trim_blocks(true);
    env.set_lstrip_blocks(true);
    env.set_keep_trailing_newline(false);
    env.set_undefined_behavior(UndefinedBehavior::Lenient);
    // Never HTML-escape: chat templates produce plain text.
    env.set_auto_escape_callback(|_| minijinja::AutoEscape::None);
    env.set_formatter(|out, _state, value| {
        if value.kind() == ValueKind::String {
            out.write_str(value.as_str().unwrap_or_default())?;
        } else {
            out.write_str(&py_str(value))?;
        }
        Ok(())
    });
    env.set_unknown_method_callback(call_method);
    env.add_filter("tojson", tojson);
    env.add_filter("string", string_filter);
    env.add_filter("join", join_filter);
    env.add_filter("length", length_filter);
    env.add_filter("count", length_filter);
    env.add_filter("trim", trim_filter);
    env.add_filter(ITER_FILTER, py_iter);
    env.add_filter("map", |s: &State, v: Value, a: Rest<Value>| filters::map(s, v, a).map(generator));
    env.add_filter("select", |s: &State, v: Value, t: Option<Cow<'_, str>>, a: Rest<Value>| {
        filters::select(s, v, t, a).map(generator)
    });
    env.add_filter("reject", |s: &State, v: Value, t: Option<Cow<'_, str>>, a: Rest<Value>| {
        filters::reject(s, v, t, a).map(generator)
    });
    env.add_filter(
        "selectattr",
        |s: &State, v: Value, at: Cow<'_, str>, t: Option<Cow<'_, str>>, a: Rest<Value>| {
            filters::selectattr(s, v, at, t, a).map(generator)
        },
    );
    env.add_filter(
        "rejectattr",
        |s: &State, v: Value, at: Cow<'_, str>, t: Option<Cow<'_, str>>, a: Rest<Value>| {
            filters::rejectattr(s, v, at, t, a).map(generator)
        },
    );
    env.add_test("iterable", is_iterable);
    env.add_test("sequence", is_sequence);
    env.add_function("raise_exception", raise_exception);
    env.add_function("strftime_now", move |fmt: String| {
        let tm = now.map(Tm::from_unix).unwrap_or_else(Tm::now);
        strftime(&fmt, &tm)
    });
    env.add_template_owned(TEMPLATE_NAME, source)?;
    Ok(env)
}
