//! `minfer serve`: an OpenAI-compatible HTTP server (axum on tokio).
//!
//! - [`state`]: settings ([`ServeConfig`]), the loaded model, shared counters;
//! - [`routes`]: the router, API key, request counting, `/health`, `/metrics`, `/v1/models`,
//!   `/tokenize`, `/detokenize`, 404/405;
//! - [`openai`]: `/v1/chat/completions` and `/v1/completions` (and `n` choices); [`responses`]:
//!   OpenAI's Responses API; [`native`]: llama-server's `/completion` and `/infill`;
//!   [`introspect`]: `/props`, `/slots`, `/apply-template`; [`cors`]: `--cors-origins` and
//!   preflights; [`request`] reads their
//!   bodies ([`fields`] has the typed reads), [`response`] and [`stream`] write them, and
//!   [`tools`] finds tool calls in answers, [`structured`] reads the constraints of structured
//!   output (`response_format`, `json_schema`, `grammar`, forced tool calls);
//! - [`listener`]: the accept loop and its limits (connections, header/body/idle timeouts),
//!   and the drain on shutdown; [`lifecycle`]: serving, draining, shut;
//! - [`admission`]: the bound on requests inside the server (`--slots` + `--queue`);
//! - [`scheduler`]: the inference thread, which interleaves the [`slot`]s' forward passes;
//! - [`metrics`]: the Prometheus counters; [`error`]: errors in the OpenAI shape.
//!
//! The listener is up before the model is loaded: `/health` answers 503 until it is.

pub mod admission;
pub mod cors;
pub mod embeddings;
pub mod error;
pub mod fields;
pub mod introspect;
pub mod lifecycle;
pub mod listener;
pub mod metrics;
pub mod native;
pub mod ollama;
pub mod openai;
pub mod request;
pub mod response;
pub mod responses;
pub mod routes;
pub mod scheduler;
pub mod slot;
pub mod slot_files;
pub mod state;
pub mod stream;
pub mod structured;
pub mod tools;

pub use error::{ApiError, ServeError};
pub use state::{AppState, ServeConfig};

use std::time::Duration;

use crate::http;

/// Runs the server until Ctrl-C / SIGTERM, or until the model fails to load.
pub fn serve(cfg: ServeConfig) -> Result<(), ServeError> {
    http::runtime("minfer-http")?.block_on(run(cfg))
}

async fn run(cfg: ServeConfig) -> Result<(), ServeError> {
    let st = AppState::new(cfg);
    let opened = st.open_model()?;
    // `--host a,b`: one listener per address (llama-server's form, e.g. 127.0.0.1,::1).
    let mut listeners = Vec::new();
    for host in st.cfg.host.split(',').map(str::trim).filter(|h| !h.is_empty()) {
        let addr = if host.contains(':') && !host.starts_with('[') { format!("[{host}]:{}", st.cfg.port) } else { format!("{host}:{}", st.cfg.port) };
        let (listener, local) = http::bind(&addr).await?;
        eprintln!("minfer serve: listening on http://{local} (loading {})", st.cfg.model.display());
        listeners.push(listener);
    }
    if listeners.is_empty() {
        return Err(ServeError::Config(format!("--host '{}' names no address", st.cfg.host)));
    }
    let (failed_tx, failed_rx) = tokio::sync::oneshot::channel::<ServeError>();
    let loader = st.clone();
    tokio::task::spawn_blocking(move || match loader.load(opened) {
        Ok(()) => {
            let m = loader.loaded.get().map(|m| (m.model_id.clone(), m.n_ctx_slot));
            if let Some((id, n_ctx)) = m {
                eprintln!(
                    "minfer serve: model {id} ready: {} slots x {n_ctx} tokens of context, {} threads",
                    loader.cfg.slots, loader.cfg.threads
                );
            }
        }
        Err(e) => {
            let _ = failed_tx.send(e);
        }
    });
    let app = routes::router(st.clone());
    let limits = listener::ConnLimits {
        max_connections: st.cfg.max_connections,
        read_timeout: Duration::from_secs(st.cfg.read_timeout_secs),
        idle_timeout: Duration::from_secs(st.cfg.idle_timeout_secs),
    };
    // The sender is dropped without a message when the model loads.
    let load_failed = async {
        match failed_rx.await {
            Ok(e) => e,
            Err(_) => std::future::pending().await,
        }
    };
    // Accepting ends at SIGTERM / Ctrl-C, or when the model fails to load.
    let (outcome_tx, outcome_rx) = tokio::sync::oneshot::channel::<Option<ServeError>>();
    let lc = st.clone();
    let stop = async move {
        let outcome = tokio::select! {
            e = load_failed => Some(e),
            _ = http::shutdown_signal() => None,
        };
        // No new generations from here on; /health says so.
        lc.lifecycle.start_draining();
        let _ = outcome_tx.send(outcome);
    };
    let acceptor = listener::Acceptor::new(listeners, app, st.clone(), limits);
    let open = acceptor.serve_until(stop).await;
    let outcome = outcome_rx.await.ok().flatten();
    if let Some(e) = outcome {
        return Err(e);
    }
    tokio::spawn(acceptor.serve_draining());
    let inside = st.admission.inside();
    let drain = Duration::from_secs(st.cfg.drain_timeout_secs);
    eprintln!("minfer serve: draining: {inside} requests in flight, up to {} s", drain.as_secs());
    let clean = listener::drain(open, &st, drain, Duration::from_secs(3)).await;
    if clean {
        eprintln!("minfer serve: stopped");
    } else {
        eprintln!("minfer serve: stopped; the generations still running after --drain-timeout were ended");
    }
    Ok(())
}
