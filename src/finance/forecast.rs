//! Burn rate and the projected date a budget runs out: a plain, integer-only estimator.
//!
//! Input: the subject's spend on each of the last 28 complete UTC days (oldest first,
//! ending yesterday), how many of those days it existed (`known`), the budget left in the
//! current period and the day that period resets (if it does).
//!
//! - **Weekday-aware (28 known days).** A future day of weekday *w* is expected to cost
//!   `L7 × S_w / S28`: L7 the spend of the last 7 days (the recent level), S_w the spend of
//!   the 4 days on weekday *w* in the 28, S28 their total. That is each weekday's mean over
//!   the last 4 weeks scaled by the recent 7-day level; a week of it sums to exactly L7, so
//!   a flat history projects flat, a weekday pattern repeats, and a step change is followed
//!   at its new level from the first full week after it.
//! - **Flat (1 to 27 known days).** The mean of the known days, every day.
//! - **No spend at all, or no known day**: no rate, no exhaustion.
//!
//! Spend is projected from today, of which only the rest counts: today's spend so far is
//! already out of the remaining budget, so today is expected to cost max(0, its expected
//! spend − its spend so far). Counting today whole again would make a daily budget (and any
//! budget on its period's last day) "run out today" every day once it is past half used.
//! The exhaustion date is the first day whose projected cumulative spend reaches the
//! remaining budget — compared as exact rationals in `i128`, no rounding — unless the period
//! resets first (then none), and never more than a year ahead. Tolerance, on a history that
//! goes on as it was: the date is exact for a flat history, a weekday pattern and a step
//! change at least 7 days old; a step younger than 7 days is followed part-way, its date
//! between the old level's and the new one's. Today's spend so far not in the rollup
//! (adjustments) is not subtracted, so the date errs early by it; today's absorbed amounts
//! are in the rollup but not out of the remaining budget, so it errs late by them.

use chrono::{Datelike, Duration, NaiveDate};

/// The days of history the estimator reads.
pub const WINDOW: usize = 28;
/// How far ahead an exhaustion is looked for.
const HORIZON_DAYS: i64 = 366;

/// A subject's recent spend.
#[derive(Debug, Clone)]
pub struct History {
    /// Spend per complete UTC day, oldest first; the last one is yesterday. At most 28.
    pub days: Vec<i64>,
    /// How many of the latest days the subject existed (the rest are before it).
    pub known: usize,
    /// Spend so far today (the day in progress, not in `days`).
    pub today: i64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Forecast {
    /// The expected spend of the next 7 days (today first), in micro-dollars (rounded down).
    pub next_days: Vec<(NaiveDate, i64)>,
    /// The day the remaining budget is expected to run out.
    pub exhausts_on: Option<NaiveDate>,
}

/// The estimator's daily rate as an exact fraction: day `d` costs `num(d) / den`.
enum Rate {
    None,
    Flat {
        sum: i128,
        days: i128,
    },
    Weekday {
        level: i128,
        by_weekday: [i128; 7],
        total: i128,
    },
}

impl Rate {
    fn of(h: &History, yesterday: NaiveDate) -> Rate {
        let days: Vec<i128> = h.days.iter().map(|&d| i128::from(d.max(0))).collect();
        let n = h.known.min(days.len());
        if n == 0 {
            return Rate::None;
        }
        let recent = &days[days.len() - n..];
        let sum: i128 = recent.iter().sum();
        if sum == 0 {
            return Rate::None;
        }
        if n < WINDOW {
            return Rate::Flat {
                sum,
                days: n as i128,
            };
        }
        let mut by_weekday = [0i128; 7];
        for (i, spend) in recent.iter().enumerate() {
            let date = yesterday - Duration::days((n - 1 - i) as i64);
            by_weekday[date.weekday().num_days_from_monday() as usize] += spend;
        }
        Rate::Weekday {
            level: recent[n - 7..].iter().sum(),
            by_weekday,
            total: sum,
        }
    }

    /// (numerator, denominator) of day `d`'s expected spend.
    fn day(&self, d: NaiveDate) -> (i128, i128) {
        match self {
            Rate::None => (0, 1),
            Rate::Flat { sum, days } => (*sum, *days),
            Rate::Weekday {
                level,
                by_weekday,
                total,
            } => (
                level * by_weekday[d.weekday().num_days_from_monday() as usize],
                *total,
            ),
        }
    }
}

/// The projection for a subject with `remaining` micro-dollars left in a period that resets
/// on `resets_on` (`None`: never), seen on `today`.
pub fn forecast(
    h: &History,
    today: NaiveDate,
    remaining: i64,
    resets_on: Option<NaiveDate>,
) -> Forecast {
    let rate = Rate::of(h, today - Duration::days(1));
    let next_days = (0..7)
        .map(|k| {
            let d = today + Duration::days(k);
            let (num, den) = rate.day(d);
            (d, i64::try_from(num / den).unwrap_or(i64::MAX))
        })
        .collect();
    Forecast {
        next_days,
        exhausts_on: exhaustion(&rate, today, h.today, remaining, resets_on),
    }
}

fn exhaustion(
    rate: &Rate,
    today: NaiveDate,
    spent_today: i64,
    remaining: i64,
    resets_on: Option<NaiveDate>,
) -> Option<NaiveDate> {
    if remaining <= 0 {
        return Some(today);
    }
    if matches!(rate, Rate::None) {
        return None;
    }
    // Σ num over the days so far, against remaining × den (every day shares `den`); today
    // starts its spend so far behind, as that is already out of `remaining`, and counts
    // nothing below zero (a day already spent past its expectation adds nothing more).
    let (_, den) = rate.day(today);
    let target = i128::from(remaining) * den;
    let mut spent = -(i128::from(spent_today.max(0)) * den);
    for k in 0..HORIZON_DAYS {
        let d = today + Duration::days(k);
        if resets_on.is_some_and(|r| d >= r) {
            return None;
        }
        spent = (spent + rate.day(d).0).max(0);
        if spent >= target {
            return Some(d);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    const M: i64 = 1_000_000;

    /// A Wednesday.
    fn today() -> NaiveDate {
        NaiveDate::from_ymd_opt(2026, 3, 4).unwrap()
    }

    /// 28 days ending yesterday, each `f(its date)`.
    fn history(f: impl Fn(NaiveDate) -> i64) -> History {
        let days = (1..=28)
            .rev()
            .map(|back| f(today() - Duration::days(back)))
            .collect();
        History {
            days,
            known: 28,
            today: 0,
        }
    }

    /// The true exhaustion day of a history that goes on as `f` says.
    fn truth(f: impl Fn(NaiveDate) -> i64, remaining: i64) -> NaiveDate {
        let mut left = remaining;
        let mut d = today();
        loop {
            left -= f(d);
            if left <= 0 {
                return d;
            }
            d += Duration::days(1);
        }
    }

    fn weekdays_only(d: NaiveDate) -> i64 {
        if d.weekday().num_days_from_monday() < 5 {
            2 * M
        } else {
            0
        }
    }

    #[test]
    fn a_flat_history_runs_out_on_the_day_it_must() {
        let f = |_| M;
        let got = forecast(&history(f), today(), 10 * M, None);
        assert_eq!(got.exhausts_on, Some(truth(f, 10 * M)));
        assert_eq!(got.exhausts_on, Some(today() + Duration::days(9)));
        assert!(got.next_days.iter().all(|(_, s)| *s == M));
    }

    #[test]
    fn a_weekday_pattern_is_repeated() {
        for remaining in [3 * M, 11 * M, 15 * M, 33 * M] {
            let got = forecast(&history(weekdays_only), today(), remaining, None);
            assert_eq!(
                got.exhausts_on,
                Some(truth(weekdays_only, remaining)),
                "{remaining}"
            );
        }
        let got = forecast(&history(weekdays_only), today(), M, None);
        // Wednesday to Tuesday: weekdays 2, the weekend 0.
        let week: Vec<i64> = got.next_days.iter().map(|(_, s)| *s).collect();
        assert_eq!(week, vec![2 * M, 2 * M, 2 * M, 0, 0, 2 * M, 2 * M]);
    }

    #[test]
    fn a_step_change_is_followed_at_its_new_level() {
        let step = today() - Duration::days(7);
        let f = |d: NaiveDate| if d < step { M } else { 3 * M };
        let got = forecast(&history(f), today(), 20 * M, None);
        assert_eq!(got.exhausts_on, Some(truth(f, 20 * M)));
        // A step 3 days ago is followed part-way (the 7-day level mixes both levels): the
        // date falls between the old level's and the new one's.
        let step = today() - Duration::days(3);
        let f = |d: NaiveDate| if d < step { M } else { 3 * M };
        let got = forecast(&history(f), today(), 10 * M, None)
            .exhausts_on
            .unwrap();
        assert!(got > truth(f, 10 * M), "{got}");
        assert!(got < truth(|_| M, 10 * M), "{got}");
    }

    #[test]
    fn zero_spend_never_runs_out() {
        let got = forecast(&history(|_| 0), today(), 10 * M, None);
        assert_eq!(got.exhausts_on, None);
        assert!(got.next_days.iter().all(|(_, s)| *s == 0));
        // A budget already spent is out today, whatever the rate.
        assert_eq!(
            forecast(&history(|_| 0), today(), 0, None).exhausts_on,
            Some(today())
        );
    }

    #[test]
    fn a_new_subject_is_projected_flat_from_the_days_it_has() {
        let mut h = history(|_| 0);
        h.known = 3;
        let n = h.days.len();
        h.days[n - 3..].copy_from_slice(&[M, 2 * M, 3 * M]);
        // 2 USD a day: 10 USD last through the fifth day.
        let got = forecast(&h, today(), 10 * M, None);
        assert_eq!(got.exhausts_on, Some(today() + Duration::days(4)));
        h.known = 0;
        assert_eq!(forecast(&h, today(), 10 * M, None).exhausts_on, None);
    }

    #[test]
    fn today_counts_only_what_is_expected_beyond_its_spend_so_far() {
        let mut h = history(|_| 8 * M);
        h.today = 6 * M;
        let tomorrow = Some(today() + Duration::days(1));
        // A daily budget of 10 with 6 spent: 2 more expected today, 4 left.
        assert_eq!(forecast(&h, today(), 4 * M, tomorrow).exhausts_on, None);
        h.today = 3 * M;
        assert_eq!(
            forecast(&h, today(), 7 * M, tomorrow).exhausts_on,
            None,
            "5 more expected today, 7 left"
        );
        assert_eq!(
            forecast(&h, today(), 5 * M, tomorrow).exhausts_on,
            Some(today()),
            "5 more expected today, 5 left"
        );
        // Spent past the day's expectation: nothing more today, 8 tomorrow.
        h.today = 9 * M;
        assert_eq!(
            forecast(&h, today(), M, None).exhausts_on,
            Some(today() + Duration::days(1))
        );
        // 6 spent today, 11 left: 2 today, 8 tomorrow, the rest the day after.
        h.today = 6 * M;
        assert_eq!(
            forecast(&h, today(), 11 * M, None).exhausts_on,
            Some(today() + Duration::days(2))
        );
        // The projection shows each day's whole expected spend, today's too.
        assert_eq!(forecast(&h, today(), 11 * M, None).next_days[0].1, 8 * M);
    }

    #[test]
    fn a_period_that_resets_first_has_no_exhaustion() {
        let f = |_| M;
        let resets = Some(today() + Duration::days(5));
        assert_eq!(
            forecast(&history(f), today(), 10 * M, resets).exhausts_on,
            None
        );
        let resets = Some(today() + Duration::days(10));
        assert_eq!(
            forecast(&history(f), today(), 10 * M, resets).exhausts_on,
            Some(today() + Duration::days(9))
        );
    }
}
