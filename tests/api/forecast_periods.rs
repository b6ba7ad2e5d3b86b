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

/// Forecasts read the daily rollup (`spend_days`), not the request log: the same figures,
/// day by day, as the request log's sums — and still there once the log's rows are gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forecasts_read_the_rollup_whose_figures_equal_the_request_logs() {
    let app = crate::helpers::spawn_app().await;
    let (token, _) = app
        .issue(sluice::cli::IssueArgs {
            budget_usd: Some("100"),
            reset: Some("never"),
            ..issue_args("ann")
        })
        .await;
    let user = crate::helpers::scalar_on(
        app.db(),
        &format!("SELECT user_id FROM tokens WHERE id = {token}"),
    )
    .await;
    crate::forecast::seed(&app, (token, user, 1), 1_234_567).await;
    let now = Utc::now();
    let find = |all: Vec<sluice::finance::budgets::BudgetForecast>| {
        all.into_iter()
            .find(|b| b.kind == "token" && b.id == token)
            .expect("the token's budget")
    };
    let before = find(
        sluice::finance::budgets::forecasts(app.db(), None, now)
            .await
            .unwrap(),
    );
    for d in &before.history {
        let logged = crate::helpers::scalar_on(
            app.db(),
            &format!(
                "SELECT CAST(COALESCE(SUM(cost_micros), 0) AS BIGINT) FROM requests
                 WHERE token_id = {token} AND substr(created_at, 1, 10) = '{}'",
                d.day
            ),
        )
        .await;
        assert_eq!(d.spend_micros, logged, "{}", d.day);
    }
    assert_eq!(
        before.history.iter().map(|d| d.spend_micros).sum::<i64>(),
        28 * 1_234_567
    );
    crate::helpers::sql_exec(app.db(), "DELETE FROM requests").await;
    let after = find(
        sluice::finance::budgets::forecasts(app.db(), None, now)
            .await
            .unwrap(),
    );
    let spend = |f: &sluice::finance::budgets::BudgetForecast| {
        f.history.iter().map(|d| d.spend_micros).collect::<Vec<_>>()
    };
    assert_eq!(spend(&after), spend(&before));
    assert_eq!(after.exhausts_on, before.exhausts_on);
}

/// A daily budget's only possible exhaustion day is today, and its spend so far today is
/// already out of the remaining budget: today is projected as what is still expected of it
/// (the day's expected spend less today's spend so far), not a whole day again. A token
/// spending $8 a day of $10, $6 of it spent today, never runs out; one spending $12 a day,
/// $6 of it today, runs out today.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_daily_budget_used_at_eighty_percent_never_runs_out() {
    let app = crate::helpers::spawn_app().await;
    let now = Utc::now();
    let mut ids = Vec::new();
    for (user, daily) in [("ann", 8_000_000), ("bob", 12_000_000)] {
        let (token, _) = app
            .issue(sluice::cli::IssueArgs {
                budget_usd: Some("10"),
                reset: Some("daily"),
                ..issue_args(user)
            })
            .await;
        let uid = crate::helpers::scalar_on(
            app.db(),
            &format!("SELECT user_id FROM tokens WHERE id = {token}"),
        )
        .await;
        crate::forecast::seed(&app, (token, uid, 1), daily).await;
        // Today's $6: logged and charged, as a request's settlement and log row are.
        let row = sluice::store::requests::RequestRow {
            id: format!("today-{token}"),
            token_id: Some(token),
            user_id: Some(uid),
            team_id: Some(1),
            endpoint: "chat",
            model: "gpt-4o-mini".into(),
            served_model: "gpt-4o-mini".into(),
            upstream: "a".into(),
            status: 200,
            cost_micros: 6_000_000,
            cache: "miss",
            created_at: sluice::clock::db_time(now),
            ..Default::default()
        };
        sluice::store::requests::insert_batch(app.db(), &[row])
            .await
            .unwrap();
        spend(&app, token, 6_000_000, now).await;
        ids.push(token);
    }
    let all = sluice::finance::budgets::forecasts(app.db(), None, now)
        .await
        .unwrap();
    let of = |id: i64| {
        all.iter()
            .find(|b| b.kind == "token" && b.id == id)
            .expect("the token's budget")
    };
    let (steady, heavy) = (of(ids[0]), of(ids[1]));
    assert_eq!(steady.remaining_micros, 4_000_000, "{steady:?}");
    assert_eq!(steady.exhausts_on, None, "{steady:?}");
    assert_eq!(
        heavy.exhausts_on,
        Some(now.date_naive().to_string()),
        "{heavy:?}"
    );
    assert_eq!(
        sluice::finance::alerts::check(&app.state).await.unwrap(),
        1,
        "only the heavy budget is raised"
    );
}
