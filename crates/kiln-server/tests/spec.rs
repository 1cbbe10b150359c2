//! Speculative decoding in the server (smollm2, when cached): a batch of concurrent
//! requests of every kind — greedy, greedy under a grammar, greedy with logprobs, sampled,
//! streamed — served with a draft model (smollm2 drafting for itself) and with prompt lookup
//! gives the same greedy replies as the same server without speculation; `usage` reports
//! the tokens drafted and accepted, and `/metrics` counts them. Under `KILN_FULL=1` also
//! qwen2.5-coder-0.5b drafting for qwen2.5-coder-1.5b.

mod support;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use kiln::engine::{Engine, EngineOptions};
use kiln::spec::SpecOptions;
use serde_json::{json, Value};
use support::*;

const N_CTX: usize = 1024;
const PARALLEL: usize = 4;

/// Code-editing requests: replies repeat much of the prompt, so drafts get accepted.
const PROMPTS: [&str; 3] = [
    "Add a docstring to this function:\n\ndef area(w, h):\n    return w * h\n",
    "Rename the variable x to count in this code:\n\nx = 0\nfor item in items:\n    if item:\n        x += 1\nprint(x)\n",
    "Rewrite this loop as a list comprehension:\n\nsquares = []\nfor n in range(10):\n    squares.append(n * n)\n",
];

/// The cached file of catalog model `name`, if pulled.
fn cached(name: &str) -> Option<String> {
    let path = kiln::hub::cached_path(kiln::hub::find(name)?);
    if !path.exists() {
        eprintln!("skipping: {name} is not in the cache (kiln pull {name})");
        return None;
    }
    Some(path.to_string_lossy().into_owned())
}

/// The model at `path` served with `spec` (the server's own setup: a KV pool of `PARALLEL` contexts),
/// and the engine, to check its KV pools.
fn server(path: &str, spec: SpecOptions) -> (SocketAddr, Engine) {
    let opts =
        EngineOptions::default().with_n_ctx(N_CTX).with_n_seq(PARALLEL).with_threads(2).with_spec(spec);
    let engine = Engine::load(path, opts).unwrap();
    (serve_engine_stepping(engine.clone(), PARALLEL, N_CTX, 256), engine)
}

/// The KV bookkeeping of the model's pool and the draft model's, after rollbacks.
fn check_kv(engine: &Engine) {
    engine.runner().check_kv().unwrap();
    if let Some(d) = engine.draft_runner() {
        d.check_kv().unwrap();
    }
}

/// The requests of one batch: (body, streamed). Greedy unless said otherwise.
fn requests() -> Vec<(Value, bool)> {
    let chat = |p: &str| json!({"model": "m", "messages": [{"role": "user", "content": p}], "max_tokens": 40, "temperature": 0});
    let mut out = vec![(chat(PROMPTS[0]), false), (chat(PROMPTS[1]), false)];
    // A grammar: decoded one token a step, beside the speculating ones.
    let mut json_mode = chat(PROMPTS[2]);
    json_mode["response_format"] = json!({"type": "json_object"});
    out.push((json_mode, false));
    // Logprobs: decoded one token a step.
    let mut lp = chat(PROMPTS[2]);
    lp["logprobs"] = json!(true);
    lp["top_logprobs"] = json!(2);
    out.push((lp, false));
    // Streamed, with the usage chunk.
    let mut streamed = chat(PROMPTS[2]);
    streamed["stream"] = json!(true);
    streamed["stream_options"] = json!({"include_usage": true});
    out.push((streamed, true));
    // Sampled: speculative sampling (its text differs from run to run of the draft's seed
    // stream, so only its shape is compared).
    let mut sampled = chat(PROMPTS[1]);
    sampled["temperature"] = json!(0.8);
    sampled["seed"] = json!(7);
    out.push((sampled, false));
    out
}

/// The body of an HTTP/1.1 reply, its chunked transfer encoding undone.
fn dechunk(head: &str, body: &str) -> String {
    if !head.to_ascii_lowercase().contains("transfer-encoding: chunked") {
        return body.to_string();
    }
    let mut out = String::new();
    let mut rest = body;
    while let Some((size, after)) = rest.split_once("\r\n") {
        let n = usize::from_str_radix(size.trim(), 16).unwrap();
        if n == 0 {
            break;
        }
        out.push_str(&after[..n]);
        rest = &after[n + 2..];
    }
    out
}

/// A streamed chat completion: (its text, the usage of its last chunk).
fn stream(addr: SocketAddr, body: &Value) -> (String, Value) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
    let body = body.to_string();
    let req = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).unwrap();
    let mut raw = String::new();
    s.read_to_string(&mut raw).unwrap();
    let (head, body) = raw.split_once("\r\n\r\n").unwrap();
    assert!(head.starts_with("HTTP/1.1 200"), "{raw}");
    let (mut text, mut usage) = (String::new(), Value::Null);
    for data in dechunk(head, body).lines().filter_map(|l| l.strip_prefix("data: ")) {
        if data == "[DONE]" {
            continue;
        }
        let v: Value = serde_json::from_str(data).unwrap();
        if let Some(t) = v["choices"][0]["delta"]["content"].as_str() {
            text.push_str(t);
        }
        if !v["usage"].is_null() {
            usage = v["usage"].clone();
        }
    }
    (text, usage)
}

/// Every request of [`requests`] at once: (choice, usage) each, in order (a streamed
/// reply's choice is its text).
fn batch(addr: SocketAddr) -> Vec<(Value, Value)> {
    let handles: Vec<_> = requests()
        .into_iter()
        .map(|(body, streamed)| {
            std::thread::spawn(move || {
                if streamed {
                    let (text, usage) = stream(addr, &body);
                    return (json!(text), usage);
                }
                let (s, v) = post(addr, "/v1/chat/completions", &body.to_string());
                assert_eq!(s, 200, "{v}");
                (v["choices"][0].clone(), v["usage"].clone())
            })
        })
        .collect();
    handles.into_iter().map(|h| h.join().unwrap()).collect()
}

/// Drafted and accepted tokens of a usage object, checked to be there and consistent.
fn drafted(usage: &Value) -> (u64, u64) {
    let (d, a) = (usage["draft_tokens"].as_u64(), usage["accepted_tokens"].as_u64());
    let (Some(d), Some(a)) = (d, a) else { panic!("no draft_tokens/accepted_tokens in {usage}") };
    assert!(a <= d, "{usage}");
    assert!(a <= usage["completion_tokens"].as_u64().unwrap(), "{usage}");
    (d, a)
}

fn check(path: &str, spec: SpecOptions, plain: &[(Value, Value)]) {
    let what = format!("{spec:?}");
    let (addr, engine) = server(path, spec);
    let got = batch(addr);
    check_kv(&engine);
    let sampled = got.len() - 1;
    for (k, ((want, want_usage), (choice, usage))) in plain.iter().zip(&got).enumerate() {
        if k == sampled {
            assert!(choice["message"]["content"].is_string(), "{choice}");
        } else {
            assert_eq!(choice, want, "{what}: request {k} differs from the server without speculation");
            assert_eq!(usage["completion_tokens"], want_usage["completion_tokens"], "{what}: request {k}");
        }
        let (d, a) = drafted(usage);
        // Grammar and logprobs requests decode one token a step.
        if k == 2 || k == 3 {
            assert_eq!((d, a), (0, 0), "{what}: request {k} speculated: {usage}");
        }
    }
    let (d, a): (u64, u64) = got.iter().map(|(_, u)| drafted(u)).fold((0, 0), |s, x| (s.0 + x.0, s.1 + x.1));
    eprintln!("{what}: {a} of {d} drafted tokens accepted");
    assert!(a > 0, "{what}: no drafted token accepted: the comparison checks no speculation");
    assert_eq!(metric(addr, "kiln_draft_tokens_total"), d as f64);
    assert_eq!(metric(addr, "kiln_draft_tokens_accepted_total"), a as f64);
    assert!(metric(addr, "kiln_step_seconds_total{phase=\"draft\"}") > 0.0);
    // Alone again, from the prefix its first run left (rolled back) in the pools.
    let (s, v) = post(addr, "/v1/chat/completions", &requests()[0].0.to_string());
    assert_eq!((s, &v["choices"][0]), (200, &plain[0].0), "{what}: the first request again");
    check_kv(&engine);
}

/// The batch on `path` served plainly, then with each of `specs`.
fn same_as_plain(path: &str, specs: Vec<SpecOptions>) {
    let (plain_addr, _) = server(path, SpecOptions::default());
    let plain = batch(plain_addr);
    for (_, usage) in &plain {
        assert!(usage.get("draft_tokens").is_none(), "a server without speculation reports drafts: {usage}");
    }
    assert_eq!(metric(plain_addr, "kiln_draft_tokens_total"), 0.0);
    for spec in specs {
        check(path, spec, &plain);
    }
}

fn draft_model(path: &str) -> SpecOptions {
    let mut o = SpecOptions::default();
    o.draft_model = Some(path.to_string());
    o
}

#[test]
fn speculative_batch_equals_plain_decoding() {
    let Some(path) = cached("smollm2-135m") else { return };
    let mut lookup = SpecOptions::default();
    lookup.lookup_ngram = Some(2);
    same_as_plain(&path, vec![draft_model(&path), lookup]);
}

/// The slow tier (`KILN_FULL=1`): qwen2.5-coder-0.5b drafting for qwen2.5-coder-1.5b.
#[test]
fn qwen05_drafting_for_qwen15_in_a_batch() {
    if std::env::var("KILN_FULL").map_or(true, |v| v != "1") {
        eprintln!("skipping: slow tier, set KILN_FULL=1");
        return;
    }
    let (Some(target), Some(draft)) = (cached("qwen2.5-coder-1.5b"), cached("qwen2.5-coder-0.5b")) else {
        return;
    };
    same_as_plain(&target, vec![draft_model(&draft)]);
}
