//! Stage 3: sliding windows per token and per user (requests and tokens per window).
//!
//! With `[redis]` configured, windows live in Redis (`redis_window.rs`, one Lua script per
//! request: `window.lua`). Without it, or while Redis is failing, the in-process store
//! (`local_window.rs`) applies the same rules; during a Redis outage each replica admits
//! `limit / ratelimit.expected_replicas`, so the fleet as a whole stays near the limit.
//! Money never depends on any of this: budgets are the ledger's.
//!
//! Token windows are booked at the worst case and corrected to what was used by a
//! [`Booking`] guard on every outcome; window names carry Redis Cluster hash tags so that
//! every key of one script call shares a slot (see [`WindowSpec`]).

pub mod local_window;
pub mod redis_conn;
pub mod redis_window;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use local_window::LocalWindows;
use redis_window::RedisWindows;

/// One window a request is checked against: the token's, the user's or an upstream key's.
#[derive(Debug, Clone)]
pub struct WindowSpec {
    /// Names the window; Redis keys add a versioned prefix and a kind suffix. Built only by
    /// the constructors below, which own the naming rule.
    pub key: String,
    /// Requests per window (0 = none).
    pub requests: u64,
    /// Tokens per window (0 = none).
    pub tokens: u64,
}

/// Window names carry a Redis Cluster hash tag (`{…}`): every key of one script call must
/// hash to one slot, so a request's token and user windows both take the user's tag and an
/// upstream key's window takes its own.
impl WindowSpec {
    /// A sub-token's own window: `{u:<user id>}:t:<token id>`.
    pub fn token(user_id: i64, token_id: i64, requests: u64, tokens: u64) -> Self {
        Self {
            key: format!("{{u:{user_id}}}:t:{token_id}"),
            requests,
            tokens,
        }
    }

    /// The window every token of one user shares: `{u:<user id>}`.
    pub fn user(user_id: i64, requests: u64, tokens: u64) -> Self {
        Self {
            key: format!("{{u:{user_id}}}"),
            requests,
            tokens,
        }
    }

    /// An upstream key's own window (`rpm_limit` / `tpm_limit`): `{k:<upstream id>}`.
    pub fn upstream(upstream_id: &str, requests: u64, tokens: u64) -> Self {
        Self {
            key: format!("{{k:{upstream_id}}}"),
            requests,
            tokens,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    Requests,
    Tokens,
}

/// The outcome of a check, with the first window's figures for the `x-ratelimit-*` headers.
#[derive(Debug, Clone, Copy)]
pub struct Decision {
    pub refused: Option<Refused>,
    pub retry_after: Duration,
    pub requests_limit: u64,
    pub requests_used: u64,
    pub requests_reset: Duration,
    pub tokens_limit: u64,
    pub tokens_used: u64,
    pub tokens_reset: Duration,
    /// The unix second the request's tokens were booked in (for the later correction).
    pub second: i64,
}

#[derive(Debug, thiserror::Error)]
pub enum WindowError {
    #[error("redis: {0}")]
    Redis(#[from] redis::RedisError),
    #[error("redis did not answer within the timeout")]
    Timeout,
    #[error("redis sentinel: no master known")]
    NoMaster,
    /// A window call judged late twice in a row, the second time against the clock its
    /// first answer showed (`RedisWindows::check`).
    #[error("redis judged a window call late against the clock it had just shown")]
    Late,
}

/// The store a request's tokens were booked in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Store {
    Redis,
    Local,
}

/// A request's tokens in the windows it was admitted to (its token's and user's, or one
/// upstream key's). Admission books the worst case; when the booking is dropped, every one
/// of those windows is corrected to the tokens recorded with [`Booking::used`] — 0 unless
/// something was recorded. So every outcome corrects every window it booked, the early
/// returns included (a cache hit, a quota or queue refusal, an upstream failure, a client
/// gone), and a new path cannot forget to. The correction is spawned: no I/O in `drop` and
/// no round trip on the client's path.
///
/// The correction goes only to the store that booked: a second and a bucket mean nothing in
/// the other one (the local store counts seconds on its own clock), and a delta applied to
/// buckets that never held the estimate would undercount them.
pub struct Booking {
    windows: Arc<Windows>,
    specs: Vec<WindowSpec>,
    store: Store,
    second: i64,
    estimated: i64,
    used: i64,
}

impl Booking {
    /// Records the tokens the provider actually used (input + output) for this request.
    pub fn used(&mut self, tokens: i64) {
        self.used = tokens.max(0);
    }

    /// Corrects the windows to what was recorded now, waiting for it (dropped, a booking
    /// corrects them off the path): a request that moves to another token (its own was
    /// rotated under it) gives back its estimate in its user's window before it books that
    /// window again for the new token. Cut off, the correction is left undone (the windows
    /// err towards refusing).
    pub async fn correct_now(mut self) {
        let delta = self.used - self.estimated;
        self.estimated = self.used;
        let specs = std::mem::take(&mut self.specs);
        self.windows
            .correct(self.store, &specs, self.second, delta)
            .await;
    }
}

impl Drop for Booking {
    fn drop(&mut self) {
        let delta = self.used - self.estimated;
        if delta == 0 {
            return;
        }
        // Without a runtime the process is going away; its Redis keys expire in a window.
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let (w, store, second) = (self.windows.clone(), self.store, self.second);
        let specs = std::mem::take(&mut self.specs);
        rt.spawn(async move { w.correct(store, &specs, second, delta).await });
    }
}

pub struct Windows {
    window: Duration,
    local: LocalWindows,
    redis: Option<RedisWindows>,
    /// Redis is failing: requests use the local store until a probe succeeds.
    degraded: Arc<AtomicBool>,
    replicas: u64,
}

impl Windows {
    pub fn new(window: Duration, redis: Option<RedisWindows>, replicas: u32) -> Arc<Self> {
        let w = Arc::new(Self {
            window,
            local: LocalWindows::new(window),
            redis,
            degraded: Arc::new(AtomicBool::new(false)),
            replicas: u64::from(replicas.max(1)),
        });
        if w.redis.is_some() {
            tokio::spawn(probe(w.clone()));
        }
        w
    }

    pub fn uses_redis(&self) -> bool {
        self.redis.is_some()
    }

    pub fn degraded(&self) -> bool {
        self.degraded.load(Ordering::Relaxed)
    }

    /// Checks `specs` and, if every window has room, records the request in all of them.
    pub async fn check(&self, specs: &[WindowSpec], member: &str, tokens: u64) -> Decision {
        self.check_in(specs, member, tokens).await.0
    }

    /// `check`, and the store that decided (and booked, when admitted).
    async fn check_in(&self, specs: &[WindowSpec], member: &str, tokens: u64) -> (Decision, Store) {
        if let Some(redis) = &self.redis {
            if !self.degraded() {
                match redis.check(specs, member, tokens, self.window).await {
                    Ok(d) => return (d, Store::Redis),
                    Err(e) => self.fall_back(&e),
                }
            }
            let shared: Vec<WindowSpec> = specs
                .iter()
                .map(|s| WindowSpec {
                    key: s.key.clone(),
                    requests: per_replica(s.requests, self.replicas),
                    tokens: per_replica(s.tokens, self.replicas),
                })
                .collect();
            return (self.local.check(&shared, tokens), Store::Local);
        }
        (self.local.check(specs, tokens), Store::Local)
    }

    /// Checks `specs` like `check`; when admitted into at least one token window, returns
    /// the booking that will correct them (nothing to correct otherwise: no booking).
    pub async fn admit(
        self: &Arc<Self>,
        specs: Vec<WindowSpec>,
        member: &str,
        tokens: u64,
    ) -> (Decision, Option<Booking>) {
        let (d, store) = self.check_in(&specs, member, tokens).await;
        let booked = d.refused.is_none() && specs.iter().any(|s| s.tokens > 0);
        let booking = booked.then(|| Booking {
            windows: self.clone(),
            specs,
            store,
            second: d.second,
            estimated: tokens.min(i64::MAX as u64) as i64,
            used: 0,
        });
        (d, booking)
    }

    /// Books the difference between the admission estimate and the actual usage in the
    /// store that booked it. A Redis booking corrected while Redis fails is dropped: its
    /// buckets over-count (a correction is almost always downwards) until they leave the
    /// window, which errs on the side of the limit.
    async fn correct(&self, store: Store, specs: &[WindowSpec], second: i64, delta: i64) {
        if delta == 0 {
            return;
        }
        match (store, &self.redis) {
            (Store::Redis, Some(r)) if !self.degraded() => {
                if let Err(e) = r.correct(specs, (second, delta), self.window).await {
                    self.fall_back(&e);
                }
            }
            (Store::Redis, _) => {}
            (Store::Local, _) => self.local.correct(specs, second, delta),
        }
    }

    fn fall_back(&self, e: &WindowError) {
        if !self.degraded.swap(true, Ordering::Relaxed) {
            tracing::error!(target: "sluice::alert", error = %e, "rate limiting degraded: Redis failed, using per-replica local windows");
        }
    }

    /// The Redis store, when configured and healthy (for sharing key cooldowns).
    pub fn redis(&self) -> Option<&RedisWindows> {
        self.redis.as_ref().filter(|_| !self.degraded())
    }

    /// Redis answers, or not (for `/readyz`).
    pub async fn redis_ready(&self) -> Option<bool> {
        match &self.redis {
            Some(r) => Some(r.ping().await.is_ok()),
            None => None,
        }
    }
}

fn per_replica(limit: u64, replicas: u64) -> u64 {
    if limit == 0 {
        0
    } else {
        (limit / replicas).max(1)
    }
}

/// While degraded, pings Redis every 500 ms and resumes exact limiting once it answers.
/// While healthy, asks Sentinel (when that is the topology) whether the master moved.
async fn probe(w: Arc<Windows>) {
    let mut tick = tokio::time::interval(Duration::from_millis(500));
    loop {
        tick.tick().await;
        if Arc::strong_count(&w) == 1 {
            return;
        }
        if !w.degraded() {
            if let Some(r) = &w.redis {
                if let Err(e) = r.refresh_topology().await {
                    tracing::debug!(error = %e, "asking Redis Sentinel for the master failed");
                }
            }
            continue;
        }
        if let Some(r) = &w.redis {
            if r.ping().await.is_ok() {
                w.degraded.store(false, Ordering::Relaxed);
                tracing::warn!(target: "sluice::alert", "Redis is back: exact rate limiting resumed");
            }
        }
    }
}

/// `1s`, `6m0s`, `1m30s`: durations the way OpenAI writes `x-ratelimit-reset-*`.
pub fn openai_duration(d: Duration) -> String {
    let ms = d.as_millis() as u64;
    if ms < 1000 {
        return format!("{ms}ms");
    }
    let secs = ms.div_ceil(1000);
    match (secs / 3600, (secs % 3600) / 60, secs % 60) {
        (0, 0, s) => format!("{s}s"),
        (0, m, s) => format!("{m}m{s}s"),
        (h, m, s) => format!("{h}h{m}m{s}s"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Lets the spawned corrections run.
    async fn corrections_land() {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    #[tokio::test]
    async fn a_dropped_booking_corrects_every_window_to_what_it_recorded() {
        let w = Windows::new(Duration::from_secs(60), None, 1);
        let specs = |limit| {
            vec![
                WindowSpec::token(1, 2, 0, limit),
                WindowSpec::user(1, 0, limit),
            ]
        };
        let (d, first) = w.admit(specs(100), "a", 80).await;
        assert!(d.refused.is_none() && first.is_some());
        // Nothing recorded (a refusal, a failure, a cache hit): corrected to 0.
        drop(first);
        corrections_land().await;
        let (d, second) = w.admit(specs(100), "b", 80).await;
        assert_eq!(d.tokens_used, 80, "the first booking left nothing");
        let mut second = second.unwrap();
        second.used(30);
        drop(second);
        corrections_land().await;
        // The user's window alone (first in the list, so its figures are reported).
        let (d, _) = w.admit(vec![WindowSpec::user(1, 0, 100)], "c", 70).await;
        assert!(d.refused.is_none());
        assert_eq!(d.tokens_used, 100, "30 used + 70 booked");
        // Windows without a token limit have nothing to correct: no booking.
        let (_, none) = w.admit(vec![WindowSpec::token(1, 3, 5, 0)], "d", 80).await;
        assert!(none.is_none());
    }

    #[test]
    fn durations_like_openai() {
        assert_eq!(openai_duration(Duration::from_millis(250)), "250ms");
        assert_eq!(openai_duration(Duration::from_millis(1000)), "1s");
        assert_eq!(openai_duration(Duration::from_secs(360)), "6m0s");
        assert_eq!(openai_duration(Duration::from_secs(3725)), "1h2m5s");
        assert_eq!(per_replica(10, 3), 3);
        assert_eq!(per_replica(1, 3), 1);
        assert_eq!(per_replica(0, 3), 0);
    }
}
