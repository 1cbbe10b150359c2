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
}

pub struct App {
    pub shared: Arc<Shared>,
    pub ready: OnceLock<Ready>,
    pub model_id: String,
    pub api_key: Option<String>,
    /// Unix seconds when the server started (`created` of `/v1/models`).
    pub created: u64,
}

impl App {
    pub fn new(model_id: String, api_key: Option<String>) -> Self {
        let created =
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
        App { shared: Arc::new(Shared::default()), ready: OnceLock::new(), model_id, api_key, created }
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

    /// Queues `job` for the scheduler; 429 when the queue is full.
    pub fn submit(&self, ready: &Ready, job: Job) -> Result<(), ApiError> {
        let m = &self.shared.metrics;
        m.waiting.fetch_add(1, Ordering::Relaxed);
        match ready.jobs.try_send(job) {
            Ok(()) => Ok(()),
            Err(e) => {
                m.waiting.fetch_sub(1, Ordering::Relaxed);
                Err(match e {
                    TrySendError::Full(_) => ApiError::queue_full(),
                    TrySendError::Disconnected(_) => ApiError::unavailable("the scheduler has stopped"),
                })
            }
        }
    }
}
