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
            let mut settling = Vec::new();
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
                            // A COMMIT cut by the stop: `CommitUnknown` (it may have
                            // landed; released below as the owner's sweep would).
                            matches!(
                                e,
                                StoreError::Sql(_)
                                    | StoreError::Batch(_)
                                    | StoreError::CommitUnknown(_)
                            ),
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
                // `quota::reservation`'s way: the settlement is retried in the background
                // until it lands, and the caller goes on (its next reservation meets the
                // outage).
                let (store, clock, pairs) = (store.clone(), clock.clone(), pairs.clone());
                settling.push(tokio::spawn(async move {
                    while store.settle(&id, R / 2, clock.clone()).await.is_err() {
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                    pairs.fetch_add(1, Ordering::Relaxed);
                }));
            }
            for s in settling {
                s.await.unwrap();
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
        matches!(
            probe,
            Err(StoreError::Sql(_) | StoreError::Batch(_) | StoreError::CommitUnknown(_))
        ),
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

/// The server's processes (the postmaster listening on `port` and its children).
fn server_pids(port: u16) -> Vec<i32> {
    let procs: Vec<(i32, i32, String)> = std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| {
            let pid: i32 = e.file_name().to_str()?.parse().ok()?;
            let cmd = std::fs::read_to_string(format!("/proc/{pid}/cmdline")).ok()?;
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            let ppid = stat[stat.rfind(')')? + 2..]
                .split(' ')
                .nth(1)?
                .parse()
                .ok()?;
            Some((pid, ppid, cmd))
        })
        .collect();
    let marker = format!("-p\0{port}\0");
    let Some(&(master, ..)) = procs
        .iter()
        .find(|(_, _, cmd)| cmd.contains("postgres") && cmd.contains(&marker))
    else {
        panic!("no postgres on port {port}");
    };
    let mut pids = vec![master];
    pids.extend(
        procs
            .iter()
            .filter(|(_, ppid, _)| *ppid == master)
            .map(|(p, ..)| *p),
    );
    pids
}

fn signal_all(pids: &[i32], sig: i32) {
    for &pid in pids {
        // SAFETY: kill(2) on processes this test started (its own server).
        unsafe {
            libc::kill(pid, sig);
        }
    }
}

/// A server that stops answering without closing its connections (a frozen host, a
/// partition): reservations fail with a store error within the writer's batch timeout
/// instead of hanging, and all is well once it answers again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_stops_answering_fails_reservations_instead_of_hanging() {
    let server = PgServer::start();
    let store = Store::open_pg(server.database()).await;
    let owner = pg_owner(
        pg(&store).0,
        &[budget(Some(100 * R)), budget(None), budget(None)],
    )
    .await;
    let clock = clock();
    store
        .reserve(&owner, "before", R, "p", clock.clone())
        .await
        .unwrap()
        .unwrap();
    let pids = server_pids(server.port);
    signal_all(&pids, libc::SIGSTOP);
    let started = Instant::now();
    let frozen = tokio::time::timeout(
        Duration::from_secs(60),
        store.reserve(&owner, "frozen", R, "p", clock.clone()),
    )
    .await;
    signal_all(&pids, libc::SIGCONT);
    match frozen {
        Ok(Err(StoreError::Batch(_) | StoreError::Sql(_))) => {}
        Ok(other) => panic!("not a store error: {other:?}"),
        Err(_) => panic!("the reservation hung for a minute"),
    }
    eprintln!("failed after {:?}", started.elapsed());
    // Once it answers again, reservations and settlements go through; the frozen one may
    // have landed (its COMMIT was never sent: it did not).
    let until = Instant::now() + Duration::from_secs(30);
    loop {
        match store.reserve(&owner, "after", R, "p", clock.clone()).await {
            Ok(Ok(_)) => break,
            Ok(Err(r)) => panic!("{r:?}"),
            Err(_) if Instant::now() < until => {
                tokio::time::sleep(Duration::from_millis(100)).await
            }
            Err(e) => panic!("never came back: {e}"),
        }
    }
    for id in ["before", "after"] {
        store.settle(id, R, clock.clone()).await.unwrap().unwrap();
    }
    assert!(store
        .settle("frozen", R, clock.clone())
        .await
        .unwrap()
        .is_none());
    store.assert_settled().await;
}

/// An admin transaction that locks a team and then its token (the opposite of the writer's
/// order) deadlocks with a batch reserving on that token: PostgreSQL aborts the batch (it
/// waited first, so it finds the cycle), and the writer runs it again — the caller never
/// sees the deadlock, and the reservation lands once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deadlock_with_an_admin_edit_is_retried_transparently() {
    use sqlx::Connection;
    let store = Arc::new(Store::postgres().await);
    let (db, writer) = pg(&store);
    let owner = pg_owner(
        db,
        &[budget(Some(100 * R)), budget(None), budget(Some(100 * R))],
    )
    .await;
    let clock = clock();
    // Settle the periods first, so the reservation below takes the one-statement path.
    store
        .reserve(&owner, "warm", R, "p", clock.clone())
        .await
        .unwrap()
        .unwrap();
    store
        .settle("warm", 0, clock.clone())
        .await
        .unwrap()
        .unwrap();
    let before = writer.stats();
    let mut admin = db.pool.acquire().await.unwrap();
    let mut tx = admin.begin().await.unwrap();
    // Only the batch looks for the cycle: the admin's own check waits longer than the test
    // (a loaded machine could otherwise run both checks at once and abort either).
    sqlx::query("SET LOCAL deadlock_timeout = '60s'")
        .execute(&mut *tx)
        .await
        .unwrap();
    sqlx::query("UPDATE teams SET name = name WHERE id = $1")
        .bind(owner.team_id)
        .execute(&mut *tx)
        .await
        .unwrap();
    let reserving = {
        let (store, owner, clock) = (store.clone(), owner.clone(), clock.clone());
        tokio::spawn(async move { store.reserve(&owner, "locked", R, "p", clock).await })
    };
    // Wait until the batch waits for the team row (it holds the token row by then).
    let until = Instant::now() + Duration::from_secs(30);
    loop {
        let waiting: i64 = sqlx::query_scalar(
            "SELECT COUNT(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'",
        )
        .fetch_one(&db.pool)
        .await
        .unwrap();
        if waiting > 0 {
            break;
        }
        assert!(
            Instant::now() < until,
            "the batch never waited for the team row"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Now close the cycle; the batch is aborted after its `deadlock_timeout` (1 s).
    let closed = sqlx::query("UPDATE tokens SET name = name WHERE id = $1")
        .bind(owner.token_id)
        .execute(&mut *tx)
        .await;
    match closed {
        Ok(_) => tx.commit().await.unwrap(),
        Err(e) => panic!("the admin transaction was the victim: {e}"),
    }
    let resv = reserving.await.unwrap().unwrap().unwrap();
    assert_eq!(resv.amount, R);
    let after = writer.stats();
    assert!(
        after.retries > before.retries,
        "the batch ran again after the deadlock"
    );
    assert_eq!(after.failed_batches, before.failed_batches);
    assert_eq!(
        store
            .int("SELECT COUNT(*) FROM ledger WHERE request_id = 'locked' AND kind = 'reserve'")
            .await,
        1
    );
    store
        .settle("locked", R, clock.clone())
        .await
        .unwrap()
        .unwrap();
    store.assert_settled().await;
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

/// The audit chain's advisory lock (`pg::audit::CHAIN_LOCK`).
const CHAIN_LOCK: i64 = 0x736c_7569_6365_0a01;

/// How long a gateway session waits for a lock (`pg::LOCK_TIMEOUT`).
const LOCK_TIMEOUT: Duration = Duration::from_secs(2);

/// A gateway session frozen between an audit append and its commit (a host paused or cut
/// off while it holds the chain's lock): reservations of the same team that roll a period
/// over fail alone within the lock timeout, the others answer, and no backend is left
/// queued on a lock holding its batch's budget rows (s30 multi-host attack F3). Before,
/// the rollover waited for the lock without end: every batch with one failed whole at
/// the writer's 10 s timeout, and its backend stayed queued on the lock with the team's
/// row locked. The server ends the frozen session (`idle_in_transaction_session_timeout`),
/// and the rollovers go through again without anyone touching it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_frozen_holding_the_chain_lock_stalls_nothing_past_the_lock_timeout() {
    let store = Arc::new(Store::postgres().await);
    let db = store.pg();
    // Eight tokens of one user and team: the even ones reset daily, the odd ones never.
    let first = pg_owner(
        db,
        &[
            budget_daily(1_000 * R),
            budget(Some(1_000_000 * R)),
            budget(Some(1_000_000 * R)),
        ],
    )
    .await;
    let mut owners = vec![first.clone()];
    for i in 1..8 {
        let token = if i % 2 == 0 {
            budget_daily(1_000 * R)
        } else {
            budget(Some(1_000 * R))
        };
        let o = pg_owner(db, &[token, budget(None), budget(None)]).await;
        owners.push(Owner {
            user_id: first.user_id,
            team_id: first.team_id,
            ..o
        });
    }
    let clock = Arc::new(ManualClock::new(at("2026-12-01T12:00:00Z")));
    for (i, owner) in owners.iter().enumerate() {
        let id = format!("warm{i}");
        store
            .reserve(owner, &id, R, "p", clock.clone())
            .await
            .unwrap()
            .unwrap();
        store.settle(&id, R, clock.clone()).await.unwrap().unwrap();
    }
    // A day later the daily tokens roll over (an audit row each); the others do not.
    clock.advance(chrono::Duration::days(1));
    let mut frozen = db.pool.acquire().await.unwrap().detach();
    sqlx::query("BEGIN").execute(&mut frozen).await.unwrap();
    sqlx::query("SELECT pg_advisory_xact_lock($1)")
        .bind(CHAIN_LOCK)
        .execute(&mut frozen)
        .await
        .unwrap();
    let froze = Instant::now();
    let mut tasks = Vec::new();
    for (i, owner) in owners.iter().enumerate() {
        let (store, owner, clock) = (store.clone(), owner.clone(), clock.clone());
        tasks.push(tokio::spawn(async move {
            let started = Instant::now();
            let id = format!("day2-{i}");
            let out = store.reserve(&owner, &id, R, "p", clock).await;
            (i % 2 == 0, id, started.elapsed(), out)
        }));
    }
    // A caller may wait for the batch before its own, which waited for the lock too; the
    // others of its batch do not wait again. Before: the writer's 10 s timeout.
    let bound = 2 * LOCK_TIMEOUT + Duration::from_secs(3);
    let mut held = Vec::new();
    for t in tasks {
        let (rolls, id, took, out) = t.await.unwrap();
        eprintln!("{id} (rollover: {rolls}) after {took:?}: {out:?}");
        assert!(took < bound, "{id} answered after {took:?}");
        match out {
            Ok(Ok(_)) if !rolls => held.push(id),
            Err(e) if rolls && e.is_unavailable() => {}
            other => panic!("{id} (rollover: {rolls}): {other:?}"),
        }
    }
    assert_eq!(held.len(), 4);
    let waiting: i64 = sqlx::query_scalar(
        "SELECT COUNT(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(waiting, 0, "backends left queued on a lock");
    // Nobody touches the frozen session: the server ends it, and the rollovers go through.
    let until = froze + Duration::from_secs(45);
    let mut i = 0;
    loop {
        let id = format!("after{i}");
        match store.reserve(&owners[0], &id, R, "p", clock.clone()).await {
            Ok(Ok(_)) => {
                held.push(id);
                break;
            }
            Err(e) if e.is_unavailable() && Instant::now() < until => {
                tokio::time::sleep(Duration::from_millis(500)).await
            }
            other => panic!("the rollover never went through: {other:?}"),
        }
        i += 1;
    }
    eprintln!("the frozen session was ended after {:?}", froze.elapsed());
    assert!(
        sqlx::query("SELECT 1").execute(&mut frozen).await.is_err(),
        "the frozen session is still open"
    );
    for id in held {
        store.settle(&id, R, clock.clone()).await.unwrap().unwrap();
    }
    store.assert_settled().await;
    let chain = pg::audit::verify(&db.pool, &db.audit).await.unwrap();
    assert_eq!(chain.broken, None);
}
