//! Time comes from one `Clock`, so budget periods, expiries and windows can be tested with a
//! manual clock instead of sleeping.

use std::sync::atomic::{AtomicI64, Ordering};

use chrono::{DateTime, Datelike, TimeZone, Utc};

pub trait Clock: Send + Sync + 'static {
    fn now(&self) -> DateTime<Utc>;
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
