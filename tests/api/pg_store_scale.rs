//! The dashboard's reports at scale on PostgreSQL (issue 17, item 5): totals and top tokens
//! over millions of request rows, read from `request_days`. A measurement, not a check
//! (`--ignored`, and `SLUICE_SCALE_ROWS` rows, 10 M by default): it prints how long the
//! queries take and their plans. (The spend report reads the rollups `spend_days` /
//! `spend_months`; `bench/` measures it.)

use std::time::Instant;

use sluice::store::pg;

use crate::pg_server;
use crate::pg_store::pg_pool;

#[tokio::test]
#[ignore = "a measurement: minutes of setup (cargo test -- --ignored pg_store_scale)"]
async fn dashboard_reports_over_millions_of_request_rows() {
    let rows: i64 = std::env::var("SLUICE_SCALE_ROWS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000_000);
    let url = tokio::task::spawn_blocking(pg_server::database)
        .await
        .unwrap();
    let pool = pg_pool(&url).await;
    sqlx::query("INSERT INTO teams (name, created_at) SELECT 'team' || i, 'x' FROM generate_series(1, 20) i")
        .execute(&pool).await.unwrap();
    sqlx::query("INSERT INTO users (username, team_id, created_at) SELECT 'user' || i, 1 + i % 20, 'x' FROM generate_series(1, 200) i")
        .execute(&pool).await.unwrap();
    sqlx::query("INSERT INTO tokens (user_id, token_hash, prefix, created_at) SELECT i, sha256(i::text::bytea), 'sk-' || i, 'x' FROM generate_series(1, 200) i")
        .execute(&pool).await.unwrap();
    let started = Instant::now();
    // 90 days of traffic, written like the gateway's batches would leave it.
    let chunk = 1_000_000;
    let mut done = 0;
    while done < rows {
        let n = chunk.min(rows - done);
        sqlx::query(
            "INSERT INTO requests (id, token_id, user_id, team_id, endpoint, model, status, input_tokens, output_tokens, cost_micros, created_at)
             SELECT 'r' || i, 1 + i % 200, 1 + i % 200, 1 + (1 + i % 200) % 20, 'chat', 'model-' || (i % 7), CASE WHEN i % 50 = 0 THEN 502 ELSE 200 END,
                    100, 20, 37 + i % 1000,
                    to_char(timestamp '2026-01-01' + (i * (90 * 86400.0 / $2)) * interval '1 second', 'YYYY-MM-DD\"T\"HH24:MI:SS.MS\"Z\"')
             FROM generate_series($1::bigint, $1::bigint + $3 - 1) i",
        )
        .bind(done)
        .bind(rows as f64)
        .bind(n)
        .execute(&pool)
        .await
        .unwrap();
        done += n;
    }
    let mut conn = pool.acquire().await.unwrap();
    pg::requests::rebuild_days(&mut conn).await.unwrap();
    sqlx::query("ANALYZE").execute(&mut *conn).await.unwrap();
    drop(conn);
    let days: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM request_days")
        .fetch_one(&pool)
        .await
        .unwrap();
    println!(
        "{rows} request rows, {days} request_days rows, set up in {:?}",
        started.elapsed()
    );
    // What the dashboard asks.
    let (from, to) = ("2026-02-01T00:00:00.000Z", "2026-03-01T00:00:00.000Z");
    let t = Instant::now();
    let totals = pg::reports::totals(&pool, None, "2026-01-01T00:00:00.000Z")
        .await
        .unwrap();
    println!("totals since the start: {:?} ({totals:?})", t.elapsed());
    let t = Instant::now();
    pg::reports::top_tokens(&pool, None, "2026-03-01T00:00:00.000Z", 5)
        .await
        .unwrap();
    println!("top tokens this month: {:?}", t.elapsed());
    // The raw query SQLite runs, for comparison.
    let t = Instant::now();
    let _: Vec<(Option<i64>, i64)> = sqlx::query_as(
        "SELECT r.team_id, SUM(r.cost_micros)::BIGINT FROM requests r WHERE r.created_at >= $1 AND r.created_at < $2 AND r.token_id IS NOT NULL GROUP BY r.team_id",
    )
    .bind(from).bind(to).fetch_all(&pool).await.unwrap();
    println!(
        "the same month over the request log itself: {:?}",
        t.elapsed()
    );
    for (what, sql) in [
        ("whole days", "EXPLAIN SELECT day, cost_micros FROM request_days WHERE day >= '2026-02-01' AND day < '2026-03-01' AND token_id IS NOT NULL"),
        ("edges", "EXPLAIN SELECT cost_micros FROM requests WHERE (created_at >= '2026-02-01T13:17:00.000Z' AND created_at < '2026-02-02T00:00:00.000Z') OR (created_at >= '2026-03-01T00:00:00.000Z' AND created_at < '2026-03-01T09:00:00.000Z')"),
    ] {
        let plan: Vec<String> = sqlx::query_scalar(sql).fetch_all(&pool).await.unwrap();
        println!("plan ({what}):\n  {}", plan.join("\n  "));
    }
}
