//! Time comes from one `Clock`, so budget periods, expiries and windows can be tested with a
//! manual clock instead of sleeping.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::OnceLock;
use std::time::Instant;

use chrono::{DateTime, Datelike, TimeZone, Utc};

pub trait Clock: Send + Sync + 'static {
    fn now(&self) -> DateTime<Utc>;

    /// Milliseconds on a clock that never steps, from an origin of this process's own: for
    /// the waits the process measures for itself (a key's rest). On the wall clock a host
    /// stepped back an hour rested every resting key an hour more, and told clients to
    /// wait that hour (s30 upstream attack, lesser finding).
    fn monotonic_ms(&self) -> i64 {
        static ORIGIN: OnceLock<Instant> = OnceLock::new();
        i64::try_from(ORIGIN.get_or_init(Instant::now).elapsed().as_millis()).unwrap_or(i64::MAX)
    }
}

#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> DateTime<Utc> {
        Utc::now()
    }
}

/// A clock that only moves when told to (milliseconds since the epoch).
#[derive(Debug)]
pub struct ManualClock(AtomicI64);

impl ManualClock {
    pub fn new(at: DateTime<Utc>) -> Self {
        Self(AtomicI64::new(at.timestamp_millis()))
    }
    pub fn advance(&self, by: chrono::Duration) {
        self.0.fetch_add(by.num_milliseconds(), Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now(&self) -> DateTime<Utc> {
        Utc.timestamp_millis_opt(self.0.load(Ordering::SeqCst))
            .single()
            .unwrap_or_default()
    }

    /// The manual time itself: a test steps a key's rest as it steps the clock.
    fn monotonic_ms(&self) -> i64 {
        self.0.load(Ordering::SeqCst)
    }
}

/// How every timestamp is written to the database and the API: RFC 3339, UTC, milliseconds.
/// Fixed width, so text comparison in SQL orders like time.
pub fn db_time(t: DateTime<Utc>) -> String {
    t.format("%Y-%m-%dT%H:%M:%S%.3fZ").to_string()
}

/// Whether `db_time(t)` keeps that fixed width: a year of four digits. chrono writes a later
/// one as `+10000-…`, text that sorts before every real time.
pub fn storable(t: DateTime<Utc>) -> bool {
    (0..=9999).contains(&t.year())
}
