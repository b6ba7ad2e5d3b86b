//! A tag of unbounded cardinality (`trace:<id>` per request) does not make the spend rollup
//! one row per request: past `[finance] max_tag_values_per_day` distinct values of a key on a
//! day, later values roll up under `(other)`; spend by tag still sums to the total, and the
//! request rows keep their exact tags.

use chrono::{NaiveDate, TimeZone, Utc};
use sluice::store::requests::{self, RequestRow};
use sluice::store::spend::{self, Dim, Filters, SpendQuery};

use crate::helpers::{scalar_on, spawn_app_with, sql_rows, test_engine};
use crate::pg_gateway_app::Engine;

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

/// A row of `token` on March `d` at second `s`, with `tags` and `cost`.
fn row(token: i64, d: u32, s: u32, tags: String, cost: i64) -> RequestRow {
    let at = Utc.from_utc_datetime(&day(d).and_hms_opt(10, s / 60, s % 60).unwrap());
    RequestRow {
        id: format!("req-{d}-{s}"),
        token_id: Some(token),
        endpoint: "chat",
        model: "gpt-4o-mini".into(),
        served_model: "gpt-4o-mini".into(),
        upstream: "a".into(),
        status: 200,
        cost_micros: cost,
        cache: "miss",
        created_at: sluice::clock::db_time(at),
        tags,
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn more_distinct_tag_keys_than_the_bound_roll_up_as_the_key_other_and_still_sum() {
    let app = spawn_app_with(|s, _| s.finance.max_tag_keys_per_day = 4).await;
    let (token, _) = app.token("ann", None).await;
    // Ten fresh keys per request: without a bound on keys, one rollup row per request.
    let rows: Vec<RequestRow> = (0..30)
        .map(|i| {
            let tags: Vec<String> = (0..10).map(|k| format!("k{:03}:v", i * 10 + k)).collect();
            row(token, 1, i, tags.join(","), 100 + i64::from(i))
        })
        .collect();
    for chunk in rows.chunks(7) {
        requests::insert_batch(app.db(), chunk).await.unwrap();
    }
    let db = app.db();
    let total = scalar_on(db, "SELECT CAST(SUM(cost_micros) AS BIGINT) FROM requests").await;
    assert_eq!(
        scalar_on(db, "SELECT COUNT(*) FROM spend_days").await,
        2,
        "the first request's keys (4 admitted, 6 as `(other)`) and every later one's as `(other)`"
    );
    for key in ["k000", "k005", "k100"] {
        let q = SpendQuery {
            from: day(1),
            to: day(2),
            group_by: vec![Dim::Tag(key.into())],
            filters: Filters::default(),
            scope: None,
        };
        let by_key = spend::report(db, &q).await.unwrap();
        let sum: i64 = by_key.iter().map(|g| g.spend_micros).sum();
        assert_eq!(sum, total, "{key}: {by_key:?}");
    }
}

/// Text the tag rules would refuse (a NUL, non-ASCII, quotes, an escaped comma) still
/// reaches the rollup whole: its sum is the request log's, row for row.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rollup_sums_to_the_log_whatever_the_logged_tag_text() {
    let app = spawn_app_with(|s, _| s.finance.max_tag_values_per_day = BOUND).await;
    let (token, _) = app.token("ann", None).await;
    let odd = [
        "k:a\0b",
        "k:caf\u{e9}",
        "k:\"q\"",
        "a:1\\,b:2",
        "k:'; DROP TABLE requests; --",
        "",
        "env:prod,k:\u{1F600}",
        "env:prod,trace:ok",
    ];
    let rows: Vec<RequestRow> = odd
        .iter()
        .enumerate()
        .map(|(i, t)| row(token, 1, i as u32, (*t).to_string(), 10 + i as i64))
        .collect();
    requests::insert_batch(app.db(), &rows).await.unwrap();
    let db = app.db();
    let logged = scalar_on(db, "SELECT CAST(SUM(cost_micros) AS BIGINT) FROM requests").await;
    let rolled = scalar_on(
        db,
        "SELECT CAST(SUM(cost_micros) AS BIGINT) FROM spend_days",
    )
    .await;
    assert_eq!(rolled, logged);
    let n = scalar_on(db, "SELECT CAST(SUM(requests) AS BIGINT) FROM spend_days").await;
    assert_eq!(n, odd.len() as i64);
}

/// Two PostgreSQL hosts admitting the same fresh value at once: the one that waits on the
/// other's insert still finds the value admitted (under the bound, it keeps its own row).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pg_a_value_admitted_by_a_concurrent_writer_is_not_rolled_up() {
    if test_engine() != Engine::Postgres {
        return;
    }
    let app = spawn_app_with(|s, _| s.finance.max_tag_values_per_day = BOUND).await;
    let (token, _) = app.token("ann", None).await;
    let pool = app.db().postgres().unwrap().pool.clone();
    let first = row(token, 1, 0, "trace:same".into(), 5);
    let second = row(token, 1, 1, "trace:same".into(), 5);
    two_writers_at_once(pool, first, second, "trace:same").await;
}

/// Two writers' transactions bounding `first` and `second` (the same fresh place): the
/// second waits on the first's uncommitted row and, once it is committed, reads it as
/// admitted — both keep `tags` as their rollup text.
async fn two_writers_at_once(
    pool: sqlx::PgPool,
    first: RequestRow,
    second: RequestRow,
    tags: &str,
) {
    let mut a = pool.begin().await.unwrap();
    let out = sluice::store::pg::tag_bound::bounded(&mut a, &[first])
        .await
        .unwrap();
    assert_eq!(out[1], [tags]);
    let b = tokio::spawn(async move {
        let mut b = pool.begin().await.unwrap();
        let out = sluice::store::pg::tag_bound::bounded(&mut b, &[second])
            .await
            .unwrap();
        b.commit().await.unwrap();
        out
    });
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    assert!(!b.is_finished(), "the second writer did not wait");
    a.commit().await.unwrap();
    assert_eq!(b.await.unwrap()[1], [tags]);
}

/// Two PostgreSQL hosts admitting the same fresh tag text at once (its key and values
/// admitted before): the one that waits on the other's insert still finds the text admitted
/// (under the bound on texts, it keeps its own row).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pg_a_text_admitted_by_a_concurrent_writer_is_not_rolled_up() {
    if test_engine() != Engine::Postgres {
        return;
    }
    let app = spawn_app_with(|s, _| s.finance.max_tag_sets_per_day = BOUND).await;
    let (token, _) = app.token("ann", None).await;
    let pool = app.db().postgres().unwrap().pool.clone();
    let admitted = [
        row(token, 1, 0, "trace:same,x:1".into(), 5),
        row(token, 1, 1, "trace:other,x:2".into(), 5),
    ];
    requests::insert_batch(app.db(), &admitted).await.unwrap();
    let first = row(token, 1, 2, "trace:same,x:2".into(), 5);
    let second = row(token, 1, 3, "trace:same,x:2".into(), 5);
    two_writers_at_once(pool, first, second, "trace:same,x:2").await;
    assert_eq!(
        scalar_on(app.db(), "SELECT COUNT(*) FROM spend_tag_sets").await,
        3
    );
}

/// During a rolling upgrade the previous version still admits tag values as (day, key,
/// value), without a tenant: its writes land under the empty scope rather than failing the
/// request log's batch (PostgreSQL) or being skipped (SQLite's `INSERT OR IGNORE`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_previous_versions_tag_admission_still_writes() {
    let app = spawn_app_with(|_, _| {}).await;
    crate::helpers::sql_exec(
        app.db(),
        "INSERT INTO spend_tag_values (day, key, value) VALUES ('2026-03-01', 'cc', '42')",
    )
    .await;
    let admitted = scalar_on(
        app.db(),
        "SELECT COUNT(*) FROM spend_tag_values WHERE scope = '' AND key = 'cc'",
    )
    .await;
    assert_eq!(admitted, 1);
}

/// The rollup's rows, whole (the days', then the months').
async fn rollup(db: &sluice::store::Db) -> Vec<(String, String, i64, i64)> {
    let mut rows = sql_rows(
        db,
        "SELECT day, tags, requests, cost_micros FROM spend_days ORDER BY day, tags",
    )
    .await;
    rows.extend(
        sql_rows(
            db,
            "SELECT month, tags, requests, cost_micros FROM spend_months ORDER BY month, tags",
        )
        .await,
    );
    rows
}

/// The admitted keys, values and texts (`spend_tag_keys`, `spend_tag_values`,
/// `spend_tag_sets`) of days before `day`, and of `day` on.
async fn admitted(db: &sluice::store::Db, day: &str) -> [(i64, i64); 3] {
    let mut out = [(0, 0); 3];
    for (i, table) in ["spend_tag_keys", "spend_tag_values", "spend_tag_sets"]
        .iter()
        .enumerate()
    {
        let count = |op: &str| format!("SELECT COUNT(*) FROM {table} WHERE day {op} '{day}'");
        out[i] = (
            scalar_on(db, &count("<")).await,
            scalar_on(db, &count(">=")).await,
        );
    }
    out
}

/// The admitted places of days before yesterday are swept (`tag_bound::sweep`): today's and
/// yesterday's stay (a batch written just after midnight may still carry yesterday's rows),
/// and the rollup is as it was — also once a later request of yesterday is written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sweep_deletes_only_the_admitted_places_of_days_before_yesterday() {
    let app = spawn_app_with(|_, _| {}).await;
    let (token, _) = app.token("ann", None).await;
    let rows: Vec<RequestRow> = (1..=4)
        .flat_map(|d| (0..2).map(move |s| row(token, d, s, format!("env:e{d},project:p{s}"), 100)))
        .collect();
    requests::insert_batch(app.db(), &rows).await.unwrap();
    let db = app.db();
    let before = rollup(db).await;
    let days = scalar_on(db, "SELECT COUNT(*) FROM spend_days").await;
    let places = admitted(db, "2026-03-03").await;
    // Two days of two keys, three values (one of `env`, two of `project`) and two texts each.
    assert_eq!(places, [(4, 4), (6, 6), (4, 4)]);

    // On March 4 just after midnight, March 1 and 2 go; March 3 (yesterday) and 4 stay.
    let now = Utc.with_ymd_and_hms(2026, 3, 4, 0, 10, 0).unwrap();
    let swept = sluice::store::tag_bound::sweep(db, now).await.unwrap();
    assert_eq!(swept, 14);
    assert_eq!(admitted(db, "2026-03-03").await, [(0, 4), (0, 6), (0, 4)]);
    assert_eq!(rollup(db).await, before, "the sweep changed the rollup");
    // Yesterday's text is still admitted: a late request of it joins its row.
    let late = row(token, 3, 59, "env:e3,project:p1".into(), 100);
    requests::insert_batch(db, &[late]).await.unwrap();
    assert_eq!(scalar_on(db, "SELECT COUNT(*) FROM spend_days").await, days);
    assert_eq!(
        scalar_on(
            db,
            "SELECT requests FROM spend_days WHERE day = '2026-03-03' AND tags = 'env:e3,project:p1'"
        )
        .await,
        2
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_report_filtered_by_a_tag_says_how_much_spend_the_bound_rolled_up() {
    // A member filling the team's daily bound with cheap values after midnight moved every
    // later `project:apollo` to `project:(other)`: a report filtered by the tag left that
    // spend out without a sign (s29 finance attack F4).
    let app = spawn_app_with(|s, _| s.finance.max_tag_values_per_day = 2).await;
    let (token, _) = app.token("ann", None).await;
    // The junk first, in a batch of its own: which of one batch's rows takes the last
    // places is the engine's order.
    let junk = vec![
        row(token, 1, 0, "project:junk1".into(), 1_000),
        row(token, 1, 1, "project:junk2".into(), 1_000),
    ];
    requests::insert_batch(app.db(), &junk).await.unwrap();
    let rows = vec![
        row(token, 1, 2, "project:apollo".into(), 5_000),
        row(token, 1, 3, "env:prod,project:apollo".into(), 7_000),
        row(token, 2, 0, "project:apollo".into(), 3_000),
    ];
    requests::insert_batch(app.db(), &rows).await.unwrap();
    crate::admin_helpers::make_login(&app, "fin", "finance", None).await;
    let fin = crate::admin_helpers::login(&app, "fin").await;
    let range = "from=2026-03-01&to=2026-03-03&group_by=day";
    let (status, v) = fin
        .get_json(&format!(
            "/admin/api/v1/reports/spend?{range}&tag=project:apollo"
        ))
        .await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["total_micros"], 3_000, "the exact matches alone: {v}");
    assert_eq!(v["rolled_up_micros"], 12_000, "{v}");
    assert_eq!(v["rolled_up_requests"], 2, "{v}");
    let (_, v) = fin
        .get_json(&format!(
            "/admin/api/v1/reports/spend?{range}&tag=project:junk1"
        ))
        .await;
    assert_eq!(v["total_micros"], 1_000, "{v}");
    assert_eq!(
        v["rolled_up_micros"], 12_000,
        "whatever value is asked for: {v}"
    );
    let (_, v) = fin
        .get_json(&format!("/admin/api/v1/reports/spend?{range}&tag=env:prod"))
        .await;
    assert_eq!(v["rolled_up_micros"], 0, "`env` was never rolled up: {v}");
    let (_, v) = fin
        .get_json(&format!("/admin/api/v1/reports/spend?{range}"))
        .await;
    assert_eq!(
        (v["total_micros"].as_i64(), v["rolled_up_micros"].as_i64()),
        (Some(17_000), Some(0)),
        "no tag filter, nothing left out: {v}"
    );

    let csv = fin
        .get(&format!("/admin/reports.csv?{range}&tag=project:apollo"))
        .await;
    assert_eq!(
        csv.headers()["x-sluice-rolled-up-micros"],
        "12000",
        "the CSV's sums leave it out too"
    );
    let page = fin
        .get(&format!("/admin/reports?{range}&tag=project:apollo"))
        .await
        .text()
        .await
        .unwrap();
    assert!(page.contains("0.012000"), "the page says it: {page}");
}
