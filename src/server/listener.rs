//! The accept loop: HTTP/1.1 connections served by hyper under the limits that protect the
//! server from slow and hostile clients.
//!
//! - At most `--max-connections` connections are open; one more is answered `503` with
//!   `Retry-After` and closed, without reading it.
//! - A connection must deliver each request's headers within `--read-timeout` (hyper's header
//!   timer, which also runs while a kept-alive connection sits idle), so a client that trickles
//!   a header byte a second is dropped; the body has the same time ([`super::routes`]).
//! - A client that accepts no response bytes for `--idle-timeout` (it stopped reading a
//!   stream) is disconnected: its response body is dropped, and with it the generation.
//! - On shutdown, kept-alive connections close after their current response and [`drain`]
//!   waits for those still generating, up to `--drain-timeout`; meanwhile new connections get
//!   one answer each (`/health`: `draining`, generations: 503), so probes see the drain.
//!
//! Only HTTP/1.1 is spoken: sniffing for HTTP/2 would read the first bytes without a timer.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio::time::Sleep;

use super::error::ApiError;
use super::state::AppState;

/// Per-connection limits.
#[derive(Debug, Clone, Copy)]
pub struct ConnLimits {
    pub max_connections: usize,
    pub read_timeout: Duration,
    pub idle_timeout: Duration,
}

/// A socket whose writes fail with `TimedOut` once they have been blocked (the peer's receive
/// window full) for `limit` in a row.
struct StallGuard {
    inner: TcpStream,
    limit: Duration,
    blocked: Option<Pin<Box<Sleep>>>,
}

impl StallGuard {
    fn new(inner: TcpStream, limit: Duration) -> StallGuard {
        StallGuard { inner, limit, blocked: None }
    }

    /// Tracks a write-side poll result: a stall starts the timer, progress clears it.
    fn track<T>(&mut self, cx: &mut Context<'_>, r: Poll<io::Result<T>>) -> Poll<io::Result<T>> {
        match r {
            Poll::Ready(r) => {
                self.blocked = None;
                Poll::Ready(r)
            }
            Poll::Pending => {
                let limit = self.limit;
                let timer = self.blocked.get_or_insert_with(|| Box::pin(tokio::time::sleep(limit)));
                match timer.as_mut().poll(cx) {
                    Poll::Ready(()) => Poll::Ready(Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        format!("the client accepted no data for {} s (--idle-timeout)", limit.as_secs()),
                    ))),
                    Poll::Pending => Poll::Pending,
                }
            }
        }
    }
}

impl AsyncRead for StallGuard {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl AsyncWrite for StallGuard {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write(cx, buf);
        self.track(cx, r)
    }

    fn poll_write_vectored(mut self: Pin<&mut Self>, cx: &mut Context<'_>, bufs: &[io::IoSlice<'_>]) -> Poll<io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        self.track(cx, r)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let r = Pin::new(&mut self.inner).poll_flush(cx);
        self.track(cx, r)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// The whole answer to a connection over the cap: a 503 in the OpenAI shape.
fn over_capacity_response(max: usize) -> Vec<u8> {
    let body = ApiError::TooManyConnections { max }.to_json().to_string();
    format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\nretry-after: 1\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// Accepts and serves connections under [`ConnLimits`].
pub struct Acceptor {
    /// One per `--host` address.
    listeners: Vec<TcpListener>,
    app: axum::Router,
    st: Arc<AppState>,
    limits: ConnLimits,
    permits: Arc<Semaphore>,
}

impl Acceptor {
    pub fn new(listeners: Vec<TcpListener>, app: axum::Router, st: Arc<AppState>, limits: ConnLimits) -> Acceptor {
        let permits = Arc::new(Semaphore::new(limits.max_connections));
        Acceptor { listeners, app, st, limits, permits }
    }

    /// Serves until `stop` resolves; returns the tracker of the connections still open.
    pub async fn serve_until(&self, stop: impl Future<Output = ()>) -> GracefulShutdown {
        let graceful = GracefulShutdown::new();
        tokio::pin!(stop);
        loop {
            let stream = tokio::select! {
                _ = &mut stop => break,
                s = self.accept() => s,
            };
            self.serve(stream, Some(&graceful));
        }
        graceful
    }

    /// Serves while the server drains, one request per connection: `/health` says
    /// `draining` and new generations are refused with 503 (the routes see the lifecycle), so
    /// a load balancer's probe gets an answer instead of a refused connection. Never returns;
    /// the runtime's end stops it.
    pub async fn serve_draining(self) {
        loop {
            let stream = self.accept().await;
            self.serve(stream, None);
        }
    }

    async fn accept(&self) -> TcpStream {
        loop {
            let accepts = self.listeners.iter().map(|l| Box::pin(l.accept()));
            let (first, _, _) = futures_util::future::select_all(accepts).await;
            match first {
                Ok((stream, _peer)) => {
                    let _ = stream.set_nodelay(true);
                    return stream;
                }
                // Out of descriptors and the like: back off instead of spinning.
                Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        }
    }

    /// Serves one connection on its own task, or answers 503 when `--max-connections` are open.
    /// A connection the drain waits for (`graceful`) is kept alive between requests; one
    /// accepted while draining answers one request.
    fn serve(&self, stream: TcpStream, graceful: Option<&GracefulShutdown>) {
        let Ok(permit) = self.permits.clone().try_acquire_owned() else {
            self.st.metrics.connection_refused();
            let reply = over_capacity_response(self.limits.max_connections);
            tokio::spawn(async move {
                let mut stream = stream;
                let _ = tokio::time::timeout(Duration::from_secs(2), async {
                    let _ = stream.write_all(&reply).await;
                    let _ = stream.shutdown().await;
                })
                .await;
            });
            return;
        };
        let mut http = hyper::server::conn::http1::Builder::new();
        // Title-Case header names, as llama-server (cpp-httplib) writes them: header names are
        // case-insensitive, but clients that keep them in a plain map look them up that way.
        http.timer(TokioTimer::new()).header_read_timeout(self.limits.read_timeout).keep_alive(graceful.is_some()).title_case_headers(true);
        let io = TokioIo::new(StallGuard::new(stream, self.limits.idle_timeout));
        let conn = http.serve_connection(io, TowerToHyperService::new(self.app.clone()));
        let conn: Pin<Box<dyn Future<Output = hyper::Result<()>> + Send>> = match graceful {
            Some(g) => Box::pin(g.watch(conn)),
            None => Box::pin(conn),
        };
        let metrics = self.st.metrics.clone();
        metrics.connection_opened();
        tokio::spawn(async move {
            let _ = conn.await;
            metrics.connection_closed();
            drop(permit);
        });
    }
}

/// Waits for the open connections to finish, at most `timeout`; then ends every open
/// response ([`super::lifecycle::Lifecycle::shut`]) and gives them `grace` to say so.
/// Returns whether every connection ended within `timeout`.
pub async fn drain(graceful: GracefulShutdown, st: &AppState, timeout: Duration, grace: Duration) -> bool {
    let all_closed = graceful.shutdown();
    tokio::pin!(all_closed);
    if tokio::time::timeout(timeout, &mut all_closed).await.is_ok() {
        return true;
    }
    st.lifecycle.shut();
    let _ = tokio::time::timeout(grace, all_closed).await;
    false
}
