//! Time to first token with and without the prefix cache, on a long shared system prompt:
//! `cargo run --release --example prefix_ttft -- [MODEL] [REPEATS]`. Each round asks a new
//! question under the same system prompt, once on an engine whose cache is off (cold) and
//! once on one that has seen the system prompt before (warm), interleaved.

use std::ops::ControlFlow;
use std::time::Instant;

use kiln::sample::SamplerParams;
use kiln::{Engine, EngineOptions, GenerateOptions, Message, SessionOptions};

fn ttft(engine: &Engine, system: &str, question: &str) -> kiln::Result<(f64, usize)> {
    let t0 = Instant::now();
    let mut s = engine.session(SessionOptions::default())?;
    s.append_chat(&[Message::system(system), Message::user(question)])?;
    let opts = GenerateOptions::default().with_sampler(SamplerParams::greedy()).with_max_tokens(1);
    s.generate(&opts, |_| ControlFlow::Continue(()))?;
    Ok((t0.elapsed().as_secs_f64() * 1e3, s.n_evaluated()))
}

fn main() -> kiln::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let model = args.first().cloned().unwrap_or_else(|| kiln::hub::DEFAULT_MODEL.to_string());
    let rounds: usize = args.get(1).and_then(|r| r.parse().ok()).unwrap_or(3);
    let opts = EngineOptions::default().with_n_ctx(2048);
    let cold = Engine::load(&model, opts.clone().with_prefix_cache_tokens(0))?;
    let warm = Engine::load(&model, opts)?;
    let system = "You are a support assistant for a hardware store. Answer politely, cite the aisle, \
                  and never recommend a competitor. "
        .repeat(24);
    ttft(&warm, &system, "Hello")?; // the warm engine sees the system prompt once
    let (mut c_sum, mut w_sum) = (0.0, 0.0);
    for i in 0..rounds {
        let q = format!("Where are the size {i} screws?");
        let (c, cn) = ttft(&cold, &system, &q)?;
        let (w, wn) = ttft(&warm, &system, &q)?;
        println!("round {i}: cold {c:.0} ms ({cn} tokens evaluated), warm {w:.0} ms ({wn} evaluated)");
        c_sum += c;
        w_sum += w;
    }
    println!(
        "time to first token: cold {:.0} ms, warm {:.0} ms, ratio {:.1}x",
        c_sum / rounds as f64,
        w_sum / rounds as f64,
        c_sum / w_sum
    );
    Ok(())
}
