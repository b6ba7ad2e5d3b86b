//! The weekly digest per team (issue 20, item 7) at a webhook receiver: last ISO week's
//! total, top tokens and models, the team's forecast and a token's 5× day; sent once per
//! team and week whichever replica tries.

use chrono::{Datelike, Duration, NaiveDate, Utc};
use sluice::store::requests::{self, RequestRow};

use crate::helpers::{issue_args, spawn_app_with, TestApp};

fn row(id: String, token: (i64, i64, i64), day: NaiveDate, cost: i64) -> RequestRow {
    RequestRow {
        id,
        token_id: Some(token.0),
        user_id: Some(token.1),
        team_id: Some(token.2),
        endpoint: "chat",
        model: "gpt-4o-mini".into(),
        served_model: "gpt-4o-mini".into(),
        upstream: "a".into(),
        status: 200,
        cost_micros: cost,
        cache: "miss",
        created_at: sluice::clock::db_time(day.and_hms_opt(10, 0, 0).unwrap().and_utc()),
        ..Default::default()
    }
}

/// An app whose alerts go to the mock's webhook receiver, with a cool-off of `cooloff` seconds.
async fn app_with_webhook(cooloff: u64) -> TestApp {
    use sluice::config::{Secret, WebhookSettings};
    spawn_app_with(|s, m| {
        s.alerts.webhooks = vec![WebhookSettings {
            url: Secret(secrecy::SecretString::from(format!(
                "{}/_mock/webhook",
                m.base_url()
            ))),
            format: "generic".into(),
        }];
        s.alerts.cooloff_seconds = cooloff;
    })
    .await
}

/// A token of `ann` spending $1 a day for the 4 weeks before last week, and last week $1 a
/// day but $6 on its Wednesday: (token, user, team), its prefix and last week's Monday.
async fn seed_weeks(app: &TestApp) -> ((i64, i64, i64), String, NaiveDate) {
    let (token, _) = app.issue(issue_args("ann")).await;
    let user = crate::helpers::scalar_on(
        app.db(),
        &format!("SELECT user_id FROM tokens WHERE id = {token}"),
    )
    .await;
    let team = crate::helpers::scalar_on(
        app.db(),
        &format!("SELECT team_id FROM users WHERE id = {user}"),
    )
    .await;
    let prefix = crate::helpers::sql_text(
        app.db(),
        &format!("SELECT prefix FROM tokens WHERE id = {token}"),
    )
    .await;
    let today = Utc::now().date_naive();
    let monday = today - Duration::days(i64::from(today.weekday().num_days_from_monday()));
    let from = monday - Duration::days(7);
    let ids = (token, user, team);
    let mut rows: Vec<RequestRow> = (1..=28)
        .map(|back| {
            row(
                format!("before-{back}"),
                ids,
                from - Duration::days(back),
                1_000_000,
            )
        })
        .collect();
    for k in 0..7 {
        let cost = if k == 2 { 6_000_000 } else { 1_000_000 };
        rows.push(row(
            format!("week-{k}"),
            ids,
            from + Duration::days(k),
            cost,
        ));
    }
    requests::insert_batch(app.db(), &rows).await.unwrap();
    (ids, prefix, from)
}

/// The weekly digests the webhook receiver got, waiting a little for the first `n`.
async fn digests(app: &TestApp, n: usize) -> Vec<serde_json::Value> {
    let mut digests = Vec::new();
    for _ in 0..200 {
        digests = app
            .mock
            .state
            .stats("webhook")
            .last_bodies
            .iter()
            .filter(|b| b["kind"] == "weekly_digest")
            .cloned()
            .collect();
        if digests.len() >= n {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(25)).await;
    }
    digests
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn last_weeks_digest_reaches_the_webhook_once_per_team() {
    let app = app_with_webhook(600).await;
    let ((_, _, team), prefix, from) = seed_weeks(&app).await;
    // The digest reads the rollup (the spend report's own queries) on both engines, never
    // the request log: the same digest once the log's rows are gone.
    crate::helpers::sql_exec(app.db(), "DELETE FROM requests").await;

    // The gateway's own first check comes minutes after start: this one sends.
    assert_eq!(sluice::finance::digest::send(&app.state).await.unwrap(), 1);
    assert_eq!(
        sluice::finance::digest::send(&app.state).await.unwrap(),
        0,
        "once per week"
    );
    let digests = digests(&app, 1).await;
    assert_eq!(digests.len(), 1, "{digests:?}");
    assert_eq!(digests[0]["subject"], format!("team:{team}"));
    let text = digests[0]["message"].as_str().unwrap();
    let iso = from.iso_week();
    assert!(
        text.contains(&format!("{}-W{:02}", iso.year(), iso.week())),
        "{text}"
    );
    assert!(text.contains("12.000000 USD over 7 requests"), "{text}");
    assert!(
        text.contains(&format!("{prefix}… (ann) 12.000000 USD")),
        "{text}"
    );
    assert!(text.contains("gpt-4o-mini 12.000000 USD"), "{text}");
    assert!(text.contains("forecast: the team has no budget"), "{text}");
    let wednesday = (from + Duration::days(2)).to_string();
    assert!(
        text.contains(&format!(
            "anomaly: {prefix}… (ann) spent 6.000000 USD on {wednesday}, at least 5× its usual 1.000000 USD a day"
        )),
        "{text}"
    );
    assert_eq!(text.matches("anomaly:").count(), 1, "{text}");
}

/// A digest the alerter drops (here: the same team's alert within the cool-off; a full
/// queue is the other way) leaves the week unsent, so a later check sends it; the week is
/// marked sent only once the digest was built and queued.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_digest_leaves_the_week_unsent() {
    let app = app_with_webhook(1).await;
    let ((_, _, team), _, _) = seed_weeks(&app).await;
    let subject = format!("team:{team}");
    app.state
        .alerts
        .raise("weekly_digest", &subject, "an earlier digest");
    assert_eq!(
        sluice::finance::digest::send(&app.state).await.unwrap(),
        0,
        "dropped within the cool-off"
    );
    let noted = crate::helpers::scalar_on(
        app.db(),
        "SELECT COUNT(*) FROM finance_notices WHERE kind = 'weekly_digest'",
    )
    .await;
    assert_eq!(noted, 0, "the week is not marked sent");
    tokio::time::sleep(std::time::Duration::from_millis(1100)).await;
    assert_eq!(sluice::finance::digest::send(&app.state).await.unwrap(), 1);
    let got = digests(&app, 2).await;
    assert_eq!(got.len(), 2, "{got:?}");
    assert!(
        got[1]["message"]
            .as_str()
            .unwrap_or_default()
            .contains("12.000000 USD over 7 requests"),
        "{got:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rotated_tokens_history_and_days_are_its_successors() {
    // A rotated token's text spends as its successor, so the successor's usual spend is
    // the rotated one's history, and a day split across the rotation is one day: the
    // successor had no history of its own and was never an anomaly for 28 days (s29
    // finance attack F3).
    let app = app_with_webhook(600).await;
    let ((rotated, user, team), _, from) = seed_weeks(&app).await;
    crate::admin_helpers::make_login(&app, "root", "admin", None).await;
    let admin = crate::admin_helpers::login(&app, "root").await;
    let (status, r) = admin
        .post(
            &format!("/admin/api/v1/tokens/{rotated}/rotate"),
            &serde_json::json!({"overlap_seconds": 0}),
        )
        .await;
    assert_eq!(status, 201, "{r}");
    let successor = r["id"].as_i64().unwrap();
    let prefix = crate::helpers::sql_text(
        app.db(),
        &format!("SELECT prefix FROM tokens WHERE id = {successor}"),
    )
    .await;
    // Thursday: $1 before the rotation, $4 after it; Friday: $1 and $6.
    let ids = (successor, user, team);
    let rows = vec![
        row("after-thu".into(), ids, from + Duration::days(3), 4_000_000),
        row("after-fri".into(), ids, from + Duration::days(4), 6_000_000),
    ];
    requests::insert_batch(app.db(), &rows).await.unwrap();

    assert_eq!(sluice::finance::digest::send(&app.state).await.unwrap(), 1);
    let digests = digests(&app, 1).await;
    let text = digests[0]["message"].as_str().unwrap();
    for (k, spent) in [(2, "6.000000"), (3, "5.000000"), (4, "7.000000")] {
        let day = (from + Duration::days(k)).to_string();
        assert!(
            text.contains(&format!(
                "anomaly: {prefix}… (ann) spent {spent} USD on {day}, at least 5× its usual 1.000000 USD a day"
            )),
            "{text}"
        );
    }
    assert_eq!(text.matches("anomaly:").count(), 3, "{text}");
}
