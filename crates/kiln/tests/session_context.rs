//! Context limits and persistence: reaching n_ctx stops with context_full or shifts the
//! context; a saved session restores with the same greedy continuation, and refuses
//! another model.

mod support;

use std::ops::ControlFlow;

use kiln::engine::Device;
use kiln::model::{synth, Entry, OutputKind};
use kiln::sample::SamplerParams;
use kiln::{Engine, EngineOptions, FinishReason, GenerateOptions, Message, SessionOptions};
use support::*;

fn engine(name: &str, n_ctx: usize) -> Engine {
    let opts = EngineOptions::default().with_n_ctx(n_ctx).with_threads(2);
    Engine::load(model(name).to_str().unwrap(), opts).unwrap()
}

fn greedy(n: usize) -> GenerateOptions {
    GenerateOptions::default().with_sampler(SamplerParams::greedy()).with_max_tokens(n).with_ignore_eos(true)
}

fn tmp(name: &str) -> std::path::PathBuf {
    std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(name)
}

#[test]
fn reaching_n_ctx_stops_with_context_full() {
    let e = engine(SMOLLM2.name, 64);
    let mut s = e.session(SessionOptions::default()).unwrap();
    let p = s.append_text("The history of the Roman empire").unwrap();
    let sum = s.generate(&greedy(1000), |_| ControlFlow::Continue(())).unwrap();
    assert_eq!(sum.finish_reason, FinishReason::ContextFull);
    assert_eq!(p.len() + sum.ids.len(), 64);
}

#[test]
fn context_shift_keeps_n_keep_tokens_and_goes_on() {
    let e = engine(SMOLLM2.name, 64);
    let mut s = e.session(SessionOptions::default().with_context_shift(4)).unwrap();
    let p = s.append_text("The history of the Roman empire").unwrap();
    let sum = s.generate(&greedy(150), |_| ControlFlow::Continue(())).unwrap();
    assert_eq!(sum.finish_reason, FinishReason::Length);
    assert_eq!(sum.ids.len(), 150);
    let t = s.tokens();
    assert!(t.len() <= 64);
    assert_eq!(&t[..4], &p[..4], "the first n_keep tokens survive every shift");
    assert_eq!(&t[t.len() - 10..], &sum.ids[140..], "the newest tokens are kept");
    // Shifted keys are rotated in place, not recomputed.
    assert_eq!(s.n_evaluated(), p.len() + sum.ids.len() - 1);
}

/// The cached keys are re-rotated as llama.cpp does, so a greedy run through two shifts
/// gives llama-completion's `--context-shift --keep 4` text (fixture made by
/// scripts/gen-shift-fixture.sh).
#[test]
fn context_shift_matches_llama_cpp() {
    let fx = fixture_json("shift/smollm2.json");
    let n_ctx = fx["n_ctx"].as_u64().unwrap() as usize;
    let e = engine(SMOLLM2.name, n_ctx);
    shifted_completion_matches(&e, &fx);
}

/// smollm3's layers without RoPE (the 4th of smollm3-tiny's 4) keep their keys as they are
/// through a context shift: they were stored without a position, so rotating them (as
/// llama.cpp's K-shift does, treating every layer as RoPE) would bend that layer's scores.
/// With the RoPE layers' attention silenced (`attn_output` zero), the NoPE layer's keys and
/// values are a function of the token alone, so after the shift the cache holds what a
/// fresh evaluation of the kept tokens writes: the next token's logits must be the same,
/// bit for bit.
#[test]
fn context_shift_leaves_the_keys_of_layers_without_rope() {
    shift_without_rope(Device::Cpu);
}

#[cfg(feature = "gpu")]
#[test]
fn context_shift_leaves_the_keys_of_layers_without_rope_on_the_gpu() {
    shift_without_rope(Device::Gpu);
}

fn shift_without_rope(device: Device) {
    let spec = synth::preset("smollm3-tiny").unwrap();
    let (d, q_dim) = (spec.n_embd, spec.head_dim.unwrap_or(spec.n_embd / spec.n_head) * spec.n_head);
    let mut w = spec.build().unwrap();
    for il in 0..3 {
        let name = format!("blk.{il}.attn_output.weight");
        assert!(w.remove_tensor(&name));
        w.add_f32(name, &[q_dim as u64, d as u64], &vec![0.0; q_dim * d]).unwrap();
    }
    let dir = tmp(&format!("shift-nope-{device:?}"));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("smollm3-tiny.gguf");
    w.write_file(&path).unwrap();
    let opts = EngineOptions::default().with_n_ctx(128).with_n_seq(3).with_threads(2).with_device(device);
    let e = Engine::load(path.to_str().unwrap(), opts).unwrap();
    let r = e.runner();

    let prompt: Vec<u32> = (0..60u32).map(|i| 32 + (i * 37) % 95).collect();
    let (n_keep, n_discard, next) = (4, 20, 77);
    let kept: Vec<u32> = prompt[..n_keep].iter().chain(&prompt[n_keep + n_discard..]).copied().collect();
    // The sequence's tokens, then `next` as the one output.
    let feed = |seq, toks: &[u32]| {
        let entries: Vec<Entry> = toks.iter().map(|&token| Entry { seq, token, output: false }).collect();
        r.decode(&entries, OutputKind::Logits).unwrap();
    };
    let next_logits =
        |seq| r.decode(&[Entry { seq, token: next, output: true }], OutputKind::Logits).unwrap();

    let shifted = r.new_seq();
    feed(shifted, &prompt);
    r.shift_seq(shifted, n_keep, n_discard).unwrap();
    let got = next_logits(shifted);
    let fresh = r.new_seq();
    feed(fresh, &kept);
    let want = next_logits(fresh);
    let unshifted = r.new_seq();
    feed(unshifted, &prompt);
    let before = next_logits(unshifted);

    let diff = |a: &[f32], b: &[f32]| a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0f32, f32::max);
    assert!(diff(&before, &want) > 1e-3, "the discarded tokens do not reach the logits");
    assert_eq!(got.len(), want.len());
    let n = bits_differ(&got, &want);
    assert_eq!(n, 0, "{n} logits differ from a fresh evaluation (max |Δ| {})", diff(&got, &want));
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn restored_session_continues_with_the_same_greedy_tokens() {
    let path = tmp("session_restore.json");
    let e = engine(SMOLLM2.name, 512);
    let mut s = e.session(SessionOptions::default()).unwrap();
    s.append_chat(&[Message::user("Tell me about bees.")]).unwrap();
    s.generate(&greedy(8), |_| ControlFlow::Continue(())).unwrap();
    s.save(&path).unwrap();
    let cont = s.generate(&greedy(16), |_| ControlFlow::Continue(())).unwrap();

    // A fresh engine (as a new process would load it) restores and continues identically.
    let e2 = engine(SMOLLM2.name, 512);
    let mut r = e2.session(SessionOptions::default()).unwrap();
    r.restore(&path).unwrap();
    assert_eq!(r.history().len(), 2);
    let cont2 = r.generate(&greedy(16), |_| ControlFlow::Continue(())).unwrap();
    assert_eq!(cont.ids, cont2.ids);
}

#[test]
fn restoring_against_another_model_fails_and_changes_nothing() {
    let path = tmp("session_other_model.json");
    let e = engine(SMOLLM2.name, 256);
    let mut s = e.session(SessionOptions::default()).unwrap();
    s.append_text("Hello").unwrap();
    s.save(&path).unwrap();
    let other = engine(GEMMA3.name, 256);
    let mut r = other.session(SessionOptions::default()).unwrap();
    r.append_text("Hi").unwrap();
    let before = r.tokens();
    let err = r.restore(&path).unwrap_err().to_string();
    assert!(err.contains("sha256"), "{err}");
    assert_eq!(r.tokens(), before);

    std::fs::write(&path, r#"{"format":"kiln-session","version":99}"#).unwrap();
    assert!(r.restore(&path).unwrap_err().to_string().contains("version 99"));
    std::fs::write(&path, "not json").unwrap();
    assert!(r.restore(&path).is_err());
}
