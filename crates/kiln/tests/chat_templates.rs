//! Every chat template of tests/fixtures/chat/ rendered by kiln must equal Python
//! jinja2's render as Hugging Face's `apply_chat_template` makes it (fixtures from
//! scripts/gen-chat-fixtures.py), or both must fail.

use kiln::chat::ChatTemplate;
use serde_json::Value;
use std::path::PathBuf;

/// Templates whose jinja2 output depends on something minijinja cannot express, with why.
/// Their renders may differ; every other one must match.
const KNOWN_DIVERGENCES: &[(&str, &str)] = &[(
    "meetkai-functionary-medium-v3.1",
    "`\"...\"|safe + t | tojson()`: jinja2's Markup + str HTML-escapes the JSON (&#34;); \
     minijinja's `+` has no Markup type",
)];

fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/chat")
}

fn load(name: &str) -> Value {
    let path = fixtures().join(name);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap()
}

/// First differing position, with context, for a readable failure.
fn diff(want: &str, got: &str) -> String {
    let i = want.bytes().zip(got.bytes()).take_while(|(a, b)| a == b).count();
    let ctx = |s: &str| {
        let mut a = i.saturating_sub(40);
        while !s.is_char_boundary(a) {
            a -= 1;
        }
        let mut b = (i + 40).min(s.len());
        while !s.is_char_boundary(b) {
            b += 1;
        }
        format!("{:?}", &s[a..b])
    };
    format!("at byte {i}: want {} got {}", ctx(want), ctx(got))
}

#[test]
fn chat_templates_match_jinja2() {
    let cases = load("cases.json");
    let now = cases["meta"]["fixed_now_unix"].as_i64().unwrap();
    let cases = cases["cases"].as_object().unwrap();
    let expected = load("expected.json");
    let (mut same_text, mut both_fail, mut total) = (0, 0, 0);
    let mut failures = Vec::new();
    let mut known = Vec::new();
    for (name, exp) in expected.as_object().unwrap() {
        let src =
            std::fs::read_to_string(fixtures().join("templates").join(format!("{name}.jinja"))).unwrap();
        let bos = exp["bos_token"].as_str().unwrap();
        let eos = exp["eos_token"].as_str().unwrap();
        let tmpl = ChatTemplate::new(&src, bos, eos).map(|t| t.with_fixed_time(now));
        for (case, want) in exp["renders"].as_object().unwrap() {
            total += 1;
            let c = &cases[case];
            let got = tmpl.as_ref().map_err(|e| e.to_string()).and_then(|t| {
                t.render_json(&c["messages"], c["add_generation_prompt"].as_bool().unwrap(), c.get("tools"))
                    .map_err(|e| e.to_string())
            });
            match (want.get("ok").and_then(Value::as_str), &got) {
                (Some(w), Ok(g)) if w == g => {
                    same_text += 1;
                    continue;
                }
                (None, Err(e)) => {
                    if std::env::var_os("KILN_SHOW_ERRORS").is_some() {
                        eprintln!(
                            "  both fail: {name} / {case}\n    jinja2: {}\n    kiln:   {e}",
                            want["error"]
                        );
                    }
                    both_fail += 1;
                    continue;
                }
                _ => {}
            }
            let detail = match (want.get("ok").and_then(Value::as_str), &got) {
                (Some(w), Ok(g)) => diff(w, g),
                (Some(_), Err(e)) => format!("kiln failed: {e}"),
                (None, Ok(_)) => format!("kiln rendered, jinja2 failed: {}", want["error"]),
                (None, Err(_)) => unreachable!(),
            };
            let line = format!("{name} / {case}: {detail}");
            match KNOWN_DIVERGENCES.iter().find(|(t, _)| t == name) {
                Some((_, why)) => known.push(format!("{line}\n    known: {why}")),
                None => failures.push(line),
            }
        }
    }
    eprintln!(
        "chat templates: {}/{total} agree with jinja2 ({same_text} identical renders, {both_fail} fail in both), \
         {} known divergences",
        same_text + both_fail,
        known.len()
    );
    for f in known.iter().chain(&failures) {
        eprintln!("  {f}");
    }
    assert!(failures.is_empty(), "{} of {total} renders differ from jinja2", failures.len());
    assert!(total >= 70 * 8, "fixtures look incomplete: {total}");
}

/// The built-in templates (`--chat-template NAME`) render as llama.cpp renders the same
/// names (`llama_chat_apply_template`; fixtures from scripts/gen-builtin-template-fixtures),
/// every name and every conversation, and the fixtures name every built-in.
#[test]
fn builtin_templates_match_llama_cpp() {
    use kiln::chat::builtin::{builtin_template, BUILTIN_TEMPLATES};
    use kiln::chat::Message;
    let want = load("builtin_templates.json");
    let want = want.as_object().unwrap();
    assert_eq!(want.len(), BUILTIN_TEMPLATES.len(), "a fixture per built-in template");
    let cases: [(&str, Vec<Message>, bool); 4] = [
        (
            "full",
            vec![
                Message::system("You are a helpful assistant"),
                Message::user("Hello"),
                Message::assistant("Hi there"),
                Message::user("Who are you"),
                Message::assistant("   I am an assistant   "),
                Message::user("Another question"),
            ],
            true,
        ),
        ("image", vec![Message::user("Describe this image.\n<__media__>")], true),
        ("done", vec![Message::user("Hello"), Message::assistant("Hi there")], false),
        ("brief", vec![Message::system("Be brief."), Message::user("Hi")], true),
    ];
    for (name, renders) in want {
        let src = builtin_template(name).unwrap_or_else(|| panic!("{name}: not built in"));
        let t = ChatTemplate::new(src, "<s>", "</s>").unwrap();
        for (case, messages, add) in &cases {
            let got = t.render(messages, *add, None).unwrap();
            let want = renders[*case].as_str().unwrap();
            assert!(got == want, "{name} {case}: {}", diff(want, &got));
        }
    }
}
