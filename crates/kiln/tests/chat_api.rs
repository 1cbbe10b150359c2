//! The `kiln::chat` API: messages, GGUF templates, errors, and the real models' templates.

use kiln::chat::{ChatTemplate, Message};
use kiln::gguf::{Array, GgufFile, GgufWriter, Value as GValue};
use kiln::KilnError;
use serde_json::json;
use std::path::PathBuf;

fn fixture_template(name: &str) -> String {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join(format!("../../tests/fixtures/chat/templates/{name}.jinja"));
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

fn expected(template: &str, case: &str) -> String {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/chat/expected.json");
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap();
    v[template]["renders"][case]["ok"].as_str().unwrap().to_string()
}

const SMOLLM2: &str = "gguf-SmolLM2-135M-Instruct.Q4_1";
const QWEN25: &str = "gguf-qwen2.5-coder-0.5b-instruct-q4_k_m";

#[test]
fn chat_smollm2_chatml() {
    let t = ChatTemplate::new(&fixture_template(SMOLLM2), "<|im_start|>", "<|im_end|>").unwrap();
    let text = t.render(&[Message::system("Be brief."), Message::user("Hi")], true, None).unwrap();
    assert_eq!(
        text,
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    );
    // Without a system message the template supplies its own.
    let text = t.render(&[Message::user("Hi")], false, None).unwrap();
    assert!(text.starts_with("<|im_start|>system\nYou are a helpful AI assistant named SmolLM"), "{text}");
    assert!(text.ends_with("<|im_start|>user\nHi<|im_end|>\n"), "{text}");
    // Same as jinja2 for the fixture messages.
    let msgs =
        [Message::system("You are a helpful assistant."), Message::user("What is the capital of France?")];
    assert_eq!(t.render(&msgs, true, None).unwrap(), expected(SMOLLM2, "system_user"));
}

#[test]
fn chat_qwen25_tools_via_typed_messages() {
    let t = ChatTemplate::new(&fixture_template(QWEN25), "", "<|im_end|>").unwrap();
    let tools = json!([{
        "type": "function",
        "function": {
            "name": "get_current_temperature",
            "description": "Get the current temperature at a location.",
            "parameters": {
                "type": "object",
                "properties": {
                    "location": {"type": "string", "description": "The location, in the format \"City, Country\"."},
                    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}
                },
                "required": ["location"]
            }
        }
    }]);
    let call = json!([{
        "id": "call12345",
        "type": "function",
        "function": {"name": "get_current_temperature", "arguments": {"location": "Paris, France", "unit": "celsius"}}
    }]);
    let msgs = [
        Message::user("Temperature in Paris, please."),
        Message::assistant("Let me check.").with("tool_calls", call),
        Message::tool("22.0")
            .with("tool_call_id", json!("call12345"))
            .with("name", json!("get_current_temperature")),
        Message::assistant("It is 22 °C in Paris."),
    ];
    let got = t.render(&msgs, false, Some(&tools)).unwrap();
    assert_eq!(got, expected(QWEN25, "tool_calls_content"));
    assert!(got
        .contains("<tools>\n{\"type\": \"function\", \"function\": {\"name\": \"get_current_temperature\""));
    assert!(got.contains("<tool_call>\n{\"name\": \"get_current_temperature\", \"arguments\": {\"location\": \"Paris, France\""));
}

#[test]
fn chat_message_serde() {
    let m = Message::assistant("").with("tool_calls", json!([]));
    assert_eq!(
        serde_json::to_value(&m).unwrap(),
        json!({"role": "assistant", "content": "", "tool_calls": []})
    );
    let m: Message = serde_json::from_value(json!({"role": "assistant", "content": null, "x": 1})).unwrap();
    assert_eq!(m.content, "");
    assert_eq!(m.extra["x"], json!(1));
    let m: Message = serde_json::from_value(json!({"role": "user"})).unwrap();
    assert_eq!(m, Message::user(""));
}

fn gguf_with(template: Option<&str>, bos: u32, eos: u32) -> GgufFile {
    let mut w = GgufWriter::new();
    w.set("general.architecture", GValue::String("llama".into()));
    let tokens = ["<unk>", "<s>", "</s>", "a"].iter().map(|s| s.to_string()).collect();
    w.set("tokenizer.ggml.tokens", GValue::Array(Array::String(tokens)));
    w.set("tokenizer.ggml.bos_token_id", GValue::U32(bos));
    w.set("tokenizer.ggml.eos_token_id", GValue::U32(eos));
    if let Some(t) = template {
        w.set("tokenizer.chat_template", GValue::String(t.into()));
    }
    GgufFile::from_bytes(w.to_bytes()).unwrap()
}

#[test]
fn chat_from_gguf() {
    let src =
        "{{ bos_token }}{% for m in messages %}[{{ m.role }}] {{ m.content }}{{ eos_token }}{% endfor %}";
    let t = ChatTemplate::from_gguf(&gguf_with(Some(src), 1, 2)).unwrap().expect("has a template");
    assert_eq!((t.bos_token(), t.eos_token()), ("<s>", "</s>"));
    assert_eq!(t.render(&[Message::user("hi")], true, None).unwrap(), "<s>[user] hi</s>");
    assert!(ChatTemplate::from_gguf(&gguf_with(None, 1, 2)).unwrap().is_none());
    let e = ChatTemplate::from_gguf(&gguf_with(Some(src), 9, 2)).unwrap_err();
    assert!(e.to_string().contains("tokenizer.ggml.bos_token_id"), "{e}");
}

/// `--chat-template`: a built-in name or a Jinja source replaces the file's template (or
/// gives one to a file without), with the file's BOS/EOS texts; anything else is an error
/// listing the names.
#[test]
fn chat_from_spec() {
    let src = "{% for m in messages %}[{{ m.role }}] {{ m.content }}{{ eos_token }}{% endfor %}";
    for g in [gguf_with(None, 1, 2), gguf_with(Some(src), 1, 2)] {
        let t = ChatTemplate::from_spec(&g, "vicuna").unwrap();
        assert_eq!(t.render(&[Message::user("hi")], true, None).unwrap(), "USER: hi\nASSISTANT:");
        let t = ChatTemplate::from_spec(&g, "{{ bos_token }}{{ messages[0].content }}").unwrap();
        assert_eq!(t.render(&[Message::user("hi")], true, None).unwrap(), "<s>hi");
        let e = ChatTemplate::from_spec(&g, "vicunna").unwrap_err().to_string();
        assert!(e.contains("unknown chat template \"vicunna\"") && e.contains("chatml, llama2"), "{e}");
        assert!(ChatTemplate::from_spec(&g, "{% if %}").is_err());
    }
}

#[test]
fn chat_errors_name_the_line() {
    let e = ChatTemplate::new("line one\n{% for m in messages %}\n{{ m.content }\n{% endfor %}", "", "")
        .unwrap_err();
    assert!(matches!(e, KilnError::Template(_)));
    assert!(e.to_string().contains("line 3"), "{e}");

    let t = ChatTemplate::new(
        "{% if messages[0].role == 'system' %}\n{{ raise_exception('System role not supported') }}\n{% endif %}ok",
        "",
        "",
    )
    .unwrap();
    let e = t.render(&[Message::system("x")], true, None).unwrap_err();
    assert_eq!(e.to_string(), "chat template: line 2: System role not supported");
    assert_eq!(t.render(&[Message::user("x")], true, None).unwrap(), "ok");
}

/// A template is input from the model file: one that would loop 10^10 times fails with an
/// error, in bounded time, instead of hanging the caller (`kiln serve`'s request).
#[test]
fn chat_endless_template_runs_out_of_fuel() {
    let src = "{% for a in range(100000) %}{% for b in range(100000) %}x{% endfor %}{% endfor %}";
    let t = ChatTemplate::new(src, "", "").unwrap();
    let start = std::time::Instant::now();
    let e = t.render(&[Message::user("x")], true, None).unwrap_err();
    assert!(matches!(e, KilnError::Template(_)) && e.to_string().contains("fuel"), "{e}");
    eprintln!("ran out of fuel after {:?}", start.elapsed());
    // The same template with few steps still renders.
    let t = ChatTemplate::new(&src.replace("100000", "3"), "", "").unwrap();
    assert_eq!(t.render(&[Message::user("x")], true, None).unwrap(), "xxxxxxxxx");
}

#[test]
fn chat_python_semantics() {
    let t = |src: &str| {
        ChatTemplate::new(src, "<s>", "</s>").unwrap().render(&[Message::user(" Hi ")], true, None)
    };
    assert_eq!(
        t("{{ messages[0].content.strip() }}|{{ messages[0]['content'].split() }}").unwrap(),
        "Hi|['Hi']"
    );
    assert_eq!(
        t("{{ none }} {{ true }} {{ [1, 'a', none] }} {{ {'k': 1.0} }}").unwrap(),
        "None True [1, 'a', None] {'k': 1.0}"
    );
    assert_eq!(
        t("{{ {'a': '<é>'} | tojson }}|{{ [1, 2] | tojson(indent=2) }}").unwrap(),
        "{\"a\": \"<é>\"}|[\n  1,\n  2\n]"
    );
    assert_eq!(t("{{ '{}-{}'.format(1, 'x') }} {{ 'a,b'.split(',') | join('+') }}").unwrap(), "1-x a+b");
    assert_eq!(
        t("{% for k, v in {'b': 1, 'a': 2}.items() %}{{ k }}={{ v }};{% endfor %}").unwrap(),
        "b=1;a=2;"
    );
    assert_eq!(
        t("{{ messages[0].get('missing') is none }} {{ messages[0].get('x', 5) }}").unwrap(),
        "True 5"
    );
    assert_eq!(
        t("{{ tools is none }} {{ tools is defined }} {{ add_generation_prompt }}").unwrap(),
        "True True True"
    );
    // Iterating None fails in jinja2, so it does here.
    assert!(t("{% for x in tools %}{% endfor %}").is_err());
}

#[test]
fn chat_strftime_now() {
    let src = "{{ strftime_now('%d %b %Y') }}";
    let t = ChatTemplate::new(src, "", "").unwrap().with_fixed_time(1_741_964_966);
    assert_eq!(t.render(&[], false, None).unwrap(), "14 Mar 2025");
    // Unpinned: today's date in that shape.
    let now = ChatTemplate::new(src, "", "").unwrap().render(&[], false, None).unwrap();
    assert_eq!(now.len(), 11, "{now}");
}
