//! Encoders (bert, nomic-bert, jina-bert-v2) and rerankers against llama.cpp's
//! `llama-embedding` (fixtures made by scripts/gen-encoder-fixtures, which records the
//! commands and llama.cpp's version): the real nomic-embed-text-v1.5 and synthetic presets
//! of each architecture, each pooled as its file says; the presets on the CPU and on the
//! GPU (lavapipe in CI).

mod support;

use kiln::embed::{embed_batch, normalize, rank, rerank_input, Pooling};
use kiln::engine::{Device, Engine, EngineOptions};
use kiln::model::synth;
use support::*;

fn floats(v: &serde_json::Value) -> Vec<f32> {
    v.as_array().unwrap().iter().map(|x| x.as_f64().unwrap() as f32).collect()
}

fn max_abs(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f32::max)
}

fn unit(v: &[f32]) -> Vec<f32> {
    let mut v = v.to_vec();
    normalize(&mut v);
    v
}

/// A synthetic preset written to a temporary file and loaded on the CPU.
fn synth_engine(preset: &str) -> Engine {
    synth_engine_on(preset, Device::Cpu)
}

/// [`synth_engine`] on `device` (the GPU's batch-invariant kernels).
fn synth_engine_on(preset: &str, device: Device) -> Engine {
    let dir = std::env::temp_dir().join(format!("kiln-encoder-{}-{preset}-{device:?}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(format!("{preset}.gguf"));
    synth::preset(preset).unwrap().build().unwrap().write_file(&path).unwrap();
    let opts = EngineOptions::default().with_threads(2).with_device(device).with_batch_invariant(true);
    let e = Engine::load(path.to_str().unwrap(), opts).unwrap();
    std::fs::remove_dir_all(&dir).ok();
    e
}

#[test]
fn nomic_embed_matches_llama_embedding() {
    nomic_embed_on(Device::Cpu);
}

/// The real model on the GPU (lavapipe here: slow, so in the slow tier).
#[cfg(feature = "gpu")]
#[test]
fn nomic_embed_on_the_gpu_matches_llama_embedding() {
    if !full() {
        eprintln!("skipping: slow tier, set KILN_FULL=1");
        return;
    }
    nomic_embed_on(Device::Gpu);
}

fn nomic_embed_on(device: Device) {
    let e = Engine::load(
        model("nomic-embed-text-v1.5").to_str().unwrap(),
        // (Batch-invariant: the invariance checked below holds on tensor cores too.)
        EngineOptions::default()
            .with_threads(2)
            .with_device(device)
            .with_batch_invariant(device == Device::Gpu),
    )
    .unwrap();
    assert_eq!(Pooling::of(&e), Pooling::Mean);
    let fx = fixture_json("embed/nomic-embed-text-v1.5.json");
    let cases = fx["cases"].as_array().unwrap();
    let ids: Vec<Vec<u32>> = cases
        .iter()
        .map(|c| e.tokenizer().encode(c["text"].as_str().unwrap(), true, true).unwrap())
        .collect();
    assert!(ids.iter().any(|i| i.len() > 200), "a long input");
    // All the texts in one batch, as `kiln embed` runs them.
    let refs: Vec<&[u32]> = ids.iter().map(Vec::as_slice).collect();
    let got = embed_batch(&e, &refs, Pooling::Mean).unwrap();
    for (case, got) in cases.iter().zip(&got) {
        let want = floats(&case["embedding"]);
        let (raw, unit_err) = (max_abs(&got[0], &want), max_abs(&unit(&got[0]), &unit(&want)));
        let text: String = case["text"].as_str().unwrap().chars().take(48).collect();
        eprintln!(
            "{text:?} ({} chars): max abs {raw:.5} raw, {unit_err:.2e} normalized",
            case["text"].as_str().unwrap().len()
        );
        // The bound, on the vectors as served (normalized). llama.cpp's F16 matmul
        // tiles and its f32 attention on micro-batches of 64+ tokens round differently.
        assert!(unit_err < 1e-3, "normalized max abs {unit_err}");
        assert!(raw < 2e-2, "raw max abs {raw}");
    }
    // Batch invariance: each text alone gives the same vector as inside the batch.
    for (ids, batched) in ids.iter().zip(&got) {
        assert_eq!(&embed_batch(&e, &[ids], Pooling::Mean).unwrap()[0], batched);
    }
}

#[test]
fn synthetic_encoders_match_llama_embedding() {
    synthetic_encoders_on(Device::Cpu);
}

fn synthetic_encoders_on(device: Device) {
    let fx = fixture_json("synth/encoders.json");
    let text = fx["text"].as_str().unwrap();
    for (preset, pooling) in [
        ("bert-tiny", Pooling::Cls),
        ("nomic-bert-tiny", Pooling::Mean),
        ("jina-bert-v2-tiny", Pooling::Mean),
    ] {
        let e = synth_engine_on(preset, device);
        assert_eq!(Pooling::of(&e), pooling, "{preset}");
        let got = e.embed(text, pooling).unwrap().remove(0);
        let err = max_abs(&got, &floats(&fx["embeddings"][preset]));
        eprintln!("{preset} on {}: max abs {err:.2e}", e.backend_name());
        assert!(err < 1e-3, "{preset}: max abs {err}");
        // Batch invariance: the text alone and beside two others, one longer.
        let ids = e.tokenizer().encode(text, true, true).unwrap();
        let other = e.tokenizer().encode("a b c d e f g h i j k l m n o p q r s t", true, true).unwrap();
        let batch = embed_batch(&e, &[&other, &ids, &ids[..ids.len() / 2]], pooling).unwrap();
        assert_eq!(batch[1], embed_batch(&e, &[&ids], pooling).unwrap()[0], "{preset}: alone vs batched");
    }
}

#[test]
fn reranker_matches_llama_embedding_rank() {
    reranker_on(Device::Cpu);
}

/// The encoder presets and the reranker on the GPU: the same bars against llama.cpp.
#[cfg(feature = "gpu")]
#[test]
fn encoders_on_the_gpu() {
    synthetic_encoders_on(Device::Gpu);
    reranker_on(Device::Gpu);
}

fn reranker_on(device: Device) {
    let fx = &fixture_json("synth/encoders.json")["rerank"];
    let e = synth_engine_on(fx["preset"].as_str().unwrap(), device);
    assert_eq!(Pooling::of(&e), Pooling::Rank);
    let query = fx["query"].as_str().unwrap();
    let docs: Vec<&str> = fx["documents"].as_array().unwrap().iter().map(|d| d.as_str().unwrap()).collect();
    let inputs: Vec<Vec<u32>> = docs.iter().map(|d| rerank_input(&e, query, d).unwrap()).collect();
    let refs: Vec<&[u32]> = inputs.iter().map(Vec::as_slice).collect();
    let got: Vec<f32> = embed_batch(&e, &refs, Pooling::Rank).unwrap().iter().map(|r| r[0][0]).collect();
    let want = floats(&fx["scores"]);
    eprintln!("rerank scores {got:?}, llama.cpp {want:?}");
    assert!(max_abs(&got, &want) < 1e-3);
    let order: Vec<usize> = rank(got.iter().copied(), None).iter().map(|r| r.0).collect();
    let want_order: Vec<usize> = rank(want.iter().copied(), None).iter().map(|r| r.0).collect();
    assert_eq!(order, want_order);
    assert_eq!(rank(got.iter().copied(), Some(1)).len(), 1);
}

#[test]
fn encoder_errors_name_why() {
    let e = synth_engine("bert-tiny");
    // No classification head: rank pooling is refused.
    let ids = e.tokenizer().encode("the fox", true, true).unwrap();
    let err = embed_batch(&e, &[&ids], Pooling::Rank).unwrap_err().to_string();
    assert!(err.contains("classification head"), "{err}");
    assert!(embed_batch(&e, &[&[]], Pooling::Cls).is_err());
    let long = vec![ids[1]; e.n_ctx() + 1];
    let err = embed_batch(&e, &[&ids, &long], Pooling::Cls).unwrap_err().to_string();
    assert!(err.contains("input 1"), "{err}");
}

/// The warm-up a hardware GPU runs at load (every step shape built before the first
/// request) takes an encoder's steps, which give hidden states and have no decode steps,
/// and leaves the pool as it was: the embeddings after it are those of a fresh runner.
#[test]
fn warm_up_runs_encoder_steps() {
    use kiln::backend::cpu::CpuBackend;
    use kiln::model::{Entry, Model, ModelRunner, OutputKind, Runner};
    let path = std::env::temp_dir().join(format!("kiln-warm-up-{}.gguf", std::process::id()));
    synth::preset("nomic-bert-tiny").unwrap().build().unwrap().write_file(&path).unwrap();
    let gguf = std::sync::Arc::new(kiln::gguf::GgufFile::open(&path).unwrap());
    std::fs::remove_file(&path).ok();
    let hidden = |runner: &ModelRunner<CpuBackend>| {
        let seq = runner.new_seq();
        let entries: Vec<Entry> = (0..9).map(|i| Entry { seq, token: 100 + i, output: true }).collect();
        let out = runner.decode(&entries, OutputKind::Hidden).unwrap();
        runner.free_seq(seq);
        out
    };
    let runner = || ModelRunner::new(Model::load(&gguf, CpuBackend::new(2)).unwrap(), 64, 32).unwrap();
    let warmed = runner();
    warmed.warm_up().unwrap();
    assert_eq!(hidden(&warmed), hidden(&runner()));
}
