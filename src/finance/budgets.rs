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
    Ok(subjects
        .into_iter()
        .map(|s| {
            let days = daily(&rows, &s, first);
            one(s, days, first, today, now)
        })
        .collect())
}

/// A rotated token's spend is its successor's history: its text spends the successor's
/// budget, which carries on the rotated one's (`token_ops::rotate`). Each row's token
/// becomes the last of its rotations.
fn as_successors(rows: &mut [TokenDay], tokens: &[TokenSummary]) {
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

/// The subject's spend on each of the 28 days from `first`, then today's so far.
fn daily(rows: &[TokenDay], s: &Subject, first: NaiveDate) -> Vec<i64> {
    let mut days = vec![0i64; WINDOW + 1];
    let index: HashMap<String, usize> = (0..=WINDOW)
        .map(|i| ((first + Duration::days(i as i64)).to_string(), i))
        .collect();
    for r in rows {
        let mine = match s.kind {
            "token" => r.token_id == s.id,
            "user" => r.user_id == Some(s.id),
            _ => r.team_id == Some(s.id),
        };
        if let (true, Some(&i)) = (mine, index.get(&r.day)) {
            days[i] = days[i].saturating_add(r.cost_micros);
        }
    }
    days
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
