//! The connections behind the Redis window store, for each topology `[redis]` can name: one
//! server, a Redis Cluster, or a master found through Sentinel.
//!
//! One connection per thread, whatever the topology: a multiplexed connection's I/O — and a
//! cluster connection's routing task with its connection to every node — runs as a task on
//! the runtime that created it. Shared by every HTTP worker, that was another thread, so each
//! `EVALSHA` cost four thread switches on top of its round trip; a connection of the worker's
//! own keeps the whole round trip on the thread that awaits it.
//!
//! - One server: an auto-reconnecting `ConnectionManager`.
//! - Cluster: the `redis` crate's `ClusterConnection`. It routes each call to the node that
//!   owns its keys' slot, follows `MOVED` (and refreshes its slot map) and `ASK` (a slot
//!   being migrated), and after a failover learns the promoted replica from the nodes left.
//! - Sentinel: a `ConnectionManager` to the master the sentinels name. Any failure forgets
//!   that master; the next call (the degraded store's probe, `Windows`) asks the sentinels
//!   again, so a promoted replica is found and a demoted master, which now refuses writes
//!   (`READONLY`), is left.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread::ThreadId;
use std::time::Duration;

use parking_lot::Mutex;
use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster::{ClusterClient, ClusterClientBuilder, ClusterConfig};
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{MultipleNodeRoutingInfo, ResponsePolicy, RoutingInfo};
use redis::sentinel::{SentinelClient, SentinelNodeConnectionInfo, SentinelServerType};
use redis::{Cmd, Pipeline, RedisFuture, RedisResult, Value};

use super::WindowError;
use crate::config::RedisTopology;

/// One thread's connection, whichever the topology.
#[derive(Clone)]
pub enum Conn {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Conn::Single(c) => c.req_packed_command(cmd),
            Conn::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Conn::Single(c) => c.req_packed_commands(pipeline, offset, count),
            Conn::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Conn::Single(c) => c.get_db(),
            Conn::Cluster(c) => c.get_db(),
        }
    }
}

impl Conn {
    /// `PING` where it tells whether windows can be kept: the server, or on a cluster every
    /// master the client knows (a master down before its replica is promoted fails it).
    pub async fn ping(&mut self) -> RedisResult<()> {
        match self {
            Conn::Single(c) => redis::cmd("PING").query_async::<String>(c).await.map(drop),
            Conn::Cluster(c) => {
                let all_masters = RoutingInfo::MultiNode((
                    MultipleNodeRoutingInfo::AllMasters,
                    Some(ResponsePolicy::AllSucceeded),
                ));
                c.route_command(redis::cmd("PING"), all_masters)
                    .await
                    .map(drop)
            }
        }
    }
}

/// How often the cluster client retries one call (see `Connector::new`).
const RETRIES: u32 = 20;

// One per process, made once: the variants' sizes do not matter.
#[allow(clippy::large_enum_variant)]
enum Target {
    Single {
        client: redis::Client,
        config: ConnectionManagerConfig,
    },
    Cluster {
        client: ClusterClient,
    },
    Sentinel(SentinelTarget),
}

struct SentinelTarget {
    sentinel: tokio::sync::Mutex<SentinelClient>,
    config: ConnectionManagerConfig,
    /// The master the sentinels named last, with a generation (`None` after a failure).
    master: Mutex<Option<(u64, redis::Client)>>,
    generation: AtomicU64,
}

impl SentinelTarget {
    /// Takes `client` as the master under a new generation, which it returns: each thread's
    /// connection to the one before is replaced at its next call.
    fn take_master(&self, client: &redis::Client) -> u64 {
        let mut master = self.master.lock();
        let g = self.generation.fetch_add(1, Ordering::Relaxed) + 1;
        *master = Some((g, client.clone()));
        g
    }
}

/// Hands each thread its connection (made lazily, on the thread's runtime).
pub struct Connector {
    target: Target,
    /// Each thread's connection, with the Sentinel master generation it was made for (0 for
    /// the other topologies). Thread ids are never reused.
    conns: Mutex<HashMap<ThreadId, (u64, Conn)>>,
}

impl Connector {
    /// Checks the URLs now; connects at the first call, so a Redis that is down at start only
    /// degrades limiting. `timeout` bounds every answer; connecting gets at least 200 ms.
    pub fn new(topology: &RedisTopology, timeout: Duration) -> Result<Self, WindowError> {
        let connect = timeout.max(Duration::from_millis(200));
        let manager = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(connect))
            .set_response_timeout(Some(timeout))
            .set_number_of_retries(1);
        let target = match topology {
            RedisTopology::Single(url) => {
                let client = redis::Client::open(url.as_str())?;
                ConnectionManager::new_lazy_with_config(client.clone(), manager.clone())?;
                Target::Single {
                    client,
                    config: manager,
                }
            }
            RedisTopology::Cluster(nodes) => {
                // The caller bounds every call by `timeout` (the local window serves past
                // it), so the client retries as often as fits: a slot being migrated answers
                // `TRYAGAIN` to a call whose keys are only partly on the importing node (a
                // new window, say) until the slot is handed over, milliseconds later in a
                // `--cluster reshard`. Giving up earlier sent those requests to the local
                // window. Waits are drawn between 1 ms and a fifth of the timeout, so 20
                // retries outlast the timeout; a dropped call stops retrying. (Not many more:
                // the client computes 2^retry × 10 ms, which overflows past 60 retries and
                // panics its routing task.) The client's own overall bound is left off, so
                // that a `MOVED` or `ASK` landing just inside the caller's bound is not cut
                // short.
                let max_wait = (timeout.as_millis() as u64 / 5).max(2);
                let client = ClusterClientBuilder::new(nodes.iter().map(String::as_str))
                    .connection_timeout(connect)
                    .response_timeout(timeout)
                    .overall_response_timeout(None)
                    .retries(RETRIES)
                    .min_retry_wait(1)
                    .max_retry_wait(max_wait)
                    .build()?;
                Target::Cluster { client }
            }
            RedisTopology::Sentinel {
                sentinels,
                master_name,
                master_password,
            } => Target::Sentinel(SentinelTarget {
                sentinel: tokio::sync::Mutex::new(SentinelClient::build(
                    sentinels.iter().map(String::as_str).collect(),
                    master_name.clone(),
                    master_password.as_ref().map(|p| {
                        SentinelNodeConnectionInfo::default().set_redis_connection_info(
                            redis::RedisConnectionInfo::default().set_password(p),
                        )
                    }),
                    SentinelServerType::Master,
                )?),
                config: manager,
                master: Mutex::new(None),
                generation: AtomicU64::new(0),
            }),
        };
        Ok(Self {
            target,
            conns: Mutex::new(HashMap::new()),
        })
    }

    /// This thread's connection. Under Sentinel, asks the sentinels for the master first
    /// when none is known (at the first call, and after a failure).
    pub async fn conn(&self) -> Result<Conn, WindowError> {
        let master = match &self.target {
            Target::Sentinel(_) => Some(self.sentinel_master().await?),
            _ => None,
        };
        let generation = master.as_ref().map_or(0, |(g, _)| *g);
        let me = std::thread::current().id();
        let mut conns = self.conns.lock();
        if let Some((g, c)) = conns.get(&me) {
            if *g == generation {
                return Ok(c.clone());
            }
        }
        let c = match (&self.target, master) {
            (Target::Single { client, config }, _) => Conn::Single(
                ConnectionManager::new_lazy_with_config(client.clone(), config.clone())?,
            ),
            (Target::Cluster { client }, _) => {
                Conn::Cluster(client.get_pending_async_connection_with_config(ClusterConfig::new()))
            }
            // The master named when this call began: if the probe moved it since, the next
            // call gets the new one.
            (Target::Sentinel(s), Some((_, client))) => Conn::Single(
                ConnectionManager::new_lazy_with_config(client, s.config.clone())?,
            ),
            (Target::Sentinel(_), None) => return Err(WindowError::NoMaster),
        };
        conns.insert(me, (generation, c.clone()));
        Ok(c)
    }

    /// A call failed. Under Sentinel the master may have changed: forget it, so the next call
    /// asks the sentinels. A cluster connection is made afresh from the seed nodes: it
    /// repairs itself after a failover, but one whose routing task has ended (a panic in the
    /// client) would fail every call for good. A connection manager reconnects by itself.
    pub fn failed(&self) {
        match &self.target {
            Target::Sentinel(s) => {
                s.master.lock().take();
            }
            Target::Cluster { .. } => {
                self.conns.lock().remove(&std::thread::current().id());
            }
            Target::Single { .. } => {}
        }
    }

    /// Under Sentinel, asks the sentinels which master they name now and switches to it when
    /// it moved. A master demoted on purpose (`SENTINEL FAILOVER`, maintenance) keeps
    /// accepting writes until the sentinels reconfigure it, up to ten seconds later: without
    /// this, windows would be booked where they are about to be discarded. Other topologies:
    /// nothing to do.
    pub async fn refresh(&self) -> Result<(), WindowError> {
        let Target::Sentinel(s) = &self.target else {
            return Ok(());
        };
        let Some((_, current)) = s.master.lock().clone() else {
            return Ok(());
        };
        let named = s.sentinel.lock().await.async_get_client().await?;
        if named.get_connection_info().addr() != current.get_connection_info().addr() {
            s.take_master(&named);
            tracing::warn!(
                master = %named.get_connection_info().addr(),
                "Redis Sentinel moved the master for rate-limit windows"
            );
        }
        Ok(())
    }

    /// The master the sentinels name (asked once at a time; the caller bounds the wait).
    async fn sentinel_master(&self) -> Result<(u64, redis::Client), WindowError> {
        let Target::Sentinel(s) = &self.target else {
            return Err(WindowError::NoMaster);
        };
        if let Some(m) = s.master.lock().clone() {
            return Ok(m);
        }
        let mut sentinel = s.sentinel.lock().await;
        // Another caller may have asked while this one waited for the lock.
        if let Some(m) = s.master.lock().clone() {
            return Ok(m);
        }
        let client = sentinel.async_get_client().await?;
        let g = s.take_master(&client);
        tracing::info!(
            master = %client.get_connection_info().addr(),
            "Redis Sentinel named the master for rate-limit windows"
        );
        Ok((g, client))
    }

    /// `single`, `cluster` or `sentinel`: for logs and metrics.
    pub fn kind(&self) -> &'static str {
        match self.target {
            Target::Single { .. } => "single",
            Target::Cluster { .. } => "cluster",
            Target::Sentinel(_) => "sentinel",
        }
    }
}
