//! The request log and cache entries on PostgreSQL (issue 17): a batch is one statement,
//! idempotent, with the same results as SQLite's; and epoch bumps heard at once through
//! LISTEN/NOTIFY, with the poll still working when the listener's connection is killed.

use std::time::{Duration, Instant};

use sluice::store::cache::{KeyRow, NewEntry};
use sluice::store::pg;
use sluice::store::pg::notify::{Epoch, Heard};
use sluice::store::requests::RequestRow;
use sluice::store::writer;
use sqlx::PgPool;
use tokio::sync::mpsc;

use crate::pg_store::{at, both, populate, request_rows, same};
use crate::{pool_write_both, read_both};

/// Counts INSERT statements (not rows) into `table` from here on.
async fn count_statements(pool: &PgPool, table: &str) {
    for sql in [
        "CREATE TABLE IF NOT EXISTS statements (tbl TEXT PRIMARY KEY, n BIGINT NOT NULL)".to_string(),
        format!("INSERT INTO statements VALUES ('{table}', 0)"),
        format!(
            "CREATE FUNCTION count_{table}() RETURNS trigger LANGUAGE plpgsql AS $$
             BEGIN UPDATE statements SET n = n + 1 WHERE tbl = '{table}'; RETURN NULL; END; $$"
        ),
        format!("CREATE TRIGGER count_{table} AFTER INSERT ON {table} FOR EACH STATEMENT EXECUTE FUNCTION count_{table}()"),
    ] {
        sqlx::query(&sql).execute(pool).await.unwrap();
    }
}

async fn statements(pool: &PgPool, table: &str) -> i64 {
    sqlx::query_scalar("SELECT n FROM statements WHERE tbl = $1")
        .bind(table)
        .fetch_one(pool)
        .await
        .unwrap()
}

type RawColumns = Vec<(
    String,
    String,
    Option<i64>,
    Option<String>,
    Option<f64>,
    bool,
)>;

const RAW: &str =
    "SELECT id, upstream, ttfb_ms, cache_key, cache_similarity, stream FROM requests ORDER BY id";

#[tokio::test]
async fn a_request_log_batch_is_one_statement_idempotent_and_reads_as_on_sqlite() {
    let b = both().await;
    populate(&b).await;
    count_statements(&b.pool, "requests").await;
    let mut rows = request_rows();
    rows.extend((0..240).map(|i| RequestRow {
        id: format!("bulk-{i}"),
        token_id: Some(1 + i % 3),
        created_at: sluice::clock::db_time(at(12, (i % 60) as u32)),
        tags: String::new(),
        endpoint: "embeddings",
        status: 200,
        cache: "off",
        ..Default::default()
    }));
    assert_eq!(rows.len(), 300);
    same(
        "insert_batch",
        pool_write_both!(b, requests::insert_batch(&rows)),
    );
    assert_eq!(
        statements(&b.pool, "requests").await,
        1,
        "300 rows, one INSERT statement"
    );
    // The same batch again (a retried write), with one new row and a row twice: nothing doubled.
    let mut again = rows.clone();
    again.push(RequestRow {
        id: "late".into(),
        token_id: Some(2),
        created_at: sluice::clock::db_time(at(5, 0)),
        tags: String::new(),
        endpoint: "chat",
        status: 200,
        cache: "off",
        ..Default::default()
    });
    again.push(again[0].clone());
    same(
        "insert_batch again",
        pool_write_both!(b, requests::insert_batch(&again)),
    );
    assert_eq!(statements(&b.pool, "requests").await, 2);
    let count: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM requests")
        .fetch_one(&b.pool)
        .await
        .unwrap();
    assert_eq!(count, 301);
    same(
        "insert_batch empty",
        pool_write_both!(b, requests::insert_batch(&[])),
    );
    let lite: RawColumns = sqlx::query_as(RAW)
        .fetch_all(&b.lite.sqlite().read)
        .await
        .unwrap();
    let pg: RawColumns = sqlx::query_as(RAW).fetch_all(&b.pool).await.unwrap();
    assert_eq!(lite, pg, "every column as written");
    let filter = sluice::store::reports::RequestFilter::default();
    same(
        "request log",
        read_both!(b, reports::requests(&filter, 1000, 0)),
    );
    // `last_used_at`, one per token and batch, alike.
    same(
        "tokens after the log",
        read_both!(b, token_admin::list(None, None, chrono::Utc::now())),
    );
    b.lite.close().await;
}

/// Returns once `task` waits on an advisory lock in this database, or has ended; fails,
/// naming `what`, after 30 s of neither.
async fn waits_or_ends<T>(pool: &PgPool, task: &tokio::task::JoinHandle<T>, what: &str) {
    let until = Instant::now() + Duration::from_secs(30);
    loop {
        let waiting: i64 = sqlx::query_scalar(
            "SELECT COUNT(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted
             AND database = (SELECT oid FROM pg_database WHERE datname = current_database())",
        )
        .fetch_one(pool)
        .await
        .unwrap();
        if waiting > 0 || task.is_finished() {
            return;
        }
        assert!(Instant::now() < until, "{what} neither ended nor waited");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn new_entry(key: u8, tags: &str, answer: &str, minute: u32) -> NewEntry {
    NewEntry {
        key: [key; 32],
        scope: "team:1".into(),
        model: "gpt-4o-mini".into(),
        format: "openai",
        context_hash: key.is_multiple_of(2).then_some([key ^ 0xff; 32]),
        vector: key.is_multiple_of(2).then(|| vec![key, 1, 2, 3]),
        answer: answer.into(),
        input_tokens: key as i64,
        output_tokens: 2,
        tags: tags.into(),
        created_at: at(10, minute),
        expires_at: at(20, minute),
        version: i64::from(key) * 100 + i64::from(minute) + 1,
        epoch: None,
    }
}

/// Keys of entries after `after`, in id order (ids themselves may differ between engines:
/// only their order and "newer than" matter to the indexes).
fn keys_of(rows: &[KeyRow]) -> Vec<u8> {
    rows.iter().map(|r| r.key[0]).collect()
}

/// Which store of each key the rows hold, as a refresh compares it with an entry held.
fn versions(rows: &[KeyRow]) -> Vec<i64> {
    rows.iter().map(|r| r.version).collect()
}

#[tokio::test]
async fn cache_batches_replace_and_tags_match_as_on_sqlite() {
    let b = both().await;
    populate(&b).await;
    count_statements(&b.pool, "cache_entries").await;
    let put = |entries: Vec<NewEntry>| {
        let (lite, pg) = (b.lite.sqlite().write.clone(), b.pool.clone());
        async move {
            writer::once(&lite, |tx| sluice::store::cache::put_batch_tx(tx, &entries))
                .await
                .unwrap();
            let mut tx = pg.begin().await.unwrap();
            pg::cache::put_batch_tx(&mut tx, &entries).await.unwrap();
            tx.commit().await.unwrap();
        }
    };
    put(vec![
        new_entry(1, ",a_b,", "one", 0),
        new_entry(2, ",axb,", "two", 1),
        new_entry(1, ",a_b,Case:1,", "one again", 2),
        new_entry(3, ",%,", "three", 3),
        new_entry(4, ",", "four", 4),
    ])
    .await;
    assert_eq!(
        statements(&b.pool, "cache_entries").await,
        1,
        "one statement per batch"
    );
    let now = at(11, 0);
    for key in 1..=5u8 {
        same("get", read_both!(b, cache::get(&[key; 32], now)));
    }
    let (l, p) = read_both!(b, cache::keys_after(0, now));
    let (l, p) = (l.unwrap(), p.unwrap());
    assert_eq!(keys_of(&l), keys_of(&p), "same entries in the same order");
    assert_eq!(versions(&l), versions(&p), "the same stores");
    assert_eq!(
        keys_of(&p),
        [2, 1, 3, 4],
        "a key twice in a batch: its last version, stored last"
    );
    let (l_idx, p_idx) = read_both!(b, cache::index_rows(0, now, 1_000));
    let strip = |rows: Vec<sluice::store::cache::IndexRow>| {
        rows.into_iter()
            .map(|(_, k, c, v)| (k, c, v))
            .collect::<Vec<_>>()
    };
    assert_eq!(strip(l_idx.unwrap()), strip(p_idx.unwrap()));
    // Hits, then a replacement: a new, newer id and the hit count starts over (SQLite's
    // INSERT OR REPLACE deletes and re-inserts).
    let seen = p.last().unwrap().id;
    writer::once(&b.lite.sqlite().write, |tx| {
        sluice::store::cache::count_hits_tx(tx, &[[2; 32], [3; 32], [2; 32]])
    })
    .await
    .unwrap();
    pg::cache::count_hits_tx(
        &mut b.pool.acquire().await.unwrap(),
        &[[2; 32], [3; 32], [2; 32]],
    )
    .await
    .unwrap();
    let hits = "SELECT hits FROM cache_entries WHERE key = $1";
    let lite_hits: i64 = sqlx::query_scalar(hits)
        .bind([2u8; 32].as_slice())
        .fetch_one(&b.lite.sqlite().read)
        .await
        .unwrap();
    let pg_hits: i64 = sqlx::query_scalar(hits)
        .bind([2u8; 32].as_slice())
        .fetch_one(&b.pool)
        .await
        .unwrap();
    assert_eq!(
        (lite_hits, pg_hits),
        (2, 2),
        "a key twice in a batch: two hits"
    );
    put(vec![new_entry(2, ",b,", "two again", 9)]).await;
    let after = pg::cache::keys_after(&b.pool, seen, now).await.unwrap();
    assert_eq!(
        keys_of(&after),
        [2],
        "the replaced entry is new to the indexes"
    );
    assert_eq!(versions(&after), [210], "holding the new store's version");
    let pg_hits: i64 = sqlx::query_scalar(hits)
        .bind([2u8; 32].as_slice())
        .fetch_one(&b.pool)
        .await
        .unwrap();
    let lite_hits: i64 = sqlx::query_scalar(hits)
        .bind([2u8; 32].as_slice())
        .fetch_one(&b.lite.sqlite().read)
        .await
        .unwrap();
    assert_eq!((lite_hits, pg_hits), (0, 0));
    // Tags: exact, case-sensitive, no wildcards; the epoch moves at every invalidation.
    // (Counted from where each engine's stands: SQLite's migration 0029 moved its own.)
    let epochs = || async {
        let (l, p) = read_both!(b, cache::epoch());
        (l.unwrap(), p.unwrap())
    };
    let start = epochs().await;
    for tag in ["a_b", "A_B", "case:1", "%", "_", "nothing", "b"] {
        let (l, p) = pool_write_both!(b, cache::delete_tag(tag));
        let (mut l, mut p) = (l.unwrap(), p.unwrap());
        l.sort();
        p.sort();
        assert_eq!(l, p, "tag {tag}");
        let now = epochs().await;
        assert_eq!(
            now.0 - start.0,
            now.1 - start.1,
            "the epoch moved alike: tag {tag}"
        );
    }
    let (l, p) = read_both!(b, cache::keys_after(0, now));
    assert_eq!(keys_of(&l.unwrap()), keys_of(&p.unwrap()));
    // Eviction: expired first, then the oldest past the cap.
    put((10..20).map(|k| new_entry(k, ",", "x", k as u32)).collect()).await;
    // The deleted keys, in no order the engines agree on.
    type Keys<E> = Result<Vec<Vec<u8>>, E>;
    let sorted = |(l, p): (Keys<_>, Keys<_>)| {
        let by_key = |mut v: Vec<Vec<u8>>| {
            v.sort();
            v
        };
        (l.map(by_key), p.map(by_key))
    };
    let expired = same(
        "evict expired",
        sorted(pool_write_both!(b, cache::evict_expired(at(20, 12)))),
    );
    assert!(!expired.is_empty());
    same(
        "evict over the cap",
        sorted(pool_write_both!(b, cache::evict_over_cap(3, at(20, 12)))),
    );
    let (l, p) = read_both!(b, cache::keys_after(0, at(20, 12)));
    assert_eq!(keys_of(&l.unwrap()), keys_of(&p.unwrap()));
    // The balance a hit reports.
    let owner = sluice::store::ledger::Owner {
        token_id: 1,
        user_id: 2,
        team_id: 1,
        resets: [
            sluice::quota::period::Reset::Daily,
            sluice::quota::period::Reset::Daily,
            sluice::quota::period::Reset::Monthly,
        ],
    };
    same(
        "budget_remaining",
        read_both!(b, cache::budget_remaining(&owner, at(10, 0), a_while())),
    );
    same(
        "budget_remaining a day on",
        read_both!(
            b,
            cache::budget_remaining(&owner, at(10, 0) + chrono::Duration::days(1), a_while())
        ),
    );
    b.lite.close().await;
}

/// A store by an older Sluice still running in the fleet (its statements set every column
/// but `version`) leaves the row unversioned on both engines: on PostgreSQL its upsert kept
/// the version of the store it replaced, and a replica holding that store kept serving it
/// (s39 attack F1). A hit's count leaves the version as it is.
#[tokio::test]
async fn an_older_replicas_store_leaves_its_row_unversioned() {
    let b = both().await;
    let entry = new_entry(7, ",", "seven", 0);
    writer::once(&b.lite.sqlite().write, |tx| {
        sluice::store::cache::put_batch_tx(tx, std::slice::from_ref(&entry))
    })
    .await
    .unwrap();
    let mut tx = b.pool.begin().await.unwrap();
    pg::cache::put_batch_tx(&mut tx, std::slice::from_ref(&entry))
        .await
        .unwrap();
    tx.commit().await.unwrap();
    pg::cache::count_hits_tx(&mut b.pool.acquire().await.unwrap(), &[[7; 32]])
        .await
        .unwrap();
    let version = "SELECT version FROM cache_entries WHERE key = $1";
    let read = |pool: sqlx::PgPool| async move {
        let v: i64 = sqlx::query_scalar(version)
            .bind([7u8; 32].as_slice())
            .fetch_one(&pool)
            .await
            .unwrap();
        v
    };
    assert_eq!(read(b.pool.clone()).await, 701, "a hit keeps the version");
    // The statements of the version before versions, as they were.
    sqlx::query(
        "INSERT OR REPLACE INTO cache_entries (key, scope, model, format, context_hash, vector, answer, input_tokens, output_tokens, tags, created_at, expires_at)
         VALUES (?, 'team:1', 'gpt-4o-mini', 'openai', NULL, NULL, 'seven again', 7, 2, ',', '2026-01-10T10:00:00.000Z', '2026-01-10T20:00:00.000Z')",
    )
    .bind([7u8; 32].as_slice())
    .execute(&b.lite.sqlite().write)
    .await
    .unwrap();
    sqlx::query(
        "INSERT INTO cache_entries (key, scope, model, format, context_hash, vector, answer, input_tokens, output_tokens, tags, created_at, expires_at)
         SELECT * FROM unnest($1::bytea[], $2::text[], $3::text[], $4::text[], $5::bytea[], $6::bytea[], $7::text[],
                              $8::bigint[], $9::bigint[], $10::text[], $11::text[], $12::text[])
         ON CONFLICT (key) DO UPDATE SET id = DEFAULT, scope = EXCLUDED.scope, model = EXCLUDED.model, format = EXCLUDED.format,
            context_hash = EXCLUDED.context_hash, vector = EXCLUDED.vector, answer = EXCLUDED.answer,
            input_tokens = EXCLUDED.input_tokens, output_tokens = EXCLUDED.output_tokens, tags = EXCLUDED.tags,
            created_at = EXCLUDED.created_at, expires_at = EXCLUDED.expires_at, hits = 0",
    )
    .bind(vec![vec![7u8; 32]])
    .bind(vec!["team:1"])
    .bind(vec!["gpt-4o-mini"])
    .bind(vec!["openai"])
    .bind(vec![None::<Vec<u8>>])
    .bind(vec![None::<Vec<u8>>])
    .bind(vec!["seven again"])
    .bind(vec![7i64])
    .bind(vec![2i64])
    .bind(vec![","])
    .bind(vec!["2026-01-10T10:00:00.000Z"])
    .bind(vec!["2026-01-10T20:00:00.000Z"])
    .execute(&b.pool)
    .await
    .unwrap();
    let lite: i64 = sqlx::query_scalar(version)
        .bind([7u8; 32].as_slice())
        .fetch_one(&b.lite.sqlite().read)
        .await
        .unwrap();
    assert_eq!((lite, read(b.pool.clone()).await), (0, 0));
    b.lite.close().await;
}

/// The statements that write many cache rows take one lock, one at a time: each locks its
/// rows in an order of its own (entry batches by arrival, hit counts by the join, deletions
/// by the scan), and two at once could wait for each other's rows — a deadlock failing one,
/// an admin's tag invalidation among them (s39 attack H2). A tag deletion waits for a hit
/// batch still open, though they share no row.
#[tokio::test]
async fn cache_writes_of_many_rows_wait_for_each_other() {
    let b = both().await;
    let mut tx = b.pool.begin().await.unwrap();
    pg::cache::put_batch_tx(
        &mut tx,
        &[
            new_entry(1, ",one,", "one", 0),
            new_entry(2, ",two,", "two", 1),
        ],
    )
    .await
    .unwrap();
    tx.commit().await.unwrap();
    let mut hits = b.pool.begin().await.unwrap();
    pg::cache::count_hits_tx(&mut hits, &[[1; 32]])
        .await
        .unwrap();
    let pool = b.pool.clone();
    let delete = tokio::spawn(async move { pg::cache::delete_tag(&pool, "two").await });
    waits_or_ends(&b.pool, &delete, "the deletion").await;
    assert!(
        !delete.is_finished(),
        "the deletion ran beside the hit batch"
    );
    hits.commit().await.unwrap();
    let deleted = tokio::time::timeout(Duration::from_secs(10), delete)
        .await
        .expect("the deletion goes on once the batch committed")
        .unwrap()
        .unwrap();
    assert_eq!(deleted, [vec![2u8; 32]]);
    b.lite.close().await;
}

#[tokio::test]
async fn lingering_rows_are_written_in_batches_and_flushed() {
    let b = both().await;
    populate(&b).await;
    count_statements(&b.pool, "requests").await;
    let log = pg::lingering::Lingering::start(b.pool.clone(), "request log", |conn, rows| {
        Box::pin(pg::requests::insert_batch_tx(conn, rows))
    });
    let rows = request_rows();
    for r in &rows {
        assert!(log.push(r.clone()).await);
    }
    log.flush().await;
    let count: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM requests")
        .fetch_one(&b.pool)
        .await
        .unwrap();
    assert_eq!(count, rows.len() as i64, "every row written by the flush");
    let n = statements(&b.pool, "requests").await;
    assert!(
        n < rows.len() as i64 / 4,
        "{} rows took {n} statements: not batched",
        rows.len()
    );
    b.lite.close().await;
}

/// The next thing the listener heard, within `limit`.
async fn heard(rx: &mut mpsc::UnboundedReceiver<Heard>, limit: Duration) -> Option<Heard> {
    tokio::time::timeout(limit, rx.recv()).await.ok().flatten()
}

#[tokio::test]
async fn an_epoch_bump_is_heard_at_once_and_the_poll_survives_a_killed_listener() {
    let b = both().await;
    populate(&b).await;
    let (tx, mut rx) = mpsc::unbounded_channel();
    let listener = pg::notify::listen(&b.pool, move |h| {
        let _ = tx.send(h);
    });
    assert_eq!(
        heard(&mut rx, Duration::from_secs(30)).await,
        Some(Heard::Lost),
        "connected (everything dropped once)"
    );
    // A bump rolled back is never heard; the next committed one is.
    let mut t = b.pool.begin().await.unwrap();
    pg::tokens::bump_epoch(&mut t).await.unwrap();
    t.rollback().await.unwrap();
    let sent = Instant::now();
    let mut t = b.pool.begin().await.unwrap();
    assert!(pg::tokens::revoke(&mut t, 1, at(10, 0)).await.unwrap());
    t.commit().await.unwrap();
    assert_eq!(
        heard(&mut rx, Duration::from_secs(5)).await,
        Some(Heard::Bumped(Epoch::Token))
    );
    let took = sent.elapsed();
    assert!(
        took < Duration::from_secs(1),
        "a revocation heard after {took:?}"
    );
    // An invalidation that deleted nothing moves the cache's epoch all the same (an answer
    // planned before it must not be written after it: s46 stop attack F4).
    let keys = pg::cache::delete_tag(&b.pool, "nothing").await.unwrap();
    assert!(keys.is_empty());
    assert_eq!(
        heard(&mut rx, Duration::from_secs(5)).await,
        Some(Heard::Bumped(Epoch::Cache))
    );
    // Token edits notify too, and cache invalidations on their own payload.
    let mut t = b.pool.begin().await.unwrap();
    pg::token_admin::expire_at(&mut t, 2, at(11, 0))
        .await
        .unwrap();
    t.commit().await.unwrap();
    assert_eq!(
        heard(&mut rx, Duration::from_secs(5)).await,
        Some(Heard::Bumped(Epoch::Token))
    );
    let entries = vec![new_entry(7, ",t,", "a", 0)];
    let mut t = b.pool.begin().await.unwrap();
    pg::cache::put_batch_tx(&mut t, &entries).await.unwrap();
    t.commit().await.unwrap();
    assert_eq!(pg::cache::delete_tag(&b.pool, "t").await.unwrap().len(), 1);
    assert_eq!(
        heard(&mut rx, Duration::from_secs(5)).await,
        Some(Heard::Bumped(Epoch::Cache))
    );

    // The listener's connection killed: the poll still sees every bump, and the listener
    // comes back (telling its callback to drop everything: it may have missed some).
    let before = pg::tokens::epoch(&b.pool).await.unwrap();
    let killed: i64 = sqlx::query_scalar(
        "SELECT COUNT(pg_terminate_backend(pid)) FROM pg_stat_activity
         WHERE datname = current_database() AND query LIKE 'LISTEN%' AND pid <> pg_backend_pid()",
    )
    .fetch_one(&b.pool)
    .await
    .unwrap();
    assert_eq!(killed, 1, "the listener's own connection");
    let mut t = b.pool.begin().await.unwrap();
    assert!(pg::tokens::revoke(&mut t, 2, at(10, 0)).await.unwrap());
    t.commit().await.unwrap();
    assert_eq!(
        pg::tokens::epoch(&b.pool).await.unwrap(),
        before + 1,
        "the poll sees the bump"
    );
    // Whatever it heard meanwhile, it ends reconnected and hearing.
    let until = Instant::now() + Duration::from_secs(30);
    let mut lost = false;
    while !lost {
        assert!(Instant::now() < until, "the listener never came back");
        lost = heard(&mut rx, Duration::from_secs(30)).await == Some(Heard::Lost);
    }
    let mut t = b.pool.begin().await.unwrap();
    assert!(pg::tokens::revoke(&mut t, 3, at(10, 0)).await.unwrap());
    t.commit().await.unwrap();
    loop {
        match heard(&mut rx, Duration::from_secs(5)).await {
            Some(Heard::Bumped(Epoch::Token)) => break,
            Some(Heard::Lost) => continue,
            other => panic!("after reconnecting, heard {other:?}"),
        }
    }
    // Closing the pool ends the listener.
    b.pg.close().await;
    tokio::time::timeout(Duration::from_secs(30), listener)
        .await
        .expect("the listener ends with its pool")
        .unwrap();
    b.lite.close().await;
}

/// The in-memory cache indexes follow new entries by id ("after the last id seen"). With
/// two hosts writing, an entry whose id is smaller than one already read must not commit
/// after it, or every reader past that id misses it for good.
#[tokio::test]
async fn cache_entries_become_visible_in_id_order_across_writers() {
    let b = both().await;
    let now = at(11, 0);
    // Host A writes and has not committed yet.
    let mut a = b.pool.begin().await.unwrap();
    pg::cache::put_batch_tx(&mut a, &[new_entry(1, ",", "a", 0)])
        .await
        .unwrap();
    // Host B writes meanwhile.
    let pool = b.pool.clone();
    let host_b = tokio::spawn(async move {
        let mut t = pool.begin().await.unwrap();
        pg::cache::put_batch_tx(&mut t, &[new_entry(2, ",", "b", 0)])
            .await
            .unwrap();
        t.commit().await.unwrap();
    });
    waits_or_ends(&b.pool, &host_b, "host B").await;
    // A reader polls now, then again after both committed.
    let first = pg::cache::keys_after(&b.pool, 0, now).await.unwrap();
    let seen = first.last().map_or(0, |r| r.id);
    a.commit().await.unwrap();
    host_b.await.unwrap();
    let second = pg::cache::keys_after(&b.pool, seen, now).await.unwrap();
    let mut found = keys_of(&first);
    found.extend(keys_of(&second));
    found.sort();
    assert_eq!(found, [1, 2], "a reader following ids missed an entry");
    b.lite.close().await;
}

/// One row PostgreSQL cannot store as it is (a NUL in its text) must not take the rest of
/// its batch with it: the lingering writer would retry the batch and then drop every row.
#[tokio::test]
async fn a_nul_in_one_row_does_not_fail_its_batch() {
    let b = both().await;
    populate(&b).await;
    let mut rows = request_rows();
    rows[3].model = "gpt\0-4o".into();
    rows[4].cache_key = Some("ab\0cd".into());
    pg::requests::insert_batch(&b.pool, &rows).await.unwrap();
    let count: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM requests")
        .fetch_one(&b.pool)
        .await
        .unwrap();
    assert_eq!(count, rows.len() as i64, "every row of the batch logged");
    let model: String = sqlx::query_scalar("SELECT model FROM requests WHERE id = $1")
        .bind(&rows[3].id)
        .fetch_one(&b.pool)
        .await
        .unwrap();
    assert_eq!(model, "gpt\u{FFFD}-4o");
    let mut bad = new_entry(1, ",", "an answer with \0 in it", 0);
    bad.tags = ",t,".into();
    let mut tx = b.pool.begin().await.unwrap();
    pg::cache::put_batch_tx(&mut tx, &[bad, new_entry(2, ",", "fine", 0)])
        .await
        .unwrap();
    tx.commit().await.unwrap();
    let keys = pg::cache::keys_after(&b.pool, 0, at(11, 0)).await.unwrap();
    assert_eq!(
        keys_of(&keys),
        [2],
        "the storable entry is stored, the other left out"
    );
    b.lite.close().await;
}

/// Two hosts logging at once, every batch touching the same tokens and the same day rows
/// in another order: no deadlock, no row lost or counted twice.
#[tokio::test]
async fn two_hosts_logging_at_once_neither_deadlock_nor_miscount() {
    let b = both().await;
    populate(&b).await;
    let url_pool = b.pool.clone();
    let second = {
        let opts = (*url_pool.connect_options()).clone();
        sqlx::postgres::PgPoolOptions::new()
            .max_connections(8)
            .connect_with(opts)
            .await
            .unwrap()
    };
    let mut tasks = Vec::new();
    for (h, pool) in [b.pool.clone(), second].into_iter().enumerate() {
        for w in 0..4 {
            let pool = pool.clone();
            tasks.push(tokio::spawn(async move {
                for batch in 0..20 {
                    let mut rows: Vec<RequestRow> = (0..8)
                        .map(|i| {
                            let token = 1 + (i + w + batch) % 4;
                            RequestRow {
                                id: format!("h{h}-w{w}-b{batch}-{i}"),
                                token_id: Some(token as i64),
                                user_id: Some(token as i64),
                                team_id: Some(1),
                                endpoint: "chat",
                                model: ["a", "b"][i % 2].into(),
                                status: 200,
                                cost_micros: 10,
                                cache: "off",
                                created_at: sluice::clock::db_time(at(10, (i * 7) as u32)),
                                tags: String::new(),
                                ..Default::default()
                            }
                        })
                        .collect();
                    if (h + w + batch) % 2 == 0 {
                        rows.reverse();
                    }
                    pg::requests::insert_batch(&pool, &rows).await.unwrap();
                }
            }));
        }
    }
    for t in tasks {
        t.await.unwrap();
    }
    let (rows, spend): (i64, i64) =
        sqlx::query_as("SELECT COUNT(*), SUM(cost_micros)::BIGINT FROM requests")
            .fetch_one(&b.pool)
            .await
            .unwrap();
    assert_eq!((rows, spend), (2 * 4 * 20 * 8, 2 * 4 * 20 * 8 * 10));
    let (days, day_spend): (i64, i64) =
        sqlx::query_as("SELECT SUM(requests)::BIGINT, SUM(cost_micros)::BIGINT FROM request_days")
            .fetch_one(&b.pool)
            .await
            .unwrap();
    assert_eq!(
        (days, day_spend),
        (rows, spend),
        "the spend by day counts each row once"
    );
    b.lite.close().await;
}

/// `last_used_at` is a token's latest use: the latest row of a batch, and a batch written
/// late (another host's, a retried flush) with older rows does not move it back. Before, the
/// earliest row of each batch overwrote it, on both engines.
#[tokio::test]
async fn last_used_is_the_latest_use_and_an_older_batch_does_not_move_it_back() {
    let b = both().await;
    populate(&b).await;
    let row = |id: &str, minute: u32| RequestRow {
        id: id.into(),
        token_id: Some(1),
        created_at: sluice::clock::db_time(at(12, minute)),
        tags: String::new(),
        endpoint: "chat",
        status: 200,
        cache: "off",
        ..Default::default()
    };
    let latest = sluice::clock::db_time(at(12, 30));
    same(
        "a batch",
        pool_write_both!(
            b,
            requests::insert_batch(&[row("a", 0), row("b", 30), row("c", 10)])
        ),
    );
    same(
        "an older batch",
        pool_write_both!(b, requests::insert_batch(&[row("d", 5)])),
    );
    let sql = "SELECT last_used_at FROM tokens WHERE id = 1";
    let lite: Option<String> = sqlx::query_scalar(sql)
        .fetch_one(&b.lite.sqlite().read)
        .await
        .unwrap();
    let pg: Option<String> = sqlx::query_scalar(sql).fetch_one(&b.pool).await.unwrap();
    assert_eq!(lite.as_deref(), Some(latest.as_str()), "SQLite");
    assert_eq!(pg.as_deref(), Some(latest.as_str()), "PostgreSQL");
    b.lite.close().await;
}

/// A use stamped ahead of the database's clock (a host whose clock runs ahead) is kept at
/// most a minute ahead of it, and a value already further ahead (written before, or by a
/// clock since set back) gives way to the next use: forward-only, it stayed until real time
/// passed it, every later use hidden (s23 final attack #3).
#[tokio::test]
async fn a_use_stamped_ahead_of_the_databases_clock_does_not_hide_later_uses() {
    let b = both().await;
    populate(&b).await;
    let row = |id: &str, created: chrono::DateTime<chrono::Utc>| RequestRow {
        id: id.into(),
        token_id: Some(1),
        created_at: sluice::clock::db_time(created),
        tags: String::new(),
        endpoint: "chat",
        status: 200,
        cache: "off",
        ..Default::default()
    };
    let sql = "SELECT last_used_at FROM tokens WHERE id = 1";
    let read = |b: &crate::pg_store::Both| {
        let (lite, pg) = (b.lite.sqlite().read.clone(), b.pool.clone());
        async move {
            let l: Option<String> = sqlx::query_scalar(sql).fetch_one(&lite).await.unwrap();
            let p: Option<String> = sqlx::query_scalar(sql).fetch_one(&pg).await.unwrap();
            [("SQLite", l.unwrap()), ("PostgreSQL", p.unwrap())]
        }
    };
    let before = chrono::Utc::now();
    same(
        "a day ahead",
        pool_write_both!(
            b,
            requests::insert_batch(&[row("a", before + chrono::Duration::days(1))])
        ),
    );
    let bound = sluice::clock::db_time(chrono::Utc::now() + chrono::Duration::seconds(61));
    for (engine, at) in read(&b).await {
        assert!(
            at.as_str() <= bound.as_str() && at >= sluice::clock::db_time(before),
            "{engine}: {at} is more than a minute ahead of the database's clock ({bound})"
        );
    }
    let ahead = sluice::clock::db_time(before + chrono::Duration::days(365));
    let set = "UPDATE tokens SET last_used_at = $1 WHERE id = 1";
    sqlx::query(&set.replace("$1", "?1"))
        .bind(&ahead)
        .execute(&b.lite.sqlite().write)
        .await
        .unwrap();
    sqlx::query(set)
        .bind(&ahead)
        .execute(&b.pool)
        .await
        .unwrap();
    let now = chrono::Utc::now();
    same(
        "a use now",
        pool_write_both!(b, requests::insert_batch(&[row("b", now)])),
    );
    for (engine, at) in read(&b).await {
        assert_eq!(at, sluice::clock::db_time(now), "{engine}");
    }
    b.lite.close().await;
}

/// A read's bound no test reaches.
fn a_while() -> std::time::Instant {
    std::time::Instant::now() + std::time::Duration::from_secs(60)
}
