//! Which tool-call format a chat template speaks, found the way llama.cpp finds it: by
//! rendering probe conversations through the template and reading what comes out (does it
//! show the tools, an assistant's call, a tool result; how does it write the call).

use serde_json::{json, Value};

use crate::chat::ChatTemplate;
use crate::tokenizer::Tokenizer;

/// How a model writes tool calls.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ToolFormat {
    /// `<tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>`, one block per call:
    /// Hermes 2/3 Pro, Qwen 2.5 and 3, and the templates that copied them.
    Hermes,
    /// `{"name": ..., "parameters": {...}}` as the whole reply, optionally after
    /// `<|python_tag|>` (where builtin tools also write `name.call(key="value")`): Llama 3.1-3.3.
    Llama3,
    /// `[TOOL_CALLS][{"name": ..., "arguments": {...}, "id": "..."}]`: Mistral Nemo and the
    /// other v3-tokenizer Mistral templates.
    MistralNemo,
    /// `[TOOL_CALLS]name[ARGS]{...}` per call (`[CALL_ID]id` between, in some): Mistral Small
    /// 3.2, Devstral, Ministral 3.
    Mistral,
    /// kiln's own JSON reply, for every other template: a system message lists the tools and
    /// asks for `{"tool_calls": [{"name": ..., "arguments": {...}}]}` or
    /// `{"response": "..."}`, and the whole reply is constrained to that.
    Generic,
}

impl ToolFormat {
    /// The name the docs and logs use.
    pub fn name(self) -> &'static str {
        match self {
            ToolFormat::Hermes => "hermes",
            ToolFormat::Llama3 => "llama3",
            ToolFormat::MistralNemo => "mistral-nemo",
            ToolFormat::Mistral => "mistral",
            ToolFormat::Generic => "generic",
        }
    }

    /// The marker strings of calls in this format.
    pub fn markers(self) -> &'static [&'static str] {
        match self {
            ToolFormat::Hermes => &["<tool_call>", "</tool_call>"],
            ToolFormat::Llama3 => &["<|python_tag|>"],
            ToolFormat::MistralNemo => &["[TOOL_CALLS]"],
            ToolFormat::Mistral => &["[TOOL_CALLS]", "[ARGS]", "[CALL_ID]"],
            ToolFormat::Generic => &[],
        }
    }

    /// The markers that are control tokens of `tok`: a detokenizer must show their text
    /// for the reply's parser to see them.
    pub fn marker_tokens(self, tok: &Tokenizer) -> Vec<u32> {
        self.markers()
            .iter()
            .filter_map(|m| match tok.encode(m, false, true).ok()?.as_slice() {
                [id] if tok.is_control(*id) => Some(*id),
                _ => None,
            })
            .collect()
    }
}

/// What a template does with tools, found by probe renders.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TemplateCaps {
    pub format: ToolFormat,
    /// It renders the `tools` it is given.
    pub takes_tools: bool,
    /// It renders an assistant message's `tool_calls`.
    pub takes_tool_calls: bool,
    /// It renders `arguments` given as an object (else they go as a JSON string).
    pub object_arguments: bool,
    /// It renders `tool` messages.
    pub takes_tool_role: bool,
    /// It renders a leading `system` message.
    pub takes_system: bool,
}

const PROBE_TOOL: &str = "kiln_probe_tool";
const PROBE_CALL: &str = "kiln_probe_call";
const PROBE_ARG: &str = "kiln_probe_arg";
const PROBE_RESULT: &str = "kiln-probe-result";
const PROBE_SYSTEM: &str = "kiln-probe-system";
/// Nine letters: Mistral's templates insist on call ids of exactly nine alphanumerics.
const PROBE_ID: &str = "kilnprobe";

impl TemplateCaps {
    /// Probes `t`. Renders that fail count as "not supported".
    pub fn detect(t: &ChatTemplate) -> TemplateCaps {
        let user = json!({"role": "user", "content": "kiln-probe-user"});
        let render = |msgs: Value, tools: Option<&Value>| t.render_json(&msgs, false, tools).ok();
        let has = |text: &Option<String>, needle: &str| text.as_deref().is_some_and(|s| s.contains(needle));

        let tool = json!([{"type": "function", "function": {"name": PROBE_TOOL, "description": "probe",
            "parameters": {"type": "object", "properties": {PROBE_ARG: {"type": "string"}}, "required": [PROBE_ARG]}}}]);
        let takes_system = has(
            &render(json!([{"role": "system", "content": PROBE_SYSTEM}, user.clone()]), None),
            PROBE_SYSTEM,
        );
        let takes_tools = has(&render(json!([user.clone()]), Some(&tool)), PROBE_TOOL);

        let call = |arguments: Value| {
            json!({"role": "assistant", "content": "", "tool_calls": [{"id": PROBE_ID, "type": "function",
                "function": {"name": PROBE_CALL, "arguments": arguments}}]})
        };
        let object_args = json!({PROBE_ARG: "kiln-probe-value"});
        let as_object = render(json!([user.clone(), call(object_args.clone())]), Some(&tool));
        let object_arguments = has(&as_object, PROBE_ARG);
        let rendered = if object_arguments {
            as_object
        } else {
            render(json!([user.clone(), call(json!(object_args.to_string()))]), Some(&tool))
        };
        let takes_tool_calls = has(&rendered, PROBE_CALL);
        let arguments = if object_arguments { object_args } else { json!(object_args.to_string()) };
        let result =
            json!({"role": "tool", "tool_call_id": PROBE_ID, "name": PROBE_CALL, "content": PROBE_RESULT});
        let before =
            if takes_tool_calls { call(arguments) } else { json!({"role": "assistant", "content": "ok"}) };
        let takes_tool_role = has(&render(json!([user, before, result]), Some(&tool)), PROBE_RESULT);

        // The call's own text: where the render with the call leaves the one with a reply.
        let reply = json!({"role": "assistant", "content": "kiln-probe-reply"});
        let plain = render(json!([user.clone(), reply]), Some(&tool)).unwrap_or_default();
        let format = match rendered.as_deref() {
            Some(text) if takes_tools && takes_tool_calls => {
                let common = text.bytes().zip(plain.bytes()).take_while(|(a, b)| a == b).count();
                let mut at = common;
                while !text.is_char_boundary(at) {
                    at -= 1;
                }
                classify(&text[at..])
            }
            _ => ToolFormat::Generic,
        };
        TemplateCaps {
            format,
            takes_tools,
            takes_tool_calls,
            object_arguments,
            takes_tool_role,
            takes_system,
        }
    }
}

/// The format of a rendered call (the render from where the call's text begins).
fn classify(text: &str) -> ToolFormat {
    let name = format!("\"name\": \"{PROBE_CALL}\"");
    let after = |marker: &str| text.find(marker).map(|i| &text[i..]);
    if let Some(rest) = after("[TOOL_CALLS]") {
        if rest.starts_with(&format!("[TOOL_CALLS]{PROBE_CALL}[")) {
            return ToolFormat::Mistral;
        }
        if rest.contains(&name) {
            return ToolFormat::MistralNemo;
        }
    }
    if let Some(rest) = after("<tool_call>") {
        let body = rest.trim_start_matches("<tool_call>").trim_start();
        if body.starts_with('{') && body.contains(&name) && body.contains("\"arguments\": ") {
            return ToolFormat::Hermes;
        }
    }
    if text.contains(&format!("{{{name}, \"parameters\": ")) {
        return ToolFormat::Llama3;
    }
    ToolFormat::Generic
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chatml_without_tools_is_generic() {
        let src = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}";
        let caps = TemplateCaps::detect(&ChatTemplate::new(src, "", "").unwrap());
        assert_eq!(caps.format, ToolFormat::Generic);
        assert!(!caps.takes_tools && !caps.takes_tool_calls);
        assert!(caps.takes_tool_role && caps.takes_system);
    }
}
