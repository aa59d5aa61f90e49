//! The router: endpoints, API-key check, request counting, 404/405 in the OpenAI error shape.
//!
//! `/health` and `/metrics` are open (for probes and scrapers); everything else needs the key
//! when `--api-key` is set. Every response except those two is counted by status.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, Path, Request, State};
use axum::http::{HeaderMap, Method, Uri, header};
use axum::middleware::{Next, from_fn_with_state};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json as AxJson, Router};
use serde_json::{Value as Json, json};
use tower_http::catch_panic::CatchPanicLayer;

use super::error::{ApiError, bounded};
use super::fields::{Fields, kind_of, parse_object};
use super::openai::{body_bytes, chat_completions, completions};
use super::{introspect, native};
use super::request::token_ids;
use super::state::AppState;

/// Largest request body accepted.
pub const BODY_LIMIT: usize = 8 << 20;
/// Bytes of request bodies being read at once, at most (a body without a length counts as
/// [`BODY_LIMIT`]); a request that cannot get its share within `--read-timeout` is answered
/// 503. This bounds the memory of many large bodies arriving together.
pub const BODY_BUDGET: usize = 32 * BODY_LIMIT;

pub fn router(st: Arc<AppState>) -> Router {
    // llama-server's paths beside OpenAI's: the un-prefixed aliases, its native completion
    // API, and its introspection routes.
    let api = Router::new()
        .route("/v1/chat/completions", post(chat_completions))
        .route("/chat/completions", post(chat_completions))
        .route("/v1/completions", post(completions))
        .route("/v1/responses", post(super::responses::create))
        .route("/responses", post(super::responses::create))
        .route("/completion", post(native::completion))
        .route("/completions", post(native::completion))
        .route("/infill", post(native::infill))
        .route("/v1/embeddings", post(super::embeddings::openai))
        .route("/embeddings", post(super::embeddings::openai))
        .route("/embedding", post(super::embeddings::native))
        .route("/api/embed", post(super::embeddings::ollama_embed))
        .route("/api/embeddings", post(super::embeddings::ollama_embeddings))
        .route("/api/chat", post(super::ollama::chat))
        .route("/api/generate", post(super::ollama::generate))
        .route("/api/tags", get(super::ollama::tags))
        .route("/api/show", post(super::ollama::show))
        .route("/api/ps", get(super::ollama::ps))
        .route("/api/version", get(super::ollama::version))
        .route("/v1/models", get(models))
        .route("/models", get(models))
        .route("/v1/models/{id}", get(model))
        .route("/tokenize", post(tokenize))
        .route("/detokenize", post(detokenize))
        .route("/props", get(introspect::props).post(introspect::set_props))
        .route("/slots", get(introspect::slots))
        .route("/slots/{id}", post(introspect::slot_action))
        .route("/apply-template", post(introspect::apply_template))
        .route("/chat/completions/input_tokens", post(introspect::input_tokens))
        .route("/v1/chat/completions/input_tokens", post(introspect::input_tokens))
        // Route layers run last-added first: the key is checked before any body is read.
        .route_layer(from_fn_with_state(st.clone(), read_body_in_time))
        .route_layer(from_fn_with_state(st.clone(), require_key));
    Router::new()
        .route("/health", get(health))
        .route("/v1/health", get(health))
        .route("/", get(chat_page))
        .route("/metrics", get(metrics))
        .merge(api)
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(CatchPanicLayer::custom(handler_panicked))
        .layer(from_fn_with_state(st.clone(), count_status))
        .layer(DefaultBodyLimit::max(BODY_LIMIT))
        .layer(from_fn_with_state(st.clone(), super::cors::layer))
        .with_state(st)
}

/// Bodies are JSON: a request that declares another media type (a form, plain text) is
/// refused with 415 before its body is read. A request without `Content-Type` is taken as
/// JSON, as llama-server takes it.
fn wrong_content_type(headers: &HeaderMap) -> Option<ApiError> {
    let ctype = headers.get(header::CONTENT_TYPE)?;
    let Ok(text) = ctype.to_str() else { return Some(ApiError::UnsupportedMediaType { given: "(not ASCII)".into() }) };
    let essence = text.split(';').next().unwrap_or("").trim();
    let json = essence.eq_ignore_ascii_case("application/json") || essence.to_ascii_lowercase().ends_with("+json");
    (!json).then(|| ApiError::UnsupportedMediaType { given: bounded(essence) })
}

/// Reads the whole body (at most [`BODY_LIMIT`] bytes, within [`BODY_BUDGET`]) within
/// `--read-timeout` before any handler runs, so a client that trickles its body is answered
/// 408 and holds no admission ticket or slot while it does.
async fn read_body_in_time(State(st): State<Arc<AppState>>, req: Request, next: Next) -> Response {
    if let Some(e) = wrong_content_type(req.headers()) {
        return e.into_response();
    }
    let declared = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok())
        .unwrap_or(BODY_LIMIT);
    if declared > BODY_LIMIT {
        return ApiError::BodyTooLarge { limit: BODY_LIMIT }.into_response();
    }
    let (parts, body) = req.into_parts();
    let secs = st.cfg.read_timeout_secs;
    let limit = std::time::Duration::from_secs(secs);
    // Permits are KiB of body: at most BODY_BUDGET / 1024 of them, which fits a u32.
    let kib = declared.div_ceil(1024).max(1) as u32;
    let share = match tokio::time::timeout(limit, st.body_budget.clone().acquire_many_owned(kib)).await {
        Ok(Ok(p)) => p,
        _ => return ApiError::Busy("too many large request bodies are being read at once").into_response(),
    };
    let read = axum::body::to_bytes(body, BODY_LIMIT);
    let bytes = match tokio::time::timeout(limit, read).await {
        Err(_) => return ApiError::ReadTimeout { secs }.into_response(),
        Ok(Err(e)) => {
            let too_large = std::error::Error::source(&e)
                .is_some_and(|s| s.is::<http_body_util::LengthLimitError>());
            return if too_large { ApiError::BodyTooLarge { limit: BODY_LIMIT } } else { ApiError::MalformedJson(format!("the body could not be read: {e}")) }
                .into_response();
        }
        Ok(Ok(b)) => b,
    };
    drop(share);
    next.run(Request::from_parts(parts, axum::body::Body::from(bytes))).await
}

/// A panic in a handler (a bug: inference has its own guard) is a 500 in the OpenAI shape,
/// not a dropped connection.
fn handler_panicked(panic: Box<dyn std::any::Any + Send>) -> Response {
    let what = crate::http::panic_text(&*panic);
    eprintln!("minfer serve: a request handler panicked: {what}");
    ApiError::Internal(format!("the request handler panicked: {}", bounded(&what))).into_response()
}

/// Constant-time comparison, so the key cannot be guessed byte by byte from timings.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// The key of a request: `Authorization: Bearer KEY`, else `X-Api-Key: KEY` (llama-server's
/// and Anthropic's header).
fn given_key(headers: &HeaderMap) -> Option<&str> {
    let bearer = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split_once(' '))
        // RFC 7235: the scheme is case-insensitive.
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
        .map(|(_, token)| token.trim());
    bearer.or_else(|| headers.get("x-api-key").and_then(|v| v.to_str().ok()).map(str::trim))
}

async fn require_key(State(st): State<Arc<AppState>>, headers: HeaderMap, req: Request, next: Next) -> Response {
    if let Some(key) = &st.cfg.api_key {
        let given = given_key(&headers);
        if !given.is_some_and(|g| same(g.as_bytes(), key.as_bytes())) {
            return ApiError::Unauthorized.into_response();
        }
    }
    next.run(req).await
}

async fn count_status(State(st): State<Arc<AppState>>, req: Request, next: Next) -> Response {
    let counted = !matches!(req.uri().path(), "/health" | "/v1/health" | "/metrics" | "/");
    let r = next.run(req).await;
    if counted {
        st.metrics.request(r.status().as_u16());
    }
    r
}

async fn not_found(method: Method, uri: Uri) -> ApiError {
    ApiError::NotFound { method: bounded(method.as_str()), path: bounded(uri.path()) }
}

async fn method_not_allowed(method: Method, uri: Uri) -> ApiError {
    ApiError::MethodNotAllowed { method: bounded(method.as_str()), path: bounded(uri.path()) }
}

/// A plain chat page over the API (`--no-ui` turns it off); open, like llama-server's, since
/// it holds no data: its requests carry the key.
async fn chat_page(State(st): State<Arc<AppState>>) -> Response {
    if !st.cfg.ui {
        return ApiError::NotFound { method: "GET".into(), path: "/".into() }.into_response();
    }
    ([(header::CONTENT_TYPE, "text/html; charset=utf-8")], include_str!("assets/chat.html")).into_response()
}

async fn health(State(st): State<Arc<AppState>>) -> Response {
    if st.lifecycle.draining() {
        let body = json!({"status": "draining", "error": ApiError::Draining.to_json()["error"]});
        return (axum::http::StatusCode::SERVICE_UNAVAILABLE, AxJson(body)).into_response();
    }
    match st.model() {
        Ok(_) => AxJson(json!({"status": "ok"})).into_response(),
        Err(e) => e.into_response(),
    }
}

async fn metrics(State(st): State<Arc<AppState>>) -> Response {
    if !st.cfg.metrics_endpoint {
        return ApiError::EndpointOff { endpoint: "/metrics", flag: "it runs with --no-metrics" }.into_response();
    }
    let start = st.started.to_string();
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4"), (header::HeaderName::from_static("process-start-time-unix"), start.as_str())], st.metrics.render(st.admission.inside()))
        .into_response()
}

fn model_object(st: &AppState) -> Result<Json, ApiError> {
    let m = st.model()?;
    Ok(json!({
        "id": m.model_id,
        "aliases": m.aliases,
        "tags": st.cfg.tags,
        "object": "model",
        "created": m.created,
        "owned_by": "minfer",
        "meta": {"n_ctx_slot": m.n_ctx_slot, "n_slots": st.cfg.slots, "n_vocab": m.n_vocab},
    }))
}

async fn models(State(st): State<Arc<AppState>>) -> Result<AxJson<Json>, ApiError> {
    Ok(AxJson(json!({"object": "list", "data": [model_object(&st)?]})))
}

async fn model(State(st): State<Arc<AppState>>, Path(id): Path<String>) -> Result<AxJson<Json>, ApiError> {
    let m = model_object(&st)?;
    if !st.model()?.answers_to(&id) {
        return Err(ApiError::NotFound { method: "GET".into(), path: bounded(&format!("/v1/models/{id}")) });
    }
    Ok(AxJson(m))
}

/// `{"content": TEXT, "add_special": false, "parse_special": true, "with_pieces": false}` →
/// `{"tokens": [ids]}`, or `[{"id", "piece"}]` with `with_pieces` (llama-server's shape).
async fn tokenize(State(st): State<Arc<AppState>>, body: Result<Bytes, BytesRejection>) -> Result<AxJson<Json>, ApiError> {
    let m = st.model()?;
    let obj = parse_object(&body_bytes(body)?)?;
    let f = Fields::new(&obj);
    let content = f.str("content")?.ok_or_else(|| ApiError::param("content", "is required"))?.to_string();
    let add_special = f.bool("add_special")?.unwrap_or(false);
    let parse_special = f.bool("parse_special")?.unwrap_or(true);
    let with_pieces = f.bool("with_pieces")?.unwrap_or(false);
    let tok = m.tok.clone();
    let v = tokio::task::spawn_blocking(move || {
        let mut ids = Vec::new();
        if add_special && tok.add_bos() {
            ids.extend(tok.bos_id());
        }
        ids.extend(tok.encode(&content, parse_special));
        if !with_pieces {
            return json!({ "tokens": ids });
        }
        let pieces: Vec<Json> = ids
            .iter()
            .map(|&id| {
                let bytes = tok.token_bytes(id).unwrap_or_default();
                match std::str::from_utf8(bytes) {
                    Ok(s) => json!({"id": id, "piece": s}),
                    Err(_) => json!({"id": id, "piece": bytes}),
                }
            })
            .collect();
        json!({ "tokens": pieces })
    })
    .await
    .map_err(|e| ApiError::Internal(e.to_string()))?;
    Ok(AxJson(v))
}

/// `{"tokens": [ids]}` → `{"content": TEXT}`; an id outside the vocabulary is a 400.
async fn detokenize(State(st): State<Arc<AppState>>, body: Result<Bytes, BytesRejection>) -> Result<AxJson<Json>, ApiError> {
    let m = st.model()?;
    let obj = parse_object(&body_bytes(body)?)?;
    let items = match Fields::new(&obj).get("tokens") {
        None => return Err(ApiError::param("tokens", "is required")),
        Some(Json::Array(items)) => items,
        Some(v) => return Err(ApiError::param("tokens", format!("must be an array of token ids, got {}", kind_of(v)))),
    };
    let ids = token_ids("tokens", items, m.n_vocab)?;
    let tok = m.tok.clone();
    let content = tokio::task::spawn_blocking(move || tok.decode(&ids))
        .await
        .map_err(|e| ApiError::Internal(e.to_string()))?
        .map_err(|e| ApiError::param("tokens", e.to_string()))?;
    Ok(AxJson(json!({ "content": content })))
}
