//! The grammar of a reply's tool calls in each format, so that every call the model makes
//! names a given function and its arguments match that function's schema. Under `required`
//! or a named choice it constrains the reply from the first token; under `auto` it waits
//! for a call to open (its marker, or a bare JSON call at the start of the reply) and
//! constrains the rest. The generic format constrains the whole reply always.
//!
//! Grammars are llguidance Lark: fixed parts as literals (markers that are control tokens
//! as `<[id]>`), each function's arguments as `%json` of its schema (with kiln's JSON schema
//! restrictions: objects that list `properties` are closed), written with `, ` and
//! `: ` separators and no other whitespace.

use serde_json::{json, Value};

use super::{ChatTools, Tool, ToolChoice, ToolFormat};
use crate::engine::Engine;
use crate::grammar::json::with_defaults;
use crate::grammar::{CompiledGrammar, Grammar, GrammarSpec, Trigger};
use crate::tokenizer::Tokenizer;
use crate::{KilnError, Result};

/// Whitespace between the fixed parts of a call (models write `{"name": ...}` with the
/// spacing they learned); bounded, so it cannot run on.
const WS: &str = r#"WS: /[ \t\n]{1,4}/"#;

/// Llama 3.1's builtin tools, which it calls as `<|python_tag|>name.call(key="value")`.
const LLAMA_BUILTINS: &[&str] = &["brave_search", "wolfram_alpha", "code_interpreter"];

/// The grammar of `tools`' calls in `format` (`None` when no tool may be called).
pub fn tool_grammar(format: ToolFormat, tools: &ChatTools, tok: &Tokenizer) -> Result<Option<GrammarSpec>> {
    if !tools.active() {
        return Ok(None);
    }
    let callable = tools.callable();
    let mut g = Lark {
        rules: Vec::new(),
        mistral_args: marker(tok, "[ARGS]").0,
        mistral_id: marker(tok, "[CALL_ID]").0,
    };
    let bodies: Vec<String> =
        callable.iter().enumerate().map(|(i, t)| g.call(i, t, format)).collect::<Result<_>>()?;
    g.rule("body", &bodies.join(" | "));
    let forced = !matches!(tools.choice, ToolChoice::Auto);
    let many = |item: &str, sep: &str| {
        if tools.parallel {
            format!("{item} ({sep}{item})*")
        } else {
            item.to_string()
        }
    };
    let mut triggers = Vec::new();
    let names = callable.iter().map(|t| regex_escape(&t.name)).collect::<Vec<_>>().join("|");
    match format {
        ToolFormat::Hermes => {
            let (open, trigger) = marker(tok, "<tool_call>");
            let (close, _) = marker(tok, "</tool_call>");
            // Tagged, bare, or in a Markdown code block as small models write it.
            g.rule(
                "item",
                &format!("{open} WS? body WS? {close} | body | \"```\" \"json\"? WS? body WS? \"```\""),
            );
            g.rule("start", &many("item", "WS? "));
            triggers.push(trigger);
            triggers.push(Trigger::Pattern(format!(
                r#"\A\s*((?:```(?:json)?\s*)?\{{\s*"name"\s*:\s*"(?:{names})")"#
            )));
        }
        ToolFormat::Llama3 => {
            let mut alts = vec!["body".to_string()];
            if let Some(id) = control_token(tok, "<|python_tag|>") {
                alts.push(format!("<[{id}]> WS? body"));
                triggers.push(Trigger::Token(id));
                for (i, t) in callable.iter().enumerate() {
                    if LLAMA_BUILTINS.contains(&t.name.as_str()) {
                        alts.push(format!("<[{id}]> {}", g.builtin(i, t)?));
                    }
                }
            }
            g.rule("start", &alts.join(" | "));
            triggers.push(bare_call_at_start(r#"(?:"type"\s*:\s*"function"\s*,\s*)?"name"\s*:"#));
        }
        ToolFormat::MistralNemo => {
            let (open, trigger) = marker(tok, "[TOOL_CALLS]");
            g.rule("start", &format!("{open} WS? \"[\" {} \"]\"", many("body", "\",\" WS? ")));
            triggers.push(trigger);
        }
        ToolFormat::Mistral => {
            let (open, trigger) = marker(tok, "[TOOL_CALLS]");
            g.rule("item", &format!("{open} body"));
            g.rule("start", &many("item", ""));
            triggers.push(trigger);
        }
        ToolFormat::Generic => {
            let calls = format!(
                "\"{{\" WS? \"\\\"tool_calls\\\"\" WS? \":\" WS? \"[\" WS? {} WS? \"]\" WS? \"}}\"",
                many("body", "WS? \",\" WS? ")
            );
            if forced {
                g.rule("start", &calls);
            } else {
                g.rule("calls", &calls);
                g.rule("response", "\"{\" WS? \"\\\"response\\\"\" WS? \":\" WS? answer WS? \"}\"");
                g.rule("answer", "%json {\"type\": \"string\"}");
                g.rule("start", "calls | response");
            }
        }
    }
    let grammar = Grammar::Lark(g.finish());
    Ok(Some(if forced || format == ToolFormat::Generic { grammar.into() } else { grammar.lazy(triggers) }))
}

/// [`tool_grammar`] compiled for `engine`'s vocabulary. A schema llguidance cannot take is
/// an error naming the tool.
pub fn compile_tool_grammar(
    engine: &Engine,
    format: ToolFormat,
    tools: &ChatTools,
) -> Result<Option<CompiledGrammar>> {
    let Some(spec) = tool_grammar(format, tools, engine.tokenizer())? else { return Ok(None) };
    match engine.compile_grammar(&spec) {
        Ok(g) => Ok(Some(g)),
        Err(e) => {
            // Name the tool whose schema fails on its own, if one does.
            for t in tools.callable() {
                if let Err(te) = engine.compile_grammar(&Grammar::JsonSchema(t.parameters.clone()).into()) {
                    let why = match te {
                        KilnError::Grammar(m) => m,
                        other => other.to_string(),
                    };
                    return Err(KilnError::Grammar(format!("the parameters of tool '{}': {why}", t.name)));
                }
            }
            Err(e)
        }
    }
}

/// A call as plain JSON at the start of the reply (after whitespace): `{` and the
/// `key_pattern` that makes it a call.
fn bare_call_at_start(key_pattern: &str) -> Trigger {
    Trigger::Pattern(format!(r"\A\s*(\{{\s*{key_pattern})"))
}

/// A marker as a Lark terminal and the trigger that sees it: a control token by id, else
/// its text.
fn marker(tok: &Tokenizer, text: &str) -> (String, Trigger) {
    match control_token(tok, text) {
        Some(id) => (format!("<[{id}]>"), Trigger::Token(id)),
        None => (lit(text), Trigger::Text(text.to_string())),
    }
}

/// The id of `text` when it is one control token of `tok`.
fn control_token(tok: &Tokenizer, text: &str) -> Option<u32> {
    match tok.encode(text, false, true).ok()?.as_slice() {
        [id] if tok.is_control(*id) => Some(*id),
        _ => None,
    }
}

/// A Lark string literal.
fn lit(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_default()
}

fn regex_escape(s: &str) -> String {
    s.chars()
        .map(|c| if c.is_ascii_alphanumeric() || c == '_' { c.to_string() } else { format!("\\{c}") })
        .collect()
}

/// The arguments schema as `%json` takes it: kiln's separators, no free whitespace, and
/// the restrictions every kiln JSON schema gets (closed objects, implied types, bounded
/// integers), as llama.cpp's tool grammars have them too.
fn args_json(t: &Tool) -> Result<String> {
    let mut schema = t.parameters.clone();
    if let Value::Object(m) = &mut schema {
        m.insert(
            "x-guidance".into(),
            json!({"whitespace_flexible": false, "item_separator": ", ", "key_separator": ": "}),
        );
    }
    let schema = with_defaults(&schema)
        .map_err(|e| KilnError::Grammar(format!("the parameters of tool '{}': {e}", t.name)))?;
    Ok(schema.to_string())
}

/// A Lark grammar under construction.
struct Lark {
    rules: Vec<String>,
    /// Mistral's `[ARGS]` and `[CALL_ID]` markers as terminals.
    mistral_args: String,
    mistral_id: String,
}

impl Lark {
    fn rule(&mut self, name: &str, body: &str) {
        self.rules.push(format!("{name}: {body}"));
    }

    /// Tool `i`'s call in `format` (rule `call_i`, arguments rule `args_i`); returns the
    /// rule's name.
    fn call(&mut self, i: usize, t: &Tool, format: ToolFormat) -> Result<String> {
        self.rule(&format!("args_{i}"), &format!("%json {}", args_json(t)?));
        let key = |k: &str| format!("{} WS? \":\" WS?", lit(&format!("\"{k}\"")));
        let name = lit(&format!("\"{}\"", t.name));
        let body = match format {
            ToolFormat::Mistral => {
                // name, an optional nine-character call id, then the arguments.
                format!(
                    "{} ({} /[a-zA-Z0-9]{{9}}/)? {} args_{i}",
                    lit(&t.name),
                    self.mistral_id,
                    self.mistral_args
                )
            }
            _ => {
                let args_key = if format == ToolFormat::Llama3 { "parameters" } else { "arguments" };
                let kind = if format == ToolFormat::Llama3 {
                    format!("({} \"\\\"function\\\"\" WS? \",\" WS?)?", key("type"))
                } else {
                    String::new()
                };
                let id = if format == ToolFormat::MistralNemo {
                    format!(" WS? \",\" WS? {} \"\\\"\" /[a-zA-Z0-9]{{9}}/ \"\\\"\"", key("id"))
                } else {
                    String::new()
                };
                format!(
                    "\"{{\" WS? {kind} {} {name} WS? \",\" WS? {} args_{i}{id} WS? \"}}\"",
                    key("name"),
                    key(args_key)
                )
            }
        };
        self.rule(&format!("call_{i}"), &body);
        Ok(format!("call_{i}"))
    }

    /// Tool `i` as a Llama 3.1 builtin call, `name.call(key=value, ...)` with each property
    /// of its schema in order (rule `builtin_i`).
    fn builtin(&mut self, i: usize, t: &Tool) -> Result<String> {
        let props = t.parameters.get("properties").and_then(Value::as_object);
        let Some(props) = props.filter(|p| !p.is_empty()) else {
            return Err(KilnError::invalid(format!("builtin tool '{}' needs parameter properties", t.name)));
        };
        let mut parts = Vec::new();
        for (j, (k, schema)) in props.iter().enumerate() {
            let mut schema = schema.clone();
            if let Value::Object(m) = &mut schema {
                m.insert("x-guidance".into(), json!({"whitespace_flexible": false}));
            }
            let schema = with_defaults(&schema)?;
            self.rule(&format!("builtin_{i}_{j}"), &format!("%json {schema}"));
            parts.push(format!("{} builtin_{i}_{j}", lit(&format!("{k}="))));
        }
        let body = format!("{} {} \")\"", lit(&format!("{}.call(", t.name)), parts.join(" \", \" "));
        self.rule(&format!("builtin_{i}"), &body);
        Ok(format!("builtin_{i}"))
    }

    fn finish(mut self) -> String {
        self.rules.push(WS.to_string());
        self.rules.join("\n") + "\n"
    }
}
