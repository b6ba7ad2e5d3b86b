//! Budget periods. A budget's remaining amount belongs to one period, named by a key
//! (`2026-11-29`, `2026-W48`, `2026-11`, `never`); UTC calendar boundaries. Rolling over is a
//! conditional write keyed by the old period (`store::ledger`), never a blind overwrite.

use chrono::{DateTime, Datelike, Duration, NaiveDate, TimeZone, Utc};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reset {
    Daily,
    Weekly,
    Monthly,
    Never,
}

impl Reset {
    pub fn parse(s: &str) -> Option<Reset> {
        match s {
            "daily" => Some(Reset::Daily),
            "weekly" => Some(Reset::Weekly),
            "monthly" => Some(Reset::Monthly),
            "never" => Some(Reset::Never),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Reset::Daily => "daily",
            Reset::Weekly => "weekly",
            Reset::Monthly => "monthly",
            Reset::Never => "never",
        }
    }

    /// The key of the period that contains `now`.
    pub fn period_key(self, now: DateTime<Utc>) -> String {
        match self {
            Reset::Daily => now.format("%Y-%m-%d").to_string(),
            Reset::Weekly => {
                let w = now.iso_week();
                format!("{}-W{:02}", w.year(), w.week())
            }
            Reset::Monthly => now.format("%Y-%m").to_string(),
            Reset::Never => "never".to_string(),
        }
    }

    /// Start of the period containing `now`.
    pub fn period_start(self, now: DateTime<Utc>) -> Option<DateTime<Utc>> {
        let day = now.date_naive();
        let start = match self {
            Reset::Daily => day,
            Reset::Weekly => day - Duration::days(i64::from(day.weekday().num_days_from_monday())),
            Reset::Monthly => NaiveDate::from_ymd_opt(day.year(), day.month(), 1)?,
            Reset::Never => return None,
        };
        Some(Utc.from_utc_datetime(&start.and_hms_opt(0, 0, 0)?))
    }

    /// When the period containing `now` ends (the next reset), if it ever does.
    pub fn period_end(self, now: DateTime<Utc>) -> Option<DateTime<Utc>> {
        let start = self.period_start(now)?;
        match self {
            Reset::Daily => Some(start + Duration::days(1)),
            Reset::Weekly => Some(start + Duration::days(7)),
            Reset::Monthly => {
                let (y, m) = if start.month() == 12 {
                    (start.year() + 1, 1)
                } else {
                    (start.year(), start.month() + 1)
                };
                Some(
                    Utc.from_utc_datetime(&NaiveDate::from_ymd_opt(y, m, 1)?.and_hms_opt(0, 0, 0)?),
                )
            }
            Reset::Never => None,
        }
    }

    /// The period a level is in, given the period it has stored and the period `now` names:
    /// periods only ever move forward. A stored period newer than `now`'s (another process's
    /// clock is ahead, or this one stepped back) is kept, never reset again; an older one —
    /// or one of another rule (the level's reset was changed) — gives way to `now`'s.
    pub fn advance(stored: &str, now_key: &str) -> Advance {
        let kind = |k: &str| (k.len(), k.contains('W'));
        if stored == now_key || (kind(stored) == kind(now_key) && stored > now_key) {
            Advance::Keep
        } else {
            Advance::RollTo
        }
    }

    /// Whole seconds (rounded up) until the next reset, for `Retry-After`.
    pub fn seconds_to_reset(self, now: DateTime<Utc>) -> Option<u64> {
        let end = self.period_end(now)?;
        let ms = (end - now).num_milliseconds().max(0) as u64;
        Some(ms.div_ceil(1000).max(1))
    }
}

/// What a level's stored period does when a new reservation or adjustment comes in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Advance {
    /// The stored period is current (or newer than this clock's): it stays.
    Keep,
    /// The stored period is older: the level rolls over to the clock's period.
    RollTo,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(s).unwrap().with_timezone(&Utc)
    }

    #[test]
    fn keys_and_boundaries() {
        let t = at("2026-12-31T23:59:59Z");
        assert_eq!(Reset::Daily.period_key(t), "2026-12-31");
        assert_eq!(Reset::Monthly.period_key(t), "2026-12");
        assert_eq!(Reset::Weekly.period_key(t), "2026-W53");
        assert_eq!(Reset::Never.period_key(t), "never");
        assert_eq!(
            Reset::Monthly.period_end(t),
            Some(at("2027-01-01T00:00:00Z"))
        );
        assert_eq!(Reset::Daily.seconds_to_reset(t), Some(1));
        assert_eq!(
            Reset::Weekly.period_start(at("2026-11-29T10:00:00Z")),
            Some(at("2026-11-23T00:00:00Z"))
        );
        assert_eq!(Reset::Never.seconds_to_reset(t), None);
    }

    #[test]
    fn periods_only_move_forward() {
        use Advance::*;
        assert_eq!(Reset::advance("2026-12-01", "2026-12-01"), Keep);
        assert_eq!(Reset::advance("2026-12-01", "2026-12-02"), RollTo);
        // A clock a second behind must not roll the new day back to the old one.
        assert_eq!(Reset::advance("2026-12-02", "2026-12-01"), Keep);
        assert_eq!(Reset::advance("2026-W53", "2027-W01"), RollTo);
        assert_eq!(Reset::advance("2027-W01", "2026-W53"), Keep);
        assert_eq!(Reset::advance("2026-12", "2027-01"), RollTo);
        assert_eq!(Reset::advance("2027-01", "2026-12"), Keep);
        // A changed rule (daily → monthly, never → daily, daily → never) takes the new key.
        assert_eq!(Reset::advance("2026-12-01", "2026-12"), RollTo);
        assert_eq!(Reset::advance("never", "2026-12-01"), RollTo);
        assert_eq!(Reset::advance("2026-12-01", "never"), RollTo);
        assert_eq!(Reset::advance("never", "never"), Keep);
    }
}
