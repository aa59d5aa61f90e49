//! The server's shutdown state: serving, then draining (after SIGTERM / Ctrl-C: no new
//! connections or generations, `/health` answers `draining`), then — if generations are still
//! running when `--drain-timeout` has passed — shut: every open response ends at once (a stream
//! with a last chunk whose `finish_reason` is `"shutdown"` and an error event).

use std::sync::atomic::{AtomicBool, Ordering};

use tokio::sync::watch;

#[derive(Debug)]
pub struct Lifecycle {
    draining: AtomicBool,
    /// Becomes `true` when the drain has timed out.
    shut: watch::Sender<bool>,
}

impl Default for Lifecycle {
    fn default() -> Self {
        Lifecycle { draining: AtomicBool::new(false), shut: watch::channel(false).0 }
    }
}

impl Lifecycle {
    pub fn start_draining(&self) {
        self.draining.store(true, Ordering::Release);
    }

    pub fn draining(&self) -> bool {
        self.draining.load(Ordering::Acquire)
    }

    /// Ends every response still open.
    pub fn shut(&self) {
        self.shut.send_replace(true);
    }

    /// Resolves when [`shut`](Self::shut) is called (at once if it was).
    pub fn until_shut(&self) -> impl Future<Output = ()> + Send + 'static {
        let mut rx = self.shut.subscribe();
        async move {
            // An error means the sender is gone with the server: nothing will end this wait.
            if rx.wait_for(|shut| *shut).await.is_err() {
                std::future::pending::<()>().await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(flavor = "current_thread")]
    async fn shut_wakes_waiters_before_and_after() {
        let l = Lifecycle::default();
        assert!(!l.draining());
        let early = tokio::spawn(l.until_shut());
        l.start_draining();
        assert!(l.draining());
        l.shut();
        tokio::time::timeout(std::time::Duration::from_secs(5), early).await.unwrap().unwrap();
        tokio::time::timeout(std::time::Duration::from_secs(5), l.until_shut()).await.unwrap();
    }
}
