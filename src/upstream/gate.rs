//! A per-deployment concurrency gate for local model servers (vLLM, Ollama, llama.cpp) that
//! run out of memory when pushed: at most `max_concurrent` requests in flight, at most
//! `max_queue` waiting for a slot (within the request's deadline); beyond that the
//! deployment is busy at once. A stream holds its slot until it ends.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Instant;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

pub struct Gate {
    slots: Option<Arc<Semaphore>>,
    waiting: AtomicU32,
    max_concurrent: u32,
    max_queue: u32,
}

#[derive(Debug)]
pub struct Busy;

/// Decrements the waiting count however the wait ends (the client may leave mid-wait).
struct Waiting<'a>(&'a AtomicU32);

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Gate {
    pub fn new(max_concurrent: u32, max_queue: u32) -> Self {
        let slots = (max_concurrent > 0).then(|| Arc::new(Semaphore::new(max_concurrent as usize)));
        Self {
            slots,
            waiting: AtomicU32::new(0),
            max_concurrent,
            max_queue,
        }
    }

    /// Whether this gate was made for these limits (a reload that changes them makes a new
    /// gate: `Pool::carried`).
    pub fn has_limits(&self, max_concurrent: u32, max_queue: u32) -> bool {
        (self.max_concurrent, self.max_queue) == (max_concurrent, max_queue)
    }

    /// A slot (`None` when the deployment has no gate), or `Busy`.
    pub async fn enter(&self, deadline: Instant) -> Result<Option<OwnedSemaphorePermit>, Busy> {
        let Some(slots) = &self.slots else {
            return Ok(None);
        };
        if let Ok(p) = slots.clone().try_acquire_owned() {
            return Ok(Some(p));
        }
        if self.waiting.fetch_add(1, Ordering::Relaxed) >= self.max_queue {
            self.waiting.fetch_sub(1, Ordering::Relaxed);
            return Err(Busy);
        }
        let _waiting = Waiting(&self.waiting);
        let wait = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(wait, slots.clone().acquire_owned()).await {
            Ok(Ok(p)) => Ok(Some(p)),
            _ => Err(Busy),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn two_in_flight_one_waiting_then_busy() {
        let g = Gate::new(2, 1);
        let deadline = Instant::now() + Duration::from_millis(200);
        let a = g.enter(deadline).await.unwrap();
        let _b = g.enter(deadline).await.unwrap();
        let g = Arc::new(g);
        let waiter = {
            let g = g.clone();
            tokio::spawn(async move {
                g.enter(Instant::now() + Duration::from_secs(2))
                    .await
                    .map(|p| p.is_some())
            })
        };
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(g.enter(deadline).await.is_err(), "queue full: busy at once");
        drop(a);
        assert!(
            waiter.await.unwrap().unwrap(),
            "the waiter got the freed slot"
        );
        assert!(Gate::new(0, 0).enter(deadline).await.unwrap().is_none());
    }
}
