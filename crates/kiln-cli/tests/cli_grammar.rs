//! The grammar flags of `kiln run` and `kiln chat` (docs/cli.md): outputs match the grammar
//! or schema, `--json` keeps its one-line shape, bad grammars and schemas exit 1 naming the
//! problem, and two grammar flags at once are a usage error.

mod support;

use std::io::Write;
use std::process::{Command, Output, Stdio};

use support::{fails, kiln};

fn run(extra: &[&str]) -> Output {
    let mut args = vec!["run", "-t", "2", "--temp", "0", "-n", "64"];
    args.extend_from_slice(extra);
    kiln(&args)
}

fn stdout(out: &Output) -> String {
    assert!(out.status.success(), "stderr: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout.clone()).unwrap()
}

fn tmp(name: &str, text: &str) -> String {
    let p = std::env::temp_dir().join(format!("kiln-cli-grammar-{}-{name}", std::process::id()));
    std::fs::write(&p, text).unwrap();
    p.to_str().unwrap().to_string()
}

#[test]
fn gbnf_inline_and_from_a_file() {
    let out = stdout(&run(&["--grammar", r#"root ::= ("yes" | "no") "!""#, "-p", "Is water wet?"]));
    assert!(out == "yes!" || out == "no!", "{out:?}");
    let f = tmp("list.gbnf", "root ::= item{2}\nitem ::= \"- \" [a-z]{1,10} \"\\n\"\n");
    let out = stdout(&run(&["--grammar-file", &f, "-p", "Two fruits"]));
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 2, "{out:?}");
    assert!(lines.iter().all(|l| l.starts_with("- ") && l[2..].bytes().all(|b| b.is_ascii_lowercase())));
}

#[test]
fn lark_when_the_text_says_llguidance() {
    let out = stdout(&run(&["--grammar", "%llguidance {}\nstart: \"A\" /[0-9]{3}/", "-p", "A number"]));
    assert!(out.len() == 4 && out.starts_with('A'), "{out:?}");
}

#[test]
fn json_schema_inline_and_file_with_json_output() {
    let schema = r#"{"type":"object","properties":{"name":{"type":"string","maxLength":12},"n":{"type":"integer"}},"required":["name","n"]}"#;
    let check = |out: &Output| {
        let line = stdout(out);
        assert_eq!(line.matches('\n').count(), 1, "--json is one line: {line}");
        let j: serde_json::Value = serde_json::from_str(&line).unwrap();
        assert_eq!(j["finish_reason"], "eog");
        let v: serde_json::Value = serde_json::from_str(j["text"].as_str().unwrap()).unwrap();
        assert!(v["name"].is_string() && v["n"].is_i64(), "{v}");
        assert_eq!(v.as_object().unwrap().len(), 2, "no other properties: {v}");
    };
    check(&run(&["--json", "--json-schema", schema, "-p", "A person"]));
    let f = tmp("schema.json", schema);
    check(&run(&["--json", "--json-schema", &f, "-p", "A person"]));
}

#[test]
fn json_object() {
    let out = kiln(&[
        "run",
        "-t",
        "2",
        "--temp",
        "0",
        "-n",
        "200",
        "--json-object",
        "-p",
        "Answer in JSON with the key \"answer\": what is 2+2?",
    ]);
    let out = stdout(&out);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out:?}"));
    assert!(v.is_object());
}

#[test]
fn chat_takes_the_same_flags() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args(["chat", "-t", "2", "--temp", "0", "-n", "16", "--grammar", "root ::= [0-9]+"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(b"How many legs has a cat?\nAnd a bird?\n").unwrap();
    let out = child.wait_with_output().unwrap();
    let text = stdout(&out);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 2, "{text:?}");
    assert!(lines.iter().all(|l| !l.is_empty() && l.bytes().all(|b| b.is_ascii_digit())), "{text:?}");
}

#[test]
fn bad_grammars_exit_1_naming_the_problem() {
    fails(&run(&["--grammar", "root ::= \"a\" (", "-p", "x"]), "GBNF line 1, column 15: expected `)`");
    fails(&run(&["--grammar", "root ::= undefined-rule", "-p", "x"]), "undefined rule `undefined-rule`");
    fails(&run(&["--grammar-file", "/nonexistent.gbnf", "-p", "x"]), "/nonexistent.gbnf");
    fails(&run(&["--json-schema", "{\"type\":", "-p", "x"]), "JSON schema is not JSON");
    fails(&run(&["--json-schema", r#"{"type":"array","minContains":1}"#, "-p", "x"]), "minContains");
    fails(&run(&["--json-schema", r#"{"type":"string","format":"bogus"}"#, "-p", "x"]), "bogus");
    let chat = kiln(&["chat", "-t", "2", "--grammar", "root ::= ["]);
    fails(&chat, "unterminated character class");
    let both = run(&["--json-object", "--grammar", "root ::= \"a\"", "-p", "x"]);
    assert_eq!(both.status.code(), Some(2));
}
