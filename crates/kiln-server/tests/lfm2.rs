//! LFM2 through the server (synthetic `lfm2-tiny`, the prompt of tests/fixtures/synth/
//! lfm2-tiny.json): its convolution state rides with each sequence, so greedy completions
//! equal one uninterrupted library run when the scheduler batches them with other
//! requests, and when a conversation's next request resumes from a cached prefix — its
//! own idle sequence, or whole blocks from the prefix cache after another request took the
//! slot.

mod support;

use std::net::SocketAddr;
use std::ops::ControlFlow;
use std::path::PathBuf;

use kiln::engine::{Engine, EngineOptions};
use kiln::sample::SamplerParams;
use kiln::{GenerateOptions, SessionOptions};
use serde_json::{json, Value};
use support::*;

const N_CTX: usize = 256;
const N_GEN: usize = 24;

fn prompt() -> Vec<u32> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/synth/lfm2-tiny.json");
    let fx: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    fx["prompt_ids"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as u32).collect()
}

fn engine(n_seq: usize, prefix_cache: bool) -> Engine {
    let mut opts = EngineOptions::default().with_n_ctx(N_CTX).with_n_seq(n_seq).with_threads(2);
    if !prefix_cache {
        opts = opts.with_prefix_cache_tokens(0);
    }
    synth_engine("lfm2-tiny", opts)
}

/// One uninterrupted run: a fresh session (no prefix cache), `prompt`, greedy steps.
/// (generated ids, text)
fn library_run(e: &Engine, prompt: &[u32]) -> (Vec<u32>, String) {
    let mut s = e.session(SessionOptions::default()).unwrap();
    s.append_tokens(prompt).unwrap();
    let opts = GenerateOptions::default()
        .with_sampler(SamplerParams::greedy())
        .with_max_tokens(N_GEN)
        .with_ignore_eos(true);
    let sum = s.generate(&opts, |_| ControlFlow::Continue(())).unwrap();
    assert_eq!(sum.ids.len(), N_GEN);
    (sum.ids, sum.text)
}

/// The server's greedy completion of `prompt` (token ids).
fn complete(addr: SocketAddr, prompt: &[u32]) -> String {
    let body =
        json!({"model": "m", "prompt": prompt, "max_tokens": N_GEN, "temperature": 0, "ignore_eos": true});
    let (s, v) = post(addr, "/v1/completions", &body.to_string());
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["usage"]["completion_tokens"], N_GEN, "{v}");
    v["choices"][0]["text"].as_str().unwrap().to_string()
}

#[test]
fn greedy_batched_equals_one_uninterrupted_run() {
    let p = prompt();
    let prompts: Vec<Vec<u32>> = vec![p.clone(), p[3..].to_vec(), p[..20].to_vec(), p[..45].to_vec()];
    let lib = engine(1, false);
    let want: Vec<String> = prompts.iter().map(|q| library_run(&lib, q).1).collect();
    assert!(want.iter().all(|t| !t.is_empty()));
    let addr = serve_engine(engine(4, true), 4, N_CTX);
    let alone: Vec<String> = prompts.iter().map(|q| complete(addr, q)).collect();
    assert_eq!(alone, want, "alone");
    // All at once (each twice): prompts are prefilled beside the others' decode steps.
    let handles: Vec<_> = prompts
        .iter()
        .chain(&prompts)
        .cloned()
        .map(|q| std::thread::spawn(move || complete(addr, &q)))
        .collect();
    let batched: Vec<String> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    assert_eq!(batched[..4], want[..], "batched");
    assert_eq!(batched[4..], want[..], "batched, second of each");
}

#[test]
fn a_conversation_resumes_through_cached_prefixes() {
    let p = prompt();
    let lib = engine(1, false);
    let (first, first_text) = library_run(&lib, &p);
    // The next request of the conversation: the first prompt, its reply, a new turn.
    let mut next = p.clone();
    next.extend(&first);
    next.extend(&p[..10]);
    let (_, want) = library_run(&lib, &next);
    let other: Vec<u32> = p.iter().rev().take(12).copied().collect();
    let (_, want_other) = library_run(&lib, &other);

    // One slot: the conversation's sequence stays idle in it between requests.
    let addr = serve_engine(engine(1, true), 1, N_CTX);
    assert_eq!(complete(addr, &p), first_text);
    let cached = metric(addr, "kiln_prompt_tokens_cached_total");
    assert_eq!(complete(addr, &next), want, "resumed on its own idle sequence");
    let reused = metric(addr, "kiln_prompt_tokens_cached_total") - cached;
    assert!(reused >= 32.0, "reused {reused} tokens");

    // Another request takes the slot between the two: the conversation's whole blocks
    // come back from the prefix cache, with the convolution state at the last of them.
    let addr = serve_engine(engine(1, true), 1, N_CTX);
    assert_eq!(complete(addr, &p), first_text);
    assert_eq!(complete(addr, &other), want_other);
    let cached = metric(addr, "kiln_prompt_tokens_cached_total");
    assert_eq!(complete(addr, &next), want, "resumed from the prefix cache");
    let reused = metric(addr, "kiln_prompt_tokens_cached_total") - cached;
    assert!(reused >= 32.0 && reused % 32.0 == 0.0, "reused {reused} tokens: whole blocks");
}
