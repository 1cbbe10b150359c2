//! Token ids equal llama.cpp's on its own vocabulary test vectors (the `ggml-vocab-*.gguf`
//! files of the llama.cpp source; inputs and expected ids copied into tests/fixtures):
//! no BOS, special tokens not parsed, as llama.cpp's test-tokenizer-0 runs them.

use std::path::PathBuf;

use kiln::gguf::GgufFile;
use kiln::tokenizer::Tokenizer;

fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/tokenizer")
}

/// (input, expected ids) pairs of one vocabulary.
fn cases(name: &str) -> Vec<(String, Vec<u32>)> {
    let inp = std::fs::read(fixtures().join(format!("ggml-vocab-{name}.gguf.inp"))).unwrap();
    let out = std::fs::read_to_string(fixtures().join(format!("ggml-vocab-{name}.gguf.out"))).unwrap();
    let inp = String::from_utf8(inp).unwrap();
    let sep = "\n__ggml_vocab_test__\n";
    let mut inputs = Vec::new();
    let mut pos = 0;
    while pos < inp.len() {
        match inp[pos..].find(sep) {
            Some(n) => {
                inputs.push(inp[pos..pos + n].to_string());
                pos += n + sep.len();
            }
            None => {
                inputs.push(inp[pos..].to_string());
                break;
            }
        }
    }
    let outputs: Vec<Vec<u32>> =
        out.lines().map(|l| l.split_whitespace().map(|t| t.parse().unwrap()).collect()).collect();
    assert_eq!(inputs.len(), outputs.len(), "{name}: inputs and outputs differ in count");
    inputs.into_iter().zip(outputs).collect()
}

fn check(name: &str) {
    let path = match kiln::hub::llama_cpp_source() {
        Ok(root) => root.join(format!("vendor/llama.cpp/models/ggml-vocab-{name}.gguf")),
        Err(e) => {
            eprintln!("skipping {name}: {e}");
            return;
        }
    };
    let g = GgufFile::open(&path).unwrap();
    let tok = Tokenizer::from_gguf(&g).unwrap();
    let mut bad = Vec::new();
    let cases = cases(name);
    for (text, want) in &cases {
        let got = tok.encode(text, false, false).unwrap();
        if &got != want {
            bad.push(format!("{text:?}\n   want {want:?}\n    got {got:?}"));
        }
    }
    assert!(bad.is_empty(), "{name}: {} of {} differ:\n{}", bad.len(), cases.len(), bad.join("\n"));
}

macro_rules! vocab_tests {
    ($($test:ident => $name:literal),* $(,)?) => {
        $(#[test] fn $test() { check($name); })*
    };
}

vocab_tests! {
    bert_bge => "bert-bge",
    command_r => "command-r",
    deepseek_coder => "deepseek-coder",
    deepseek_llm => "deepseek-llm",
    falcon => "falcon",
    gemma_4 => "gemma-4",
    gpt_2 => "gpt-2",
    llama_bpe => "llama-bpe",
    llama_spm => "llama-spm",
    mpt => "mpt",
    phi_3 => "phi-3",
    qwen2 => "qwen2",
    qwen35 => "qwen35",
    refact => "refact",
    starcoder => "starcoder",
}
