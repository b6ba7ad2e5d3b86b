//! Hosts whose clocks disagree on one PostgreSQL database (issue 17): liveness is judged by
//! the database's clock, so a host whose clock runs ahead does not take every other live
//! host for dead and settle their live reservations as orphans; a host that really stopped
//! beating is still found gone.

use std::sync::Arc;

use chrono::{Duration, Utc};
use sluice::clock::{Clock, ManualClock};
use sluice::store::ledger::{self, Orphans};
use sluice::store::processes::{self, Me};

use crate::helpers::Budget;
use crate::pg_money::Store;

const R: i64 = 1_000;

/// What a host's orphan recovery does (`ops::housekeeping::recover_orphans`), at its clock.
async fn recover(store: &Store, me: &Me, now: chrono::DateTime<Utc>) -> u64 {
    let mut settled = 0;
    for owner in processes::dead_owners(&store.db, me, now).await.unwrap() {
        settled += ledger::settle_orphans(&store.db, Orphans::OfOwner(&owner), now)
            .await
            .unwrap();
    }
    settled
        + ledger::settle_orphans(&store.db, Orphans::LeaseExpired, now)
            .await
            .unwrap()
}

/// Host A (true clock) beats and holds three live reservations; host B's clock runs a
/// minute — then a day — ahead: B beats and recovers orphans, and settles none of A's.
/// Host C, which beat once and then stopped, is found gone once its beat is older than the
/// stale window by the database's clock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_whose_clock_runs_ahead_does_not_orphan_live_reservations() {
    let a = Store::postgres().await;
    let b = a.another().await;
    let owner = a
        .owner(&[
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
        ])
        .await;
    let host_a = Me::new("host-a".into(), "a".into());
    let host_b = Me::new("host-b".into(), "b".into());
    let clock_a: Arc<dyn Clock> = Arc::new(ManualClock::new(Utc::now()));
    assert!(processes::heartbeat(&a.db, &host_a, clock_a.now())
        .await
        .unwrap());
    for i in 0..3 {
        a.reserve(&owner, &format!("live-{i}"), R, "host-a", clock_a.clone())
            .await
            .unwrap()
            .unwrap();
    }
    for ahead in [Duration::seconds(60), Duration::days(1)] {
        let now_b = Utc::now() + ahead;
        processes::heartbeat(&b.db, &host_b, now_b).await.unwrap();
        assert_eq!(
            processes::dead_owners(&b.db, &host_b, now_b).await.unwrap(),
            Vec::<String>::new(),
            "a host {ahead} ahead took a live host for dead"
        );
        assert_eq!(recover(&b, &host_b, now_b).await, 0, "{ahead} ahead");
    }
    assert_eq!(
        a.level("tokens", owner.token_id).await,
        (10 * R, 7 * R, 3 * R)
    );
    for i in 0..3 {
        a.settle(&format!("live-{i}"), R / 2, clock_a.clone())
            .await
            .unwrap()
            .unwrap();
    }
    assert_eq!(
        a.level("tokens", owner.token_id).await,
        (10 * R, 10 * R - 3 * R / 2, 0),
        "charged what was served, nothing as an orphan"
    );
    a.assert_settled().await;

    // A host that stopped beating is still found gone — once its beat is older than the
    // stale window by the database's clock, whatever the others' clocks say — and its
    // reservation is settled as an orphan.
    let host_c = Me::new("host-c".into(), "c".into());
    processes::heartbeat(&a.db, &host_c, clock_a.now())
        .await
        .unwrap();
    a.reserve(&owner, "held-by-c", R, "host-c", clock_a.clone())
        .await
        .unwrap()
        .unwrap();
    let behind = Utc::now() - Duration::days(1);
    assert_eq!(recover(&b, &host_b, behind).await, 0, "c beat just now");
    a.age_heartbeat("host-c", 16.0).await;
    assert_eq!(
        processes::dead_owners(&b.db, &host_b, behind)
            .await
            .unwrap(),
        ["host-c"],
        "a host silent past the stale window, seen by a host a day behind"
    );
    assert_eq!(recover(&b, &host_b, behind).await, 1);
    a.assert_settled().await;
}
