//! Grammars from users and requests: GBNF (kiln's own front end), JSON schemas, Lark and
//! regexes compiled over a vocabulary of single bytes must give a grammar or an error,
//! never a panic. A compiled grammar then drives a constraint (lazy for some inputs) for a
//! few steps with logits drawn from the input: an active grammar accepts every token it
//! picked, and whatever it completes matches it. The first input byte picks the kind; the
//! rest is the text.

#![no_main]

use std::sync::{Arc, OnceLock};

use kiln::grammar::{Grammar, GrammarEnv, Trigger};
use kiln::sample::{Sampler, SamplerParams};
use libfuzzer_sys::fuzz_target;

const EOS: u32 = 256;

fn env() -> &'static Arc<GrammarEnv> {
    static E: OnceLock<Arc<GrammarEnv>> = OnceLock::new();
    E.get_or_init(|| {
        let mut words: Vec<Vec<u8>> = (0..=255u8).map(|b| vec![b]).collect();
        words.push(b"\xff<eos>".to_vec());
        words.push(b"\xff<|tool|>".to_vec());
        for w in ["{\"", "\":", "true", "  ", "abc", "<tool_call>"] {
            words.push(w.as_bytes().to_vec());
        }
        Arc::new(GrammarEnv::from_vocab(words, &[EOS]).unwrap())
    })
}

fuzz_target!(|data: &[u8]| {
    let Some((&pick, rest)) = data.split_first() else { return };
    let text = String::from_utf8_lossy(rest).into_owned();
    let grammar = match pick % 4 {
        0 => Grammar::Gbnf(text),
        1 => match Grammar::json_schema_str(&text) {
            Ok(g) => g,
            Err(_) => return,
        },
        2 => Grammar::Lark(text),
        _ => Grammar::Regex(text),
    };
    let spec = if pick & 0x10 != 0 { grammar.lazy(vec![Trigger::Token(257), Trigger::Text("{".into())]) } else { grammar.into() };
    let env = env();
    let Ok(compiled) = env.compile(&spec) else { return };
    let mut c = compiled.constraint();
    let mut sampler = Sampler::new(SamplerParams::default().with_seed(pick as u64), env.n_vocab()).unwrap();
    let mut ids = Vec::new();
    let mut seed = data.len() as u64;
    for _ in 0..24 {
        let logits: Vec<f32> = (0..env.n_vocab())
            .map(|i| {
                seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                let b = rest.get(i % rest.len().max(1)).copied().unwrap_or(0);
                ((seed >> 40) as f32 / (1u64 << 24) as f32) * 4.0 + (b % 7) as f32
            })
            .collect();
        let Ok(id) = c.sample(&mut sampler, &logits) else { return };
        let was_active = c.is_active();
        if c.accept(id).is_err() {
            // A trigger's text may not fit the grammar (an error, as documented); a token the
            // active grammar chose itself must always fit.
            assert!(!was_active, "the constraint refused the token it sampled: {id}");
            return;
        }
        if id == EOS {
            break;
        }
        ids.push(id);
        if c.is_complete() {
            break;
        }
    }
    if c.activated_at() == Some(0) && (c.is_complete() || ids.len() < 24) && !ids.is_empty() {
        assert!(compiled.matches_tokens(&ids), "a completed output does not match: {ids:?}");
    }
});
