//! What the store boundary promises its callers about transactions: a `Tx` keeps nothing
//! unless committed, `begin` takes the write lock up front (a second writer — another
//! process on the file — waits for it instead of failing midway), and a read snapshot
//! never waits for a writer.

use std::time::Duration;

use super::tenants::{self, NewBudget};
use super::{directory, Db};
use crate::quota::period::Reset;

const NO_BUDGET: NewBudget = NewBudget {
    limit_micros: None,
    reset: Reset::Never,
};

async fn team_names(db: &Db) -> Vec<String> {
    let mut names: Vec<String> = directory::teams(db, None)
        .await
        .unwrap()
        .into_iter()
        .map(|t| t.name)
        .collect();
    names.sort();
    names
}

#[tokio::test]
async fn a_dropped_tx_keeps_nothing_and_a_committed_one_everything() {
    let dir = tempfile::tempdir().unwrap();
    let db = Db::open(&dir.path().join("t.db"), false).await.unwrap();
    let now = chrono::Utc::now();
    let before = team_names(&db).await;
    let mut tx = db.begin().await.unwrap();
    tenants::create_team(&mut tx, "dropped", &NO_BUDGET, now)
        .await
        .unwrap();
    drop(tx);
    let mut tx = db.begin().await.unwrap();
    tenants::create_team(&mut tx, "rolled-back", &NO_BUDGET, now)
        .await
        .unwrap();
    tx.rollback().await.unwrap();
    assert_eq!(team_names(&db).await, before);
    let mut tx = db.begin().await.unwrap();
    tenants::create_team(&mut tx, "kept", &NO_BUDGET, now)
        .await
        .unwrap();
    tx.commit().await.unwrap();
    let mut expected = before;
    expected.push("kept".into());
    expected.sort();
    assert_eq!(team_names(&db).await, expected);
}

#[tokio::test]
async fn begin_holds_the_write_lock_until_the_tx_ends_and_readers_never_wait() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.db");
    let db = Db::open(&path, false).await.unwrap();
    // Another process on the same file: its own write connection.
    let other = Db::open(&path, false).await.unwrap();
    let now = chrono::Utc::now();
    let mut tx = db.begin().await.unwrap();
    tenants::create_team(&mut tx, "first", &NO_BUDGET, now)
        .await
        .unwrap();
    // A reader is not held up by the open write transaction, and does not see it.
    let mut snapshot = tokio::time::timeout(Duration::from_secs(5), other.begin_read())
        .await
        .expect("a read snapshot waited for a writer")
        .unwrap();
    assert_eq!(
        tenants::team_id(&mut snapshot, "first").await.unwrap(),
        None
    );
    drop(snapshot);
    // The other writer waits for the lock up front (`BEGIN IMMEDIATE`), not at its
    // first write.
    let waiting = tokio::spawn(async move {
        let mut tx = other.begin().await.unwrap();
        let seen = tenants::team_id(&mut tx, "first").await.unwrap();
        tenants::create_team(&mut tx, "second", &NO_BUDGET, now)
            .await
            .unwrap();
        tx.commit().await.unwrap();
        seen
    });
    // Time for it to try (a slow machine only makes this check weaker, never wrong; the
    // proof is that it saw "first" below).
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !waiting.is_finished(),
        "a second writer began while the first held the lock"
    );
    tx.commit().await.unwrap();
    let seen = tokio::time::timeout(Duration::from_secs(8), waiting)
        .await
        .expect("the second writer never got the lock")
        .unwrap();
    assert!(
        seen.is_some(),
        "the second writer began before the first committed"
    );
    let names = team_names(&db).await;
    assert!(names.contains(&"first".to_string()) && names.contains(&"second".to_string()));
}

/// Neither SQLite pool pings its connection before each use: the connection is in-process
/// (a dead worker thread fails the next statement anyway), and the ping was a round trip to
/// its thread before every read — a cache hit's budget read paid two hops for one (s39).
#[tokio::test]
async fn no_sqlite_pool_pings_before_each_use() {
    let dir = tempfile::tempdir().unwrap();
    let db = Db::open(&dir.path().join("ping.db"), false).await.unwrap();
    let pools = db.sqlite();
    assert!(!pools.write.options().get_test_before_acquire());
    assert!(
        !pools.read.options().get_test_before_acquire(),
        "the read pool pings"
    );
}

/// A cache hit's budget read runs on a reader of the store's own (`store::readers`), not
/// through the read pool: reads holding every pooled connection (exports, reports) do not
/// hold it up. Through the pool it waited for a connection, up to the pool's 30 s.
// On two threads, the read spawned: a read that blocked its thread would still be timed out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hits_budget_read_waits_for_no_pooled_connection() {
    let (_dir, db, owner) = super::writer_test::setup(5_000_000).await;
    let pool = &db.sqlite().read;
    let mut held = Vec::new();
    for _ in 0..pool.options().get_max_connections() {
        held.push(pool.acquire().await.unwrap());
    }
    let read = tokio::spawn({
        let db = db.clone();
        async move { super::cache::budget_remaining(&db, &owner, chrono::Utc::now(), unbounded()).await }
    });
    let read = tokio::time::timeout(Duration::from_secs(2), read)
        .await
        .expect("the budget read waited for the read pool");
    assert_eq!(read.unwrap().unwrap(), Some(5_000_000));
    drop(held);
}

/// `Db::close` closes the hit path's readers too: an open one went on reading after every
/// other read failed, and kept the write connection from closing last — the one that
/// removes the WAL (s40 attack F2). The WAL's removal itself is not asserted: with no
/// reader ever opened, sqlx's close of the pools left it behind in about one run in twenty
/// on a loaded machine.
#[tokio::test]
async fn closing_the_database_closes_its_readers() {
    let (_dir, db, owner) = super::writer_test::setup(5_000_000).await;
    let now = chrono::Utc::now();
    let read = super::cache::budget_remaining(&db, &owner, now, unbounded()).await;
    assert_eq!(read.unwrap(), Some(5_000_000));
    db.close().await;
    let after = super::cache::budget_remaining(&db, &owner, now, unbounded()).await;
    assert!(after.is_err(), "a reader outlived the close: {after:?}");
}

/// A hit's budget read that SQLite holds in its WAL read retry — which sleeps between
/// tries whatever the busy timeout, up to ~10 s, while another process holds the read-mark
/// locks (another gateway on the file, a tool) — holds no worker: the worker's other
/// requests go on. On the worker's own thread it held the whole runtime (s40 final attack
/// F1). The other process: a child holding the `-shm` read-mark bytes (123–127) for 1.5 s.
#[tokio::test]
async fn a_budget_read_sqlite_holds_in_its_wal_retry_holds_no_worker() {
    let (dir, db, owner) = super::writer_test::setup(5_000_000).await;
    let shm = dir.path().join("t.db-shm");
    let mut child = hold_read_marks(&shm, 1.5).await;
    // On this test's one thread: a read that held it would stall the ticks.
    let started = std::time::Instant::now();
    let ticks = tokio::spawn(async move {
        for _ in 0..10 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        started.elapsed()
    });
    let read = super::cache::budget_remaining(&db, &owner, chrono::Utc::now(), unbounded()).await;
    let ticked = ticks.await.unwrap();
    assert!(
        ticked < Duration::from_millis(700),
        "the worker was held {ticked:?}"
    );
    assert!(
        started.elapsed() >= Duration::from_millis(700),
        "the lock held no read"
    );
    assert_eq!(read.unwrap(), Some(5_000_000), "read once the lock went");
    child.wait().await.unwrap();
}

/// Budget reads past the most in flight wait their turn, not fail: 17 reads while another
/// process holds the read marks 1 s all give the budget once it lets go (s42 final attack
/// F1: past 16 in flight a read failed at once, and under an ordinary burst of hits — no
/// lock held — the hits past 16 lost their budget header).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn budget_reads_past_the_most_in_flight_wait_their_turn() {
    let (dir, db, owner) = super::writer_test::setup(5_000_000).await;
    let db = std::sync::Arc::new(db);
    let mut child = hold_read_marks(&dir.path().join("t.db-shm"), 1.0).await;
    let reads: Vec<_> = (0..17)
        .map(|_| {
            let (db, owner) = (db.clone(), owner.clone());
            tokio::spawn(async move {
                super::cache::budget_remaining(&db, &owner, chrono::Utc::now(), unbounded()).await
            })
        })
        .collect();
    // Meanwhile the held reads take every slot, and no more threads than those.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(db.budget_reads.available_permits(), 0);
    for read in reads {
        assert_eq!(read.await.unwrap().unwrap(), Some(5_000_000));
    }
    child.wait().await.unwrap();
}

/// A hit whose bound has passed before its budget read (a client deadline spent on the
/// lookup) begins no read: one begun then was given up on at once, yet held a slot — and,
/// with the read marks held, its thread — until the store let go (s42 final attack F4).
/// A read that the store holds past its bound is given up on at the bound.
#[tokio::test]
async fn a_budget_read_past_its_bound_is_not_begun() {
    let (dir, db, owner) = super::writer_test::setup(5_000_000).await;
    let mut child = hold_read_marks(&dir.path().join("t.db-shm"), 1.0).await;
    let now = chrono::Utc::now();
    let passed = std::time::Instant::now();
    let read = super::cache::budget_remaining(&db, &owner, now, passed).await;
    assert!(
        matches!(read, Err(super::StoreError::NotInTime(_))),
        "{read:?}"
    );
    // Given time to begin, a read would hold its slot now.
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(db.budget_reads.available_permits(), 4, "a read was begun");
    let started = std::time::Instant::now();
    let by = started + Duration::from_millis(200);
    let read = super::cache::budget_remaining(&db, &owner, now, by).await;
    assert!(
        matches!(read, Err(super::StoreError::NotInTime(_))),
        "{read:?}"
    );
    let took = started.elapsed();
    assert!(took < Duration::from_millis(600), "given up after {took:?}");
    child.wait().await.unwrap();
}

/// Nor when its slot comes after the bound: every slot taken, one handed over just before
/// the bound and taken after it (this runtime's one thread held meanwhile), the read is
/// not begun — it held that slot, with the marks held, until SQLite let go (s43 attack F1).
#[tokio::test]
async fn a_budget_read_whose_slot_comes_after_its_bound_is_not_begun() {
    slot_freed_before_the_bound(30, Duration::from_millis(100)).await;
}

/// Nor when its slot comes too near the bound to end by it (`LEAST_TIME_LEFT`): one begun
/// then ended for nobody, holding its slot, and with the slots queued under a burst each
/// freed slot went to the waiter with the least time left (s43 final attack F1).
#[tokio::test]
async fn a_budget_read_whose_slot_comes_too_near_its_bound_is_not_begun() {
    slot_freed_before_the_bound(35, Duration::ZERO).await;
}

/// With the read marks held and every slot taken, a read bound 50 ms on whose slot is
/// freed at `freed_at_ms`, this runtime's one thread then held for `held`: the read must
/// give up without beginning — its slot free again.
async fn slot_freed_before_the_bound(freed_at_ms: u64, held: Duration) {
    let (dir, db, owner) = super::writer_test::setup(5_000_000).await;
    let db = std::sync::Arc::new(db);
    let mut child = hold_read_marks(&dir.path().join("t.db-shm"), 1.0).await;
    let mut slots = Vec::new();
    for _ in 0..4 {
        slots.push(db.budget_reads.clone().acquire_owned().await.unwrap());
    }
    let by = std::time::Instant::now() + Duration::from_millis(50);
    let read = tokio::spawn({
        let (db, owner) = (db.clone(), owner.clone());
        async move { super::cache::budget_remaining(&db, &owner, chrono::Utc::now(), by).await }
    });
    tokio::time::sleep(Duration::from_millis(freed_at_ms)).await;
    drop(slots.pop());
    std::thread::sleep(held);
    let read = read.await.unwrap();
    assert!(
        matches!(read, Err(super::StoreError::NotInTime(_))),
        "{read:?}"
    );
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(db.budget_reads.available_permits(), 1, "a read was begun");
    drop(slots);
    child.wait().await.unwrap();
}

/// A bound no test reaches.
fn unbounded() -> std::time::Instant {
    std::time::Instant::now() + Duration::from_secs(60)
}

/// A child process holding `shm`'s read marks for `seconds` (`tests/support/
/// hold_read_marks.py`), returned once it holds them.
async fn hold_read_marks(shm: &std::path::Path, seconds: f64) -> tokio::process::Child {
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/support/hold_read_marks.py"
    );
    let mut child = tokio::process::Command::new("python3")
        .arg(script)
        .arg(shm)
        .arg(seconds.to_string())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("python3 runs");
    let mut out = tokio::io::BufReader::new(child.stdout.take().expect("piped"));
    let mut line = String::new();
    tokio::io::AsyncBufReadExt::read_line(&mut out, &mut line)
        .await
        .expect("the child's first line");
    assert_eq!(line.trim(), "locked");
    child
}
