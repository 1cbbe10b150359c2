//! `kiln perplexity`: llama.cpp's chunked perplexity of a text file.

use serde_json::json;

use super::common::{print_out, ModelArgs, TextArgs};

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    model: ModelArgs,
    #[command(flatten)]
    text: TextArgs,
    /// Score only the first K chunks.
    #[arg(long)]
    chunks: Option<usize>,
    #[arg(long)]
    json: bool,
}

pub fn run(mut a: Args) -> kiln::Result<()> {
    let mut text = a.text.require()?;
    if text.ends_with('\n') {
        text.pop();
    }
    let n_ctx = a.model.ctx_size.unwrap_or(512);
    let n_batch = a.model.batch_size.unwrap_or(n_ctx);
    a.model.ctx_size = Some(n_ctx);
    a.model.batch_size = Some(n_batch.min(n_ctx));
    let engine = a.model.load()?;
    // BOS per the model, special tokens not parsed (llama-perplexity).
    let tokens = engine.tokenizer().encode(&text, true, false)?;
    let r = kiln::eval::perplexity(&engine, &tokens, n_ctx, a.chunks)?;
    if a.json {
        let out = json!({"ppl": r.ppl, "ppl_stderr": r.ppl_stderr, "nll": r.nll, "chunks": r.n_chunks,
                         "n_ctx": n_ctx, "n_batch": n_batch, "n_tokens": tokens.len(), "n_scored": r.n_scored});
        print_out(&format!("{out}\n"));
    } else {
        let running: Vec<String> =
            r.running.iter().enumerate().map(|(i, p)| format!("[{}]{p:.4}", i + 1)).collect();
        eprintln!("{}", running.join(" "));
        print_out(&format!("Final estimate: PPL = {:.4} +/- {:.5}\n", r.ppl, r.ppl_stderr));
    }
    Ok(())
}
