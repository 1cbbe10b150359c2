//! Tool calling: the functions a chat may call, how a model's own template asks for and
//! writes calls (its [`ToolFormat`], detected from the template), and a streaming parser
//! that turns the model's output back into content and [`ToolCall`]s.
//!
//! ```
//! use kiln::chat::tools::{ToolCallParser, ToolFormat};
//! let mut p = ToolCallParser::new(ToolFormat::Hermes);
//! let mut out = kiln::chat::tools::Parsed::default();
//! p.push("Let me check.<tool_call>\n{\"name\": \"get_weather\", ", &mut out);
//! p.push("\"arguments\": {\"city\": \"Paris\"}}\n</tool_call>", &mut out);
//! let reply = p.finish(&mut out);
//! assert_eq!(reply.content, "Let me check.");
//! assert_eq!(reply.tool_calls[0].name, "get_weather");
//! assert_eq!(reply.tool_calls[0].arguments, r#"{"city": "Paris"}"#);
//! ```

mod format;
mod grammar;
mod json_scan;
mod parse;
mod render;

pub use format::{TemplateCaps, ToolFormat};
pub use grammar::{compile_tool_grammar, tool_grammar};
pub use parse::{Parsed, Reply, ToolCallParser};
pub use render::render_chat;

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use crate::{KilnError, Result};

/// A function the model may call: its name, what it does, and a JSON schema of its
/// arguments object.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Tool {
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// JSON schema of the arguments (an object schema).
    pub parameters: Value,
}

impl Tool {
    /// A function tool. `parameters` is the JSON schema of its arguments object.
    pub fn function(name: impl Into<String>, description: impl Into<String>, parameters: Value) -> Self {
        let description = Some(description.into()).filter(|d| !d.is_empty());
        Tool { name: name.into(), description, parameters }
    }

    /// Reads an OpenAI tool, `{"type": "function", "function": {"name", "description",
    /// "parameters"}}`. Errors name the field at fault.
    pub fn from_openai(v: &Value) -> Result<Tool> {
        let bad = |m: &str| KilnError::invalid(m.to_string());
        let o = v.as_object().ok_or_else(|| bad("a tool must be an object"))?;
        match o.get("type").and_then(Value::as_str) {
            Some("function") => {}
            Some(t) => {
                return Err(KilnError::invalid(format!("tool type '{t}' is not supported; use 'function'")))
            }
            None => return Err(bad("a tool needs \"type\": \"function\"")),
        }
        let f = o
            .get("function")
            .and_then(Value::as_object)
            .ok_or_else(|| bad("'function' must be an object"))?;
        let name =
            f.get("name").and_then(Value::as_str).ok_or_else(|| bad("'function.name' must be a string"))?;
        check_name(name)?;
        let description = match f.get("description") {
            None | Some(Value::Null) => None,
            Some(Value::String(s)) => Some(s.clone()),
            Some(_) => return Err(bad("'function.description' must be a string")),
        };
        let parameters = match f.get("parameters") {
            None | Some(Value::Null) => json!({"type": "object", "properties": {}}),
            Some(p @ Value::Object(_)) => p.clone(),
            Some(_) => return Err(bad("'function.parameters' must be a JSON schema object")),
        };
        Ok(Tool { name: name.to_string(), description, parameters })
    }

    /// The OpenAI shape, as chat templates take it.
    pub fn to_openai(&self) -> Value {
        let mut f = json!({"name": self.name});
        if let Some(d) = &self.description {
            f["description"] = json!(d);
        }
        f["parameters"] = self.parameters.clone();
        json!({"type": "function", "function": f})
    }
}

/// OpenAI's rule for function names (1-64 of `[a-zA-Z0-9_-]`); it also keeps names safe
/// to write into grammars and to find in output.
fn check_name(name: &str) -> Result<()> {
    let ok = (1..=64).contains(&name.len())
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    if ok {
        Ok(())
    } else {
        Err(KilnError::invalid(format!(
            "tool name {name:?} must be 1 to 64 letters, digits, underscores or dashes"
        )))
    }
}

/// Whether and which tools the model must call.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum ToolChoice {
    /// The model decides: content, calls, or both.
    #[default]
    Auto,
    /// No calls: the tools are not shown to the model and the output is all content.
    None,
    /// At least one call, from the first token.
    Required,
    /// Exactly this function, from the first token.
    Function(String),
}

impl ToolChoice {
    /// Reads OpenAI's `tool_choice`: `"auto"`, `"none"`, `"required"` or
    /// `{"type": "function", "function": {"name": ...}}`.
    pub fn from_openai(v: &Value) -> Result<ToolChoice> {
        let bad = || {
            KilnError::invalid(
                "'tool_choice' must be \"auto\", \"none\", \"required\" or {\"type\": \"function\", \"function\": {\"name\": ...}}",
            )
        };
        match v {
            Value::String(s) => match s.as_str() {
                "auto" => Ok(ToolChoice::Auto),
                "none" => Ok(ToolChoice::None),
                "required" => Ok(ToolChoice::Required),
                _ => Err(bad()),
            },
            Value::Object(o) if o.get("type").and_then(Value::as_str) == Some("function") => {
                let name =
                    o.get("function").and_then(|f| f.get("name")).and_then(Value::as_str).ok_or_else(bad)?;
                Ok(ToolChoice::Function(name.to_string()))
            }
            _ => Err(bad()),
        }
    }
}

/// The tools of a chat turn and how they may be called.
#[non_exhaustive]
#[derive(Clone, Debug, PartialEq)]
pub struct ChatTools {
    pub tools: Vec<Tool>,
    pub choice: ToolChoice,
    /// Several calls in one reply (OpenAI's default: true).
    pub parallel: bool,
}

impl Default for ChatTools {
    fn default() -> Self {
        ChatTools { tools: Vec::new(), choice: ToolChoice::Auto, parallel: true }
    }
}

impl ChatTools {
    /// These tools, the model's choice, parallel calls allowed. Errors on a duplicate or
    /// invalid name.
    pub fn new(tools: Vec<Tool>) -> Result<Self> {
        ChatTools { tools, ..Default::default() }.checked()
    }
    pub fn with_choice(mut self, choice: ToolChoice) -> Result<Self> {
        self.choice = choice;
        self.checked()
    }
    pub fn with_parallel(mut self, parallel: bool) -> Self {
        self.parallel = parallel;
        self
    }

    /// Names valid, unique, and a named choice among them.
    fn checked(self) -> Result<Self> {
        for (i, t) in self.tools.iter().enumerate() {
            check_name(&t.name)?;
            if self.tools[..i].iter().any(|u| u.name == t.name) {
                return Err(KilnError::invalid(format!("two tools are named '{}'", t.name)));
            }
        }
        if let ToolChoice::Function(name) = &self.choice {
            if !self.tools.iter().any(|t| &t.name == name) {
                return Err(KilnError::invalid(format!(
                    "tool_choice names '{name}', which is not among the tools"
                )));
            }
        }
        if self.tools.is_empty() && matches!(self.choice, ToolChoice::Required) {
            return Err(KilnError::invalid("tool_choice 'required' needs at least one tool"));
        }
        Ok(self)
    }

    /// Whether the model sees the tools and its output is parsed for calls.
    pub fn active(&self) -> bool {
        !self.tools.is_empty() && self.choice != ToolChoice::None
    }

    /// The tools the model may call under `choice`.
    pub fn callable(&self) -> Vec<&Tool> {
        match &self.choice {
            ToolChoice::None => Vec::new(),
            ToolChoice::Function(n) => self.tools.iter().filter(|t| &t.name == n).collect(),
            _ => self.tools.iter().collect(),
        }
    }

    /// The tools in OpenAI's shape, as templates take them.
    pub fn to_openai(&self) -> Value {
        Value::Array(self.tools.iter().map(Tool::to_openai).collect())
    }
}

/// One parsed call.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolCall {
    /// `call_` and 24 random letters and digits, unique.
    pub id: String,
    pub name: String,
    /// The arguments object as JSON text, as the model wrote it.
    pub arguments: String,
}

impl ToolCall {
    /// The OpenAI shape of an assistant message's `tool_calls` entry.
    pub fn to_openai(&self) -> Value {
        json!({"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}})
    }
}

/// A piece of a call while it streams: OpenAI's `delta.tool_calls` entry. A call's first
/// delta carries its id and name (with empty arguments); the rest carry argument text.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ToolCallDelta {
    /// The call's position in the reply.
    pub index: usize,
    pub id: Option<String>,
    pub name: Option<String>,
    pub arguments: String,
}

impl ToolCallDelta {
    pub fn to_openai(&self) -> Value {
        let mut v = json!({"index": self.index});
        let mut f = serde_json::Map::new();
        if let Some(id) = &self.id {
            v["id"] = json!(id);
            v["type"] = json!("function");
        }
        if let Some(name) = &self.name {
            f.insert("name".into(), json!(name));
        }
        f.insert("arguments".into(), json!(self.arguments));
        v["function"] = Value::Object(f);
        v
    }
}

/// A fresh call id: `call_` and 24 characters of `[A-Za-z0-9]`, from the process's random
/// hash keys and a counter (unique within a process, unpredictable across processes).
pub fn new_call_id() -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    const ALPHABET: &[u8; 62] = b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let mut id = String::with_capacity(29);
    id.push_str("call_");
    // Eight characters from each of three hashes (62^8 < 2^64, so every digit varies).
    for part in 0..3u64 {
        let mut h = RandomState::new().build_hasher();
        h.write_u64(n);
        h.write_u64(part);
        let mut x = h.finish();
        for _ in 0..8 {
            id.push(ALPHABET[(x % 62) as usize] as char);
            x /= 62;
        }
    }
    id
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn call_ids_are_unique_and_shaped() {
        let ids: std::collections::HashSet<String> = (0..1000).map(|_| new_call_id()).collect();
        assert_eq!(ids.len(), 1000);
        for id in &ids {
            assert!(id.starts_with("call_") && id.len() == 29, "{id}");
            assert!(id[5..].bytes().all(|b| b.is_ascii_alphanumeric()), "{id}");
        }
    }

    #[test]
    fn openai_shapes_round_trip_and_bad_ones_say_why() {
        let v = json!({"type": "function", "function": {"name": "get_weather", "description": "d",
                       "parameters": {"type": "object"}}});
        let t = Tool::from_openai(&v).unwrap();
        assert_eq!(t.to_openai(), v);
        let no_params = Tool::from_openai(&json!({"type": "function", "function": {"name": "f"}})).unwrap();
        assert_eq!(no_params.parameters["type"], "object");
        for (bad, why) in [
            (json!({"type": "code", "function": {"name": "f"}}), "not supported"),
            (json!({"type": "function", "function": {"name": "a b"}}), "letters, digits"),
            (json!({"type": "function", "function": {"name": "f", "parameters": 3}}), "parameters"),
            (json!({"type": "function"}), "'function'"),
        ] {
            let e = Tool::from_openai(&bad).unwrap_err().to_string();
            assert!(e.contains(why), "{e}");
        }
        assert_eq!(ToolChoice::from_openai(&json!("required")).unwrap(), ToolChoice::Required);
        let named = json!({"type": "function", "function": {"name": "f"}});
        assert_eq!(ToolChoice::from_openai(&named).unwrap(), ToolChoice::Function("f".into()));
        assert!(ToolChoice::from_openai(&json!("sometimes")).is_err());
    }

    #[test]
    fn choices_must_name_a_tool() {
        let tools = vec![Tool::function("f", "", json!({"type": "object"}))];
        let e = ChatTools::new(tools.clone()).unwrap().with_choice(ToolChoice::Function("g".into()));
        assert!(e.unwrap_err().to_string().contains("'g'"));
        let dup = ChatTools::new(vec![tools[0].clone(), tools[0].clone()]);
        assert!(dup.unwrap_err().to_string().contains("two tools"));
        assert!(ChatTools::new(vec![]).unwrap().with_choice(ToolChoice::Required).is_err());
    }
}
