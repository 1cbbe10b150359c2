//! Tool calling without a model: every chat template's detected format, prompts rendered
//! with tools, and the streaming parser on the output cases of
//! tests/fixtures/chat/tool_calls.json (partly ported from llama.cpp's test-chat.cpp), fed
//! whole and in every kind of piece.

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;

use kiln::chat::tools::{render_chat, ChatTools, Parsed, Tool, ToolCallParser, ToolChoice, ToolFormat};
use kiln::chat::ChatTemplate;
use serde_json::{json, Value};

fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/chat")
}

fn template(name: &str) -> ChatTemplate {
    let src = std::fs::read_to_string(fixtures().join("templates").join(format!("{name}.jinja"))).unwrap();
    ChatTemplate::new(&src, "<s>", "</s>").unwrap().with_fixed_time(1_741_964_966)
}

fn format_named(name: &str) -> ToolFormat {
    [
        ToolFormat::Hermes,
        ToolFormat::Llama3,
        ToolFormat::MistralNemo,
        ToolFormat::Mistral,
        ToolFormat::Generic,
    ]
    .into_iter()
    .find(|f| f.name() == name)
    .unwrap_or_else(|| panic!("unknown format {name}"))
}

/// The formats llama.cpp's test-chat.cpp parses each template's calls with; every other
/// template in the fixtures gets the generic format.
const FAMILIES: &[(&str, &str)] = &[
    ("gguf-qwen2.5-coder-0.5b-instruct-q4_k_m", "hermes"),
    ("Qwen-Qwen2.5-7B-Instruct", "hermes"),
    ("Qwen-Qwen3-0.6B", "hermes"),
    ("Qwen-QwQ-32B", "hermes"),
    ("NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use", "hermes"),
    ("NousResearch-Hermes-3-Llama-3.1-8B-tool_use", "hermes"),
    ("MiMo-VL", "hermes"),
    ("Reka-Edge", "hermes"),
    ("Bielik-11B-v3.0-Instruct", "hermes"),
    ("ibm-granite-granite-4.0", "hermes"),
    ("ibm-granite-granite-4.1", "hermes"),
    ("meta-llama-Llama-3.1-8B-Instruct", "llama3"),
    ("meta-llama-Llama-3.2-3B-Instruct", "llama3"),
    ("meta-llama-Llama-3.3-70B-Instruct", "llama3"),
    ("mistralai-Mistral-Nemo-Instruct-2407", "mistral-nemo"),
    ("Mistral-Small-3.2-24B-Instruct-2506", "mistral"),
    ("unsloth-mistral-Devstral-Small-2507", "mistral"),
    ("mistralai-Ministral-3-14B-Reasoning-2512", "mistral"),
    ("gguf-SmolLM2-135M-Instruct.Q4_1", "generic"),
];

#[test]
fn every_template_gets_its_family_format() {
    let want: HashMap<&str, &str> = FAMILIES.iter().copied().collect();
    let mut seen = 0;
    for e in std::fs::read_dir(fixtures().join("templates")).unwrap() {
        let path = e.unwrap().path();
        let name = path.file_stem().unwrap().to_str().unwrap().to_string();
        let t = template(&name);
        let got = t.tool_caps().format.name();
        let expect = want.get(name.as_str()).copied().unwrap_or("generic");
        assert_eq!(got, expect, "{name}");
        seen += 1;
    }
    assert!(seen > 60, "only {seen} templates");
}

fn special_function() -> Tool {
    Tool::function(
        "special_function",
        "I'm special",
        json!({"type": "object", "properties": {"arg1": {"type": "integer", "description": "The arg."}},
               "required": ["arg1"]}),
    )
}

#[test]
fn tools_reach_the_template_as_it_renders_them() {
    let t = template("gguf-qwen2.5-coder-0.5b-instruct-q4_k_m");
    let tools = ChatTools::new(vec![special_function()]).unwrap();
    let msgs = json!([{"role": "user", "content": "Hi"}]);
    let ours = render_chat(&t, &msgs, &tools, true).unwrap();
    let direct = t.render_json(&msgs, true, Some(&tools.to_openai())).unwrap();
    assert_eq!(ours, direct);
    assert!(ours.contains("\"name\": \"special_function\""), "{ours}");
    // tool_choice none: the model is not shown the tools.
    let none = tools.clone().with_choice(ToolChoice::None).unwrap();
    let plain = render_chat(&t, &msgs, &none, true).unwrap();
    assert_eq!(plain, t.render_json(&msgs, true, None).unwrap());
}

#[test]
fn history_calls_render_in_each_family() {
    let history = |id: &str, args: Value| {
        json!([
            {"role": "user", "content": "Call it"},
            {"role": "assistant", "content": null, "tool_calls": [
                {"id": id, "type": "function", "function": {"name": "special_function", "arguments": args}}]},
            {"role": "tool", "tool_call_id": id, "content": "{\"ok\": true}"},
        ])
    };
    let tools = ChatTools::new(vec![special_function()]).unwrap();
    // Arguments as OpenAI sends them (a JSON string) are shown as the object they encode.
    let qwen = render_chat(
        &template("Qwen-Qwen2.5-7B-Instruct"),
        &history("call_abc", json!("{\"arg1\": 1}")),
        &tools,
        true,
    )
    .unwrap();
    assert!(
        qwen.contains(
            "<tool_call>\n{\"name\": \"special_function\", \"arguments\": {\"arg1\": 1}}\n</tool_call>"
        ),
        "{qwen}"
    );
    assert!(qwen.contains("<tool_response>\n{\"ok\": true}\n</tool_response>"), "{qwen}");
    // Mistral's template raises on ids that are not nine alphanumerics: they are mapped,
    // the same way for the call and its result.
    let nemo = render_chat(
        &template("mistralai-Mistral-Nemo-Instruct-2407"),
        &history("call_0123456789abcdefghijklmn", json!({"arg1": 1})),
        &tools,
        true,
    )
    .unwrap();
    let id_at = nemo.find("\"id\": \"").unwrap() + 7;
    let id = &nemo[id_at..id_at + 9];
    assert!(id.bytes().all(|b| b.is_ascii_alphanumeric()), "{nemo}");
    assert!(nemo.contains(&format!("\"call_id\": \"{id}\"")), "{nemo}");
    let llama = render_chat(
        &template("meta-llama-Llama-3.1-8B-Instruct"),
        &history("c1", json!({"arg1": 1})),
        &tools,
        true,
    )
    .unwrap();
    assert!(llama.contains("{\"name\": \"special_function\", \"parameters\": {\"arg1\": 1}}"), "{llama}");
    // A template with no tool support: kiln's instructions, and the call as generic JSON.
    let smol = render_chat(
        &template("gguf-SmolLM2-135M-Instruct.Q4_1"),
        &history("c1", json!("{\"arg1\": 1}")),
        &tools,
        true,
    )
    .unwrap();
    assert!(smol.starts_with("<|im_start|>system\nYou can call the following functions."), "{smol}");
    assert!(smol.contains("\"name\": \"special_function\""), "{smol}");
    assert!(
        smol.contains("<|im_start|>assistant\n{\"tool_calls\": [{\"name\": \"special_function\", \"arguments\": {\"arg1\": 1}}]}<|im_end|>"),
        "{smol}"
    );
    // Gemma 2 takes no system message: the instructions open the first user message.
    let gemma = render_chat(
        &template("google-gemma-2-2b-it"),
        &json!([{"role": "user", "content": "Hi"}]),
        &tools,
        true,
    )
    .unwrap();
    assert!(gemma.contains("<start_of_turn>user\nYou can call the following functions."), "{gemma}");
}

struct Case {
    format: ToolFormat,
    output: String,
    content: String,
    calls: Vec<(String, Value)>,
}

fn cases() -> Vec<Case> {
    let text = std::fs::read_to_string(fixtures().join("tool_calls.json")).unwrap();
    let doc: Value = serde_json::from_str(&text).unwrap();
    doc["cases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| Case {
            format: format_named(c["format"].as_str().unwrap()),
            output: c["output"].as_str().unwrap().to_string(),
            content: c["content"].as_str().unwrap().to_string(),
            calls: c["calls"]
                .as_array()
                .unwrap()
                .iter()
                .map(|p| (p[0].as_str().unwrap().to_string(), p[1].clone()))
                .collect(),
        })
        .collect()
}

const TOOL_NAMES: &[&str] =
    &["special_function", "special_function_with_opt", "python", "code_interpreter", "brave_search"];

/// Feeds `pieces` and checks that the deltas add up to the reply.
fn run(case: &Case, pieces: &[&str]) {
    let names = TOOL_NAMES.iter().map(|s| s.to_string()).collect();
    let mut p = ToolCallParser::new(case.format).with_names(names);
    let mut out = Parsed::default();
    for piece in pieces {
        p.push(piece, &mut out);
    }
    let reply = p.finish(&mut out);
    let ctx = format!("{:?} in {} pieces: {:?}", case.output, pieces.len(), pieces);
    assert_eq!(reply.content, case.content, "{ctx}");
    assert_eq!(out.content, reply.content, "streamed content, {ctx}");
    let got: Vec<(String, Value)> = reply
        .tool_calls
        .iter()
        .map(|c| {
            let args = serde_json::from_str(&c.arguments).unwrap_or_else(|e| panic!("{ctx}: arguments {e}"));
            (c.name.clone(), args)
        })
        .collect();
    assert_eq!(got, case.calls, "{ctx}");
    // Deltas: id and name first, then argument text adding up to the arguments.
    let mut streamed: Vec<(String, String, String)> = Vec::new();
    for d in &out.tool_calls {
        if d.index == streamed.len() {
            let (id, name) =
                (d.id.clone().expect("first delta has the id"), d.name.clone().expect("and the name"));
            assert!(d.arguments.is_empty(), "{ctx}");
            streamed.push((id, name, String::new()));
        } else {
            assert!(d.id.is_none() && d.name.is_none(), "{ctx}");
            streamed[d.index].2.push_str(&d.arguments);
        }
    }
    for (i, c) in reply.tool_calls.iter().enumerate() {
        assert_eq!((&streamed[i].0, &streamed[i].1, &streamed[i].2), (&c.id, &c.name, &c.arguments), "{ctx}");
    }
    let ids: HashSet<&str> = reply.tool_calls.iter().map(|c| c.id.as_str()).collect();
    assert_eq!(ids.len(), reply.tool_calls.len(), "{ctx}");
    assert!(ids.iter().all(|id| id.starts_with("call_") && id.len() > 5), "{ctx}");
}

fn split_every(s: &str, n: usize) -> Vec<&str> {
    let mut out = Vec::new();
    let mut at = 0;
    while at < s.len() {
        let mut end = (at + n).min(s.len());
        while !s.is_char_boundary(end) {
            end += 1;
        }
        out.push(&s[at..end]);
        at = end;
    }
    out
}

#[test]
fn outputs_parse_the_same_whole_and_in_pieces() {
    let cases = cases();
    assert!(cases.len() >= 30);
    for case in &cases {
        run(case, &[&case.output]);
        for n in [1, 2, 3, 5, 8, 13] {
            run(case, &split_every(&case.output, n));
        }
        // Every split in two.
        for k in 1..case.output.len() {
            if case.output.is_char_boundary(k) {
                run(case, &[&case.output[..k], &case.output[k..]]);
            }
        }
    }
}

#[test]
fn no_markup_reaches_the_content() {
    for case in cases() {
        if case.calls.is_empty() {
            continue;
        }
        let mut p = ToolCallParser::new(case.format);
        let mut out = Parsed::default();
        for piece in split_every(&case.output, 1) {
            p.push(piece, &mut out);
            for marker in ["<tool_call>", "[TOOL_CALLS]", "<|python_tag|>", "\"arguments\"", "\"parameters\""]
            {
                assert!(!out.content.contains(marker), "{:?}: {:?}", case.output, out.content);
            }
        }
    }
}
