//! One module per subcommand.

mod bench;
mod chat;
mod common;
mod embed;
mod grammar;
mod inspect;
mod logits;
mod perplexity;
mod prompt;
mod pull;
mod rerank;
mod run;
mod serve;
mod tokenize;

use clap::Subcommand;

#[derive(Subcommand)]
pub enum Command {
    /// Generate a reply to a prompt.
    Run(run::Args),
    /// Print the next-token logits after a prompt.
    Logits(logits::Args),
    /// Measure perplexity of a text file.
    Perplexity(perplexity::Args),
    /// Measure prompt processing and generation speed.
    Bench(bench::Args),
    /// Show a model's metadata and tensors.
    Inspect(inspect::Args),
    /// Turn text into token ids.
    Tokenize(tokenize::Args),
    /// Fetch a model into its cache; print its path.
    Pull(pull::Args),
    /// Talk with a model, turn by turn.
    Chat(chat::Args),
    /// Print embeddings (hidden states after the final norm, pooled).
    Embed(embed::Args),
    /// Score documents against a query with a reranker, best first.
    Rerank(rerank::Args),
    /// Serve the model over an OpenAI-compatible HTTP API.
    Serve(serve::Args),
}

impl Command {
    pub fn run(self) -> kiln::Result<()> {
        match self {
            Command::Run(a) => run::run(a),
            Command::Logits(a) => logits::run(a),
            Command::Perplexity(a) => perplexity::run(a),
            Command::Bench(a) => bench::run(a),
            Command::Inspect(a) => inspect::run(a),
            Command::Tokenize(a) => tokenize::run(a),
            Command::Pull(a) => pull::run(a),
            Command::Chat(a) => chat::run(a),
            Command::Embed(a) => embed::run(a),
            Command::Rerank(a) => rerank::run(a),
            Command::Serve(a) => serve::run(a),
        }
    }
}
