//! The server in-process on loopback, spoken to with plain HTTP/1.1: readiness, auth and
//! error shapes without a model; with smollm2 (when cached), greedy batch invariance.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::Duration;

use kiln::engine::{Engine, EngineOptions};
use kiln_server::{router, start, App};
use serde_json::{json, Value};

/// Serves `app` on an OS-chosen loopback port from a background runtime.
fn serve(app: Arc<App>) -> SocketAddr {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
        rt.block_on(async move {
            let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            tx.send(l.local_addr().unwrap()).unwrap();
            axum::serve(l, router(app)).await.unwrap();
        });
    });
    rx.recv().unwrap()
}

/// (status, body) of one request (Connection: close).
fn http(addr: SocketAddr, method: &str, path: &str, headers: &[(&str, &str)], body: &str) -> (u16, String) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
    let mut req = format!(
        "{method} {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    req.push_str(body);
    s.write_all(req.as_bytes()).unwrap();
    let mut raw = String::new();
    s.read_to_string(&mut raw).unwrap();
    let status = raw[9..12].parse().unwrap();
    let body = raw.split_once("\r\n\r\n").map_or("", |(_, b)| b).to_string();
    (status, body)
}

fn error_code(body: &str) -> Value {
    let v: Value = serde_json::from_str(body).unwrap();
    let e = &v["error"];
    assert!(e["message"].is_string() && e["type"].is_string(), "{body}");
    e["code"].clone()
}

#[test]
fn loading_auth_and_unknown_routes() {
    let app = Arc::new(App::new("m".into(), Some("key".into())));
    let addr = serve(app);
    let (s, b) = http(addr, "GET", "/health", &[], "");
    assert_eq!((s, serde_json::from_str::<Value>(&b).unwrap()), (503, json!({"status": "loading"})));
    assert_eq!(http(addr, "GET", "/metrics", &[], "").0, 200);
    let (s, b) = http(addr, "GET", "/v1/models", &[], "");
    assert_eq!((s, error_code(&b)), (401, json!("invalid_api_key")));
    let (s, _) = http(addr, "GET", "/v1/models", &[("Authorization", "Bearer nope")], "");
    assert_eq!(s, 401);
    let (s, b) = http(addr, "GET", "/v1/models", &[("Authorization", "Bearer key")], "");
    assert_eq!(s, 200);
    assert_eq!(serde_json::from_str::<Value>(&b).unwrap()["data"][0]["id"], "m");
    let auth = [("Authorization", "Bearer key")];
    let (s, _) = http(addr, "POST", "/v1/chat/completions", &auth, "{}");
    assert_eq!(s, 503, "generation while loading");
    let (s, b) = http(addr, "GET", "/v1/nope", &[], "");
    assert_eq!((s, error_code(&b)), (404, json!("not_found")));
}

fn smollm2() -> Option<Engine> {
    let e = kiln::hub::find("smollm2-135m")?;
    let path = kiln::hub::cached_path(e);
    if !path.exists() {
        eprintln!("skipping: smollm2-135m is not in the cache (kiln pull smollm2-135m)");
        return None;
    }
    Some(
        Engine::load(path.to_string_lossy(), EngineOptions::default().with_n_ctx(256).with_n_seq(4)).unwrap(),
    )
}

fn complete(addr: SocketAddr, prompt: &str) -> String {
    let body = json!({"model": "m", "prompt": prompt, "max_tokens": 12, "temperature": 0}).to_string();
    let (s, b) = http(addr, "POST", "/v1/completions", &[], &body);
    assert_eq!(s, 200, "{b}");
    let v: Value = serde_json::from_str(&b).unwrap();
    v["choices"][0]["text"].as_str().unwrap().to_string()
}

#[test]
fn greedy_batched_equals_alone() {
    let Some(engine) = smollm2() else { return };
    let app = Arc::new(App::new("m".into(), None));
    // A small step budget: the long prompt is prefilled in chunks beside the decodes.
    start(&app, engine, 4, 8, 256, 24).unwrap();
    let addr = serve(app);
    // The long one is prefilled in chunks while the others decode in the same forwards.
    let long: &'static str = "The history of the printing press begins with movable type. ".repeat(12).leak();
    let prompts: [&'static str; 5] =
        ["The capital of France is", "def add(a, b):", long, "Water boils at", "Once upon a time"];
    let alone: Vec<String> = prompts.iter().map(|p| complete(addr, p)).collect();
    let handles: Vec<_> =
        prompts.into_iter().map(|p| std::thread::spawn(move || complete(addr, p))).collect();
    let batched: Vec<String> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    assert_eq!(batched, alone);
    // Errors leave the server serving.
    let huge = "hello ".repeat(400);
    let (s, b) =
        http(addr, "POST", "/v1/completions", &[], &json!({"model": "m", "prompt": huge}).to_string());
    assert_eq!((s, error_code(&b)), (400, json!("context_length_exceeded")));
    let (s, b) =
        http(addr, "POST", "/v1/completions", &[], &json!({"model": "x", "prompt": "a"}).to_string());
    assert_eq!((s, error_code(&b)), (404, json!("model_not_found")));
    let (s, _) = http(addr, "POST", "/v1/completions", &[], "{oops");
    assert_eq!(s, 400);
    assert_eq!(complete(addr, prompts[0]), alone[0]);
}

/// Tools need a chat template: on a model without one, a 400 naming `tools`, and the
/// server goes on.
#[test]
fn tools_without_a_chat_template() {
    let Some(e) = kiln::hub::find("tiny-random-llama") else { return };
    let path = kiln::hub::cached_path(e);
    if !path.exists() {
        eprintln!("skipping: tiny-random-llama is not in the cache");
        return;
    }
    let engine = Engine::load(path.to_string_lossy(), EngineOptions::default().with_n_ctx(128)).unwrap();
    assert!(engine.chat_template().is_none());
    let app = Arc::new(App::new("m".into(), None));
    start(&app, engine, 2, 4, 128, 64).unwrap();
    let addr = serve(app);
    let tool = json!({"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}});
    let body = json!({"model": "m", "messages": [{"role": "user", "content": "hi"}], "tools": [tool]});
    let (s, b) = http(addr, "POST", "/v1/chat/completions", &[], &body.to_string());
    assert_eq!(s, 400, "{b}");
    let v: Value = serde_json::from_str(&b).unwrap();
    assert_eq!(v["error"]["param"], "tools", "{b}");
    assert!(v["error"]["message"].as_str().unwrap().contains("chat template"), "{b}");
    let body =
        json!({"model": "m", "prompt": "a", "max_tokens": 2, "response_format": {"type": "json_object"}});
    let (s, b) = http(addr, "POST", "/v1/completions", &[], &body.to_string());
    assert_eq!(s, 200, "{b}");
}
