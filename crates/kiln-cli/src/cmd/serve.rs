//! `kiln serve`: the OpenAI-compatible HTTP server (crate kiln-server; docs/cli.md).

use kiln::KilnError;
use kiln_server::{serve, ServerOptions};

use super::common::ModelArgs;

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    model: ModelArgs,
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    /// 0: an OS-chosen port (shown in the "listening" line).
    #[arg(long, default_value_t = 8080)]
    port: u16,
    /// Model id reported by /v1/models and expected in requests.
    #[arg(long)]
    alias: Option<String>,
    /// Most sequences decoded together.
    #[arg(long, default_value_t = 8)]
    parallel: usize,
    /// Most requests waiting for a slot (more get 429).
    #[arg(long, default_value_t = 64)]
    queue: usize,
    /// Require `Authorization: Bearer KEY` on /v1/* (env KILN_API_KEY).
    #[arg(long = "api-key")]
    api_key: Option<String>,
}

pub fn run(a: Args) -> kiln::Result<()> {
    if a.parallel == 0 || a.queue == 0 {
        return Err(KilnError::invalid("--parallel and --queue must be at least 1"));
    }
    let api_key = a.api_key.or_else(|| std::env::var("KILN_API_KEY").ok()).filter(|k| !k.is_empty());
    serve(ServerOptions {
        engine: a.model.engine_options()?,
        model: a.model.name(),
        host: a.host,
        port: a.port,
        alias: a.alias,
        parallel: a.parallel,
        queue: a.queue,
        api_key,
    })
}
