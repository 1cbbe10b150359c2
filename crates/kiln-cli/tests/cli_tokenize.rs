//! `kiln tokenize` against docs/cli.md: ids as llama-tokenize prints them, pieces, flags, text
//! sources and exit codes.

use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};

mod support;
use support::model;

fn kiln(args: &[&str], stdin: Option<&[u8]>) -> Output {
    let mut c = Command::new(env!("CARGO_BIN_EXE_kiln"));
    c.arg("tokenize").args(args).stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = c.spawn().unwrap();
    let mut pipe = child.stdin.take().unwrap();
    pipe.write_all(stdin.unwrap_or_default()).unwrap();
    drop(pipe);
    child.wait_with_output().unwrap()
}

fn stdout(o: &Output) -> String {
    assert_eq!(o.status.code(), Some(0), "stderr: {}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8(o.stdout.clone()).unwrap()
}

fn fixture(stem: &str) -> serde_json::Value {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join(format!("../../tests/fixtures/tokenizer/{stem}.tokenize.json"));
    serde_json::from_slice(&std::fs::read(p).unwrap()).unwrap()
}

/// Every oracle string, written to a file and read with `-f`, gives llama.cpp's ids.
#[test]
fn ids_match_llama_tokenize() {
    for stem in ["gemma-3-270m-q4_k_m", "SmolLM2-135M-Instruct.Q4_1"] {
        let Some(m) = model(stem) else { continue };
        let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
            .join(format!("kiln-cli-tokenize-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        for case in fixture(stem)["cases"].as_array().unwrap() {
            let file = dir.join("text.txt");
            std::fs::write(&file, case["text"].as_str().unwrap()).unwrap();
            let out = stdout(&kiln(&["-m", m.to_str().unwrap(), "-f", file.to_str().unwrap()], None));
            let got: Vec<u64> = serde_json::from_str(&out).unwrap();
            let want: Vec<u64> =
                case["ids"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap()).collect();
            assert_eq!(got, want, "{stem} {}", case["name"]);
            assert!(out.ends_with("]\n") && out.lines().count() == 1);
        }
        std::fs::remove_dir_all(&dir).ok();
    }
}

#[test]
fn flags_and_sources() {
    let Some(m) = model("gemma-3-270m-q4_k_m") else { return };
    let m = m.to_str().unwrap();
    assert_eq!(stdout(&kiln(&["-m", m, "-p", "Hello world"], None)), "[2, 9259, 1902]\n");
    assert_eq!(stdout(&kiln(&["-m", m, "Hello world"], None)), "[2, 9259, 1902]\n");
    assert_eq!(stdout(&kiln(&["-m", m, "-f", "-"], Some(b"Hello world"))), "[2, 9259, 1902]\n");
    assert_eq!(stdout(&kiln(&["-m", m, "--no-bos", "-p", "Hello world"], None)), "[9259, 1902]\n");
    assert_eq!(stdout(&kiln(&["-m", m, "--no-bos", "-p", "<start_of_turn>"], None)), "[105]\n");
    let plain = stdout(&kiln(&["-m", m, "--no-bos", "--no-parse-special", "-p", "<start_of_turn>"], None));
    assert_ne!(plain, "[105]\n");
    assert_eq!(
        stdout(&kiln(&["-m", m, "--pieces", "-p", "Hi \"you\""], None)),
        "[[2, \"<bos>\"], [10979, \"Hi\"], [623, \" \\\"\"], [7624, \"you\"], [236775, \"\\\"\"]]\n"
    );
}

#[test]
fn pieces_show_partial_utf8_as_bytes() {
    let Some(m) = model("SmolLM2-135M-Instruct.Q4_1") else { return };
    // A rare character splits into byte-level tokens that are not UTF-8 on their own.
    let out = stdout(&kiln(&["-m", m.to_str().unwrap(), "--pieces", "-p", "\u{1F9EC}"], None));
    let pairs: Vec<(u32, String)> = serde_json::from_str(&out).unwrap();
    let joined: String = pairs.iter().map(|p| p.1.as_str()).collect();
    assert!(joined.contains("<0x"), "{out}");
}

#[test]
fn errors_and_usage() {
    let Some(m) = model("gemma-3-270m-q4_k_m") else { return };
    let m = m.to_str().unwrap();
    let o = kiln(&["-m", m, "-f", "-"], Some(b"a\xffb"));
    assert_eq!(o.status.code(), Some(1));
    assert!(o.stdout.is_empty());
    assert!(String::from_utf8_lossy(&o.stderr).starts_with("error: stdin: invalid UTF-8"));
    let o = kiln(&["-m", m, "-f", "/nonexistent/text.txt"], None);
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stderr).contains("/nonexistent/text.txt"));
    let o = kiln(&["-m", "/nonexistent/model.gguf", "-p", "x"], None);
    assert_eq!(o.status.code(), Some(1));
    assert_eq!(kiln(&["-m", m, "-p", "a", "b"], None).status.code(), Some(2));
    assert_eq!(kiln(&["-m", m, "--bogus"], None).status.code(), Some(2));
    assert_eq!(kiln(&["-m", m], None).status.code(), Some(1));
}
