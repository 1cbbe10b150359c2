//! `kiln serve`'s HTTP layer on raw bytes: each input is written as it is to a new
//! loopback connection of the server's own connection handling (hyper's HTTP/1 parser under
//! the watchdog and the connection cap, the router with its JSON error layer, a scheduler
//! with a tiny random-weight model), the client then closes its write side and reads until
//! the server closes. What comes back must be well-formed HTTP/1.x responses: no 500, every
//! error with a body in OpenAI's JSON shape, bodiless errors only where hyper answers a head
//! that does not parse (400, 414, 431); the server must close within its timeouts and keep
//! answering `/health`. (`server_request` fuzzes the bodies behind a parsed head.)

#![no_main]

use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use kiln::engine::{Engine, EngineOptions};
use kiln::model::synth::SynthSpec;
use kiln_server::{router, serve_connections, start, App, ConnLimits};
use libfuzzer_sys::fuzz_target;

/// A context small enough that any request's generation ends within a few dozen steps.
const N_CTX: usize = 64;
/// The server's timeouts: a request that has not arrived by then is dropped unanswered.
const TIMEOUT: Duration = Duration::from_secs(3);
/// Longer than any answer takes: past it the server is hung.
const HUNG: Duration = Duration::from_secs(30);

fn server() -> SocketAddr {
    static S: OnceLock<(tokio::runtime::Runtime, SocketAddr)> = OnceLock::new();
    S.get_or_init(|| {
        let path = std::env::temp_dir().join(format!("kiln-fuzz-http-{}.gguf", std::process::id()));
        SynthSpec::default().build().expect("tiny model").write_file(&path).expect("write the tiny model");
        let opts = EngineOptions::default().with_n_ctx(N_CTX).with_n_seq(2).with_threads(1);
        let engine = Engine::load(path.to_string_lossy(), opts).expect("load the tiny model");
        let _ = std::fs::remove_file(&path);
        let app = Arc::new(App::new("m".into(), Some("key".into())));
        start(&app, engine, 2, 8, N_CTX, 32).expect("scheduler");
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("runtime");
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = listener.local_addr().expect("address");
        listener.set_nonblocking(true).expect("non-blocking");
        let limits = ConnLimits { header_timeout: TIMEOUT, idle_timeout: TIMEOUT, max_connections: 64 };
        rt.spawn(async move {
            let listener = tokio::net::TcpListener::from_std(listener).expect("listener");
            serve_connections(listener, router(app), limits, std::future::pending()).await
        });
        (rt, addr)
    })
    .1
}

/// Sends `data`, closes the write side, returns all the server sent and whether the
/// connection ended in a reset (the server closed with input unread: the tail of what it
/// sent may be lost).
fn exchange(addr: SocketAddr, data: &[u8]) -> (Vec<u8>, bool) {
    let mut s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(HUNG)).unwrap();
    s.set_write_timeout(Some(HUNG)).unwrap();
    // The server may close before reading everything (after a head it cannot parse).
    let _ = s.write_all(data);
    let _ = s.shutdown(Shutdown::Write);
    let mut out = Vec::new();
    let mut buf = [0u8; 16384];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return (out, false),
            Ok(n) => out.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                panic!("the server neither finished nor closed in {HUNG:?}; so far: {:?}", show(&out))
            }
            Err(_) => return (out, true),
        }
    }
}

fn show(b: &[u8]) -> String {
    String::from_utf8_lossy(&b[..b.len().min(2000)]).into_owned()
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// A chunked body from the start of `b`: its bytes and what follows it, `None` if cut short.
fn chunked(mut b: &[u8]) -> Option<(Vec<u8>, &[u8])> {
    let mut body = Vec::new();
    loop {
        let eol = find(b, b"\r\n")?;
        let size = std::str::from_utf8(&b[..eol]).ok()?.split(';').next()?.trim();
        let size = usize::from_str_radix(size, 16).unwrap_or_else(|_| panic!("a bad chunk size {size:?}"));
        b = &b[eol + 2..];
        if size == 0 {
            let end = find(b, b"\r\n")?; // no trailers: an empty line
            return Some((body, &b[end + 2..]));
        }
        if b.len() < size + 2 {
            return None;
        }
        body.extend_from_slice(&b[..size]);
        assert_eq!(&b[size..size + 2], b"\r\n", "a chunk not followed by CRLF");
        b = &b[size + 2..];
    }
}

/// Checks every response in `out`. `head_only`: a HEAD request may be among them, whose
/// response has no body whatever its headers say, so only the first head is checked.
fn check(out: &[u8], head_only: bool, reset: bool) {
    let mut rest = out;
    while !rest.is_empty() {
        let Some(end) = find(rest, b"\r\n\r\n") else {
            assert!(reset, "a response head cut short: {:?}", show(out));
            return;
        };
        let head = std::str::from_utf8(&rest[..end]).expect("a response head is ASCII");
        rest = &rest[end + 4..];
        let mut lines = head.split("\r\n");
        let status_line = lines.next().unwrap_or("");
        let code: u16 = status_line
            .strip_prefix("HTTP/1.1 ")
            .or_else(|| status_line.strip_prefix("HTTP/1.0 ")) // the answer to an HTTP/1.0 request
            .and_then(|s| s.get(..3))
            .and_then(|c| c.parse().ok())
            .unwrap_or_else(|| panic!("a bad status line {status_line:?}"));
        assert!((100..600).contains(&code), "{status_line}");
        assert_ne!(code, 500, "{:?}", show(out));
        if code < 200 {
            continue; // 100 Continue: the final response follows
        }
        if head_only {
            return;
        }
        let header = |name: &str| {
            lines.clone().find_map(|l| {
                let (n, v) = l.split_once(':')?;
                n.eq_ignore_ascii_case(name).then(|| v.trim().to_string())
            })
        };
        let body: Vec<u8> = if header("transfer-encoding").is_some_and(|v| v.eq_ignore_ascii_case("chunked"))
        {
            match chunked(rest) {
                Some((body, after)) => {
                    rest = after;
                    body
                }
                None => {
                    assert!(reset, "a chunked body cut short: {:?}", show(out));
                    return;
                }
            }
        } else if let Some(n) = header("content-length") {
            let n: usize = n.parse().unwrap_or_else(|_| panic!("a bad content-length {n:?}"));
            if rest.len() < n {
                assert!(reset, "a body cut short: {:?}", show(out));
                return;
            }
            let (body, after) = rest.split_at(n);
            rest = after;
            body.to_vec()
        } else if code == 204 || code == 304 {
            Vec::new()
        } else {
            std::mem::take(&mut rest).to_vec() // delimited by the close
        };
        if code >= 400 {
            if body.is_empty() {
                assert!(matches!(code, 400 | 414 | 431), "a bodiless {code}: {:?}", show(out));
            } else {
                let v: serde_json::Value = serde_json::from_slice(&body).unwrap_or_else(|e| {
                    panic!("{code}: the error body is not JSON ({e}): {:?}", show(&body))
                });
                let e = &v["error"];
                assert!(e["message"].is_string() && e["type"].is_string(), "{code}: {v}");
                assert!(e.get("param").is_some() && e.get("code").is_some(), "{code}: {v}");
            }
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let addr = server();
    let (out, reset) = exchange(addr, data);
    check(&out, find(data, b"HEAD").is_some(), reset);
    // The server still answers.
    let (out, _) = exchange(addr, b"GET /health HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n");
    assert!(out.starts_with(b"HTTP/1.1 200"), "/health after the input: {:?}", show(&out));
});
