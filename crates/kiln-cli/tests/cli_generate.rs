//! `kiln run`, `logits`, `perplexity` and `bench` per docs/cli.md on the default model: JSON
//! shapes, greedy ids against llama.cpp's oracle, and clear errors for impossible settings.

mod support;

use std::process::Output;

use serde_json::Value as Json;
use support::{fails, fixture, kiln};

fn json_out(out: &Output) -> Json {
    assert!(out.status.success(), "stderr: {}", String::from_utf8_lossy(&out.stderr));
    let s = String::from_utf8(out.stdout.clone()).unwrap();
    assert_eq!(s.matches('\n').count(), 1, "one line of JSON: {s}");
    serde_json::from_str(&s).unwrap()
}

fn oracle_case(i: usize) -> Json {
    let s = std::fs::read_to_string(fixture("oracle/SmolLM2-135M-Instruct.Q4_1/greedy.json")).unwrap();
    serde_json::from_str::<Json>(&s).unwrap()["cases"][i].clone()
}

#[test]
fn run_raw_greedy_matches_llama_cpp() {
    let case = oracle_case(0);
    let prompt = case["prompt"].as_str().unwrap();
    let out = kiln(&["run", "--raw", "--temp", "0", "-n", "48", "-t", "2", "--json", "-p", prompt]);
    let j = json_out(&out);
    assert_eq!(j["prompt_ids"], case["prompt_ids"]);
    assert_eq!(j["ids"], case["ids"], "the oracle's first prompt has no near-tie");
    assert_eq!(j["text"], case["text"]);
    assert_eq!(j["finish_reason"], "length");
    for k in ["load_ms", "prompt_n", "prompt_ms", "prompt_tok_s", "gen_n", "gen_ms", "gen_tok_s"] {
        assert!(j["timings"][k].is_number(), "timings.{k}");
    }
}

#[test]
fn run_streams_only_the_text() {
    let case = oracle_case(0);
    let out = kiln(&["run", "--raw", "--temp", "0", "-n", "12", "-p", case["prompt"].as_str().unwrap()]);
    assert!(out.status.success());
    let want: String = {
        let j = json_out(&kiln(&[
            "run",
            "--raw",
            "--temp",
            "0",
            "-n",
            "12",
            "--json",
            "-p",
            case["prompt"].as_str().unwrap(),
        ]));
        j["text"].as_str().unwrap().to_string()
    };
    assert_eq!(String::from_utf8(out.stdout).unwrap(), want);
}

#[test]
fn run_chat_mode_and_stop_string() {
    let j = json_out(&kiln(&[
        "run",
        "--temp",
        "0",
        "-n",
        "64",
        "--json",
        "--stop",
        ".",
        "-p",
        "Why is the sky blue?",
    ]));
    // ChatML: the prompt starts with <|im_start|> (id 1) and ends with the assistant header.
    assert_eq!(j["prompt_ids"][0], 1);
    let text = j["text"].as_str().unwrap();
    assert!(["stop", "eog", "length"].contains(&j["finish_reason"].as_str().unwrap()));
    if j["finish_reason"] == "stop" {
        assert!(!text.contains('.'), "text is cut before the stop string: {text:?}");
    }
}

#[test]
fn logits_json_shape() {
    let j = json_out(&kiln(&["logits", "--raw", "-p", "My favourite fruit is the", "--top", "5", "--json"]));
    assert_eq!(j["n_vocab"], 49152);
    let top = j["top"].as_array().unwrap();
    assert_eq!(top.len(), 5);
    let v: Vec<f64> = top.iter().map(|p| p[1].as_f64().unwrap()).collect();
    assert!(v.windows(2).all(|w| w[0] >= w[1]));
    // llama.cpp's argmax for this prompt (oracle top_logits.json).
    assert_eq!(top[0][0], 12619);
}

/// An empty raw prompt has no tokens, so no logits: a clear error, not a panic.
#[test]
fn logits_of_an_empty_raw_prompt_is_an_error() {
    fails(&kiln(&["logits", "--raw", "-p", ""]), "the prompt has no tokens");
}

#[test]
fn perplexity_json_shape() {
    let text = fixture("oracle/ppl.txt");
    let j = json_out(&kiln(&[
        "perplexity",
        "-f",
        text.to_str().unwrap(),
        "-c",
        "128",
        "--chunks",
        "2",
        "--json",
    ]));
    assert_eq!(j["chunks"], 2);
    assert_eq!(j["n_ctx"], 128);
    assert_eq!(j["n_scored"], 2 * 63);
    assert!(j["ppl"].as_f64().unwrap() > 1.0);
}

#[test]
fn bench_json_shape() {
    let j = json_out(&kiln(&["bench", "-p", "16", "-n", "4", "-r", "2", "-t", "2", "--json"]));
    let rows = j.as_array().unwrap();
    assert_eq!(rows.len(), 2);
    assert_eq!(rows[0]["test"], "pp16");
    assert_eq!(rows[1]["test"], "tg4");
    assert!(rows[0]["gbps"].is_null() && rows[1]["gbps"].as_f64().unwrap() > 0.0);
    assert_eq!(rows[1]["samples_ns"].as_array().unwrap().len(), 2);
}

/// At depth a decode step reads the cached keys and values too: more bytes per token.
#[test]
fn bench_gbps_counts_the_kv_cache_at_depth() {
    let j = json_out(&kiln(&["bench", "-p", "0", "-n", "2", "-d", "0,64", "-r", "1", "--json"]));
    let per_token: Vec<f64> = j
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["gbps"].as_f64().unwrap() / r["avg_ts"].as_f64().unwrap())
        .collect();
    assert_eq!(per_token.len(), 2);
    assert!(per_token[1] > per_token[0] * 1.0001, "{per_token:?}");
}

#[test]
fn impossible_settings_are_errors() {
    fails(&kiln(&["run", "-c", "100000", "-p", "hi"]), "trained context");
    let long = "word ".repeat(200);
    fails(&kiln(&["run", "--raw", "-c", "64", "-p", &long]), "more than the context");
    fails(&kiln(&["run", "--top-p", "1.5", "-p", "hi"]), "top_p");
    fails(&kiln(&["run", "--device", "tpu", "-p", "hi"]), "unknown device");
    fails(&kiln(&["run", "-m", "/nonexistent/model.gguf", "-p", "hi"]), "model.gguf");
    fails(&kiln(&["perplexity", "-c", "4096", "-p", "too short"]), "needs at least");
    let usage = kiln(&["run", "--temp"]);
    assert_eq!(usage.status.code(), Some(2));
}

/// llama.cpp's spellings `-md`, `-ctk`, `-ctv` as written: a q8_0 cache runs, and a draft
/// model (smollm2 for itself) gives the same greedy ids with drafts counted in `timings`.
#[test]
fn run_takes_draft_and_cache_type_flags_as_llama_cpp_spells_them() {
    let case = oracle_case(0);
    let prompt = case["prompt"].as_str().unwrap();
    let base = ["run", "--raw", "--temp", "0", "-n", "24", "-t", "2", "--json", "-p", prompt];
    let plain = json_out(&kiln(&base));
    let model = String::from_utf8(kiln(&["pull", "smollm2-135m"]).stdout).unwrap().trim().to_string();
    let spec = json_out(&kiln(&[&base[..], &["-md", &model, "--draft-p-min", "0"]].concat()));
    assert_eq!(spec["ids"], plain["ids"]);
    assert!(spec["timings"]["draft_tokens"].as_u64().unwrap() > 0);
    assert_eq!(
        spec["timings"]["accepted_tokens"], spec["timings"]["draft_tokens"],
        "a model agrees with itself"
    );
    let lookup = json_out(&kiln(&[&base[..], &["--lookup-ngram", "2"]].concat()));
    assert_eq!(lookup["ids"], plain["ids"]);
    let q8 = json_out(&kiln(&[&base[..], &["-ctk", "q8_0", "-ctv", "q8_0"]].concat()));
    assert_eq!(q8["ids"].as_array().unwrap().len(), 24);
}

/// An unknown cache type is a usage error (exit 2) naming the types; a draft model of
/// another vocabulary exits 1 at load.
#[test]
fn bad_cache_types_and_drafts_are_refused() {
    let out = kiln(&["run", "-ctk", "q3_k", "-p", "x"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "stderr: {err}");
    assert!(err.contains("unknown KV cache type") && err.contains("iq4_nl"), "stderr: {err}");
    let gemma = String::from_utf8(kiln(&["pull", "gemma3-270m"]).stdout).unwrap().trim().to_string();
    fails(&kiln(&["run", "-md", &gemma, "-n", "4", "-p", "x"]), "vocabulary does not match");
}
