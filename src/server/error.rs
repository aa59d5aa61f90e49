//! Errors a request can end with, answered in the OpenAI shape
//! `{"error": {"message", "type", "param", "code"}}`.
//!
//! No variant carries unbounded client input: parameter names are the API's own (or index
//! paths built from them), and anything else taken from a request is cut by [`bounded`].

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{Value as Json, json};

/// At most this many characters of client input appear in an error message.
pub const ECHO_LIMIT: usize = 64;

/// `s` cut to [`ECHO_LIMIT`] characters (with `…` when cut), for echoing client input.
pub fn bounded(s: &str) -> String {
    bounded_to(s, ECHO_LIMIT)
}

/// `s` cut to `limit` characters (with `…` when cut).
pub fn bounded_to(s: &str, limit: usize) -> String {
    match s.char_indices().nth(limit) {
        Some((at, _)) => format!("{}…", &s[..at]),
        None => s.to_string(),
    }
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ApiError {
    /// The body is not JSON (serde_json's message names the line and column, never the text).
    #[error("the request body is not valid JSON: {0}")]
    MalformedJson(String),
    #[error("the request body must be a JSON object")]
    NotAnObject,
    #[error("the request body is larger than the limit of {limit} bytes")]
    BodyTooLarge { limit: usize },
    /// A parameter of the wrong type, out of range, missing or not supported.
    #[error("'{param}' {why}")]
    BadParam { param: String, why: String },
    #[error(
        "the request exceeds the available context size: {n_prompt_tokens} prompt tokens, but a slot holds {n_ctx} tokens"
    )]
    ExceedContext { n_prompt_tokens: usize, n_ctx: usize },
    /// The prompt fits, but not with the completion asked for.
    #[error(
        "the request exceeds the available context size: {n_prompt_tokens} prompt tokens + {max_tokens} completion tokens (max_tokens) = {total}, but a slot holds {n_ctx} tokens",
        total = n_prompt_tokens + max_tokens
    )]
    ExceedContextWithCompletion { n_prompt_tokens: usize, max_tokens: usize, n_ctx: usize },
    /// A request field minfer does not implement: refused rather than silently ignored.
    #[error("'{field}' is not supported by this server{why}")]
    Unsupported { field: String, why: &'static str },
    #[error("the request body must be JSON (Content-Type: application/json), not {given}")]
    UnsupportedMediaType { given: String },
    /// Headers or body did not arrive within `--read-timeout`.
    #[error("the request body did not arrive within the server's --read-timeout of {secs} s")]
    ReadTimeout { secs: u64 },
    /// SIGTERM: no new generations; those in flight finish within `--drain-timeout`.
    #[error("the server is shutting down")]
    Draining,
    /// The drain timed out before this generation ended.
    #[error("the server shut down before the generation ended (--drain-timeout of {secs} s)")]
    ShutDown { secs: u64 },
    #[error("invalid or missing API key (send 'Authorization: Bearer KEY')")]
    Unauthorized,
    #[error("no such route: {method} {path}")]
    NotFound { method: String, path: String },
    #[error("method {method} is not allowed on {path}")]
    MethodNotAllowed { method: String, path: String },
    #[error("the server is busy: {slots} slots busy and {queued} requests queued (queue limit {queue}); retry later")]
    QueueFull { slots: usize, queued: usize, queue: usize },
    #[error("too many open connections (--max-connections {max}); retry later")]
    TooManyConnections { max: usize },
    #[error("the server is busy: {0}; retry later")]
    Busy(&'static str),
    /// An endpoint this server was started without.
    #[error("this server does not serve {endpoint}: {flag}")]
    EndpointOff { endpoint: &'static str, flag: &'static str },
    #[error("the model is loading")]
    Loading,
    #[error("the inference thread has stopped after a fault; restart the server")]
    Stopped,
    #[error("the request took longer than the server's --timeout of {secs} s")]
    Timeout { secs: u64 },
    /// A real fault inside the server: an inference error or a caught panic.
    #[error("internal error: {0}")]
    Internal(String),
}

impl ApiError {
    pub fn param(param: impl Into<String>, why: impl Into<String>) -> ApiError {
        ApiError::BadParam { param: param.into(), why: why.into() }
    }

    /// The HTTP status and the OpenAI `type`, decided together.
    fn class(&self) -> (StatusCode, &'static str) {
        const INVALID: &str = "invalid_request_error";
        const UNAVAILABLE: (StatusCode, &str) = (StatusCode::SERVICE_UNAVAILABLE, "unavailable_error");
        match self {
            ApiError::MalformedJson(_) | ApiError::NotAnObject | ApiError::BadParam { .. } | ApiError::Unsupported { .. } => {
                (StatusCode::BAD_REQUEST, INVALID)
            }
            ApiError::ExceedContext { .. } | ApiError::ExceedContextWithCompletion { .. } => {
                (StatusCode::BAD_REQUEST, "exceed_context_size_error")
            }
            ApiError::ReadTimeout { .. } => (StatusCode::REQUEST_TIMEOUT, INVALID),
            ApiError::UnsupportedMediaType { .. } => (StatusCode::UNSUPPORTED_MEDIA_TYPE, INVALID),
            ApiError::BodyTooLarge { .. } => (StatusCode::PAYLOAD_TOO_LARGE, INVALID),
            ApiError::MethodNotAllowed { .. } => (StatusCode::METHOD_NOT_ALLOWED, INVALID),
            ApiError::Unauthorized => (StatusCode::UNAUTHORIZED, "authentication_error"),
            ApiError::NotFound { .. } => (StatusCode::NOT_FOUND, "not_found_error"),
            ApiError::QueueFull { .. }
            | ApiError::TooManyConnections { .. }
            | ApiError::Busy(_)
            | ApiError::Loading
            | ApiError::Stopped
            | ApiError::Draining
            | ApiError::ShutDown { .. } => UNAVAILABLE,
            ApiError::Timeout { .. } => (StatusCode::GATEWAY_TIMEOUT, "timeout_error"),
            ApiError::EndpointOff { .. } => (StatusCode::NOT_IMPLEMENTED, "not_supported_error"),
            ApiError::Internal(_) => (StatusCode::INTERNAL_SERVER_ERROR, "server_error"),
        }
    }

    pub fn status(&self) -> StatusCode {
        self.class().0
    }

    /// The OpenAI `type`.
    pub fn kind(&self) -> &'static str {
        self.class().1
    }

    /// The `error` object.
    pub fn to_json(&self) -> Json {
        let param = match self {
            ApiError::BadParam { param, .. } => Json::String(param.clone()),
            ApiError::Unsupported { field, .. } => Json::String(field.clone()),
            ApiError::ExceedContextWithCompletion { .. } => json!("max_tokens"),
            _ => Json::Null,
        };
        let code = match self {
            ApiError::Unauthorized => json!("invalid_api_key"),
            ApiError::ExceedContext { .. } | ApiError::ExceedContextWithCompletion { .. } => json!("context_length_exceeded"),
            ApiError::QueueFull { .. } | ApiError::TooManyConnections { .. } | ApiError::Busy(_) => json!("server_busy"),
            ApiError::Unsupported { .. } => json!("unsupported_parameter"),
            ApiError::Draining | ApiError::ShutDown { .. } => json!("server_shutting_down"),
            _ => Json::Null,
        };
        let mut err = json!({"message": self.to_string(), "type": self.kind(), "param": param, "code": code});
        match self {
            ApiError::ExceedContext { n_prompt_tokens, n_ctx } => {
                err["n_prompt_tokens"] = json!(n_prompt_tokens);
                err["n_ctx"] = json!(n_ctx);
            }
            ApiError::ExceedContextWithCompletion { n_prompt_tokens, max_tokens, n_ctx } => {
                err["n_prompt_tokens"] = json!(n_prompt_tokens);
                err["max_tokens"] = json!(max_tokens);
                err["n_ctx"] = json!(n_ctx);
            }
            _ => {}
        }
        json!({ "error": err })
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut r = (self.status(), axum::Json(self.to_json())).into_response();
        if matches!(self, ApiError::QueueFull { .. } | ApiError::Busy(_) | ApiError::Loading | ApiError::Draining) {
            r.headers_mut().insert(axum::http::header::RETRY_AFTER, axum::http::HeaderValue::from_static("1"));
        }
        r
    }
}

/// Why `minfer serve` could not start or stopped (one line on stderr, non-zero exit).
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// Listening, the runtime.
    #[error(transparent)]
    Http(#[from] crate::http::HttpError),
    #[error("cannot load {path}: {reason}")]
    Load { path: String, reason: String },
    #[error("{0}")]
    Config(String),
    #[error(transparent)]
    Engine(#[from] crate::generate::EngineError),
    #[error("cannot start the inference thread: {0}")]
    Thread(std::io::Error),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounded_cuts_long_input_on_a_char_boundary() {
        assert_eq!(bounded("short"), "short");
        let long = "é".repeat(1000);
        let b = bounded(&long);
        assert_eq!(b.chars().count(), ECHO_LIMIT + 1);
        assert!(b.ends_with('…'));
    }

    #[test]
    fn exceed_context_carries_the_counts() {
        let e = ApiError::ExceedContext { n_prompt_tokens: 5000, n_ctx: 4096 };
        assert_eq!(e.status(), StatusCode::BAD_REQUEST);
        let j = e.to_json();
        assert_eq!(j["error"]["type"], "exceed_context_size_error");
        assert_eq!(j["error"]["n_prompt_tokens"], 5000);
        assert_eq!(j["error"]["n_ctx"], 4096);
    }
}
