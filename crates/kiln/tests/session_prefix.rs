//! Prefix reuse: a follow-up chat turn evaluates only the new tokens; a new session
//! starting with tokens another one computed reuses their whole blocks; the cache is
//! bounded and its reuse is exact.

mod support;

use kiln::model::{Entry, OutputKind};
use kiln::sample::SamplerParams;
use kiln::{Engine, EngineOptions, GenerateOptions, Message, SessionOptions};
use support::*;

fn engine(opts: EngineOptions) -> Engine {
    Engine::load(model(SMOLLM2.name).to_str().unwrap(), opts.with_threads(2)).unwrap()
}

fn greedy(n: usize) -> GenerateOptions {
    GenerateOptions::default().with_sampler(SamplerParams::greedy()).with_max_tokens(n)
}

fn lcp(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

#[test]
fn second_chat_turn_evaluates_only_new_tokens() {
    let e = engine(EngineOptions::default().with_n_ctx(1024));
    let mut s = e.session(SessionOptions::default()).unwrap();
    let turn1 = s.append_chat(&[Message::system("You are terse."), Message::user("Name a colour.")]).unwrap();
    assert_eq!(s.n_evaluated(), turn1.len());
    let sum = s.generate(&greedy(200), |_| std::ops::ControlFlow::Continue(())).unwrap();
    assert_eq!(sum.finish_reason.as_str(), "eog", "{:?}", sum.text);
    // The KV holds the prompt and every sampled token but the final end-of-turn token.
    let kv_before = turn1.len() + sum.ids.len() - 1;
    assert_eq!(s.n_evaluated(), kv_before);
    assert_eq!(s.history().len(), 3);

    let before = s.n_evaluated();
    let turn2 = s.append_chat(&[Message::user("Another one.")]).unwrap();
    let evaluated = s.n_evaluated() - before;
    let mut conv = turn1.clone();
    conv.extend_from_slice(&sum.ids);
    // The re-rendered history starts with everything the model has seen ...
    assert_eq!(lcp(&conv, &turn2), conv.len(), "re-rendered history diverges from the KV");
    // ... so only the tokens after the KV's end are evaluated.
    assert_eq!(evaluated, turn2.len() - kv_before);
    eprintln!("turn 2: {} tokens, {evaluated} evaluated", turn2.len());

    // Exactness: the logits after turn 2 equal a fresh evaluation of the whole prompt.
    let fresh = engine(EngineOptions::default().with_n_ctx(1024).with_prefix_cache_tokens(0));
    let mut f = fresh.session(SessionOptions::default()).unwrap();
    f.append_tokens(&turn2).unwrap();
    assert_eq!(f.n_evaluated(), turn2.len());
    assert_eq!(f.logits().unwrap(), s.logits().unwrap());
}

#[test]
fn new_session_reuses_whole_blocks_of_another() {
    let e = engine(EngineOptions::default().with_n_ctx(512).with_n_seq(2));
    let sys = "You are a helpful assistant who answers questions about geography. ".repeat(8);
    let mut a = e.session(SessionOptions::default()).unwrap();
    let pa = a.append_chat(&[Message::system(sys.clone()), Message::user("Capital of France?")]).unwrap();
    let mut b = e.session(SessionOptions::default()).unwrap();
    let pb = b.append_chat(&[Message::system(sys), Message::user("Capital of Peru?")]).unwrap();
    let common = lcp(&pa, &pb);
    assert!(common >= 64, "the test wants a long shared prefix, got {common}");
    assert_eq!(b.n_evaluated(), pb.len() - common / 32 * 32);
    let (cached, cap) = e.runner().prefix_cache_blocks();
    assert!(cached >= common / 32 && cached <= cap);

    // B's logits equal a run without any cache.
    let fresh = engine(EngineOptions::default().with_n_ctx(512).with_prefix_cache_tokens(0));
    let mut f = fresh.session(SessionOptions::default()).unwrap();
    f.append_tokens(&pb).unwrap();
    assert_eq!(f.logits().unwrap(), b.logits().unwrap());

    // A dropped session's blocks stay cached for the next one.
    drop(a);
    drop(b);
    let mut c = e.session(SessionOptions::default()).unwrap();
    c.append_tokens(&pa).unwrap();
    assert_eq!(c.n_evaluated(), pa.len() - (pa.len() - 1) / 32 * 32);
}

#[test]
fn cache_is_bounded_and_evicts_least_recently_used() {
    // Two blocks of cache at most.
    let e = engine(EngineOptions::default().with_n_ctx(256).with_prefix_cache_tokens(64));
    let r = e.runner();
    assert_eq!(r.prefix_cache_blocks(), (0, 2));
    let run = |first: u32, n: usize| {
        let seq = r.new_seq();
        let entries: Vec<Entry> =
            (0..n as u32).map(|i| Entry { seq, token: first + i, output: false }).collect();
        r.decode(&entries, OutputKind::Logits).unwrap();
        r.free_seq(seq);
    };
    run(1000, 96); // three full blocks; only two may stay
    assert_eq!(r.prefix_cache_blocks().0, 2);
    run(5000, 64); // a newer prefix evicts the older one's blocks
    assert_eq!(r.prefix_cache_blocks().0, 2);
    let mut s = e.session(SessionOptions::default()).unwrap();
    s.append_tokens(&(5000..5070).collect::<Vec<_>>()).unwrap();
    assert_eq!(s.n_evaluated(), 70 - 64);
    let mut t = e.session(SessionOptions::default()).unwrap();
    t.append_tokens(&(1000..1040).collect::<Vec<_>>()).unwrap();
    assert_eq!(t.n_evaluated(), 40, "the evicted prefix must be recomputed");
}

#[test]
fn full_pool_evicts_cached_blocks_on_demand() {
    // n_ctx 128, one sequence: the pool has 4 blocks; the cache may name all of them.
    let e = engine(EngineOptions::default().with_n_ctx(128));
    for first in [100u32, 2000, 7000] {
        let mut s = e.session(SessionOptions::default()).unwrap();
        s.append_tokens(&(first..first + 128).collect::<Vec<_>>()).unwrap();
    }
    let mut s = e.session(SessionOptions::default()).unwrap();
    s.append_tokens(&(7000..7128).collect::<Vec<_>>()).unwrap();
    assert_eq!(s.n_evaluated(), 32, "the last prefix's first three blocks are still cached");
}
