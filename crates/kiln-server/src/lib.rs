//! kiln's OpenAI-compatible HTTP server (`kiln serve`): axum routes in front of a
//! continuous-batching scheduler thread that owns the model. Routes, flags, errors and
//! metrics are the contract of docs/cli.md. `conn` serves the sockets: timeouts and a cap
//! on open connections.

mod conn;
mod error;
mod image;
mod metrics;
mod params;
mod routes;
mod scheduler;
mod state;
mod stream;
mod structured;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use kiln::engine::{Engine, EngineOptions};
use kiln::gguf::GgufFile;
use kiln::model::ModelConfig;
use kiln::{KilnError, Result};

pub use conn::{default_max_connections, fit_max_connections, serve_connections, ConnLimits};
pub use error::ApiError;
pub use routes::router;
pub use state::App;

/// The most sequences decoded together and requests waiting: bounds on input, far above
/// what a machine serves (the queue's slots are allocated up front).
pub const MAX_PARALLEL: usize = 4096;
pub const MAX_QUEUE: usize = 65536;

/// `kiln serve`'s settings.
#[derive(Clone, Debug)]
pub struct ServerOptions {
    /// A `.gguf` path or a catalog name.
    pub model: String,
    /// Threads, device, batch size; `n_ctx` here is the context of each request.
    pub engine: EngineOptions,
    pub host: String,
    pub port: u16,
    pub alias: Option<String>,
    /// Most sequences decoded together.
    pub parallel: usize,
    /// Most requests waiting for a slot.
    pub queue: usize,
    pub api_key: Option<String>,
    /// Timeouts and the cap on open connections.
    pub limits: ConnLimits,
    /// Most prompt or input tokens one request may ask to evaluate; `None`: 8 × `n_ctx`.
    pub max_request_tokens: Option<usize>,
    /// Fetch `http(s)` image URLs of `image_url` content parts (else only `data:` URLs).
    pub allow_image_urls: bool,
}

/// The id `/v1/models` reports: the alias, else the catalog name, else a Hub name without
/// `hf://` (`ORG/REPO:QUANT`), else the file stem.
pub fn model_id(model: &str, alias: Option<&str>) -> String {
    if let Some(a) = alias {
        return a.to_string();
    }
    if let Some(name) = model.strip_prefix(kiln::hub::hf::SCHEME) {
        return name.to_string();
    }
    if kiln::hub::find(model).is_some() {
        return model.to_string();
    }
    std::path::Path::new(model)
        .file_stem()
        .map_or_else(|| model.to_string(), |s| s.to_string_lossy().into_owned())
}

/// Runs the server until SIGTERM or Ctrl-C, then drains (within 5 s) and returns.
pub fn serve(opts: ServerOptions) -> Result<()> {
    serve_until(opts, |_| {}, shutdown_signal())
}

/// [`serve`] for a host program (kiln's Python package): `on_ready` gets the bound address
/// once the model is loaded, and the server drains and returns when `shutdown` completes
/// (no signal handlers are installed).
pub fn serve_until(
    opts: ServerOptions,
    on_ready: impl FnOnce(SocketAddr),
    shutdown: impl Future<Output = ()>,
) -> Result<()> {
    if !(1..=MAX_PARALLEL).contains(&opts.parallel) || !(1..=MAX_QUEUE).contains(&opts.queue) {
        return Err(KilnError::invalid(format!(
            "--parallel must be between 1 and {MAX_PARALLEL}, --queue between 1 and {MAX_QUEUE}"
        )));
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| KilnError::io("tokio runtime", e))?;
    let r = rt.block_on(run(opts, on_ready, shutdown));
    rt.shutdown_timeout(Duration::from_millis(200));
    r
}

async fn run(
    opts: ServerOptions,
    on_ready: impl FnOnce(SocketAddr),
    shutdown: impl Future<Output = ()>,
) -> Result<()> {
    let mut shutdown = std::pin::pin!(shutdown);
    let addr = format!("{}:{}", opts.host, opts.port);
    let listener = tokio::net::TcpListener::bind(&addr).await.map_err(|e| KilnError::io(&addr, e))?;
    let local: SocketAddr = listener.local_addr().map_err(|e| KilnError::io(&addr, e))?;
    eprintln!("kiln: loading {} (port bound: http://{local})", opts.model);
    let mut app = App::new(model_id(&opts.model, opts.alias.as_deref()), opts.api_key.clone());
    app.max_request_tokens = opts.max_request_tokens;
    app.allow_image_urls = opts.allow_image_urls;
    let app = Arc::new(app);
    let stop = Arc::new(tokio::sync::Notify::new());
    let stop2 = stop.clone();
    let server = tokio::spawn(serve_connections(listener, router(app.clone()), opts.limits, async move {
        stop2.notified().await
    }));

    // /health answers 503 while this loads.
    let model = opts.model.clone();
    let eopts = opts.engine.clone();
    let parallel = opts.parallel;
    let load = tokio::task::spawn_blocking(move || load_engine(&model, eopts, parallel));
    let (engine, n_ctx) = tokio::select! {
        r = load => r.map_err(|e| KilnError::invalid(format!("loading failed: {e}")))??,
        _ = &mut shutdown => {
            stop.notify_one();
            return Ok(());
        }
    };
    let (kv, kv_row) = (engine.runner().kv_types(), engine.runner().kv_bytes_per_token());
    eprintln!(
        "kiln: KV cache {} keys, {} values: {kv_row} bytes per token, {:.1} MiB for {} slots",
        kiln::kv::cache_type_name(kv.k),
        kiln::kv::cache_type_name(kv.v),
        (kv_row * engine.runner().n_slots()) as f64 / (1 << 20) as f64,
        engine.runner().n_slots()
    );
    let spec = engine.spec();
    if spec.enabled() {
        let source = match (&spec.draft_model, spec.lookup_ngram) {
            (Some(m), _) => format!("draft model {m}"),
            (None, Some(n)) => format!("prompt lookup of {n}-grams"),
            (None, None) => String::new(),
        };
        eprintln!("kiln: speculative decoding: {source}, drafts of up to {} tokens", spec.draft_max);
    }
    let worker = start(&app, engine, parallel, opts.queue, n_ctx, opts.engine.n_batch)?;
    eprintln!("kiln: listening on http://{local}");
    on_ready(local);

    shutdown.await;
    eprintln!("kiln: draining");
    app.shared.draining.store(true, Ordering::SeqCst);
    // The scheduler finishes or cancels what runs within its grace period, then exits;
    // its event senders close, which ends every open stream.
    let joined = tokio::task::spawn_blocking(move || worker.join());
    let _ = tokio::time::timeout(Duration::from_millis(4300), joined).await;
    stop.notify_one();
    let _ = tokio::time::timeout(Duration::from_millis(400), server).await;
    Ok(())
}

/// Starts the scheduler thread on a loaded engine and marks `app` ready. `n_ctx` is the
/// context of each request; the engine's KV pool must hold `parallel` of them.
/// `step_tokens` caps one step's tokens (all decode tokens first, then prompt chunks).
pub fn start(
    app: &App,
    engine: Engine,
    parallel: usize,
    queue: usize,
    n_ctx: usize,
    step_tokens: usize,
) -> Result<std::thread::JoinHandle<()>> {
    let (tx, rx) = std::sync::mpsc::sync_channel(queue.max(1));
    let sched = scheduler::Scheduler::new(
        engine.clone(),
        rx,
        app.shared.clone(),
        parallel.max(1),
        n_ctx,
        step_tokens,
    );
    let worker = std::thread::Builder::new()
        .name("kiln-scheduler".into())
        .spawn(move || sched.run())
        .map_err(|e| KilnError::io("scheduler thread", e))?;
    let max_request_tokens = app.max_request_tokens.unwrap_or(8 * n_ctx);
    let ready = state::Ready { engine, jobs: tx, n_ctx, queue: queue.max(1), max_request_tokens };
    if app.ready.set(ready).is_err() {
        return Err(KilnError::invalid("the server already has a model"));
    }
    Ok(worker)
}

/// Loads the model with a KV pool of `parallel` full contexts. The pool's context is
/// rounded up to whole KV blocks so that every sequence fits its block-rounded length.
fn load_engine(model: &str, opts: EngineOptions, parallel: usize) -> Result<(Engine, usize)> {
    let path = kiln::hub::resolve_model(model)?;
    let n_ctx_train = ModelConfig::from_gguf(&GgufFile::open(&path)?)?.n_ctx_train;
    let n_ctx = opts.n_ctx.unwrap_or(n_ctx_train.min(4096));
    let rounded = n_ctx.div_ceil(kiln::kv::BLOCK_SIZE) * kiln::kv::BLOCK_SIZE;
    let pool_ctx = if rounded <= n_ctx_train { rounded } else { n_ctx };
    let opts = opts.with_n_ctx(pool_ctx).with_n_seq(parallel);
    let engine = Engine::load(path.to_string_lossy(), opts)?;
    Ok((engine, n_ctx))
}

/// Completes at the first SIGTERM or Ctrl-C. Both are listened for from the first poll,
/// which `run` makes while the model loads: one future serves the whole run, so no signal
/// falls between two listeners.
async fn shutdown_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, Signal, SignalKind};
        async fn recv(s: Option<Signal>) {
            match s {
                Some(mut s) => {
                    s.recv().await;
                }
                None => std::future::pending().await,
            }
        }
        let (term, int) = (signal(SignalKind::terminate()).ok(), signal(SignalKind::interrupt()).ok());
        tokio::select! {
            _ = recv(term) => {},
            _ = recv(int) => {},
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}
