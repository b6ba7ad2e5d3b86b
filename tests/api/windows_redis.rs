//! The Redis window scripts themselves, against a real `redis-server`: token windows booked
//! and corrected (`window.lua`, `correct.lua`), `Retry-After` that lasts until enough has
//! left the window, and one request's keys on a Redis Cluster node.

use std::time::Duration;

use sluice::ratelimit::redis_window::RedisWindows;
use sluice::ratelimit::WindowSpec;

use crate::helpers::*;

const TIMEOUT: Duration = Duration::from_millis(500);

fn token_and_user(requests: u64, tokens: u64) -> [WindowSpec; 2] {
    [
        WindowSpec::token(7, 12, requests, tokens),
        WindowSpec::user(7, requests, tokens),
    ]
}

fn now_ms() -> i64 {
    chrono::Utc::now().timestamp_millis()
}

/// A one-node Redis Cluster owning every slot: it refuses (CROSSSLOT) any script call whose
/// keys hash to different slots, as a real cluster does.
struct ClusterNode {
    server: RedisServer,
    _dir: tempfile::TempDir,
}

impl ClusterNode {
    async fn start() -> Option<ClusterNode> {
        let dir = tempfile::tempdir().unwrap();
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let child = std::process::Command::new("redis-server")
            .current_dir(dir.path())
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .args(["--cluster-enabled", "yes"])
            .stdout(std::process::Stdio::null())
            .spawn()
            .ok()?;
        let server = RedisServer::adopt(port, child);
        for _ in 0..100 {
            if server.cli(&["PING"]).await.is_some_and(|o| o.contains("PONG")) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(30)).await;
        }
        server.cli(&["CLUSTER", "ADDSLOTSRANGE", "0", "16383"]).await?;
        for _ in 0..100 {
            let info = server.cli(&["CLUSTER", "INFO"]).await?;
            if info.contains("cluster_state:ok") {
                return Some(ClusterNode { server, _dir: dir });
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        None
    }
}

#[tokio::test]
async fn the_window_scripts_run_on_a_redis_cluster_node() {
    let node = ClusterNode::start()
        .await
        .expect("a one-node Redis Cluster starts");
    let w = RedisWindows::new(&node.server.url(), TIMEOUT).unwrap();
    let window = Duration::from_secs(60);
    let specs = token_and_user(10, 1000);
    let d = w.check(&specs, "r1", 100, window).await.expect("no CROSSSLOT");
    assert!(d.refused.is_none());
    w.correct(&specs, d.second, -60)
        .await
        .expect("correction: no CROSSSLOT");
    let key = [WindowSpec::upstream("openai-a", 10, 1000)];
    let d = w.check(&key, "r1:0", 100, window).await.unwrap();
    w.correct(&key, d.second, -100).await.unwrap();
    let ids = ["a".to_string(), "b".to_string()];
    let cool = w
        .sync_cooldowns(&[("a".into(), now_ms() + 5000, 5000)], &ids)
        .await
        .expect("cooldowns: no CROSSSLOT");
    assert!(cool[0].is_some() && cool[1].is_none());
}
