//! Sampling keywords (OpenAI's names plus llama.cpp's `top_k`, `min_p`, `repeat_penalty`
//! and `grammar`) → `GenerateOptions`. One list of keywords, shared by `complete`, `chat` and
//! `Session.generate`; unknown keywords and wrong types raise `TypeError`, values out of
//! range `kiln.InvalidArgumentError`.

use kiln::grammar::Grammar;
use kiln::sample::SamplerParams;
use kiln::GenerateOptions;
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyString};
use serde_json::Value;

use crate::convert::to_json;
use crate::errors::{invalid, OrRaise};

/// Every keyword the generating methods take besides their own arguments.
pub const KEYWORDS: [&str; 16] = [
    "max_tokens",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "repeat_penalty",
    "presence_penalty",
    "frequency_penalty",
    "seed",
    "stop",
    "logit_bias",
    "logprobs",
    "ignore_eos",
    "response_format",
    "grammar",
    "stream",
];

/// What the keywords ask for.
pub struct Sampling {
    pub opts: GenerateOptions,
    pub stream: bool,
}

/// A keyword's value, `None` when absent or None; `kind` names the expected type in errors.
fn get<'py, T: FromPyObjectOwned<'py>>(
    kw: &Bound<'py, PyDict>,
    key: &str,
    kind: &str,
) -> PyResult<Option<T>> {
    match kw.get_item(key)? {
        None => Ok(None),
        Some(v) if v.is_none() => Ok(None),
        Some(v) => v.extract::<T>().map(Some).map_err(|_| {
            let ty = v.get_type().name().map(|n| n.to_string()).unwrap_or_default();
            PyTypeError::new_err(format!("{key} must be {kind}, not {ty}"))
        }),
    }
}

/// A number that must not be a bool (Python's bools are ints).
fn number(kw: &Bound<'_, PyDict>, key: &str) -> PyResult<Option<f32>> {
    if kw.get_item(key)?.is_some_and(|v| v.is_instance_of::<PyBool>()) {
        return Err(PyTypeError::new_err(format!("{key} must be a number, not bool")));
    }
    get::<f64>(kw, key, "a number").map(|v| v.map(|x| x as f32))
}

fn integer(kw: &Bound<'_, PyDict>, key: &str) -> PyResult<Option<i64>> {
    if kw.get_item(key)?.is_some_and(|v| v.is_instance_of::<PyBool>()) {
        return Err(PyTypeError::new_err(format!("{key} must be an int, not bool")));
    }
    get::<i64>(kw, key, "an int")
}

/// Parses the keywords against a vocabulary of `n_vocab` tokens.
pub fn parse(kw: Option<&Bound<'_, PyDict>>, n_vocab: usize) -> PyResult<Sampling> {
    let mut opts = GenerateOptions::default();
    let Some(kw) = kw else {
        return Ok(Sampling { opts, stream: false });
    };
    for k in kw.keys() {
        let k: String = k.extract()?;
        if !KEYWORDS.contains(&k.as_str()) {
            return Err(PyTypeError::new_err(format!(
                "unexpected keyword argument '{k}' (sampling takes: {})",
                KEYWORDS.join(", ")
            )));
        }
    }
    let mut p = SamplerParams::default();
    if let Some(t) = number(kw, "temperature")? {
        if t < 0.0 {
            return Err(invalid(format!("temperature must be >= 0, got {t}")));
        }
        p.temp = t;
    }
    if let Some(t) = number(kw, "top_p")? {
        // OpenAI allows 0 (only the most likely token); kiln's top-p needs > 0, and the
        // smallest positive value keeps exactly that token.
        p.top_p = if t == 0.0 { f32::MIN_POSITIVE } else { t };
    }
    if let Some(k) = integer(kw, "top_k")? {
        p.top_k = k.clamp(i32::MIN as i64, i32::MAX as i64) as i32;
    }
    if let Some(v) = number(kw, "min_p")? {
        p.min_p = v;
    }
    if let Some(v) = number(kw, "repeat_penalty")? {
        p.repeat_penalty = v;
    }
    if let Some(v) = number(kw, "presence_penalty")? {
        p.presence_penalty = v;
    }
    if let Some(v) = number(kw, "frequency_penalty")? {
        p.frequency_penalty = v;
    }
    if let Some(s) = integer(kw, "seed")? {
        p.seed = Some(s as u64);
    }
    if let Some(bias) = get::<Bound<'_, PyDict>>(kw, "logit_bias", "a dict")? {
        for (k, v) in bias.iter() {
            let id = match k.cast::<PyString>() {
                Ok(s) => s.to_cow()?.trim().parse::<u32>().ok(),
                Err(_) if !k.is_instance_of::<PyBool>() => k.extract::<u32>().ok(),
                Err(_) => None,
            }
            .ok_or_else(|| invalid(format!("logit_bias: key {k} is not a token id")))?;
            let b: f32 = v
                .extract::<f64>()
                .map_err(|_| PyTypeError::new_err(format!("logit_bias[{id}] must be a number")))?
                as f32;
            p.logit_bias.push((id, b));
        }
    }
    p.validate(n_vocab).or_raise()?;
    opts = opts.with_sampler(p);
    if let Some(m) = integer(kw, "max_tokens")? {
        if m < 0 {
            return Err(invalid(format!("max_tokens must be >= 0, got {m}")));
        }
        opts = opts.with_max_tokens(m as usize);
    }
    if let Some(stop) = kw.get_item("stop")?.filter(|v| !v.is_none()) {
        let list: Vec<String> = if let Ok(s) = stop.cast::<PyString>() {
            vec![s.to_cow()?.into_owned()]
        } else {
            stop.extract().map_err(|_| PyTypeError::new_err("stop must be a string or a list of strings"))?
        };
        if list.iter().any(String::is_empty) {
            return Err(invalid("stop strings must not be empty"));
        }
        opts = opts.with_stop(list);
    }
    if let Some(v) = kw.get_item("logprobs")?.filter(|v| !v.is_none()) {
        let top = if v.is_instance_of::<PyBool>() {
            v.extract::<bool>()?.then_some(0)
        } else {
            let n = integer(kw, "logprobs")?.unwrap_or(0);
            if !(0..=20).contains(&n) {
                return Err(invalid(format!("logprobs must be between 0 and 20, got {n}")));
            }
            Some(n as usize)
        };
        if let Some(n) = top {
            opts = opts.with_logprobs(n);
        }
    }
    if let Some(b) = get::<bool>(kw, "ignore_eos", "a bool")? {
        opts = opts.with_ignore_eos(b);
    }
    let format = match kw.get_item("response_format")?.filter(|v| !v.is_none()) {
        Some(v) => response_format(&to_json(&v, "response_format")?)?,
        None => None,
    };
    let gbnf = get::<String>(kw, "grammar", "a string (GBNF)")?;
    match (format, gbnf) {
        (Some(_), Some(_)) => return Err(invalid("give response_format or grammar, not both")),
        (Some(g), None) => opts = opts.with_grammar(g),
        (None, Some(text)) => opts = opts.with_grammar(Grammar::Gbnf(text)),
        (None, None) => {}
    }
    let stream = get::<bool>(kw, "stream", "a bool")?.unwrap_or(false);
    Ok(Sampling { opts, stream })
}

/// OpenAI's `response_format`: `{"type": "text"}` (no constraint), `{"type": "json_object"}`
/// (any JSON object) or `{"type": "json_schema", "json_schema": {"schema": {...}, ...}}`.
fn response_format(v: &Value) -> PyResult<Option<Grammar>> {
    let bad = |m: &str| invalid(format!("response_format: {m}"));
    let Value::Object(o) = v else { return Err(PyTypeError::new_err("response_format must be a dict")) };
    match o.get("type").and_then(Value::as_str) {
        Some("text") => Ok(None),
        Some("json_object") => Ok(Some(Grammar::JsonObject)),
        Some("json_schema") => {
            let spec = o
                .get("json_schema")
                .and_then(Value::as_object)
                .ok_or_else(|| bad("'json_schema' must be a dict"))?;
            match spec.get("schema") {
                Some(schema @ Value::Object(_)) => Ok(Some(Grammar::JsonSchema(schema.clone()))),
                Some(_) => Err(bad("'json_schema.schema' must be a dict")),
                None => Ok(Some(Grammar::JsonObject)),
            }
        }
        _ => Err(bad("'type' must be 'text', 'json_object' or 'json_schema'")),
    }
}
