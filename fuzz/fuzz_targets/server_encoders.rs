//! `/v1/rerank` and `/v1/embeddings` on encoders, with arbitrary bodies: each input is one
//! request (its first byte picks the model — the tiny synthetic reranker `bert-rerank-tiny`
//! or the plain encoder `bert-tiny` — and the route; the rest is the body) through the
//! router to a running scheduler. Every answer is a success of the route's shape (rerank:
//! distinct in-range indices, best first, at most `top_n`) or an OpenAI-shaped error with a
//! status the server owns (never a 500), and the servers keep serving: no panic in parsing
//! the body, building the pair inputs (WordPiece on arbitrary text), pooling or ranking.

#![no_main]

use std::sync::{Arc, OnceLock};

use axum::body::{to_bytes, Body};
use axum::http::{header, Request, StatusCode};
use axum::Router;
use kiln::engine::{Engine, EngineOptions};
use kiln::model::synth;
use kiln_server::{router, start, App};
use libfuzzer_sys::fuzz_target;
use serde_json::Value;
use tower::ServiceExt;

/// A context that long inputs exceed quickly.
const N_CTX: usize = 64;

struct Servers {
    rt: tokio::runtime::Runtime,
    /// bert-rerank-tiny, bert-tiny.
    routers: [Router; 2],
}

fn server(preset: &str) -> Router {
    let path = std::env::temp_dir().join(format!("kiln-fuzz-{preset}-{}.gguf", std::process::id()));
    synth::preset(preset).expect("preset").build().expect("build").write_file(&path).expect("write");
    let opts = EngineOptions::default().with_n_ctx(N_CTX).with_n_seq(2).with_threads(1);
    let engine = Engine::load(path.to_string_lossy(), opts).expect("load");
    let _ = std::fs::remove_file(&path);
    let app = Arc::new(App::new("m".into(), None));
    // The scheduler thread runs detached for the life of the process.
    start(&app, engine, 2, 8, N_CTX, 32).expect("scheduler");
    router(app)
}

fn servers() -> &'static Servers {
    static S: OnceLock<Servers> = OnceLock::new();
    S.get_or_init(|| {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
        Servers { rt, routers: [server("bert-rerank-tiny"), server("bert-tiny")] }
    })
}

fuzz_target!(|data: &[u8]| {
    let Some((&sel, body)) = data.split_first() else { return };
    let s = servers();
    let path = if sel & 2 == 0 { "/v1/rerank" } else { "/v1/embeddings" };
    let req = Request::builder()
        .method("POST")
        .uri(path)
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(body.to_vec()))
        .expect("request");
    let router = s.routers[(sel & 1) as usize].clone();
    let (status, bytes) = s.rt.block_on(async {
        let resp = router.oneshot(req).await.expect("the router is infallible");
        let status = resp.status();
        (status, to_bytes(resp.into_body(), usize::MAX).await.expect("body"))
    });
    assert_ne!(status, StatusCode::INTERNAL_SERVER_ERROR, "{}", String::from_utf8_lossy(&bytes));
    let v: Value = serde_json::from_slice(&bytes).expect("every answer is JSON");
    if !status.is_success() {
        assert!(v["error"]["message"].is_string() && v["error"]["type"].is_string(), "{v}");
        return;
    }
    if path == "/v1/rerank" {
        let req: Value = serde_json::from_slice(body).expect("a served body is JSON");
        let n_docs = req["documents"].as_array().expect("documents").len();
        let results = v["results"].as_array().expect("results");
        let top_n = req["top_n"].as_u64().map_or(n_docs, |n| (n as usize).min(n_docs));
        assert_eq!(results.len(), top_n, "{v}");
        let mut seen = vec![false; n_docs];
        let mut prev = f64::INFINITY;
        for r in results {
            let i = r["index"].as_u64().expect("index") as usize;
            assert!(i < n_docs && !std::mem::replace(&mut seen[i], true), "{v}");
            // NaN scores would print as null: the head's outputs are finite.
            let score = r["relevance_score"].as_f64().expect("a finite score");
            assert!(score <= prev, "best first: {v}");
            prev = score;
        }
    } else {
        assert!(v["data"].as_array().is_some_and(|d| !d.is_empty()), "{v}");
    }
});
