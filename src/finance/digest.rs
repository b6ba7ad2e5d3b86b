//! The weekly spend digest per team, to the alert webhooks (`weekly_digest`): the ISO week
//! that ended last — its total, top tokens, top models, the team budget's forecast, and
//! anomalies: a token that spent at least 5× its usual daily amount on a day (usual: its
//! mean over the 28 days before that week; a token with no spend then has no usual yet). A
//! rotated token's spend counts as its successor's, as its text does.
//! Sent once per team and ISO week across every replica (`store::finance::note_once`); a
//! team that spent nothing that week gets none.

use std::collections::{BTreeMap, HashMap};

use chrono::{Datelike, Duration, NaiveDate};

use super::budgets;
use crate::quota::pricing::usd;
use crate::state::AppState;
use crate::store::finance::{self, TokenDay};
use crate::store::spend::{self, Dim, Filters, SpendQuery};
use crate::store::{directory, tokens, Db, StoreError};

pub const KIND: &str = "weekly_digest";
/// A day at this many times a token's usual daily spend is an anomaly.
const ANOMALY_FACTOR: i128 = 5;
const TOP: usize = 5;

/// Sends the digest of last week to every team not yet sent it; how many this replica sent.
/// A team's week is marked sent (`note_once`) only once its digest is built, and unmarked
/// if the alerter drops it, so a store error or a dropped alert leaves it to the next check.
pub async fn send(state: &AppState) -> Result<usize, StoreError> {
    let now = state.clock.now();
    let week = Week::ended_last(now.date_naive());
    let mut days =
        finance::spend_by_token_day(&state.db, week.from - Duration::days(28), week.to).await?;
    let tokens = tokens::list(&state.db).await?;
    // A rotated token's text spends as its successor: its history is the successor's
    // usual, else a successor had none for 28 days (s29 finance attack F3).
    budgets::as_successors(&mut days, &tokens);
    let labels: HashMap<i64, String> = tokens
        .into_iter()
        .map(|t| (t.id, format!("{}… ({})", t.prefix, t.user)))
        .collect();
    let forecasts = budgets::forecasts(&state.db, None, now).await?;
    let mut sent = 0;
    for team in directory::teams(&state.db, None).await? {
        let Some(mut text) = spend(&state.db, &team, &week).await? else {
            continue;
        };
        text.push_str(&forecast(&forecasts, team.id));
        text.push_str(&anomalies_text(&days, &labels, team.id, &week));
        let subject = format!("team:{}", team.id);
        if !finance::note_once(&state.db, KIND, &subject, &week.name, now).await? {
            continue;
        }
        if !state.alerts.try_raise(KIND, &subject, &text) {
            // A failed forget costs this team the week, not the other teams their digest.
            if let Err(e) = finance::forget(&state.db, KIND, &subject, &week.name).await {
                tracing::warn!(error = %e, subject, "could not forget a dropped digest's notice");
            }
            continue;
        }
        sent += 1;
    }
    Ok(sent)
}

/// The ISO week that ended last: `[from, to)` and its name, `2026-W44`.
struct Week {
    from: NaiveDate,
    to: NaiveDate,
    name: String,
}

impl Week {
    fn ended_last(today: NaiveDate) -> Week {
        let monday = today - Duration::days(i64::from(today.weekday().num_days_from_monday()));
        let from = monday - Duration::days(7);
        let iso = from.iso_week();
        Week {
            from,
            to: monday,
            name: format!("{}-W{:02}", iso.year(), iso.week()),
        }
    }
}

/// The digest's head, top tokens and top models from the spend report's own queries (the
/// rollup); `None` when the team spent nothing that week.
async fn spend(
    db: &Db,
    team: &directory::TeamRow,
    week: &Week,
) -> Result<Option<String>, StoreError> {
    let by = |dim: Dim| SpendQuery {
        from: week.from,
        to: week.to,
        group_by: vec![dim],
        filters: Filters::default(),
        scope: Some(team.id),
    };
    let by_token = spend::report(db, &by(Dim::Token)).await?;
    let total: i64 = by_token.iter().map(|r| r.spend_micros).sum();
    if total == 0 {
        return Ok(None);
    }
    let by_model = spend::report(db, &by(Dim::Model)).await?;
    let mut text = format!(
        "weekly digest of team {} for {} ({} to {}): {} USD over {} requests",
        team.name,
        week.name,
        week.from,
        week.to - Duration::days(1),
        usd(total),
        by_token.iter().map(|r| r.requests).sum::<i64>()
    );
    for (title, rows) in [("top tokens", &by_token), ("top models", &by_model)] {
        text.push_str(&format!("\n{title}:"));
        for r in rows.iter().take(TOP) {
            let label = r.keys.first().map_or("", String::as_str);
            text.push_str(&format!(" {label} {} USD;", usd(r.spend_micros)));
        }
    }
    Ok(Some(text))
}

/// The team budget's forecast line.
fn forecast(forecasts: &[budgets::BudgetForecast], team: i64) -> String {
    match forecasts.iter().find(|f| f.kind == "team" && f.id == team) {
        Some(f) => format!(
            "\nforecast: {} USD left of {}; {}",
            usd(f.remaining_micros),
            usd(f.limit_micros),
            match &f.exhausts_on {
                Some(d) => format!("projected to run out on {d}"),
                None => "not projected to run out this period".into(),
            }
        ),
        None => "\nforecast: the team has no budget".into(),
    }
}

/// The anomaly lines of `team`'s tokens that week.
fn anomalies_text(
    days: &[TokenDay],
    labels: &HashMap<i64, String>,
    team: i64,
    week: &Week,
) -> String {
    let found = anomalies(days, team, week.from, week.to);
    if found.is_empty() {
        return "\nanomalies: none".into();
    }
    let mut text = String::new();
    for (token, day, spent, usual) in found {
        let label = labels
            .get(&token)
            .cloned()
            .unwrap_or_else(|| format!("token {token}"));
        text.push_str(&format!(
            "\nanomaly: {label} spent {} USD on {day}, at least {ANOMALY_FACTOR}× its usual {} USD a day",
            usd(spent),
            usd(usual)
        ));
    }
    text
}

/// (token, day, spend, usual daily spend) of every day in `[from, to)` a token of `team`
/// spent at least 5× its mean over the 28 days before `from`.
fn anomalies(
    days: &[TokenDay],
    team: i64,
    from: NaiveDate,
    to: NaiveDate,
) -> Vec<(i64, String, i64, i64)> {
    let (from_s, to_s) = (from.to_string(), to.to_string());
    let mut before: HashMap<i64, i128> = HashMap::new();
    for d in days
        .iter()
        .filter(|d| d.team_id == Some(team) && d.day < from_s)
    {
        *before.entry(d.token_id).or_default() += i128::from(d.cost_micros);
    }
    // A day's rows of one token are summed: a day split across a rotation is one day.
    let mut week: BTreeMap<(i64, &str), i128> = BTreeMap::new();
    for d in days
        .iter()
        .filter(|d| d.team_id == Some(team) && d.day >= from_s && d.day < to_s)
    {
        *week.entry((d.token_id, &d.day)).or_default() += i128::from(d.cost_micros);
    }
    let mut out = Vec::new();
    for ((token, day), spent) in week {
        let Some(&sum) = before.get(&token).filter(|s| **s > 0) else {
            continue;
        };
        // spend ≥ 5 × sum / 28, exactly.
        if spent * 28 >= ANOMALY_FACTOR * sum {
            let clamp = |v: i128| i64::try_from(v).unwrap_or(i64::MAX);
            out.push((token, day.to_string(), clamp(spent), clamp(sum / 28)));
        }
    }
    out
}
