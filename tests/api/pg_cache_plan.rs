//! On PostgreSQL, the eviction past `max_entries` (`store::cache::past_cap`) tells a dead
//! token's scope by probing that token by its id, once per entry: tokens are never
//! deleted, so revoked, rotated and expired ones pile up, and a set of them read whole
//! for the test was hashed only while it fit in `work_mem` — past some 150 000 dead tokens
//! PostgreSQL rescanned it for every entry, a pass over 100 000 entries taking minutes
//! inside the eviction's lock (s33 diff attack F1). SQLite's half is the lib test
//! `store::cache_evict_test::the_dead_token_probe_reads_the_token_by_its_id`.

use sqlx::postgres::PgRow;
use sqlx::Row;

use crate::pg_server;
use crate::pg_store::pg_pool;

#[tokio::test]
async fn the_evictions_dead_token_probe_reads_each_token_by_its_id() {
    let pool = pg_pool(&pg_server::database()).await;
    sqlx::raw_sql(
        "INSERT INTO teams (id, name, created_at) VALUES (1, 't', 'x');
         INSERT INTO users (id, username, team_id, created_at) VALUES (1, 'u', 1, 'x');
         INSERT INTO tokens (user_id, token_hash, prefix, created_at, revoked_at)
           SELECT 1, int8send(i), 'p', 'x', 'x' FROM generate_series(1, 200000) AS i;
         INSERT INTO cache_entries (key, scope, model, format, answer, created_at, expires_at)
           SELECT int8send(i), 'token:' || (i * 13 % 250000), 'm', 'f', 'a', 'x', 'z'
           FROM generate_series(1, 20000) AS i;
         ANALYZE tokens;
         ANALYZE cache_entries;",
    )
    .execute(&pool)
    .await
    .unwrap();
    // The dead tokens past what a hash may hold, as 150 000 of them are at the default
    // `work_mem`: the plan then is the one that reads each entry's token by its id.
    let mut conn = pool.acquire().await.unwrap();
    sqlx::query("SET work_mem = '64kB'")
        .execute(&mut *conn)
        .await
        .unwrap();
    let rows: Vec<PgRow> = sqlx::query(&format!(
        "EXPLAIN {}",
        sluice::store::cache::past_cap("$1", "$2")
    ))
    .bind(10_000_i64)
    .bind("2026-12-05T10:00:00.000Z")
    .fetch_all(&mut *conn)
    .await
    .unwrap();
    let plan = rows
        .iter()
        .map(|r| r.get::<String, _>(0))
        .collect::<Vec<_>>()
        .join("\n");
    assert!(plan.contains("tokens_pkey"), "{plan}");
    assert!(!plan.contains("Seq Scan on tokens"), "{plan}");
    assert!(!plan.contains("Materialize"), "{plan}");
}
