//! The money path's PostgreSQL-only properties (issue 17 item 2): group commit batches,
//! two hosts' batches never deadlock, one failing job fails alone, and the path fails
//! closed while the server is down and recovers after it.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use sluice::clock::{Clock, ManualClock};
use sluice::store::ledger::Owner;
use sluice::store::pg::{self, PgDb};
use sluice::store::writer::Writer;
use sluice::store::StoreError;

use crate::helpers::Budget;
use crate::pg_money::{at, pg_owner, Store};
use crate::pg_server::PgServer;

const R: i64 = 1_000;

fn budget(limit: Option<i64>) -> Budget {
    Budget {
        limit,
        reset: "never",
    }
}

fn budget_daily(limit: i64) -> Budget {
    Budget {
        limit: Some(limit),
        reset: "daily",
    }
}

fn clock() -> Arc<dyn Clock> {
    Arc::new(ManualClock::new(at("2026-12-01T12:00:00Z")))
}

fn pg(store: &Store) -> (&PgDb, &Writer) {
    (store.pg(), &store.writer)
}

/// 64 reservations and their settlements at once: far fewer transactions (batches) than
/// jobs. One
/// job that fails (a request id used twice) fails alone; its batch-mates commit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn group_commit_puts_many_jobs_in_one_transaction_and_a_failing_job_fails_alone() {
    let store = Arc::new(Store::postgres().await);
    let (db, writer) = pg(&store);
    let owner = pg_owner(db, &[budget(Some(1_000 * R)), budget(None), budget(None)]).await;
    let clock = clock();
    let before = writer.stats();
    let mut tasks = Vec::new();
    for i in 0..64 {
        let (store, owner, clock) = (store.clone(), owner.clone(), clock.clone());
        // Two callers use the request id `dup`: one reservation, one unique violation.
        let id = if i < 2 {
            "dup".to_string()
        } else {
            format!("g{i}")
        };
        tasks.push(tokio::spawn(async move {
            store.reserve(&owner, &id, R, "p", clock).await
        }));
    }
    let mut ok = 0;
    let mut failed = 0;
    for t in tasks {
        match t.await.unwrap() {
            Ok(Ok(_)) => ok += 1,
            Err(StoreError::Sql(_)) => failed += 1,
            other => panic!("{other:?}"),
        }
    }
    assert_eq!((ok, failed), (63, 1));
    let after = writer.stats();
    let batches = after.batches - before.batches;
    assert_eq!(after.jobs - before.jobs, 64);
    assert!(
        batches <= 16,
        "64 concurrent reservations took {batches} batches"
    );
    assert_eq!(
        after.failed_batches, before.failed_batches,
        "no batch failed whole"
    );
    let before = writer.stats();
    let mut tasks = Vec::new();
    for i in 0..64 {
        let (store, clock) = (store.clone(), clock.clone());
        let id = if i < 2 {
            "dup".to_string()
        } else {
            format!("g{i}")
        };
        tasks.push(tokio::spawn(async move {
            store.settle(&id, R / 2, clock).await
        }));
    }
    let mut settled = 0;
    for t in tasks {
        if t.await.unwrap().unwrap().is_some() {
            settled += 1;
        }
    }
    assert_eq!(
        settled, 63,
        "the second settlement of `dup` finds it settled"
    );
    // The writer's own count (the server's `xact_commit` counts every query of the pool
    // too, and is flushed by each backend only once a second).
    let after = writer.stats();
    let batches = after.batches - before.batches;
    assert!(
        batches <= 16,
        "64 concurrent settlements took {batches} batches"
    );
    assert_eq!(after.retries, before.retries);
    store.assert_settled().await;
}

/// Owners sharing one user and one team: every job of every batch locks the same user
/// and team rows, and tokens in whatever order the callers arrive.
async fn shared_owners(db: &PgDb, n: usize) -> Vec<Owner> {
    let first = pg_owner(
        db,
        &[
            budget(None),
            budget(Some(1_000_000 * R)),
            budget(Some(1_000_000 * R)),
        ],
    )
    .await;
    let mut owners = vec![first.clone()];
    for _ in 1..n {
        let o = pg_owner(
            db,
            &[budget(Some(1_000_000 * R)), budget(None), budget(None)],
        )
        .await;
        owners.push(Owner {
            user_id: first.user_id,
            team_id: first.team_id,
            ..o
        });
    }
    owners
}

/// Two hosts (two pools, two writers) reserving and settling on eight tokens of one team
/// in opposite orders: their batches lock the rows in one global order, so none deadlocks
/// (no batch ran again) and every pair lands.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hosts_batches_never_deadlock() {
    let a = Arc::new(Store::postgres().await);
    let b = Arc::new(a.another().await);
    let owners = Arc::new(shared_owners(pg(&a).0, 8).await);
    let clock = clock();
    let mut tasks = Vec::new();
    for caller in 0..32usize {
        let (host, owners, clock) = (
            if caller % 2 == 0 {
                a.clone()
            } else {
                b.clone()
            },
            owners.clone(),
            clock.clone(),
        );
        tasks.push(tokio::spawn(async move {
            for k in 0..12usize {
                // Host a walks the tokens upwards, host b downwards.
                let t = if caller % 2 == 0 {
                    (caller + k) % 8
                } else {
                    7 - (caller + k) % 8
                };
                let id = format!("c{caller}-{k}");
                host.reserve(
                    &owners[t],
                    &id,
                    R,
                    if caller % 2 == 0 { "a" } else { "b" },
                    clock.clone(),
                )
                .await
                .unwrap()
                .unwrap();
                host.settle(&id, R / 4, clock.clone())
                    .await
                    .unwrap()
                    .unwrap();
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let (sa, sb) = (pg(&a).1.stats(), pg(&b).1.stats());
    assert_eq!(
        (sa.retries, sb.retries),
        (0, 0),
        "a batch met a deadlock or serialization failure"
    );
    assert_eq!((sa.failed_batches, sb.failed_batches), (0, 0));
    assert_eq!(
        a.int("SELECT CAST(SUM(amount_micros) AS BIGINT) FROM ledger WHERE kind IN ('reserve', 'settle')").await,
        32 * 12 * R / 4
    );
    a.assert_settled().await;
}

/// PostgreSQL stops under load and comes back: meanwhile every reservation fails with a
/// store error (nothing admitted without a committed reservation) within the connect
/// timeout; settlements of reservations held across the outage are retried and land after
/// it; nothing is half-written and the invariant holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_stopped_mid_load_fails_closed_and_everything_lands_after() {
    let server = PgServer::start();
    let store = Arc::new(Store::open_pg(server.database()).await);
    let owner = pg_owner(
        pg(&store).0,
        &[
            budget(Some(1_000_000 * R)),
            budget(None),
            budget(Some(1_000_000 * R)),
        ],
    )
    .await;
    let clock = clock();
    let stop = Arc::new(AtomicBool::new(false));
    let pairs = Arc::new(AtomicUsize::new(0));
    let refused = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for caller in 0..8 {
        let (store, owner, clock, stop, pairs, refused) = (
            store.clone(),
            owner.clone(),
            clock.clone(),
            stop.clone(),
            pairs.clone(),
            refused.clone(),
        );
        tasks.push(tokio::spawn(async move {
            let mut admitted = Vec::new();
            let mut k = 0;
            while !stop.load(Ordering::Relaxed) {
                k += 1;
                let id = format!("l{caller}-{k}");
                let started = Instant::now();
                match store.reserve(&owner, &id, R, "p", clock.clone()).await {
                    Ok(Ok(_)) => admitted.push(id.clone()),
                    Ok(Err(r)) => panic!("refused: {r:?}"),
                    Err(e) => {
                        assert!(
                            matches!(e, StoreError::Sql(_) | StoreError::Batch(_)),
                            "not a store error: {e:?}"
                        );
                        assert!(
                            started.elapsed() < Duration::from_secs(30),
                            "failing took {:?}",
                            started.elapsed()
                        );
                        refused.fetch_add(1, Ordering::Relaxed);
                        tokio::time::sleep(Duration::from_millis(20)).await;
                        continue;
                    }
                }
                // Held across a little work, so some settlements meet the outage.
                tokio::time::sleep(Duration::from_millis(5)).await;
                // `quota::reservation`'s loop: a settlement is retried until it lands.
                loop {
                    match store.settle(&id, R / 2, clock.clone()).await {
                        Ok(_) => break,
                        Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
                    }
                }
                pairs.fetch_add(1, Ordering::Relaxed);
            }
            admitted
        }));
    }
    let wait_for = |what: &'static str, done: Box<dyn Fn() -> bool>| async move {
        let until = Instant::now() + Duration::from_secs(60);
        while !done() {
            assert!(Instant::now() < until, "timed out waiting for {what}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    let p = pairs.clone();
    wait_for(
        "pairs before the outage",
        Box::new(move || p.load(Ordering::Relaxed) >= 50),
    )
    .await;
    server.stop();
    // A reservation of the test's own, so the check does not depend on a caller being
    // between its settlement and its next reservation when the server stopped (all eight
    // may be in their settlement loops then: this waited for 8 refusals and timed out).
    let started = Instant::now();
    let probe = store
        .reserve(&owner, "probe-during-outage", R, "p", clock.clone())
        .await;
    assert!(
        matches!(probe, Err(StoreError::Sql(_) | StoreError::Batch(_))),
        "a reservation while PostgreSQL is down: {probe:?}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "failing took {:?}",
        started.elapsed()
    );
    let during = pairs.load(Ordering::Relaxed);
    server.run();
    let p = pairs.clone();
    wait_for(
        "pairs after the outage",
        Box::new(move || p.load(Ordering::Relaxed) >= during + 50),
    )
    .await;
    stop.store(true, Ordering::Relaxed);
    let mut admitted = HashSet::new();
    for t in tasks {
        admitted.extend(t.await.unwrap());
    }
    // A reservation whose COMMIT was cut may have landed without its caller knowing: the
    // owner's sweep releases what no live request holds (`ops::housekeeping`).
    let (db, writer) = pg(&store);
    let mut released = 0;
    for (id, _) in pg::ledger::own_reservations(db, "p").await.unwrap() {
        assert!(!admitted.contains(&id), "{id} was settled by its caller");
        sluice::store::ledger::release_via(writer, id.into(), clock.clone())
            .await
            .unwrap();
        released += 1;
    }
    let reserves = store
        .int("SELECT COUNT(*) FROM ledger WHERE kind = 'reserve'")
        .await as usize;
    assert_eq!(
        reserves,
        admitted.len() + released,
        "every reservation row is an admitted or a released one"
    );
    for id in &admitted {
        assert_eq!(
            store.int(&format!("SELECT COUNT(*) FROM ledger WHERE request_id = '{id}' AND kind IN ('reserve', 'settle')")).await,
            2,
            "{id}: reserved and settled once"
        );
    }
    store.assert_settled().await;
    assert_eq!(
        store
            .int(&format!(
                "SELECT {} - remaining_micros FROM tokens WHERE id = {}",
                1_000_000 * R,
                owner.token_id
            ))
            .await,
        admitted.len() as i64 * R / 2
    );
}

/// The money path's audit rows (a period rollover) and the admins' share one chain: both
/// append through `pg::audit::append` under one advisory lock. The money path had an
/// append of its own (`pg::chain`) under another lock, so a rollover and an admin action
/// committing at once could both link to the same previous row (a fork `audit verify`
/// reports as broken).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rollovers_and_admin_actions_appending_at_once_keep_one_chain() {
    let store = Arc::new(Store::postgres().await);
    let clock = Arc::new(ManualClock::new(at("2026-12-01T12:00:00Z")));
    let mut owners = Vec::new();
    for _ in 0..8 {
        owners.push(
            pg_owner(
                store.pg(),
                &[budget_daily(1_000 * R), budget(None), budget(None)],
            )
            .await,
        );
    }
    let admin = {
        let store = store.clone();
        tokio::spawn(async move {
            let pg = store.pg();
            for i in 0..200 {
                let target = format!("user:{i}");
                let entry = sluice::store::audit::AuditEntry {
                    actor: "admin",
                    address: "127.0.0.1",
                    action: "user.update",
                    target: &target,
                    before: None,
                    after: Some("x"),
                };
                pg::audit::record(&pg.pool, &pg.audit, &entry, chrono::Utc::now())
                    .await
                    .unwrap();
            }
        })
    };
    // Every day every token rolls over (one audit row each), while the admin appends.
    for day in 0..10 {
        let mut tasks = Vec::new();
        for (i, owner) in owners.iter().enumerate() {
            let (store, owner, clock) = (store.clone(), owner.clone(), clock.clone());
            tasks.push(tokio::spawn(async move {
                let id = format!("d{day}-{i}");
                store
                    .reserve(&owner, &id, R, "p", clock.clone())
                    .await
                    .unwrap()
                    .unwrap();
                store.settle(&id, R, clock).await.unwrap();
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
        clock.advance(chrono::Duration::days(1));
    }
    admin.await.unwrap();
    let chain = pg::audit::verify(&store.pg().pool, &store.pg().audit)
        .await
        .unwrap();
    assert_eq!(chain.broken, None, "the chain forked");
    assert!(chain.rows >= 200 + 8 * 9, "{} rows", chain.rows);
    store.assert_settled().await;
}
