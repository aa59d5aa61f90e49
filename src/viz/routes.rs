//! The visualizer's routes. Errors are `{"error": {"message": ...}}` with a 4xx/5xx status.
//!
//! | route | answer |
//! |---|---|
//! | `GET /`, `GET /viz` | the page |
//! | `GET /viz/viz.js`, `GET /viz/viz.css` | its script and style |
//! | `GET /viz/info` | `{model, n_ctx, max_values, max_tokens, busy, chat}` |
//! | `GET /viz/graph?n_tokens=N` | the graph a pass of N tokens (default 1) runs (`minfer-graph`) |
//! | `GET /viz/events` | server-sent events: `hello`, then every run's events ([`super::runner`]) |
//! | `POST /viz/run` | starts a run: 202 `{run}`; 400 bad request; 409 while another runs |
//! | `POST /viz/stop` | asks the run in progress to stop: `{stopping}` |
//! | `GET /viz/trace` | the last run's trace (`minfer-trace`); 404 before the first |
//! | `GET /viz/samples` | `{dir, traces: [names]}`: the `.json` files of `--trace-dir` |
//! | `GET /viz/samples/{name}` | one of them |

use std::convert::Infallible;
use std::sync::Arc;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::{StatusCode, header};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use futures_util::Stream;
use serde_json::{Value, json};
use tokio::sync::broadcast::error::RecvError;

use super::runner::{RunRequest, prepare, run_blocking};
use super::state::{Frame, MAX_RUN_TOKENS, VizState};

const PAGE: &str = include_str!("page.html");
const SCRIPT: &str = include_str!("viz.js");
const STYLE: &str = include_str!("viz.css");

/// `GET /viz/graph` during a run.
const BUSY_GRAPH: &str = "a run is in progress; its graphs arrive as `phase` events";

/// Largest `POST /viz/run` body.
const BODY_LIMIT: usize = 1 << 20;

pub fn router(st: Arc<VizState>) -> Router {
    Router::new()
        .route("/", get(page))
        .route("/viz", get(page))
        .route("/viz/viz.js", get(|| async { asset("text/javascript; charset=utf-8", SCRIPT) }))
        .route("/viz/viz.css", get(|| async { asset("text/css; charset=utf-8", STYLE) }))
        .route("/viz/info", get(info))
        .route("/viz/graph", get(graph))
        .route("/viz/events", get(events))
        .route("/viz/run", post(start_run))
        .route("/viz/stop", post(stop))
        .route("/viz/trace", get(trace))
        .route("/viz/samples", get(samples))
        .route("/viz/samples/{name}", get(sample))
        .fallback(|| async { error(StatusCode::NOT_FOUND, "no such route (the page is at /)".into()) })
        .layer(axum::extract::DefaultBodyLimit::max(BODY_LIMIT))
        .with_state(st)
}

fn error(status: StatusCode, message: String) -> Response {
    (status, axum::Json(json!({ "error": { "message": message } }))).into_response()
}

fn asset(content_type: &'static str, body: &'static str) -> Response {
    ([(header::CONTENT_TYPE, content_type), (header::CACHE_CONTROL, "no-cache")], body).into_response()
}

fn json_text(body: impl Into<axum::body::Body>) -> Response {
    ([(header::CONTENT_TYPE, "application/json")], body.into()).into_response()
}

async fn page() -> Response {
    asset("text/html; charset=utf-8", PAGE)
}

async fn info(State(st): State<Arc<VizState>>) -> Response {
    axum::Json(json!({
        "model": st.model_name, "n_ctx": st.cfg.n_ctx, "max_values": st.cfg.max_values,
        "max_tokens": MAX_RUN_TOKENS, "busy": st.busy(), "chat": st.template.is_some(),
    }))
    .into_response()
}

async fn graph(State(st): State<Arc<VizState>>, Query(q): Query<Vec<(String, String)>>) -> Response {
    let mut n_tokens = 1usize;
    for (k, v) in &q {
        match (k.as_str(), v.parse::<usize>()) {
            ("n_tokens", Ok(n)) if (1..=st.cfg.n_ctx).contains(&n) => n_tokens = n,
            ("n_tokens", _) => return error(StatusCode::BAD_REQUEST, format!("n_tokens must be from 1 to {}, not {v:?}", st.cfg.n_ctx)),
            _ => return error(StatusCode::BAD_REQUEST, format!("unknown parameter {k:?} (expected n_tokens)")),
        }
    }
    // The engine is held by a run for its whole length: do not wait behind one (a run claimed
    // but not started yet counts as one too).
    if st.busy() {
        return error(StatusCode::CONFLICT, BUSY_GRAPH.into());
    }
    let built = tokio::task::spawn_blocking(move || {
        let engine = st.try_engine()?;
        Some(engine.preview_graph(n_tokens, 1).map(|(g, p)| g.export_json(Some(&p), Some(&st.model_name)).to_string()))
    });
    match built.await {
        Ok(None) => error(StatusCode::CONFLICT, BUSY_GRAPH.into()),
        Ok(Some(Ok(body))) => json_text(body),
        Ok(Some(Err(e))) => error(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
        Err(e) => error(StatusCode::INTERNAL_SERVER_ERROR, format!("building the graph failed: {e}")),
    }
}

async fn events(State(st): State<Arc<VizState>>) -> Sse<impl Stream<Item = Result<Event, Infallible>>> {
    let rx = st.subscribe();
    let hello = Frame::new("hello", &json!({ "model": st.model_name, "busy": st.busy(), "run": st.current_run() }));
    let stream = futures_util::stream::unfold((Some(hello), rx), |(first, mut rx)| async move {
        if let Some(f) = first {
            return Some((sse(&f), (None, rx)));
        }
        let f = match rx.recv().await {
            Ok(f) => f,
            // Fell behind: say how much was missed; the page reloads `/viz/trace` after `done`.
            Err(RecvError::Lagged(n)) => Frame::new("lagged", &json!({ "missed": n })),
            Err(RecvError::Closed) => return None,
        };
        Some((sse(&f), (None, rx)))
    });
    Sse::new(stream).keep_alive(KeepAlive::default())
}

fn sse(f: &Frame) -> Result<Event, Infallible> {
    Ok(Event::default().event(f.event).data(f.data.as_str()))
}

async fn start_run(State(st): State<Arc<VizState>>, body: Bytes) -> Response {
    let req = match RunRequest::parse(&body) {
        Ok(r) => r,
        Err(e) => return error(StatusCode::BAD_REQUEST, e.0),
    };
    let prepared = match prepare(&st, req) {
        Ok(p) => p,
        Err(e) => return error(StatusCode::BAD_REQUEST, e.0),
    };
    let Some(guard) = st.try_start() else {
        return error(StatusCode::CONFLICT, "a run is in progress (POST /viz/stop ends it)".into());
    };
    let run = guard.id;
    tokio::task::spawn_blocking(move || run_blocking(guard, prepared));
    (StatusCode::ACCEPTED, axum::Json(json!({ "run": run }))).into_response()
}

async fn stop(State(st): State<Arc<VizState>>) -> Response {
    axum::Json(json!({ "stopping": st.request_stop() })).into_response()
}

async fn trace(State(st): State<Arc<VizState>>) -> Response {
    match st.last_trace() {
        Some(t) => json_text(t),
        None => error(StatusCode::NOT_FOUND, "no run has finished yet".into()),
    }
}

/// The `.json` files directly in the trace directory, sorted.
fn sample_names(st: &VizState) -> Vec<String> {
    let Some(dir) = &st.cfg.trace_dir else {
        return Vec::new();
    };
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_file()))
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|n| n.ends_with(".json"))
        .collect();
    names.sort();
    names
}

async fn samples(State(st): State<Arc<VizState>>) -> Response {
    let dir = st.cfg.trace_dir.as_ref().map(|d| d.display().to_string());
    axum::Json(json!({ "dir": dir, "traces": sample_names(&st) })).into_response()
}

async fn sample(State(st): State<Arc<VizState>>, Path(name): Path<String>) -> Response {
    // Only names listed by /viz/samples: no paths, no escaping the directory.
    let (Some(dir), true) = (&st.cfg.trace_dir, sample_names(&st).contains(&name)) else {
        return error(StatusCode::NOT_FOUND, format!("no trace named {name:?} (GET /viz/samples lists them)"));
    };
    let path = dir.join(&name);
    let read = tokio::task::spawn_blocking(move || std::fs::read_to_string(path)).await;
    match read.unwrap_or_else(|e| Err(std::io::Error::other(e))) {
        Ok(text) => match serde_json::from_str::<Value>(&text) {
            Ok(v) if v["format"] == "minfer-trace" => json_text(text),
            _ => error(StatusCode::UNPROCESSABLE_ENTITY, format!("{name} is not a minfer-trace document")),
        },
        Err(e) => error(StatusCode::INTERNAL_SERVER_ERROR, format!("cannot read {name}: {e}")),
    }
}
