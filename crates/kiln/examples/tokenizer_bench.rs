//! Encoding speed on English text, one thread: `scripts/bench_tokenizer.sh [GGUF...]`.
//! Default: the cached real models and, if present, llama.cpp's vocab files.

use std::path::PathBuf;
use std::time::Instant;

use kiln::gguf::GgufFile;
use kiln::tokenizer::Tokenizer;

fn main() -> kiln::Result<()> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let sample = std::fs::read_to_string(root.join("tests/fixtures/tokenizer/english.txt"))
        .map_err(|e| kiln::KilnError::io("english.txt", e))?;
    // About 2 MB: paragraphs of the sample, in a changing order, so runs do not repeat exactly.
    let paras: Vec<&str> = sample.split("\n\n").collect();
    let mut text = String::new();
    let mut k = 0usize;
    while text.len() < 2_000_000 {
        k = (k * 7 + 3) % paras.len();
        text.push_str(paras[k]);
        text.push_str("\n\n");
    }
    let mut paths: Vec<PathBuf> = std::env::args().skip(1).map(PathBuf::from).collect();
    if paths.is_empty() {
        let models = kiln::hub::kiln_home().join("models");
        for m in ["SmolLM2-135M-Instruct.Q4_1", "qwen2.5-coder-0.5b-instruct-q4_k_m", "gemma-3-270m-q4_k_m"] {
            paths.push(models.join(format!("{m}.gguf")));
        }
        if let Ok(src) = kiln::hub::llama_cpp_source() {
            for v in ["llama-bpe", "gpt-2", "llama-spm", "bert-bge", "deepseek-llm", "gemma-4"] {
                paths.push(src.join(format!("vendor/llama.cpp/models/ggml-vocab-{v}.gguf")));
            }
        }
    }
    println!("text: {:.2} MB of English", text.len() as f64 / 1e6);
    for p in paths.iter().filter(|p| p.exists()) {
        let g = GgufFile::open(p)?;
        let t0 = Instant::now();
        let tok = Tokenizer::from_gguf(&g)?;
        let load = t0.elapsed().as_secs_f64();
        let mut best = f64::MAX;
        let mut n = 0;
        for _ in 0..3 {
            let t = Instant::now();
            n = tok.encode(&text, false, true)?.len();
            best = best.min(t.elapsed().as_secs_f64());
        }
        let name = p.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
        println!(
            "{name:<40} {:>7.2} MB/s  {n:>8} tokens  ({:.0} ms best of 3; load {:.0} ms)",
            text.len() as f64 / 1e6 / best,
            best * 1e3,
            load * 1e3
        );
    }
    Ok(())
}
