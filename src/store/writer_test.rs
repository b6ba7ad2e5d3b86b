//! The group-commit writer and the raw-handle CAS, on a real database file: batches where
//! some reservations fit and some do not, a job that fails alone (also when several of a
//! batch fail, also when they end the whole transaction), a reservation whose caller left
//! before it ran, a late settlement of an orphan, and prepared statements that never
//! outlive their connection.

use std::sync::Arc;
use std::time::Duration;

use chrono::{TimeZone, Utc};

use super::ledger::{self, Owner, Refusal, ReserveRequest};
use super::raw::{Conn, Keeper};
use super::writer::{Stats, Writer};
use super::{Db, StoreError};
use crate::clock::{Clock, ManualClock};
use crate::quota::period::Reset;

fn now() -> chrono::DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 11, 29, 12, 0, 0)
        .single()
        .unwrap_or_default()
}

fn clock() -> Arc<dyn Clock> {
    Arc::new(ManualClock::new(now()))
}

/// A database with one token (limit `token_limit`) under an unlimited user and team.
pub(super) async fn setup(token_limit: i64) -> (tempfile::TempDir, Db, Owner) {
    let dir = tempfile::tempdir().unwrap();
    let db = Db::open(&dir.path().join("t.db"), false).await.unwrap();
    let at = "2026-11-29T00:00:00.000Z";
    sqlx::query("INSERT INTO teams (id, name, reset, created_at) VALUES (1, 'team', 'never', ?)")
        .bind(at)
        .execute(&db.sqlite().write)
        .await
        .unwrap();
    sqlx::query("INSERT INTO users (id, username, team_id, reset, created_at) VALUES (1, 'user', 1, 'never', ?)")
        .bind(at)
        .execute(&db.sqlite().write)
        .await
        .unwrap();
    sqlx::query(
        "INSERT INTO tokens (id, user_id, token_hash, prefix, limit_micros, remaining_micros, reset, period, created_at)
         VALUES (1, 1, x'01', 'abcdefgh', ?, ?, 'never', 'never', ?)",
    )
    .bind(token_limit)
    .bind(token_limit)
    .bind(at)
    .execute(&db.sqlite().write)
    .await
    .unwrap();
    let owner = Owner {
        token_id: 1,
        user_id: 1,
        team_id: 1,
        resets: [Reset::Never; 3],
    };
    (dir, db, owner)
}

type Answer = super::Result<Result<ledger::Reservation, Refusal>>;

fn reserve(
    writer: &Writer,
    owner: &Owner,
    id: &str,
    amount: i64,
) -> tokio::task::JoinHandle<Answer> {
    let (writer, owner, id) = (writer.clone(), owner.clone(), id.to_string());
    tokio::spawn(async move {
        let req = ReserveRequest {
            request_id: &id,
            owner: &owner,
            amount,
            process: "test",
            lease: chrono::Duration::minutes(10),
        };
        ledger::reserve_via(&writer, &req, clock()).await
    })
}

/// Waits until the writer has taken `jobs` jobs into batches.
async fn taken(writer: &Writer, jobs: u64) {
    for _ in 0..2000 {
        if writer.stats().jobs >= jobs {
            return;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    panic!("the writer did not take {jobs} jobs: {:?}", writer.stats());
}

/// Lets the tasks spawned so far hand their jobs over (current-thread runtime: they run
/// in spawn order).
async fn yield_a_little() {
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
}

/// (limit − remaining, Σ ledger reserve/settle/adjust, reserved, open reservations) of the token.
async fn token_books(db: &Db) -> (i64, i64, i64, i64) {
    sqlx::query_as(
        "SELECT limit_micros - remaining_micros,
                (SELECT COALESCE(SUM(amount_micros), 0) FROM ledger WHERE token_id = 1 AND kind IN ('reserve', 'settle', 'adjust')),
                reserved_micros, (SELECT COUNT(*) FROM reservations)
         FROM tokens WHERE id = 1",
    )
    .fetch_one(&db.sqlite().read)
    .await
    .unwrap()
}

#[tokio::test]
async fn one_batch_admits_what_fits_and_refuses_the_rest_in_order() {
    let (_dir, db, owner) = setup(350).await;
    let writer = Writer::start(&db);
    // Hold the write connection so that the writer's second batch gathers four jobs.
    let held = db.sqlite().write.acquire().await.unwrap();
    let first = reserve(&writer, &owner, "r1", 100);
    taken(&writer, 1).await;
    let rest: Vec<_> = [("r2", 100), ("r3", 100), ("r4", 100), ("r5", 50)]
        .into_iter()
        .map(|(id, amount)| reserve(&writer, &owner, id, amount))
        .collect();
    yield_a_little().await;
    drop(held);
    let r1 = first.await.unwrap().unwrap().unwrap();
    let mut answers = Vec::new();
    for r in rest {
        answers.push(r.await.unwrap().unwrap());
    }
    assert_eq!(
        writer.stats(),
        Stats {
            batches: 2,
            jobs: 5,
            failed_batches: 0,
            retries: 0
        }
    );
    // 350 − 100 − 100 − 100 = 50: r4 (100) is refused, r5 (50) still fits after it.
    assert_eq!(answers[0].as_ref().unwrap().token_remaining, Some(150));
    assert_eq!(answers[1].as_ref().unwrap().token_remaining, Some(50));
    assert!(matches!(
        answers[2],
        Err(Refusal::Insufficient(ledger::Level::Token, None))
    ));
    assert_eq!(answers[3].as_ref().unwrap().token_remaining, Some(0));
    // The refused one wrote nothing; the others are all there, books balanced.
    assert_eq!(token_books(&db).await, (350, 350, 350, 4));
    // Settle them all in one batch too: 10 charged each.
    let held = db.sqlite().write.acquire().await.unwrap();
    let mut settles = Vec::new();
    for resv in std::iter::once(r1).chain(answers.into_iter().filter_map(Result::ok)) {
        let w = writer.clone();
        settles.push(tokio::spawn(async move {
            ledger::settle_via(&w, resv.request_id, 10, clock()).await
        }));
    }
    yield_a_little().await;
    drop(held);
    for s in settles {
        assert_eq!(s.await.unwrap().unwrap().unwrap().charged, 10);
    }
    assert_eq!(token_books(&db).await, (40, 40, 0, 0));
    db.close().await;
}

#[tokio::test]
async fn a_failing_job_is_rolled_back_alone() {
    let (_dir, db, owner) = setup(1_000).await;
    sqlx::query(
        "CREATE TRIGGER refuse_bad BEFORE INSERT ON reservations WHEN NEW.request_id = 'bad'
         BEGIN SELECT RAISE(ABORT, 'bad request id'); END",
    )
    .execute(&db.sqlite().write)
    .await
    .unwrap();
    let writer = Writer::start(&db);
    let held = db.sqlite().write.acquire().await.unwrap();
    let first = reserve(&writer, &owner, "a", 100);
    taken(&writer, 1).await;
    let (b, bad, c) = (
        reserve(&writer, &owner, "b", 100),
        reserve(&writer, &owner, "bad", 100),
        reserve(&writer, &owner, "c", 100),
    );
    yield_a_little().await;
    drop(held);
    assert!(first.await.unwrap().unwrap().is_ok());
    assert!(b.await.unwrap().unwrap().is_ok());
    assert!(matches!(bad.await.unwrap(), Err(StoreError::Sqlite { .. })));
    assert_eq!(
        c.await.unwrap().unwrap().unwrap().token_remaining,
        Some(700)
    );
    assert_eq!(writer.stats().failed_batches, 0);
    // The failed job's level updates were rolled back with it.
    assert_eq!(token_books(&db).await, (300, 300, 300, 3));
    db.close().await;
}

#[tokio::test]
async fn jobs_that_end_the_transaction_fail_alone_however_many() {
    let (_dir, db, owner) = setup(1_000).await;
    // RAISE(ROLLBACK) ends the whole transaction. Each such job is set aside and the batch
    // runs again without it (before the fix, a second one failed every job of the batch).
    sqlx::query(
        "CREATE TRIGGER poison BEFORE INSERT ON reservations WHEN NEW.request_id LIKE 'poison%'
         BEGIN SELECT RAISE(ROLLBACK, 'poisoned batch'); END",
    )
    .execute(&db.sqlite().write)
    .await
    .unwrap();
    let writer = Writer::start(&db);
    let held = db.sqlite().write.acquire().await.unwrap();
    let first = reserve(&writer, &owner, "before", 100);
    taken(&writer, 1).await;
    let batch: Vec<_> = [
        "x", "poison 1", "y", "poison 2", "poison 3", "poison 4", "poison 5", "z",
    ]
    .into_iter()
    .map(|id| (id, reserve(&writer, &owner, id, 100)))
    .collect();
    yield_a_little().await;
    drop(held);
    assert!(first.await.unwrap().unwrap().is_ok());
    for (id, answer) in batch {
        let answer = answer.await.unwrap();
        if id.starts_with("poison") {
            assert!(answer.is_err(), "{id}");
        } else {
            assert!(matches!(answer, Ok(Ok(_))), "{id}: {answer:?}");
        }
    }
    // The writer goes on.
    let after = reserve(&writer, &owner, "after", 100)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(after.unwrap().token_remaining, Some(500));
    assert_eq!(writer.stats().failed_batches, 0);
    assert_eq!(token_books(&db).await, (500, 500, 500, 5));
    db.close().await;
}

#[tokio::test]
async fn a_panicking_job_fails_alone_and_the_writer_goes_on() {
    let (_dir, db, owner) = setup(1_000).await;
    let writer = Writer::start(&db);
    let held = db.sqlite().write.acquire().await.unwrap();
    let first = reserve(&writer, &owner, "a", 100);
    taken(&writer, 1).await;
    let b = reserve(&writer, &owner, "b", 100);
    let w = writer.clone();
    let boom = tokio::spawn(async move {
        w.run(|tx| {
            tx.execute("UPDATE tokens SET remaining_micros = 0", &[])?;
            if tx.in_transaction() {
                panic!("a bug in a job");
            }
            Ok(())
        })
        .await
    });
    let c = reserve(&writer, &owner, "c", 100);
    yield_a_little().await;
    drop(held);
    assert!(first.await.unwrap().unwrap().is_ok());
    assert!(b.await.unwrap().unwrap().is_ok());
    assert!(matches!(boom.await.unwrap(), Err(StoreError::Batch(_))));
    assert_eq!(
        c.await.unwrap().unwrap().unwrap().token_remaining,
        Some(700)
    );
    assert_eq!(token_books(&db).await, (300, 300, 300, 3));
    db.close().await;
}

#[tokio::test]
async fn the_standalone_functions_run_the_same_cas() {
    let (_dir, db, owner) = setup(150).await;
    let req = |id: &'static str| ReserveRequest {
        request_id: id,
        owner: &owner,
        amount: 100,
        process: "test",
        lease: chrono::Duration::zero(),
    };
    let a = ledger::reserve(&db, &req("a"), now())
        .await
        .unwrap()
        .unwrap();
    assert!(matches!(
        ledger::reserve(&db, &req("b"), now()).await.unwrap(),
        Err(Refusal::Insufficient(ledger::Level::Token, None))
    ));
    let s = ledger::settle(&db, &a.request_id, 1_000, now())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        (s.charged, s.absorbed, s.token_remaining),
        (100, 900, Some(50))
    );
    assert!(ledger::settle(&db, &a.request_id, 0, now())
        .await
        .unwrap()
        .is_none());
    assert_eq!(token_books(&db).await, (100, 100, 0, 0));
    db.close().await;
}

#[tokio::test]
async fn a_reservation_whose_caller_left_before_it_ran_is_never_written() {
    let (_dir, db, owner) = setup(1_000).await;
    let writer = Writer::start(&db);
    let held = db.sqlite().write.acquire().await.unwrap();
    let first = reserve(&writer, &owner, "first", 100);
    taken(&writer, 1).await;
    let gone = reserve(&writer, &owner, "gone", 100);
    yield_a_little().await;
    // The client disconnects while its job waits for the writer: its future is dropped.
    gone.abort();
    let _ = gone.await;
    drop(held);
    assert!(first.await.unwrap().unwrap().is_ok());
    let after = reserve(&writer, &owner, "after", 100)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(after.unwrap().token_remaining, Some(800));
    assert_eq!(token_books(&db).await, (200, 200, 200, 2));
    db.close().await;
}

#[tokio::test]
async fn a_late_settlement_corrects_an_orphan_to_the_actual_cost() {
    let (_dir, db, owner) = setup(1_000).await;
    let req = ReserveRequest {
        request_id: "stalled",
        owner: &owner,
        amount: 300,
        process: "stalled-process",
        lease: chrono::Duration::minutes(10),
    };
    ledger::reserve(&db, &req, now()).await.unwrap().unwrap();
    // Another process takes the stalled one for gone: charged in full.
    let n = ledger::settle_orphans(&db, ledger::Orphans::OfOwner("stalled-process"), now())
        .await
        .unwrap();
    assert_eq!(n, 1);
    assert_eq!(token_books(&db).await, (300, 300, 0, 0));
    // The stalled process wakes and settles at the actual cost: the ledger agrees with it.
    let s = ledger::settle(&db, "stalled", 120, now())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        (s.charged, s.absorbed, s.token_remaining),
        (120, 0, Some(880))
    );
    assert_eq!(token_books(&db).await, (120, 120, 0, 0));
    // Once only.
    assert!(ledger::settle(&db, "stalled", 0, now())
        .await
        .unwrap()
        .is_none());
    assert_eq!(token_books(&db).await, (120, 120, 0, 0));
    db.close().await;
}

#[tokio::test]
async fn cached_statements_go_with_their_connection() {
    let (_dir, db, _owner) = setup(1).await;
    let mut keeper = Keeper::default();
    {
        let mut conn = db.sqlite().write.acquire().await.unwrap();
        let mut handle = conn.lock_handle().await.unwrap();
        let cache = keeper.attach(&mut handle);
        let mut stmts = cache.lock();
        let mut c = Conn::new(handle.as_raw_handle().as_ptr(), &mut stmts).unwrap();
        let n = c
            .query_row("SELECT COUNT(*) FROM tokens", &[], |r| r.int(0))
            .unwrap();
        assert_eq!(n, Some(Some(1)));
    }
    assert!(keeper.is_live());
    // Closing the connection finalizes our statements first (else SQLite refuses to close).
    // The write pool has exactly one connection: take that one out of the pool and close it
    // (closing the pool instead leaves the close to a background task that may never run
    // before the test ends).
    let conn = db.sqlite().write.acquire().await.unwrap();
    sqlx::Connection::close(conn.detach()).await.unwrap();
    for _ in 0..2000 {
        if !keeper.is_live() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    panic!("the statement cache outlived its connection");
}

/// What the gateway answers 503 for (`StoreError::is_unavailable`): the database out of
/// reach or busy, never a refusal of the operation itself.
#[test]
fn out_of_reach_is_told_from_a_refusal() {
    use super::StoreError;
    let busy = |code| StoreError::Sqlite {
        code,
        message: String::new(),
    };
    assert!(StoreError::Sql(sqlx::Error::PoolTimedOut).is_unavailable());
    assert!(StoreError::Batch("commit failed".into()).is_unavailable());
    assert!(StoreError::WriterGone.is_unavailable());
    assert!(busy(5).is_unavailable(), "SQLITE_BUSY");
    assert!(busy(517).is_unavailable(), "SQLITE_BUSY_SNAPSHOT");
    assert!(busy(6).is_unavailable(), "SQLITE_LOCKED");
    assert!(!busy(19).is_unavailable(), "a constraint is a refusal");
    assert!(!StoreError::NotFound("token 7".into()).is_unavailable());
    assert!(!StoreError::Conflict("taken".into()).is_unavailable());
}
