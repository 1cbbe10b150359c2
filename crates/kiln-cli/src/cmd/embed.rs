//! `kiln embed`: hidden states after the final norm, pooled (docs/cli.md). The pooling is the
//! library's (`kiln::embed`), shared with the server's `/v1/embeddings`.

use kiln::embed::{embed_tokens, normalize, Pooling};
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
    /// mean, last or none (one row per token).
    #[arg(long, default_value = "mean")]
    pooling: String,
    /// Scale each embedding (each row, with --pooling none) to unit Euclidean length.
    #[arg(long)]
    normalize: bool,
    #[arg(long)]
    json: bool,
}

pub fn run(a: Args) -> kiln::Result<()> {
    let pooling: Pooling = a.pooling.parse()?;
    let engine = a.model.load()?;
    let mut data = Vec::new();
    for (i, text) in a.texts.iter().enumerate() {
        let ids = engine.tokenizer().encode(text, true, true)?;
        let mut rows =
            embed_tokens(&engine, &ids, pooling).map_err(|e| KilnError::invalid(format!("text {i}: {e}")))?;
        if a.normalize {
            rows.iter_mut().for_each(|r| normalize(r));
        }
        data.push(rows);
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
        let out = json!({"n_embd": engine.config().n_embd, "pooling": pooling.as_str(), "data": items});
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
