//! The eviction past the cap deletes a large surplus in writes of `EVICT_CHUNK` entries,
//! each committed on its own, so that the one write connection — every reservation and
//! settlement behind it — is free between them (s31 evict attack F2: one statement held it
//! for seconds).

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use super::cache::evict_over_cap;
use super::Db;
use chrono::Utc;

/// A database of 1 300 entries of one scope, and `then` run on it.
async fn thirteen_hundred_entries(then: &str) -> (tempfile::TempDir, Db) {
    let dir = tempfile::tempdir().unwrap();
    let db = Db::open(&dir.path().join("evict.db"), false).await.unwrap();
    sqlx::raw_sql(&format!(
        "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 1300)
         INSERT INTO cache_entries (key, scope, model, format, answer, created_at, expires_at)
         SELECT CAST(printf('%016d', i) AS BLOB), 'team:1', 'gpt-4o-mini', 'openai', '{{}}',
                '2026-12-05T10:00:00.000000Z', '2999-01-01T00:00:00.000000Z'
         FROM n;
         {then}",
    ))
    .execute(&db.sqlite().write)
    .await
    .unwrap();
    (dir, db)
}

#[tokio::test]
async fn a_surplus_past_the_cap_is_evicted_in_chunks_to_the_cap() {
    let (_dir, db) = thirteen_hundred_entries(
        "-- Each deletion made slow (a join of 200 × 200 rows per entry), so that a reader
         -- polling the table sees every write's commit, however fast the machine.
         CREATE TABLE pad (n INTEGER);
         WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 200)
         INSERT INTO pad SELECT i FROM n;
         CREATE TRIGGER stretch AFTER DELETE ON cache_entries
         BEGIN SELECT COUNT(*) FROM pad a, pad b; END;",
    )
    .await;
    let done = AtomicBool::new(false);
    let evict = async {
        let keys = evict_over_cap(&db, 100, Utc::now()).await.unwrap();
        done.store(true, Ordering::Release);
        keys
    };
    // What other connections see committed while the eviction runs, each change once.
    let watch = async {
        let mut seen: Vec<i64> = Vec::new();
        loop {
            let finished = done.load(Ordering::Acquire);
            let n: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM cache_entries")
                .fetch_one(&db.sqlite().read)
                .await
                .unwrap();
            if seen.last() != Some(&n) {
                seen.push(n);
            }
            if finished {
                return seen;
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    };
    let (keys, seen) = tokio::join!(evict, watch);
    assert_eq!(keys.len(), 1_200);
    // Three writes of at most 500, each committed before the next began: one statement
    // would show 1 300 and then 100 only.
    assert_eq!(seen, [1_300, 800, 300, 100]);
}

/// A write that fails after others were committed hands back the keys those deleted, so
/// the cache's memory forgets them too; the rest is the next pass's. The error lost them
/// until the next rebuild: keys in memory for rows gone (s31 final attack F3).
#[tokio::test]
async fn a_chunk_that_fails_keeps_the_keys_of_the_chunks_before_it() {
    let (_dir, db) = thirteen_hundred_entries(
        "-- The second write fails (a full disk, say): the first has taken the table to 800.
         CREATE TRIGGER full BEFORE DELETE ON cache_entries
         WHEN (SELECT COUNT(*) FROM cache_entries) <= 800
         BEGIN SELECT RAISE(ABORT, 'disk full'); END;",
    )
    .await;
    let keys = evict_over_cap(&db, 100, Utc::now()).await.unwrap();
    assert_eq!(keys.len(), 500);
    let left: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM cache_entries")
        .fetch_one(&db.sqlite().read)
        .await
        .unwrap();
    assert_eq!(left, 800);
    // With nothing deleted yet, the failure is the caller's to see.
    assert!(evict_over_cap(&db, 100, Utc::now()).await.is_err());
}

/// The eviction tells a dead token's scope by probing that token by its id, once per
/// entry, not by reading every dead token (tokens are never deleted, so those pile up;
/// PostgreSQL rescanned such a set for every entry past `work_mem`, s33 diff attack F1;
/// its half is `tests/api/pg_cache_plan.rs`).
#[tokio::test]
async fn the_dead_token_probe_reads_the_token_by_its_id() {
    let (_dir, db) = thirteen_hundred_entries("").await;
    let sql = format!("EXPLAIN QUERY PLAN {}", super::cache::past_cap("?1", "?2"));
    let rows: Vec<(i64, i64, i64, String)> = sqlx::query_as(&sql)
        .bind(100_i64)
        .bind("2026-12-05T10:00:00.000Z")
        .fetch_all(&db.sqlite().read)
        .await
        .unwrap();
    let plan: Vec<&str> = rows.iter().map(|r| r.3.as_str()).collect();
    assert!(
        plan.iter()
            .any(|p| p.starts_with("SEARCH t USING INTEGER PRIMARY KEY")),
        "{plan:#?}"
    );
    assert!(!plan.iter().any(|p| p.contains("SCAN tokens")), "{plan:#?}");
}
