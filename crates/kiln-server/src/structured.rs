//! The request fields that shape a reply: `tools`, `tool_choice` and `parallel_tool_calls`
//! (what the model is shown, how its reply is parsed into calls, and the grammar that
//! keeps the calls valid), `response_format` and llama.cpp's `grammar` (a constraint on
//! the whole reply).

use serde_json::{Map, Value};

use kiln::chat::tools::{compile_tool_grammar, ChatTools, Tool, ToolCallParser, ToolChoice, ToolFormat};
use kiln::engine::Engine;
use kiln::grammar::{CompiledGrammar, Grammar};

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

/// The grammar a reply must match: its tool calls' (when tools may be called), or the one
/// `response_format` or `grammar` asks for. A schema or grammar that does not compile is a
/// 400 naming the field and the problem.
pub fn grammar(o: &Obj, engine: &Engine, tools: &Tools) -> Result<Option<CompiledGrammar>, ApiError> {
    let asked = output_grammar(o)?;
    if let Some(format) = tools.format {
        if let Some((field, _)) = asked {
            return Err(ApiError::param(
                field,
                format!("'{field}' cannot be combined with tools the model may call"),
            ));
        }
        return compile_tool_grammar(engine, format, &tools.chat)
            .map_err(|e| ApiError::param("tools", e.to_string()));
    }
    let Some((field, g)) = asked else { return Ok(None) };
    engine.compile_grammar(&g.into()).map(Some).map_err(|e| ApiError::param(field, e.to_string()))
}

/// `response_format` (`text`, `json_object`, `json_schema`) or `grammar` (GBNF), with the
/// field it came from.
fn output_grammar(o: &Obj) -> Result<Option<(&'static str, Grammar)>, ApiError> {
    let present = |k: &str| o.get(k).filter(|v| !v.is_null());
    let bad = |m: &str| ApiError::param("response_format", m.to_string());
    let format = match present("response_format") {
        None => None,
        Some(Value::Object(rf)) => match rf.get("type").and_then(Value::as_str) {
            Some("text") => None,
            Some("json_object") => Some(Grammar::JsonObject),
            Some("json_schema") => {
                let js = rf
                    .get("json_schema")
                    .and_then(Value::as_object)
                    .ok_or_else(|| bad("'response_format.json_schema' must be an object"))?;
                if js.get("name").is_some_and(|n| !n.is_string()) {
                    return Err(bad("'response_format.json_schema.name' must be a string"));
                }
                if js.get("strict").is_some_and(|v| !v.is_boolean() && !v.is_null()) {
                    return Err(bad("'response_format.json_schema.strict' must be a boolean"));
                }
                // `strict` either way: kiln always enforces the schema.
                match js.get("schema") {
                    None | Some(Value::Null) => Some(Grammar::JsonObject),
                    Some(schema) => Some(Grammar::JsonSchema(schema.clone())),
                }
            }
            _ => return Err(bad("'response_format.type' must be 'text', 'json_object' or 'json_schema'")),
        },
        Some(_) => return Err(bad("'response_format' must be an object")),
    };
    let gbnf = match present("grammar") {
        None => None,
        Some(Value::String(g)) => Some(Grammar::Gbnf(g.clone())),
        Some(_) => return Err(ApiError::param("grammar", "'grammar' must be a string (GBNF)")),
    };
    match (format, gbnf) {
        (Some(_), Some(_)) => {
            Err(ApiError::param("grammar", "'grammar' and 'response_format' cannot be combined"))
        }
        (Some(g), None) => Ok(Some(("response_format", g))),
        (None, Some(g)) => Ok(Some(("grammar", g))),
        (None, None) => Ok(None),
    }
}
