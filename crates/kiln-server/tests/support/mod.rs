//! What the model-backed server tests share: a synthetic preset loaded as an engine, the
//! server on a loopback port, and plain HTTP/1.1 requests to it.

#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::Duration;

use kiln::engine::{Engine, EngineOptions};
use kiln_server::{router, start, App};
use serde_json::Value;

/// The synthetic `preset` (kiln's `model::synth`) written to a temporary file and loaded
/// with `opts`; the file is gone once the engine holds its mapping.
pub fn synth_engine(preset: &str, opts: EngineOptions) -> Engine {
    let dir = std::env::temp_dir().join(format!(
        "kiln-server-{preset}-{}-{:?}",
        std::process::id(),
        std::thread::current().id()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(format!("{preset}.gguf"));
    kiln::model::synth::preset(preset).unwrap().build().unwrap().write_file(&path).unwrap();
    let engine = Engine::load(path.to_string_lossy(), opts).unwrap();
    std::fs::remove_dir_all(&dir).ok();
    engine
}

/// `engine` served as model "m" (`parallel` slots, a queue of 16, contexts of `n_ctx`) on an
/// OS-chosen loopback port from a background runtime.
pub fn serve_engine(engine: Engine, parallel: usize, n_ctx: usize) -> SocketAddr {
    serve_engine_stepping(engine, parallel, n_ctx, 64)
}

/// [`serve_engine`] with at most `step_tokens` tokens a scheduler step.
pub fn serve_engine_stepping(
    engine: Engine,
    parallel: usize,
    n_ctx: usize,
    step_tokens: usize,
) -> SocketAddr {
    let app = Arc::new(App::new("m".into(), None));
    start(&app, engine, parallel, 16, n_ctx, step_tokens).unwrap();
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
pub fn http(addr: SocketAddr, method: &str, path: &str, body: &str) -> (u16, String) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
    let req = format!(
        "{method} {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).unwrap();
    let mut raw = String::new();
    s.read_to_string(&mut raw).unwrap();
    let status = raw[9..12].parse().unwrap();
    (status, raw.split_once("\r\n\r\n").map_or("", |(_, b)| b).to_string())
}

/// (status, JSON body) of a POST of `body`.
pub fn post(addr: SocketAddr, path: &str, body: &str) -> (u16, Value) {
    let (s, b) = http(addr, "POST", path, body);
    (s, serde_json::from_str(&b).unwrap_or_else(|e| panic!("{e}: {b}")))
}

/// The `error` object of an error reply, checked to have OpenAI's shape.
pub fn error_of(body: &Value) -> &Value {
    let e = &body["error"];
    assert!(e["message"].is_string() && e["type"] == "invalid_request_error", "{body}");
    e
}

/// A counter of the server's Prometheus text.
pub fn metric(addr: SocketAddr, name: &str) -> f64 {
    let (_, text) = http(addr, "GET", "/metrics", "");
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {name} in /metrics"))
}
