//! Per-deployment state of the key pool, read and written by the request path: cooldown,
//! disabled (quota or auth), the rate-limit streak, requests in flight, and the
//! deployment's circuit breaker, concurrency gate and retry budget. Cooldowns are also
//! learned from the upstream's own rate-limit headers (a key that reports no requests left
//! is rested until its reset instead of being sent into a 429), and, with Redis, shared
//! with the other replicas (`ops::housekeeping`).
//!
//! The state is indexed by a deployment's position in the catalog, which never changes
//! for a deployment id within the process (`catalog::Catalog::rebuild`). When the catalog
//! is rebuilt, the next pool takes over every entry of the last one (`Pool::carried`): the
//! entries are shared, so cooldowns, breakers and the requests in flight carry across.
//!
//! Every instant here (a rest's end, an attempt's send) is in `Clock::monotonic_ms`: a rest
//! is this process's own wait, which a step of the wall clock must not lengthen. Wall time
//! is only for what leaves the process: the admin's view, the value shared through Redis.

use std::sync::atomic::{AtomicI64, AtomicU32, AtomicU8, Ordering};
use std::sync::Arc;
use std::time::Duration;

use reqwest::header::HeaderMap;

use super::breaker::Breaker;
use super::catalog::Catalog;
use super::gate::Gate;
use super::retry::RetryBudget;
use crate::config::Settings;

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
            Disabled::Auth => "authentication refused",
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

pub struct Pool {
    members: Vec<Arc<Member>>,
    /// Rotates which of equally idle keys goes first, so load spreads across a pool.
    turn: std::sync::atomic::AtomicUsize,
    pub breakers: Vec<Arc<Breaker>>,
    pub gates: Vec<Arc<Gate>>,
    pub budgets: Vec<Arc<RetryBudget>>,
}

impl Pool {
    pub fn new(settings: &Settings) -> Self {
        Pool::carried(None, &Catalog::from_settings(settings), settings)
    }

    /// The pool for `catalog`: the entries of `previous` at their positions (the same
    /// deployments: positions are kept), fresh ones for deployments new to this process.
    /// A deployment's concurrency gate is made when it first appears, and again when its
    /// limits change.
    pub fn carried(previous: Option<&Pool>, catalog: &Catalog, settings: &Settings) -> Self {
        let kept = previous.map_or(0, |p| p.members.len());
        let mut pool = match previous {
            Some(p) => Pool {
                members: p.members.clone(),
                turn: std::sync::atomic::AtomicUsize::new(p.turn.load(Ordering::Relaxed)),
                breakers: p.breakers.clone(),
                gates: p.gates.clone(),
                budgets: p.budgets.clone(),
            },
            None => Pool {
                members: Vec::new(),
                turn: std::sync::atomic::AtomicUsize::new(0),
                breakers: Vec::new(),
                gates: Vec::new(),
                budgets: Vec::new(),
            },
        };
        let limits = |id: &str| {
            settings
                .upstreams
                .iter()
                .find(|u| u.id == id)
                .map_or((0, 0), |u| (u.max_concurrent, u.max_queue))
        };
        // A kept deployment whose limits changed (a reloaded file) has its gate resized in
        // place, counting the slots in flight (`Gate::resize`); one switched on or off gets
        // a new gate (nothing in flight held a slot of none).
        for (gate, d) in pool.gates.iter_mut().zip(&catalog.deployments) {
            let (concurrent, queue) = limits(&d.id);
            if gate.can_resize_to(concurrent) {
                gate.resize(concurrent, queue);
            } else {
                *gate = Arc::new(Gate::new(concurrent, queue));
            }
        }
        for d in catalog.deployments.iter().skip(kept) {
            let (concurrent, queue) = limits(&d.id);
            pool.members.push(Arc::default());
            pool.breakers
                .push(Arc::new(Breaker::new(&settings.breaker)));
            pool.gates.push(Arc::new(Gate::new(concurrent, queue)));
            pool.budgets
                .push(Arc::new(RetryBudget::new(settings.retry.budget_ratio)));
        }
        pool
    }

    pub fn disabled(&self, d: usize) -> Option<Disabled> {
        match self.members[d].disabled.load(Ordering::Relaxed) {
            1 => Some(Disabled::Quota),
            2 => Some(Disabled::Auth),
            3 => Some(Disabled::Admin),
            _ => None,
        }
    }

    pub fn is_disabled(&self, d: usize) -> bool {
        self.disabled(d).is_some()
    }

    /// Milliseconds until the deployment may be used again (0 = now).
    pub fn cooling_ms(&self, d: usize, now_ms: i64) -> u64 {
        (self.members[d].cooling_until_ms.load(Ordering::Relaxed) - now_ms).max(0) as u64
    }

    pub fn cooling_until_ms(&self, d: usize) -> i64 {
        self.members[d].cooling_until_ms.load(Ordering::Relaxed)
    }

    pub fn in_flight(&self, d: usize) -> u32 {
        self.members[d].in_flight.load(Ordering::Relaxed)
    }

    /// This request's turn, for breaking ties between equally loaded keys.
    pub fn next_turn(&self) -> usize {
        self.turn.fetch_add(1, Ordering::Relaxed)
    }

    /// Rests a deployment after a rate limit answered to an attempt sent at `sent_ms`, for
    /// `rest(streak)` from `now_ms`; returns that rest. The limit counts into the streak only
    /// when its attempt was sent after the key's last rest ended: the answers of one burst
    /// — every request it had out at once, each answered in turn, a stream's error event
    /// seconds later — rest the key as one, by the streak at the burst. Counted each, eight
    /// simultaneous 529s without a `Retry-After` rested it 2^7 s, the cap, for an overload
    /// of a second (s30 upstream attack F2). The rest that counts moves `cooling_until_ms`
    /// past every attempt of its burst in one step, so no two answers of it both count.
    pub fn rate_limited(
        &self,
        d: usize,
        (sent_ms, now_ms): (i64, i64),
        rest: impl Fn(u32) -> Duration,
    ) -> Duration {
        let m = &self.members[d];
        let until_of = |cool: Duration| {
            now_ms.saturating_add(i64::try_from(cool.as_millis()).unwrap_or(i64::MAX))
        };
        loop {
            let until = m.cooling_until_ms.load(Ordering::Relaxed);
            if sent_ms < until {
                let cool = rest(m.streak.load(Ordering::Relaxed));
                self.cool_until(d, until_of(cool));
                return cool;
            }
            let streak = m.streak.load(Ordering::Relaxed).saturating_add(1);
            let cool = rest(streak);
            let next = until_of(cool).max(until);
            if m.cooling_until_ms
                .compare_exchange(until, next, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
            {
                m.streak.store(streak, Ordering::Relaxed);
                return cool;
            }
        }
    }

    /// Rests a deployment until `until_ms` (never shortens a longer cooldown).
    pub fn cool_until(&self, d: usize, until_ms: i64) {
        self.members[d]
            .cooling_until_ms
            .fetch_max(until_ms, Ordering::Relaxed);
    }

    pub fn cool_down(&self, d: usize, now_ms: i64, for_: Duration) {
        let ms = i64::try_from(for_.as_millis()).unwrap_or(i64::MAX);
        self.cool_until(d, now_ms.saturating_add(ms));
    }

    /// Disables a deployment; `false` if it already was.
    pub fn disable(&self, d: usize, why: Disabled) -> bool {
        self.members[d].disabled.swap(why as u8, Ordering::Relaxed) == 0
    }

    /// Re-enables a deployment and clears its cooldown (an admin action).
    pub fn enable(&self, d: usize) {
        self.members[d].disabled.store(0, Ordering::Relaxed);
        self.members[d].cooling_until_ms.store(0, Ordering::Relaxed);
        self.members[d].streak.store(0, Ordering::Relaxed);
    }

    /// The deployment's key was replaced (a rotation, a SIGHUP with another key): what the
    /// pool learned from the old key — refused (401/403), out of quota, cooling down after
    /// its 429s — is not the new key's. An admin's disabling stays.
    pub fn key_replaced(&self, d: usize) {
        let m = &self.members[d];
        let learned = [1, 2];
        let _ = m
            .disabled
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| {
                learned.contains(&v).then_some(0)
            });
        m.cooling_until_ms.store(0, Ordering::Relaxed);
        m.streak.store(0, Ordering::Relaxed);
    }

    pub fn succeeded(&self, d: usize) {
        self.members[d].streak.store(0, Ordering::Relaxed);
    }

    /// Reads the upstream's own rate-limit headers (OpenAI `x-ratelimit-*`, Anthropic
    /// `anthropic-ratelimit-*`): a key with no requests or tokens left rests until the reset,
    /// but no longer than a 429 may rest it (`cap`, `retry.max_cooldown_seconds`): a lying
    /// upstream's `100000h` rested a key for years on every replica. `now_ms` is the
    /// monotonic time the rests are counted from; `wall_ms` reads Anthropic's reset instant.
    pub fn observe_headers(
        &self,
        d: usize,
        h: &HeaderMap,
        (now_ms, wall_ms): (i64, i64),
        cap: Duration,
    ) {
        let get = |k: &str| h.get(k).and_then(|v| v.to_str().ok());
        for (remaining, reset) in [
            (
                "x-ratelimit-remaining-requests",
                "x-ratelimit-reset-requests",
            ),
            ("x-ratelimit-remaining-tokens", "x-ratelimit-reset-tokens"),
        ] {
            if get(remaining).and_then(|r| r.trim().parse::<u64>().ok()) == Some(0) {
                // Azure sends the remaining counts without a reset: its windows are
                // evaluated every 1 to 10 s, so the key rests a second and its next 429
                // says how long (`retry-after-ms`).
                let ms = get(reset)
                    .and_then(parse_openai_duration_ms)
                    .unwrap_or(AZURE_REST_MS);
                self.cool_down(d, now_ms, Duration::from_millis(ms).min(cap));
            }
        }
        for (remaining, reset) in [
            (
                "anthropic-ratelimit-requests-remaining",
                "anthropic-ratelimit-requests-reset",
            ),
            (
                "anthropic-ratelimit-tokens-remaining",
                "anthropic-ratelimit-tokens-reset",
            ),
        ] {
            if get(remaining).and_then(|r| r.trim().parse::<u64>().ok()) == Some(0) {
                if let Some(at) =
                    get(reset).and_then(|r| chrono::DateTime::parse_from_rfc3339(r.trim()).ok())
                {
                    let ms = u64::try_from(at.timestamp_millis().saturating_sub(wall_ms));
                    self.cool_down(d, now_ms, Duration::from_millis(ms.unwrap_or(0)).min(cap));
                }
            }
        }
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

/// How long a key that reports nothing left, with no reset time, rests (Azure OpenAI).
const AZURE_REST_MS: u64 = 1000;

/// `20ms`, `1s`, `6m0s`, `1h2m3.5s` → milliseconds.
pub fn parse_openai_duration_ms(s: &str) -> Option<u64> {
    let s = s.trim();
    let mut total = 0f64;
    let mut num = String::new();
    let mut chars = s.chars().peekable();
    let mut any = false;
    while let Some(c) = chars.next() {
        if c.is_ascii_digit() || c == '.' {
            num.push(c);
            continue;
        }
        let value: f64 = num.parse().ok()?;
        num.clear();
        let unit = match c {
            'h' => 3_600_000.0,
            'm' if chars.peek() == Some(&'s') => {
                chars.next();
                1.0
            }
            'm' => 60_000.0,
            's' => 1000.0,
            _ => return None,
        };
        total += value * unit;
        any = true;
    }
    (any && num.is_empty()).then_some(total.ceil() as u64)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn openai_reset_durations() {
        assert_eq!(parse_openai_duration_ms("20ms"), Some(20));
        assert_eq!(parse_openai_duration_ms("1s"), Some(1000));
        assert_eq!(parse_openai_duration_ms("6m0s"), Some(360_000));
        assert_eq!(parse_openai_duration_ms("1h2m3.5s"), Some(3_723_500));
        assert_eq!(parse_openai_duration_ms("soon"), None);
    }

    fn one_upstream(max_concurrent: u32, max_queue: u32) -> Settings {
        let mut s = Settings::default();
        s.upstreams.push(crate::config::UpstreamSettings {
            id: "a".into(),
            provider: crate::config::Provider::Openai,
            base_url: "https://api.openai.com/v1".into(),
            api_key: crate::config::Secret(secrecy::SecretString::from("k")),
            max_concurrent,
            max_queue,
            ..Default::default()
        });
        s
    }

    /// A reload that changes a kept upstream's `max_concurrent` / `max_queue` takes effect
    /// (the gate was carried over as it was, the new limits ignored) on the same gate, the
    /// slots in flight counted: a new gate beside the old one let both limits in at once
    /// (s29 limits attack F2). Switching the gate off and on makes a new one.
    #[tokio::test]
    async fn a_reload_that_changes_the_limits_resizes_the_gate_in_place() {
        let soon = || std::time::Instant::now() + Duration::from_millis(20);
        let before = one_upstream(1, 0);
        let catalog = Catalog::from_settings(&before);
        let pool = Pool::carried(None, &catalog, &before);
        let held = pool.gates[0].enter(soon()).await.unwrap().expect("a slot");
        assert!(pool.gates[0].enter(soon()).await.is_err());
        let after = one_upstream(2, 2);
        let changed = Pool::carried(Some(&pool), &Catalog::from_settings(&after), &after);
        assert!(Arc::ptr_eq(&changed.gates[0], &pool.gates[0]));
        let second = changed.gates[0].enter(soon()).await.unwrap();
        assert!(second.is_some(), "raised to 2");
        assert!(
            changed.gates[0].enter(soon()).await.is_err(),
            "two in flight: the one held before the reload counts"
        );
        drop((held, second));
        let off = one_upstream(0, 0);
        let ungated = Pool::carried(Some(&changed), &Catalog::from_settings(&off), &off);
        assert!(ungated.gates[0].enter(soon()).await.unwrap().is_none());
    }

    #[test]
    fn a_key_reporting_nothing_left_rests_until_its_reset() {
        let s = one_upstream(0, 0);
        let pool = Pool::new(&s);
        let mut h = HeaderMap::new();
        h.insert("x-ratelimit-remaining-requests", "0".parse().unwrap());
        h.insert("x-ratelimit-reset-requests", "1.5s".parse().unwrap());
        pool.observe_headers(0, &h, (1_000, 1_000), Duration::from_secs(120));
        assert_eq!(pool.cooling_ms(0, 1_000), 1_500);
        // Azure: the remaining counts only, no reset: a second's rest.
        let mut azure = HeaderMap::new();
        azure.insert("x-ratelimit-remaining-tokens", "0".parse().unwrap());
        azure.insert("x-ratelimit-remaining-requests", "12".parse().unwrap());
        pool.observe_headers(0, &azure, (10_000, 10_000), Duration::from_secs(120));
        assert_eq!(pool.cooling_ms(0, 10_000), 1_000);
    }

    /// A success's reset header rests a key no longer than a 429 may (`max_cooldown_seconds`),
    /// and no value overflows: a lying upstream rested a key for years on every replica, and
    /// `9223371000000000000ms` overflowed the sum (a panic in a debug build).
    #[test]
    fn a_reset_header_rests_a_key_no_longer_than_the_cooldown_cap() {
        let cap = Duration::from_secs(120);
        for (remaining, reset, value) in [
            (
                "x-ratelimit-remaining-requests",
                "x-ratelimit-reset-requests",
                "100000h",
            ),
            (
                "x-ratelimit-remaining-tokens",
                "x-ratelimit-reset-tokens",
                "9223371000000000000ms",
            ),
            (
                "x-ratelimit-remaining-tokens",
                "x-ratelimit-reset-tokens",
                &format!("{}s", "9".repeat(320)),
            ),
            (
                "anthropic-ratelimit-requests-remaining",
                "anthropic-ratelimit-requests-reset",
                "2999-01-01T00:00:00Z",
            ),
        ] {
            let pool = Pool::new(&one_upstream(0, 0));
            let mut h = HeaderMap::new();
            h.insert(remaining, "0".parse().unwrap());
            h.insert(reset, value.parse().unwrap());
            pool.observe_headers(0, &h, (1_000, 1_000), cap);
            assert_eq!(pool.cooling_ms(0, 1_000), 120_000, "{reset}: {value}");
        }
        let pool = Pool::new(&one_upstream(0, 0));
        pool.cool_down(0, i64::MAX - 5, Duration::from_secs(1));
        assert_eq!(pool.cooling_until_ms(0), i64::MAX);
    }

    /// The rate limits of attempts sent before the key's last rest ended count as one: a
    /// burst's answers, however spread in time, rest the key by the streak at the burst;
    /// an attempt sent after the rest grows the streak (s30 upstream attack F2).
    #[test]
    fn a_bursts_rate_limits_count_once_into_the_streak() {
        let pool = Pool::new(&one_upstream(0, 0));
        let rest = |streak: u32| Duration::from_secs(1 << streak.saturating_sub(1));
        // Eight attempts sent at 0, answered 0 ms to 2.1 s later.
        for i in 0..8 {
            let now = 1_000 + 300 * i;
            assert_eq!(
                pool.rate_limited(0, (1_000, now), rest),
                rest(1),
                "answer {i}"
            );
        }
        assert_eq!(pool.cooling_until_ms(0), 1_000 + 2_100 + 1_000);
        // Sent after that rest: the streak grows, once for its burst.
        for now in [5_000, 5_001] {
            assert_eq!(pool.rate_limited(0, (4_200, now), rest), rest(2));
        }
        assert_eq!(pool.cooling_until_ms(0), 5_001 + 2_000);
        pool.succeeded(0);
        assert_eq!(pool.rate_limited(0, (8_000, 8_000), rest), rest(1));
    }
}
