//! Numeric metadata the forward cannot run is refused at load, each error naming the key
//! and its value: non-finite or non-positive rope bases, epsilons and factors, rope
//! dimensions outside the head, zero counts. Synthetic models of each architecture with
//! one bad value each, and the shared reader (`Meta`) on keys only other architectures
//! read, which it checks by name.

use kiln::engine::{Engine, EngineOptions};
use kiln::gguf::{GgufFile, Value};
use kiln::model::synth::SynthSpec;
use kiln::model::{Meta, ModelConfig};

fn load(arch: &str, key: &str, value: Value) -> kiln::Result<ModelConfig> {
    let spec = SynthSpec { arch: arch.into(), metadata: vec![(key.into(), value)], ..SynthSpec::default() };
    ModelConfig::from_gguf(&GgufFile::from_bytes(spec.build()?.to_bytes())?)
}

#[test]
fn every_bad_value_is_refused_naming_key_and_value() {
    use Value::{F32, U32};
    let cases: Vec<(&str, &str, Value, &str)> = vec![
        ("llama", "rope.freq_base", F32(f32::NAN), "NaN"),
        ("llama", "rope.freq_base", F32(-10000.0), "-10000"),
        ("llama", "rope.freq_base", F32(0.0), "0"),
        ("llama", "rope.freq_base", F32(f32::INFINITY), "inf"),
        ("llama", "attention.layer_norm_rms_epsilon", F32(-1e-5), "-0.00001"),
        ("llama", "attention.layer_norm_rms_epsilon", F32(0.0), "0"),
        ("llama", "attention.layer_norm_rms_epsilon", F32(f32::NAN), "NaN"),
        ("llama", "rope.dimension_count", U32(0), "0"),
        ("llama", "rope.dimension_count", U32(3), "3"),
        ("llama", "rope.dimension_count", U32(1024), "1024"),
        ("llama", "context_length", U32(0), "0"),
        ("llama", "block_count", U32(0), "0"),
        ("llama", "embedding_length", U32(0), "0"),
        ("llama", "feed_forward_length", U32(0), "0"),
        ("llama", "attention.head_count", U32(0), "0"),
        ("llama", "attention.head_count_kv", U32(0), "0"),
        ("llama", "attention.head_count_kv", U32(3), "3"),
        ("llama", "attention.key_length", U32(0), "0"),
        ("llama", "attention.scale", F32(f32::NAN), "NaN"),
        ("llama", "attention.scale", F32(-1.0), "-1"),
        ("llama", "rope.scaling.factor", F32(-2.0), "-2"),
        ("llama", "rope.scaling.factor", F32(f32::NAN), "NaN"),
        ("llama", "rope.scaling.factor", F32(1e-45), "0.000000000000000000000000000000000000000000001"),
        ("llama", "rope.scaling.yarn_ext_factor", F32(f32::INFINITY), "inf"),
        ("llama", "rope.scaling.yarn_attn_factor", F32(0.0), "0"),
        ("llama", "rope.scaling.attn_factor", F32(f32::NEG_INFINITY), "-inf"),
        ("llama", "rope.scaling.yarn_beta_fast", F32(f32::NAN), "NaN"),
        ("llama", "rope.scaling.original_context_length", U32(0), "0"),
        ("qwen2", "rope.freq_base", F32(f32::NAN), "NaN"),
        ("qwen3", "attention.layer_norm_rms_epsilon", F32(-1.0), "-1"),
        ("gemma3", "rope.freq_base_swa", F32(-1.0), "-1"),
        ("granite", "logit_scale", F32(0.0), "0"),
        ("granite", "embedding_scale", F32(f32::NAN), "NaN"),
        ("granite", "residual_scale", F32(f32::INFINITY), "inf"),
    ];
    for (arch, key, value, shown) in cases {
        let err = match load(arch, key, value.clone()) {
            Ok(_) => panic!("{arch}.{key} = {value:?} loaded"),
            Err(e) => e.to_string(),
        };
        let want = format!("{arch}.{key} = {shown}");
        assert!(err.contains(&want), "{arch}.{key} = {value:?}: {err:?} does not name {want:?}");
    }
    // The same files with good values load.
    for arch in ["llama", "qwen2", "qwen3", "gemma3", "granite"] {
        load(arch, "rope.freq_base", Value::F32(10000.0)).unwrap_or_else(|e| panic!("{arch}: {e}"));
    }
}

/// Mixtures of experts: each expert's width and a shared expert's are checked by their own
/// keys, lfm2moe's gating by its key, and every tiny preset (dense or not) loads.
#[test]
fn expert_widths_are_checked_and_every_tiny_preset_loads() {
    use kiln::model::synth::{preset, PRESETS};
    let with = |name: &str, key: &str| {
        let mut spec = preset(name).unwrap();
        spec.metadata.push((key.into(), Value::U32(0)));
        ModelConfig::from_gguf(&GgufFile::from_bytes(spec.build()?.to_bytes())?)
    };
    for (name, key) in [
        ("qwen3moe-tiny", "qwen3moe.expert_feed_forward_length"),
        ("qwen2moe-tiny", "qwen2moe.expert_shared_feed_forward_length"),
    ] {
        let short = key.split_once('.').unwrap().1;
        let err = with(name, short).err().unwrap_or_else(|| panic!("{key} = 0 loaded")).to_string();
        assert!(err.contains(&format!("{key} = 0")), "{name}: {err}");
    }
    // lfm2moe's gating: llama.cpp's enum, and kiln's biased route scores by sigmoid (2).
    for (v, why) in [(0, "1 (softmax) or 2 (sigmoid)"), (1, "needs sigmoid scores"), (3, "1 (softmax) or 2")]
    {
        let mut spec = preset("lfm2moe-tiny").unwrap();
        spec.metadata.push(("expert_gating_func".into(), Value::U32(v)));
        let err = ModelConfig::from_gguf(&GgufFile::from_bytes(spec.build().unwrap().to_bytes()).unwrap())
            .err()
            .unwrap_or_else(|| panic!("expert_gating_func = {v} loaded"))
            .to_string();
        assert!(
            err.contains(&format!("lfm2moe.expert_gating_func = {v}")) && err.contains(why),
            "{v}: {err}"
        );
    }
    for name in PRESETS.iter().filter(|n| n.ends_with("-tiny")) {
        let spec = preset(name).unwrap();
        ModelConfig::from_gguf(&GgufFile::from_bytes(spec.build().unwrap().to_bytes()).unwrap())
            .unwrap_or_else(|e| panic!("{name}: {e}"));
    }
}

/// The engine (and so every command) refuses the file before allocating anything.
#[test]
fn engine_load_refuses_a_nan_rope_base() {
    let spec =
        SynthSpec { metadata: vec![("rope.freq_base".into(), Value::F32(f32::NAN))], ..SynthSpec::default() };
    let path = std::env::temp_dir().join(format!("kiln-nan-rope-{}.gguf", std::process::id()));
    spec.build().unwrap().write_file(&path).unwrap();
    let r = Engine::load(path.to_string_lossy(), EngineOptions::default().with_threads(1));
    let _ = std::fs::remove_file(&path);
    let err = r.err().expect("a NaN rope base loaded").to_string();
    assert!(err.contains("llama.rope.freq_base = NaN"), "{err}");
}

/// `Meta` checks a number by its key's name, so an architecture file gets the check by
/// reading the key: epsilons and RoPE bases above 0, soft caps 0 or more, NaN nowhere.
#[test]
fn the_shared_reader_checks_keys_by_name() {
    use Value::F32;
    let cases: Vec<(&str, Value, Option<&str>)> = vec![
        ("attention.layer_norm_epsilon", F32(-1e-5), Some("-0.00001: must be a finite number above 0")),
        ("attention.group_norm_epsilon", F32(0.0), Some("0: must be a finite number above 0")),
        ("rope.freq_base_swa", F32(f32::INFINITY), Some("inf: must be a finite number above 0")),
        ("attn_logit_softcapping", F32(-50.0), Some("-50: must be a finite number, 0 or more")),
        ("final_logit_softcapping", F32(0.0), None),
        ("rope.scaling.yarn_log_multiplier", F32(f32::NEG_INFINITY), Some("-inf: must be a finite number")),
        ("some_future_key", F32(f32::NAN), Some("NaN: must be a number")),
        ("some_future_key", F32(-3.5), None),
        ("rope.scaling.yarn_ext_factor", F32(-1.0), None),
    ];
    for (key, value, want) in cases {
        let spec = SynthSpec { metadata: vec![(key.into(), value.clone())], ..SynthSpec::default() };
        let g = GgufFile::from_bytes(spec.build().unwrap().to_bytes()).unwrap();
        let m = Meta { g: &g, arch: "llama" };
        match (m.f32(key), want) {
            (Ok(_), None) => {}
            (Err(e), Some(w)) => {
                let want = format!("llama.{key} = {w}");
                assert!(e.to_string().contains(&want), "{key} = {value:?}: {e} does not say {want:?}");
            }
            (r, w) => panic!("{key} = {value:?}: {r:?}, expected {w:?}"),
        }
    }
}
