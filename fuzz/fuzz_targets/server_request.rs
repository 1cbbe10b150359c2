//! `kiln serve`'s request handling on arbitrary bodies: each input is one request (its
//! first byte picks the route, auth and content type; the rest is the body) sent through
//! the router to a running scheduler with a tiny random-weight model. Every answer must be
//! a well-formed response with a status the server owns (never a 500), and the server must
//! keep serving: no panic in parsing, tokenizing, templating, sampling or streaming.

#![no_main]

use std::sync::{Arc, OnceLock};

use axum::body::{to_bytes, Body};
use axum::http::{header, Request, StatusCode};
use axum::Router;
use kiln::engine::{Engine, EngineOptions};
use kiln::gguf::Value;
use kiln::model::synth::SynthSpec;
use kiln_server::{router, start, App};
use libfuzzer_sys::fuzz_target;
use tower::ServiceExt;

/// A context small enough that any request's generation ends within a few dozen steps.
const N_CTX: usize = 64;

struct Server {
    rt: tokio::runtime::Runtime,
    router: Router,
}

fn server() -> &'static Server {
    static S: OnceLock<Server> = OnceLock::new();
    S.get_or_init(|| {
        let mut w = SynthSpec::default().build().expect("tiny model");
        // A ChatML template with tools, as chat models carry.
        let template = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}\
            {% if m.tool_calls %}{{ m.tool_calls | tojson }}{% endif %}<|im_end|>\n{% endfor %}\
            {% if tools %}{{ tools | tojson }}{% endif %}\
            {% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";
        w.set("tokenizer.chat_template", Value::String(template.into()));
        let path = std::env::temp_dir().join(format!("kiln-fuzz-server-{}.gguf", std::process::id()));
        w.write_file(&path).expect("write the tiny model");
        let opts = EngineOptions::default().with_n_ctx(N_CTX).with_n_seq(2).with_threads(1);
        let engine = Engine::load(path.to_string_lossy(), opts).expect("load the tiny model");
        let _ = std::fs::remove_file(&path);
        let app = Arc::new(App::new("m".into(), Some("key".into())));
        // The scheduler thread runs detached for the life of the process.
        start(&app, engine, 2, 8, N_CTX, 32).expect("scheduler");
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
        Server { rt, router: router(app) }
    })
}

const ROUTES: [(&str, &str); 6] = [
    ("POST", "/v1/chat/completions"),
    ("POST", "/v1/completions"),
    ("POST", "/v1/embeddings"),
    ("GET", "/v1/models/m"),
    ("GET", "/v1/models"),
    ("POST", "/v1/chat/completions/x"),
];

fuzz_target!(|data: &[u8]| {
    let Some((&sel, body)) = data.split_first() else { return };
    let s = server();
    let (method, path) = ROUTES[sel as usize % ROUTES.len()];
    let mut req = Request::builder().method(method).uri(path);
    // Bit 3: no key (401); bit 4: a form body's content type.
    if sel & 8 == 0 {
        req = req.header(header::AUTHORIZATION, "Bearer key");
    }
    let ctype = if sel & 16 == 0 { "application/json" } else { "application/x-www-form-urlencoded" };
    let req = req.header(header::CONTENT_TYPE, ctype).body(Body::from(body.to_vec())).expect("request");
    let (status, bytes) = s.rt.block_on(async {
        let resp = s.router.clone().oneshot(req).await.expect("the router is infallible");
        let status = resp.status();
        let bytes = to_bytes(resp.into_body(), usize::MAX).await.expect("body");
        (status, bytes)
    });
    assert_ne!(status, StatusCode::INTERNAL_SERVER_ERROR, "{}", String::from_utf8_lossy(&bytes));
    if !status.is_success() {
        // Errors are OpenAI's shape: {"error": {"message", "type", ...}}.
        let v: serde_json::Value = serde_json::from_slice(&bytes).expect("an error body is JSON");
        assert!(v["error"]["message"].is_string() && v["error"]["type"].is_string(), "{v}");
    }
});
