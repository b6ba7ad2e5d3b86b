//! The Redis window store: `window.lua` runs the whole check-and-add atomically in one
//! `EVALSHA` on a multiplexed, auto-reconnecting connection. Every call is bounded by
//! `ratelimit.redis_timeout_ms`; the caller falls back to the local store on any error.
//!
//! One connection per thread: a multiplexed connection's I/O runs as a task on the runtime
//! that first used it. Shared by every HTTP worker, that was another thread, so each
//! `EVALSHA` cost four thread switches on top of its round trip; a connection of the
//! worker's own keeps the whole round trip on the thread that awaits it.

use std::collections::HashMap;
use std::thread::ThreadId;
use std::time::Duration;

use parking_lot::Mutex;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::Script;

use super::{Decision, Refused, WindowError, WindowSpec};

const WINDOW_LUA: &str = include_str!("window.lua");
const CORRECT_LUA: &str = include_str!("correct.lua");
/// Key prefix with a version: a change of the script's data layout changes the prefix.
const PREFIX: &str = "sl:v1";

pub struct RedisWindows {
    client: redis::Client,
    config: ConnectionManagerConfig,
    /// The connection of each thread that used Redis (thread ids are never reused).
    conns: Mutex<HashMap<ThreadId, ConnectionManager>>,
    window: Script,
    correct: Script,
    timeout: Duration,
}

impl RedisWindows {
    /// Connects lazily: a Redis that is down at start only degrades limiting.
    pub fn new(url: &str, timeout: Duration) -> Result<Self, WindowError> {
        let client = redis::Client::open(url)?;
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(timeout.max(Duration::from_millis(200))))
            .set_response_timeout(Some(timeout))
            .set_number_of_retries(1);
        // Checks the URL and config now rather than at the first request.
        ConnectionManager::new_lazy_with_config(client.clone(), config.clone())?;
        Ok(Self {
            client,
            config,
            conns: Mutex::new(HashMap::new()),
            window: Script::new(WINDOW_LUA),
            correct: Script::new(CORRECT_LUA),
            timeout,
        })
    }

    /// This thread's connection (connecting lazily, on this thread's runtime).
    fn conn(&self) -> Result<ConnectionManager, WindowError> {
        let me = std::thread::current().id();
        let mut conns = self.conns.lock();
        if let Some(c) = conns.get(&me) {
            return Ok(c.clone());
        }
        let c = ConnectionManager::new_lazy_with_config(self.client.clone(), self.config.clone())?;
        conns.insert(me, c.clone());
        Ok(c)
    }

    fn keys(spec: &WindowSpec) -> (String, String) {
        (
            format!("{PREFIX}:rq:{}", spec.key),
            format!("{PREFIX}:tk:{}", spec.key),
        )
    }

    /// The key holding an upstream key's shared cooldown (read for every key in one `MGET`).
    pub fn cool_key(upstream_id: &str) -> String {
        format!("{PREFIX}:cool:{upstream_id}")
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
        let mut inv = self.window.prepare_invoke();
        for k in Self::window_keys(specs) {
            inv.key(k);
        }
        inv.arg(window.as_millis() as u64).arg(member).arg(tokens);
        for s in specs {
            inv.arg(s.requests).arg(s.tokens);
        }
        let mut conn = self.conn()?;
        let r: Vec<i64> = tokio::time::timeout(self.timeout, inv.invoke_async(&mut conn))
            .await
            .map_err(|_| WindowError::Timeout)??;
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

    pub async fn correct(
        &self,
        specs: &[WindowSpec],
        second: i64,
        delta: i64,
    ) -> Result<(), WindowError> {
        for s in specs.iter().filter(|s| s.tokens > 0) {
            let (_, tk) = Self::keys(s);
            let mut conn = self.conn()?;
            let mut inv = self.correct.key(tk);
            inv.arg(second).arg(delta);
            tokio::time::timeout(self.timeout, inv.invoke_async::<i64>(&mut conn))
                .await
                .map_err(|_| WindowError::Timeout)??;
        }
        Ok(())
    }

    pub async fn ping(&self) -> Result<(), WindowError> {
        let mut conn = self.conn()?;
        let cmd = redis::cmd("PING");
        let _: String = tokio::time::timeout(
            self.timeout.max(Duration::from_millis(200)),
            cmd.query_async(&mut conn),
        )
        .await
        .map_err(|_| WindowError::Timeout)??;
        Ok(())
    }

    /// Shares key-pool cooldowns between replicas in one round trip: publishes this
    /// replica's new cooldowns (`id`, until in epoch ms, time to live) and reads everyone's.
    pub async fn sync_cooldowns(
        &self,
        publish: &[(String, i64, u64)],
        ids: &[String],
    ) -> Result<Vec<Option<i64>>, WindowError> {
        let mut pipe = redis::pipe();
        for (id, until, ttl_ms) in publish {
            pipe.cmd("SET")
                .arg(Self::cool_key(id))
                .arg(until)
                .arg("PX")
                .arg((*ttl_ms).max(1))
                .ignore();
        }
        let keys: Vec<String> = ids.iter().map(|id| Self::cool_key(id)).collect();
        pipe.cmd("MGET").arg(&keys);
        let mut conn = self.conn()?;
        let (values,): (Vec<Option<i64>>,) = tokio::time::timeout(
            self.timeout.max(Duration::from_millis(200)),
            pipe.query_async(&mut conn),
        )
        .await
        .map_err(|_| WindowError::Timeout)??;
        Ok(values)
    }

    /// The eviction policy, to warn when limiter keys could be evicted.
    pub async fn eviction_policy(&self) -> Result<String, WindowError> {
        let mut conn = self.conn()?;
        let cmd = redis::cmd("CONFIG")
            .arg("GET")
            .arg("maxmemory-policy")
            .clone();
        let v: Vec<String> =
            tokio::time::timeout(Duration::from_secs(1), cmd.query_async(&mut conn))
                .await
                .map_err(|_| WindowError::Timeout)??;
        Ok(v.get(1).cloned().unwrap_or_default())
    }
}

