//! The hardware GPUs' default path (`KILN_GPU_MATMUL=vec`: f32 partial sums, split decode
//! attention) run end to end on lavapipe: `kiln run --device gpu --temp 0` on smollm2 gives
//! llama.cpp's greedy ids up to the oracle's first near-tie. Its own test binary: the path
//! is chosen from the environment when the backend opens, and this sets it for the process.
#![cfg(feature = "gpu")]

mod support;

use kiln::engine::{Device, Engine, EngineOptions};
use support::*;

#[test]
fn smollm2_gpu_vec_greedy_matches_llama_cpp() {
    std::env::set_var("KILN_GPU_MATMUL", "vec");
    let opts =
        EngineOptions::default().with_n_ctx(256).with_batch(64).with_threads(2).with_device(Device::Gpu);
    let e = Engine::load(model(SMOLLM2.name).to_str().unwrap(), opts).unwrap();
    // lavapipe runs the vec kernels at ~1 token/s: 8 steps per case.
    session_greedy_matches_oracle(&e, &SMOLLM2, 8);
}
