//! The weekly spend digest per team, to the alert webhooks (`weekly_digest`): the ISO week
//! that ended last — its total, top tokens, top models, the team budget's forecast, and
//! anomalies: a token that spent at least 5× its usual daily amount on a day (usual: its
//! mean over the 28 days before that week; a token with no spend then has no usual yet).
//! Sent once per team and ISO week across every replica (`store::finance::note_once`); a
//! team that spent nothing that week gets none.

use std::collections::HashMap;

use chrono::{Datelike, Duration, NaiveDate};

use super::budgets;
use crate::quota::pricing::usd;
use crate::state::AppState;
use crate::store::finance::{self, TokenDay};
use crate::store::reports::{self, GroupBy};
use crate::store::{directory, tokens, StoreError};

pub const KIND: &str = "weekly_digest";
/// A day at this many times a token's usual daily spend is an anomaly.
const ANOMALY_FACTOR: i128 = 5;
const TOP: usize = 5;

/// Sends the digest of last week to every team not yet sent it; how many this replica sent.
pub async fn send(state: &AppState) -> Result<usize, StoreError> {
    let now = state.clock.now();
    let today = now.date_naive();
    let monday = today - Duration::days(i64::from(today.weekday().num_days_from_monday()));
    let (from, to) = (monday - Duration::days(7), monday);
    let iso = from.iso_week();
    let week = format!("{}-W{:02}", iso.year(), iso.week());
    let at = |d: NaiveDate| crate::clock::db_time(d.and_time(chrono::NaiveTime::MIN).and_utc());
    let days = finance::spend_by_token_day(&state.db, from - Duration::days(28), to).await?;
    let labels: HashMap<i64, String> = tokens::list(&state.db)
        .await?
        .into_iter()
        .map(|t| (t.id, format!("{}… ({})", t.prefix, t.user)))
        .collect();
    let forecasts = budgets::forecasts(&state.db, None, now).await?;
    let mut sent = 0;
    for team in directory::teams(&state.db, None).await? {
        let scope = Some(team.id);
        let by_token = reports::spend(&state.db, scope, GroupBy::Token, &at(from), &at(to)).await?;
        let total: i64 = by_token.iter().map(|r| r.spend_micros).sum();
        if total == 0 {
            continue;
        }
        let subject = format!("team:{}", team.id);
        if !finance::note_once(&state.db, KIND, &subject, &week, now).await? {
            continue;
        }
        let by_model = reports::spend(&state.db, scope, GroupBy::Model, &at(from), &at(to)).await?;
        let mut text = format!(
            "weekly digest of team {} for {week} ({from} to {}): {} USD over {} requests",
            team.name,
            to - Duration::days(1),
            usd(total),
            by_token.iter().map(|r| r.requests).sum::<i64>()
        );
        text.push_str("\ntop tokens:");
        for r in by_token.iter().take(TOP) {
            text.push_str(&format!(" {} {} USD;", r.label, usd(r.spend_micros)));
        }
        text.push_str("\ntop models:");
        for r in by_model.iter().take(TOP) {
            text.push_str(&format!(" {} {} USD;", r.label, usd(r.spend_micros)));
        }
        match forecasts
            .iter()
            .find(|f| f.kind == "team" && f.id == team.id)
        {
            Some(f) => text.push_str(&format!(
                "\nforecast: {} USD left of {}; {}",
                usd(f.remaining_micros),
                usd(f.limit_micros),
                match &f.exhausts_on {
                    Some(d) => format!("projected to run out on {d}"),
                    None => "not projected to run out this period".into(),
                }
            )),
            None => text.push_str("\nforecast: the team has no budget"),
        }
        let found = anomalies(&days, team.id, from, to);
        if found.is_empty() {
            text.push_str("\nanomalies: none");
        }
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
        state.alerts.raise(KIND, &subject, &text);
        sent += 1;
    }
    Ok(sent)
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
    let mut out = Vec::new();
    for d in days
        .iter()
        .filter(|d| d.team_id == Some(team) && d.day >= from_s && d.day < to_s)
    {
        let Some(&sum) = before.get(&d.token_id).filter(|s| **s > 0) else {
            continue;
        };
        // spend ≥ 5 × sum / 28, exactly.
        if i128::from(d.cost_micros) * 28 >= ANOMALY_FACTOR * sum {
            let usual = i64::try_from(sum / 28).unwrap_or(i64::MAX);
            out.push((d.token_id, d.day.clone(), d.cost_micros, usual));
        }
    }
    out
}
