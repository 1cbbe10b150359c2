//! OpenAI request bodies → what the scheduler runs. Bodies are parsed by hand from JSON so
//! that every wrong type, value or unsupported field gets a 400 naming the field.

use std::sync::Arc;

use serde_json::{Map, Value};

use kiln::engine::Engine;
use kiln::grammar::CompiledGrammar;
use kiln::sample::SamplerParams;
use kiln::vision::{ImageRows, MEDIA_MARKER};

use crate::error::ApiError;
use crate::image;
use crate::structured::{self, Tools};

type Obj = Map<String, Value>;

/// The route a body was sent to.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Kind {
    Chat,
    Completion,
}

/// A parsed generation request.
#[derive(Debug)]
pub struct GenRequest {
    /// One tokenized prompt per prompt given (chat: exactly one).
    pub prompts: Vec<Vec<u32>>,
    /// What the prompt's image-row ids stand for (chat messages with `image_url` parts).
    pub images: Option<Arc<ImageRows>>,
    pub max_tokens: Option<usize>,
    pub params: SamplerParams,
    pub stop: Vec<String>,
    pub ignore_eos: bool,
    pub n: usize,
    pub stream: bool,
    pub include_usage: bool,
    /// Alternatives per token; `None`: no logprobs.
    pub logprobs: Option<usize>,
    /// The chat's tools (none for completions).
    pub tools: Tools,
    /// What every choice's output must match.
    pub grammar: Option<CompiledGrammar>,
}

/// Fields both routes take, kiln's extensions (llama.cpp's names) included.
const COMMON: &[&str] = &[
    "model",
    "max_tokens",
    "temperature",
    "top_p",
    "n",
    "stream",
    "stream_options",
    "stop",
    "presence_penalty",
    "frequency_penalty",
    "logit_bias",
    "logprobs",
    "seed",
    "user",
    "top_k",
    "min_p",
    "repeat_penalty",
    "ignore_eos",
    "response_format",
    "grammar",
];
const CHAT_ONLY: &[&str] = &[
    "messages",
    "max_completion_tokens",
    "top_logprobs",
    "tools",
    "tool_choice",
    "functions",
    "function_call",
    "parallel_tool_calls",
    "store",
    "metadata",
    "service_tier",
    "modalities",
    "audio",
    "prediction",
    "reasoning_effort",
];
const COMPLETION_ONLY: &[&str] = &["prompt", "echo", "best_of", "suffix"];

pub fn object(body: &[u8]) -> Result<Obj, ApiError> {
    let v: Value =
        serde_json::from_slice(body).map_err(|e| ApiError::bad(format!("invalid JSON body: {e}")))?;
    match v {
        Value::Object(o) => Ok(o),
        _ => Err(ApiError::bad("the request body must be a JSON object")),
    }
}

pub fn model(o: &Obj) -> Result<Option<&str>, ApiError> {
    opt_str(o, "model")
}

fn present<'a>(o: &'a Obj, k: &str) -> Option<&'a Value> {
    o.get(k).filter(|v| !v.is_null())
}

fn opt_str<'a>(o: &'a Obj, k: &str) -> Result<Option<&'a str>, ApiError> {
    match present(o, k) {
        None => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(_) => Err(ApiError::param(k, format!("'{k}' must be a string"))),
    }
}

fn opt_bool(o: &Obj, k: &str) -> Result<Option<bool>, ApiError> {
    match present(o, k) {
        None => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(*b)),
        Some(_) => Err(ApiError::param(k, format!("'{k}' must be a boolean"))),
    }
}

fn opt_num(o: &Obj, k: &str, lo: f64, hi: f64) -> Result<Option<f32>, ApiError> {
    match present(o, k) {
        None => Ok(None),
        Some(Value::Number(n)) => {
            let x = n.as_f64().unwrap_or(f64::NAN);
            if (lo..=hi).contains(&x) {
                Ok(Some(x as f32))
            } else {
                Err(ApiError::param(k, format!("'{k}' must be between {lo} and {hi}, got {x}")))
            }
        }
        Some(_) => Err(ApiError::param(k, format!("'{k}' must be a number"))),
    }
}

fn opt_int(o: &Obj, k: &str, lo: i64, hi: i64) -> Result<Option<i64>, ApiError> {
    match present(o, k) {
        None => Ok(None),
        Some(Value::Number(n)) => match n.as_i64() {
            Some(x) if (lo..=hi).contains(&x) => Ok(Some(x)),
            Some(x) => Err(ApiError::param(k, format!("'{k}' must be between {lo} and {hi}, got {x}"))),
            None if n.as_u64().is_some() => {
                Err(ApiError::param(k, format!("'{k}' must be between {lo} and {hi}, got {n}")))
            }
            None => Err(ApiError::param(k, format!("'{k}' must be an integer"))),
        },
        Some(_) => Err(ApiError::param(k, format!("'{k}' must be an integer"))),
    }
}

/// Accepts fields kiln has no use for only at their do-nothing values.
fn check_unsupported(o: &Obj, kind: Kind) -> Result<(), ApiError> {
    for k in o.keys() {
        let known = COMMON.contains(&k.as_str())
            || (kind == Kind::Chat && CHAT_ONLY.contains(&k.as_str()))
            || (kind == Kind::Completion && COMPLETION_ONLY.contains(&k.as_str()));
        if !known {
            return Err(ApiError::unsupported(k));
        }
    }
    let harmless = |k: &str, ok: &dyn Fn(&Value) -> bool| match present(o, k) {
        Some(v) if !ok(v) => Err(ApiError::unsupported(k)),
        _ => Ok(()),
    };
    let empty_array = |v: &Value| v.as_array().is_some_and(|a| a.is_empty());
    harmless("functions", &empty_array)?;
    harmless("function_call", &|v| v == "none")?;
    harmless("modalities", &|v| v.as_array().is_some_and(|a| a.iter().all(|m| m == "text")))?;
    harmless("audio", &|_| false)?;
    harmless("prediction", &|_| false)?;
    harmless("reasoning_effort", &|_| false)?;
    harmless("echo", &|v| v == false)?;
    harmless("best_of", &|v| v == 1)?;
    harmless("suffix", &|v| v.as_str().is_some_and(str::is_empty))?;
    Ok(())
}

/// Parses a chat or completion body; `n_ctx` is each request's context.
pub fn parse_generation(
    o: &Obj,
    kind: Kind,
    engine: &Engine,
    n_ctx: usize,
    allow_image_urls: bool,
) -> Result<GenRequest, ApiError> {
    check_unsupported(o, kind)?;
    let n_vocab = engine.config().n_vocab;
    let tools = match kind {
        Kind::Chat => structured::tools(o, engine)?,
        Kind::Completion => Tools::default(),
    };
    let (prompts, images) = match kind {
        Kind::Chat => {
            let (p, images) = chat_prompt(o, engine, &tools, allow_image_urls)?;
            (vec![p], images.map(Arc::new))
        }
        Kind::Completion => (completion_prompts(o, engine)?, None),
    };
    let mut p = SamplerParams::default();
    if let Some(t) = opt_num(o, "temperature", 0.0, 2.0)? {
        p.temp = t;
    }
    if let Some(t) = opt_num(o, "top_p", 0.0, 1.0)? {
        // OpenAI allows 0 (only the most likely token); kiln's top-p needs > 0, and the
        // smallest positive value keeps exactly that token.
        p.top_p = t.max(f32::MIN_POSITIVE);
    }
    if let Some(v) = opt_num(o, "presence_penalty", -2.0, 2.0)? {
        p.presence_penalty = v;
    }
    if let Some(v) = opt_num(o, "frequency_penalty", -2.0, 2.0)? {
        p.frequency_penalty = v;
    }
    if let Some(v) = opt_int(o, "top_k", 0, n_vocab as i64)? {
        p.top_k = v as i32;
    }
    if let Some(v) = opt_num(o, "min_p", 0.0, 1.0)? {
        p.min_p = v;
    }
    if let Some(v) = opt_num(o, "repeat_penalty", 1e-3, 100.0)? {
        p.repeat_penalty = v;
    }
    if let Some(s) = opt_int(o, "seed", i64::MIN, i64::MAX)? {
        p.seed = Some(s as u64);
    }
    p.logit_bias = logit_bias(o, n_vocab)?;
    let stop = match present(o, "stop") {
        None => Vec::new(),
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(a)) if a.len() <= 16 => a
            .iter()
            .map(|v| v.as_str().map(str::to_string))
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| ApiError::param("stop", "'stop' must be a string or an array of strings"))?,
        Some(Value::Array(_)) => return Err(ApiError::param("stop", "'stop' takes at most 16 strings")),
        Some(_) => return Err(ApiError::param("stop", "'stop' must be a string or an array of strings")),
    };
    let n = opt_int(o, "n", 1, 16)?.unwrap_or(1) as usize;
    let stream = opt_bool(o, "stream")?.unwrap_or(false);
    let include_usage = match present(o, "stream_options") {
        None => false,
        Some(Value::Object(so)) => opt_bool(so, "include_usage")
            .map_err(|_| {
                ApiError::param("stream_options", "'stream_options.include_usage' must be a boolean")
            })?
            .unwrap_or(false),
        Some(_) => return Err(ApiError::param("stream_options", "'stream_options' must be an object")),
    };
    let logprobs = match kind {
        Kind::Chat => {
            let on = opt_bool(o, "logprobs")?.unwrap_or(false);
            let top = opt_int(o, "top_logprobs", 0, 20)?;
            if top.is_some() && !on {
                return Err(ApiError::param("top_logprobs", "'top_logprobs' needs 'logprobs': true"));
            }
            on.then_some(top.unwrap_or(0) as usize)
        }
        Kind::Completion => opt_int(o, "logprobs", 0, 5)?.map(|n| n as usize),
    };
    let ignore_eos = opt_bool(o, "ignore_eos")?.unwrap_or(false);
    let max_key =
        if present(o, "max_completion_tokens").is_some() { "max_completion_tokens" } else { "max_tokens" };
    let max_tokens = opt_int(o, max_key, 1, i64::MAX)?.map(|m| m as usize);
    let longest = prompts.iter().map(Vec::len).max().unwrap_or(0);
    let prompt_key = if kind == Kind::Chat { "messages" } else { "prompt" };
    if longest >= n_ctx {
        return Err(ApiError::context_length(
            prompt_key,
            format!(
                "the prompt has {longest} tokens; the context is {n_ctx} (prompt and completion together)"
            ),
        ));
    }
    if let Some(m) = max_tokens {
        if longest.saturating_add(m) > n_ctx {
            return Err(ApiError::context_length(
                max_key,
                format!(
                    "this model's context is {n_ctx} tokens; the prompt has {longest} and {max_key} asks for {m} \
                     more"
                ),
            ));
        }
    }
    p.validate(n_vocab).map_err(|e| ApiError::bad(e.to_string()))?;
    let grammar = structured::grammar(o, engine, &tools)?;
    Ok(GenRequest {
        prompts,
        images,
        max_tokens,
        params: p,
        stop,
        ignore_eos,
        n,
        stream,
        include_usage,
        logprobs,
        tools,
        grammar,
    })
}

fn logit_bias(o: &Obj, n_vocab: usize) -> Result<Vec<(u32, f32)>, ApiError> {
    let Some(v) = present(o, "logit_bias") else { return Ok(Vec::new()) };
    let bad = || ApiError::param("logit_bias", "'logit_bias' must map token ids to numbers in [-100, 100]");
    let map = v.as_object().ok_or_else(bad)?;
    let mut out = Vec::with_capacity(map.len());
    for (k, b) in map {
        let id: u32 = k.parse().map_err(|_| bad())?;
        if id as usize >= n_vocab {
            return Err(ApiError::param(
                "logit_bias",
                format!("token id {id} is outside the vocabulary ({n_vocab})"),
            ));
        }
        let b = b.as_f64().filter(|b| (-100.0..=100.0).contains(b)).ok_or_else(bad)?;
        out.push((id, b as f32));
    }
    Ok(out)
}

/// Renders `messages` with the model's chat template (content parts flattened to text, an
/// `image_url` part to the media marker; with the request's tools) and tokenizes the result
/// as `kiln run` does, each image encoded and placed at its marker.
fn chat_prompt(
    o: &Obj,
    engine: &Engine,
    tools: &Tools,
    allow_urls: bool,
) -> Result<(Vec<u32>, Option<ImageRows>), ApiError> {
    let bad = |m: String| ApiError::param("messages", m);
    let msgs = match present(o, "messages") {
        None => return Err(bad("'messages' is required".into())),
        Some(Value::Array(a)) if !a.is_empty() => a,
        Some(_) => return Err(bad("'messages' must be a non-empty array".into())),
    };
    let mut norm = Vec::with_capacity(msgs.len());
    let mut images = Vec::new();
    for (i, m) in msgs.iter().enumerate() {
        let mut m = m.as_object().cloned().ok_or_else(|| bad(format!("messages[{i}] must be an object")))?;
        let role = match m.get("role") {
            Some(Value::String(r))
                if ["system", "user", "assistant", "tool", "developer"].contains(&r.as_str()) =>
            {
                r.clone()
            }
            _ => {
                return Err(bad(format!(
                    "messages[{i}].role must be one of system, developer, user, assistant, tool"
                )))
            }
        };
        // The templates know "system"; OpenAI's newer name for it is "developer".
        let role = if role == "developer" { "system".to_string() } else { role };
        m.insert("role".into(), Value::String(role));
        let content = match m.get("content") {
            None | Some(Value::Null) => Value::Null,
            Some(Value::String(s)) => Value::String(s.clone()),
            Some(Value::Array(parts)) => {
                let mut text = String::new();
                for (j, p) in parts.iter().enumerate() {
                    match (p.get("type").and_then(Value::as_str), p.get("text").and_then(Value::as_str)) {
                        (Some("text"), Some(t)) => text.push_str(t),
                        (Some("image_url"), _) => {
                            let at = format!("messages[{i}].content[{j}].image_url");
                            let url = p
                                .get("image_url")
                                .and_then(|u| u.get("url").or(Some(u)))
                                .and_then(Value::as_str);
                            let url =
                                url.ok_or_else(|| ApiError::param(&at, "expected {\"url\": string}"))?;
                            images.push(image::load(url, allow_urls).map_err(|e| ApiError::param(&at, e))?);
                            text.push_str(MEDIA_MARKER);
                        }
                        _ => {
                            return Err(ApiError::unsupported(&format!("messages[{i}].content[{j}]"))
                                .with_code("unsupported_content"))
                        }
                    }
                }
                Value::String(text)
            }
            Some(_) => return Err(bad(format!("messages[{i}].content must be a string, an array or null"))),
        };
        m.insert("content".into(), content);
        check_tool_calls(&m, i)?;
        norm.push(Value::Object(m));
    }
    let tpl = engine
        .chat_template()
        .ok_or_else(|| ApiError::bad("the model has no chat template; use /v1/completions"))?;
    let text = kiln::chat::tools::render_chat(tpl, &Value::Array(norm), &tools.chat, true)
        .map_err(|e| bad(e.to_string()))?;
    let tok = engine.tokenizer();
    if images.is_empty() {
        return Ok((tok.encode_prompt(&text).map_err(|e| bad(e.to_string()))?, None));
    }
    let enc = engine
        .vision()
        .ok_or_else(|| ApiError::bad("the model takes no images (start kiln serve with --mmproj FILE)"))?;
    let segments: Vec<&str> = text.split(MEDIA_MARKER).collect();
    if segments.len() - 1 != images.len() {
        return Err(bad(format!(
            "{} media markers in the messages for {} images",
            segments.len() - 1,
            images.len()
        )));
    }
    let mut rows = ImageRows::default();
    let mut ids = tok.encode_prompt(segments[0]).map_err(|e| bad(e.to_string()))?;
    for (seg, img) in segments[1..].iter().zip(&images) {
        let e = rows.encode(enc, tok, img).map_err(|e| bad(e.to_string()))?;
        ids.extend_from_slice(&e.ids);
        ids.extend(tok.encode(seg, false, true).map_err(|e| bad(e.to_string()))?);
    }
    if ids.last().is_some_and(|&id| rows.contains(id)) {
        return Err(bad("the prompt ends with an image: the template must follow it with text".into()));
    }
    Ok((ids, Some(rows)))
}

/// An assistant message's `tool_calls`: an array of `{"id", "type": "function",
/// "function": {"name", "arguments"}}` (arguments a string or an object).
fn check_tool_calls(m: &Obj, i: usize) -> Result<(), ApiError> {
    let Some(calls) = present(m, "tool_calls") else { return Ok(()) };
    let bad = |j: Option<usize>, what: &str| {
        let at = j.map_or(String::new(), |j| format!("[{j}]"));
        ApiError::param("messages", format!("messages[{i}].tool_calls{at} {what}"))
    };
    let calls = calls.as_array().ok_or_else(|| bad(None, "must be an array"))?;
    for (j, c) in calls.iter().enumerate() {
        let f = c
            .get("function")
            .and_then(Value::as_object)
            .ok_or_else(|| bad(Some(j), "needs a 'function' object"))?;
        if !f.get("name").is_some_and(Value::is_string) {
            return Err(bad(Some(j), "needs 'function.name', a string"));
        }
        if !f.get("arguments").is_none_or(|a| a.is_string() || a.is_object()) {
            return Err(bad(Some(j), "'function.arguments' must be a string or an object"));
        }
    }
    Ok(())
}

/// `prompt`: a string, an array of strings, an array of token ids or an array of those.
fn completion_prompts(o: &Obj, engine: &Engine) -> Result<Vec<Vec<u32>>, ApiError> {
    let bad = |m: &str| ApiError::param("prompt", m.to_string());
    let shape = "'prompt' must be a string, an array of strings, or token ids";
    let p = present(o, "prompt").ok_or_else(|| bad("'prompt' is required"))?;
    let prompts = inputs(p, engine, "prompt", shape)?;
    if prompts.len() > 16 {
        return Err(bad("at most 16 prompts per request"));
    }
    Ok(prompts)
}

/// Text or token inputs (`prompt` of completions, `input` of embeddings), tokenized with
/// BOS/EOS per model and special tokens parsed, as llama.cpp's server does.
pub fn inputs(v: &Value, engine: &Engine, key: &str, shape: &str) -> Result<Vec<Vec<u32>>, ApiError> {
    let n_vocab = engine.config().n_vocab;
    let bad = |m: String| ApiError::param(key, m);
    let text = |s: &str| engine.tokenizer().encode(s, true, true).map_err(|e| bad(e.to_string()));
    let ids = |a: &[Value]| -> Result<Vec<u32>, ApiError> {
        a.iter()
            .map(|t| match t.as_u64() {
                Some(t) if (t as usize) < n_vocab => Ok(t as u32),
                _ => Err(bad(format!("token ids in '{key}' must be integers below {n_vocab}"))),
            })
            .collect()
    };
    let out = match v {
        Value::String(s) => vec![text(s)?],
        Value::Array(a) if a.is_empty() => return Err(bad(format!("'{key}' must not be empty"))),
        Value::Array(a) if a.iter().all(Value::is_string) => {
            a.iter().map(|s| text(s.as_str().unwrap_or_default())).collect::<Result<_, _>>()?
        }
        Value::Array(a) if a.iter().all(Value::is_number) => vec![ids(a)?],
        Value::Array(a) if a.iter().all(Value::is_array) => {
            a.iter().map(|x| ids(x.as_array().map_or(&[][..], |v| v))).collect::<Result<_, _>>()?
        }
        _ => return Err(bad(shape.to_string())),
    };
    if out.iter().any(Vec::is_empty) {
        return Err(bad(format!("'{key}' holds an input with no tokens")));
    }
    Ok(out)
}
