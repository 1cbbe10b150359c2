//! `kiln rerank`: a reranker's relevance scores of documents for a query (docs/cli.md),
//! as the classification head outputs them, best first. Shares `kiln::embed` with the
//! server's `/v1/rerank`.

use kiln::embed::{embed_batch, rerank_input, Pooling};
use kiln::KilnError;
use serde_json::json;

use super::common::{print_out, ModelArgs};

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    model: ModelArgs,
    /// The query the documents are scored against.
    #[arg(long)]
    query: String,
    /// Documents to score.
    #[arg(value_name = "DOC", required = true)]
    documents: Vec<String>,
    /// Print only the best N.
    #[arg(long, value_name = "N")]
    top_n: Option<usize>,
    /// Print {"results":[{"index":i,"relevance_score":f}]}.
    #[arg(long)]
    json: bool,
}

pub fn run(a: Args) -> kiln::Result<()> {
    let engine = a.model.load()?;
    engine.classifier()?;
    let mut inputs = Vec::with_capacity(a.documents.len());
    for (i, doc) in a.documents.iter().enumerate() {
        let ids = rerank_input(&engine, &a.query, doc)?;
        if ids.len() > engine.n_ctx() {
            return Err(KilnError::invalid(format!(
                "the query with document {i} has {} tokens, more than the context ({})",
                ids.len(),
                engine.n_ctx()
            )));
        }
        inputs.push(ids);
    }
    let refs: Vec<&[u32]> = inputs.iter().map(Vec::as_slice).collect();
    let scores = embed_batch(&engine, &refs, Pooling::Rank)?;
    let ranked = kiln::embed::rank(scores.iter().map(|s| s[0][0]), a.top_n);
    if a.json {
        let results: Vec<_> =
            ranked.iter().map(|&(i, s)| json!({"index": i, "relevance_score": s})).collect();
        print_out(&format!("{}\n", json!({ "results": results })));
    } else {
        let mut s = String::new();
        for (i, score) in ranked {
            s.push_str(&format!("{score}\t{i}\t{}\n", a.documents[i]));
        }
        print_out(&s);
    }
    Ok(())
}
