//! Properties on generated text for every vocabulary: no panics, ids in range, byte-level
//! and byte-fallback tokenizers lose nothing, streaming decode equals decode.

use std::path::PathBuf;
use std::sync::Arc;

use kiln::gguf::GgufFile;
use kiln::tokenizer::Tokenizer;

const POOL: &[&str] = &[
    "a",
    "Z",
    "the",
    " quick",
    "DON'T",
    "'s",
    "'LL",
    "'ve",
    "'",
    "7",
    "42",
    "1234567",
    "³",
    "½",
    "Ⅻ",
    " ",
    "  ",
    "\t",
    "\n",
    "\r\n",
    "\n\n\n",
    "\u{a0}",
    "\u{3000}",
    "\u{2028}",
    "\u{85}",
    "\u{1c}",
    "\u{200b}",
    "\u{200d}",
    "\u{feff}",
    "\u{ad}",
    "e\u{301}",
    "\u{301}",
    "é",
    "ß",
    "İ",
    "Ω",
    "你好",
    "世界",
    "한국어",
    "ﾃｽﾄ",
    "ｱ",
    "мир",
    "नमस्ते",
    "ع",
    "👍",
    "👨\u{200d}👩\u{200d}👧",
    "🇯🇵",
    "\u{e000}",
    "\u{10ffff}",
    "\u{378}",
    "$",
    "+",
    "<",
    "=>",
    "^",
    "`",
    "|",
    "~",
    "...",
    "!?",
    "(",
    "]",
    "{",
    "}",
    "_",
    "-",
    "@",
    "#",
    "%",
    "&",
    "*",
    "/",
    "\\",
    "\"",
    "<s>",
    "</s>",
    "<unk>",
    "<|im_start|>",
    "<|im_end|>",
    "<|endoftext|>",
    "<start_of_turn>",
    "<bos>",
    "<|im_start",
    "[CLS]",
    "[SEP]",
    "<|begin_of_text|>",
    "<tool_call>",
    "<b>",
    "<table>",
    "<|assistant|>",
    "<|end|>",
    "\u{0}",
    "\u{7f}",
    "\u{fffd}",
];

/// A deterministic generator (xorshift) of texts made from the pool.
fn texts() -> Vec<String> {
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let mut out = vec![String::new(), " ".repeat(300), "\n".repeat(70), "a".repeat(5000), "1".repeat(100)];
    for _ in 0..300 {
        let n = 1 + next() % 24;
        out.push((0..n).map(|_| POOL[(next() % POOL.len() as u64) as usize]).collect());
    }
    out
}

fn vocab_paths() -> Vec<PathBuf> {
    let mut v = Vec::new();
    if let Ok(src) = kiln::hub::llama_cpp_source() {
        for name in [
            "bert-bge",
            "command-r",
            "deepseek-coder",
            "deepseek-llm",
            "falcon",
            "gemma-4",
            "gpt-2",
            "llama-bpe",
            "llama-spm",
            "mpt",
            "phi-3",
            "qwen2",
            "qwen35",
            "refact",
            "starcoder",
        ] {
            v.push(src.join(format!("vendor/llama.cpp/models/ggml-vocab-{name}.gguf")));
        }
    }
    let models = kiln::hub::kiln_home().join("models");
    for m in ["SmolLM2-135M-Instruct.Q4_1", "gemma-3-270m-q4_k_m", "qwen2.5-coder-0.5b-instruct-q4_k_m"] {
        v.push(models.join(format!("{m}.gguf")));
    }
    v.retain(|p| {
        let ok = p.exists();
        if !ok {
            eprintln!("skipping {}", p.display());
        }
        ok
    });
    v
}

#[test]
fn generated_texts() {
    let texts = texts();
    for path in vocab_paths() {
        let name = path.file_stem().unwrap().to_string_lossy().into_owned();
        let tok = Arc::new(Tokenizer::from_gguf(&GgufFile::open(&path).unwrap()).unwrap());
        // Byte-level BPE and SentencePiece without a space prefix reproduce any text, but
        // falcon's vocabulary lacks a few byte tokens (llama.cpp drops those bytes too).
        let lossless = !["bert-bge", "llama-spm", "phi-3", "falcon"].iter().any(|v| name.ends_with(v));
        for text in &texts {
            for (add, parse) in [(false, false), (true, true), (false, true)] {
                let ids = tok.encode(text, add, parse).unwrap();
                assert!(ids.iter().all(|&id| (id as usize) < tok.n_vocab()), "{name}: {text:?}");
                let decoded = tok.decode(&ids, true);
                if lossless && !add {
                    assert_eq!(&decoded, text, "{name}: parse_special {parse}");
                }
                let mut d = tok.detokenizer(true);
                let mut streamed: String = ids.iter().map(|&id| d.push(id)).collect();
                streamed.push_str(&d.finish());
                assert_eq!(streamed, decoded, "{name}");
            }
        }
    }
}

#[test]
fn unknown_pre_tokenizer_is_named() {
    let Some(path) = vocab_paths().into_iter().find(|p| p.ends_with("ggml-vocab-gpt-2.gguf")) else { return };
    let mut g = GgufFile::open(&path).unwrap();
    for (k, v) in g.metadata.iter_mut() {
        if k == "tokenizer.ggml.pre" {
            *v = kiln::gguf::Value::String("no-such-pre".into());
        }
    }
    let err = Tokenizer::from_gguf(&g).unwrap_err().to_string();
    assert!(err.contains("no-such-pre") && err.contains("tokenizer.ggml.pre"), "{err}");
}

#[test]
fn unsupported_model_is_named() {
    let Ok(src) = kiln::hub::llama_cpp_source() else { return };
    // nomic-bert-moe's vocabulary is a SentencePiece unigram model (`t5`), which kiln lacks.
    let g = GgufFile::open(src.join("vendor/llama.cpp/models/ggml-vocab-nomic-bert-moe.gguf")).unwrap();
    let err = Tokenizer::from_gguf(&g).unwrap_err().to_string();
    assert!(err.contains("t5") && err.contains("tokenizer.ggml.model"), "{err}");
}
