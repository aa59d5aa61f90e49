//! What the two HTTP front ends, `minfer serve` ([`crate::server`]) and `minfer viz`
//! ([`crate::viz`]), share: their async runtime, binding the listener, the shutdown signal, and
//! the text of a caught panic. Below both: it knows neither a model nor a route.

pub mod base64;

use std::net::SocketAddr;

use tokio::net::TcpListener;

/// Why a front end could not start serving, or stopped (one line on stderr).
#[derive(Debug, thiserror::Error)]
pub enum HttpError {
    #[error("cannot listen on {addr}: {source}")]
    Bind { addr: String, source: std::io::Error },
    #[error("cannot start the async runtime: {0}")]
    Runtime(std::io::Error),
    #[error("server error: {0}")]
    Io(std::io::Error),
}

/// The async runtime of an HTTP front end: two threads, since inference runs on its own threads.
pub fn runtime(thread_name: &str) -> Result<tokio::runtime::Runtime, HttpError> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name(thread_name)
        .enable_all()
        .build()
        .map_err(HttpError::Runtime)
}

/// A listener on `addr` (`host:port`) and the address it got (the port, when `addr` asks for 0).
pub async fn bind(addr: &str) -> Result<(TcpListener, SocketAddr), HttpError> {
    let listener = TcpListener::bind(addr).await.map_err(|source| HttpError::Bind { addr: addr.to_string(), source })?;
    let local = listener.local_addr().map_err(HttpError::Io)?;
    Ok((listener, local))
}

/// Ctrl-C or SIGTERM.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {},
        _ = term => {},
    }
}

/// A panic's message, when it has one.
pub fn panic_text(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown panic".into())
}
