//! Chat templates: a model's `tokenizer.chat_template` (Jinja) rendered exactly as
//! Hugging Face's `apply_chat_template` renders it with jinja2.
//!
//! ```
//! use kiln::chat::{ChatTemplate, Message};
//! let src = "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}{{ eos_token }}\n{% endfor %}\
//!            {% if add_generation_prompt %}<|assistant|>{% endif %}";
//! let t = ChatTemplate::new(src, "<s>", "</s>").unwrap();
//! let text = t.render(&[Message::user("Hi")], true, None).unwrap();
//! assert_eq!(text, "<|user|>Hi</s>\n<|assistant|>");
//! ```

pub mod builtin;
mod env;
mod pyfmt;
mod pymethods;
mod rewrite;
mod strftime;
pub mod tools;

use crate::gguf::{Array, GgufFile};
use crate::{KilnError, Result};
use std::sync::OnceLock;

use minijinja::{context, Environment, Value};
use serde::{Deserialize, Deserializer, Serialize};

/// One chat message. Fields beyond `role` and `content` (`tool_calls`, `tool_call_id`,
/// `name`, `reasoning_content`...) go in `extra` and reach the template as they are.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Message {
    pub role: String,
    /// The text; JSON `null` reads as empty.
    #[serde(default, deserialize_with = "null_as_empty")]
    pub content: String,
    #[serde(flatten)]
    pub extra: serde_json::Map<String, serde_json::Value>,
}

fn null_as_empty<'de, D: Deserializer<'de>>(d: D) -> std::result::Result<String, D::Error> {
    Ok(Option::<String>::deserialize(d)?.unwrap_or_default())
}

impl Message {
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        Message { role: role.into(), content: content.into(), extra: serde_json::Map::new() }
    }
    pub fn system(s: impl Into<String>) -> Self {
        Message::new("system", s)
    }
    pub fn user(s: impl Into<String>) -> Self {
        Message::new("user", s)
    }
    pub fn assistant(s: impl Into<String>) -> Self {
        Message::new("assistant", s)
    }
    /// A tool result.
    pub fn tool(s: impl Into<String>) -> Self {
        Message::new("tool", s)
    }
    /// Adds a field such as `tool_calls` or `tool_call_id`.
    pub fn with(mut self, key: impl Into<String>, value: serde_json::Value) -> Self {
        self.extra.insert(key.into(), value);
        self
    }
}

/// A compiled chat template.
#[derive(Clone, Debug)]
pub struct ChatTemplate {
    source: String,
    bos_token: String,
    eos_token: String,
    now: Option<i64>,
    env: Environment<'static>,
    /// What the template does with tools, probed on first use.
    caps: OnceLock<tools::TemplateCaps>,
}

fn template_error(e: minijinja::Error) -> KilnError {
    let mut msg = match e.detail() {
        Some(d) => d.to_string(),
        None => e.kind().to_string(),
    };
    if let Some(line) = e.line() {
        msg = format!("line {line}: {msg}");
    }
    KilnError::Template(msg)
}

impl ChatTemplate {
    /// Compiles `source`. Syntax errors give `KilnError::Template` naming the line.
    pub fn new(source: &str, bos_token: &str, eos_token: &str) -> Result<Self> {
        let source = rewrite::rewrite(source);
        let env = env::build(source.clone(), None).map_err(template_error)?;
        Ok(ChatTemplate {
            source,
            bos_token: bos_token.to_string(),
            eos_token: eos_token.to_string(),
            now: None,
            env,
            caps: OnceLock::new(),
        })
    }

    /// The template of a GGUF file (`tokenizer.chat_template`), with the text of its BOS
    /// and EOS tokens; `None` when the file has no template.
    pub fn from_gguf(g: &GgufFile) -> Result<Option<Self>> {
        let Some(src) = g.get_str("tokenizer.chat_template")? else {
            return Ok(None);
        };
        let (bos, eos) = Self::special_texts(g)?;
        Ok(Some(ChatTemplate::new(src, &bos, &eos)?))
    }

    /// The template `spec` gives a model whose file is `g`, in place of the file's own
    /// (`--chat-template`): a Jinja source, or the name of a built-in template
    /// ([`builtin::BUILTIN_TEMPLATES`], llama.cpp's formats by the same names). Neither: an
    /// error listing the names.
    pub fn from_spec(g: &GgufFile, spec: &str) -> Result<Self> {
        let src = match builtin::builtin_template(spec.trim()) {
            Some(src) => src,
            None if spec.contains("{{") || spec.contains("{%") => spec,
            None => {
                return Err(KilnError::invalid(format!(
                    "unknown chat template {spec:?}: give a Jinja template or one of {}",
                    builtin::builtin_names()
                )))
            }
        };
        let (bos, eos) = Self::special_texts(g)?;
        ChatTemplate::new(src, &bos, &eos)
    }

    /// The texts of a file's BOS and EOS tokens (empty where it names none).
    fn special_texts(g: &GgufFile) -> Result<(String, String)> {
        let tokens = match g.get_array("tokenizer.ggml.tokens")? {
            Some(Array::String(t)) => t.as_slice(),
            Some(_) => {
                return Err(KilnError::Metadata("tokenizer.ggml.tokens: not an array of strings".into()))
            }
            None => &[],
        };
        let token_text = |key: &str| -> Result<String> {
            match g.get_u64(key)? {
                None => Ok(String::new()),
                Some(id) => tokens.get(id as usize).cloned().ok_or_else(|| {
                    KilnError::Metadata(format!("{key} = {id} is outside the vocabulary ({})", tokens.len()))
                }),
            }
        };
        let bos = token_text("tokenizer.ggml.bos_token_id")?;
        let eos = token_text("tokenizer.ggml.eos_token_id")?;
        Ok((bos, eos))
    }

    /// Pins `strftime_now` to a Unix time (UTC) instead of the clock, for reproducible
    /// prompts.
    pub fn with_fixed_time(mut self, unix_seconds: i64) -> Self {
        self.now = Some(unix_seconds);
        // The source compiled once already, so this cannot fail.
        if let Ok(env) = env::build(self.source.clone(), self.now) {
            self.env = env;
        }
        self
    }

    pub fn source(&self) -> &str {
        &self.source
    }
    pub fn bos_token(&self) -> &str {
        &self.bos_token
    }
    pub fn eos_token(&self) -> &str {
        &self.eos_token
    }

    /// What this template does with tools, and the tool-call format it speaks (probed
    /// once, on first use).
    pub fn tool_caps(&self) -> &tools::TemplateCaps {
        self.caps.get_or_init(|| tools::TemplateCaps::detect(self))
    }

    /// Renders `messages` as `apply_chat_template(messages, tools=tools,
    /// add_generation_prompt=...)` does. A template's `raise_exception(...)` and runtime
    /// errors give `KilnError::Template`.
    pub fn render(
        &self,
        messages: &[Message],
        add_generation_prompt: bool,
        tools: Option<&serde_json::Value>,
    ) -> Result<String> {
        let messages = serde_json::to_value(messages).map_err(|e| KilnError::Template(e.to_string()))?;
        self.render_json(&messages, add_generation_prompt, tools)
    }

    /// Like [`render`](Self::render) with messages as raw JSON (an array of objects), for
    /// content that is `null` or a list of parts, as OpenAI-style requests carry.
    pub fn render_json(
        &self,
        messages: &serde_json::Value,
        add_generation_prompt: bool,
        tools: Option<&serde_json::Value>,
    ) -> Result<String> {
        let tmpl = self.env.get_template(env::TEMPLATE_NAME).map_err(template_error)?;
        // HF passes tools=None and documents=None when absent: defined, but none.
        let ctx = context! {
            messages => Value::from_serialize(messages),
            tools => tools.map(Value::from_serialize).unwrap_or(Value::from(())),
            documents => Value::from(()),
            add_generation_prompt => add_generation_prompt,
            bos_token => &self.bos_token,
            eos_token => &self.eos_token,
        };
        tmpl.render(ctx).map_err(template_error)
    }
}
