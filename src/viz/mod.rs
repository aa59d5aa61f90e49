//! `minfer viz`: the graph visualizer (design §8.2–8.3; docs/VIZ.md).
//!
//! A small axum server around one engine. The page (`page.html`, `viz.js`, `viz.css`, hand
//! written, compiled into the binary: no build step) draws the graph layer by layer and shows
//! every node's captured output; a run started from the page streams its per-node data live
//! over server-sent events, and a saved `MINFER_TRACE` file loads into the same page.
//!
//! - [`state`]: settings, the loaded model, the event channel, the last trace;
//! - [`runner`]: a run (`POST /viz/run`) on a blocking thread, the engine's trace sink turned
//!   into events;
//! - [`routes`]: the router: the page, `GET /viz/graph`, `GET /viz/events` (SSE),
//!   `POST /viz/run`, `POST /viz/stop`, `GET /viz/trace`, `GET /viz/samples[/NAME]`.

pub mod routes;
pub mod runner;
pub mod state;

use std::future::IntoFuture;
use std::path::PathBuf;

use crate::http::{self, HttpError};

pub use state::{VizConfig, VizState};

#[derive(Debug, thiserror::Error)]
pub enum VizError {
    /// Listening, the runtime: as `minfer serve` reports them.
    #[error(transparent)]
    Http(#[from] HttpError),
    /// The model could not be opened or loaded (in `minfer serve`'s words).
    #[error("cannot load {path}: {reason}")]
    Load { path: String, reason: String },
    #[error("--trace-dir {path}: not a directory")]
    TraceDir { path: PathBuf },
}

/// Loads the model, then serves until Ctrl-C / SIGTERM.
pub fn viz(cfg: VizConfig) -> Result<(), VizError> {
    if let Some(dir) = cfg.trace_dir.as_ref().filter(|d| !d.is_dir()) {
        return Err(VizError::TraceDir { path: dir.clone() });
    }
    let st = VizState::load(cfg)?;
    http::runtime("minfer-viz")?.block_on(async move {
        let (listener, local) = http::bind(&format!("{}:{}", st.cfg.host, st.cfg.port)).await?;
        eprintln!("minfer viz: {} on http://{local}/", st.model_name);
        // No graceful shutdown: open event streams would hold it open, and a run in progress
        // only reads the model.
        tokio::select! {
            r = axum::serve(listener, routes::router(st)).into_future() => r.map_err(HttpError::Io)?,
            _ = http::shutdown_signal() => eprintln!("minfer viz: stopped"),
        }
        Ok(())
    })
}
