//! Liveness on PostgreSQL (CHECKS Q14, issue 17): a process is gone only when its heartbeat
//! is stale by the database's clock AND no session holds its liveness lock
//! (`store::pg::processes`). A paused host keeps its lock's session, so it keeps its
//! reservations however stale its heartbeat; a process whose session ended is gone once its
//! heartbeat is stale; a lock session ended by the server is taken again.

use std::sync::Arc;
use std::time::{Duration, Instant};

use sluice::clock::{Clock, ManualClock};
use sluice::store::ledger::Orphans;
use sluice::store::pg::processes::liveness_session;
use sluice::store::processes::{self, Me};

use crate::helpers::Budget;
use crate::pg_money::Store;

const R: i64 = 1_000;

/// A $10 token budget, the user's and the team's unlimited.
pub(crate) fn budgets() -> [Budget; 3] {
    [
        Budget {
            limit: Some(10 * R),
            reset: "never",
        },
        Budget {
            limit: None,
            reset: "never",
        },
        Budget {
            limit: None,
            reset: "never",
        },
    ]
}

/// Polls `f` until it holds, for at most 30 s (a loaded machine: the server notices a
/// closed session at its own pace).
async fn until<F, Fut>(what: &str, mut f: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let bound = Instant::now() + Duration::from_secs(30);
    while !f().await {
        assert!(Instant::now() < bound, "never: {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Two processes with an open reservation each and a heartbeat an hour stale: the one whose
/// lock session lives (a paused host) is not gone and keeps its row; the one whose session
/// ended (a killed host) is gone, its reservation settled as an orphan, its row pruned.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_heartbeat_is_gone_only_once_its_lock_session_ended() {
    let store = Store::postgres().await;
    let survivor = store.another().await;
    let owner = store.owner(&budgets()).await;
    let clock: Arc<dyn Clock> = Arc::new(ManualClock::new(chrono::Utc::now()));
    let now = clock.now();
    let paused = Me::new("paused".into(), "host-a".into());
    let killed = Me::new("killed".into(), "host-b".into());
    let alive = Me::new("alive".into(), "host-c".into());
    for me in [&paused, &killed, &alive] {
        assert!(store.heartbeat(me, now).await);
    }
    let paused_lock = processes::hold_liveness(&store.db, &paused).await.unwrap();
    let killed_lock = processes::hold_liveness(&store.db, &killed).await.unwrap();
    for (i, me) in [&paused, &killed].iter().enumerate() {
        store
            .reserve(&owner, &format!("r{i}"), R, &me.id, clock.clone())
            .await
            .unwrap()
            .unwrap();
    }
    store.age_heartbeat("paused", 3600.0).await;
    store.age_heartbeat("killed", 3600.0).await;
    assert_eq!(
        survivor.dead_owners(&alive, now).await,
        Vec::<String>::new(),
        "a stale heartbeat whose lock is held is not gone"
    );
    drop(killed_lock);
    let pg = store.db.postgres().unwrap();
    until("the killed process's lock freed", || async {
        liveness_session(pg, "killed").await.unwrap().is_none()
    })
    .await;
    assert_eq!(survivor.dead_owners(&alive, now).await, ["killed"]);
    assert_eq!(
        survivor
            .settle_orphans(Orphans::OfOwner("killed"), now)
            .await,
        1
    );
    // The paused process's reservation is settled by itself later; then both rows are
    // stale and hold nothing, and only the one whose lock is free is pruned.
    assert!(store.release("r0", clock.clone()).await.is_some());
    processes::prune(&survivor.db, &alive, now).await.unwrap();
    let mut left: Vec<String> = sqlx::query_scalar("SELECT id FROM processes")
        .fetch_all(&pg.pool)
        .await
        .unwrap();
    left.sort();
    assert_eq!(left, ["alive", "paused"]);
    assert_eq!(
        store
            .int("SELECT COUNT(*) FROM ledger WHERE kind = 'orphan'")
            .await,
        1
    );
    drop(paused_lock);
    store.assert_settled().await;
}

/// The lock's session ended by the server (`pg_terminate_backend`): the process takes its
/// lock again on a new session; meanwhile its heartbeat is fresh, so it is not gone; once
/// the lock is back, a stale heartbeat does not make it gone either.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_terminated_lock_session_is_taken_again() {
    let store = Store::postgres().await;
    let survivor = store.another().await;
    let owner = store.owner(&budgets()).await;
    let clock: Arc<dyn Clock> = Arc::new(ManualClock::new(chrono::Utc::now()));
    let now = clock.now();
    let me = Me::new("me".into(), "host-a".into());
    let alive = Me::new("alive".into(), "host-b".into());
    assert!(store.heartbeat(&me, now).await);
    assert!(survivor.heartbeat(&alive, now).await);
    let _lock = processes::hold_liveness(&store.db, &me).await.unwrap();
    store
        .reserve(&owner, "r0", R, "me", clock.clone())
        .await
        .unwrap()
        .unwrap();
    let pg = store.db.postgres().unwrap();
    let first = liveness_session(pg, "me")
        .await
        .unwrap()
        .expect("lock held");
    let ended: bool = sqlx::query_scalar("SELECT pg_terminate_backend($1)")
        .bind(first)
        .fetch_one(&pg.pool)
        .await
        .unwrap();
    assert!(ended);
    assert_eq!(
        survivor.dead_owners(&alive, now).await,
        Vec::<String>::new(),
        "a fresh heartbeat is alive without its lock"
    );
    until("the lock taken again on a new session", || async {
        liveness_session(pg, "me")
            .await
            .unwrap()
            .is_some_and(|pid| pid != first)
    })
    .await;
    store.age_heartbeat("me", 3600.0).await;
    assert_eq!(
        survivor.dead_owners(&alive, now).await,
        Vec::<String>::new(),
        "the lock taken again keeps a stale process alive"
    );
    assert_eq!(store.int("SELECT COUNT(*) FROM reservations").await, 1);
    assert!(store.release("r0", clock.clone()).await.is_some());
    store.assert_settled().await;
}

/// PostgreSQL restarted (an outage): every lock session ended with it and no host could
/// beat meanwhile, so every heartbeat may be stale the moment it is back. A host must not
/// be taken for gone before it could beat and take its lock again: nobody is gone until the
/// server has been up for `STALE_AFTER`; then a host that still has not beaten is. (Failed
/// before a beat counted as no older than `pg_postmaster_start_time()`: the first host
/// back took the others for gone.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_server_takes_no_host_for_gone_before_it_could_beat() {
    let server = Arc::new(crate::pg_server::PgServer::start());
    let store = Store::open_pg(server.database()).await;
    let survivor = store.another().await;
    let owner = store.owner(&budgets()).await;
    let clock: Arc<dyn Clock> = Arc::new(ManualClock::new(chrono::Utc::now()));
    let now = clock.now();
    let host = Me::new("host".into(), "host-a".into());
    let alive = Me::new("alive".into(), "host-b".into());
    assert!(store.heartbeat(&host, now).await);
    store
        .reserve(&owner, "r0", R, "host", clock.clone())
        .await
        .unwrap()
        .unwrap();
    let s = server.clone();
    tokio::task::spawn_blocking(move || {
        s.stop();
        s.run();
    })
    .await
    .unwrap();
    // As if the outage had lasted a minute; the host has not beaten since it is back.
    store.age_heartbeat("host", 60.0).await;
    survivor.heartbeat(&alive, now).await;
    assert_eq!(
        survivor.dead_owners(&alive, now).await,
        Vec::<String>::new(),
        "a host taken for gone before it could beat after the database came back"
    );
    until(
        "the silent host gone once the server is up for the window",
        || async { survivor.dead_owners(&alive, now).await == ["host"] },
    )
    .await;
}

/// PostgreSQL reinitialized after one backend crashed (`kill -9` of a backend, the OOM
/// killer, a segfault): the postmaster ends every session — every liveness lock with it —
/// runs crash recovery and accepts connections again, but it did not start again, so
/// `pg_postmaster_start_time()` has not moved and the heartbeat rule alone says a host that
/// could not beat during a recovery longer than the stale window (a minute here) is gone.
/// The watcher's own lock session ended too: a host takes nobody for gone until it has held
/// its lock again for the window (`processes::may_judge`), by which time every live host
/// has beaten and taken its own. The same holds for a standby promoted after a failover
/// (its postmaster started long before the promotion). Before, the first host back took
/// every other live host for gone and settled their open reservations as orphans.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_reinitialized_after_a_backend_crash_takes_no_host_for_gone_before_it_could_beat()
{
    let server = Arc::new(crate::pg_server::PgServer::start());
    let url = server.database();
    let dbname = url.rsplit('/').next().unwrap().to_string();
    let store = Store::open_pg(url).await;
    let survivor = store.another().await;
    let owner = store.owner(&budgets()).await;
    let clock: Arc<dyn Clock> = Arc::new(ManualClock::new(chrono::Utc::now()));
    let now = clock.now();
    let host = Me::new("host".into(), "host-a".into());
    let alive = Me::new("alive".into(), "host-b".into());
    let _watching = processes::hold_liveness(&survivor.db, &alive)
        .await
        .unwrap();
    assert!(
        !processes::may_judge(&survivor.db, &alive).await.unwrap(),
        "a host that has just taken its lock judges nobody"
    );
    // A server (and a watcher) up for a while: neither start is a grace any more.
    let s = server.clone();
    tokio::task::spawn_blocking(move || s.wait_past_the_stale_window())
        .await
        .unwrap();
    until("the watcher's lock held for the window", || async {
        processes::may_judge(&survivor.db, &alive).await.unwrap()
    })
    .await;
    assert!(store.heartbeat(&host, now).await);
    store
        .reserve(&owner, "r0", R, "host", clock.clone())
        .await
        .unwrap()
        .unwrap();
    // One backend dies by SIGKILL: the postmaster ends every session and reinitializes.
    let psql = |sql: &str| {
        std::process::Command::new("psql")
            .args(["-h", "127.0.0.1", "-p", &server.port.to_string()])
            .args(["-U", "postgres", "-d", &dbname, "-tAc", sql])
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
    };
    // On disk first (the test server commits asynchronously: a crash may lose the last commits).
    psql("CHECKPOINT").unwrap();
    let started = psql("SELECT pg_postmaster_start_time()").unwrap();
    let victim: i32 = psql(
        "SELECT pid FROM pg_stat_activity WHERE backend_type = 'client backend' AND pid <> pg_backend_pid() LIMIT 1",
    )
    .unwrap()
    .parse()
    .unwrap();
    // SAFETY: plain kill(2) on a backend of this test's own server.
    unsafe {
        libc::kill(victim, libc::SIGKILL);
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let bound = Instant::now() + Duration::from_secs(60);
    let back = loop {
        if let Some(t) = psql("SELECT pg_postmaster_start_time()") {
            break t;
        }
        assert!(Instant::now() < bound, "the server never came back");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(back, started, "a crash-restart, not a new postmaster");
    // As if recovery had lasted a minute; the host has not beaten since it is back.
    until("the store's pool back", || async {
        processes::heartbeat(&survivor.db, &alive, now)
            .await
            .is_ok()
    })
    .await;
    store.age_heartbeat("host", 60.0).await;
    assert_eq!(
        psql("SELECT owner FROM reservations").as_deref(),
        Some("host"),
        "the open reservation outlived the crash"
    );
    assert_eq!(
        survivor.dead_owners(&alive, now).await,
        ["host"],
        "by its heartbeat alone the host looks gone"
    );
    let pg = survivor.db.postgres().unwrap();
    until("the watcher's lock taken again", || async {
        liveness_session(pg, "alive").await.unwrap().is_some()
    })
    .await;
    assert!(
        !processes::may_judge(&survivor.db, &alive).await.unwrap(),
        "a host taken for gone before it could beat after the database came back"
    );
}

/// s25 attack multi-host #2: host A's batch commits a reservation but the answer to its
/// COMMIT never comes (held by the link until the writer gives up): the request gets an
/// error (a 503) and reaches no upstream. Host A then looks gone (its heartbeat stale, no
/// lock), and host B settles its rows as orphans at their full amount before A's sweep
/// runs. A's sweep corrects the one it knows it answered with an error to 0; the row of a
/// previous incarnation of A (a crash, whose request may have reached an upstream) keeps
/// its orphan charge. Before, A's sweep saw nothing of its own open and the failed request
/// stayed charged R.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reservation_whose_owner_saw_an_error_is_not_charged_after_it_was_orphaned() {
    use sluice::clock::SystemClock;
    use sluice::quota::reservation::Quota;
    use sluice::quota::QuotaError;
    use sluice::store::StoreError;

    let url = crate::pg_server::database();
    let link = crate::pg_round_trips::Link::start(&url).await;
    let b = Store::open_pg(url).await;
    let a = Store::open_pg(link.url.clone()).await;
    let owner = b.owner(&budgets()).await;
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let quota = Quota::with_writer(a.writer.clone(), clock.clone(), "host-a".into());
    let (host_a, host_b) = (
        Me::new("host-a".into(), "a".into()),
        Me::new("host-b".into(), "b".into()),
    );
    assert!(b.heartbeat(&host_a, clock.now()).await);
    b.reserve(&owner, "before-crash", R, "host-a", clock.clone())
        .await
        .unwrap()
        .unwrap();

    link.hold_next_commit();
    match quota.reserve("cut", &owner, R).await {
        Err(QuotaError::Store(e)) => assert!(
            matches!(e, StoreError::CommitUnknown(_)) && e.is_unavailable(),
            "{e}"
        ),
        Err(e) => panic!("refused instead of failing: {e}"),
        Ok(_) => panic!("the COMMIT's answer was held, yet the reservation was answered"),
    }
    link.hold(false);
    let rows = |id: &str| format!("SELECT COUNT(*) FROM reservations WHERE request_id = '{id}'");
    assert_eq!(b.int(&rows("cut")).await, 1, "the COMMIT landed");

    b.age_heartbeat("host-a", 20.0).await;
    assert_eq!(b.dead_owners(&host_b, clock.now()).await, ["host-a"]);
    assert_eq!(
        b.settle_orphans(Orphans::OfOwner("host-a"), clock.now())
            .await,
        2
    );
    sluice::ops::housekeeping::sweep_own(&quota, &a.db, clock.now())
        .await
        .unwrap();
    let charged = |id: &str| {
        format!("SELECT COALESCE(SUM(amount_micros), 0) FROM ledger WHERE request_id = '{id}'")
    };
    assert_eq!(
        b.int(&charged("cut")).await,
        0,
        "a request answered with an error stayed charged as an orphan"
    );
    assert_eq!(
        b.int(&charged("before-crash")).await,
        R,
        "a previous incarnation's orphan keeps its charge"
    );
    assert_eq!(b.level("tokens", owner.token_id).await, (10 * R, 9 * R, 0));
    assert_eq!(
        b.int("SELECT COUNT(*) FROM orphaned WHERE request_id = 'cut'")
            .await,
        0
    );
    b.assert_settled().await;
}
