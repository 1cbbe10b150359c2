//! `kiln serve`: the OpenAI-compatible HTTP server (crate kiln-server; docs/cli.md).

use std::time::Duration;

use kiln::KilnError;
use kiln_server::{default_max_connections, fit_max_connections, serve, ConnLimits, ServerOptions};

use super::common::{ModelArgs, SpecArgs};

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    model: ModelArgs,
    /// Speculative decoding of every request that may (docs/server.md).
    #[command(flatten)]
    spec: SpecArgs,
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
    /// Require `Authorization: Bearer KEY` on /v1/*. A flag's value is visible to every
    /// user in `ps`: prefer the environment variable KILN_API_KEY.
    #[arg(long = "api-key")]
    api_key: Option<String>,
    /// Seconds a request may take to arrive, head and body (on a new connection, from
    /// its opening); past it the connection is closed without a response.
    #[arg(long = "header-timeout", value_name = "SECS", default_value_t = 30)]
    header_timeout: u64,
    /// Seconds a kept-alive connection may wait for its next request, and a reply for
    /// its client to read it, before the connection is closed.
    #[arg(long = "idle-timeout", value_name = "SECS", default_value_t = 60)]
    idle_timeout: u64,
    /// Most open connections; a sixteenth of them is kept for /health and /metrics
    /// (default: what the file-descriptor limit leaves, at most 4096).
    #[arg(long = "max-connections", value_name = "N")]
    max_connections: Option<usize>,
    /// Most prompt or input tokens one request may ask to evaluate, summed over its
    /// prompts and choices (default: 8 x -c).
    #[arg(long = "max-request-tokens", value_name = "N")]
    max_request_tokens: Option<usize>,
    /// Fetch http(s) image URLs of image_url content parts (default: data: URLs only).
    #[arg(long = "allow-image-urls")]
    allow_image_urls: bool,
}

/// The longest timeout accepted (a day): longer is no timeout at all.
const MAX_TIMEOUT: u64 = 86_400;

pub fn run(a: Args) -> kiln::Result<()> {
    for (flag, secs) in [("--header-timeout", a.header_timeout), ("--idle-timeout", a.idle_timeout)] {
        if !(1..=MAX_TIMEOUT).contains(&secs) {
            return Err(KilnError::invalid(format!("{flag} must be between 1 and {MAX_TIMEOUT} seconds")));
        }
    }
    if a.max_request_tokens == Some(0) {
        return Err(KilnError::invalid("--max-request-tokens must be at least 1"));
    }
    let max_connections = match a.max_connections {
        None => default_max_connections(),
        Some(n) if n < 2 => {
            return Err(KilnError::invalid("--max-connections must be at least 2 (one is kept for /health)"))
        }
        Some(n) => {
            let (n, note) = fit_max_connections(n);
            if let Some(note) = note {
                eprintln!("note: {note}");
            }
            n
        }
    };
    let limits = ConnLimits {
        header_timeout: Duration::from_secs(a.header_timeout),
        idle_timeout: Duration::from_secs(a.idle_timeout),
        max_connections,
    };
    let api_key = a.api_key.or_else(|| std::env::var("KILN_API_KEY").ok()).filter(|k| !k.is_empty());
    serve(ServerOptions {
        engine: a.model.engine_options()?.with_spec(a.spec.options()),
        model: a.model.name(),
        host: a.host,
        port: a.port,
        alias: a.alias,
        parallel: a.parallel,
        queue: a.queue,
        api_key,
        limits,
        max_request_tokens: a.max_request_tokens,
        allow_image_urls: a.allow_image_urls,
    })
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    /// `kiln serve`'s arguments alone, parsed as `main` parses argv.
    #[derive(Parser)]
    struct Serve {
        #[command(flatten)]
        args: super::Args,
    }

    fn parse(args: &[&str]) -> super::Args {
        let argv = std::iter::once("serve").chain(args.iter().copied()).map(std::ffi::OsString::from);
        Serve::try_parse_from(crate::argv::rewrite(argv)).unwrap().args
    }

    #[test]
    fn takes_the_speculation_flags() {
        let a = parse(&["-md", "draft.gguf", "--draft-max", "8", "--draft-min", "2", "--draft-p-min", "0.5"]);
        let o = a.spec.options();
        assert_eq!(o.draft_model.as_deref(), Some("draft.gguf"));
        assert_eq!((o.draft_max, o.draft_min, o.draft_p_min), (8, 2, 0.5));
        assert_eq!(parse(&["-md=d.gguf"]).spec.options().draft_model.as_deref(), Some("d.gguf"));
        assert_eq!(parse(&["--model-draft", "d.gguf"]).spec.options().draft_model.as_deref(), Some("d.gguf"));
        assert_eq!(parse(&["--lookup-ngram", "3"]).spec.options().lookup_ngram, Some(3));
        assert!(!parse(&[]).spec.options().enabled());
    }
}
