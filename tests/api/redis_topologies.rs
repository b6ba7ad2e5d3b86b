//! Real Redis topologies for the window tests: a Redis Cluster of `redis-server
//! --cluster-enabled yes` nodes joined by `redis-cli --cluster create`, and a master with a
//! replica watched by `redis-server --sentinel`. Every process runs on a free port in a temp
//! folder and is stopped when its handle is dropped; every wait is a bounded poll.

use std::time::Duration;

use tokio::sync::{Semaphore, SemaphorePermit};

use crate::helpers::RedisServer;
use crate::processes::free_port;

/// One rig at a time: a cluster is six servers and its tests add two gateways, and other
/// tests of this binary bound their Redis calls by 50 ms on a shared 2-core machine.
static RIGS: Semaphore = Semaphore::const_new(1);

/// Polls `check` every 50 ms until it holds; panics with `what` after `limit`.
pub async fn poll_until<F, Fut>(limit: Duration, what: &str, check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    assert!(polled(limit, check).await, "{what}: not within {limit:?}");
}

/// Polls `check` every 50 ms until it holds (true) or `limit` has passed (false).
pub async fn polled<F, Fut>(limit: Duration, mut check: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let start = std::time::Instant::now();
    while start.elapsed() < limit {
        if check().await {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    false
}

/// Runs `redis-cli -p port args…`; `None` if it failed or answered an error.
pub async fn cli(port: u16, args: &[&str]) -> Option<String> {
    let out = tokio::process::Command::new("redis-cli")
        .arg("-p")
        .arg(port.to_string())
        .args(args)
        .output()
        .await
        .ok()?;
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    (out.status.success() && !text.starts_with("ERR") && !text.starts_with("CROSSSLOT"))
        .then_some(text)
}

/// `redis-cli` with `password` (if any) on a node that requires it.
async fn node_cli(port: u16, password: Option<&str>, args: &[&str]) -> Option<String> {
    match password {
        Some(p) => {
            let mut all = vec!["-a", p, "--no-auth-warning"];
            all.extend_from_slice(args);
            cli(port, &all).await
        }
        None => cli(port, args).await,
    }
}

/// `n` distinct free ports: every listener is held until all are chosen, so none repeats.
pub(crate) fn free_ports(n: usize) -> Vec<u16> {
    let held: Vec<std::net::TcpListener> = (0..n)
        .map(|_| std::net::TcpListener::bind("127.0.0.1:0").unwrap())
        .collect();
    held.iter()
        .map(|l| l.local_addr().unwrap().port())
        .collect()
}

fn spawn(dir: &std::path::Path, port: u16, extra: &[&str]) -> RedisServer {
    let child = std::process::Command::new("redis-server")
        .current_dir(dir)
        .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
        .args(["--save", "", "--appendonly", "no"])
        // A replica's first sync starts at once, not after the default 5 s wait for more.
        .args(["--repl-diskless-sync-delay", "0"])
        .args(extra)
        .stdout(std::process::Stdio::null())
        .spawn()
        .expect("redis-server is installed (scripts/test-deps.sh)");
    RedisServer::adopt(port, child)
}

async fn answers(port: u16) {
    poll_until(
        Duration::from_secs(10),
        "redis-server answers PING",
        || async move {
            cli(port, &["PING"])
                .await
                .is_some_and(|o| o.contains("PONG"))
        },
    )
    .await;
}

/// A Redis Cluster: `masters` masters with `replicas` replicas each, a 1 s node timeout (a
/// dead master is failed over within seconds) and replicas always eligible for promotion.
pub struct RedisCluster {
    pub nodes: Vec<RedisServer>,
    /// Ports of the nodes `kill` stopped.
    killed: Vec<u16>,
    _dir: tempfile::TempDir,
    /// Released last, once the servers are stopped (fields drop in order).
    _turn: SemaphorePermit<'static>,
}

impl RedisCluster {
    pub async fn start(masters: usize, replicas: usize) -> RedisCluster {
        let turn = RIGS.acquire().await.expect("never closed");
        let dir = tempfile::tempdir().unwrap();
        let mut nodes = Vec::new();
        let count = masters * (1 + replicas);
        let ports = free_ports(2 * count);
        for pair in ports.chunks(2) {
            let (port, bus) = (pair[0], pair[1]);
            let conf = format!("nodes-{port}.conf");
            nodes.push(spawn(
                dir.path(),
                port,
                &[
                    "--cluster-enabled",
                    "yes",
                    // Named, not the implicit port + 10 000: an ephemeral port above 55 535
                    // has no such bus port and the node would exit at start.
                    "--cluster-port",
                    &bus.to_string(),
                    "--cluster-config-file",
                    &conf,
                    "--cluster-node-timeout",
                    "1000",
                    "--cluster-replica-validity-factor",
                    "0",
                ],
            ));
        }
        for n in &nodes {
            answers(n.port).await;
        }
        let addrs: Vec<String> = nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect();
        let out = tokio::process::Command::new("redis-cli")
            .args(["--cluster", "create"])
            .args(&addrs)
            .args(["--cluster-replicas", &replicas.to_string(), "--cluster-yes"])
            .output()
            .await
            .unwrap();
        assert!(
            out.status.success(),
            "redis-cli --cluster create: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        let cluster = RedisCluster {
            _turn: turn,
            nodes,
            killed: Vec::new(),
            _dir: dir,
        };
        for n in &cluster.nodes {
            let port = n.port;
            poll_until(
                Duration::from_secs(20),
                "cluster_state:ok on every node",
                || async move {
                    cli(port, &["CLUSTER", "INFO"])
                        .await
                        .is_some_and(|i| i.contains("cluster_state:ok"))
                },
            )
            .await;
        }
        // Every replica attached to its master (so a failover has someone to promote).
        let want = masters * replicas;
        let port = cluster.nodes[0].port;
        poll_until(
            Duration::from_secs(20),
            "every replica attached",
            || async move {
                cli(port, &["CLUSTER", "NODES"]).await.is_some_and(|n| {
                    n.lines()
                        .filter(|l| l.contains("slave") && l.contains("connected"))
                        .count()
                        == want
                })
            },
        )
        .await;
        cluster
    }

    /// The seed list for `[redis] url` with `cluster = true`.
    pub fn urls(&self) -> String {
        self.nodes
            .iter()
            .map(|n| format!("redis://127.0.0.1:{}", n.port))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// A node that still runs (for commands about the cluster as a whole).
    fn alive(&self) -> u16 {
        self.nodes
            .iter()
            .find(|n| !self.killed.contains(&n.port))
            .expect("a node still runs")
            .port
    }

    /// `redis-cli -c` (following redirections) through a running node.
    pub async fn cli(&self, args: &[&str]) -> Option<String> {
        let mut all = vec!["-c"];
        all.extend_from_slice(args);
        cli(self.alive(), &all).await
    }

    pub async fn keyslot(&self, key: &str) -> u16 {
        self.cli(&["CLUSTER", "KEYSLOT", key])
            .await
            .unwrap()
            .trim()
            .parse()
            .unwrap()
    }

    /// `(node id, port)` of the master serving `slot`, as a running node sees it.
    pub async fn owner(&self, slot: u16) -> Option<(String, u16)> {
        let nodes = cli(self.alive(), &["CLUSTER", "NODES"]).await?;
        nodes.lines().find_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            if !f.get(2)?.contains("master") || f.get(2)?.contains("fail") {
                return None;
            }
            let serves = f[8..].iter().any(|r| match r.split_once('-') {
                _ if r.starts_with('[') => false,
                Some((a, b)) => {
                    a.parse::<u16>().is_ok_and(|a| a <= slot)
                        && b.parse::<u16>().is_ok_and(|b| slot <= b)
                }
                None => r.parse::<u16>() == Ok(slot),
            });
            let port = f[1].split('@').next()?.rsplit(':').next()?.parse().ok()?;
            serves.then(|| (f[0].to_string(), port))
        })
    }

    /// Every master's `(node id, port)`, as a running node sees it.
    pub async fn masters(&self) -> Vec<(String, u16)> {
        let nodes = cli(self.alive(), &["CLUSTER", "NODES"]).await.unwrap();
        nodes
            .lines()
            .filter_map(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                (f.get(2)?.contains("master") && !f[2].contains("fail")).then(|| {
                    let port = f[1].split('@').next()?.rsplit(':').next()?.parse().ok()?;
                    Some((f[0].to_string(), port))
                })?
            })
            .collect()
    }

    /// Stops the node on `port` at once (SIGKILL).
    pub fn kill(&mut self, port: u16) {
        self.nodes
            .iter_mut()
            .find(|n| n.port == port)
            .unwrap()
            .kill();
        self.killed.push(port);
    }
}

/// A master, one replica and three sentinels watching it as `mymaster` (quorum 2), with a
/// 1 s down-after: a dead master is replaced within seconds.
pub struct SentinelRig {
    pub master: RedisServer,
    pub replica: RedisServer,
    pub sentinels: Vec<RedisServer>,
    /// The master's and replica's `requirepass`, if any.
    password: Option<String>,
    _dir: tempfile::TempDir,
    /// Released last, once the servers are stopped.
    _turn: SemaphorePermit<'static>,
}

pub const MASTER_NAME: &str = "mymaster";

impl SentinelRig {
    pub async fn start() -> SentinelRig {
        Self::start_with(None).await
    }

    /// The rig with `password` required by the master and the replica (`requirepass`,
    /// `masterauth`; the sentinels get it as `auth-pass`).
    pub async fn start_with(password: Option<&str>) -> SentinelRig {
        let turn = RIGS.acquire().await.expect("never closed");
        let dir = tempfile::tempdir().unwrap();
        let auth: Vec<&str> = match password {
            Some(p) => vec!["--requirepass", p, "--masterauth", p],
            None => vec![],
        };
        let master = spawn(dir.path(), free_port(), &auth);
        let mp = master.port;
        poll_until(
            Duration::from_secs(10),
            "the master answers",
            || async move {
                node_cli(mp, password, &["PING"])
                    .await
                    .is_some_and(|o| o.contains("PONG"))
            },
        )
        .await;
        let mp_s = mp.to_string();
        let mut replica_args = vec!["--replicaof", "127.0.0.1", &mp_s];
        replica_args.extend(&auth);
        let replica = spawn(dir.path(), free_port(), &replica_args);
        let rp = replica.port;
        poll_until(
            Duration::from_secs(20),
            "the replica is in sync",
            || async move {
                node_cli(rp, password, &["INFO", "replication"])
                    .await
                    .is_some_and(|i| i.contains("master_link_status:up"))
            },
        )
        .await;
        // Each sentinel is told the others and the replica up front (ids fixed in the
        // config), so none waits for the others' hello messages before it can vote.
        let ports: Vec<u16> = (0..3).map(|_| free_port()).collect();
        let id = |i: usize| format!("{:040x}", i + 1);
        let mut sentinels = Vec::new();
        for (i, &port) in ports.iter().enumerate() {
            let conf = dir.path().join(format!("sentinel-{port}.conf"));
            let mut text = format!(
                "port {port}\nbind 127.0.0.1\ndir {dir}\nsentinel myid {me}\n\
                 sentinel monitor {MASTER_NAME} 127.0.0.1 {mp} 2\n\
                 sentinel down-after-milliseconds {MASTER_NAME} 1000\n\
                 sentinel failover-timeout {MASTER_NAME} 5000\n\
                 sentinel parallel-syncs {MASTER_NAME} 1\n\
                 sentinel known-replica {MASTER_NAME} 127.0.0.1 {rp}\n",
                dir = dir.path().display(),
                me = id(i)
            );
            if let Some(p) = password {
                text += &format!("sentinel auth-pass {MASTER_NAME} {p}\n");
            }
            for (j, &other) in ports.iter().enumerate() {
                if j != i {
                    text += &format!(
                        "sentinel known-sentinel {MASTER_NAME} 127.0.0.1 {other} {}\n",
                        id(j)
                    );
                }
            }
            std::fs::write(&conf, text).unwrap();
            let child = std::process::Command::new("redis-server")
                .arg(&conf)
                .arg("--sentinel")
                .stdout(std::process::Stdio::null())
                .spawn()
                .expect("redis-server runs as a sentinel");
            sentinels.push(RedisServer::adopt(port, child));
        }
        for s in &sentinels {
            let port = s.port;
            poll_until(
                Duration::from_secs(20),
                "each sentinel sees the replica and the others",
                || async move {
                    let Some(m) = cli(port, &["SENTINEL", "MASTER", MASTER_NAME]).await else {
                        return false;
                    };
                    let field = |name: &str| {
                        let lines: Vec<&str> = m.lines().collect();
                        lines
                            .iter()
                            .position(|l| l.trim() == name)
                            .and_then(|i| lines.get(i + 1))
                            .map(|v| v.trim().to_string())
                    };
                    field("num-slaves").as_deref() == Some("1")
                        && field("num-other-sentinels").as_deref() == Some("2")
                },
            )
            .await;
        }
        SentinelRig {
            _turn: turn,
            master,
            replica,
            sentinels,
            password: password.map(str::to_string),
            _dir: dir,
        }
    }

    /// `redis-cli` on the master or the replica, with the rig's password.
    pub async fn node_cli(&self, port: u16, args: &[&str]) -> Option<String> {
        node_cli(port, self.password.as_deref(), args).await
    }

    /// The `[redis]` table of a gateway that finds the master through these sentinels.
    pub fn config(&self) -> String {
        let list = self
            .sentinels
            .iter()
            .map(|s| format!("\"redis://127.0.0.1:{}\"", s.port))
            .collect::<Vec<_>>()
            .join(", ");
        let mut text = format!("[redis]\nsentinels = [{list}]\nmaster_name = \"{MASTER_NAME}\"\n");
        if let Some(p) = &self.password {
            text += &format!("master_password = \"{p}\"\n");
        }
        text
    }

    /// The port of the master the sentinels name now.
    pub async fn master_port(&self) -> Option<u16> {
        for s in &self.sentinels {
            if let Some(out) = cli(
                s.port,
                &["SENTINEL", "GET-MASTER-ADDR-BY-NAME", MASTER_NAME],
            )
            .await
            {
                return out.lines().nth(1)?.trim().parse().ok();
            }
        }
        None
    }
}

/// One server whose password has a comma in it (a sub-delimiter RFC 3986 allows in a URL's
/// user info, and what generated passwords often hold): `url` was taken whole before
/// clusters could be listed in it, and must still be. Only a comma that starts another
/// `redis://` URL separates nodes.
#[tokio::test]
async fn a_password_with_a_comma_is_one_server_not_two() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let _server = spawn(dir.path(), port, &["--requirepass", "pa,ss"]);
    poll_until(
        Duration::from_secs(10),
        "redis-server answers PING",
        || async move {
            node_cli(port, Some("pa,ss"), &["PING"])
                .await
                .is_some_and(|o| o.contains("PONG"))
        },
    )
    .await;
    let url = format!("redis://:pa,ss@127.0.0.1:{port}");
    let text = format!("[redis]\nurl = \"{url}\"\n");
    let settings =
        sluice::config::load_from(Some(&text), &std::collections::BTreeMap::new()).unwrap();
    let topology = settings
        .redis
        .as_ref()
        .unwrap()
        .topology()
        .map_err(|e| e.to_string());
    assert_eq!(
        topology,
        Ok(sluice::config::RedisTopology::Single(url.clone())),
        "one server"
    );
    let w = sluice::ratelimit::redis_window::RedisWindows::with_topology(
        &topology.unwrap(),
        Duration::from_secs(1),
    )
    .unwrap();
    w.ping().await.expect("signed in with the whole password");
}
