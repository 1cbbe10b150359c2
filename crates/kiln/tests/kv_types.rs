//! Quantized KV caches (`--cache-type-k/-v`): perplexity of every cache type against
//! `llama-perplexity -ctk T -ctv T` on the same file, a greedy run through two context
//! shifts with a q8_0 K cache against llama-completion's, batch invariance and exact prefix
//! reuse over quantized caches, and clear errors for caches a model cannot have.

mod support;

use kiln::quant::GgmlType;
use kiln::{Engine, EngineOptions, SessionOptions};
use support::*;

fn engine(name: &str, opts: EngineOptions, k: GgmlType, v: GgmlType) -> Engine {
    let opts = opts.with_threads(2).with_kv_types(k, v);
    Engine::load(model(name).to_str().unwrap(), opts).unwrap()
}

/// Perplexity at ctx 512 with both caches of each type, within 1% of llama.cpp's with the
/// same types (fixture: scripts/gen-kv-types-fixture); q8_0 within 0.5% of f16 (beyond
/// llama.cpp's own gap).
fn perplexity(m: &RealModel) {
    if !m.enabled() {
        return;
    }
    let fx = fixture_json("oracle/kv_types_ppl.json");
    let tokens = ids(&fixture_json(&format!("oracle/{}/perplexity.json", m.stem))["token_ids"]);
    let cases = fx["models"][m.stem].as_object().unwrap_or_else(|| panic!("no cases for {}", m.stem));
    let ctx = fx["ctx"].as_u64().unwrap() as usize;
    let mut mine = std::collections::HashMap::new();
    for (name, want) in cases {
        // The fast tier: f16, q8_0 and q4_0; every type under KILN_FULL=1.
        if !full() && !["f16", "q8_0", "q4_0"].contains(&name.as_str()) {
            continue;
        }
        let ty = kiln::kv::cache_type(name).unwrap();
        let e = engine(m.name, EngineOptions::default().with_n_ctx(ctx).with_batch(ctx), ty, ty);
        let r = kiln::eval::perplexity(&e, &tokens, ctx, None).unwrap();
        let want = want.as_f64().unwrap();
        let rel = ppl_vs_llama_cpp(&format!("{} {name}", m.name), r.ppl, want);
        // Past the first 256 keys kiln's attention turns to f32 blocks (llama.cpp keeps
        // ggml's per-key arithmetic): with both caches 4-bit the perplexity moves by up to
        // about 2% with the arithmetic (kiln's own f32 and ggml modes differ as much),
        // while at ctx 256 it is llama.cpp's to 4 digits (below). The 1% bound holds for
        // every other type.
        let tol = if name == "q4_0" || name == "iq4_nl" { 0.025 } else { 0.01 };
        assert!(rel <= tol, "{} {name}: ppl {} vs llama.cpp's {want}", m.name, r.ppl);
        mine.insert(name.clone(), r.ppl);
    }
    // q8_0 against f16: within 0.5%, beyond llama.cpp's own gap where the model has one
    // (qwen2.5's keys have outliers that even q8_0 blocks feel: +0.85% in llama.cpp).
    let (f16, q8) = (mine["f16"], mine["q8_0"]);
    let theirs = cases["q8_0"].as_f64().unwrap() / cases["f16"].as_f64().unwrap() - 1.0;
    let gap = (q8 - f16) / f16;
    eprintln!("{}: q8_0 against f16 {:+.2}% (llama.cpp {:+.2}%)", m.name, 100.0 * gap, 100.0 * theirs);
    assert!(gap.abs() <= 0.005 + theirs.max(0.0), "{}: q8_0 ppl {q8} vs f16 {f16}", m.name);
}

#[test]
fn smollm2_perplexity_per_cache_type_matches_llama_cpp() {
    perplexity(&SMOLLM2);
}

/// Inside one 256-key chunk kiln's attention over quantized caches is ggml's arithmetic:
/// perplexity at ctx 256 equals llama.cpp's to its printed digits.
#[test]
fn smollm2_perplexity_at_ctx_256_is_llama_cpps() {
    let fx = fixture_json("oracle/kv_types_ppl.json");
    let tokens = ids(&fixture_json(&format!("oracle/{}/perplexity.json", SMOLLM2.stem))["token_ids"]);
    for (types, want) in fx["ctx_256"][SMOLLM2.stem].as_object().unwrap() {
        let (k, v) = types.split_once('/').unwrap();
        let (k, v) = (kiln::kv::cache_type(k).unwrap(), kiln::kv::cache_type(v).unwrap());
        let e = engine(SMOLLM2.name, EngineOptions::default().with_n_ctx(256).with_batch(256), k, v);
        let r = kiln::eval::perplexity(&e, &tokens, 256, None).unwrap();
        let want = want.as_f64().unwrap();
        eprintln!("smollm2 ctx 256 {types}: kiln {:.4}, llama.cpp {want:.4}", r.ppl);
        assert!((r.ppl - want).abs() <= 1e-4 * want, "{types}: ppl {} vs llama.cpp's {want}", r.ppl);
    }
}

#[test]
fn gemma3_perplexity_per_cache_type_matches_llama_cpp() {
    perplexity(&RealModel { slow: true, ..GEMMA3 });
}

#[test]
fn qwen05_perplexity_per_cache_type_matches_llama_cpp() {
    perplexity(&RealModel { slow: true, ..QWEN05 });
}

/// Re-rotation of quantized keys (dequantized, rotated back by the cache's Hadamard
/// transform, roped, rotated and quantized again, as llama.cpp's K-shift): a greedy run
/// through two shifts gives llama-completion's text with `-ctk q8_0` (fixture:
/// scripts/gen-shift-fixture.sh).
#[test]
fn context_shift_with_q8_0_keys_matches_llama_cpp() {
    let fx = fixture_json("shift/smollm2_ctk_q8_0.json");
    let n_ctx = fx["n_ctx"].as_u64().unwrap() as usize;
    let e = engine(SMOLLM2.name, EngineOptions::default().with_n_ctx(n_ctx), GgmlType::Q8_0, GgmlType::F16);
    shifted_completion_matches(&e, &fx);
}

/// Over quantized caches a token's logits are still the same bits whatever its batch.
#[test]
fn quantized_caches_keep_batch_invariance() {
    for (k, v) in [(GgmlType::Q8_0, GgmlType::Q8_0), (GgmlType::Q4_0, GgmlType::Q5_1)] {
        let opts = EngineOptions::default().with_n_ctx(256).with_batch(128).with_n_seq(2);
        let e = engine(SMOLLM2.name, opts, k, v);
        let alone = last_logits(&e, &[1; 72], false);
        for (sizes, noise) in
            [(vec![7; 10].into_iter().chain([2]).collect::<Vec<_>>(), true), (vec![8, 64], false)]
        {
            let got = last_logits(&e, &sizes, noise);
            let diff = bits_differ(&alone, &got);
            assert_eq!(
                diff, 0,
                "{k}/{v}, batches {sizes:?}: {diff} logits differ from the token-by-token run"
            );
        }
    }
}

/// A session starting with another's tokens reuses its quantized blocks, and its logits
/// are those of a run without any cache.
#[test]
fn prefix_reuse_over_quantized_caches_is_exact() {
    let (k, v) = (GgmlType::Q8_0, GgmlType::Q4_0);
    let e = engine(SMOLLM2.name, EngineOptions::default().with_n_ctx(512).with_n_seq(2), k, v);
    let prompt = spread_tokens(150, e.config().n_vocab);
    let mut a = e.session(SessionOptions::default()).unwrap();
    a.append_tokens(&prompt[..140]).unwrap();
    let mut b = e.session(SessionOptions::default()).unwrap();
    b.append_tokens(&prompt).unwrap();
    assert_eq!(b.n_evaluated(), 150 - 128, "four whole blocks reused");
    let fresh =
        engine(SMOLLM2.name, EngineOptions::default().with_n_ctx(512).with_prefix_cache_tokens(0), k, v);
    let mut f = fresh.session(SessionOptions::default()).unwrap();
    f.append_tokens(&prompt).unwrap();
    assert_eq!(f.logits().unwrap(), b.logits().unwrap());
    e.runner().check_kv().unwrap();
}

/// KV bytes per token: q8_0 takes 34/64 of f16 (≤ 54%), q4_0 18/64.
#[test]
fn quantized_caches_take_fewer_bytes() {
    let f16 = engine(SMOLLM2.name, EngineOptions::default().with_n_ctx(64), GgmlType::F16, GgmlType::F16);
    let q8 = engine(SMOLLM2.name, EngineOptions::default().with_n_ctx(64), GgmlType::Q8_0, GgmlType::Q8_0);
    let cfg = f16.config();
    assert_eq!(f16.runner().kv_bytes_per_token(), cfg.n_layer * 2 * 2 * cfg.kv_dim());
    assert_eq!(q8.runner().kv_bytes_per_token() * 64, f16.runner().kv_bytes_per_token() * 34);
}

/// A head size that is not whole blocks, and a type that is no cache type: errors that say
/// so, at load.
#[test]
fn caches_a_model_cannot_have_are_refused() {
    let path = model(SMOLLM2.name);
    let opts = EngineOptions::default().with_n_ctx(64).with_kv_types(GgmlType::Q4_K, GgmlType::F16);
    let e = Engine::load(path.to_str().unwrap(), opts).err().expect("Q4_K is no cache type").to_string();
    assert!(e.contains("not a KV cache type"), "{e}");
    let e = kiln::kv::cache_type("q3_k").unwrap_err().to_string();
    assert!(e.contains("unknown KV cache type") && e.contains("q8_0"), "{e}");
}
