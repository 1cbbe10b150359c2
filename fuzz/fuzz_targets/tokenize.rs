//! Text from users and requests goes through the tokenizers: `encode` of any text (special
//! tokens parsed or not, BOS or not) on every vocabulary of llama.cpp's tokenizer tests
//! (`kiln::hub::llama_cpp_source`, as `tests/tokenizer_vocab.rs`), then `decode` and the
//! streaming detokenizer of the ids, must not panic. The first input byte picks the
//! vocabulary; the rest is the text.

#![no_main]

use std::sync::{Arc, OnceLock};

use kiln::gguf::GgufFile;
use kiln::tokenizer::Tokenizer;
use libfuzzer_sys::fuzz_target;

fn vocabs() -> &'static [Arc<Tokenizer>] {
    static V: OnceLock<Vec<Arc<Tokenizer>>> = OnceLock::new();
    V.get_or_init(|| {
        let dir = kiln::hub::llama_cpp_source().expect("llama.cpp source").join("vendor/llama.cpp/models");
        let mut paths: Vec<_> = std::fs::read_dir(&dir)
            .expect("models dir")
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with("ggml-vocab-")))
            .filter(|p| p.extension().is_some_and(|e| e == "gguf"))
            .collect();
        paths.sort();
        // Vocabularies kiln does not support give an error, not a panic; those are skipped.
        paths
            .iter()
            .filter_map(|p| Tokenizer::from_gguf(&GgufFile::open(p).ok()?).ok())
            .map(Arc::new)
            .collect()
    })
}

fuzz_target!(|data: &[u8]| {
    let Some((&pick, text)) = data.split_first() else { return };
    let v = vocabs();
    let tok = &v[pick as usize % v.len()];
    let text = String::from_utf8_lossy(text);
    for (add, parse) in [(false, false), (true, true)] {
        let Ok(ids) = tok.encode(&text, add, parse) else { continue };
        let _ = tok.decode(&ids, parse);
        let mut d = tok.detokenizer(parse);
        for &id in &ids {
            let _ = d.push(id);
        }
        let _ = d.finish();
    }
});
