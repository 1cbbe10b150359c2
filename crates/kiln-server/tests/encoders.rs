//! Encoders and rerankers through the server (synthetic presets, tests/fixtures/synth/
//! encoders.json from llama.cpp's `llama-embedding`): `/v1/embeddings` of bert and
//! nomic-bert gives the library's vectors (what `kiln embed` prints) alone and with other
//! requests in flight; `/v1/rerank` gives the library's scores, which are llama.cpp's; and
//! every bad request is a 400 in OpenAI's error shape naming why — a malformed body, empty
//! documents, a model without a rank head, an input past the context — after which the
//! server goes on serving.

mod support;

use std::net::SocketAddr;
use std::path::PathBuf;

use kiln::embed::{embed_batch, normalize, rerank_input, Pooling};
use kiln::engine::{Engine, EngineOptions};
use serde_json::{json, Value};
use support::*;

const N_CTX: usize = 32;

fn fixture() -> Value {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/synth/encoders.json");
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn engine(preset: &str) -> Engine {
    synth_engine(preset, EngineOptions::default().with_n_ctx(N_CTX).with_n_seq(2).with_threads(2))
}

fn floats(v: &Value) -> Vec<f32> {
    v.as_array().unwrap().iter().map(|x| x.as_f64().unwrap() as f32).collect()
}

/// The server's unit vectors of `texts`.
fn embeddings(addr: SocketAddr, texts: &[&str]) -> Vec<Vec<f32>> {
    let (s, v) = post(addr, "/v1/embeddings", &json!({"model": "m", "input": texts}).to_string());
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["object"], "list");
    let data = v["data"].as_array().unwrap();
    assert_eq!(data.len(), texts.len());
    data.iter()
        .enumerate()
        .map(|(i, d)| {
            assert_eq!(d["index"], i);
            floats(&d["embedding"])
        })
        .collect()
}

/// The library's vectors of `texts`, normalized as the server's (and `kiln embed
/// --normalize`'s) are.
fn library_embeddings(e: &Engine, texts: &[&str]) -> Vec<Vec<f32>> {
    let ids: Vec<Vec<u32>> = texts.iter().map(|t| e.tokenizer().encode(t, true, true).unwrap()).collect();
    let refs: Vec<&[u32]> = ids.iter().map(Vec::as_slice).collect();
    embed_batch(e, &refs, Pooling::of(e))
        .unwrap()
        .into_iter()
        .map(|mut rows| {
            normalize(&mut rows[0]);
            rows.swap_remove(0)
        })
        .collect()
}

/// Asserts a 400 with the error shape, `param` (where given) and a message containing `why`.
fn assert_400(addr: SocketAddr, path: &str, body: &str, param: Option<&str>, why: &str) {
    let (s, v) = http(addr, "POST", path, body);
    let v: Value = serde_json::from_str(&v).unwrap_or_else(|e| panic!("{e}: {v}"));
    assert_eq!(s, 400, "{body}: {v}");
    let e = error_of(&v);
    if let Some(p) = param {
        assert_eq!(e["param"], p, "{body}: {v}");
    }
    let msg = e["message"].as_str().unwrap();
    assert!(msg.contains(why), "{body}: {msg:?} does not say {why:?}");
}

#[test]
fn embeddings_equal_the_library_alone_and_batched() {
    let fx = fixture();
    let texts = [fx["text"].as_str().unwrap(), "the lazy dog", "again and again, the quick brown fox", "fox"];
    for preset in ["bert-tiny", "nomic-bert-tiny"] {
        let want = library_embeddings(&engine(preset), &texts);
        let addr = serve_engine(engine(preset), 2, N_CTX);
        assert_eq!(embeddings(addr, &texts), want, "{preset}: one request");
        // One request per text (each text twice), all at once: the scheduler runs them in
        // shared forwards.
        let handles: Vec<_> = texts
            .iter()
            .map(|&t| {
                let t = t.to_string();
                std::thread::spawn(move || embeddings(addr, &[&t, &t]).swap_remove(1))
            })
            .collect();
        let got: Vec<Vec<f32>> = handles.into_iter().map(|h| h.join().unwrap()).collect();
        assert_eq!(got, want, "{preset}: concurrent requests");
        // The first text's vector is llama.cpp's (the file's pooling, normalized).
        let mut oracle = floats(&fx["embeddings"][preset]);
        normalize(&mut oracle);
        let err = got[0].iter().zip(&oracle).map(|(a, b)| (a - b).abs()).fold(0.0, f32::max);
        assert!(err < 1e-3, "{preset}: max abs {err} against llama-embedding");
    }
}

#[test]
fn encoder_errors_are_400s_naming_why() {
    let addr = serve_engine(engine("bert-tiny"), 2, N_CTX);
    let long = "the quick brown fox ".repeat(N_CTX);
    assert_400(
        addr,
        "/v1/embeddings",
        &json!({"model": "m", "input": ["fox", long]}).to_string(),
        Some("input"),
        &format!("the context is {N_CTX}"),
    );
    let (_, v) = post(addr, "/v1/embeddings", &json!({"model": "m", "input": long}).to_string());
    assert_eq!(error_of(&v)["code"], "context_length_exceeded");
    // A model without a rank head cannot rerank, whatever the body.
    let rerank = json!({"model": "m", "query": "fox", "documents": ["the fox"]}).to_string();
    assert_400(addr, "/v1/rerank", &rerank, None, "no classification head");
    // Still serving.
    assert_eq!(embeddings(addr, &["fox"]).len(), 1);
}

#[test]
fn rerank_scores_equal_llama_cpp_and_bad_requests_are_400s() {
    let fx = &fixture()["rerank"];
    let preset = fx["preset"].as_str().unwrap();
    let query = fx["query"].as_str().unwrap();
    let docs: Vec<&str> = fx["documents"].as_array().unwrap().iter().map(|d| d.as_str().unwrap()).collect();
    let e = engine(preset);
    let inputs: Vec<Vec<u32>> = docs.iter().map(|d| rerank_input(&e, query, d).unwrap()).collect();
    let refs: Vec<&[u32]> = inputs.iter().map(Vec::as_slice).collect();
    let library: Vec<f32> = embed_batch(&e, &refs, Pooling::Rank).unwrap().iter().map(|r| r[0][0]).collect();
    let oracle = floats(&fx["scores"]);
    let addr = serve_engine(e, 2, N_CTX);

    let body = json!({"model": "m", "query": query, "documents": docs, "top_n": 2}).to_string();
    let (s, v) = post(addr, "/v1/rerank", &body);
    assert_eq!(s, 200, "{v}");
    let results = v["results"].as_array().unwrap();
    assert_eq!(results.len(), 2, "top_n");
    let mut prev = f32::INFINITY;
    for r in results {
        let i = r["index"].as_u64().unwrap() as usize;
        let score = r["relevance_score"].as_f64().unwrap() as f32;
        assert_eq!(score, library[i], "document {i}: the library's score");
        assert!((score - oracle[i]).abs() < 1e-3, "document {i}: {score} vs llama.cpp {}", oracle[i]);
        assert!(score <= prev, "sorted best first");
        prev = score;
    }
    assert!(v["usage"]["prompt_tokens"].as_u64().unwrap() > 0);

    let bad: [(&str, Option<&str>, &str); 10] = [
        ("{oops", None, ""),
        ("[]", None, ""),
        (r#"{"model": "m", "documents": ["a"]}"#, Some("query"), "'query' is required"),
        (r#"{"model": "m", "query": 5, "documents": ["a"]}"#, Some("query"), "must be a string"),
        (r#"{"model": "m", "query": "q"}"#, Some("documents"), "non-empty array of strings"),
        (r#"{"model": "m", "query": "q", "documents": []}"#, Some("documents"), "non-empty array of strings"),
        (
            r#"{"model": "m", "query": "q", "documents": "a"}"#,
            Some("documents"),
            "non-empty array of strings",
        ),
        (
            r#"{"model": "m", "query": "q", "documents": ["a", 3]}"#,
            Some("documents"),
            "non-empty array of strings",
        ),
        (
            r#"{"model": "m", "query": "q", "documents": ["a"], "top_n": -1}"#,
            Some("top_n"),
            "non-negative integer",
        ),
        (
            r#"{"model": "m", "query": "q", "documents": ["a"], "return_text": true}"#,
            Some("return_text"),
            "not supported",
        ),
    ];
    for (body, param, why) in bad {
        assert_400(addr, "/v1/rerank", body, param, why);
    }
    let long = "the quick brown fox ".repeat(N_CTX);
    let body = json!({"model": "m", "query": query, "documents": ["fox", long]}).to_string();
    assert_400(addr, "/v1/rerank", &body, Some("documents"), &format!("the context is {N_CTX}"));
    let (_, v) = post(addr, "/v1/rerank", &body);
    assert_eq!(error_of(&v)["code"], "context_length_exceeded");
    // A reranker has no embeddings.
    assert_400(addr, "/v1/embeddings", r#"{"model": "m", "input": "fox"}"#, None, "reranker");
    // Still serving, with the same scores.
    let (s, v) =
        post(addr, "/v1/rerank", &json!({"model": "m", "query": query, "documents": [docs[1]]}).to_string());
    assert_eq!(s, 200);
    assert_eq!(v["results"][0]["relevance_score"].as_f64().unwrap() as f32, library[1]);
}
