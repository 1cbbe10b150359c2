//! Tool calling on a real model (qwen2.5-coder-0.5b, whose template speaks the Hermes
//! format): each format's call grammar accepts well-formed calls and rejects the rest;
//! sessions with `required`, a named function and `none`; a call, its result and the
//! answer after it; a schema llguidance cannot take is an error naming the tool.

mod support;

use std::ops::ControlFlow;
use std::sync::Arc;

use kiln::chat::tools::{tool_grammar, ChatTools, Tool, ToolChoice, ToolFormat};
use kiln::grammar::{Grammar, GrammarEnv};
use kiln::{Engine, EngineOptions, GenerateOptions, Message, SessionOptions};
use serde_json::{json, Value};
use support::*;

fn engine() -> Engine {
    let opts = EngineOptions::default().with_n_ctx(2048).with_threads(2);
    Engine::load(model(QWEN05.name).to_str().unwrap(), opts).unwrap()
}

fn weather() -> Tool {
    Tool::function(
        "get_weather",
        "Current weather of a city",
        json!({"type": "object", "properties": {"city": {"type": "string"},
               "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}, "required": ["city"]}),
    )
}

fn time() -> Tool {
    Tool::function(
        "get_time",
        "Local time in a time zone",
        json!({"type": "object", "properties": {"timezone": {"type": "string"}}, "required": ["timezone"]}),
    )
}

fn tools(choice: ToolChoice, parallel: bool) -> ChatTools {
    ChatTools::new(vec![weather(), time()]).unwrap().with_choice(choice).unwrap().with_parallel(parallel)
}

#[test]
fn call_grammars_accept_calls_and_nothing_else() {
    let e = engine();
    let env: Arc<GrammarEnv> = e.grammar_env().unwrap();
    let tok = e.tokenizer();
    let w = r#"{"name": "get_weather", "arguments": {"city": "Paris"}}"#;
    let t = r#"{"name": "get_time", "arguments": {"timezone": "Europe/Paris"}}"#;
    let cases: Vec<(ToolFormat, ToolChoice, bool, String, bool)> = vec![
        (ToolFormat::Hermes, ToolChoice::Required, true, format!("<tool_call>\n{w}\n</tool_call>"), true),
        (ToolFormat::Hermes, ToolChoice::Required, true, w.to_string(), true),
        (ToolFormat::Hermes, ToolChoice::Required, true, format!("```json\n{w}\n```"), true),
        (ToolFormat::Hermes, ToolChoice::Required, true, format!("<tool_call>\n{w}\n</tool_call>\n<tool_call>\n{t}\n</tool_call>"), true),
        (ToolFormat::Hermes, ToolChoice::Required, false, format!("<tool_call>\n{w}\n</tool_call>\n<tool_call>\n{t}\n</tool_call>"), false),
        (ToolFormat::Hermes, ToolChoice::Function("get_time".into()), true, format!("<tool_call>\n{w}\n</tool_call>"), false),
        (ToolFormat::Hermes, ToolChoice::Function("get_time".into()), true, format!("<tool_call>\n{t}\n</tool_call>"), true),
        (ToolFormat::Hermes, ToolChoice::Required, true, r#"{"name": "get_weather", "arguments": {"city": 5}}"#.into(), false),
        (ToolFormat::Hermes, ToolChoice::Required, true, r#"{"name": "get_weather", "arguments": {"unit": "celsius"}}"#.into(), false),
        (ToolFormat::Hermes, ToolChoice::Required, true, r#"{"name": "get_weather", "arguments": {"city": "Paris", "unit": "kelvin"}}"#.into(), false),
        (ToolFormat::Hermes, ToolChoice::Required, true, r#"{"name": "get_weather", "arguments": {"city": "Paris",  "unit": "celsius"}}"#.into(), false),
        (ToolFormat::Hermes, ToolChoice::Required, true, r#"{"name": "get_wind", "arguments": {"city": "Paris"}}"#.into(), false),
        // Objects that list their properties are closed, as in response_format's schemas.
        (ToolFormat::Hermes, ToolChoice::Required, true, r#"{"name": "get_time", "arguments": {"timezone": "UTC", "type": "string"}}"#.into(), false),
        (ToolFormat::Hermes, ToolChoice::Required, true, "Sure, I can help.".into(), false),
        (ToolFormat::MistralNemo, ToolChoice::Required, true, r#"[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}, "id": "a1b2c3d4e"}]"#.into(), true),
        (ToolFormat::MistralNemo, ToolChoice::Required, true, r#"[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}, "id": "short"}]"#.into(), false),
        (ToolFormat::Mistral, ToolChoice::Required, true, r#"[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}[TOOL_CALLS]get_time[CALL_ID]a1b2c3d4e[ARGS]{"timezone": "UTC"}"#.into(), true),
        (ToolFormat::Llama3, ToolChoice::Required, true, r#"{"name": "get_weather", "parameters": {"city": "Paris"}}"#.into(), true),
        (ToolFormat::Llama3, ToolChoice::Required, true, r#"{"type": "function", "name": "get_time", "parameters": {"timezone": "UTC"}}"#.into(), true),
        (ToolFormat::Llama3, ToolChoice::Required, true, w.to_string(), false),
        (ToolFormat::Generic, ToolChoice::Auto, true, format!(r#"{{"tool_calls": [{w}, {t}]}}"#), true),
        (ToolFormat::Generic, ToolChoice::Auto, true, r#"{"response": "It is sunny."}"#.into(), true),
        (ToolFormat::Generic, ToolChoice::Required, true, r#"{"response": "It is sunny."}"#.into(), false),
        (ToolFormat::Generic, ToolChoice::Required, false, format!(r#"{{"tool_calls": [{w}, {t}]}}"#), false),
    ];
    for (format, choice, parallel, text, want) in cases {
        let spec = tool_grammar(format, &tools(choice.clone(), parallel), tok).unwrap().unwrap();
        let g = env.compile(&spec).unwrap_or_else(|e| panic!("{format:?} {choice:?}: {e}"));
        assert_eq!(g.matches(&text), want, "{format:?} {choice:?} parallel={parallel}: {text}");
    }
    assert!(tool_grammar(ToolFormat::Hermes, &tools(ToolChoice::None, true), tok).unwrap().is_none());
}

/// Whether `args` is JSON that the tool's schema accepts (checked by the schema's own
/// grammar, independent of the call grammar that produced it).
fn validates(e: &Engine, tool: &Tool, args: &str) -> bool {
    serde_json::from_str::<Value>(args).is_ok()
        && e.compile_grammar(&Grammar::JsonSchema(tool.parameters.clone()).into()).unwrap().matches(args)
}

fn ask(
    e: &Engine,
    question: &str,
    tools: &ChatTools,
) -> (kiln::Summary, Vec<kiln::chat::tools::ToolCallDelta>, String) {
    let mut s = e.session(SessionOptions::default()).unwrap();
    s.append_chat_with(&[Message::user(question)], tools).unwrap();
    let mut deltas = Vec::new();
    let mut streamed = String::new();
    let opts =
        GenerateOptions::default().with_sampler(kiln::sample::SamplerParams::greedy()).with_max_tokens(96);
    let sum = s
        .generate(&opts, |ev| {
            deltas.extend_from_slice(ev.tool_calls);
            streamed.push_str(ev.text);
            ControlFlow::Continue(())
        })
        .unwrap();
    (sum, deltas, streamed)
}

#[test]
fn sessions_call_tools_as_told() {
    let e = engine();
    let all = [weather(), time()];
    for (choice, question) in [
        (ToolChoice::Required, "What's the weather in Paris?"),
        (ToolChoice::Function("get_time".into()), "Hello! How are you?"),
        (ToolChoice::Required, "Tell me a joke."),
    ] {
        let (sum, deltas, streamed) = ask(&e, question, &tools(choice.clone(), true));
        assert!(!sum.tool_calls.is_empty(), "{choice:?}: {sum:?}");
        for c in &sum.tool_calls {
            let tool = all.iter().find(|t| t.name == c.name).unwrap();
            assert!(validates(&e, tool, &c.arguments), "{choice:?}: {c:?}");
            assert!(c.id.starts_with("call_"));
        }
        if let ToolChoice::Function(name) = &choice {
            assert!(sum.tool_calls.iter().all(|c| &c.name == name), "{sum:?}");
        }
        // The stream carried the same calls, and no markup.
        let args: String = deltas.iter().filter(|d| d.index == 0).map(|d| d.arguments.as_str()).collect();
        assert_eq!(args, sum.tool_calls[0].arguments);
        assert_eq!(deltas[0].name.as_deref(), Some(sum.tool_calls[0].name.as_str()));
        assert_eq!(streamed, sum.text);
        assert!(!sum.text.contains("tool_call") && !sum.text.contains("\"name\""), "{}", sum.text);
    }
    // none: no calls, the tools unseen.
    let (sum, deltas, _) = ask(&e, "What's the weather in Paris?", &tools(ToolChoice::None, true));
    assert!(sum.tool_calls.is_empty() && deltas.is_empty());
}

#[test]
fn a_call_its_result_and_the_answer() {
    let e = engine();
    let mut s = e.session(SessionOptions::default()).unwrap();
    let required = tools(ToolChoice::Function("get_weather".into()), false);
    s.append_chat_with(&[Message::user("What's the weather in Paris?")], &required).unwrap();
    let opts =
        GenerateOptions::default().with_sampler(kiln::sample::SamplerParams::greedy()).with_max_tokens(64);
    let first = s.generate(&opts, |_| ControlFlow::Continue(())).unwrap();
    assert_eq!(first.tool_calls.len(), 1, "{first:?}");
    let call = &first.tool_calls[0];
    let last = s.history().last().unwrap();
    assert_eq!(last.extra["tool_calls"][0]["id"], json!(call.id));
    // The result goes back, and the model answers from it (tools off: a 0.5B model would
    // call again).
    let result = Message::tool(r#"{"temperature": 21, "sky": "sunny"}"#).with("tool_call_id", json!(call.id));
    let ids = s.append_chat_with(&[result], &tools(ToolChoice::None, false)).unwrap();
    let prompt = e.tokenizer().decode(&ids, true);
    assert!(
        prompt.contains("<tool_response>\n{\"temperature\": 21, \"sky\": \"sunny\"}\n</tool_response>"),
        "{prompt}"
    );
    let answer = s.generate(&opts, |_| ControlFlow::Continue(())).unwrap();
    assert!(answer.tool_calls.is_empty(), "{answer:?}");
    assert!(answer.text.contains("21"), "{}", answer.text);
}

#[test]
fn a_schema_the_engine_cannot_take_names_its_tool() {
    let e = engine();
    let bad = Tool::function("broken", "", json!({"type": "object", "properties": {"x": {"type": "strin"}}}));
    let t = ChatTools::new(vec![weather(), bad]).unwrap().with_choice(ToolChoice::Required).unwrap();
    let mut s = e.session(SessionOptions::default()).unwrap();
    s.append_chat_with(&[Message::user("Hi")], &t).unwrap();
    let err = s.generate(&GenerateOptions::default(), |_| ControlFlow::Continue(())).unwrap_err().to_string();
    assert!(err.contains("'broken'"), "{err}");
}
