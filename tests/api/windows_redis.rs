//! The Redis window scripts themselves, against a real `redis-server`: token windows booked
//! and corrected (`window.lua`, `correct.lua`), `Retry-After` that lasts until enough has
//! left the window, one request's keys on a Redis Cluster node, and corrections that land
//! only in the store that booked them, never below 0.

use std::time::Duration;

use sluice::ratelimit::redis_window::RedisWindows;
use sluice::ratelimit::{Refused, WindowSpec, Windows};

use crate::helpers::*;

const TIMEOUT: Duration = Duration::from_millis(500);

async fn hash_sum(redis: &RedisServer, key: &str) -> i64 {
    let out = redis.cli(&["HVALS", key]).await.unwrap();
    out.lines()
        .filter_map(|l| l.trim().parse::<i64>().ok())
        .sum()
}

fn token_and_user(requests: u64, tokens: u64) -> [WindowSpec; 2] {
    [
        WindowSpec::token(7, 12, requests, tokens),
        WindowSpec::user(7, requests, tokens),
    ]
}

/// Sleeps into the next Redis second (bounded: at most 1.1 s).
async fn next_second(redis: &RedisServer, after: i64) {
    for _ in 0..30 {
        let t = redis.cli(&["TIME"]).await.unwrap();
        let secs: i64 = t.lines().next().unwrap().trim().parse().unwrap();
        if secs > after {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("Redis time did not move past {after}");
}

fn now_ms() -> i64 {
    chrono::Utc::now().timestamp_millis()
}

#[tokio::test]
async fn redis_token_windows_are_booked_and_corrected() {
    let redis = RedisServer::start().await;
    let w = RedisWindows::new(&redis.url(), TIMEOUT).unwrap();
    let window = Duration::from_secs(60);
    let specs = token_and_user(0, 100);
    let d = w.check(&specs, "r1", 80, window).await.unwrap();
    assert!(d.refused.is_none());
    assert_eq!((d.tokens_limit, d.tokens_used), (100, 80));
    let keys = RedisWindows::correct_keys(&specs);
    for k in &keys {
        assert_eq!(hash_sum(&redis, k).await, 80, "{k}");
    }
    let refused = w.check(&specs, "r2", 30, window).await.unwrap();
    assert_eq!(refused.refused, Some(Refused::Tokens));
    // Corrected from the estimate (80) to the actual usage (20) in both windows.
    w.correct(&specs, (d.second, -60), window).await.unwrap();
    for k in &keys {
        assert_eq!(hash_sum(&redis, k).await, 20, "{k}");
    }
    let d2 = w.check(&specs, "r3", 30, window).await.unwrap();
    assert!(d2.refused.is_none(), "the correction made room");
    assert_eq!(d2.tokens_used, 50);
    // A correction for a second whose bucket is gone changes nothing (it must not write
    // a negative bucket that would let more in).
    w.correct(&specs, (d.second - 30, -50), window)
        .await
        .unwrap();
    for k in &keys {
        assert_eq!(hash_sum(&redis, k).await, 50, "{k}");
        let ttl: i64 = redis
            .cli(&["PTTL", k])
            .await
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        assert!(ttl > 0, "{k} keeps its TTL");
    }
}

/// A stream longer than the window is corrected after its admission second has left (its
/// key expired, or its field still there but out of the window): the tokens used beyond the
/// estimate are booked in the current second, with the window's TTL. Before, the
/// correction was dropped, or landed in the stale field the next check deletes, and a long
/// stream's tokens were never counted (s29 limits attack F1). A negative correction for a
/// gone bucket still changes nothing.
#[tokio::test]
async fn a_positive_correction_after_the_window_moved_on_is_booked_now() {
    let redis = RedisServer::start().await;
    let w = RedisWindows::new(&redis.url(), TIMEOUT).unwrap();
    let window = Duration::from_secs(2);
    let specs = token_and_user(0, 100);
    let booked = w.check(&specs, "r1", 30, window).await.unwrap();
    assert!(booked.refused.is_none());
    let keys = RedisWindows::correct_keys(&specs);
    // One key expired (the window's TTL passed), the other still holding the stale field.
    redis.cli(&["DEL", &keys[0]]).await.unwrap();
    redis.cli(&["PERSIST", &keys[1]]).await.unwrap();
    // Its bucket left at (s + 1) s + window: in second s + 4 it is gone.
    for s in booked.second..=booked.second + 3 {
        next_second(&redis, s).await;
    }
    w.correct(&specs, (booked.second, 120), window)
        .await
        .unwrap();
    for k in &keys {
        let ttl: i64 = redis
            .cli(&["PTTL", k])
            .await
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        assert!(ttl > 2000 && ttl <= 3000, "{k}: the window's TTL, {ttl}");
    }
    let d = w.check(&specs, "r2", 1, window).await.unwrap();
    assert_eq!(d.refused, Some(Refused::Tokens));
    assert_eq!(
        d.tokens_used, 120,
        "the delta alone: the estimate counted already"
    );
    for k in &keys {
        assert_eq!(
            hash_sum(&redis, k).await,
            120,
            "{k}: the stale field is gone"
        );
    }
    // Negative, for a bucket gone: nothing changes.
    w.correct(&specs, (booked.second, -500), window)
        .await
        .unwrap();
    for k in &keys {
        assert_eq!(hash_sum(&redis, k).await, 120, "{k}");
    }
}

/// Waits (bounded) until `w` uses Redis again after an outage.
async fn recovered(w: &Windows) {
    for _ in 0..100 {
        if !w.degraded() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("Redis windows did not resume within 5 s");
}

/// Lets the spawned corrections of dropped bookings run.
async fn corrections_land() {
    tokio::time::sleep(Duration::from_millis(200)).await;
}

/// A booking is corrected only in the store that booked it. One booked in the local store
/// while Redis was down and dropped after Redis is back is corrected in the local window (it
/// counts again if Redis fails again within the window) and never in Redis; one booked in
/// Redis and dropped while Redis is failing is not corrected anywhere.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_correction_goes_only_to_the_store_that_booked_it() {
    let mut redis = RedisServer::start().await;
    let store = RedisWindows::new(&redis.url(), Duration::from_millis(100)).unwrap();
    let w = Windows::new(Duration::from_secs(60), Some(store), 1);
    let specs = || token_and_user(0, 100_000).to_vec();

    redis.kill();
    let (d, local) = w.admit(specs(), "a", 80_000).await;
    assert!(w.degraded(), "Redis is down: the local store booked it");
    assert!(d.refused.is_none());
    let mut local = local.expect("booked");
    redis.restart().await;
    recovered(&w).await;

    let (d, in_redis) = w.admit(specs(), "b", 5_000).await;
    assert!(!w.degraded() && d.refused.is_none());
    assert_eq!(d.tokens_used, 5_000, "the restarted Redis starts empty");
    // The local booking used 1 000 of its 80 000.
    local.used(1_000);
    drop(local);
    corrections_land().await;
    for k in RedisWindows::correct_keys(&specs()) {
        assert_eq!(hash_sum(&redis, &k).await, 5_000, "{k}: Redis is untouched");
    }

    // Redis fails again within the window: the local window holds what was used.
    redis.kill();
    let (d, _c) = w.admit(specs(), "c", 50_000).await;
    assert!(w.degraded());
    assert!(
        d.refused.is_none(),
        "the local booking was corrected locally: {} used",
        d.tokens_used
    );
    assert_eq!(d.tokens_used, 51_000);
    // The Redis booking dropped while Redis fails: nothing is corrected in the local store.
    drop(in_redis);
    corrections_land().await;
    let (d, _d) = w.admit(specs(), "d", 49_000).await;
    assert!(d.refused.is_none());
    assert_eq!(d.tokens_used, 100_000);
}

/// A bucket whose key was lost between a booking and its correction (FLUSHALL, an
/// eviction, a failover to a replica without the last writes) and booked again in the same
/// second holds less than the lost booking's estimate: the correction must not drive it
/// below 0, which would let that many tokens over the limit in.
#[tokio::test]
async fn a_correction_never_leaves_a_redis_bucket_below_zero() {
    let redis = RedisServer::start().await;
    let w = RedisWindows::new(&redis.url(), TIMEOUT).unwrap();
    let window = Duration::from_secs(60);
    let specs = token_and_user(0, 100_000);
    let mut same_second = None;
    for _ in 0..3 {
        let t = redis.cli(&["TIME"]).await.unwrap();
        next_second(&redis, t.lines().next().unwrap().trim().parse().unwrap()).await;
        let lost = w.check(&specs, "lost", 80_000, window).await.unwrap();
        redis.cli(&["FLUSHALL"]).await.unwrap();
        let again = w.check(&specs, "again", 5_000, window).await.unwrap();
        if again.second == lost.second {
            same_second = Some(lost.second);
            break;
        }
    }
    let second = same_second.expect("two bookings within one Redis second");
    w.correct(&specs, (second, 1_000 - 80_000), window)
        .await
        .unwrap();
    for k in RedisWindows::correct_keys(&specs) {
        let bucket: i64 = redis
            .cli(&["HGET", &k, &second.to_string()])
            .await
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        assert_eq!(bucket, 0, "{k}: clamped at 0");
    }
}

#[tokio::test]
async fn redis_retry_after_lasts_until_enough_tokens_leave() {
    let redis = RedisServer::start().await;
    let w = RedisWindows::new(&redis.url(), TIMEOUT).unwrap();
    let window = Duration::from_secs(3);
    let specs = [WindowSpec::token(1, 1, 0, 100)];
    let a = w.check(&specs, "a", 40, window).await.unwrap();
    next_second(&redis, a.second).await;
    let b = w.check(&specs, "b", 40, window).await.unwrap();
    assert!(a.refused.is_none() && b.refused.is_none());
    assert!(b.second > a.second);
    // 80 used + 70 − 100 = 50 must leave: the oldest bucket (40) is not enough, the next
    // one is. Bucket s leaves by (s + 1) s + window.
    let d = w.check(&specs, "c", 70, window).await.unwrap();
    assert_eq!(d.refused, Some(Refused::Tokens));
    let retry = d.retry_after.as_millis() as i64;
    let leaves_ms = (b.second + 1) * 1000 + 3000;
    let now = d.second * 1000; // the check ran within second `d.second`
    assert!(
        retry > leaves_ms - now - 1000 && retry <= leaves_ms - now,
        "Retry-After {retry} ms: the second bucket (second {}) leaves {} ms after second {}",
        b.second,
        leaves_ms - now,
        d.second
    );
    // 80 + 20 − 100 = 0… one token: the oldest bucket is enough.
    let d = w.check(&specs, "d", 21, window).await.unwrap();
    let retry = d.retry_after.as_millis() as i64;
    let leaves_ms = (a.second + 1) * 1000 + 3000;
    let now = d.second * 1000;
    assert!(
        retry > leaves_ms - now - 1000 && retry <= leaves_ms - now,
        "Retry-After {retry} ms"
    );
}

#[tokio::test]
async fn redis_retry_after_a_lowered_request_limit_waits_for_enough_to_leave() {
    let redis = RedisServer::start().await;
    let w = RedisWindows::new(&redis.url(), TIMEOUT).unwrap();
    let window = Duration::from_secs(5);
    let specs = |limit| [WindowSpec::token(1, 2, limit, 0)];
    for i in 0..5 {
        let d = w.check(&specs(10), &format!("early{i}"), 1, window).await;
        assert!(d.unwrap().refused.is_none());
    }
    tokio::time::sleep(Duration::from_millis(1000)).await;
    for i in 0..5 {
        let d = w.check(&specs(10), &format!("late{i}"), 1, window).await;
        assert!(d.unwrap().refused.is_none());
    }
    // The exact admission times, in ms, oldest first.
    let key = &RedisWindows::window_keys(&specs(10))[0];
    let scores: Vec<i64> = redis
        .cli(&["ZRANGE", key, "0", "-1", "WITHSCORES"])
        .await
        .unwrap()
        .lines()
        .skip(1)
        .step_by(2)
        .map(|l| l.trim().parse().unwrap())
        .collect();
    assert_eq!(scores.len(), 10);
    // 10 booked, the limit lowered to 3: 10 + 1 − 3 = 8 must leave, so Retry-After lasts
    // until the 8th oldest leaves (not the oldest, a second earlier).
    let before = now_ms();
    let d = w.check(&specs(3), "probe", 1, window).await.unwrap();
    let after = now_ms();
    assert_eq!(d.refused, Some(Refused::Requests));
    let retry = d.retry_after.as_millis() as i64;
    let until = scores[7] + 5000;
    assert!(
        retry >= until - after - 1 && retry <= until - before + 1,
        "Retry-After {retry} ms, the 8th oldest leaves in {}..{} ms",
        until - after,
        until - before
    );
    // At the unchanged limit one must leave: the oldest.
    let before = now_ms();
    let d = w.check(&specs(10), "probe2", 1, window).await.unwrap();
    let retry = d.retry_after.as_millis() as i64;
    assert!(retry <= scores[0] + 5000 - before + 1, "{retry}");
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
        let [port, bus] = crate::redis_topologies::free_ports(2)[..] else {
            unreachable!("two ports asked for")
        };
        let child = std::process::Command::new("redis-server")
            .current_dir(dir.path())
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            // The bus port named: the implicit port + 10 000 does not exist above 55 535.
            .args([
                "--cluster-enabled",
                "yes",
                "--cluster-port",
                &bus.to_string(),
            ])
            .stdout(std::process::Stdio::null())
            .spawn()
            .ok()?;
        let server = RedisServer::adopt(port, child);
        for _ in 0..100 {
            if server
                .cli(&["PING"])
                .await
                .is_some_and(|o| o.contains("PONG"))
            {
                break;
            }
            tokio::time::sleep(Duration::from_millis(30)).await;
        }
        server
            .cli(&["CLUSTER", "ADDSLOTSRANGE", "0", "16383"])
            .await?;
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
    let d = w
        .check(&specs, "r1", 100, window)
        .await
        .expect("no CROSSSLOT");
    assert!(d.refused.is_none());
    w.correct(&specs, (d.second, -60), window)
        .await
        .expect("correction: no CROSSSLOT");
    // A positive correction for a bucket gone books in the current second: still one slot.
    w.correct(&specs, (d.second - 120, 25), window)
        .await
        .expect("a correction booked now: no CROSSSLOT");
    let key = [WindowSpec::upstream("openai-a", 10, 1000)];
    let d = w.check(&key, "r1:0", 100, window).await.unwrap();
    w.correct(&key, (d.second, -100), window).await.unwrap();
    let ids = ["a".to_string(), "b".to_string()];
    let cool = w
        .sync_cooldowns(&[("a".into(), now_ms() + 5000, 5000)], &ids)
        .await
        .expect("cooldowns: no CROSSSLOT");
    assert!(cool[0].is_some() && cool[1].is_none());
}

/// Tokens booked in a second leave the window a second after that second's window ends
/// (`(s + 1) + window`, what `Retry-After` says), not at `s + window`: booked late in a
/// second, they left up to a second early, and a 2 s window let twice its limit through
/// in 1.1 s (s25 attack, windows #5).
#[tokio::test]
async fn tokens_booked_late_in_a_second_stay_their_whole_window() {
    let redis = RedisServer::start().await;
    let w = RedisWindows::new(&redis.url(), TIMEOUT).unwrap();
    let window = Duration::from_secs(2);
    let specs = token_and_user(0, 100);
    // Into the last fifth of a Redis second (bounded: at most ~2 s of polling).
    let mut booked = None;
    for _ in 0..200 {
        let t = redis.cli(&["TIME"]).await.unwrap();
        let micros: i64 = t.lines().nth(1).unwrap().trim().parse().unwrap();
        if (800_000..900_000).contains(&micros) {
            booked = Some(w.check(&specs, "late", 100, window).await.unwrap());
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let booked = booked.expect("Redis time reached the end of a second");
    assert!(booked.refused.is_none());
    // 1.15–1.25 s after the booking: past `s + window`, before `(s + 1) + window`.
    next_second(&redis, booked.second).await;
    tokio::time::sleep(Duration::from_millis(1_050)).await;
    let d = w.check(&specs, "again", 100, window).await.unwrap();
    assert_eq!(d.refused, Some(Refused::Tokens), "still in the window");
    assert!(
        d.retry_after <= Duration::from_millis(1_000),
        "{:?}",
        d.retry_after
    );
}

/// A call Redis answers in time is never a failure, even when this host's estimate of
/// Redis's clock (a clock step, another node) makes the script judge it late: it is made
/// again and booked in Redis, and the replica does not degrade to local windows (s25 stop
/// attack F2: it degraded, with an alert, and booked the request locally).
#[tokio::test]
async fn an_answer_in_time_judged_late_is_booked_in_redis_without_degrading() {
    let redis = RedisServer::start().await;
    let store = RedisWindows::new(&redis.url(), TIMEOUT).unwrap();
    let w = Windows::new(Duration::from_secs(60), Some(store), 1);
    let specs = token_and_user(100, 0);
    assert!(w.check(&specs, "first", 1).await.refused.is_none());
    // Both on this machine, the clocks agree; this host now believes Redis's 10 s behind.
    w.redis().unwrap().assume_offset_ms(-10_000);
    assert!(w.check(&specs, "second", 1).await.refused.is_none());
    assert!(!w.degraded(), "an answering Redis is no failure");
    let key = &RedisWindows::window_keys(&specs)[0];
    assert_eq!(zcard(&redis, key).await, 2, "both requests are Redis's");
}

/// The first window call of a replica, before it has heard Redis's clock, is bounded like
/// every other: cut by the timeout while Redis stalls, it books nothing when Redis wakes
/// (the local store decided its request). Another replica had loaded the script, so the
/// stalled `EVALSHA` would run (s25 open item: the first calls carried no `valid_until`
/// and were booked in both stores).
#[tokio::test]
async fn a_replicas_first_call_cut_by_the_timeout_books_nothing_when_redis_wakes() {
    let redis = RedisServer::start().await;
    let loaded = redis
        .cli(&[
            "SCRIPT",
            "LOAD",
            include_str!("../../src/ratelimit/window.lua"),
        ])
        .await;
    assert!(loaded.is_some(), "another replica's script load");
    let store = RedisWindows::new(&redis.url(), Duration::from_millis(50)).unwrap();
    store.ping().await.unwrap();
    let w = Windows::new(Duration::from_secs(60), Some(store), 1);
    let specs = token_and_user(100, 0);

    redis.signal("-STOP");
    assert!(w.check(&specs, "first", 1).await.refused.is_none());
    assert!(w.degraded(), "cut by the timeout: the local store decided");
    // Past the timeout and its margin (`LATE_MARGIN_MS`).
    tokio::time::sleep(Duration::from_millis(1_300)).await;
    redis.signal("-CONT");
    let key = &RedisWindows::window_keys(&specs)[0];
    assert_eq!(
        zcard(&redis, key).await,
        0,
        "booked by the local store only"
    );
}

/// What `Proxy` does to the next window call (`EVALSHA`/`EVAL`) it sees after `skip`
/// others.
#[derive(Clone, Copy)]
enum Tamper {
    /// Forwards the call `by` late: Redis runs it only after its caller gave up.
    Hold { skip: u32, by: Duration },
    /// Lowers the Redis time (the last integer) its answer carries by `ms`: the caller
    /// learns a clock that is off.
    Backdate { skip: u32, ms: i64 },
}

/// A TCP proxy in front of a real `redis-server` that forwards everything as it comes, but
/// for one window call it was told to hold or whose answer it was told to backdate: what no
/// signal to the server can time, since the call to tamper with follows another within
/// microseconds.
struct Proxy {
    port: u16,
    tamper: std::sync::Arc<std::sync::Mutex<Option<Tamper>>>,
}

impl Proxy {
    async fn start(redis: &RedisServer) -> Proxy {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let tamper = std::sync::Arc::new(std::sync::Mutex::new(None::<Tamper>));
        let upstream = redis.port;
        let shared = tamper.clone();
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let server = tokio::net::TcpStream::connect(("127.0.0.1", upstream))
                    .await
                    .unwrap();
                let (mut cr, mut cw) = client.into_split();
                let (mut sr, mut sw) = server.into_split();
                // Set when the call whose answer is to be backdated went out.
                let backdate = std::sync::Arc::new(std::sync::Mutex::new(None::<i64>));
                let (tamper, to_backdate) = (shared.clone(), backdate.clone());
                tokio::spawn(async move {
                    let mut buf = vec![0u8; 64 * 1024];
                    while let Ok(n @ 1..) = cr.read(&mut buf).await {
                        let chunk = &buf[..n];
                        let is_call = chunk.windows(4).any(|w| w == b"EVAL");
                        let mut hold = Duration::ZERO;
                        if is_call {
                            let mut t = tamper.lock().unwrap();
                            match *t {
                                Some(Tamper::Hold { skip: 0, by }) => {
                                    hold = by;
                                    *t = None;
                                }
                                Some(Tamper::Backdate { skip: 0, ms }) => {
                                    *to_backdate.lock().unwrap() = Some(ms);
                                    *t = None;
                                }
                                Some(Tamper::Hold { ref mut skip, .. })
                                | Some(Tamper::Backdate { ref mut skip, .. }) => *skip -= 1,
                                None => {}
                            }
                        }
                        if !hold.is_zero() {
                            tokio::time::sleep(hold).await;
                        }
                        if sw.write_all(chunk).await.is_err() {
                            return;
                        }
                    }
                });
                tokio::spawn(async move {
                    let mut buf = vec![0u8; 64 * 1024];
                    while let Ok(n @ 1..) = sr.read(&mut buf).await {
                        let mut chunk = buf[..n].to_vec();
                        let ms = backdate.lock().unwrap().take();
                        if let Some(ms) = ms {
                            chunk = backdated(&chunk, ms);
                        }
                        if cw.write_all(&chunk).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        Proxy { port, tamper }
    }

    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/0", self.port)
    }

    fn tamper(&self, t: Tamper) {
        *self.tamper.lock().unwrap() = Some(t);
    }
}

/// A RESP array answer whose last integer (`window.lua`'s Redis time) is `ms` lower.
fn backdated(answer: &[u8], ms: i64) -> Vec<u8> {
    let text = std::str::from_utf8(answer).expect("a window call's answer is text");
    let body = text.strip_suffix("\r\n").expect("one whole answer");
    let (head, last) = body.rsplit_once("\r\n:").expect("an array of integers");
    let now: i64 = last.parse().expect("Redis's time in ms");
    format!("{head}\r\n:{}\r\n", now - ms).into_bytes()
}

/// The members of the sorted set at `key`: the requests a window booked in Redis.
async fn zcard(redis: &RedisServer, key: &str) -> i64 {
    redis
        .cli(&["ZCARD", key])
        .await
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

/// The call made again after one judged late is bounded by the clock its answer showed:
/// cut by the timeout while Redis stalls, the local store decides its request, and when
/// Redis runs it past that bound it books nothing (s26 final attack #3: made again without
/// a bound, it was booked in both stores).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_after_a_late_judgment_cut_by_the_timeout_books_nothing_when_redis_runs_it() {
    let redis = RedisServer::start().await;
    let proxy = Proxy::start(&redis).await;
    let store = RedisWindows::new(&proxy.url(), Duration::from_millis(200)).unwrap();
    let w = Windows::new(Duration::from_secs(60), Some(store), 1);
    let specs = token_and_user(100, 0);
    assert!(w.check(&specs, "first", 1).await.refused.is_none());
    let key = &RedisWindows::window_keys(&specs)[0];
    assert_eq!(zcard(&redis, key).await, 1);
    redis.cli(&["CONFIG", "RESETSTAT"]).await.unwrap();

    // This host believes Redis's clock 10 s behind: the next call is judged late, answered
    // in time; the one made again is held past the timeout and its margin
    // (`LATE_MARGIN_MS`).
    w.redis().unwrap().assume_offset_ms(-10_000);
    let held = Duration::from_millis(1_800);
    proxy.tamper(Tamper::Hold { skip: 1, by: held });
    let asked = std::time::Instant::now();
    assert!(w.check(&specs, "second", 1).await.refused.is_none());
    assert!(w.degraded(), "cut by the timeout: the local store decided");
    // The held call reaches Redis and runs.
    tokio::time::sleep(held.saturating_sub(asked.elapsed()) + Duration::from_millis(300)).await;
    let seen = redis.cli(&["INFO", "commandstats"]).await.unwrap();
    assert!(seen.contains("cmdstat_evalsha:calls=2,"), "{seen}");
    assert_eq!(
        zcard(&redis, key).await,
        1,
        "the retry was booked by the local store only"
    );
}

/// A call made again after a late judgment and judged late again, against the clock the
/// same node showed one round trip earlier, is a failure the caller degrades over: this
/// host's estimate of Redis's clock cannot be trusted, and a third call without a bound
/// would book twice if Redis stalled during it (s26 final attack #3).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_judged_late_again_after_learning_the_clock_degrades_and_books_nothing_in_redis() {
    let redis = RedisServer::start().await;
    let proxy = Proxy::start(&redis).await;
    let store = RedisWindows::new(&proxy.url(), TIMEOUT).unwrap();
    let w = Windows::new(Duration::from_secs(60), Some(store), 1);
    let specs = token_and_user(100, 0);
    assert!(w.check(&specs, "first", 1).await.refused.is_none());
    redis.cli(&["CONFIG", "RESETSTAT"]).await.unwrap();

    // Judged late, and its answer shows a clock 10 s behind Redis's own, as a clock stepped
    // between the two calls would: the call made again is judged late too.
    w.redis().unwrap().assume_offset_ms(-10_000);
    proxy.tamper(Tamper::Backdate {
        skip: 0,
        ms: 10_000,
    });
    let d = w.check(&specs, "second", 1).await;
    assert!(d.refused.is_none(), "decided locally, not refused: {d:?}");
    assert!(w.degraded(), "judged late twice: a failure");
    let seen = redis.cli(&["INFO", "commandstats"]).await.unwrap();
    assert!(
        seen.contains("cmdstat_evalsha:calls=2,"),
        "no third call: {seen}"
    );
    let key = &RedisWindows::window_keys(&specs)[0];
    assert_eq!(
        zcard(&redis, key).await,
        1,
        "booked by the local store only"
    );
}
