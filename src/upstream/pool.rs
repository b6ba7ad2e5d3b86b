//! Per-deployment state the request path reads and writes without locks: cooldown until a
//! time, disabled (quota or auth), the current rate-limit streak, and requests in flight.

use std::sync::atomic::{AtomicI64, AtomicU32, AtomicU8, Ordering};
use std::sync::Arc;
use std::time::Duration;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Disabled {
    Quota = 1,
    Auth = 2,
    /// Switched off by an admin in the UI or API.
    Admin = 3,
}

impl Disabled {
    pub fn as_str(self) -> &'static str {
        match self {
            Disabled::Quota => "quota exhausted",
            Disabled::Auth => "auth failed",
            Disabled::Admin => "disabled by an admin",
        }
    }
}

#[derive(Debug, Default)]
struct Member {
    cooling_until_ms: AtomicI64,
    disabled: AtomicU8,
    streak: AtomicU32,
    in_flight: AtomicU32,
}

#[derive(Debug)]
pub struct Pool {
    members: Vec<Member>,
}

impl Pool {
    pub fn new(deployments: usize) -> Self {
        Self {
            members: (0..deployments).map(|_| Member::default()).collect(),
        }
    }

    pub fn is_disabled(&self, d: usize) -> bool {
        self.members[d].disabled.load(Ordering::Relaxed) != 0
    }

    /// Milliseconds until the deployment may be used again (0 = now).
    pub fn cooling_ms(&self, d: usize, now_ms: i64) -> u64 {
        (self.members[d].cooling_until_ms.load(Ordering::Relaxed) - now_ms).max(0) as u64
    }

    pub fn in_flight(&self, d: usize) -> u32 {
        self.members[d].in_flight.load(Ordering::Relaxed)
    }

    /// Cools a deployment down after a rate limit; returns the streak count it used.
    pub fn rate_limited(&self, d: usize) -> u32 {
        self.members[d].streak.fetch_add(1, Ordering::Relaxed) + 1
    }

    pub fn cool_down(&self, d: usize, now_ms: i64, for_: Duration) {
        let until = now_ms + for_.as_millis() as i64;
        self.members[d]
            .cooling_until_ms
            .fetch_max(until, Ordering::Relaxed);
    }

    pub fn disable(&self, d: usize, why: Disabled) {
        self.members[d].disabled.store(why as u8, Ordering::Relaxed);
    }

    /// Why a deployment is disabled, if it is.
    pub fn disabled_reason(&self, d: usize) -> Option<Disabled> {
        match self.members[d].disabled.load(Ordering::Relaxed) {
            1 => Some(Disabled::Quota),
            2 => Some(Disabled::Auth),
            3 => Some(Disabled::Admin),
            _ => None,
        }
    }

    /// Milliseconds since the epoch until which the deployment cools down (0 = never did).
    pub fn cooling_until_ms(&self, d: usize) -> i64 {
        self.members[d].cooling_until_ms.load(Ordering::Relaxed)
    }

    /// An admin re-enables a deployment: disabled state, cooldown and streak are cleared.
    pub fn enable(&self, d: usize) {
        let m = &self.members[d];
        m.disabled.store(0, Ordering::Relaxed);
        m.cooling_until_ms.store(0, Ordering::Relaxed);
        m.streak.store(0, Ordering::Relaxed);
    }

    pub fn succeeded(&self, d: usize) {
        self.members[d].streak.store(0, Ordering::Relaxed);
    }

    /// Counts a request in flight on a deployment until the guard drops (a stream holds
    /// it until the stream ends).
    pub fn enter(self: &Arc<Self>, d: usize) -> InFlight {
        self.members[d].in_flight.fetch_add(1, Ordering::Relaxed);
        InFlight {
            pool: self.clone(),
            d,
        }
    }
}

pub struct InFlight {
    pool: Arc<Pool>,
    d: usize,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.pool.members[self.d]
            .in_flight
            .fetch_sub(1, Ordering::Relaxed);
    }
}
