//! `kiln embed`: hidden states after the final norm, pooled (docs/cli.md). The pooling is the
//! library's (`kiln::embed`), shared with the server's `/v1/embeddings`; the texts are
//! embedded together, several to a forward pass.

use kiln::embed::{embed_batch, normalize, Pooling};
use kiln::KilnError;
use serde_json::json;

use super::common::{print_out, ModelArgs};

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    model: ModelArgs,
    /// Texts to embed, one embedding each.
    #[arg(value_name = "TEXT", required = true)]
    texts: Vec<String>,
    /// mean, cls, last, rank or none (one row per token); default: the model's own
    /// (the file's pooling_type, else mean).
    #[arg(long)]
    pooling: Option<String>,
    /// Scale each embedding (each row, with --pooling none) to unit Euclidean length.
    #[arg(long)]
    normalize: bool,
    /// Cut texts longer than the context to its length (else they are an error).
    #[arg(long)]
    truncate: bool,
    #[arg(long)]
    json: bool,
}

pub fn run(a: Args) -> kiln::Result<()> {
    let engine = a.model.load()?;
    let pooling = match &a.pooling {
        Some(p) => p.parse()?,
        None => Pooling::of(&engine),
    };
    let mut inputs = Vec::with_capacity(a.texts.len());
    for (i, text) in a.texts.iter().enumerate() {
        let mut ids = engine.tokenizer().encode(text, true, true)?;
        if a.truncate {
            ids.truncate(engine.n_ctx());
        } else if ids.len() > engine.n_ctx() {
            return Err(KilnError::invalid(format!(
                "text {i} has {} tokens, more than the context ({}); --truncate cuts it",
                ids.len(),
                engine.n_ctx()
            )));
        }
        inputs.push(ids);
    }
    let refs: Vec<&[u32]> = inputs.iter().map(Vec::as_slice).collect();
    let mut data = embed_batch(&engine, &refs, pooling)?;
    if a.normalize {
        data.iter_mut().flatten().for_each(|r| normalize(r));
    }
    if a.json {
        let items: Vec<_> = data
            .iter()
            .enumerate()
            .map(|(i, rows)| match pooling {
                Pooling::None => json!({"index": i, "embedding": rows}),
                _ => json!({"index": i, "embedding": rows[0]}),
            })
            .collect();
        let width = data.first().and_then(|r| r.first()).map_or(engine.config().n_embd, Vec::len);
        let out = json!({"n_embd": width, "pooling": pooling.as_str(), "data": items});
        print_out(&format!("{out}\n"));
    } else {
        let mut s = String::new();
        for rows in &data {
            for r in rows {
                let line: Vec<String> = r.iter().map(|x| x.to_string()).collect();
                s.push_str(&line.join(" "));
                s.push('\n');
            }
        }
        print_out(&s);
    }
    Ok(())
}
