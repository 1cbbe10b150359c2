//! The session API: streaming events with logprobs, cancellation from another thread,
//! sessions generating concurrently on one engine, `Send`, errors.

mod support;

use std::ops::ControlFlow;
use std::time::{Duration, Instant};

use kiln::sample::SamplerParams;
use kiln::{Engine, EngineOptions, FinishReason, GenerateOptions, Message, Session, SessionOptions};
use support::*;

fn engine(n_ctx: usize, n_seq: usize) -> Engine {
    let opts = EngineOptions::default().with_n_ctx(n_ctx).with_n_seq(n_seq).with_threads(2);
    Engine::load(model(SMOLLM2.name).to_str().unwrap(), opts).unwrap()
}

fn greedy(n: usize) -> GenerateOptions {
    GenerateOptions::default().with_sampler(SamplerParams::greedy()).with_max_tokens(n)
}

#[test]
fn sessions_are_send_and_sync() {
    fn check<T: Send + Sync + 'static>() {}
    check::<Session>();
    check::<Engine>();
    check::<kiln::CancelHandle>();
}

#[test]
fn streamed_pieces_make_the_text_and_logprobs_are_the_models() {
    let e = engine(512, 1);
    let mut s = e.session(SessionOptions::default()).unwrap();
    s.append_chat(&[Message::user("Write a word with an accent, like café.")]).unwrap();
    let logits = s.logits().unwrap().to_vec();
    let mut pieces = String::new();
    let mut first = None;
    let sum = s
        .generate(&greedy(12).with_logprobs(3), |ev| {
            pieces.push_str(ev.text);
            if first.is_none() {
                first = Some((ev.token, ev.logprob.unwrap(), ev.top_logprobs.to_vec()));
            }
            ControlFlow::Continue(())
        })
        .unwrap();
    assert_eq!(pieces, sum.text);
    assert_eq!(sum.timings.gen_n, sum.ids.len());
    let (tok, lp, top) = first.unwrap();
    assert_eq!(tok, argmax(&logits));
    assert_eq!(top.len(), 3);
    assert_eq!(top[0].0, tok);
    assert!((top[0].1 - lp).abs() < 1e-6 && lp <= 0.0 && top[1].1 <= top[0].1);
    let total: f64 = logits.iter().map(|&l| ((l - logits[tok as usize] + lp) as f64).exp()).sum();
    assert!((total - 1.0).abs() < 1e-3, "probabilities sum to {total}");
}

#[test]
fn cancel_from_another_thread_stops_decode_quickly() {
    let e = engine(2048, 1);
    let mut s = e.session(SessionOptions::default()).unwrap();
    s.append_text("Once upon a time").unwrap();
    let h = s.cancel_handle();
    let (tx, rx) = std::sync::mpsc::channel::<Instant>();
    let t = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(300));
        h.cancel();
        tx.send(Instant::now()).unwrap();
    });
    let opts = GenerateOptions::default().with_sampler(SamplerParams::greedy()).with_ignore_eos(true);
    let sum = s.generate(&opts, |_| ControlFlow::Continue(())).unwrap();
    let stopped = Instant::now();
    t.join().unwrap();
    let asked = rx.recv().unwrap();
    assert_eq!(sum.finish_reason, FinishReason::Cancelled);
    let lag = stopped.duration_since(asked);
    eprintln!("cancel lag {lag:?} after {} tokens", sum.ids.len());
    assert!(lag < Duration::from_millis(250), "cancel took {lag:?}");
    // The request was consumed: the next call runs.
    let again = s.generate(&greedy(2), |_| ControlFlow::Continue(())).unwrap();
    assert_eq!(again.finish_reason, FinishReason::Length);
}

#[test]
fn cancel_during_prefill_stops_within_one_ubatch() {
    let opts = EngineOptions::default().with_n_ctx(1024).with_batch(32).with_threads(2);
    let e = Engine::load(model(SMOLLM2.name).to_str().unwrap(), opts).unwrap();
    let mut s = e.session(SessionOptions::default()).unwrap();
    let h = s.cancel_handle();
    let t = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(200));
        h.cancel();
    });
    let ids: Vec<u32> = (0..700u32).map(|i| 100 + i % 5000).collect();
    s.append_tokens(&ids).unwrap();
    t.join().unwrap();
    assert!(s.n_evaluated() < ids.len(), "prefill finished before the cancel ({} tokens)", s.n_evaluated());
    assert_eq!(s.n_evaluated() % 32, 0);
    let sum = s.generate(&greedy(4), |_| ControlFlow::Continue(())).unwrap();
    assert_eq!(sum.finish_reason, FinishReason::Cancelled);
    assert!(sum.ids.is_empty());
    // Resuming evaluates only the rest.
    let before = s.n_evaluated();
    let sum = s.generate(&greedy(1), |_| ControlFlow::Continue(())).unwrap();
    assert_eq!(sum.finish_reason, FinishReason::Length);
    assert_eq!(s.n_evaluated() - before, ids.len() - before);
}

#[test]
fn two_sessions_on_two_threads_both_progress() {
    let e = engine(512, 2);
    let prompts = ["The sea is", "My favourite food is"];
    // Alone, one after the other.
    let alone: Vec<Vec<u32>> = prompts
        .iter()
        .map(|p| {
            let mut s = e.session(SessionOptions::default()).unwrap();
            s.append_text(p).unwrap();
            s.generate(&greedy(16), |_| ControlFlow::Continue(())).unwrap().ids
        })
        .collect();
    // Together. At its first token each session tells the other it has started and
    // waits (bounded) to hear the same back: if sessions were serialized, the first one
    // would wait inside its generate for a session that cannot start, and time out.
    let (to_b, from_a) = std::sync::mpsc::channel::<()>();
    let (to_a, from_b) = std::sync::mpsc::channel::<()>();
    let peers = [(to_b, from_b), (to_a, from_a)];
    let handles: Vec<_> = prompts
        .iter()
        .zip(peers)
        .map(|(p, (tell, hear))| {
            let e = e.clone();
            let p = p.to_string();
            std::thread::spawn(move || {
                let mut s = e.session(SessionOptions::default()).unwrap();
                s.append_text(&p).unwrap();
                let mut met = None;
                let ids = s
                    .generate(&greedy(16), |_| {
                        if met.is_none() {
                            let _ = tell.send(());
                            met = Some(hear.recv_timeout(Duration::from_secs(60)).is_ok());
                        }
                        ControlFlow::Continue(())
                    })
                    .unwrap()
                    .ids;
                (ids, met == Some(true))
            })
        })
        .collect();
    let results: Vec<_> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    for (i, (ids, met)) in results.iter().enumerate() {
        assert!(met, "session {i} waited for the other session to finish before it could start");
        assert_eq!(ids, &alone[i], "session {i} changed its greedy tokens when run concurrently");
    }
}

#[test]
fn bad_input_is_an_error() {
    let e = engine(64, 1);
    let mut s = e.session(SessionOptions::default()).unwrap();
    assert!(s.append_tokens(&[u32::MAX]).is_err());
    let long: Vec<u32> = (0..65).map(|i| 100 + i).collect();
    let err = s.append_tokens(&long).unwrap_err().to_string();
    assert!(err.contains("more than the context"), "{err}");
    assert!(s.tokens().is_empty(), "a failed append must change nothing");
    assert!(s.generate(&greedy(1), |_| ControlFlow::Continue(())).is_err());
}
