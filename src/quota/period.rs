//! Budget periods. A budget's remaining amount belongs to one period, named by a key
//! (`2026-11-29`, `2026-W48`, `2026-11`, `never`); UTC calendar boundaries. Rolling over is a
//! conditional write keyed by the old period (`store::ledger`), never a blind overwrite.

use chrono::{DateTime, Datelike, Duration, NaiveDate, TimeZone, Utc};

/// How far ahead of this host's clock another host's may be and still be right about the
/// budget period (`Reset::place`): NTP keeps hosts within milliseconds; a host further ahead
/// than this is taken for one whose clock is wrong.
pub const MAX_CLOCK_SKEW: Duration = Duration::days(2);

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

    /// The period a level is in at `now`, given the period it has stored, and whether it
    /// must roll over into it. Periods move forward only, within the clock skew a host may
    /// have: the stored period stays when it is `now`'s, or a later one of the same rule
    /// that starts no more than `MAX_CLOCK_SKEW` after `now` — another process whose clock
    /// is ahead already rolled the level over, and a clock behind must not roll it back.
    /// Rolling such a period back to the host's own let two hosts' clocks a period apart flip
    /// the level between their periods, each flip restoring that period's budget — a daily
    /// budget spent three times in a real day (s29 money attack F1). It gives way to `now`'s
    /// period when it is older (the boundary passed), of another rule (the reset was
    /// changed), unreadable, or further ahead than any host's clock can be right about (a
    /// host that ran with its clock years ahead must not pin the level to that future
    /// period, one budget until then: s29 final attack F1). A rollover into a period starts
    /// it at the limit less that period's ledger sum, and a rollover back from one ahead
    /// less that one's too (`counted_with`, `store::ledger`): coming back to a period never
    /// resets it a second time, and leaving a period a wrong clock put the level in never
    /// refills it.
    pub fn place(self, stored: &str, now: DateTime<Utc>) -> (String, bool) {
        let key = self.period_key(now);
        let ahead = self.start_of(stored).is_some_and(|start| {
            self.period_start(now).is_some_and(|own| start > own) && start <= now + MAX_CLOCK_SKEW
        });
        if stored == key || ahead {
            (stored.to_string(), false)
        } else {
            (key, true)
        }
    }

    /// The period whose ledger sum a rollover from `stored` into `key` subtracts from the
    /// limit besides `key`'s: `stored` when it is a later period of this rule (a rollback
    /// from a period a wrong clock put the level in, whose spend stays spent), else `key`
    /// itself (nothing more).
    pub fn counted_with<'a>(self, stored: &'a str, key: &'a str) -> &'a str {
        match self.start_of(stored).zip(self.start_of(key)) {
            Some((from, to)) if from > to => stored,
            _ => key,
        }
    }

    /// When the period `key` of this rule starts; `None` for a key of another rule, one not
    /// written as this rule writes its keys, and `Never`'s.
    fn start_of(self, key: &str) -> Option<DateTime<Utc>> {
        let day = match self {
            Reset::Daily => NaiveDate::parse_from_str(key, "%Y-%m-%d").ok()?,
            Reset::Monthly => NaiveDate::parse_from_str(&format!("{key}-01"), "%Y-%m-%d").ok()?,
            Reset::Weekly => {
                let (year, week) = key.split_once("-W")?;
                NaiveDate::from_isoywd_opt(
                    year.parse().ok()?,
                    week.parse().ok()?,
                    chrono::Weekday::Mon,
                )?
            }
            Reset::Never => return None,
        };
        let start = Utc.from_utc_datetime(&day.and_hms_opt(0, 0, 0)?);
        // Only the key this rule writes for that period (`2026-1-5` is no daily key).
        (self.period_key(start) == key).then_some(start)
    }

    /// Whole seconds (rounded up) until the period `key` of this rule ends, for the
    /// `Retry-After` of a budget refused in it: a level another host rolled into the next
    /// period refills when that one ends, not when `now`'s does (s29 money attack F2). A key
    /// not of this rule counts to the end of `now`'s period.
    pub fn seconds_to_end_of(self, key: &str, now: DateTime<Utc>) -> Option<u64> {
        let end = self.period_end(self.start_of(key).unwrap_or(now))?;
        let ms = (end - now).num_milliseconds().max(0) as u64;
        Some(ms.div_ceil(1000).max(1))
    }

    /// Whole seconds (rounded up) until the next reset, for `Retry-After`.
    pub fn seconds_to_reset(self, now: DateTime<Utc>) -> Option<u64> {
        let end = self.period_end(now)?;
        let ms = (end - now).num_milliseconds().max(0) as u64;
        Some(ms.div_ceil(1000).max(1))
    }
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
    fn periods_move_forward_within_a_hosts_clock_skew() {
        let place = |r: Reset, stored: &str, now: &str| r.place(stored, at(now));
        let eve = "2026-12-31T23:59:59.500Z";
        let key = |k: &str, roll: bool| (k.to_string(), roll);
        assert_eq!(
            place(Reset::Daily, "2026-12-31", eve),
            key("2026-12-31", false)
        );
        assert_eq!(
            place(Reset::Daily, "2026-12-30", eve),
            key("2026-12-31", true)
        );
        // A clock half a second behind must not roll the new day back to the old one.
        assert_eq!(
            place(Reset::Daily, "2027-01-01", eve),
            key("2027-01-01", false)
        );
        assert_eq!(
            place(Reset::Weekly, "2027-W01", "2027-01-03T10:00:00Z"),
            key("2027-W01", false)
        );
        // No clock within the skew of a Thursday's is in the next ISO week yet.
        assert_eq!(
            place(Reset::Weekly, "2027-W01", "2026-12-31T10:00:00Z"),
            key("2026-W53", true)
        );
        assert_eq!(place(Reset::Monthly, "2027-01", eve), key("2027-01", false));
        // A period further ahead, within a host's clock skew, is kept too: rolled back, it
        // gave the level a second budget (s29 money attack F1).
        assert_eq!(
            place(Reset::Daily, "2027-01-02", eve),
            key("2027-01-02", false)
        );
        // One starting more than the skew ahead is a wrong clock's: the host's own period,
        // not one budget until that one (s29 final attack F1).
        assert_eq!(
            place(Reset::Daily, "2027-01-03", eve),
            key("2026-12-31", true)
        );
        assert_eq!(
            place(Reset::Daily, "2036-01-01", "2026-12-31T18:00:00Z"),
            key("2026-12-31", true)
        );
        assert_eq!(place(Reset::Monthly, "2027-03", eve), key("2026-12", true));
        assert_eq!(place(Reset::Weekly, "2027-W10", eve), key("2026-W53", true));
        // Not a key this rule writes: the host's period.
        assert_eq!(
            place(Reset::Daily, "2027-1-5", eve),
            key("2026-12-31", true)
        );
        assert_eq!(place(Reset::Weekly, "2027-W99", eve), key("2026-W53", true));
        // A changed rule takes the new rule's period.
        assert_eq!(
            place(Reset::Monthly, "2026-12-31", eve),
            key("2026-12", true)
        );
        assert_eq!(place(Reset::Daily, "never", eve), key("2026-12-31", true));
        assert_eq!(place(Reset::Never, "2026-12-31", eve), key("never", true));
        assert_eq!(place(Reset::Never, "never", eve), key("never", false));
        assert_eq!(place(Reset::Daily, "", eve), key("2026-12-31", true));
    }

    #[test]
    fn only_a_move_back_from_a_later_period_of_the_rule_is_a_rollback() {
        // `counted_with` names the period a move leaves when it is a rollback (its spend
        // is carried: `store::ledger::carried_from`), else the period it enters.
        assert_eq!(
            Reset::Daily.counted_with("2036-01-01", "2026-12-31"),
            "2036-01-01"
        );
        // Forward, or from another rule's or an unreadable key: the new period's sum only.
        assert_eq!(
            Reset::Daily.counted_with("2026-12-30", "2026-12-31"),
            "2026-12-31"
        );
        assert_eq!(
            Reset::Daily.counted_with("2036-01", "2026-12-31"),
            "2026-12-31"
        );
        assert_eq!(
            Reset::Weekly.counted_with("2036-W01", "2026-W53"),
            "2036-W01"
        );
    }

    #[test]
    fn a_refusal_waits_for_the_end_of_the_period_it_was_refused_in() {
        let eve = at("2026-12-31T18:00:00Z");
        // The level another host rolled into the next day refills at that day's end.
        assert_eq!(
            Reset::Daily.seconds_to_end_of("2027-01-01", eve),
            Some(30 * 3600)
        );
        assert_eq!(
            Reset::Daily.seconds_to_end_of("2026-12-31", eve),
            Some(6 * 3600)
        );
        assert_eq!(
            Reset::Monthly.seconds_to_end_of("2027-01", eve),
            Some((31 * 24 + 6) * 3600)
        );
        assert_eq!(Reset::Daily.seconds_to_end_of("never", eve), Some(6 * 3600));
        assert_eq!(Reset::Never.seconds_to_end_of("never", eve), None);
    }
}
