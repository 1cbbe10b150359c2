//! `kiln perplexity`: llama.cpp's chunked perplexity of a text file.

use kiln::engine::Engine;
use kiln::model::{Entry, OutputKind};
use kiln::KilnError;
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
    let tok = engine.tokenizer();
    let tokens = tok.encode(&text, true, false)?;
    if tokens.len() < 2 * n_ctx {
        return Err(KilnError::invalid(format!(
            "the text has {} tokens; perplexity at context {n_ctx} needs at least {}",
            tokens.len(),
            2 * n_ctx
        )));
    }
    let mut n_chunks = tokens.len() / n_ctx;
    if let Some(k) = a.chunks {
        n_chunks = n_chunks.min(k.max(1));
    }
    let first = n_ctx / 2;
    let (nll, nll2, n_scored) = score(&engine, &tokens, n_ctx, n_chunks, first, a.json)?;
    let mean = nll / n_scored as f64;
    let ppl = mean.exp();
    // llama.cpp's uncertainty estimate of the perplexity.
    let var = (nll2 / n_scored as f64 - mean * mean).max(0.0);
    let ppl_stderr = ppl * (var / (n_scored as f64 - 1.0).max(1.0)).sqrt();
    if a.json {
        let out = json!({"ppl": ppl, "ppl_stderr": ppl_stderr, "nll": mean, "chunks": n_chunks, "n_ctx": n_ctx,
                         "n_batch": n_batch, "n_tokens": tokens.len(), "n_scored": n_scored});
        print_out(&format!("{out}\n"));
    } else {
        print_out(&format!("Final estimate: PPL = {ppl:.4} +/- {ppl_stderr:.5}\n"));
    }
    Ok(())
}

/// Sum of NLL and NLL² over the scored positions of each chunk, and their count.
fn score(
    engine: &Engine,
    tokens: &[u32],
    n_ctx: usize,
    n_chunks: usize,
    first: usize,
    quiet: bool,
) -> kiln::Result<(f64, f64, usize)> {
    let tok = engine.tokenizer();
    let runner = engine.runner();
    let n_vocab = engine.config().n_vocab;
    let (mut nll, mut nll2, mut n) = (0.0f64, 0.0f64, 0usize);
    for c in 0..n_chunks {
        let mut seq_tokens = tokens[c * n_ctx..(c + 1) * n_ctx].to_vec();
        if tok.add_bos() {
            if let Some(bos) = tok.bos() {
                seq_tokens[0] = bos;
            }
        }
        let seq = runner.new_seq();
        let entries: Vec<Entry> = seq_tokens
            .iter()
            .enumerate()
            .map(|(p, &t)| Entry { seq, token: t, output: p >= first && p + 1 < n_ctx })
            .collect();
        let logits = runner.decode(&entries, OutputKind::Logits);
        runner.free_seq(seq);
        let logits = logits?;
        for (row, p) in (first..n_ctx - 1).enumerate() {
            let l = &logits[row * n_vocab..(row + 1) * n_vocab];
            let max = l.iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x));
            let sum: f64 = l.iter().map(|&x| ((x - max) as f64).exp()).sum();
            let v = -((l[seq_tokens[p + 1] as usize] - max) as f64 - sum.ln());
            nll += v;
            nll2 += v * v;
            n += 1;
        }
        if !quiet {
            eprint!("[{}]{:.4} ", c + 1, (nll / n as f64).exp());
        }
    }
    if !quiet {
        eprintln!();
    }
    Ok((nll, nll2, n))
}
