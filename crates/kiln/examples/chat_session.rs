//! A two-turn chat with streaming, prefix reuse, a cancel from another thread and a saved
//! session: `cargo run --release --example chat_session -- [MODEL]` (default smollm2-135m).

use std::ops::ControlFlow;
use std::time::Duration;

use kiln::sample::SamplerParams;
use kiln::{Engine, EngineOptions, GenerateOptions, Message, SessionOptions};

fn main() -> kiln::Result<()> {
    let model = std::env::args().nth(1).unwrap_or_else(|| kiln::hub::DEFAULT_MODEL.to_string());
    let engine = Engine::load(&model, EngineOptions::default().with_n_ctx(2048))?;
    let mut s = engine.session(SessionOptions::default())?;
    let opts = GenerateOptions::default().with_sampler(SamplerParams::greedy()).with_max_tokens(64);
    let print = |ev: &kiln::Event| {
        print!("{}", ev.text);
        ControlFlow::Continue(())
    };

    let system = "You are a concise assistant. ".repeat(20);
    s.append_chat(&[Message::system(system), Message::user("Name three rivers.")])?;
    let first = s.generate(&opts, print)?;
    println!(
        "\n-- {} ({} prompt tokens in {:.0} ms)",
        first.finish_reason.as_str(),
        first.timings.prompt_n,
        first.timings.prompt_ms
    );

    s.append_chat(&[Message::user("Which is the longest?")])?;
    let second = s.generate(&opts, print)?;
    let t = &second.timings;
    println!(
        "\n-- turn 2: {} new prompt tokens evaluated in {:.0} ms, {} reused",
        t.prompt_n, t.prompt_ms, t.prompt_cached
    );

    // Cancel a long reply from another thread.
    let cancel = s.cancel_handle();
    std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(300));
        cancel.cancel();
    });
    s.append_chat(&[Message::user("Now write a long essay about rivers.")])?;
    let third = s.generate(&GenerateOptions::default().with_sampler(SamplerParams::greedy()), print)?;
    println!("\n-- {} after {} tokens", third.finish_reason.as_str(), third.ids.len());

    let path = std::env::temp_dir().join("kiln-example-session.json");
    s.save(&path)?;
    let mut restored = engine.session(SessionOptions::default())?;
    restored.restore(&path)?;
    println!("-- saved and restored {} tokens ({})", restored.tokens().len(), path.display());
    Ok(())
}
