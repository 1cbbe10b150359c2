//! Progress reports: loading weights (bytes, ending at the total) and evaluating a prompt
//! (tokens per micro-batch, ending at the prompt's length), on a small synthetic model.

use std::sync::{Arc, Mutex};

use kiln::progress::{ProgressFn, Stage};
use kiln::{Device, Engine, EngineOptions, SessionOptions};

#[test]
fn load_and_prompt_report_progress() {
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("progress");
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("m.gguf");
    let w = kiln::model::synth::SynthSpec::default().build().unwrap();
    w.write_file(&path).unwrap();
    let seen: Arc<Mutex<Vec<(Stage, u64, u64)>>> = Arc::default();
    let s2 = seen.clone();
    let f = ProgressFn::new(move |p| s2.lock().unwrap().push((p.stage, p.done, p.total)));

    let opts = EngineOptions::default().with_device(Device::Cpu).with_batch(8).with_progress(f.clone());
    let engine = Engine::load(path.to_str().unwrap(), opts).unwrap();
    let load: Vec<_> = seen.lock().unwrap().drain(..).collect();
    let total: u64 = engine.gguf().tensors.iter().map(|t| t.size).sum();
    assert!(load.iter().all(|&(s, _, t)| s == Stage::Load && t == total), "{load:?}");
    assert!(load.windows(2).all(|w| w[0].1 <= w[1].1), "{load:?}");
    assert_eq!(load.last().unwrap().1, total);

    let mut s = engine.session(SessionOptions::default().with_progress(f)).unwrap();
    s.append_tokens(&(1..=20).collect::<Vec<u32>>()).unwrap();
    let prompt: Vec<_> = seen.lock().unwrap().drain(..).collect();
    assert_eq!(prompt, [(Stage::Prompt, 8, 20), (Stage::Prompt, 16, 20), (Stage::Prompt, 20, 20)]);
}
