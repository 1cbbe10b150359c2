//! Rendering a conversation with tools through the model's own template, adapting the
//! messages to what the template can show: call arguments as objects or strings, Mistral's
//! nine-character call ids, calls and results as plain text where the template has no
//! place for them, and kiln's generic instructions where it has no tool format of its own.

use serde_json::{json, Map, Value};

use super::{ChatTools, TemplateCaps, ToolChoice, ToolFormat};
use crate::chat::ChatTemplate;
use crate::{KilnError, Result};

/// Renders `messages` (OpenAI-shaped message objects) with `tools`. With no tools active
/// (none given, or `tool_choice: none`) the model is not shown any, but calls and results
/// already in the history are still rendered.
pub fn render_chat(
    t: &ChatTemplate,
    messages: &Value,
    tools: &ChatTools,
    add_generation_prompt: bool,
) -> Result<String> {
    let caps = t.tool_caps();
    let msgs = messages.as_array().ok_or_else(|| KilnError::Template("messages must be an array".into()))?;
    let mut out = Vec::with_capacity(msgs.len() + 1);
    for m in msgs {
        adapt(m, caps, &mut out);
    }
    let active = tools.active();
    if active && caps.format == ToolFormat::Generic {
        instruct(&mut out, tools, caps.takes_system);
    }
    let openai = tools.to_openai();
    let shown = (active && caps.format != ToolFormat::Generic).then_some(&openai);
    t.render_json(&Value::Array(out), add_generation_prompt, shown)
}

/// Pushes `m` as the template can take it.
fn adapt(m: &Value, caps: &TemplateCaps, out: &mut Vec<Value>) {
    let Some(obj) = m.as_object() else {
        out.push(m.clone());
        return;
    };
    let mut obj = obj.clone();
    let role = obj.get("role").and_then(Value::as_str).unwrap_or("").to_string();
    let mistral = matches!(caps.format, ToolFormat::Mistral | ToolFormat::MistralNemo);
    if let Some(Value::Array(calls)) = obj.get("tool_calls").cloned() {
        if calls.is_empty() {
            obj.remove("tool_calls");
            out.push(Value::Object(obj));
            return;
        }
        let calls: Vec<Value> =
            calls.iter().map(|c| normalize_call(c, caps.object_arguments, mistral)).collect();
        if !caps.takes_tool_calls || caps.format == ToolFormat::Generic {
            // The calls as the generic format writes them, after any text.
            let text = format!(
                "{{\"tool_calls\": [{}]}}",
                calls.iter().map(generic_call).collect::<Vec<_>>().join(", ")
            );
            let content = text_of(obj.get("content"));
            obj.remove("tool_calls");
            obj.insert(
                "content".into(),
                json!(if content.is_empty() { text } else { format!("{content}\n{text}") }),
            );
            out.push(Value::Object(obj));
            return;
        }
        if obj.get("content").is_none_or(Value::is_null) {
            obj.insert("content".into(), json!(""));
        }
        if caps.format == ToolFormat::Llama3 && calls.len() > 1 {
            // Llama 3's templates show one call per assistant message.
            for (i, c) in calls.into_iter().enumerate() {
                let mut one = obj.clone();
                if i > 0 {
                    one.insert("content".into(), json!(""));
                }
                one.insert("tool_calls".into(), json!([c]));
                out.push(Value::Object(one));
            }
            return;
        }
        obj.insert("tool_calls".into(), Value::Array(calls));
    }
    if role == "tool" {
        if mistral {
            if let Some(id) = obj.get("tool_call_id").and_then(Value::as_str) {
                let id = mistral_id(id);
                obj.insert("tool_call_id".into(), json!(id));
            }
        }
        if !caps.takes_tool_role {
            // A user message carrying the result, as the generic format describes it.
            let mut r = Map::new();
            if let Some(id) = obj.get("tool_call_id") {
                r.insert("tool_call_id".into(), id.clone());
            }
            r.insert("content".into(), json!(text_of(obj.get("content"))));
            let content = json!({"tool_response": r}).to_string();
            out.push(json!({"role": "user", "content": content}));
            return;
        }
    }
    out.push(Value::Object(obj));
}

/// A call with `type`, an id the template accepts, and `arguments` as the template wants
/// them (an object, or JSON text).
fn normalize_call(c: &Value, object_arguments: bool, mistral: bool) -> Value {
    let mut c = c.as_object().cloned().unwrap_or_default();
    c.entry("type").or_insert_with(|| json!("function"));
    if mistral {
        let id = c.get("id").and_then(Value::as_str).unwrap_or("");
        let id = mistral_id(id);
        c.insert("id".into(), json!(id));
    }
    if let Some(Value::Object(f)) = c.get_mut("function") {
        let args = f.get("arguments").cloned().unwrap_or(Value::Null);
        let args = match (args, object_arguments) {
            (Value::String(s), true) => serde_json::from_str::<Value>(&s).unwrap_or(Value::String(s)),
            (Value::String(s), false) => Value::String(s),
            (Value::Null, true) => json!({}),
            (Value::Null, false) => json!("{}"),
            (v, true) => v,
            (v, false) => Value::String(v.to_string()),
        };
        f.insert("arguments".into(), args);
    }
    Value::Object(c)
}

/// A normalized call as the generic format writes it, `{"name": ..., "arguments": ...}`.
fn generic_call(c: &Value) -> String {
    let f = &c["function"];
    let args = match &f["arguments"] {
        Value::String(s) => s.clone(),
        v => v.to_string(),
    };
    format!("{{\"name\": {}, \"arguments\": {args}}}", f["name"])
}

fn text_of(v: Option<&Value>) -> String {
    match v {
        Some(Value::String(s)) => s.clone(),
        None | Some(Value::Null) => String::new(),
        Some(v) => v.to_string(),
    }
}

/// Nine letters and digits for `id`, as Mistral's templates require: the id itself when it
/// has that shape, else a stable hash of it (so a call and its result keep matching).
pub(crate) fn mistral_id(id: &str) -> String {
    if id.len() == 9 && id.bytes().all(|b| b.is_ascii_alphanumeric()) {
        return id.to_string();
    }
    const ALPHABET: &[u8; 62] = b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";
    // FNV-1a: fixed across runs and machines, unlike std's hasher.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in id.bytes() {
        h = (h ^ b as u64).wrapping_mul(0x0100_0000_01b3);
    }
    (0..9)
        .map(|_| {
            let c = ALPHABET[(h % 62) as usize] as char;
            h /= 62;
            c
        })
        .collect()
}

/// Adds kiln's generic tool instructions: to the system message (made if there is none),
/// or before the first user message where the template takes no system message.
fn instruct(out: &mut Vec<Value>, tools: &ChatTools, takes_system: bool) {
    let text = generic_instructions(tools);
    let first_role = out.first().and_then(|m| m.get("role")).and_then(Value::as_str);
    if takes_system && first_role == Some("system") {
        let old = text_of(out[0].get("content"));
        out[0]["content"] = json!(if old.is_empty() { text } else { format!("{old}\n\n{text}") });
    } else if takes_system {
        out.insert(0, json!({"role": "system", "content": text}));
    } else if let Some(m) = out.iter_mut().find(|m| m.get("role").and_then(Value::as_str) == Some("user")) {
        let old = text_of(m.get("content"));
        m["content"] = json!(format!("{text}\n\n{old}"));
    } else {
        out.insert(0, json!({"role": "user", "content": text}));
    }
}

/// What the generic format tells the model: the functions, and the one JSON reply shape.
fn generic_instructions(tools: &ChatTools) -> String {
    let list: Vec<Value> = tools
        .callable()
        .iter()
        .map(|t| {
            let mut f = json!({"name": t.name});
            if let Some(d) = &t.description {
                f["description"] = json!(d);
            }
            f["parameters"] = t.parameters.clone();
            f
        })
        .collect();
    let list = serde_json::to_string_pretty(&list).unwrap_or_default();
    let call = r#"{"tool_calls": [{"name": <function name>, "arguments": <arguments object>}]}"#;
    let shape = match (&tools.choice, tools.parallel) {
        (ToolChoice::Auto, true) => format!(
            "either {call} to call one or more functions, or {{\"response\": <your answer as a string>}} to answer \
             directly"
        ),
        (ToolChoice::Auto, false) => format!(
            "either {call} with exactly one call, or {{\"response\": <your answer as a string>}} to answer directly"
        ),
        (_, true) => format!("{call}, calling one or more functions"),
        (_, false) => format!("{call}, calling exactly one function"),
    };
    format!(
        "You can call the following functions. Each one's arguments follow the JSON schema given as its \
         \"parameters\":\n{list}\n\nReply with one JSON object and nothing else: {shape}."
    )
}
