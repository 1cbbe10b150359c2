//! Token ids equal llama.cpp's (`llama-tokenize`, BOS per model, special tokens parsed) on
//! the four real models, plus properties that hold on any text: decoding and streaming.

use std::path::PathBuf;
use std::sync::Arc;

use kiln::gguf::GgufFile;
use kiln::tokenizer::Tokenizer;

fn fixture(stem: &str) -> serde_json::Value {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join(format!("../../tests/fixtures/tokenizer/{stem}.tokenize.json"));
    serde_json::from_slice(&std::fs::read(p).unwrap()).unwrap()
}

fn load(stem: &str) -> Option<Arc<Tokenizer>> {
    let path = kiln::hub::kiln_home().join("models").join(format!("{stem}.gguf"));
    if !path.exists() {
        eprintln!("skipping {stem}: {} is absent", path.display());
        return None;
    }
    let g = GgufFile::open(&path).unwrap();
    Some(Arc::new(Tokenizer::from_gguf(&g).unwrap()))
}

fn check(stem: &str) {
    let Some(tok) = load(stem) else { return };
    let f = fixture(stem);
    assert_eq!(tok.add_bos(), f["add_bos"].as_bool().unwrap(), "add_bos");
    assert_eq!(tok.bos(), f["bos_id"].as_u64().map(|b| b as u32), "bos");
    let mut bad = Vec::new();
    for case in f["cases"].as_array().unwrap() {
        let text = case["text"].as_str().unwrap();
        let want: Vec<u32> =
            case["ids"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as u32).collect();
        let got = tok.encode(text, true, true).unwrap();
        if got != want {
            bad.push(format!("{}: {text:?}\n   want {want:?}\n    got {got:?}", case["name"]));
        }
        // Streaming decode equals decoding at once, with and without control tokens.
        for special in [false, true] {
            let mut d = tok.detokenizer(special);
            let mut streamed: String = got.iter().map(|&id| d.push(id)).collect();
            streamed.push_str(&d.finish());
            assert_eq!(streamed, tok.decode(&got, special), "{}", case["name"]);
        }
        // Without BOS and with special tokens rendered, decoding gives the text back.
        let ids = tok.encode(text, false, true).unwrap();
        assert_eq!(tok.decode(&ids, true), *text, "round trip of {}", case["name"]);
    }
    assert!(bad.is_empty(), "{stem}: {} cases differ:\n{}", bad.len(), bad.join("\n"));
}

#[test]
fn smollm2() {
    check("SmolLM2-135M-Instruct.Q4_1");
}

#[test]
fn gemma3() {
    check("gemma-3-270m-q4_k_m");
}

#[test]
fn qwen25_coder_05b() {
    check("qwen2.5-coder-0.5b-instruct-q4_k_m");
}

#[test]
fn qwen25_coder_15b() {
    check("qwen2.5-coder-1.5b-instruct-q4_k_m");
}

#[test]
fn eog_sets() {
    let sets: [(&str, &[u32]); 3] = [
        ("SmolLM2-135M-Instruct.Q4_1", &[0, 2, 4]),
        ("gemma-3-270m-q4_k_m", &[1, 106, 212]),
        ("qwen2.5-coder-0.5b-instruct-q4_k_m", &[128247, 151643, 151645, 151662, 151663, 151664]),
    ];
    for (stem, want) in sets {
        let Some(tok) = load(stem) else { continue };
        assert_eq!(tok.eog_ids(), want, "{stem}");
        for &id in want {
            assert!(tok.is_eog(id) && tok.is_control(id), "{stem} {id}");
            assert_eq!(tok.token_to_piece(id, false), b"", "{stem} {id}");
        }
    }
}

#[test]
fn qwen_space_before_special() {
    let Some(tok) = load("qwen2.5-coder-0.5b-instruct-q4_k_m") else { return };
    assert_eq!(tok.encode(" then </s>", false, true).unwrap(), [1221, 220, 128247]);
}

#[test]
fn gemma_byte_fallback_streams_whole_characters() {
    let Some(tok) = load("gemma-3-270m-q4_k_m") else { return };
    // A private-use character missing from the vocabulary: one byte-fallback token per
    // byte (`<0x00>`..`<0xFF>` are ids 238..=493).
    let (c, ids) = ('\u{E000}'..='\u{F8FF}')
        .map(|c| (c, tok.encode(&c.to_string(), false, false).unwrap()))
        .find(|(_, ids)| ids.len() == 3)
        .expect("some private-use character falls back to bytes");
    let mut utf8 = [0u8; 4];
    let want: Vec<u32> = c.encode_utf8(&mut utf8).bytes().map(|b| 238 + b as u32).collect();
    assert_eq!(ids, want);
    let mut d = tok.detokenizer(false);
    assert_eq!(d.push(ids[0]), "");
    assert_eq!(d.push(ids[1]), "");
    assert_eq!(d.push(ids[2]), c.to_string());
    // A lone continuation byte is invalid at once; a cut-off character shows at finish.
    assert_eq!(d.push(238 + 0x80), "\u{FFFD}");
    assert_eq!(d.push(238 + 0xE2), "");
    assert_eq!(d.finish(), "\u{FFFD}");
}
