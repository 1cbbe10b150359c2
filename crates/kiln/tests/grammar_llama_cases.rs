//! llama.cpp's grammar tests, ported as data (tests/fixtures/grammar/, written by
//! scripts/port-llama-grammar-tests.py): every grammar in its `grammars/` folder compiles;
//! the pass/fail strings of tests/test-grammar-integration.cpp are accepted/rejected alike;
//! the schemas of tests/test-json-schema-to-grammar.cpp compile (or fail) as llama.cpp's
//! converter does, and the GBNF it writes for each compiles with kiln's GBNF front end.
//!
//! Text is fed byte by byte over a vocabulary of single bytes; llama.cpp's test tokens
//! (`token(N)`, N < 32) are special tokens 0..31 of that vocabulary.

mod support;

use std::sync::Arc;

use kiln::grammar::{CompiledGrammar, Grammar, GrammarEnv};
use serde_json::Value;
use support::*;

/// Ids 0..32 are the special tokens `<[i]>`; ids 32..256 are those bytes, 256..288 the bytes
/// 0..32; 288 is the end of generation.
fn env() -> Arc<GrammarEnv> {
    let mut words: Vec<Vec<u8>> = (0..32).map(|i| format!("\u{ff}<[{i}]>").into_bytes()).collect();
    for w in &mut words {
        // The marker is the byte 0xFF, not the character U+00FF.
        w.splice(0..2, [0xffu8]);
    }
    words.extend((32..=255u8).map(|b| vec![b]));
    words.extend((0..32u8).map(|b| vec![b]));
    words.push(b"\xff<eos>".to_vec());
    Arc::new(GrammarEnv::from_vocab(words, &[288]).unwrap())
}

fn byte_id(b: u8) -> u32 {
    if b >= 32 {
        b as u32
    } else {
        256 + b as u32
    }
}

/// A test string: text, or a list of text and `{"token": N}` segments.
fn ids(s: &Value) -> Vec<u32> {
    let segs = match s {
        Value::Array(a) => a.clone(),
        other => vec![other.clone()],
    };
    let mut out = Vec::new();
    for seg in segs {
        match seg {
            Value::String(t) => out.extend(t.bytes().map(byte_id)),
            Value::Object(o) => out.push(o["token"].as_u64().unwrap() as u32),
            other => panic!("bad segment {other}"),
        }
    }
    out
}

fn show(s: &Value) -> String {
    s.to_string()
}

fn grammar(kind: &str, text: &str) -> Grammar {
    match kind {
        "gbnf" => Grammar::Gbnf(text.into()),
        _ => Grammar::json_schema_str(text).unwrap(),
    }
}

/// Integration cases whose schema uses a keyword llguidance does not implement: kiln refuses
/// the schema naming it (llama.cpp ignores the keyword).
const UNSUPPORTED: &[(&str, &str)] = &[("required props", "uniqueItems")];

#[test]
fn integration_strings_pass_and_fail_as_in_llama_cpp() {
    let env = env();
    let data = fixture_json("grammar/integration.json");
    let cases = data["cases"].as_array().unwrap();
    assert!(cases.len() >= 40);
    let mut problems = Vec::new();
    let (mut n_pass, mut n_fail) = (0, 0);
    for c in cases {
        let name = c["name"].as_str().unwrap();
        let (kind, text) = (c["kind"].as_str().unwrap(), c["grammar"].as_str().unwrap());
        let compiled: CompiledGrammar = match env.compile(&grammar(kind, text).into()) {
            Ok(_) if UNSUPPORTED.iter().any(|(n, _)| *n == name) => {
                problems.push(format!("{name}: listed as unsupported but compiles"));
                continue;
            }
            Ok(g) => g,
            Err(e) => {
                match UNSUPPORTED.iter().find(|(n, _)| *n == name) {
                    Some((_, kw)) if e.to_string().contains(kw) => {}
                    _ => problems.push(format!("{name}: does not compile: {e}")),
                }
                continue;
            }
        };
        for s in c["pass"].as_array().unwrap() {
            n_pass += 1;
            if !compiled.matches_tokens(&ids(s)) {
                problems.push(format!("{name}: should pass: {}", show(s)));
            }
        }
        for s in c["fail"].as_array().unwrap() {
            n_fail += 1;
            if compiled.matches_tokens(&ids(s)) {
                problems.push(format!("{name}: should fail: {}", show(s)));
            }
        }
    }
    eprintln!("{n_pass} passing and {n_fail} failing strings checked");
    assert!(problems.is_empty(), "{} problems:\n{}", problems.len(), problems.join("\n"));
}

#[test]
fn grammars_llama_cpp_refuses() {
    let env = env();
    let data = fixture_json("grammar/integration.json");
    for c in data["llama_cpp_refuses"].as_array().unwrap() {
        let text = c["grammar"].as_str().unwrap();
        let r = env.compile(&Grammar::Gbnf(text.into()).into());
        match c["reason"].as_str().unwrap() {
            "no root rule" => assert!(r.unwrap_err().to_string().contains("no `root` rule")),
            "undefined rule" => assert!(r.unwrap_err().to_string().contains("undefined rule `numero`")),
            // An Earley parser takes left recursion, which llama.cpp's stack machine cannot.
            "left recursion" => {
                let g = r.unwrap_or_else(|e| panic!("{text}: {e}"));
                assert!(!g.matches(""));
            }
            other => panic!("unknown reason {other}"),
        }
    }
    // The languages are what the grammars say.
    let g = env.compile(&Grammar::Gbnf("root ::= \"a\" | root \"a\"".into()).into()).unwrap();
    assert!(g.matches("a") && g.matches("aaaa") && !g.matches("ab"));
}

#[test]
fn every_example_grammar_compiles() {
    let env = env();
    let dir = fixtures().join("grammar/gbnf");
    let mut n = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        let text = std::fs::read_to_string(&path).unwrap();
        env.compile(&Grammar::Gbnf(text).into()).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        n += 1;
    }
    assert_eq!(n, 8, "llama.cpp's grammars/ folder has 8 grammars");
    // And they mean what they say.
    let read = |f: &str| std::fs::read_to_string(dir.join(f)).unwrap();
    let json = env.compile(&Grammar::Gbnf(read("json.gbnf")).into()).unwrap();
    assert!(json.matches("{\"a\": [1, 2.5e3, true, null, \"x\\n\"]}") && !json.matches("{\"a\": }"));
    let arith = env.compile(&Grammar::Gbnf(read("arithmetic.gbnf")).into()).unwrap();
    assert!(arith.matches("(1+2)*3=9\n") && !arith.matches("(1+2)*3"));
    let chess = env.compile(&Grammar::Gbnf(read("chess.gbnf")).into()).unwrap();
    assert!(chess.matches("1. e4 e5\n2. Nf3 Nc6\n"));
    let list = env.compile(&Grammar::Gbnf(read("list.gbnf")).into()).unwrap();
    assert!(list.matches("- milk\n- bread\n") && !list.matches("milk"));
}

/// Schemas llama.cpp converts that kiln refuses, with the error's words: `prefixItems`
/// given a schema instead of an array (invalid in draft 2020-12; llama.cpp reads it as
/// `items`), and a pattern with look-ahead (llama.cpp drops that property's pattern).
const SCHEMA_UNSUPPORTED: &[(&str, &str)] = &[
    ("string array", "prefixItems must be an array"),
    ("nullable string array", "prefixItems must be an array"),
    ("array with empty items and prefixItems", "prefixItems must be an array"),
    ("unsupported regexp in a property", "look-around"),
];

#[test]
fn json_schema_to_grammar_cases() {
    let env = env();
    let data = fixture_json("grammar/json-schema-to-grammar.json");
    let cases = data["cases"].as_array().unwrap();
    assert!(cases.len() >= 80);
    let mut problems = Vec::new();
    for c in cases {
        let name = c["name"].as_str().unwrap();
        let schema = c["schema"].as_str().unwrap();
        let r = Grammar::json_schema_str(schema).and_then(|g| env.compile(&g.into()));
        match (c["status"].as_str().unwrap(), r) {
            ("FAILURE", Ok(_)) => {
                problems.push(format!("{name}: llama.cpp refuses this schema, kiln took it"))
            }
            ("SUCCESS", Ok(_)) if SCHEMA_UNSUPPORTED.iter().any(|(n, _)| *n == name) => {
                problems.push(format!("{name}: listed as unsupported but compiles"))
            }
            ("SUCCESS", Err(e)) => match SCHEMA_UNSUPPORTED.iter().find(|(n, _)| *n == name) {
                Some((_, kw)) if e.to_string().contains(kw) => {}
                _ => problems.push(format!("{name}: {e}")),
            },
            _ => {}
        }
        // llama.cpp's own GBNF for the schema is a real-world grammar for the front end.
        if c["status"] == "SUCCESS" {
            let gbnf = c["grammar"].as_str().unwrap();
            if let Err(e) = env.compile(&Grammar::Gbnf(gbnf.into()).into()) {
                problems.push(format!("{name}: llama.cpp's GBNF does not compile: {e}"));
            }
        }
    }
    assert!(problems.is_empty(), "{} problems:\n{}", problems.len(), problems.join("\n"));
}
