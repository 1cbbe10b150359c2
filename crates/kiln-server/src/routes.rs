//! The HTTP routes (docs/cli.md): OpenAI's chat, completions, embeddings and models,
//! llama-server's `/v1/rerank`, plus `/health` and `/metrics`.

use std::sync::Arc;
use std::time::Instant;

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use kiln::embed::Pooling;
use serde_json::{json, Value};
use tokio::sync::mpsc::unbounded_channel;

use crate::error::ApiError;
use crate::params::{self, Kind};
use crate::scheduler::{EmbedJob, Event, GenJob, Job};
use crate::state::App;
use crate::stream::{collect, event_stream, Reply};

pub fn router(app: Arc<App>) -> Router {
    Router::new()
        .route("/health", get(health))
        .route("/metrics", get(metrics))
        .route("/v1/models", get(models))
        .route("/v1/models/{id}", get(model))
        .route("/v1/chat/completions", post(chat))
        .route("/v1/completions", post(completions))
        .route("/v1/embeddings", post(embeddings))
        .route("/v1/rerank", post(rerank))
        .fallback(fallback)
        .layer(axum::middleware::map_response(crate::error::shape))
        .with_state(app)
}

async fn health(State(app): State<Arc<App>>) -> Response {
    let (code, status) = if app.draining() {
        (StatusCode::SERVICE_UNAVAILABLE, "draining")
    } else if app.ready.get().is_none() {
        (StatusCode::SERVICE_UNAVAILABLE, "loading")
    } else {
        (StatusCode::OK, "ok")
    };
    (code, Json(json!({"status": status}))).into_response()
}

async fn metrics(State(app): State<Arc<App>>) -> Response {
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], app.shared.metrics.render()).into_response()
}

async fn fallback(uri: Uri) -> ApiError {
    ApiError::not_found(uri.path())
}

fn model_json(app: &App) -> Value {
    json!({"id": app.model_id, "object": "model", "created": app.created, "owned_by": "kiln"})
}

/// Counts a request whose handler is dropped before answering (the client went away
/// while a non-streamed reply was being generated) as 499, nginx's "client closed".
struct Abandoned<'a>(&'a App, bool);

impl Drop for Abandoned<'_> {
    fn drop(&mut self) {
        if self.1 {
            self.0.shared.metrics.request_done(499);
        }
    }
}

/// Records the request's final status in `kiln_requests_total`.
fn done(app: &App, r: Result<Response, ApiError>) -> Response {
    let r = r.unwrap_or_else(IntoResponse::into_response);
    // A streamed reply records its status when the stream ends.
    if r.headers().get(header::CONTENT_TYPE).is_none_or(|v| v != "text/event-stream") {
        app.shared.metrics.request_done(r.status().as_u16());
    }
    r
}

async fn models(State(app): State<Arc<App>>, headers: HeaderMap) -> Response {
    let r = app
        .authorize(&headers)
        .map(|_| Json(json!({"object": "list", "data": [model_json(&app)]})).into_response());
    done(&app, r)
}

async fn model(State(app): State<Arc<App>>, headers: HeaderMap, Path(id): Path<String>) -> Response {
    let r = app.authorize(&headers).and_then(|_| {
        if id == app.model_id {
            Ok(Json(model_json(&app)).into_response())
        } else {
            Err(ApiError::model_not_found(&id))
        }
    });
    done(&app, r)
}

async fn chat(State(app): State<Arc<App>>, headers: HeaderMap, body: Bytes) -> Response {
    let mut guard = Abandoned(&app, true);
    let r = generate(&app, &headers, &body, Kind::Chat).await;
    guard.1 = false;
    done(&app, r)
}

async fn completions(State(app): State<Arc<App>>, headers: HeaderMap, body: Bytes) -> Response {
    let mut guard = Abandoned(&app, true);
    let r = generate(&app, &headers, &body, Kind::Completion).await;
    guard.1 = false;
    done(&app, r)
}

async fn generate(
    app: &Arc<App>,
    headers: &HeaderMap,
    body: &[u8],
    kind: Kind,
) -> Result<Response, ApiError> {
    app.authorize(headers)?;
    let ready = app.ready()?;
    let o = params::object(body)?;
    app.check_model(params::model(&o)?)?;
    // Parsing renders the template, tokenizes, compiles grammars and fetches, decodes and
    // encodes images: blocking work, kept off the async runtime's worker threads.
    let (engine, n_ctx, allow_urls) = (ready.engine.clone(), ready.n_ctx, app.allow_image_urls);
    let req =
        tokio::task::spawn_blocking(move || params::parse_generation(&o, kind, &engine, n_ctx, allow_urls))
            .await
            .map_err(|e| ApiError::internal(format!("parsing the request: {e}")))??;
    let jobs = req.prompts.len().saturating_mul(req.n);
    let tokens = req.prompts.iter().map(Vec::len).sum::<usize>().saturating_mul(req.n);
    let what = if kind == Kind::Chat { "messages" } else { "prompt" };
    admissible(ready, jobs, if req.n > 1 { "n" } else { what }, tokens, what)?;
    let (tx, rx) = unbounded_channel::<Event>();
    let enqueued = Instant::now();
    let mut jobs = Vec::with_capacity(req.prompts.len() * req.n);
    for prompt in &req.prompts {
        let prompt = Arc::new(prompt.clone());
        let max_tokens = req.max_tokens.unwrap_or(ready.n_ctx - prompt.len());
        for j in 0..req.n {
            let mut params = req.params.clone();
            // Choices of one request differ; a given seed still makes the request repeatable.
            params.seed = params.seed.map(|s| s.wrapping_add(j as u64));
            let job = GenJob {
                prompt: prompt.clone(),
                images: req.images.clone(),
                max_tokens,
                params,
                stop: req.stop.clone(),
                ignore_eos: req.ignore_eos,
                logprobs: req.logprobs,
                shown: req.tools.shown.clone(),
                grammar: req.grammar.clone(),
                index: jobs.len(),
                events: tx.clone(),
                enqueued,
            };
            jobs.push(Job::Gen(Box::new(job)));
        }
    }
    let index = jobs.len();
    app.submit(ready, jobs)?;
    drop(tx);
    let reply = Reply::new(
        app.clone(),
        kind,
        index,
        req.include_usage,
        req.logprobs.is_some(),
        &req.prompts,
        &req.tools,
    );
    if req.stream {
        Ok(event_stream(reply, rx))
    } else {
        collect(reply, rx).await
    }
}

/// 400 for a request that could never be served whole: more jobs than the queue holds
/// (`param` names the field that makes them), or more tokens to evaluate than
/// `--max-request-tokens`. Checked before anything is queued, so a 429 only ever means
/// load that will clear.
fn admissible(
    ready: &crate::state::Ready,
    jobs: usize,
    param: &str,
    tokens: usize,
    tokens_param: &str,
) -> Result<(), ApiError> {
    if jobs > ready.queue {
        let message = format!(
            "this request makes {jobs} jobs (prompts x n); the server queues at most {} (--queue)",
            ready.queue
        );
        return Err(ApiError::too_large(param, message));
    }
    if tokens > ready.max_request_tokens {
        let message = format!(
            "this request asks to evaluate {tokens} tokens; the server takes at most {} per request \
             (--max-request-tokens)",
            ready.max_request_tokens
        );
        return Err(ApiError::too_large(tokens_param, message));
    }
    Ok(())
}

async fn embeddings(State(app): State<Arc<App>>, headers: HeaderMap, body: Bytes) -> Response {
    let mut guard = Abandoned(&app, true);
    let r = embed(&app, &headers, &body).await;
    guard.1 = false;
    done(&app, r)
}

async fn embed(app: &Arc<App>, headers: &HeaderMap, body: &[u8]) -> Result<Response, ApiError> {
    app.authorize(headers)?;
    let ready = app.ready()?;
    let o = params::object(body)?;
    app.check_model(params::model(&o)?)?;
    for k in o.keys() {
        if !["input", "model", "encoding_format", "dimensions", "user"].contains(&k.as_str()) {
            return Err(ApiError::unsupported(k));
        }
    }
    let n_embd = ready.engine.config().n_embd;
    let pooling = match Pooling::of(&ready.engine) {
        Pooling::Rank => {
            return Err(ApiError::bad("this model is a reranker (pooling rank): use /v1/rerank"))
        }
        Pooling::None => {
            return Err(ApiError::bad("this model's pooling is none, which has no OpenAI shape"))
        }
        p => p,
    };
    let base64 = match o.get("encoding_format") {
        None | Some(Value::Null) => false,
        Some(v) if v == "float" => false,
        Some(v) if v == "base64" => true,
        Some(_) => {
            return Err(ApiError::param("encoding_format", "'encoding_format' must be 'float' or 'base64'"))
        }
    };
    match o.get("dimensions") {
        None | Some(Value::Null) => {}
        Some(v) if v.as_u64() == Some(n_embd as u64) => {}
        Some(_) => return Err(ApiError::unsupported("dimensions")),
    }
    let input = o
        .get("input")
        .filter(|v| !v.is_null())
        .ok_or_else(|| ApiError::param("input", "'input' is required"))?;
    let shape = "'input' must be a string, an array of strings, or token ids";
    let inputs = params::inputs(input, &ready.engine, "input", shape)?;
    if inputs.len() > 2048 {
        return Err(ApiError::param("input", "at most 2048 inputs per request"));
    }
    if let Some(long) = inputs.iter().find(|i| i.len() > ready.n_ctx) {
        return Err(ApiError::context_length(
            "input",
            format!("an input has {} tokens; the context is {}", long.len(), ready.n_ctx),
        ));
    }
    let n_tokens: usize = inputs.iter().map(Vec::len).sum();
    admissible(ready, 1, "input", n_tokens, "input")?;
    let (reply, rx) = tokio::sync::oneshot::channel();
    app.submit(ready, vec![Job::Embed(EmbedJob { inputs, pooling, normalize: true, reply })])?;
    let vectors = rx
        .await
        .map_err(|_| ApiError::unavailable("the server is shutting down"))?
        .map_err(|e| if app.draining() { ApiError::unavailable(e) } else { ApiError::internal(e) })?;
    let data: Vec<Value> = vectors
        .iter()
        .enumerate()
        .map(|(i, v)| {
            let e = if base64 { Value::String(crate::stream::base64_f32(v)) } else { json!(v) };
            json!({"object": "embedding", "index": i, "embedding": e})
        })
        .collect();
    let usage = json!({"prompt_tokens": n_tokens, "total_tokens": n_tokens});
    Ok(Json(json!({"object": "list", "data": data, "model": app.model_id, "usage": usage})).into_response())
}

async fn rerank(State(app): State<Arc<App>>, headers: HeaderMap, body: Bytes) -> Response {
    let mut guard = Abandoned(&app, true);
    let r = rerank_documents(&app, &headers, &body).await;
    guard.1 = false;
    done(&app, r)
}

/// llama-server's rerank: `query`, `documents` (strings), optional `top_n`; the results
/// sorted best first, each with its document's `index` and the head's raw score.
async fn rerank_documents(app: &Arc<App>, headers: &HeaderMap, body: &[u8]) -> Result<Response, ApiError> {
    app.authorize(headers)?;
    let ready = app.ready()?;
    let o = params::object(body)?;
    app.check_model(params::model(&o)?)?;
    for k in o.keys() {
        if !["query", "documents", "top_n", "model"].contains(&k.as_str()) {
            return Err(ApiError::unsupported(k));
        }
    }
    ready.engine.classifier().map_err(|e| ApiError::bad(e.to_string()))?;
    let query = o
        .get("query")
        .and_then(Value::as_str)
        .ok_or_else(|| ApiError::param("query", "'query' is required and must be a string"))?;
    let shape = "'documents' must be a non-empty array of strings";
    let docs =
        o.get("documents").and_then(Value::as_array).ok_or_else(|| ApiError::param("documents", shape))?;
    if docs.is_empty() || !docs.iter().all(Value::is_string) {
        return Err(ApiError::param("documents", shape));
    }
    if docs.len() > 2048 {
        return Err(ApiError::param("documents", "at most 2048 documents per request"));
    }
    let top_n = match o.get("top_n") {
        None | Some(Value::Null) => None,
        Some(v) => Some(
            v.as_u64().ok_or_else(|| ApiError::param("top_n", "'top_n' must be a non-negative integer"))?
                as usize,
        ),
    };
    let mut inputs = Vec::with_capacity(docs.len());
    for (i, d) in docs.iter().enumerate() {
        let ids = kiln::embed::rerank_input(&ready.engine, query, d.as_str().unwrap_or_default())
            .map_err(|e| ApiError::param("documents", e.to_string()))?;
        if ids.len() > ready.n_ctx {
            return Err(ApiError::context_length(
                "documents",
                format!(
                    "the query with document {i} has {} tokens; the context is {}",
                    ids.len(),
                    ready.n_ctx
                ),
            ));
        }
        inputs.push(ids);
    }
    let n_tokens: usize = inputs.iter().map(Vec::len).sum();
    admissible(ready, 1, "documents", n_tokens, "documents")?;
    let (reply, rx) = tokio::sync::oneshot::channel();
    app.submit(
        ready,
        vec![Job::Embed(EmbedJob { inputs, pooling: Pooling::Rank, normalize: false, reply })],
    )?;
    let scores = rx
        .await
        .map_err(|_| ApiError::unavailable("the server is shutting down"))?
        .map_err(|e| if app.draining() { ApiError::unavailable(e) } else { ApiError::internal(e) })?;
    let ranked = kiln::embed::rank(scores.iter().map(|s| s.first().copied().unwrap_or(f32::NAN)), top_n);
    let results: Vec<Value> =
        ranked.iter().map(|&(i, score)| json!({"index": i, "relevance_score": score})).collect();
    let usage = json!({"prompt_tokens": n_tokens, "total_tokens": n_tokens});
    Ok(Json(json!({"object": "list", "model": app.model_id, "results": results, "usage": usage}))
        .into_response())
}
