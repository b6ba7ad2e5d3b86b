//! Every budget's forecast: spendable tokens, users and teams with a limit, each with its
//! last 28 days of spend from the daily rollup (`store::finance::spend_by_token_day`) run
//! through `forecast`. A subject's history starts on its first day of spend in the window; one
//! whose first spend falls in the window's first week is taken as older than the window
//! (a weekday pattern may well start with idle days).

use std::collections::{HashMap, HashSet};

use chrono::{DateTime, Duration, NaiveDate, Utc};
use serde::Serialize;

use super::forecast::{self, History, WINDOW};
use crate::quota::period::Reset;
use crate::store::finance::{self, TokenDay};
use crate::store::tokens::{self, TokenSummary};
use crate::store::{directory, Db, StoreError};

#[derive(Debug, Clone, Serialize)]
pub struct DaySpend {
    pub day: String,
    pub spend_micros: i64,
}

/// One budget's projection.
#[derive(Debug, Clone, Serialize)]
pub struct BudgetForecast {
    /// `token`, `user` or `team`.
    pub kind: &'static str,
    pub id: i64,
    pub name: String,
    pub limit_micros: i64,
    pub spent_micros: i64,
    pub remaining_micros: i64,
    pub reset: String,
    /// The day the current period ends (the next reset), if it does.
    pub resets_on: Option<String>,
    /// The last 28 complete days, oldest first.
    pub history: Vec<DaySpend>,
    /// The next 7 days' expected spend, today first.
    pub projected: Vec<DaySpend>,
    pub exhausts_on: Option<String>,
}

/// Who a forecast is about.
struct Subject {
    kind: &'static str,
    id: i64,
    name: String,
    limit: i64,
    spent: i64,
    reset: Reset,
}

/// The forecasts of every budget in `scope` (`None`: every team), seen at `now`.
pub async fn forecasts(
    db: &Db,
    scope: Option<i64>,
    now: DateTime<Utc>,
) -> Result<Vec<BudgetForecast>, StoreError> {
    let today = now.date_naive();
    let first = today - Duration::days(WINDOW as i64);
    // Through today: its spend so far is what the forecast takes off today's expectation.
    let mut rows = finance::spend_by_token_day(db, first, today + Duration::days(1)).await?;
    let tokens = tokens::list(db).await?;
    as_successors(&mut rows, &tokens);
    let subjects = subjects(db, tokens, scope, now).await?;
    let histories = Histories::of(&rows, first);
    Ok(subjects
        .into_iter()
        .map(|s| {
            let days = histories.of_subject(&s);
            one(s, days, first, today, now)
        })
        .collect())
}

/// A rotated token's spend is its successor's history: its text spends the successor's
/// budget, which carries on the rotated one's (`token_ops::rotate`). Each row's token
/// becomes the last of its rotations.
pub(super) fn as_successors(rows: &mut [TokenDay], tokens: &[TokenSummary]) {
    let next: HashMap<i64, i64> = tokens
        .iter()
        .filter_map(|t| Some((t.id, t.successor_id?)))
        .collect();
    for r in rows {
        // At most one step per rotation: ends even on a (never written) cycle.
        for _ in 0..next.len() {
            let Some(&n) = next.get(&r.token_id) else {
                break;
            };
            r.token_id = n;
        }
    }
}

/// A token whose budget can still be spent: not revoked, not expired, not rotated (its text
/// works as its successor, whose budget is the one spent).
fn spendable(t: &TokenSummary, now: DateTime<Utc>) -> bool {
    let expired = t
        .expires_at
        .as_deref()
        .and_then(|e| DateTime::parse_from_rfc3339(e).ok())
        .is_some_and(|e| e <= now);
    !t.revoked && !expired && t.successor_id.is_none()
}

async fn subjects(
    db: &Db,
    tokens: Vec<TokenSummary>,
    scope: Option<i64>,
    now: DateTime<Utc>,
) -> Result<Vec<Subject>, StoreError> {
    let teams = directory::teams(db, scope).await?;
    let team_names: HashSet<&str> = teams.iter().map(|t| t.name.as_str()).collect();
    let mut out = Vec::new();
    for t in tokens {
        let Some(limit) = t.limit_micros.filter(|_| spendable(&t, now)) else {
            continue;
        };
        if !team_names.contains(t.team.as_str()) {
            continue;
        }
        let reset = Reset::parse(&t.reset).unwrap_or(Reset::Never);
        out.push(Subject {
            kind: "token",
            id: t.id,
            name: format!("{}… ({})", t.prefix, t.user),
            limit,
            spent: in_period(t.spent_micros, &t.period, reset, now),
            reset,
        });
    }
    for u in directory::members(db, scope).await? {
        if let Some(limit) = u.limit_micros {
            let reset = Reset::parse(&u.reset).unwrap_or(Reset::Never);
            out.push(Subject {
                kind: "user",
                id: u.id,
                name: u.username,
                limit,
                spent: in_period(u.spent_micros, &u.period, reset, now),
                reset,
            });
        }
    }
    for t in teams {
        if let Some(limit) = t.limit_micros {
            let reset = Reset::parse(&t.reset).unwrap_or(Reset::Never);
            out.push(Subject {
                kind: "team",
                id: t.id,
                name: t.name,
                limit,
                spent: in_period(t.spent_micros, &t.period, reset, now),
                reset,
            });
        }
    }
    Ok(out)
}

/// A level's spend as of `now`: a level not yet rolled into the current period (no request
/// since it ended) has spent nothing of it; its stored spend is the last period's.
fn in_period(spent: i64, period: &str, reset: Reset, now: DateTime<Utc>) -> i64 {
    if period == reset.period_key(now) {
        spent
    } else {
        0
    }
}

/// Every token's, user's and team's spend on each of the 28 days from `first`, then today's
/// so far: the rows grouped once, so the work grows with the rows, not rows × subjects.
struct Histories(HashMap<(&'static str, i64), Vec<i64>>);

impl Histories {
    fn of(rows: &[TokenDay], first: NaiveDate) -> Histories {
        let index: HashMap<String, usize> = (0..=WINDOW)
            .map(|i| ((first + Duration::days(i as i64)).to_string(), i))
            .collect();
        let mut by: HashMap<(&'static str, i64), Vec<i64>> = HashMap::new();
        for r in rows {
            let Some(&i) = index.get(&r.day) else {
                continue;
            };
            let subjects = [
                Some(("token", r.token_id)),
                r.user_id.map(|u| ("user", u)),
                r.team_id.map(|t| ("team", t)),
            ];
            for key in subjects.into_iter().flatten() {
                let days = by.entry(key).or_insert_with(|| vec![0; WINDOW + 1]);
                days[i] = days[i].saturating_add(r.cost_micros);
            }
        }
        Histories(by)
    }

    fn of_subject(&self, s: &Subject) -> Vec<i64> {
        self.0
            .get(&(s.kind, s.id))
            .cloned()
            .unwrap_or_else(|| vec![0; WINDOW + 1])
    }
}

fn one(
    s: Subject,
    mut days: Vec<i64>,
    first: NaiveDate,
    today: NaiveDate,
    now: DateTime<Utc>,
) -> BudgetForecast {
    let so_far = days.pop().unwrap_or(0);
    let known = match days.iter().position(|&d| d != 0) {
        Some(i) if i < 7 => WINDOW,
        Some(i) => WINDOW - i,
        None => 0,
    };
    let remaining = s.limit.saturating_sub(s.spent);
    let resets_on = s.reset.period_end(now).map(|t| t.date_naive());
    let f = forecast::forecast(
        &History {
            days: days.clone(),
            known,
            today: so_far,
        },
        today,
        remaining,
        resets_on,
    );
    let spend = |(d, v): (NaiveDate, i64)| DaySpend {
        day: d.to_string(),
        spend_micros: v,
    };
    BudgetForecast {
        kind: s.kind,
        id: s.id,
        name: s.name,
        limit_micros: s.limit,
        spent_micros: s.spent,
        remaining_micros: remaining,
        reset: s.reset.as_str().to_string(),
        resets_on: resets_on.map(|d| d.to_string()),
        history: days
            .into_iter()
            .enumerate()
            .map(|(i, v)| spend((first + Duration::days(i as i64), v)))
            .collect(),
        projected: f.next_days.into_iter().map(spend).collect(),
        exhausts_on: f.exhausts_on.map(|d| d.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn subject(kind: &'static str, id: i64) -> Subject {
        Subject {
            kind,
            id,
            name: String::new(),
            limit: 1,
            spent: 0,
            reset: Reset::Never,
        }
    }

    /// Every subject's days, as `forecasts` reads them.
    fn all_days(rows: &[TokenDay], subjects: &[Subject], first: NaiveDate) -> Vec<Vec<i64>> {
        let histories = Histories::of(rows, first);
        subjects.iter().map(|s| histories.of_subject(s)).collect()
    }

    /// 2 000 tokens (each its own user, in 10 teams) with 28 days and today of spend: each
    /// subject's days are read from rows grouped once, not by a walk of every row per
    /// subject (4 000 × 58 000 rows took minutes of an admin page's worker).
    #[test]
    fn thousands_of_subjects_are_read_in_one_pass_over_the_rows() {
        let first = NaiveDate::from_ymd_opt(2026, 3, 1).unwrap();
        let mut rows = Vec::new();
        for token in 1..=2000 {
            for i in 0..=WINDOW {
                rows.push(TokenDay {
                    token_id: token,
                    user_id: Some(token),
                    team_id: Some(token % 10),
                    day: (first + Duration::days(i as i64)).to_string(),
                    cost_micros: token + i as i64,
                });
            }
        }
        let mut subjects: Vec<Subject> = (1..=2000)
            .flat_map(|id| [subject("token", id), subject("user", id)])
            .collect();
        subjects.extend((0..10).map(|id| subject("team", id)));
        let started = std::time::Instant::now();
        let days = all_days(&rows, &subjects, first);
        let took = started.elapsed();
        assert!(took < std::time::Duration::from_secs(2), "{took:?}");
        assert_eq!(
            days[0],
            (0..=WINDOW as i64).map(|i| 1 + i).collect::<Vec<_>>()
        );
        assert_eq!(days[1], days[0], "the user of token 1");
        // Team 3: tokens 3, 13, …, 1993, 200 of them.
        let team3: Vec<i64> = (0..=WINDOW as i64)
            .map(|i| (0..200).map(|k| 3 + 10 * k + i).sum())
            .collect();
        assert_eq!(days[4003], team3);
    }
}
