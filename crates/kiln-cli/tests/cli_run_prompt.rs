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
