//! The in-process window store: the same rules as `window.lua` (exact request log, tokens
//! in per-second buckets, rejected requests not recorded), for a single replica without
//! Redis and as the fallback while Redis fails. Time is the monotonic clock.

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use super::{Decision, Refused, WindowSpec};

#[derive(Default)]
struct Window {
    /// Admission times (ms since `origin`) of the requests in the window, oldest first.
    requests: VecDeque<u64>,
    /// (second since `origin`, tokens), oldest first.
    tokens: VecDeque<(i64, i64)>,
}

pub struct LocalWindows {
    window_ms: u64,
    origin: Instant,
    state: Mutex<(HashMap<String, Window>, u64)>,
}

/// Every this many checks, windows that have emptied are dropped.
const SWEEP_EVERY: u64 = 4096;

impl LocalWindows {
    pub fn new(window: Duration) -> Self {
        Self {
            window_ms: window.as_millis() as u64,
            origin: Instant::now(),
            state: Mutex::new((HashMap::new(), 0)),
        }
    }

    fn now_ms(&self) -> u64 {
        self.origin.elapsed().as_millis() as u64 + self.window_ms
    }

    pub fn check(&self, specs: &[WindowSpec], cost: u64) -> Decision {
        self.check_at(specs, cost, self.now_ms())
    }

    /// `check` at `now` (ms on this store's clock): tests step time by hand.
    fn check_at(&self, specs: &[WindowSpec], cost: u64, now: u64) -> Decision {
        let second = (now / 1000) as i64;
        let cutoff_ms = now.saturating_sub(self.window_ms);
        // Tokens are booked per second: those of second `s` leave at `s + 1 + window`.
        let cutoff_sec = (cutoff_ms / 1000) as i64;
        let cost = cost as i64;
        let mut guard = self.state.lock();
        let (map, calls) = &mut *guard;
        *calls += 1;
        if *calls % SWEEP_EVERY == 0 {
            map.retain(|_, w| {
                w.requests.back().is_some_and(|&t| t > cutoff_ms)
                    || w.tokens.back().is_some_and(|&(s, _)| s >= cutoff_sec)
            });
        }
        let mut refused = None;
        let mut retry = 0u64;
        let mut first = (0u64, 0u64, 0i64, 0u64);
        for (i, spec) in specs.iter().enumerate() {
            let w = map.entry(spec.key.clone()).or_default();
            while w.requests.front().is_some_and(|&t| t <= cutoff_ms) {
                w.requests.pop_front();
            }
            while w.tokens.front().is_some_and(|&(s, _)| s < cutoff_sec) {
                w.tokens.pop_front();
            }
            let count = w.requests.len() as u64;
            let rreset = w
                .requests
                .front()
                .map(|&t| t + self.window_ms - now)
                .unwrap_or(0);
            if spec.requests > 0 && count + 1 > spec.requests {
                refused.get_or_insert(Refused::Requests);
                retry = retry.max(self.requests_retry(w, spec.requests, now));
            }
            let used: i64 = w.tokens.iter().map(|&(_, n)| n).sum();
            let treset = w
                .tokens
                .front()
                .map(|&(s, _)| ((s + 1) as u64 * 1000 + self.window_ms).saturating_sub(now))
                .unwrap_or(0);
            if spec.tokens > 0 && used > 0 && used + cost > spec.tokens as i64 {
                refused.get_or_insert(Refused::Tokens);
                let need = used + cost - spec.tokens as i64;
                retry = retry.max(self.tokens_retry(w, need, now));
            }
            if i == 0 {
                first = (count, rreset, used, treset);
            }
        }
        if refused.is_none() {
            for spec in specs {
                let w = map.entry(spec.key.clone()).or_default();
                if spec.requests > 0 {
                    w.requests.push_back(now);
                }
                if spec.tokens > 0 {
                    match w.tokens.back_mut() {
                        Some((s, n)) if *s == second => *n += cost,
                        _ => w.tokens.push_back((second, cost)),
                    }
                }
            }
            if specs.first().is_some_and(|s| s.requests > 0) {
                first.0 += 1;
                if first.1 == 0 {
                    first.1 = self.window_ms;
                }
            }
            if specs.first().is_some_and(|s| s.tokens > 0) {
                first.2 += cost;
                if first.3 == 0 {
                    first.3 = self.window_ms;
                }
            }
        }
        let spec0 = specs.first();
        Decision {
            refused,
            retry_after: Duration::from_millis(retry),
            requests_limit: spec0.map_or(0, |s| s.requests),
            requests_used: first.0,
            requests_reset: Duration::from_millis(first.1),
            tokens_limit: spec0.map_or(0, |s| s.tokens),
            tokens_used: first.2.max(0) as u64,
            tokens_reset: Duration::from_millis(first.3),
            second,
        }
    }

    /// How long until another request fits: until the k-th oldest leaves, k = count + 1 −
    /// limit (more than one when the limit was lowered below what the window holds).
    fn requests_retry(&self, w: &Window, limit: u64, now: u64) -> u64 {
        let k = (w.requests.len() as u64).saturating_sub(limit) as usize;
        w.requests.get(k).map_or(self.window_ms, |&t| {
            (t + self.window_ms).saturating_sub(now)
        })
    }

    /// How long until `need` tokens have left: buckets oldest first until enough have gone
    /// (all of them for a request larger than the limit, which an empty window admits).
    fn tokens_retry(&self, w: &Window, need: i64, now: u64) -> u64 {
        let mut freed = 0;
        let mut last = None;
        for &(s, n) in &w.tokens {
            freed += n;
            last = Some(s);
            if freed >= need {
                break;
            }
        }
        last.map_or(0, |s| {
            ((s + 1) as u64 * 1000 + self.window_ms).saturating_sub(now)
        })
    }

    pub fn correct(&self, specs: &[WindowSpec], second: i64, delta: i64) {
        self.correct_at(specs, second, delta, self.now_ms());
    }

    /// `correct` at `now`, by `correct.lua`'s rules: a positive delta — tokens used beyond
    /// the estimate — is booked in the current second, counted for a whole window from when
    /// it is known (in the admission bucket it counted only for what was left of that one's:
    /// a second, for a stream ending just inside the window; s29 final attack F2); a
    /// negative one is taken from the admission bucket while it is in the window (never
    /// below 0), and dropped once it is gone.
    fn correct_at(&self, specs: &[WindowSpec], second: i64, delta: i64, now: u64) {
        let cutoff_sec = (now.saturating_sub(self.window_ms) / 1000) as i64;
        let current = (now / 1000) as i64;
        let mut guard = self.state.lock();
        for spec in specs.iter().filter(|s| s.tokens > 0) {
            if delta < 0 {
                let bucket = (second >= cutoff_sec)
                    .then(|| guard.0.get_mut(&spec.key))
                    .flatten()
                    .and_then(|w| w.tokens.iter_mut().find(|(s, _)| *s == second));
                if let Some((_, n)) = bucket {
                    *n = (*n + delta).max(0);
                }
            } else if delta > 0 {
                let w = guard.0.entry(spec.key.clone()).or_default();
                // The current second is the newest: the buckets stay oldest first.
                match w.tokens.back_mut() {
                    Some((s, n)) if *s == current => *n += delta,
                    _ => w.tokens.push_back((current, delta)),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(requests: u64, tokens: u64) -> Vec<WindowSpec> {
        vec![WindowSpec {
            key: "t:1".into(),
            requests,
            tokens,
        }]
    }

    #[test]
    fn exact_counts_and_rejections_are_not_recorded() {
        let w = LocalWindows::new(Duration::from_secs(60));
        for i in 0..10 {
            let d = w.check(&spec(10, 0), 1);
            assert!(d.refused.is_none(), "{i}");
            assert_eq!(d.requests_used, i + 1);
        }
        for _ in 0..100 {
            let d = w.check(&spec(10, 0), 1);
            assert_eq!(d.refused, Some(Refused::Requests));
            assert!(d.retry_after <= Duration::from_secs(60));
        }
        assert_eq!(
            w.check(&spec(10, 0), 1).requests_used,
            10,
            "rejections left no trace"
        );
    }

    #[test]
    fn tokens_are_booked_and_corrected() {
        let w = LocalWindows::new(Duration::from_secs(60));
        let d = w.check(&spec(0, 100), 80);
        assert!(d.refused.is_none());
        assert_eq!(w.check(&spec(0, 100), 30).refused, Some(Refused::Tokens));
        w.correct(&spec(0, 100), d.second, -60);
        assert!(
            w.check(&spec(0, 100), 30).refused.is_none(),
            "80 corrected to 20 leaves room for 30"
        );
    }

    /// A stream longer than the window is corrected after its admission second has left:
    /// the tokens it used beyond its estimate are booked in the current second, for a whole
    /// window. Before, the correction found no bucket and was dropped (s29 limits attack
    /// F1). A negative correction for a gone bucket is still dropped.
    #[test]
    fn a_positive_correction_after_the_window_moved_on_is_booked_now() {
        let w = LocalWindows::new(Duration::from_secs(2));
        let booked = w.check_at(&spec(0, 100), 30, T0);
        assert!(booked.refused.is_none());
        // 4 s later the admission second has left the window (it left at T0 + 3 s); the
        // stream used 150, 120 beyond its estimate.
        let later = T0 + 4000;
        w.correct_at(&spec(0, 100), booked.second, 120, later);
        let d = w.check_at(&spec(0, 100), 1, later + 10);
        assert_eq!(d.refused, Some(Refused::Tokens), "{}", d.tokens_used);
        assert_eq!(
            d.tokens_used, 120,
            "the delta alone: the estimate counted already"
        );
        // Counted for a whole window from its second, then gone.
        let gone = later + 3000;
        assert_eq!(w.check_at(&spec(0, 100), 1, gone).tokens_used, 1);
        // Negative, for a bucket gone: nothing changes, nothing below 0.
        w.correct_at(&spec(0, 100), booked.second, -500, gone + 5000);
        assert_eq!(w.check_at(&spec(0, 100), 1, gone + 5000).tokens_used, 1);
    }

    /// Tokens used beyond the estimate are counted for a whole window from when they are
    /// known, whatever is left of the admission bucket's: booked into that bucket just
    /// before it left, they counted for a second, and a stream ending just inside the window
    /// kept most of its output out of it (s29 final attack F2).
    #[test]
    fn a_positive_correction_counts_for_a_whole_window_from_its_second() {
        let w = LocalWindows::new(Duration::from_secs(2));
        let booked = w.check_at(&spec(0, 1000), 30, T0);
        // 2.5 s on, the admission bucket is still in the window (it leaves at T0 + 3 s).
        let now = T0 + 2500;
        w.correct_at(&spec(0, 1000), booked.second, 120, now);
        assert_eq!(
            w.check_at(&spec(0, 1000), 1, T0 + 3500).tokens_used,
            120 + 1
        );
        // A negative correction still takes from the admission bucket.
        let w = LocalWindows::new(Duration::from_secs(2));
        let booked = w.check_at(&spec(0, 1000), 300, T0);
        w.correct_at(&spec(0, 1000), booked.second, -200, T0 + 500);
        assert_eq!(w.check_at(&spec(0, 1000), 0, T0 + 600).tokens_used, 100);
    }

    /// A minute's window on a hand-stepped clock: `T0` is a whole second.
    const T0: u64 = 100_000;

    #[test]
    fn retry_after_lasts_until_enough_requests_leave() {
        let w = LocalWindows::new(Duration::from_secs(60));
        for i in 0..10 {
            assert!(w.check_at(&spec(10, 0), 1, T0 + i * 1000).refused.is_none());
        }
        let now = T0 + 10_000;
        // One must leave: the oldest (booked at T0) leaves at T0 + 60 s.
        let d = w.check_at(&spec(10, 0), 1, now);
        assert_eq!(d.refused, Some(Refused::Requests));
        assert_eq!(d.retry_after, Duration::from_millis(T0 + 60_000 - now));
        // The limit lowered to 3: 10 + 1 − 3 = 8 must leave; the 8th oldest was booked at
        // T0 + 7 s. Waiting only for the oldest would answer 50 s and refuse again then.
        let d = w.check_at(&spec(3, 0), 1, now);
        assert_eq!(d.refused, Some(Refused::Requests));
        assert_eq!(
            d.retry_after,
            Duration::from_millis(T0 + 7000 + 60_000 - now)
        );
    }

    #[test]
    fn retry_after_lasts_until_enough_tokens_leave() {
        let w = LocalWindows::new(Duration::from_secs(60));
        for i in 0..3 {
            assert!(w
                .check_at(&spec(0, 100), 30, T0 + i * 1000)
                .refused
                .is_none());
        }
        let now = T0 + 3000;
        // 90 used + 20 − 100 = 10 must leave: the oldest bucket (second T0) is enough.
        let d = w.check_at(&spec(0, 100), 20, now);
        assert_eq!(d.refused, Some(Refused::Tokens));
        assert_eq!(
            d.retry_after,
            Duration::from_millis(T0 + 1000 + 60_000 - now)
        );
        // 90 + 50 − 100 = 40 must leave: the two oldest buckets (30 + 30).
        let d = w.check_at(&spec(0, 100), 50, now);
        assert_eq!(
            d.retry_after,
            Duration::from_millis(T0 + 2000 + 60_000 - now)
        );
        // Larger than the whole limit: admitted into an empty window, so all must leave.
        let d = w.check_at(&spec(0, 100), 500, now);
        assert_eq!(
            d.retry_after,
            Duration::from_millis(T0 + 3000 + 60_000 - now)
        );
    }

    /// Tokens booked in second `s` leave at `s + 1 + window` (what `Retry-After` says), not
    /// at `s + window`: they were booked as late as `s + 0.999`. Dropped a second early, a
    /// 2 s window let twice the limit through in 1.1 s (s25 attack, windows #5).
    #[test]
    fn tokens_leave_a_second_after_the_window_of_their_second() {
        let w = LocalWindows::new(Duration::from_secs(2));
        assert!(w.check_at(&spec(0, 100), 100, T0 + 950).refused.is_none());
        let d = w.check_at(&spec(0, 100), 100, T0 + 2050);
        assert_eq!(
            d.refused,
            Some(Refused::Tokens),
            "1.1 s later, still in the window"
        );
        assert_eq!(
            d.retry_after,
            Duration::from_millis(T0 + 3000 - (T0 + 2050))
        );
        assert!(w.check_at(&spec(0, 100), 100, T0 + 3000).refused.is_none());
    }
}
