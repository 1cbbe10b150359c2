//! Errors in OpenAI's shape: `{"error":{"message","type","param","code"}}` with the status
//! codes of docs/cli.md.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::json;

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

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut r = (self.status, axum::Json(self.body())).into_response();
        if self.status == StatusCode::TOO_MANY_REQUESTS || self.status == StatusCode::SERVICE_UNAVAILABLE {
            r.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        }
        r
    }
}
