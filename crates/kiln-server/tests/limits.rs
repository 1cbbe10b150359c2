//! The server's limits on loopback through its own connection layer, with a tiny
//! random-weight model: timeouts that close slow and idle connections, the connection cap
//! with its share kept for /health, admission of requests that could never fit, and
//! OpenAI's error shape on every error status, including those axum makes.

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

use kiln::engine::{Engine, EngineOptions};
use kiln::model::synth::SynthSpec;
use kiln_server::{router, serve_connections, start, App, ConnLimits};
use serde_json::{json, Value};

const N_CTX: usize = 128;

fn tiny_engine(n_seq: usize) -> Engine {
    let mut w = SynthSpec::default().build().unwrap();
    let template = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}\
        {% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";
    w.set("tokenizer.chat_template", kiln::gguf::Value::String(template.into()));
    let path = std::env::temp_dir().join(format!("kiln-limits-{}-{n_seq}.gguf", std::process::id()));
    w.write_file(&path).unwrap();
    let opts = EngineOptions::default().with_n_ctx(N_CTX).with_n_seq(n_seq).with_threads(1);
    let engine = Engine::load(path.to_string_lossy(), opts).unwrap();
    let _ = std::fs::remove_file(&path);
    engine
}

/// Serves `app` with `limits` on an OS-chosen loopback port from a background runtime.
fn serve(app: Arc<App>, limits: ConnLimits) -> SocketAddr {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
        rt.block_on(async move {
            let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            tx.send(l.local_addr().unwrap()).unwrap();
            serve_connections(l, router(app), limits, std::future::pending()).await;
        });
    });
    rx.recv().unwrap()
}

/// A model-backed server: `parallel` slots, a queue of `queue`.
fn model_server(parallel: usize, queue: usize, max_request_tokens: usize, limits: ConnLimits) -> SocketAddr {
    let app = Arc::new(App::new("m".into(), None).with_max_request_tokens(max_request_tokens));
    start(&app, tiny_engine(parallel), parallel, queue, N_CTX, 64).unwrap();
    serve(app, limits)
}

fn limits(header_ms: u64, idle_ms: u64, max: usize) -> ConnLimits {
    ConnLimits {
        header_timeout: Duration::from_millis(header_ms),
        idle_timeout: Duration::from_millis(idle_ms),
        max_connections: max,
    }
}

fn connect(addr: SocketAddr) -> TcpStream {
    let s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    s
}

/// Everything the server sends until it closes (a reset counts as a close).
fn read_all(s: &mut TcpStream) -> Vec<u8> {
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match s.read(&mut buf) {
            Ok(0) | Err(_) => return out,
            Ok(n) => out.extend_from_slice(&buf[..n]),
        }
    }
}

/// (status, headers, body) of a raw exchange on a new connection that the client closes
/// for writing after `raw`.
fn exchange(addr: SocketAddr, raw: &[u8]) -> (u16, String, String) {
    let mut s = connect(addr);
    s.write_all(raw).unwrap();
    let _ = s.shutdown(Shutdown::Write);
    parse(&read_all(&mut s))
}

/// `exchange` once the server has a place for the connection: at the cap, a connection
/// is closed without a response until the server has seen an earlier one close.
fn exchange_when_placed(addr: SocketAddr, raw: &[u8]) -> (u16, String, String) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let mut s = connect(addr);
        s.write_all(raw).unwrap();
        let _ = s.shutdown(Shutdown::Write);
        let got = read_all(&mut s);
        if !got.is_empty() {
            return parse(&got);
        }
        assert!(Instant::now() < deadline, "no place for a connection");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn parse(raw: &[u8]) -> (u16, String, String) {
    let text = String::from_utf8_lossy(raw).into_owned();
    assert!(text.starts_with("HTTP/1.1 "), "not a response: {text:?}");
    let status = text[9..12].parse().unwrap();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    (status, head.to_ascii_lowercase(), body.to_string())
}

fn request(method: &str, path: &str, body: &str) -> Vec<u8> {
    format!(
        "{method} {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

fn post(addr: SocketAddr, path: &str, body: &Value) -> (u16, Value) {
    let (status, _, body) = exchange(addr, &request("POST", path, &body.to_string()));
    (status, serde_json::from_str(&body).unwrap_or_else(|e| panic!("{e}: {body}")))
}

/// Asserts OpenAI's error shape and returns the error object.
fn api_error(status: u16, head: &str, body: &str) -> Value {
    assert!(head.contains("content-type: application/json"), "{status}: {head}");
    let v: Value = serde_json::from_str(body).unwrap_or_else(|e| panic!("{status}: {e}: {body:?}"));
    let e = &v["error"];
    assert!(e["message"].as_str().is_some_and(|m| !m.is_empty()), "{status}: {v}");
    assert!(e["type"].is_string(), "{status}: {v}");
    let keys: Vec<&String> = e.as_object().unwrap().keys().collect();
    assert_eq!(keys, ["message", "type", "param", "code"], "{status}: {v}");
    e.clone()
}

/// A connection the server has placed and keeps open while it sends nothing (one the
/// server had no place for is closed at once; retried while an earlier connection's
/// place is not yet free).
fn held_connection(addr: SocketAddr) -> TcpStream {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let mut s = connect(addr);
        s.set_read_timeout(Some(Duration::from_millis(200))).unwrap();
        let mut buf = [0u8; 1];
        match s.read(&mut buf) {
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {
                s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
                return s;
            }
            _ => assert!(Instant::now() < deadline, "no place for a connection"),
        }
    }
}

/// Waits for the server to close `s` without a response; returns how long that took.
fn closed_without_response(s: &mut TcpStream) -> Duration {
    let t0 = Instant::now();
    let got = read_all(s);
    assert!(got.is_empty(), "expected no response, got {:?}", String::from_utf8_lossy(&got));
    t0.elapsed()
}

#[test]
fn slow_and_idle_connections_are_closed() {
    let addr = serve(Arc::new(App::new("m".into(), None)), limits(400, 600, 32));
    let within = |d: Duration, lo: u64, hi: u64| {
        assert!(d >= Duration::from_millis(lo) && d < Duration::from_millis(hi), "{d:?} not in {lo}..{hi} ms")
    };

    // A connection that never sends: the head timeout runs from the accept.
    let mut s = connect(addr);
    within(closed_without_response(&mut s), 300, 3000);

    // Slowloris: a byte of the head every 100 ms never finishes in time.
    let mut s = connect(addr);
    let t0 = Instant::now();
    s.write_all(b"GET /health HTTP/1.1\r\nHost: x\r\n").unwrap();
    for b in b"X-Slow: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\r\n\r\n" {
        std::thread::sleep(Duration::from_millis(100));
        if s.write_all(&[*b]).is_err() {
            break;
        }
    }
    closed_without_response(&mut s);
    within(t0.elapsed(), 300, 3000);

    // A body that stops arriving.
    let mut s = connect(addr);
    s.write_all(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"pro").unwrap();
    within(closed_without_response(&mut s), 300, 3000);

    // A kept-alive connection: served, then closed once idle for the idle timeout.
    let mut s = connect(addr);
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    let mut buf = vec![0u8; 65536];
    let n = s.read(&mut buf).unwrap();
    assert!(buf[..n].starts_with(b"HTTP/1.1 200"), "{:?}", String::from_utf8_lossy(&buf[..n]));
    let t0 = Instant::now();
    let rest = read_all(&mut s);
    // The reply may have come in more than one read; nothing else follows it.
    assert!(!String::from_utf8_lossy(&rest).contains("HTTP/1.1"), "{rest:?}");
    within(t0.elapsed(), 450, 3000);

    // A second request before the idle timeout keeps the connection.
    let mut s = connect(addr);
    for _ in 0..3 {
        s.write_all(b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
        let n = s.read(&mut buf).unwrap();
        assert!(buf[..n].starts_with(b"HTTP/1.1 200"), "{:?}", String::from_utf8_lossy(&buf[..n]));
        std::thread::sleep(Duration::from_millis(300));
    }
}

#[test]
fn the_cap_refuses_new_connections_while_health_answers() {
    // 8 connections: 7 for anything, 1 kept for the probes.
    let addr = model_server(1, 4, 1 << 20, limits(30_000, 30_000, 8));
    let mut idle: Vec<TcpStream> = (0..7).map(|_| connect(addr)).collect();
    // The accept loop has taken them all once a probe is served from the reserved share.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (status, head, body) = exchange_when_placed(addr, &request("GET", "/v1/models", ""));
        if status == 503 {
            let e = api_error(status, &head, &body);
            assert_eq!(e["code"], "too_many_connections", "{e}");
            assert!(head.contains("retry-after: 1") && head.contains("connection: close"), "{head}");
            break;
        }
        assert!(Instant::now() < deadline, "the cap never applied");
        std::thread::sleep(Duration::from_millis(20));
    }
    let (status, _, body) = exchange_when_placed(addr, &request("GET", "/health", ""));
    assert_eq!((status, serde_json::from_str::<Value>(&body).unwrap()), (200, json!({"status": "ok"})));
    let (status, _, body) = exchange_when_placed(addr, &request("GET", "/metrics", ""));
    assert_eq!(status, 200, "{body}");

    // With the reserved share held too, the next connection is closed at once.
    let held = held_connection(addr);
    let mut s = connect(addr);
    s.write_all(&request("GET", "/health", "")).unwrap();
    assert!(closed_without_response(&mut s) < Duration::from_secs(5));
    drop(held);

    // A connection that closes frees its place.
    idle.pop();
    let deadline = Instant::now() + Duration::from_secs(10);
    while exchange_when_placed(addr, &request("GET", "/v1/models", "")).0 != 200 {
        assert!(Instant::now() < deadline, "the freed place was not reused");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn requests_that_cannot_fit_are_400_and_change_nothing() {
    let addr = model_server(2, 4, 200, limits(30_000, 30_000, 64));
    let completion = |extra: Value| {
        let mut body = json!({"model": "m", "prompt": "hello there", "max_tokens": 24, "temperature": 0});
        body.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        body
    };
    let (status, alone) = post(addr, "/v1/completions", &completion(json!({})));
    assert_eq!(status, 200, "{alone}");

    // A request beside the ones refused gets the same answer.
    let beside = std::thread::spawn(move || post(addr, "/v1/completions", &completion(json!({}))));
    for (extra, param) in [
        (json!({"n": 5}), "n"),
        (json!({"prompt": ["a", "b", "c"], "n": 2}), "n"),
        (json!({"prompt": ["a", "b", "c", "d", "e"]}), "prompt"),
        // Over the budget of 200 tokens, each prompt within the context.
        (json!({"prompt": vec![vec![7; 70]; 3]}), "prompt"),
        (json!({"prompt": vec![7; 60], "n": 4}), "prompt"),
    ] {
        let (status, v) = post(addr, "/v1/completions", &completion(extra.clone()));
        assert_eq!(status, 400, "{extra}: {v}");
        assert_eq!(
            (v["error"]["code"].as_str(), v["error"]["param"].as_str()),
            (Some("request_too_large"), Some(param))
        );
        let m = v["error"]["message"].as_str().unwrap();
        assert!(m.contains("--queue") || m.contains("--max-request-tokens"), "{m}");
    }
    let long = vec![vec![7; 40]; 6];
    let (status, v) = post(addr, "/v1/embeddings", &json!({"model": "m", "input": long}));
    assert_eq!((status, v["error"]["param"].as_str()), (400, Some("input")), "{v}");
    let (status, v) = post(
        addr,
        "/v1/chat/completions",
        &json!({"model": "m", "n": 9,
        "messages": [{"role": "user", "content": "hi"}]}),
    );
    assert_eq!((status, v["error"]["param"].as_str()), (400, Some("n")), "{v}");

    let (status, v) = beside.join().unwrap();
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["choices"][0]["text"], alone["choices"][0]["text"]);
    // Up to the queue is fine: 2 prompts x n 2 = 4 jobs.
    let (status, v) = post(addr, "/v1/completions", &completion(json!({"prompt": ["a", "b"], "n": 2})));
    assert_eq!((status, v["choices"].as_array().map(Vec::len)), (200, Some(4)), "{v}");
    let (_, _, metrics) = exchange(addr, &request("GET", "/metrics", ""));
    assert!(metrics.contains("kiln_requests_waiting 0"), "{metrics}");
}

#[test]
fn every_error_status_has_openai_shape() {
    let addr = model_server(1, 1, 1 << 20, limits(30_000, 30_000, 64));
    let check = |raw: &[u8], want: u16| {
        let (status, head, body) = exchange(addr, raw);
        assert_eq!(status, want, "{}: {body}", String::from_utf8_lossy(&raw[..raw.len().min(80)]));
        api_error(status, &head, &body)
    };
    // Made by the routes.
    check(&request("POST", "/v1/completions", "{oops"), 400);
    check(&request("POST", "/v1/completions", r#"{"model":"other","prompt":"a"}"#), 404);
    check(&request("GET", "/v1/nope", ""), 404);
    // Made by axum: a path that does not decode, a wrong method, a body over 2 MB, a
    // malformed chunked body.
    let e = check(&request("GET", "/v1/models/%ff", ""), 400);
    assert!(e["message"].as_str().unwrap().contains("ff") || !e["message"].is_null());
    let (status, head, _) = exchange(addr, &request("GET", "/v1/completions", ""));
    assert_eq!(status, 405);
    assert!(head.contains("allow: post"), "{head}");
    let e = check(&request("GET", "/v1/completions", ""), 405);
    assert_eq!(e["code"], "method_not_allowed");
    let big = format!(r#"{{"model":"m","prompt":"{}"}}"#, "a".repeat(3 << 20));
    let e = check(&request("POST", "/v1/completions", &big), 413);
    assert_eq!(e["code"], "request_too_large");
    let chunked = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nabc\r\n0\r\n\r\n";
    check(chunked, 400);
    // Auth.
    let app = Arc::new(App::new("m".into(), Some("key".into())));
    let keyed = serve(app, limits(30_000, 30_000, 64));
    let (status, head, body) = exchange(keyed, &request("GET", "/v1/models", ""));
    assert_eq!(api_error(status, &head, &body)["code"], "invalid_api_key");
    // 503 while loading.
    let raw = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer key\r\nContent-Length: 2\r\n\r\n{}";
    let (status, head, body) = exchange(keyed, raw);
    assert_eq!((status, api_error(status, &head, &body)["code"].clone()), (503, json!("unavailable")));

    // 429: one slot busy with a long embedding request, one waiting in a queue of 1.
    // (About a second each here: 6,400 tokens, one forward per input.)
    let inputs = vec![vec![7; 100]; 64];
    let long = json!({"model": "m", "input": inputs}).to_string();
    // Each waits until the server shows its state (one running, then one waiting) rather
    // than sleeping a guessed time: on a fast machine a request may finish in 100 ms.
    let gauge = |name: &str| {
        let (_, _, metrics) = exchange(addr, &request("GET", "/metrics", ""));
        let line = metrics.lines().find(|l| l.starts_with(name)).unwrap_or_default().to_string();
        line.rsplit(' ').next().and_then(|v| v.parse::<usize>().ok()).unwrap_or(0)
    };
    let until = |name: &str, want: usize| {
        let start = Instant::now();
        while gauge(name) != want {
            assert!(start.elapsed() < Duration::from_secs(30), "{name} never reached {want}");
            std::thread::sleep(Duration::from_millis(2));
        }
    };
    let busy: Vec<_> = ["kiln_requests_running", "kiln_requests_waiting"]
        .into_iter()
        .map(|gauge_name| {
            let long = long.clone();
            let h = std::thread::spawn(move || exchange(addr, &request("POST", "/v1/embeddings", &long)).0);
            until(gauge_name, 1);
            h
        })
        .collect();
    let (status, head, body) =
        exchange(addr, &request("POST", "/v1/embeddings", r#"{"model":"m","input":"a"}"#));
    assert_eq!((status, api_error(status, &head, &body)["code"].clone()), (429, json!("queue_full")));
    assert!(head.contains("retry-after: 1"), "{head}");
    assert_eq!(busy.into_iter().map(|h| h.join().unwrap()).collect::<Vec<_>>(), [200, 200]);

    // Where the head itself does not parse, hyper answers alone, with no body: documented.
    let (status, _, body) = exchange(addr, b"GET / HTTP/1.1\r\nHost: x\r\nbad header\r\n\r\n");
    assert_eq!((status, body.as_str()), (400, ""));
    let huge = format!("GET / HTTP/1.1\r\nHost: x\r\nX-Big: {}\r\n\r\n", "a".repeat(1 << 20));
    let (status, _, _) = exchange(addr, huge.as_bytes());
    assert!(status == 431 || status == 400, "{status}");
}
