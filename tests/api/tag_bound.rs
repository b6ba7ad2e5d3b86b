//! A tag of unbounded cardinality (`trace:<id>` per request) does not make the spend rollup
//! one row per request: past `[finance] max_tag_values_per_day` distinct values of a key on a
//! day, later values roll up under `(other)`; spend by tag still sums to the total, and the
//! request rows keep their exact tags.

use chrono::{NaiveDate, TimeZone, Utc};
use sluice::store::requests::{self, RequestRow};
use sluice::store::spend::{self, Dim, Filters, SpendQuery};

use crate::helpers::{scalar_on, spawn_app_with};

const BOUND: u32 = 5;

fn day(d: u32) -> NaiveDate {
    NaiveDate::from_ymd_opt(2026, 3, d).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn more_distinct_tag_values_than_the_bound_roll_up_under_other_and_still_sum() {
    let app = spawn_app_with(|s, _| s.finance.max_tag_values_per_day = BOUND).await;
    let (token, _) = app.token("ann", None).await;
    // Day 1: 40 requests, each its own trace, in batches as the log writer sends them
    // (with a request logged twice); day 2: 3 traces, under the bound.
    let mut rows = Vec::new();
    for (d, n) in [(1, 40), (2, 3)] {
        for i in 0..n {
            let at = Utc.from_utc_datetime(&day(d).and_hms_opt(10, 0, i).unwrap());
            rows.push(RequestRow {
                id: format!("req-{d}-{i}"),
                token_id: Some(token),
                endpoint: "chat",
                model: "gpt-4o-mini".into(),
                served_model: "gpt-4o-mini".into(),
                upstream: "a".into(),
                status: 200,
                cost_micros: 1_000 + i64::from(i),
                cache: "miss",
                created_at: sluice::clock::db_time(at),
                tags: format!("project:apollo,trace:t{i}"),
                ..Default::default()
            });
        }
    }
    rows.insert(7, rows[3].clone());
    for chunk in rows.chunks(9) {
        requests::insert_batch(app.db(), chunk).await.unwrap();
    }
    let db = app.db();
    let total = scalar_on(db, "SELECT CAST(SUM(cost_micros) AS BIGINT) FROM requests").await;
    assert_eq!(
        scalar_on(db, "SELECT COUNT(DISTINCT tags) FROM requests").await,
        40,
        "the request rows keep their exact tags"
    );
    let day1 = scalar_on(
        db,
        "SELECT COUNT(*) FROM spend_days WHERE day = '2026-03-01'",
    )
    .await;
    assert_eq!(day1, i64::from(BOUND) + 1, "the bound's values and (other)");
    let day2 = scalar_on(
        db,
        "SELECT COUNT(*) FROM spend_days WHERE day = '2026-03-02'",
    )
    .await;
    assert_eq!(day2, 3);

    let report = |key: &str| SpendQuery {
        from: day(1),
        to: day(3),
        group_by: vec![Dim::Tag(key.into())],
        filters: Filters::default(),
        scope: None,
    };
    let by_trace = spend::report(db, &report("trace")).await.unwrap();
    let sum: i64 = by_trace.iter().map(|g| g.spend_micros).sum();
    assert_eq!(sum, total, "{by_trace:?}");
    let other = by_trace
        .iter()
        .find(|g| g.keys == ["(other)"])
        .unwrap_or_else(|| panic!("an (other) row: {by_trace:?}"));
    assert_eq!(other.requests, 40 - i64::from(BOUND));
    // Another key of the same requests is untouched.
    let by_project = spend::report(db, &report("project")).await.unwrap();
    assert_eq!(by_project.len(), 1, "{by_project:?}");
    assert_eq!(by_project[0].keys, ["apollo"]);
    assert_eq!(by_project[0].spend_micros, total);
}
