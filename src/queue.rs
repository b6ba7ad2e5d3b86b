//! Stage 6: the priority admission gate. `max_in_flight` slots, of which `reserved[p]` may
//! be used only by priority p or a more urgent one (1 CRITICAL, 2 HIGH, 3 NORMAL, 4 LOW);
//! the rest by anyone. A request takes a slot from the most constrained pool it may use
//! (its own reserve, then less urgent reserves, then the shared slots), which keeps the
//! urgent reserves free for the urgent. Waiting requests are served by priority, then
//! arrival; at most `max_depth` wait, each at most `max_wait_seconds`. A waiter that goes
//! away (the client left) leaves the queue at once. The gate is per replica.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use tokio::sync::oneshot;

use crate::config::QueueSettings;

pub const PRIORITIES: usize = 4;

/// Where a slot came from: a priority's reserve (0..4) or the shared pool (4).
type PoolIndex = usize;
const SHARED: PoolIndex = PRIORITIES;

#[derive(Debug)]
pub enum Refused {
    Full { position: usize, eta: Duration },
    Timeout { position: usize, eta: Duration },
}

struct Waiter {
    priority: usize,
    token_id: i64,
    enqueued: Instant,
    grant: oneshot::Sender<PoolIndex>,
}

struct State {
    capacity: [u32; PRIORITIES + 1],
    used: [u32; PRIORITIES + 1],
    /// (priority index, arrival number) → waiter; iteration order is service order.
    waiting: BTreeMap<(usize, u64), Waiter>,
    next_seq: u64,
    /// Recent service time, for the wait estimate (exponential moving average, ms).
    avg_service_ms: f64,
}

pub struct Queue {
    state: Mutex<State>,
    max_depth: usize,
    max_wait: Duration,
}

/// A held slot; released (and handed to the next waiter) when dropped.
pub struct Slot {
    queue: Arc<Queue>,
    pool: PoolIndex,
    since: Instant,
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.queue.release(self.pool, self.since.elapsed());
    }
}

impl State {
    /// The most constrained pool priority index `p` (0 = CRITICAL) may take a slot from.
    fn pick(&self, p: usize) -> Option<PoolIndex> {
        (p..PRIORITIES)
            .chain(std::iter::once(SHARED))
            .find(|&i| self.used[i] < self.capacity[i])
    }

    fn position(&self, key: (usize, u64)) -> usize {
        self.waiting.range(..key).count() + 1
    }

    fn eta(&self, position: usize) -> Duration {
        let total: u32 = self.capacity.iter().sum();
        let per = self.avg_service_ms / f64::from(total.max(1));
        Duration::from_millis((per * position as f64) as u64)
    }
}

impl Queue {
    pub fn new(cfg: &QueueSettings) -> Arc<Self> {
        let reserved = cfg.reserves();
        let shared = cfg.max_in_flight.saturating_sub(reserved.iter().sum());
        let capacity = [reserved[0], reserved[1], reserved[2], reserved[3], shared];
        Arc::new(Self {
            state: Mutex::new(State {
                capacity,
                used: [0; PRIORITIES + 1],
                waiting: BTreeMap::new(),
                next_seq: 0,
                avg_service_ms: 1000.0,
            }),
            max_depth: cfg.max_depth as usize,
            max_wait: Duration::from_secs(cfg.max_wait_seconds),
        })
    }

    /// Waits for a slot for `priority` (1..=4). Dropping the future leaves the queue.
    pub async fn admit(self: &Arc<Self>, priority: u8, token_id: i64) -> Result<Slot, Refused> {
        match self.enter(priority, token_id)? {
            Admit::Now(slot) => Ok(slot),
            Admit::Wait(ticket) => ticket.granted(Instant::now() + self.max_wait).await,
        }
    }

    /// A slot now, or a place in the queue (refused when the queue is full).
    pub fn enter(self: &Arc<Self>, priority: u8, token_id: i64) -> Result<Admit, Refused> {
        let p = usize::from(priority.clamp(1, 4) - 1);
        let mut s = self.state.lock();
        // Nobody as urgent or more may be overtaken.
        if let Some(pool) = s
            .pick(p)
            .filter(|_| !s.waiting.keys().any(|&(q, _)| q <= p))
        {
            s.used[pool] += 1;
            return Ok(Admit::Now(Slot {
                queue: self.clone(),
                pool,
                since: Instant::now(),
            }));
        }
        let key = (p, s.next_seq);
        s.next_seq += 1;
        let position = s.position(key);
        if s.waiting.len() >= self.max_depth {
            return Err(Refused::Full {
                position,
                eta: s.eta(position),
            });
        }
        let (grant, rx) = oneshot::channel();
        s.waiting.insert(
            key,
            Waiter {
                priority: p,
                token_id,
                enqueued: Instant::now(),
                grant,
            },
        );
        Ok(Admit::Wait(Ticket {
            queue: self.clone(),
            key,
            rx: Some(rx),
        }))
    }

    fn release(&self, pool: PoolIndex, served: Duration) {
        let mut s = self.state.lock();
        s.used[pool] = s.used[pool].saturating_sub(1);
        s.avg_service_ms = 0.9 * s.avg_service_ms + 0.1 * served.as_millis() as f64;
        // Grant freed capacity to waiters in service order, skipping those who cannot use it.
        let keys: Vec<(usize, u64)> = s.waiting.keys().copied().collect();
        for key in keys {
            let Some(pool) = s.pick(key.0) else { continue };
            if let Some(w) = s.waiting.remove(&key) {
                if w.grant.send(pool).is_ok() {
                    s.used[pool] += 1;
                }
            }
        }
    }

    /// Waiting requests per priority (for metrics).
    pub fn depth(&self) -> [usize; PRIORITIES] {
        let s = self.state.lock();
        let mut d = [0; PRIORITIES];
        for w in s.waiting.values() {
            d[w.priority] += 1;
        }
        d
    }

    /// A token's own waiting requests: (priority, position, waited, estimated wait).
    pub fn waiting_for(&self, token_id: i64) -> Vec<(u8, usize, Duration, Duration)> {
        let s = self.state.lock();
        s.waiting
            .iter()
            .filter(|(_, w)| w.token_id == token_id)
            .map(|(k, w)| {
                let pos = s.position(*k);
                (w.priority as u8 + 1, pos, w.enqueued.elapsed(), s.eta(pos))
            })
            .collect()
    }
}

pub enum Admit {
    Now(Slot),
    Wait(Ticket),
}

/// A place in the queue. Dropping it (the client left, or gave up) leaves the queue; a
/// slot granted to it in that same instant is handed back.
pub struct Ticket {
    queue: Arc<Queue>,
    key: (usize, u64),
    rx: Option<oneshot::Receiver<PoolIndex>>,
}

/// Reads a ticket's place in the queue while the ticket itself is being waited on.
#[derive(Clone)]
pub struct Probe {
    queue: Arc<Queue>,
    key: (usize, u64),
}

impl Probe {
    /// The current position (1 = next) and the estimated wait.
    pub fn position(&self) -> (usize, Duration) {
        let s = self.queue.state.lock();
        let pos = s.position(self.key);
        (pos, s.eta(pos))
    }
}

impl Ticket {
    pub fn probe(&self) -> Probe {
        Probe {
            queue: self.queue.clone(),
            key: self.key,
        }
    }

    fn position(&self) -> (usize, Duration) {
        self.probe().position()
    }

    /// Waits until a slot is granted, at most `max_wait_seconds` and never past the
    /// request's own `deadline` (a slot granted later could not be used: the request would
    /// reach the upstream stage with no time left).
    pub async fn granted(mut self, deadline: Instant) -> Result<Slot, Refused> {
        let until = (Instant::now() + self.queue.max_wait).min(deadline);
        let waited = match self.rx.as_mut() {
            Some(rx) => tokio::time::timeout_at(until.into(), rx).await,
            None => {
                return Err(Refused::Timeout {
                    position: 1,
                    eta: Duration::ZERO,
                })
            }
        };
        match waited {
            Ok(Ok(pool)) => {
                self.rx = None;
                Ok(Slot {
                    queue: self.queue.clone(),
                    pool,
                    since: Instant::now(),
                })
            }
            _ => {
                let (position, eta) = self.position();
                Err(Refused::Timeout { position, eta })
            }
        }
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        let Some(mut rx) = self.rx.take() else { return };
        let removed = self.queue.state.lock().waiting.remove(&self.key).is_some();
        if !removed {
            if let Ok(pool) = rx.try_recv() {
                self.queue.release(pool, Duration::ZERO);
            }
        }
    }
}

impl From<Refused> for crate::error::ApiError {
    fn from(r: Refused) -> Self {
        let secs = |d: Duration| (d.as_millis() as u64).div_ceil(1000).max(1);
        match r {
            Refused::Full { position, eta } => crate::error::ApiError::QueueFull {
                position,
                eta: secs(eta),
                retry_after: secs(eta),
            },
            Refused::Timeout { position, eta } => crate::error::ApiError::QueueTimeout {
                position,
                eta: secs(eta),
                retry_after: secs(eta),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::ReservedSlots;

    fn q(max: u32, r: [u32; 4], depth: u32, wait: u64) -> Arc<Queue> {
        Queue::new(&QueueSettings {
            max_in_flight: max,
            reserved: ReservedSlots::of(r),
            max_depth: depth,
            max_wait_seconds: wait,
        })
    }

    #[tokio::test]
    async fn low_never_takes_the_critical_reserve() {
        let queue = q(4, [2, 0, 0, 0], 10, 1);
        let a = queue.admit(4, 1).await.unwrap();
        let b = queue.admit(4, 1).await.unwrap();
        assert!(
            tokio::time::timeout(Duration::from_millis(50), queue.admit(4, 1))
                .await
                .is_err(),
            "LOW waits"
        );
        let c = queue.admit(1, 1).await.unwrap();
        let d = queue.admit(1, 1).await.unwrap();
        assert!(
            matches!(queue.admit(1, 1).await, Err(Refused::Timeout { .. })),
            "all four slots are taken"
        );
        drop((a, b, c, d));
    }

    #[tokio::test]
    async fn full_queues_refuse_with_a_position() {
        let queue = q(1, [0, 0, 0, 0], 1, 5);
        let _held = queue.admit(3, 1).await.unwrap();
        let q2 = queue.clone();
        let waiter = tokio::spawn(async move { q2.admit(3, 1).await.is_ok() });
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert_eq!(queue.waiting_for(1).len(), 1);
        match queue.admit(3, 2).await {
            Err(Refused::Full { position, .. }) => assert_eq!(position, 2),
            _ => panic!("expected full"),
        }
        drop(_held);
        assert!(waiter.await.unwrap());
    }

    #[tokio::test]
    async fn waiters_go_by_priority_then_arrival() {
        let queue = q(1, [0, 0, 0, 0], 10, 5);
        let held = queue.admit(3, 0).await.unwrap();
        let order = Arc::new(parking_lot::Mutex::new(Vec::new()));
        let mut tasks = Vec::new();
        for (tag, priority) in [("n1", 3u8), ("n2", 3), ("c", 1), ("n3", 3), ("h", 2)] {
            let (queue, order) = (queue.clone(), order.clone());
            tasks.push(tokio::spawn(async move {
                let slot = queue.admit(priority, 0).await.unwrap();
                order.lock().push(tag);
                tokio::time::sleep(Duration::from_millis(5)).await;
                drop(slot);
            }));
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        drop(held);
        for t in tasks {
            t.await.unwrap();
        }
        assert_eq!(*order.lock(), vec!["c", "h", "n1", "n2", "n3"]);
    }
}
