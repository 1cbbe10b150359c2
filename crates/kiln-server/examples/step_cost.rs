//! What one scheduler step costs at a given batch: N sequences decoding one token each
//! (logits for all, as the server asks) against one sequence prefilling N tokens (logits
//! for the last only), on the same engine, interleaved.
//!
//!     cargo run --release -p kiln-server --example step_cost -- [MODEL] [THREADS] [N,...]

use std::time::Instant;

use kiln::engine::{Device, Engine, EngineOptions};
use kiln::model::{Entry, OutputKind};

fn main() -> kiln::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let model = args.get(1).map_or("smollm2-135m", String::as_str);
    let threads: usize = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(2);
    let sizes: Vec<usize> =
        args.get(3).map_or(vec![1, 4, 8, 16, 32], |s| s.split(',').filter_map(|x| x.parse().ok()).collect());
    let n_max = sizes.iter().copied().max().unwrap_or(1);
    let path = kiln::hub::resolve_model(model)?;
    let opts = EngineOptions::default()
        .with_device(Device::Cpu)
        .with_threads(threads)
        .with_n_ctx(512)
        .with_n_seq(n_max + 1);
    let engine = Engine::load(path.to_string_lossy(), opts)?;
    let r = engine.runner();
    let prompt: Vec<u32> = (0..16).map(|i| 100 + i).collect();
    let seqs: Vec<u32> = (0..n_max).map(|_| r.new_seq()).collect();
    for &s in &seqs {
        let e: Vec<Entry> = prompt.iter().map(|&token| Entry { seq: s, token, output: false }).collect();
        r.decode(&e, OutputKind::Logits)?;
    }
    let solo = r.new_seq();
    println!("batch | decode ms/step (all logits) | decode, last logits only | prefill ms (last logits)");
    for &n in &sizes {
        let mut t = [0f64; 3];
        let reps = 5;
        for _ in 0..reps {
            for (k, all) in [(0, true), (1, false)] {
                let e: Vec<Entry> = seqs[..n]
                    .iter()
                    .enumerate()
                    .map(|(i, &seq)| Entry { seq, token: 200, output: all || i + 1 == n })
                    .collect();
                let t0 = Instant::now();
                r.decode(&e, OutputKind::Logits)?;
                t[k] += t0.elapsed().as_secs_f64();
                for &s in &seqs[..n] {
                    r.truncate_seq(s, prompt.len());
                }
            }
            let e: Vec<Entry> =
                (0..n).map(|i| Entry { seq: solo, token: 100 + i as u32, output: i + 1 == n }).collect();
            let t0 = Instant::now();
            r.decode(&e, OutputKind::Logits)?;
            t[2] += t0.elapsed().as_secs_f64();
            r.truncate_seq(solo, 0);
        }
        let ms = |x: f64| 1000.0 * x / reps as f64;
        println!("{n:5} | {:27.1} | {:24.1} | {:.1}", ms(t[0]), ms(t[1]), ms(t[2]));
    }
    Ok(())
}
