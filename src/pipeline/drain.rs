//! The shutdown's deadline for requests still running. On SIGTERM the server stops
//! accepting and requests and streams may finish for `server.shutdown_timeout_seconds`;
//! then the gateway ends what is left itself (`Drain::start`), while the workers are still
//! running, so every request settles and writes its log row before its worker is stopped:
//! a request still waiting (queued, or on an upstream) is answered 503 `shutting_down`
//! and pays what a departure would (nothing while queued, its input once an upstream had
//! it); a stream is ended with an error event (`shutting_down`, never `[DONE]` /
//! `message_stop`) and charged by the cut-stream rule — unless its answer is already whole
//! (after its finish, the usage still to come): that one is read on for its usage, at most
//! `stream::AFTER_THE_FINISH` (2 s, inside `startup::SETTLE_MARGIN`) from the drain's
//! start (`started` gives that instant), charged it or the estimate, and its client gets a
//! whole stream's closing events — a client behind on it is waited for within the same
//! 2 s, then cut (`stream::ClientSink::send_whole`). Without it, the workers' forced stop
//! drops these requests with their runtime: measured before this existed, a SIGTERM with
//! four requests running left one log row of four, and the other three reservations were
//! released uncharged (the cut stream's output given away), the clients' connections
//! simply closed.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::watch;

/// Whether (and since when) the gateway has started ending the requests still running;
/// cheap to clone.
#[derive(Clone)]
pub struct Drain {
    tx: Arc<watch::Sender<Option<Instant>>>,
}

impl Default for Drain {
    fn default() -> Self {
        Self {
            tx: Arc::new(watch::channel(None).0),
        }
    }
}

impl Drain {
    /// Ends every request still running (once; later calls change nothing, its instant
    /// included).
    pub fn start(&self) {
        self.tx.send_if_modified(|at| {
            let first = at.is_none();
            if first {
                *at = Some(Instant::now());
            }
            first
        });
    }

    pub fn is_draining(&self) -> bool {
        self.tx.borrow().is_some()
    }

    /// Resolves once `start` was called, with the instant it was: a stream's limits after
    /// the drain run from there, not from when its task noticed it.
    pub async fn started(&self) -> Instant {
        let mut rx = self.tx.subscribe();
        // The sender lives as long as `self`: `wait_for` cannot fail while it is awaited.
        let at = rx.wait_for(Option::is_some).await.ok().and_then(|at| *at);
        at.unwrap_or_else(Instant::now)
    }

    /// Resolves `by` after the drain's start (never while the gateway is not draining):
    /// the deadline of what the drain still waits for — a whole answer's read-on, its
    /// client behind, its response's store.
    pub async fn after(&self, by: Duration) {
        let at = self.started().await;
        tokio::time::sleep_until((at + by).into()).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn started_resolves_for_waiters_before_and_after_the_start() {
        let drain = Drain::default();
        assert!(!drain.is_draining());
        let waiter = tokio::spawn({
            let d = drain.clone();
            async move { d.started().await }
        });
        drain.start();
        let at = waiter.await.unwrap();
        assert_eq!(drain.started().await, at);
        assert!(drain.is_draining());
        // A second start keeps the first one's instant.
        std::thread::sleep(std::time::Duration::from_millis(2));
        drain.start();
        assert_eq!(drain.started().await, at);
    }
}
