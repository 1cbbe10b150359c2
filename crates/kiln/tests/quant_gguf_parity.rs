//! kiln's dequantization against gguf-py's (`gguf.quants.dequantize`), bit for bit.
//! Fixtures come from scripts/gen-quant-fixtures.py; manifest.json records the gguf version.

use std::path::PathBuf;

use kiln::gguf::GgufFile;
use kiln::quant::{dequantize_row, GgmlType};
use sha2::{Digest, Sha256};

fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/quant")
}

fn manifest() -> serde_json::Value {
    let text = std::fs::read_to_string(fixtures().join("manifest.json")).expect("manifest.json");
    serde_json::from_str(&text).expect("manifest.json parses")
}

fn to_le_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[test]
fn random_blocks_match_gguf_py() {
    let m = manifest();
    let random = m["random"].as_object().expect("random");
    let mut checked = Vec::new();
    for (name, n) in random {
        let ty = GgmlType::from_name(name).expect("known type");
        let n = n.as_u64().unwrap() as usize;
        let q = std::fs::read(fixtures().join(format!("random/{name}.q"))).unwrap();
        let want = std::fs::read(fixtures().join(format!("random/{name}.f32"))).unwrap();
        let mut got = vec![0f32; n];
        dequantize_row(ty, &q, &mut got).unwrap();
        let got = to_le_bytes(&got);
        if let Some(i) = got.chunks(4).zip(want.chunks(4)).position(|(a, b)| a != b) {
            let f = |b: &[u8]| f32::from_le_bytes([b[4 * i], b[4 * i + 1], b[4 * i + 2], b[4 * i + 3]]);
            panic!("{name}: element {i} differs: kiln {:e}, gguf-py {:e}", f(&got), f(&want));
        }
        assert_eq!(got.len(), want.len(), "{name}");
        checked.push(name.clone());
    }
    // Every type kiln dequantizes is either checked here or one gguf-py cannot do.
    let unsupported: Vec<&str> =
        m["gguf_unsupported"].as_array().unwrap().iter().map(|v| v.as_str().unwrap()).collect();
    for ty in kiln::quant::ALL_TYPES.iter().filter(|t| t.is_supported()) {
        assert!(
            checked.iter().any(|c| c == ty.name()) || unsupported.contains(&ty.name()),
            "{ty} has no gguf-py fixture"
        );
    }
    println!("bit-exact with gguf-py {} for {checked:?}", m["gguf_version"]);
}

#[test]
fn real_model_tensors_match_gguf_py() {
    let m = manifest();
    let models = m["models"].as_object().expect("models");
    assert!(!models.is_empty(), "manifest lists no model tensors");
    let dir = kiln::hub::kiln_home().join("models");
    let mut types_seen = std::collections::BTreeSet::new();
    for (file, entries) in models {
        let path = dir.join(file);
        if !path.is_file() {
            println!("note: {} is not cached; skipping its tensors", path.display());
            continue;
        }
        let gguf = GgufFile::open(&path).unwrap();
        for e in entries.as_array().unwrap() {
            let name = e["tensor"].as_str().unwrap();
            let ty = GgmlType::from_name(e["type"].as_str().unwrap()).unwrap();
            let n = e["n"].as_u64().unwrap() as usize;
            let info = gguf.tensor(name).unwrap_or_else(|| panic!("{file}: no tensor {name}"));
            assert_eq!(info.ty, ty, "{file}: {name}");
            let data = gguf.tensor_data(info);
            assert_eq!(
                hex(&Sha256::digest(data)),
                e["input_sha256"].as_str().unwrap(),
                "{file}: {name}: the cached model differs from the one the fixture was made from"
            );
            let mut out = vec![0f32; n];
            dequantize_row(ty, data, &mut out).unwrap();
            let first: Vec<u64> =
                e["first_bits"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap()).collect();
            let got_first: Vec<u64> = out.iter().take(first.len()).map(|v| v.to_bits() as u64).collect();
            assert_eq!(got_first, first, "{file}: {name}: first values");
            assert_eq!(
                hex(&Sha256::digest(to_le_bytes(&out))),
                e["sha256"].as_str().unwrap(),
                "{file}: {name}"
            );
            types_seen.insert(ty.name());
        }
    }
    println!("real tensors bit-exact with gguf-py for types {types_seen:?}");
}
