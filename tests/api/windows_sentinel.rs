//! Windows behind Redis Sentinel (issue 17, item 4): two gateway processes find the master
//! through three sentinels and keep one window between them, follow a failover (a killed
//! master: local windows meanwhile) and a deliberate move (`SENTINEL FAILOVER`), and sign in
//! to a master that requires a password.

use std::time::Duration;

use crate::gateway_fleet::*;
use crate::redis_topologies::*;

/// (d) Sentinel: two gateways find the master through three sentinels and admit exactly the
/// limit; the master is killed, the sentinels promote the replica, the gateways keep
/// answering meanwhile and then book in the new master, exact again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_failover_is_followed() {
    let mut rig = SentinelRig::start().await;
    let fleet = fleet(2, &rig.config()).await;
    let t = fleet.token("hal", 10).await;
    assert_eq!(fleet.burst(&t.text, 30).await, 10);
    let user = fleet.user_id(t.id).await;
    let key = token_rq_key(user, t.id);
    assert_eq!(
        cli(rig.master.port, &["ZCARD", &key]).await.unwrap().trim(),
        "10"
    );
    let wide = fleet.token("hal", 100_000).await;
    let wide_key = token_rq_key(user, wide.id);
    rig.master.kill();
    for i in 0..10 {
        assert!(
            fleet.one(i % 2, &wide.text).await,
            "served during the failover"
        );
    }
    let replica = rig.replica.port;
    let r = &rig;
    poll_until(
        Duration::from_secs(30),
        "the sentinels promote the replica",
        || async move { r.master_port().await == Some(replica) },
    )
    .await;
    for g in 0..2 {
        let (f, k, w) = (&fleet, &wide_key, &wide.text);
        let back = polled(Duration::from_secs(30), || async move {
            let count = |o: Option<String>| o.and_then(|o| o.trim().parse::<i64>().ok());
            let before = count(cli(replica, &["ZCARD", k]).await);
            f.one(g, w).await;
            before.is_some() && count(cli(replica, &["ZCARD", k]).await) == before.map(|b| b + 1)
        })
        .await;
        assert!(
            back,
            "gateway {g} books in the new master: {}",
            fleet.logs()
        );
    }
    let t2 = fleet.token("hal", 10).await;
    assert_eq!(fleet.burst(&t2.text, 30).await, 10);
    assert_eq!(
        cli(replica, &["ZCARD", &token_rq_key(user, t2.id)])
            .await
            .unwrap()
            .trim(),
        "10"
    );
    fleet.assert_no_panic();
}

/// Sentinel moves the master on purpose (`SENTINEL FAILOVER`): the old master lives on and
/// accepts writes until the sentinels reconfigure it (up to 10 s later), then refuses them
/// (`READONLY`). The gateways notice the move from the sentinels within about a second and
/// book in the new master, never again in the old one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_demoted_master_is_left_for_the_new_one() {
    let rig = SentinelRig::start().await;
    let fleet = fleet(2, &rig.config()).await;
    let wide = fleet.token("ivy", 100_000).await;
    let key = token_rq_key(fleet.user_id(wide.id).await, wide.id);
    assert!(fleet.one(0, &wide.text).await && fleet.one(1, &wide.text).await);
    let (old, new) = (rig.master.port, rig.replica.port);
    assert_eq!(cli(old, &["ZCARD", &key]).await.unwrap().trim(), "2");
    cli(
        rig.sentinels[0].port,
        &["SENTINEL", "FAILOVER", MASTER_NAME],
    )
    .await
    .unwrap();
    let r = &rig;
    poll_until(
        Duration::from_secs(30),
        "the sentinels promote the replica",
        || async move { r.master_port().await == Some(new) },
    )
    .await;
    for g in 0..2 {
        let (f, k, w) = (&fleet, &key, &wide.text);
        let back = polled(Duration::from_secs(30), || async move {
            let count = |o: Option<String>| o.and_then(|o| o.trim().parse::<i64>().ok());
            let before = count(cli(new, &["ZCARD", k]).await);
            assert!(f.one(g, w).await);
            before.is_some() && count(cli(new, &["ZCARD", k]).await) == before.map(|b| b + 1)
        })
        .await;
        assert!(
            back,
            "gateway {g} books in the new master: {}",
            fleet.logs()
        );
    }
    let t = fleet.token("ivy", 10).await;
    assert_eq!(fleet.burst(&t.text, 30).await, 10);
    fleet.assert_no_panic();
}

/// The master and its replica require a password (`master_password`): the gateways find the
/// master through the sentinels, sign in and keep one window between them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sentinel_master_with_a_password() {
    let rig = SentinelRig::start_with(Some("s3cret-master-pass")).await;
    let fleet = fleet(2, &rig.config()).await;
    let t = fleet.token("jo", 10).await;
    assert_eq!(fleet.burst(&t.text, 30).await, 10);
    let key = token_rq_key(fleet.user_id(t.id).await, t.id);
    assert_eq!(
        rig.node_cli(rig.master.port, &["ZCARD", &key])
            .await
            .unwrap()
            .trim(),
        "10"
    );
    let logs = fleet.logs();
    assert!(
        !logs.contains("s3cret"),
        "the password is never logged: {logs}"
    );
    fleet.assert_no_panic();
}
