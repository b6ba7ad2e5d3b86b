//! `budget_exhaustion_forecast` against budget periods: an exhausted budget is raised once
//! per budget period, not every day; and a budget whose period has ended (not yet rolled in
//! the store) counts nothing of the old period's spend.

use std::sync::Arc;

use chrono::{Duration, Utc};
use sluice::clock::{Clock, ManualClock};

use crate::helpers::{issue_args, spawn_app_full, TestApp};

async fn app_at(clock: &Arc<ManualClock>) -> TestApp {
    spawn_app_full(|_, _| {}, Some(clock.clone() as Arc<dyn Clock>)).await
}

async fn spend(app: &TestApp, token: i64, micros: i64, now: chrono::DateTime<Utc>) {
    sluice::store::ledger::adjust(app.db(), token, micros, "test spend", "test", now)
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exhausted_budget_is_raised_once_per_period_not_every_day() {
    let clock = Arc::new(ManualClock::new(Utc::now()));
    let app = app_at(&clock).await;
    let (token, _) = app
        .issue(sluice::cli::IssueArgs {
            budget_usd: Some("5"),
            reset: Some("never"),
            ..issue_args("ann")
        })
        .await;
    spend(&app, token, 5_000_000, clock.now()).await;
    assert_eq!(sluice::finance::alerts::check(&app.state).await.unwrap(), 1);
    for day in 1..=3 {
        clock.advance(Duration::days(1));
        assert_eq!(
            sluice::finance::alerts::check(&app.state).await.unwrap(),
            0,
            "day {day}: the same exhausted period"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_is_forecast_on_the_current_periods_spend_only() {
    let clock = Arc::new(ManualClock::new(Utc::now()));
    let app = app_at(&clock).await;
    let user = sluice::cli::UserArgs {
        username: "ann",
        team: None,
        rpm: None,
        tpm: None,
        budget_usd: Some("5"),
        reset: Some("daily"),
    };
    let uid = sluice::cli::user_create(app.db(), &user, clock.now())
        .await
        .unwrap();
    let (token, _) = app.issue(issue_args("ann")).await;
    spend(&app, token, 5_000_000, clock.now()).await;
    assert_eq!(sluice::finance::alerts::check(&app.state).await.unwrap(), 1);

    // The next day is a new period: nothing of it is spent, nothing runs out.
    clock.advance(Duration::days(1));
    let all = sluice::finance::budgets::forecasts(app.db(), None, clock.now())
        .await
        .unwrap();
    let mine = all
        .iter()
        .find(|b| b.kind == "user" && b.id == uid)
        .expect("the user's budget");
    assert_eq!(mine.spent_micros, 0, "{mine:?}");
    assert_eq!(mine.remaining_micros, 5_000_000);
    assert_eq!(mine.exhausts_on, None, "{mine:?}");
    assert_eq!(sluice::finance::alerts::check(&app.state).await.unwrap(), 0);
}
