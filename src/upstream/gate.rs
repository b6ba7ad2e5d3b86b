//! A per-deployment concurrency gate for local model servers (vLLM, Ollama, llama.cpp) that
//! run out of memory when pushed: at most `max_concurrent` requests in flight, at most
//! `max_queue` waiting for a slot (within the request's deadline); beyond that the
//! deployment is busy at once. A stream holds its slot until it ends.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Instant;

use parking_lot::Mutex;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// One gate per deployment for the life of the process: a reload that changes its limits
/// resizes it in place (`resize`). A new gate beside the old one let the old one's holders
/// and waiters and the new one's `max_concurrent` all in at once — lowering 8 to 2 for a
/// server out of memory let 10 in flight (s29 limits attack F2).
pub struct Gate {
    slots: Option<Slots>,
    waiting: AtomicU32,
    max_concurrent: AtomicU32,
    max_queue: AtomicU32,
}

/// The slots, and how many of those in use are to be taken away as they come back (a
/// limit lowered below what is in flight).
struct Slots {
    semaphore: Arc<Semaphore>,
    debt: Arc<Mutex<u32>>,
}

/// A slot of a gate, held for a request's call (a stream's until it ends); given back when
/// dropped, or taken away if the gate was made smaller meanwhile.
pub struct Slot {
    permit: Option<OwnedSemaphorePermit>,
    debt: Arc<Mutex<u32>>,
}

impl Drop for Slot {
    fn drop(&mut self) {
        // Under the lock `resize` takes: a slot coming back while it lowers the limit is
        // either given back before the resize counts what it can take at once, or pays.
        let mut debt = self.debt.lock();
        if *debt > 0 {
            *debt -= 1;
            if let Some(p) = self.permit.take() {
                p.forget();
            }
        } else {
            drop(self.permit.take());
        }
    }
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
        let slots = (max_concurrent > 0).then(|| Slots {
            semaphore: Arc::new(Semaphore::new(max_concurrent as usize)),
            debt: Arc::default(),
        });
        Self {
            slots,
            waiting: AtomicU32::new(0),
            max_concurrent: AtomicU32::new(max_concurrent),
            max_queue: AtomicU32::new(max_queue),
        }
    }

    /// Whether this gate can take these limits in place: a gate stays a gate (switching
    /// one on or off makes a new one: `Pool::carried`).
    pub fn can_resize_to(&self, max_concurrent: u32) -> bool {
        self.slots.is_some() == (max_concurrent > 0)
    }

    /// Takes new limits: the queue's at once; `max_concurrent` raised gives its new slots
    /// at once, lowered takes free slots away at once and the rest as those in use come
    /// back, so at most the new limit is in flight once the excess has finished.
    pub fn resize(&self, max_concurrent: u32, max_queue: u32) {
        self.max_queue.store(max_queue, Ordering::Relaxed);
        let Some(slots) = &self.slots else {
            return;
        };
        let mut debt = slots.debt.lock();
        let old = self.max_concurrent.swap(max_concurrent, Ordering::Relaxed);
        if max_concurrent > old {
            let more = max_concurrent - old;
            // Slots still owed come off the raise first.
            let paid = more.min(*debt);
            *debt -= paid;
            slots.semaphore.add_permits((more - paid) as usize);
        } else if max_concurrent < old {
            let fewer = old - max_concurrent;
            let taken = slots.semaphore.forget_permits(fewer as usize) as u32;
            *debt += fewer - taken;
        }
    }

    /// A slot (`None` when the deployment has no gate), or `Busy`.
    pub async fn enter(&self, deadline: Instant) -> Result<Option<Slot>, Busy> {
        let Some(slots) = &self.slots else {
            return Ok(None);
        };
        let slot = |permit| {
            Some(Slot {
                permit: Some(permit),
                debt: slots.debt.clone(),
            })
        };
        if let Ok(p) = slots.semaphore.clone().try_acquire_owned() {
            return Ok(slot(p));
        }
        if self.waiting.fetch_add(1, Ordering::Relaxed) >= self.max_queue.load(Ordering::Relaxed) {
            self.waiting.fetch_sub(1, Ordering::Relaxed);
            return Err(Busy);
        }
        let _waiting = Waiting(&self.waiting);
        let wait = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(wait, slots.semaphore.clone().acquire_owned()).await {
            Ok(Ok(p)) => Ok(slot(p)),
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

    /// Whether a slot comes within a few milliseconds.
    async fn free(g: &Gate) -> Option<Slot> {
        g.enter(Instant::now() + Duration::from_millis(20))
            .await
            .ok()
            .flatten()
    }

    #[tokio::test]
    async fn a_gate_resized_never_lets_more_than_its_new_limit_in() {
        // A queue-only change adds no slot.
        let g = Gate::new(2, 4);
        let held = [free(&g).await.unwrap(), free(&g).await.unwrap()];
        g.resize(2, 8);
        assert!(free(&g).await.is_none(), "two in flight, two allowed");
        drop(held);

        // Lowered from 8 to 2 with 8 in flight: nothing new until 7 have come back.
        let g = Gate::new(8, 0);
        let mut held: Vec<Slot> = Vec::new();
        for _ in 0..8 {
            held.push(free(&g).await.unwrap());
        }
        g.resize(2, 0);
        for _ in 0..6 {
            held.pop();
            assert!(free(&g).await.is_none(), "{} in flight", held.len());
        }
        held.pop();
        let one = free(&g).await.expect("one in flight of two");
        assert!(free(&g).await.is_none(), "two in flight");
        drop(one);

        // Raised: the new slots at once; a raise while slots are owed pays them first.
        let g = Gate::new(4, 0);
        let held: Vec<Slot> = futures_util::future::join_all((0..4).map(|_| free(&g)))
            .await
            .into_iter()
            .flatten()
            .collect();
        g.resize(1, 0);
        g.resize(2, 0);
        drop(held);
        let two = [free(&g).await.unwrap(), free(&g).await.unwrap()];
        assert!(free(&g).await.is_none(), "the limit is 2");
        g.resize(3, 0);
        assert!(free(&g).await.is_some());
        drop(two);
    }
}
