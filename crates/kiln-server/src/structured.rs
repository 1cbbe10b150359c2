//! The request fields that shape a reply: `tools`, `tool_choice` and `parallel_tool_calls`
//! (what the model is shown, and how its reply is parsed into calls).

use serde_json::{Map, Value};

use kiln::chat::tools::{ChatTools, Tool, ToolCallParser, ToolChoice, ToolFormat};
use kiln::engine::Engine;

use crate::error::ApiError;

type Obj = Map<String, Value>;

/// A chat request's tools.
#[derive(Clone, Debug, Default)]
pub struct Tools {
    pub chat: ChatTools,
    /// The template's call format, when calls are parsed from the reply.
    pub format: Option<ToolFormat>,
    /// Control tokens of the format's markers, which the detokenizer must render.
    pub shown: Vec<u32>,
}

impl Tools {
    /// A parser for one choice's reply, when calls are parsed.
    pub fn parser(&self) -> Option<ToolCallParser> {
        let names = self.chat.callable().iter().map(|t| t.name.clone()).collect();
        self.format.map(|f| ToolCallParser::new(f).with_names(names))
    }
}

/// Reads `tools`, `tool_choice` and `parallel_tool_calls`. Every mistake is a 400 naming
/// the field.
pub fn tools(o: &Obj, engine: &Engine) -> Result<Tools, ApiError> {
    let present = |k: &str| o.get(k).filter(|v| !v.is_null());
    let list = match present("tools") {
        None => Vec::new(),
        Some(Value::Array(a)) => a
            .iter()
            .enumerate()
            .map(|(i, t)| {
                Tool::from_openai(t).map_err(|e| ApiError::param("tools", format!("tools[{i}]: {e}")))
            })
            .collect::<Result<_, _>>()?,
        Some(_) => return Err(ApiError::param("tools", "'tools' must be an array")),
    };
    let choice = match present("tool_choice") {
        None => ToolChoice::Auto,
        Some(v) => ToolChoice::from_openai(v).map_err(|e| ApiError::param("tool_choice", e.to_string()))?,
    };
    let parallel = match present("parallel_tool_calls") {
        None => true,
        Some(Value::Bool(b)) => *b,
        Some(_) => {
            return Err(ApiError::param("parallel_tool_calls", "'parallel_tool_calls' must be a boolean"))
        }
    };
    if list.is_empty() && matches!(choice, ToolChoice::Required | ToolChoice::Function(_)) {
        return Err(ApiError::param("tool_choice", "'tool_choice' requires 'tools'"));
    }
    let chat = ChatTools::new(list)
        .map_err(|e| ApiError::param("tools", e.to_string()))?
        .with_choice(choice)
        .map_err(|e| ApiError::param("tool_choice", e.to_string()))?
        .with_parallel(parallel);
    if !chat.active() {
        return Ok(Tools { chat, format: None, shown: Vec::new() });
    }
    let tpl = engine.chat_template().ok_or_else(|| {
        ApiError::param("tools", "the model has no chat template, so it cannot be given tools")
    })?;
    let format = tpl.tool_caps().format;
    let shown = format.marker_tokens(engine.tokenizer());
    Ok(Tools { chat, format: Some(format), shown })
}
