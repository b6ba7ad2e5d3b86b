//! The gateway on PostgreSQL, end to end (issue 17): real `sluice serve` processes, each
//! with a working directory of its own and no shared file ("hosts"), on one PostgreSQL
//! database and one Redis Cluster (three masters), with the shared master key in `SLUICE_SECRET_KEY`; the only fake
//! is the upstream (`sluice mock`, in this process).
//!
//! - two hosts, 200 concurrent requests on a budget for 100 → exactly 100 served, charged
//!   and logged;
//! - `kill -9` of one host with reservations in flight → the survivor settles them as
//!   orphans (heartbeats in the database, no PIDs), and serves meanwhile;
//! - PostgreSQL stopped for 10 s under load → 503 `service_degraded`, never a 500, nothing
//!   reaches the upstream without a committed reservation, and everything lands after.

use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;
use sluice::mock::{MockConfig, MockServer, Script};
use sluice::store::Db;
use tempfile::TempDir;

use crate::gateway_proc::{config_text, free_port, healthy, Gateway};
use crate::helpers::*;
use crate::pg_gateway_app::SHARED_KEY_HEX;
use crate::pg_server::{self, PgServer};
use crate::redis_topologies::RedisCluster;

/// One gateway process and its own working directory (config, log, backup folder).
pub struct Host {
    pub gw: Gateway,
    pub dir: TempDir,
}

/// Gateway processes on one PostgreSQL database and one Redis Cluster.
pub struct PgHosts {
    pub mock: MockServer,
    pub hosts: Vec<Host>,
    /// The database, as a further host sees it (the test's own reads and the token).
    pub db: Db,
    url: String,
    redis: RedisCluster,
    /// More config for every host.
    extra: String,
}

/// The shared master key every host holds.
fn shared_key() -> sluice::secrets::MasterKey {
    sluice::secrets::MasterKey::from_hex(SHARED_KEY_HEX).unwrap()
}

/// Starts `n` gateway processes on the PostgreSQL database at `url`.
pub async fn pg_hosts(n: usize, url: String) -> PgHosts {
    pg_hosts_with(n, url, "").await
}

/// `pg_hosts` with `extra` appended to every host's config.
pub async fn pg_hosts_with(n: usize, url: String, extra: &str) -> PgHosts {
    let mock = MockServer::start("127.0.0.1:0", MockConfig::default()).unwrap();
    let redis = RedisCluster::start(3, 0).await;
    let db = Db::open_postgres(&url, &shared_key()).await.unwrap();
    let mut fleet = PgHosts {
        mock,
        hosts: Vec::new(),
        db,
        url,
        redis,
        extra: extra.to_string(),
    };
    for _ in 0..n {
        let host = fleet.start_host().await;
        fleet.hosts.push(host);
    }
    fleet
}

impl PgHosts {
    async fn start_host(&self) -> Host {
        let dir = tempfile::tempdir().unwrap();
        let port = free_port();
        let extra = format!(
            "[redis]\nurl = \"{}\"\ncluster = true\n{}",
            self.redis.urls(),
            self.extra
        );
        let sqlite = dir.path().join("never.db");
        let text = config_text(
            port,
            &sqlite,
            &dir.path().join("backup"),
            &self.mock,
            &extra,
        )
        .replace(
            &format!("url = \"sqlite://{}\"", sqlite.display()),
            &format!("url = \"{}\"", self.url),
        );
        assert!(text.contains(&self.url), "the config names PostgreSQL");
        let config = dir.path().join("sluice.toml");
        std::fs::write(&config, text).unwrap();
        let log = dir.path().join("gateway.log");
        let child = Command::new(env!("CARGO_BIN_EXE_sluice"))
            .args(["--config", config.to_str().unwrap(), "serve"])
            .env("SLUICE_SECRET_KEY", SHARED_KEY_HEX)
            .current_dir(dir.path())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        let gw = healthy(child, port, &log).await;
        Host { gw, dir }
    }

    /// Every host's log, for failure messages.
    pub fn logs(&self) -> String {
        self.hosts
            .iter()
            .map(|h| std::fs::read_to_string(h.dir.path().join("gateway.log")).unwrap_or_default())
            .collect::<Vec<_>>()
            .join("\n----\n")
    }

    /// A token with a budget of `usd`, issued in the shared database.
    pub async fn token(&self, user: &str, usd: &str) -> (i64, String) {
        let args = sluice::cli::IssueArgs {
            budget_usd: Some(usd),
            ..issue_args(user)
        };
        let issued = sluice::cli::token_issue(&self.db, &args, chrono::Utc::now())
            .await
            .unwrap();
        (issued.id, issued.text)
    }

    pub async fn int(&self, sql: &str) -> i64 {
        sql_int(&self.db, sql).await
    }

    /// Waits (bounded) until `sql` selects `want`.
    pub async fn wait_for(&self, sql: &str, want: i64, within: Duration) {
        let until = Instant::now() + within;
        loop {
            let got = self.int(sql).await;
            if got == want {
                return;
            }
            assert!(
                Instant::now() < until,
                "{sql}: {got}, never {want}\n{}",
                self.logs()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The mock answers every request with exactly the worst case of `chat_body(100)`
    /// (so a request costs its reservation), after `delay_ms`.
    fn answer_worst_case(&self, delay_ms: u64) -> i64 {
        let (input, per_request) = chat_worst_case(100);
        self.mock.state.sticky(
            KEY_A,
            Some(Script {
                prompt_tokens: Some(input),
                completion_tokens: Some(100),
                delay_ms,
                ..Default::default()
            }),
        );
        per_request
    }
}

/// One chat request to `base`: its status and JSON body (`Null` when the body is not JSON).
async fn chat(http: &reqwest::Client, base: &str, token: &str) -> (u16, Value) {
    let resp = http
        .post(format!("{base}/v1/chat/completions"))
        .bearer_auth(token)
        .json(&chat_body(100))
        .timeout(Duration::from_secs(60))
        .send()
        .await
        .unwrap();
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap_or(Value::Null))
}

/// Issue 17: 200 concurrent requests on a budget for exactly 100, split over two hosts on
/// one PostgreSQL: exactly 100 served (the mock saw 100), 100 refused `insufficient_quota`,
/// spend equal to the budget to the micro-dollar, every answer logged, the invariant held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hosts_on_postgres_admit_exactly_one_hundred_of_two_hundred() {
    let fleet = pg_hosts(2, pg_server::database()).await;
    let per_request = fleet.answer_worst_case(0);
    let budget = sluice::quota::pricing::usd(100 * per_request);
    let (id, token) = fleet.token("alice", &budget).await;
    let http = reqwest::Client::new();
    let mut tasks = Vec::new();
    for i in 0..200 {
        let (http, token) = (http.clone(), token.clone());
        let base = fleet.hosts[i % 2].gw.url.clone();
        tasks.push(tokio::spawn(
            async move { chat(&http, &base, &token).await },
        ));
    }
    let mut ok = 0;
    let mut refused = 0;
    for t in tasks {
        match t.await.unwrap() {
            (200, body) => {
                assert!(
                    body["choices"][0]["message"]["content"].is_string(),
                    "{body}"
                );
                ok += 1;
            }
            (429, body) => {
                assert_eq!(body["error"]["code"], "insufficient_quota", "{body}");
                refused += 1;
            }
            (status, body) => panic!("{status} {body}\n{}", fleet.logs()),
        }
    }
    assert_eq!((ok, refused), (100, 100), "{}", fleet.logs());
    assert_eq!(fleet.mock.state.stats(KEY_A).count, 100);
    fleet
        .wait_for(
            "SELECT COUNT(*) FROM reservations",
            0,
            Duration::from_secs(30),
        )
        .await;
    fleet
        .wait_for(
            "SELECT COUNT(*) FROM requests WHERE status = 200",
            100,
            Duration::from_secs(30),
        )
        .await;
    assert_eq!(
        fleet
            .int(&format!(
                "SELECT remaining_micros FROM tokens WHERE id = {id}"
            ))
            .await,
        0
    );
    assert_eq!(
        fleet
            .int("SELECT SUM(amount_micros) FROM ledger WHERE kind IN ('reserve', 'settle')")
            .await,
        100 * per_request
    );
    assert_invariant_on(&fleet.db).await;
}

/// Issue 17: `kill -9` of one host while it holds reservations: the other host (which
/// keeps serving) finds it gone by its stale heartbeat — no PID is looked at across hosts —
/// and settles every reservation it left as an orphan; the invariant holds after.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_killed_under_load_leaves_its_reservations_to_the_survivor() {
    let mut fleet = pg_hosts(2, pg_server::database()).await;
    // Slow answers: the reservations of the host about to die are still open when it dies.
    fleet.answer_worst_case(2_000);
    let (_, token) = fleet.token("bob", "100").await;
    let http = reqwest::Client::new();
    let doomed = fleet.hosts[0].gw.url.clone();
    let mut in_flight = Vec::new();
    for _ in 0..20 {
        let (http, token, base) = (http.clone(), token.clone(), doomed.clone());
        in_flight.push(tokio::spawn(async move {
            let _ = http
                .post(format!("{base}/v1/chat/completions"))
                .bearer_auth(&token)
                .json(&chat_body(100))
                .send()
                .await;
        }));
    }
    fleet
        .wait_for(
            "SELECT COUNT(*) FROM reservations",
            20,
            Duration::from_secs(30),
        )
        .await;
    fleet.hosts[0].gw.child.kill().unwrap(); // SIGKILL
    fleet.hosts[0].gw.child.wait().unwrap();
    for t in in_flight {
        t.await.unwrap();
    }
    let left = fleet.int("SELECT COUNT(*) FROM reservations").await;
    assert_eq!(left, 20, "the dead host's reservations are still open");
    // The survivor serves meanwhile, and recovers the orphans within its stale window.
    fleet.answer_worst_case(0);
    let survivor = fleet.hosts[1].gw.url.clone();
    let until = Instant::now() + Duration::from_secs(90);
    let mut served = 0;
    while fleet.int("SELECT COUNT(*) FROM reservations").await > 0 {
        assert!(
            Instant::now() < until,
            "orphans never settled\n{}",
            fleet.logs()
        );
        let (status, body) = chat(&http, &survivor, &token).await;
        assert_eq!(status, 200, "{body}\n{}", fleet.logs());
        served += 1;
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(served > 0);
    assert_eq!(
        fleet
            .int("SELECT COUNT(*) FROM ledger WHERE kind = 'orphan'")
            .await,
        left,
        "every reservation of the dead host settled as an orphan, once"
    );
    fleet
        .wait_for(
            "SELECT COUNT(*) FROM requests WHERE status = 200",
            served,
            Duration::from_secs(30),
        )
        .await;
    assert_invariant_on(&fleet.db).await;
}

/// Issue 17: PostgreSQL stopped for 10 s under load from two hosts: requests are refused
/// with 503 `service_degraded` (never a 500), none reaches the upstream without a committed
/// reservation (the mock saw exactly the 200s), and once the server is back the hosts serve
/// again, every settlement and every 200's log row lands and the invariant holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_stopped_for_ten_seconds_under_load_answers_503_and_loses_nothing() {
    let server = Arc::new(PgServer::start());
    let fleet = Arc::new(pg_hosts(2, server.database()).await);
    fleet.answer_worst_case(20);
    let (_, token) = fleet.token("carol", "1000").await;
    let stop = Arc::new(AtomicBool::new(false));
    let ok = Arc::new(AtomicUsize::new(0));
    let degraded = Arc::new(AtomicUsize::new(0));
    let other: Arc<Mutex<Vec<(u16, Value)>>> = Arc::default();
    let http = reqwest::Client::new();
    let mut clients = Vec::new();
    for c in 0..6 {
        let (fleet, token, http) = (fleet.clone(), token.clone(), http.clone());
        let (stop, ok, degraded, other) =
            (stop.clone(), ok.clone(), degraded.clone(), other.clone());
        clients.push(tokio::spawn(async move {
            let base = fleet.hosts[c % 2].gw.url.clone();
            while !stop.load(Ordering::Relaxed) {
                match chat(&http, &base, &token).await {
                    (200, _) => drop(ok.fetch_add(1, Ordering::Relaxed)),
                    (503, body) if body["error"]["code"] == "service_degraded" => {
                        degraded.fetch_add(1, Ordering::Relaxed);
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                    answer => {
                        other.lock().unwrap().push(answer);
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                }
            }
        }));
    }
    let until = |n: usize, counter: Arc<AtomicUsize>, what: &'static str| {
        let fleet = fleet.clone();
        async move {
            let deadline = Instant::now() + Duration::from_secs(90);
            while counter.load(Ordering::Relaxed) < n {
                assert!(
                    Instant::now() < deadline,
                    "never {n} {what}\n{}",
                    fleet.logs()
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    };
    until(30, ok.clone(), "200s before the outage").await;
    let s = server.clone();
    tokio::task::spawn_blocking(move || s.stop()).await.unwrap();
    // The outage itself lasts 10 s (what the issue asks), whatever the clients see.
    tokio::time::sleep(Duration::from_secs(10)).await;
    let during = degraded.load(Ordering::Relaxed);
    let s = server.clone();
    tokio::task::spawn_blocking(move || s.run()).await.unwrap();
    let before = ok.load(Ordering::Relaxed);
    until(before + 30, ok.clone(), "200s after the outage").await;
    stop.store(true, Ordering::Relaxed);
    for c in clients {
        c.await.unwrap();
    }
    let other = other.lock().unwrap().clone();
    assert!(
        other.is_empty(),
        "{} answers not a 200 or a 503 service_degraded, the first: {:?}",
        other.len(),
        other.first()
    );
    assert!(
        during > 0,
        "no request was refused while PostgreSQL was down"
    );
    let served = ok.load(Ordering::Relaxed) as i64;
    assert_eq!(
        fleet.mock.state.stats(KEY_A).count as i64,
        served,
        "the upstream saw exactly the admitted requests"
    );
    fleet
        .wait_for(
            "SELECT COUNT(*) FROM reservations",
            0,
            Duration::from_secs(60),
        )
        .await;
    fleet
        .wait_for(
            "SELECT COUNT(*) FROM requests WHERE status = 200",
            served,
            Duration::from_secs(60),
        )
        .await;
    // The refusals are logged too: their rows waited for the database and landed after.
    fleet
        .wait_for(
            "SELECT COUNT(*) FROM requests WHERE status = 503",
            degraded.load(Ordering::Relaxed) as i64,
            Duration::from_secs(60),
        )
        .await;
    assert_invariant_on(&fleet.db).await;
}

/// Not a check: the request rate of two hosts with every feature on (Redis windows, budget
/// reserve and settle, request log, cache lookup and write on a miss), on PostgreSQL and,
/// for comparison in the same run, on one SQLite file shared by two processes. Run with
/// `cargo test --release --test api pg_gateway::two_host_request_rate -- --ignored
/// --nocapture`. Without `SLUICE_PG_BENCH_URL` it starts a PostgreSQL of its own with the
/// durable defaults (`fsync = on`); the two hosts are measured on it directly and again
/// through a link that holds every answer 0.5 ms (`SLUICE_PG_BENCH_RTT_US`: a remote
/// database).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement: run with --ignored --nocapture"]
async fn two_host_request_rate() {
    const CLIENTS: usize = 32;
    const SECONDS: u64 = 10;
    let extra = "[cache]\nmode = \"all\"\n[queue]\nmax_in_flight = 4096\n";
    let (_server, url, note) = match std::env::var("SLUICE_PG_BENCH_URL") {
        Ok(url) => (None, url, "SLUICE_PG_BENCH_URL"),
        Err(_) => {
            let server = PgServer::start_durable();
            let url = server.database();
            (Some(server), url, "a server of its own, fsync=on")
        }
    };
    let rtt_us: u64 = std::env::var("SLUICE_PG_BENCH_RTT_US")
        .map(|v| v.parse().expect("SLUICE_PG_BENCH_RTT_US: microseconds"))
        .unwrap_or(500);
    let far_url = crate::pg_money_bench::delayed_link(&url, Duration::from_micros(rtt_us));
    let fleet = pg_hosts_with(2, url, extra).await;
    let (_, token) = fleet.token("bench", "1000000").await;
    let urls: Vec<String> = fleet.hosts.iter().map(|h| h.gw.url.clone()).collect();
    let pg = rate(&urls, &token, CLIENTS, SECONDS).await;
    drop(fleet);
    // The same on the same database, every connection of both hosts through the link.
    let fleet = pg_hosts_with(2, far_url, extra).await;
    let (_, token) = fleet.token("bench-far", "1000000").await;
    let urls: Vec<String> = fleet.hosts.iter().map(|h| h.gw.url.clone()).collect();
    let far = rate(&urls, &token, CLIENTS, SECONDS).await;
    drop(fleet);
    // The same two processes on one SQLite file.
    let dir = tempfile::tempdir().unwrap();
    let mock = MockServer::start("127.0.0.1:0", MockConfig::default()).unwrap();
    let redis = RedisServer::start().await;
    let extra = format!("[redis]\nurl = \"{}\"\n{extra}", redis.url());
    let a = crate::gateway_proc::start_gateway_full(dir.path(), &mock, &[], &extra).await;
    let b = crate::gateway_proc::start_gateway_full(dir.path(), &mock, &[], &extra).await;
    let (_, token) = crate::gateway_proc::db_and_token(dir.path(), "bench").await;
    let lite = rate(&[a.url.clone(), b.url.clone()], &token, CLIENTS, SECONDS).await;
    println!(
        "two hosts, every feature, {CLIENTS} clients, {SECONDS} s ({note}): postgres {pg:.0} requests/s, postgres +{rtt_us} µs round trips {far:.0} requests/s, one SQLite file {lite:.0} requests/s"
    );
}

/// 200s per second from `clients` closed-loop clients spread over `urls`, each request
/// unique (the cache misses and writes).
async fn rate(urls: &[String], token: &str, clients: usize, seconds: u64) -> f64 {
    let http = reqwest::Client::new();
    let until = Instant::now() + Duration::from_secs(seconds);
    let done = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for c in 0..clients {
        let (http, token, done) = (http.clone(), token.to_string(), done.clone());
        let base = urls[c % urls.len()].clone();
        tasks.push(tokio::spawn(async move {
            let mut k = 0;
            while Instant::now() < until {
                k += 1;
                let body = serde_json::json!({"model": "gpt-4o-mini", "max_tokens": 50,
                    "messages": [{"role": "user", "content": format!("question {c}-{k}: why does the engine light blink?")}]});
                let resp = http
                    .post(format!("{base}/v1/chat/completions"))
                    .bearer_auth(&token)
                    .json(&body)
                    .send()
                    .await
                    .unwrap();
                assert_eq!(resp.status(), 200, "{}", resp.text().await.unwrap_or_default());
                let _ = resp.bytes().await;
                done.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    let started = Instant::now();
    for t in tasks {
        t.await.unwrap();
    }
    done.load(Ordering::Relaxed) as f64 / started.elapsed().as_secs_f64()
}
