//! `kiln run --json` in chat mode evaluates exactly the jinja2-rendered prompt as
//! llama.cpp tokenizes it (fixture: scripts/gen-run-prompt-fixture.py).

use std::path::PathBuf;
use std::process::Command;

#[test]
fn chat_mode_prompt_ids_equal_llama_tokenize_of_the_jinja2_render() {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/chat/run_prompt_ids.json");
    let fx: serde_json::Value = serde_json::from_slice(&std::fs::read(p).unwrap()).unwrap();
    let mut checked = 0;
    for (name, rows) in fx["models"].as_object().unwrap() {
        for row in rows.as_array().unwrap() {
            let mut c = Command::new(env!("CARGO_BIN_EXE_kiln"));
            c.args([
                "run",
                "-m",
                name,
                "-t",
                "2",
                "-n",
                "0",
                "--json",
                "-p",
                row["prompt"].as_str().unwrap(),
            ]);
            if let Some(s) = row["system"].as_str() {
                c.args(["--system", s]);
            }
            let o = c.output().unwrap();
            assert_eq!(o.status.code(), Some(0), "{name}: {}", String::from_utf8_lossy(&o.stderr));
            let out: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
            assert_eq!(out["prompt_ids"], row["ids"], "{name} {}", row["case"]);
            checked += 1;
        }
    }
    assert!(checked >= 4);
}

/// `--chat-template NAME` renders the built-in format in place of the model's template (the
/// prompt ids those of `kiln tokenize` of the render, special tokens parsed), as does
/// `--chat-template-file` with a Jinja file; an unknown name exits 1 listing the names.
#[test]
fn chat_template_flag_replaces_the_models_template() {
    let kiln = |args: &[&str]| Command::new(env!("CARGO_BIN_EXE_kiln")).args(args).output().unwrap();
    let json = |o: &std::process::Output| -> serde_json::Value {
        assert_eq!(o.status.code(), Some(0), "{}", String::from_utf8_lossy(&o.stderr));
        serde_json::from_slice(&o.stdout).unwrap()
    };
    let ids = |text: &str| {
        let o = kiln(&["tokenize", "-m", "smollm2-135m", "-p", text]);
        json(&o)
    };
    let run = |extra: &[&str]| {
        let o = kiln(
            &[&["run", "-m", "smollm2-135m", "-t", "2", "-n", "0", "--json", "-p", "Hi"], extra].concat(),
        );
        json(&o)["prompt_ids"].clone()
    };
    assert_eq!(run(&["--chat-template", "vicuna"]), ids("USER: Hi\nASSISTANT:"));
    let file = std::env::temp_dir().join(format!("kiln-template-{}.jinja", std::process::id()));
    std::fs::write(&file, "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}").unwrap();
    assert_eq!(run(&["--chat-template-file", file.to_str().unwrap()]), ids("<user>Hi"));
    std::fs::remove_file(&file).ok();
    let o = kiln(&["run", "-m", "smollm2-135m", "-n", "0", "--chat-template", "vicunna", "Hi"]);
    assert_eq!(o.status.code(), Some(1));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("unknown chat template") && err.contains("vicuna-orca"), "{err}");
}
