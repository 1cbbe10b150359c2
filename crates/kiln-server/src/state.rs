//! What the HTTP handlers share: readiness, the job queue into the scheduler, auth,
//! metrics.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{SyncSender, TrySendError};
use std::sync::{Arc, OnceLock};

use axum::http::{header, HeaderMap};
use kiln::engine::Engine;

use crate::error::ApiError;
use crate::metrics::Metrics;
use crate::scheduler::Job;

/// State the scheduler thread shares with the handlers.
#[derive(Default)]
pub struct Shared {
    pub draining: AtomicBool,
    pub metrics: Metrics,
}

/// Set once the model is loaded.
pub struct Ready {
    pub engine: Engine,
    pub jobs: SyncSender<Job>,
    /// Context per request (the user's `-c`).
    pub n_ctx: usize,
    /// Most jobs waiting (`--queue`): the channel's capacity.
    pub queue: usize,
    /// Most prompt or input tokens one request may ask to evaluate.
    pub max_request_tokens: usize,
}

pub struct App {
    pub shared: Arc<Shared>,
    pub ready: OnceLock<Ready>,
    pub model_id: String,
    pub api_key: Option<String>,
    /// Unix seconds when the server started (`created` of `/v1/models`).
    pub created: u64,
    /// `--max-request-tokens`; `None`: 8 contexts.
    pub max_request_tokens: Option<usize>,
    /// `--allow-image-urls`.
    pub allow_image_urls: bool,
}

impl App {
    pub fn new(model_id: String, api_key: Option<String>) -> Self {
        let created =
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
        App {
            shared: Arc::new(Shared::default()),
            ready: OnceLock::new(),
            model_id,
            api_key,
            created,
            max_request_tokens: None,
            allow_image_urls: false,
        }
    }

    pub fn with_max_request_tokens(mut self, n: usize) -> Self {
        self.max_request_tokens = Some(n);
        self
    }

    pub fn draining(&self) -> bool {
        self.shared.draining.load(Ordering::SeqCst)
    }

    /// The loaded model, or 503 while loading or draining.
    pub fn ready(&self) -> Result<&Ready, ApiError> {
        if self.draining() {
            return Err(ApiError::unavailable("the server is shutting down"));
        }
        self.ready.get().ok_or_else(|| ApiError::unavailable("the model is loading"))
    }

    /// With an API key set, `/v1/*` needs `Authorization: Bearer KEY`.
    pub fn authorize(&self, headers: &HeaderMap) -> Result<(), ApiError> {
        let Some(key) = &self.api_key else { return Ok(()) };
        let given = headers.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok());
        let token = given.and_then(|v| v.strip_prefix("Bearer ")).map(str::trim);
        // Constant-time compare, so the key cannot be guessed byte by byte from timings.
        let ok = token.is_some_and(|t| {
            t.len() == key.len() && t.bytes().zip(key.bytes()).fold(0u8, |acc, (a, b)| acc | (a ^ b)) == 0
        });
        if ok {
            Ok(())
        } else {
            Err(ApiError::unauthorized())
        }
    }

    /// Rejects a request naming another model (404) or none (400).
    pub fn check_model(&self, model: Option<&str>) -> Result<(), ApiError> {
        match model {
            None => Err(ApiError::param("model", "'model' is required")),
            Some(m) if m == self.model_id => Ok(()),
            Some(m) => Err(ApiError::model_not_found(m)),
        }
    }

    /// Queues a request's jobs for the scheduler, all or none: 429 when the queue has not
    /// room for all of them now (the caller has checked that it could ever hold them).
    pub fn submit(&self, ready: &Ready, jobs: Vec<Job>) -> Result<(), ApiError> {
        let waiting = &self.shared.metrics.waiting;
        let n = jobs.len();
        // `waiting` counts the jobs sent and not yet received: the channel never holds more,
        // so a reservation below its capacity makes every send below succeed.
        waiting
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |w| (w + n <= ready.queue).then_some(w + n))
            .map_err(|_| ApiError::queue_full())?;
        for (i, job) in jobs.into_iter().enumerate() {
            if let Err(e) = ready.jobs.try_send(job) {
                // Only when the scheduler has stopped; the jobs already sent see their
                // channel close and are skipped.
                waiting.fetch_sub(n - i, Ordering::SeqCst);
                return Err(match e {
                    TrySendError::Full(_) => ApiError::queue_full(),
                    TrySendError::Disconnected(_) => ApiError::unavailable("the scheduler has stopped"),
                });
            }
        }
        Ok(())
    }
}
