//! The Redis window store: `window.lua` runs the whole check-and-add atomically in one
//! `EVALSHA`, on one server, a Redis Cluster or a Sentinel-watched master (`redis_conn.rs`
//! hands out the connections). Every call is bounded by `ratelimit.redis_timeout_ms`; the
//! caller falls back to the local store on any error.
//!
//! On a cluster, every key of one call carries the same hash tag and so lives in one slot:
//! a script call never spans nodes (no `CROSSSLOT`), and it stays atomic.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use redis::Script;

use super::redis_conn::{Conn, Connector};
use super::{Decision, Refused, WindowError, WindowSpec};
use crate::config::RedisTopology;

const WINDOW_LUA: &str = include_str!("window.lua");
const CORRECT_LUA: &str = include_str!("correct.lua");
/// Key prefix with a version: a change of the script's data layout changes the prefix, so
/// that replicas on two layouts never read each other's keys as their own. v1 named keys
/// `sl:v1:rq:t:12`; v2 hash-tags them (`sl:v2:{u:7}:t:12:rq`, `sl:v2:{cool}:<id>`). A fleet
/// must not mix versions across a change (see docs/DESIGN.md, stage 3).
const PREFIX: &str = "sl:v2";

/// How long past its timeout a window call may still book when Redis runs it (`window.lua`'s
/// `valid_until`). Its caller estimates Redis's clock from the last answer; the margin
/// covers that estimate's error and the clocks of a cluster's nodes, which may differ a
/// little — a node judged ahead by more than this would refuse every call as late.
const LATE_MARGIN_MS: i64 = 1_000;

/// `RedisWindows::offset_ms` before any answer.
const UNKNOWN: i64 = i64::MIN;

pub struct RedisWindows {
    connector: Connector,
    /// A cluster's seed nodes, asked apart at start whether they are cluster nodes at all.
    seeds: Vec<String>,
    window: Script,
    correct: Script,
    timeout: Duration,
    /// Redis's clock less this host's, in ms, as the last window call's answer showed it
    /// (`UNKNOWN` before one).
    offset_ms: AtomicI64,
}

impl RedisWindows {
    /// One server at `url`. Connects lazily: a Redis that is down at start only degrades
    /// limiting.
    pub fn new(url: &str, timeout: Duration) -> Result<Self, WindowError> {
        Self::with_topology(&RedisTopology::Single(url.to_string()), timeout)
    }

    /// One server, a cluster or a Sentinel-watched master; connects lazily as `new` does.
    pub fn with_topology(topology: &RedisTopology, timeout: Duration) -> Result<Self, WindowError> {
        Ok(Self {
            connector: Connector::new(topology, timeout)?,
            seeds: match topology {
                RedisTopology::Cluster(nodes) => nodes.clone(),
                _ => Vec::new(),
            },
            window: Script::new(WINDOW_LUA),
            correct: Script::new(CORRECT_LUA),
            timeout,
            offset_ms: AtomicI64::new(UNKNOWN),
        })
    }

    /// `single`, `cluster` or `sentinel`.
    pub fn topology_kind(&self) -> &'static str {
        self.connector.kind()
    }

    /// Runs `call` on this thread's connection within `bound` (connecting, and under
    /// Sentinel finding the master, included). A failure tells the connector, which forgets
    /// a Sentinel master that may have changed.
    ///
    /// The call is boxed: nested inline, the futures of the connectors and the redis client
    /// made the request handler's future type deeper than rustc's layout limit. One
    /// allocation next to a network round trip.
    async fn run<'a, T, F, Fut>(&'a self, bound: Duration, call: F) -> Result<T, WindowError>
    where
        F: FnOnce(Conn) -> Fut + Send + 'a,
        Fut: Future<Output = redis::RedisResult<T>> + Send + 'a,
        T: Send + 'a,
    {
        let call: Pin<Box<dyn Future<Output = Result<T, WindowError>> + Send + 'a>> =
            Box::pin(async move {
                let conn = self.connector.conn().await?;
                Ok(call(conn).await?)
            });
        let result = tokio::time::timeout(bound, call)
            .await
            .unwrap_or(Err(WindowError::Timeout));
        if result.is_err() {
            self.connector.failed();
        }
        result
    }

    /// `sl:v2:{u:7}:t:12:rq` / `…:tk`: the spec's name keeps its hash tag (see `WindowSpec`).
    fn keys(spec: &WindowSpec) -> (String, String) {
        (
            format!("{PREFIX}:{}:rq", spec.key),
            format!("{PREFIX}:{}:tk", spec.key),
        )
    }

    /// The key holding an upstream key's shared cooldown. Every cooldown is read in one
    /// `MGET`, so they all share the `{cool}` hash tag (one slot on a cluster).
    pub fn cool_key(upstream_id: &str) -> String {
        format!("{PREFIX}:{{cool}}:{upstream_id}")
    }

    /// The KEYS of one `correct.lua` call: the tokens key of each window with a token limit.
    pub fn correct_keys(specs: &[WindowSpec]) -> Vec<String> {
        specs
            .iter()
            .filter(|s| s.tokens > 0)
            .map(|s| Self::keys(s).1)
            .collect()
    }

    /// The KEYS of one `window.lua` call: each window's requests key, then its tokens key.
    pub fn window_keys(specs: &[WindowSpec]) -> Vec<String> {
        let mut keys = Vec::with_capacity(specs.len() * 2);
        for s in specs {
            let (rk, tk) = Self::keys(s);
            keys.push(rk);
            keys.push(tk);
        }
        keys
    }

    pub async fn check(
        &self,
        specs: &[WindowSpec],
        member: &str,
        tokens: u64,
        window: Duration,
    ) -> Result<Decision, WindowError> {
        // A call cut by the timeout may still run once Redis wakes: past `valid_until` (on
        // Redis's clock) it books nothing, since the local store has decided its request.
        // Before any answer Redis's clock is unknown, so it is read first: one round trip
        // per replica, not an unbounded first call.
        if self.offset_ms.load(Ordering::Relaxed) == UNKNOWN {
            self.learn_clock().await?;
        }
        let sent = wall_ms();
        let mut r = self
            .call_window(specs, (member, tokens, window), self.valid_until(sent))
            .await?;
        self.learn(r.get(8), sent);
        if r.get(7) == Some(&3) {
            // Answered in time, yet judged late: this host's estimate of Redis's clock was
            // off (a clock stepped, a node ahead of the one last heard). Redis answers, so
            // this is no failure to degrade over (s25 stop attack F2): learned again above,
            // the call is made again, bounded by the clock just learned — without a bound,
            // a retry cut by the timeout while Redis stalls would still book when Redis
            // wakes, after the local store decided its request (s26 final attack #3).
            let sent = wall_ms();
            r = self
                .call_window(specs, (member, tokens, window), self.valid_until(sent))
                .await?;
            self.learn(r.get(8), sent);
            if r.get(7) == Some(&3) {
                // Judged late by the node whose clock was learned one round trip ago: the
                // estimate cannot be trusted (this host's clock steps, or the answers lie
                // about Redis's time). A failure the caller degrades over, not a third call.
                return Err(WindowError::Late);
            }
        }
        let at = |i: usize| r.get(i).copied().unwrap_or(0);
        let ms = |i: usize| Duration::from_millis(at(i).max(0) as u64);
        let spec0 = specs.first();
        Ok(Decision {
            refused: match (at(0), at(7)) {
                (1, _) => None,
                (_, 2) => Some(Refused::Tokens),
                _ => Some(Refused::Requests),
            },
            retry_after: ms(1),
            requests_limit: spec0.map_or(0, |s| s.requests),
            requests_used: at(2).max(0) as u64,
            requests_reset: ms(3),
            tokens_limit: spec0.map_or(0, |s| s.tokens),
            tokens_used: at(4).max(0) as u64,
            tokens_reset: ms(5),
            second: at(6),
        })
    }

    /// The instant on Redis's clock past which a call sent at `sent` (this host's ms) books
    /// nothing: its timeout and `LATE_MARGIN_MS` later; 0 (no bound) before Redis's clock
    /// is known.
    fn valid_until(&self, sent: i64) -> i64 {
        match self.offset_ms.load(Ordering::Relaxed) {
            UNKNOWN => 0,
            offset => {
                let timeout = i64::try_from(self.timeout.as_millis()).unwrap_or(i64::MAX);
                sent.saturating_add(offset)
                    .saturating_add(timeout)
                    .saturating_add(LATE_MARGIN_MS)
            }
        }
    }

    /// Learns Redis's clock from `redis_now`, its time in ms read between `sent` and now on
    /// this host's clock (a window call's answer carries it).
    fn learn(&self, redis_now: Option<&i64>, sent: i64) {
        if let Some(&redis_now) = redis_now {
            let midway = sent + (wall_ms() - sent) / 2;
            self.offset_ms
                .store(redis_now.saturating_sub(midway), Ordering::Relaxed);
        }
    }

    /// Learns Redis's clock from its `TIME` (seconds and microseconds, as text).
    async fn learn_clock(&self) -> Result<(), WindowError> {
        let sent = wall_ms();
        let (secs, micros): (i64, i64) = self
            .run(self.timeout, |mut c| async move {
                redis::cmd("TIME").query_async(&mut c).await
            })
            .await?;
        let redis_now = secs.saturating_mul(1_000).saturating_add(micros / 1_000);
        self.learn(Some(&redis_now), sent);
        Ok(())
    }

    /// One `window.lua` call.
    async fn call_window(
        &self,
        specs: &[WindowSpec],
        (member, tokens, window): (&str, u64, Duration),
        valid_until: i64,
    ) -> Result<Vec<i64>, WindowError> {
        let mut inv = self.window.prepare_invoke();
        for k in Self::window_keys(specs) {
            inv.key(k);
        }
        inv.arg(window.as_millis() as u64).arg(member).arg(tokens);
        for s in specs {
            inv.arg(s.requests).arg(s.tokens);
        }
        inv.arg(valid_until);
        self.run(self.timeout, |mut c| async move {
            inv.invoke_async(&mut c).await
        })
        .await
    }

    /// Sets this host's estimate of Redis's clock (ms ahead of this host's): for tests of a
    /// wrong estimate, as a clock step leaves it.
    #[doc(hidden)]
    pub fn assume_offset_ms(&self, ms: i64) {
        self.offset_ms.store(ms, Ordering::Relaxed);
    }

    /// Corrects a booking of `second` by `delta` (`correct.lua`): in its bucket while that
    /// is in the `window`, else a positive delta in the current second.
    pub async fn correct(
        &self,
        specs: &[WindowSpec],
        (second, delta): (i64, i64),
        window: Duration,
    ) -> Result<(), WindowError> {
        let keys = Self::correct_keys(specs);
        if keys.is_empty() {
            return Ok(());
        }
        // One call for every window of the booking: their keys share a hash slot.
        let mut inv = self.correct.prepare_invoke();
        for k in keys {
            inv.key(k);
        }
        inv.arg(second).arg(delta).arg(window.as_millis() as u64);
        self.run(self.timeout, |mut c| async move {
            inv.invoke_async::<i64>(&mut c).await
        })
        .await?;
        Ok(())
    }

    /// Follows a master Sentinel moved while this one still answers (see
    /// `Connector::refresh`); bounded like a probe.
    pub async fn refresh_topology(&self) -> Result<(), WindowError> {
        tokio::time::timeout(
            self.timeout.max(Duration::from_millis(200)),
            self.connector.refresh(),
        )
        .await
        .unwrap_or(Err(WindowError::Timeout))
    }

    /// Whether windows can be kept: the server (on a cluster, every master) answers.
    pub async fn ping(&self) -> Result<(), WindowError> {
        self.run(
            self.timeout.max(Duration::from_millis(200)),
            |mut c| async move { c.ping().await },
        )
        .await
    }

    /// Shares key-pool cooldowns between replicas in one round trip: publishes this
    /// replica's new cooldowns (`id`, until in epoch ms, time to live) and reads everyone's
    /// as the milliseconds left (`PTTL`, Redis's own clock): an instant on the publisher's
    /// clock means another time on a replica whose clock differs (s24 attack, resilience
    /// #4). The value stays the instant, which hosts of the previous version read.
    pub async fn sync_cooldowns(
        &self,
        publish: &[(String, i64, u64)],
        ids: &[String],
    ) -> Result<Vec<Option<u64>>, WindowError> {
        let mut pipe = redis::pipe();
        for (id, until, ttl_ms) in publish {
            pipe.cmd("SET")
                .arg(Self::cool_key(id))
                .arg(until)
                .arg("PX")
                .arg((*ttl_ms).max(1))
                .ignore();
        }
        for id in ids {
            pipe.cmd("PTTL").arg(Self::cool_key(id));
        }
        // -2: no such key; -1: no expiry (never written so by the gateway).
        let left: Vec<i64> = self
            .run(
                self.timeout.max(Duration::from_millis(200)),
                |mut c| async move { pipe.query_async(&mut c).await },
            )
            .await?;
        Ok(left
            .into_iter()
            .map(|ms| u64::try_from(ms).ok().filter(|ms| *ms > 0))
            .collect())
    }

    /// Ends a key's shared cooldown (an admin enabled it): left in Redis, every replica's
    /// next exchange would put it back.
    pub async fn clear_cooldown(&self, id: &str) -> Result<(), WindowError> {
        let key = Self::cool_key(id);
        self.run(self.timeout.max(Duration::from_millis(200)), |mut c| {
            let key = key.clone();
            async move { redis::cmd("DEL").arg(key).query_async::<()>(&mut c).await }
        })
        .await
    }

    /// What is wrong with the topology as configured, if the server says so: a `url`
    /// without `cluster = true` that points at a Redis Cluster node would be answered
    /// `MOVED` for most slots, leaving the windows local on every replica.
    pub async fn topology_mismatch(&self) -> Result<Option<String>, WindowError> {
        if self.connector.kind() == "cluster" {
            return Ok(self.plain_seed().await.then(|| {
                "redis.cluster = true, but redis.url names a server with cluster support \
                 disabled: no window can be kept there and rate limits fall back to \
                 per-replica local windows; set redis.cluster = false for one server"
                    .to_string()
            }));
        }
        if self.connector.kind() != "single" {
            return Ok(None);
        }
        let cmd = redis::cmd("INFO").arg("cluster").clone();
        let info: String = self
            .run(Duration::from_secs(1), |mut c| async move {
                cmd.query_async(&mut c).await
            })
            .await?;
        Ok(info.contains("cluster_enabled:1").then(|| {
            "redis.url points at a Redis Cluster node: set redis.cluster = true (and list \
             the cluster's nodes in redis.url), or keys on other nodes are answered MOVED \
             and rate limits fall back to per-replica local windows"
                .to_string()
        }))
    }

    /// Whether a seed node answers as a plain server (`cluster_enabled:0`), each asked on a
    /// connection of its own (a cluster connection cannot even be made to one).
    async fn plain_seed(&self) -> bool {
        for seed in &self.seeds {
            let asked = async {
                let client = redis::Client::open(seed.as_str())?;
                let mut c = client.get_multiplexed_async_connection().await?;
                redis::cmd("INFO")
                    .arg("cluster")
                    .query_async::<String>(&mut c)
                    .await
            };
            if let Ok(Ok(info)) = tokio::time::timeout(Duration::from_secs(1), asked).await {
                if info.contains("cluster_enabled:0") {
                    return true;
                }
            }
        }
        false
    }

    /// The eviction policy, to warn when limiter keys could be evicted (on a cluster, one
    /// node's: the nodes of one cluster are normally configured alike).
    pub async fn eviction_policy(&self) -> Result<String, WindowError> {
        let cmd = redis::cmd("CONFIG")
            .arg("GET")
            .arg("maxmemory-policy")
            .clone();
        let v: Vec<String> = self
            .run(Duration::from_secs(1), |mut c| async move {
                cmd.query_async(&mut c).await
            })
            .await?;
        Ok(v.get(1).cloned().unwrap_or_default())
    }
}

/// This host's wall clock in ms since the epoch (compared with Redis's `TIME`).
fn wall_ms() -> i64 {
    chrono::Utc::now().timestamp_millis()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// CRC16/XMODEM (polynomial 0x1021, initial 0), the hash Redis Cluster uses.
    fn crc16(bytes: &[u8]) -> u16 {
        let mut crc = 0u16;
        for &b in bytes {
            crc ^= u16::from(b) << 8;
            for _ in 0..8 {
                crc = if crc & 0x8000 != 0 {
                    (crc << 1) ^ 0x1021
                } else {
                    crc << 1
                };
            }
        }
        crc
    }

    /// A key's cluster slot: only the first non-empty `{…}` hash tag counts, when there is one.
    fn slot(key: &str) -> u16 {
        let hashed = key
            .find('{')
            .and_then(|open| {
                let rest = &key[open + 1..];
                rest.find('}')
                    .filter(|&len| len > 0)
                    .map(|len| &rest[..len])
            })
            .unwrap_or(key);
        crc16(hashed.as_bytes()) % 16384
    }

    fn one_slot(keys: &[String]) {
        let first = slot(&keys[0]);
        for k in keys {
            assert_eq!(slot(k), first, "CROSSSLOT on a cluster: {keys:?}");
            assert!(k.starts_with("sl:v2:"), "{k}");
        }
    }

    #[test]
    fn the_slot_function_agrees_with_redis() {
        // From the Redis Cluster specification and `CLUSTER KEYSLOT`.
        assert_eq!(crc16(b"123456789"), 0x31C3);
        assert_eq!(slot("foo"), 12182);
        assert_eq!(slot("{user1000}.following"), slot("{user1000}.followers"));
        // An empty first tag means the whole key is hashed; the tag ends at the first `}`.
        assert_eq!(slot("foo{}{bar}"), crc16(b"foo{}{bar}") % 16384);
        assert_eq!(slot("foo{{bar}}zap"), crc16(b"{bar") % 16384);
    }

    #[test]
    fn the_keys_of_one_script_call_share_a_cluster_slot() {
        for (user, token) in [(1, 2), (7, 12), (4242, 99), (3, 3)] {
            let specs = [
                WindowSpec::token(user, token, 10, 1000),
                WindowSpec::user(user, 20, 2000),
            ];
            let keys = RedisWindows::window_keys(&specs);
            assert_eq!(keys.len(), 4);
            one_slot(&keys);
            one_slot(&RedisWindows::correct_keys(&specs));
        }
        let key = [WindowSpec::upstream("openai-a", 60, 150_000)];
        let keys = RedisWindows::window_keys(&key);
        one_slot(&keys);
        assert!(keys.iter().all(|k| k.contains("{k:openai-a}")), "{keys:?}");
        // Every cooldown is read in one MGET.
        let cool: Vec<String> = ["a", "b", "openai-a", "anthropic-1"]
            .iter()
            .map(|id| RedisWindows::cool_key(id))
            .collect();
        one_slot(&cool);
        assert_eq!(RedisWindows::cool_key("openai-a"), "sl:v2:{cool}:openai-a");
        assert_eq!(
            RedisWindows::window_keys(&[WindowSpec::token(7, 12, 1, 1)]),
            ["sl:v2:{u:7}:t:12:rq", "sl:v2:{u:7}:t:12:tk"]
        );
    }
}
