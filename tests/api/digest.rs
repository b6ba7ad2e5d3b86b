//! The weekly digest per team (issue 20, item 7) at a webhook receiver: last ISO week's
//! total, top tokens and models, the team's forecast and a token's 5× day; sent once per
//! team and week whichever replica tries.

use chrono::{Datelike, Duration, NaiveDate, Utc};
use sluice::store::requests::{self, RequestRow};

use crate::helpers::{issue_args, spawn_app_with};

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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn last_weeks_digest_reaches_the_webhook_once_per_team() {
    use sluice::config::{Secret, WebhookSettings};
    let app = spawn_app_with(|s, m| {
        s.alerts.webhooks = vec![WebhookSettings {
            url: Secret(secrecy::SecretString::from(format!(
                "{}/_mock/webhook",
                m.base_url()
            ))),
            format: "generic".into(),
        }];
    })
    .await;
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
    // $1 a day for the 4 weeks before last week; last week $1 a day but $6 on its Wednesday.
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

    // The gateway's own first check comes minutes after start: this one sends.
    assert_eq!(sluice::finance::digest::send(&app.state).await.unwrap(), 1);
    assert_eq!(
        sluice::finance::digest::send(&app.state).await.unwrap(),
        0,
        "once per week"
    );
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
        if !digests.is_empty() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(25)).await;
    }
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
