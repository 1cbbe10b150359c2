//! Decode speed with a grammar against without, through `Session::generate`, and the
//! grammar's own time per token: `scripts/bench-grammar` runs it.
//!
//! `cargo run --release --example grammar_bench -- [MODEL] [THREADS] [N_TOKENS] [ROUNDS]`
//! (defaults qwen2.5-coder-0.5b, 2, 128, 3). Each round runs every configuration once,
//! interleaved, starting one configuration later each round (so a load that drifts over a
//! round favours none); tok/s are medians over the rounds, with their ratio to the
//! unconstrained run of the same sampling. The inter-token time is the median over every
//! token of every round (steadier on a busy machine: a stall moves it little); its ratio is
//! the median over rounds of each round's ratio (unconstrained over constrained median
//! inter-token time of that round, so load that changes between rounds cancels). Unconstrained runs ignore
//! EOS so they generate the same number of tokens; constrained runs stop where the grammar
//! completes. Prints one JSON line per configuration, then a table.

use std::ops::ControlFlow;

use kiln::grammar::{Grammar, GrammarSpec};
use kiln::sample::SamplerParams;
use kiln::{Engine, EngineOptions, GenerateOptions, Message, SessionOptions};
use serde_json::json;

const PROMPT: &str = "List 20 products of a hardware store as JSON: an object with a \"products\" \
array; each product has a name, a price in dollars, whether it is in stock, and two tags.";

const SCHEMA: &str = r#"{"type":"object","properties":{"products":{"type":"array","minItems":20,
"items":{"type":"object","properties":{"name":{"type":"string"},"price":{"type":"number"},
"in_stock":{"type":"boolean"},"tags":{"type":"array","items":{"type":"string"},"maxItems":3}},
"required":["name","price","in_stock","tags"]}}},"required":["products"]}"#;

fn quantile(v: &[f32], q: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    let mut s = v.to_vec();
    s.sort_by(f32::total_cmp);
    s[((s.len() - 1) as f64 * q).round() as usize] as f64
}

fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    s[s.len() / 2]
}

struct Config {
    name: &'static str,
    grammar: Option<GrammarSpec>,
    greedy: bool,
}

fn main() -> kiln::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let model = args.get(1).cloned().unwrap_or_else(|| "qwen2.5-coder-0.5b".into());
    let threads: usize = args.get(2).map_or(2, |s| s.parse().unwrap());
    let n_tokens: usize = args.get(3).map_or(128, |s| s.parse().unwrap());
    let rounds: usize = args.get(4).map_or(3, |s| s.parse().unwrap());
    let engine = Engine::load(&model, EngineOptions::default().with_n_ctx(2048).with_threads(threads))?;
    let gbnf = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../tests/fixtures/grammar/gbnf/json.gbnf"
    ))
    .map_err(|e| kiln::KilnError::io("json.gbnf", e))?;
    let schema = Grammar::json_schema_str(SCHEMA)?;
    let t0 = std::time::Instant::now();
    engine.grammar_env()?;
    eprintln!("grammar environment: {:.0} ms (once per engine)", t0.elapsed().as_secs_f64() * 1e3);

    let mut configs = Vec::new();
    for greedy in [false, true] {
        configs.push(Config { name: "none", grammar: None, greedy });
        configs.push(Config { name: "json-schema", grammar: Some(schema.clone().into()), greedy });
        configs.push(Config { name: "json-object", grammar: Some(Grammar::JsonObject.into()), greedy });
        configs.push(Config { name: "gbnf json", grammar: Some(Grammar::Gbnf(gbnf.clone()).into()), greedy });
        configs.push(Config {
            name: "json-schema mask-first",
            grammar: Some(GrammarSpec::from(schema.clone()).with_mask_first(true)),
            greedy,
        });
    }
    let mut rates = vec![Vec::new(); configs.len()];
    let mut gaps_ms = vec![Vec::new(); configs.len()];
    let mut round_itl = vec![Vec::new(); configs.len()];
    // Each configuration's unconstrained counterpart (same sampling).
    let base_of: Vec<usize> = configs
        .iter()
        .map(|c| configs.iter().position(|b| b.grammar.is_none() && b.greedy == c.greedy).unwrap())
        .collect();
    let mut grammar_us = vec![Vec::new(); configs.len()];
    let mut mask_us = vec![Vec::new(); configs.len()];
    let mut counts = vec![(0usize, 0usize, 0usize); configs.len()];
    for round in 0..rounds {
        for k in 0..configs.len() {
            let i = (k + round) % configs.len();
            let c = &configs[i];
            let mut s = engine.session(SessionOptions::default())?;
            s.append_chat(&[Message::user(PROMPT)])?;
            let sampler = if c.greedy {
                SamplerParams::greedy()
            } else {
                SamplerParams::default().with_seed(round as u64)
            };
            let mut opts = GenerateOptions::default().with_sampler(sampler).with_max_tokens(n_tokens);
            opts = match &c.grammar {
                Some(g) => opts.with_grammar(g.clone()),
                None => opts.with_ignore_eos(true),
            };
            let mut last: Option<std::time::Instant> = None;
            let mut gaps = Vec::new();
            let sum = s.generate(&opts, |_| {
                let now = std::time::Instant::now();
                if let Some(t) = last.replace(now) {
                    gaps.push((now - t).as_secs_f32() * 1e3);
                }
                ControlFlow::Continue(())
            })?;
            round_itl[i].push(quantile(&gaps, 0.5));
            gaps_ms[i].extend(gaps);
            let t = &sum.timings;
            rates[i].push(t.gen_n as f64 * 1e3 / t.gen_ms);
            if let Some(g) = &sum.grammar {
                grammar_us[i].extend_from_slice(&g.grammar_us);
                mask_us[i].extend_from_slice(&g.mask_us);
                counts[i].0 += g.n_sampled;
                counts[i].1 += g.n_masked;
            }
            counts[i].2 += t.gen_n;
            if round == 0 && c.grammar.is_some() && !c.greedy {
                eprintln!("{}: {:?}...", c.name, sum.text.chars().take(100).collect::<String>());
            }
        }
    }
    println!("model {model}, {threads} threads, up to {n_tokens} tokens, {rounds} interleaved rounds");
    let itl = |i: usize| quantile(&gaps_ms[i], 0.5);
    let ratio = |i: usize| median(&rates[i]) / median(&rates[base_of[i]]);
    let itl_ratio = |i: usize| {
        let b = &round_itl[base_of[i]];
        median(&round_itl[i].iter().zip(b).map(|(x, b)| b / x).collect::<Vec<_>>())
    };
    for (i, c) in configs.iter().enumerate() {
        let tok_s = median(&rates[i]);
        let (n_sampled, n_masked, n_gen) = counts[i];
        let line = json!({
            "config": c.name, "sampling": if c.greedy { "greedy" } else { "default chain" },
            "tok_s": tok_s, "ratio": ratio(i), "tokens": n_gen,
            "itl_ms_median": itl(i), "itl_ratio": itl_ratio(i),
            "grammar_us_median": quantile(&grammar_us[i], 0.5), "grammar_us_p99": quantile(&grammar_us[i], 0.99),
            "full_masks": n_masked, "constrained_tokens": n_sampled,
            "mask_us_median": quantile(&mask_us[i], 0.5), "mask_us_p99": quantile(&mask_us[i], 0.99),
        });
        println!("{line}");
    }
    println!(
        "\n{:<24} {:>8} {:>9} {:>6} {:>8} {:>9} {:>12} {:>10} {:>12} {:>10} {:>8}",
        "config",
        "sampling",
        "tok/s",
        "ratio",
        "itl ms",
        "itl ratio",
        "grammar us",
        "p99",
        "full mask us",
        "p99",
        "masks"
    );
    for (i, c) in configs.iter().enumerate() {
        let tok_s = median(&rates[i]);
        println!(
            "{:<24} {:>8} {:>9.2} {:>6.3} {:>8.2} {:>9.3} {:>12.1} {:>10.1} {:>12.1} {:>10.1} {:>8}",
            c.name,
            if c.greedy { "greedy" } else { "chain" },
            tok_s,
            ratio(i),
            itl(i),
            itl_ratio(i),
            quantile(&grammar_us[i], 0.5),
            quantile(&grammar_us[i], 0.99),
            quantile(&mask_us[i], 0.5),
            quantile(&mask_us[i], 0.99),
            format!("{}/{}", counts[i].1, counts[i].0),
        );
    }
    Ok(())
}
