//! One log line per while for a fault every request meets. While a store holds cache hits'
//! budget reads (up to ~10 s), each hit logged the same warning: thousands of lines a
//! second at a hit rate, each written under stderr's lock on the request path (s42 final
//! attack F5). A gate lets the first through, counts the rest, and the next line it lets
//! through says how many it held back; a counter metric keeps every occurrence.

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::time::Duration;

use crate::clock::{Clock, SystemClock};

pub struct WarnGate {
    every_ms: i64,
    /// When a line was last let through, on the process's monotonic clock (ms); `NEVER`
    /// before the first.
    last: AtomicI64,
    /// Lines held back since.
    held: AtomicU64,
}

const NEVER: i64 = i64::MIN;

impl WarnGate {
    pub const fn new(every: Duration) -> WarnGate {
        WarnGate {
            every_ms: every.as_millis() as i64,
            last: AtomicI64::new(NEVER),
            held: AtomicU64::new(0),
        }
    }

    /// Whether to log now: `Some(n)`, with the `n` lines held back since the last one let
    /// through, at most once per `every`; `None` (one more held back) otherwise.
    pub fn admit(&self) -> Option<u64> {
        self.admit_at(SystemClock.monotonic_ms())
    }

    fn admit_at(&self, now: i64) -> Option<u64> {
        let last = self.last.load(Ordering::Relaxed);
        let due = last == NEVER || now.saturating_sub(last) >= self.every_ms;
        // Of callers at the same instant, one wins the slot.
        if !due
            || self
                .last
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_err()
        {
            self.held.fetch_add(1, Ordering::Relaxed);
            return None;
        }
        Some(self.held.swap(0, Ordering::Relaxed))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lets_one_line_through_per_while_and_tells_how_many_it_held() {
        let gate = WarnGate::new(Duration::from_secs(10));
        assert_eq!(gate.admit_at(5), Some(0), "the first goes through");
        for at in [5, 6, 9_000, 10_004] {
            assert_eq!(gate.admit_at(at), None, "held at {at}");
        }
        assert_eq!(
            gate.admit_at(10_005),
            Some(4),
            "the next, with the held count"
        );
        assert_eq!(gate.admit_at(10_006), None);
        assert_eq!(gate.admit_at(40_000), Some(1));
    }

    #[test]
    fn lets_the_first_line_through_at_any_clock_reading() {
        for start in [i64::MIN + 1, -1, 0, i64::MAX] {
            let gate = WarnGate::new(Duration::from_secs(10));
            assert_eq!(gate.admit_at(start), Some(0), "first at {start}");
            assert_eq!(gate.admit_at(start), None, "second at {start}");
        }
    }
}
