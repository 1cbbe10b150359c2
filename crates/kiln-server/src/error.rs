//! Errors in OpenAI's shape: `{"error":{"message","type","param","code"}}` with the status
//! codes of docs/cli.md. `shape` gives the same shape to the errors axum makes itself (404,
//! 405, 413, a body that fails to arrive, a path that does not decode).

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::json;

/// The most of a plain-text error body kept as the message.
const MAX_MESSAGE: usize = 4096;

#[derive(Debug, Clone)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    pub kind: &'static str,
    pub param: Option<String>,
    pub code: Option<&'static str>,
}

impl ApiError {
    fn new(status: StatusCode, kind: &'static str, message: impl Into<String>) -> Self {
        ApiError { status, message: message.into(), kind, param: None, code: None }
    }

    /// 400 for a request that is wrong in itself.
    pub fn bad(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "invalid_request_error", message)
    }

    /// 400 naming the offending field.
    pub fn param(param: &str, message: impl Into<String>) -> Self {
        Self::bad(message).with_param(param)
    }

    pub fn unsupported(param: &str) -> Self {
        Self::param(param, format!("the field '{param}' is not supported by kiln"))
            .with_code("unsupported_parameter")
    }

    pub fn context_length(param: &str, message: impl Into<String>) -> Self {
        Self::param(param, message).with_code("context_length_exceeded")
    }

    pub fn unauthorized() -> Self {
        Self::new(StatusCode::UNAUTHORIZED, "invalid_request_error", "invalid or missing API key")
            .with_code("invalid_api_key")
    }

    pub fn model_not_found(model: &str) -> Self {
        Self::new(
            StatusCode::NOT_FOUND,
            "invalid_request_error",
            format!("the model '{model}' does not exist"),
        )
        .with_param("model")
        .with_code("model_not_found")
    }

    pub fn not_found(what: &str) -> Self {
        Self::new(StatusCode::NOT_FOUND, "invalid_request_error", format!("no route for {what}"))
            .with_code("not_found")
    }

    pub fn queue_full() -> Self {
        Self::new(StatusCode::TOO_MANY_REQUESTS, "rate_limit_error", "the request queue is full; retry later")
            .with_code("queue_full")
    }

    /// 400 for a request that could never be served whole, however long it waited.
    pub fn too_large(param: &str, message: impl Into<String>) -> Self {
        Self::param(param, message).with_code("request_too_large")
    }

    /// 503 from a connection of the reserved share (see `conn`).
    pub fn too_many_connections() -> Self {
        Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "server_error",
            "the server has too many open connections (--max-connections); retry later",
        )
        .with_code("too_many_connections")
    }

    pub fn unavailable(message: impl Into<String>) -> Self {
        Self::new(StatusCode::SERVICE_UNAVAILABLE, "server_error", message).with_code("unavailable")
    }

    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, "server_error", message)
    }

    pub fn with_param(mut self, p: &str) -> Self {
        self.param = Some(p.to_string());
        self
    }

    pub fn with_code(mut self, c: &'static str) -> Self {
        self.code = Some(c);
        self
    }

    pub fn body(&self) -> serde_json::Value {
        json!({"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}})
    }
}

/// The error type and code of a status axum or hyper chose.
fn kind_of(status: StatusCode) -> (&'static str, Option<&'static str>) {
    let kind = if status.is_server_error() { "server_error" } else { "invalid_request_error" };
    let code = match status {
        StatusCode::NOT_FOUND => Some("not_found"),
        StatusCode::METHOD_NOT_ALLOWED => Some("method_not_allowed"),
        StatusCode::REQUEST_TIMEOUT => Some("request_timeout"),
        StatusCode::PAYLOAD_TOO_LARGE => Some("request_too_large"),
        StatusCode::UNSUPPORTED_MEDIA_TYPE => Some("unsupported_media_type"),
        _ => None,
    };
    (kind, code)
}

/// Middleware for the router: an error response that is not already JSON becomes an
/// `ApiError` with the same status and headers, its text (or the status's reason) as the
/// message.
pub async fn shape(resp: Response) -> Response {
    let status = resp.status();
    let json = resp
        .headers()
        .get(header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/json"));
    if !(status.is_client_error() || status.is_server_error()) || json {
        return resp;
    }
    let (parts, body) = resp.into_parts();
    let text = match axum::body::to_bytes(body, MAX_MESSAGE).await {
        Ok(b) => String::from_utf8_lossy(&b).trim().to_string(),
        Err(_) => String::new(),
    };
    let message =
        if text.is_empty() { status.canonical_reason().unwrap_or("error").to_lowercase() } else { text };
    let (kind, code) = kind_of(status);
    let e = ApiError { status, message, kind, param: None, code };
    let mut r = e.into_response();
    // Keep the rest, such as a 405's `Allow`.
    for name in parts.headers.keys() {
        if !r.headers().contains_key(name) && name != header::CONTENT_LENGTH {
            for v in parts.headers.get_all(name) {
                r.headers_mut().append(name.clone(), v.clone());
            }
        }
    }
    r
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut r = (self.status, axum::Json(self.body())).into_response();
        if self.status == StatusCode::TOO_MANY_REQUESTS || self.status == StatusCode::SERVICE_UNAVAILABLE {
            r.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        }
        r
    }
}
