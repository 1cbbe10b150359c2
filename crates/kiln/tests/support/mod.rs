//! Shared helpers of the integration tests: real models from the cache, fixtures, tiers.
#![allow(dead_code)]

use std::path::PathBuf;

/// `KILN_FULL=1` runs the slow tier (the 1.5B model, long contexts).
pub fn full() -> bool {
    std::env::var("KILN_FULL").is_ok_and(|v| v == "1")
}

/// A catalog model, fetched into the cache on first use (CI pulls them beforehand).
pub fn model(name: &str) -> PathBuf {
    kiln::hub::resolve_model(name).unwrap_or_else(|e| panic!("model {name}: {e}"))
}

pub fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures")
}

pub fn fixture_json(rel: &str) -> serde_json::Value {
    let p = fixtures().join(rel);
    let s = std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    serde_json::from_str(&s).unwrap()
}

/// The catalog name and oracle stem of each real model, and its tolerance class.
pub struct RealModel {
    pub name: &'static str,
    pub stem: &'static str,
    pub gemma: bool,
    pub slow: bool,
}

pub const SMOLLM2: RealModel =
    RealModel { name: "smollm2-135m", stem: "SmolLM2-135M-Instruct.Q4_1", gemma: false, slow: false };
pub const GEMMA3: RealModel =
    RealModel { name: "gemma3-270m", stem: "gemma-3-270m-q4_k_m", gemma: true, slow: false };
pub const QWEN05: RealModel = RealModel {
    name: "qwen2.5-coder-0.5b",
    stem: "qwen2.5-coder-0.5b-instruct-q4_k_m",
    gemma: false,
    slow: false,
};
pub const QWEN15: RealModel = RealModel {
    name: "qwen2.5-coder-1.5b",
    stem: "qwen2.5-coder-1.5b-instruct-q4_k_m",
    gemma: false,
    slow: true,
};

impl RealModel {
    /// False (with a note) when the model belongs to the slow tier and it is not enabled.
    pub fn enabled(&self) -> bool {
        if self.slow && !full() {
            eprintln!("skipping {}: slow tier, set KILN_FULL=1", self.name);
            return false;
        }
        true
    }

    /// The oracle's near-tie threshold for this model.
    pub fn tau(&self) -> f32 {
        if self.gemma {
            0.5
        } else {
            0.3
        }
    }
}

pub fn argmax(v: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &x) in v.iter().enumerate() {
        if x > v[best] {
            best = i;
        }
    }
    best as u32
}

pub fn ids(v: &serde_json::Value) -> Vec<u32> {
    v.as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect()
}

/// Greedy generation through a session of `e` (incremental decode) gives llama.cpp's
/// oracle ids up to its first near-tie, at most `cap` steps per case.
pub fn session_greedy_matches_oracle(e: &kiln::engine::Engine, m: &RealModel, cap: usize) {
    use kiln::sample::SamplerParams;
    use kiln::session::{GenerateOptions, SessionOptions};
    let oracle = fixture_json(&format!("oracle/{}/greedy.json", m.stem));
    for case in oracle["cases"].as_array().unwrap() {
        let prompt = ids(&case["prompt_ids"]);
        let want = ids(&case["ids"]);
        let margins: Vec<f32> =
            case["margins"].as_array().unwrap().iter().map(|x| x.as_f64().unwrap() as f32).collect();
        let n = margins.iter().position(|&x| x < m.tau()).unwrap_or(want.len()).min(cap);
        let mut s = e.session(SessionOptions::default()).unwrap();
        s.append_tokens(&prompt).unwrap();
        let opts = GenerateOptions::default()
            .with_max_tokens(n)
            .with_sampler(SamplerParams::greedy())
            .with_ignore_eos(true);
        let got = s.generate(&opts, |_| std::ops::ControlFlow::Continue(())).unwrap().ids;
        let what = e.backend_name();
        assert_eq!(got[..n], want[..n], "{:?} on {what}: greedy ids differ from llama.cpp's", case["prompt"]);
        eprintln!("  {:?}: {n} greedy ids identical to llama.cpp's", case["prompt"].as_str().unwrap());
    }
}
