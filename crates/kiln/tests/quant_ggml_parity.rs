//! kiln's quantizers and dot products against ggml itself, bit for bit: the fixtures
//! (scripts/gen-quant-fixtures.py) hold what gguf-py and ggml's C code (quantize_row_*_ref,
//! the x86 activation quantizers, the generic vec_dot) produce for two fixed rows.

use std::path::PathBuf;

use kiln::quant::{quantize_activation, quantize_row, vec_dot, GgmlType};

fn dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/quant")
}

fn manifest() -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(dir().join("manifest.json")).unwrap()).unwrap()
}

fn read_f32(name: &str) -> Vec<f32> {
    let b = std::fs::read(dir().join("quantize").join(name)).unwrap();
    b.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()
}

fn first_difference(a: &[u8], b: &[u8]) -> Option<usize> {
    a.iter().zip(b).position(|(x, y)| x != y).or((a.len() != b.len()).then_some(a.len().min(b.len())))
}

#[test]
fn reference_quantizers_match_ggml() {
    let m = manifest();
    let x = read_f32("input.f32");
    let oracle = m["quantize"]["oracle"].as_object().unwrap();
    for (name, by) in oracle {
        let ty = GgmlType::from_name(name).unwrap();
        let want = std::fs::read(dir().join(format!("quantize/{name}.q"))).unwrap();
        let mut got = vec![0u8; ty.row_size(x.len()).unwrap()];
        quantize_row(ty, &x, &mut got).unwrap();
        if let Some(i) = first_difference(&got, &want) {
            panic!("{name}: byte {i} (block {}) differs from {by}", i / ty.type_size());
        }
    }
    println!("quantize_row bit-exact for {:?}", oracle.keys().collect::<Vec<_>>());
}

#[test]
fn activation_quantizers_match_ggml_x86() {
    let m = manifest();
    let y = read_f32("input2.f32");
    for name in m["quantize"]["activations"].as_array().unwrap() {
        let name = name.as_str().unwrap();
        let ty = GgmlType::from_name(name).unwrap();
        let want = std::fs::read(dir().join(format!("activation/{name}.q"))).unwrap();
        let mut got = vec![0u8; ty.row_size(y.len()).unwrap()];
        quantize_activation(ty, &y, &mut got).unwrap();
        if let Some(i) = first_difference(&got, &want) {
            panic!("{name}: byte {i} (block {}) differs from ggml", i / ty.type_size());
        }
    }
}

#[test]
fn vec_dot_matches_ggml_generic() {
    let m = manifest();
    let n = m["quantize"]["n"].as_u64().unwrap() as usize;
    let dots = m["quantize"]["vec_dot_bits"].as_object().unwrap();
    for (name, bits) in dots {
        let ty = GgmlType::from_name(name).unwrap();
        let w = std::fs::read(dir().join(format!("quantize/{name}.q"))).unwrap();
        let a = std::fs::read(dir().join(format!("activation/{}.q", ty.vec_dot_type().name()))).unwrap();
        let want = f32::from_bits(bits.as_u64().unwrap() as u32);
        let got = vec_dot(ty, &w, &a, n);
        assert_eq!(got.to_bits(), want.to_bits(), "{name}: kiln {got} ggml {want}");
    }
    println!("vec_dot bit-exact with ggml's generic code for {:?}", dots.keys().collect::<Vec<_>>());
}
