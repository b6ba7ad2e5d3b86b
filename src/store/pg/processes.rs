//! Gateway processes sharing a PostgreSQL database, across hosts (`store::processes`'s
//! functions, function for function). A pid means nothing on another host (and hosts may
//! share pid numbers), so liveness is told by two things the database sees:
//!
//! - the heartbeat: a process whose `seen_at` is older than `STALE_AFTER` (or that has no
//!   row) has stopped beating;
//! - its liveness lock: each gateway holds, for its whole life, a session-level advisory
//!   lock keyed by its process id on one connection of its own outside the pool
//!   (`hold_liveness`).
//!
//! A process is gone only when both say so: its heartbeat is stale AND no session holds its
//! lock (`dead_owners`, `prune`). A host paused past `STALE_AFTER` (SIGSTOP, a frozen VM or
//! container) keeps its TCP session — its kernel still answers — so its lock stays held and
//! its reservations are never taken for orphans, however long the pause (CHECKS Q14). A
//! process killed (`kill -9`, a crash) loses its sockets, PostgreSQL ends its session and
//! frees the lock at once, and it is gone as soon as its heartbeat is stale, as before. A
//! host that vanished (power loss, a partition) is noticed by the server-side TCP
//! keepalives every gateway session carries (`pg::KEEPALIVES`, about 30 s), then it is gone likewise. A process
//! that holds no lock (the previous version, during a rolling upgrade; a lock session lost
//! and not yet taken again) is judged by its heartbeat alone, as before the lock.
//!
//! The lock's key is the two-int4 form `(LIVENESS_NS, 32 bits of SHA-256 of the process
//! id)`, computed by the database (`key_of!`), so it never meets the bigint-keyed advisory
//! locks of the store (`ADMIN_WRITE_LOCK`, the audit chain's). Two process ids whose keys
//! collide (one in 2^32 per pair) can only make a gone process look alive while the other
//! lives — its reservations wait for that one's end — never a live one dead.
//!
//! Both ends of the heartbeat comparison are the database's clock, not the hosts': a beat
//! stamps `seen_at = clock_timestamp()` (a trigger on every write of `heartbeat_at`, so a
//! host still running the previous version's heartbeat during a rolling upgrade is stamped
//! too: `migrations/postgres/0002`), and the dead check and the prune compare it with
//! `clock_timestamp()` (the `now` they take is not used here). Hosts' clocks may disagree
//! by any amount — a host a minute or a day ahead does not take the others for dead and
//! settle their live reservations as orphans (`pg_clock_skew`: it did, at 15 s ahead).
//! `heartbeat_at` keeps the host's own time: leases are judged against it, both sides by
//! the owner's clock (`ledger::settle_orphans`, `Orphans::LeaseExpired`); a paused owner
//! does not beat, so its leases cannot run out against its heartbeat while it is paused,
//! and it renews them before its next beat (`ops::housekeeping`). Its next heartbeat
//! registers again a process whose row was pruned.

use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::postgres::PgConnection;
use sqlx::Connection;
use tokio::task::JoinHandle;

use super::PgDb;
use crate::clock::db_time;
use crate::store::processes::{Me, STALE_AFTER};
use crate::store::{Result, StoreError};

/// The second key of a process's liveness lock, as an SQL int4 expression of the text
/// expression `$id`: the first 32 bits of the SHA-256 of the process id. The database
/// computes it, for the lock it takes and for the locks it looks up, so both sides agree
/// whatever the host.
macro_rules! key_of {
    ($id:literal) => {
        concat!(
            "(('x' || substr(encode(sha256(convert_to(",
            $id,
            ", 'UTF8')), 'hex'), 1, 8))::bit(32)::int4)"
        )
    };
}

/// The second keys (as `objid`, an oid: the int4's 32 bits read unsigned) of the liveness
/// locks held in this database, namespace `$ns` (a parameter). The
/// two-int4 form shows in `pg_locks` as `classid` = first key, `objid` = second key,
/// `objsubid` = 2 (PostgreSQL docs, "pg_locks").
macro_rules! held_keys {
    ($ns:literal) => {
        concat!("SELECT l.objid FROM pg_locks l WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 2
         AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
         AND l.classid = ", $ns, "::int4::oid")
    };
}

/// Records a heartbeat, registering the process when its row is missing. Returns `true`
/// when the row had to be created (at start, or after another process pruned it).
pub async fn heartbeat(db: &PgDb, me: &Me, now: DateTime<Utc>) -> Result<bool> {
    let now = db_time(now);
    // `xmax = 0` only for a row this statement inserted (an updated row carries the
    // updating transaction's id there).
    let created: bool = sqlx::query_scalar(
        "INSERT INTO processes (id, host, pid, pid_start, started_at, heartbeat_at) VALUES ($1, $2, $3, $4, $5, $5)
         ON CONFLICT (id) DO UPDATE SET heartbeat_at = excluded.heartbeat_at
         RETURNING xmax = 0",
    )
    .bind(&me.id)
    .bind(&me.host)
    .bind(i64::from(me.pid))
    .bind(me.pid_start)
    .bind(&now)
    .fetch_one(&db.pool)
    .await?;
    Ok(created)
}

/// Forgets every registration (a restored copy: see `store::processes::forget_all`).
pub async fn forget_all(db: &PgDb) -> Result<()> {
    sqlx::query("DELETE FROM processes")
        .execute(&db.pool)
        .await?;
    Ok(())
}

pub async fn unregister(db: &PgDb, id: &str) -> Result<()> {
    sqlx::query("DELETE FROM processes WHERE id = $1")
        .bind(id)
        .execute(&db.pool)
        .await?;
    Ok(())
}

/// Owners of open reservations (other than `me`) that are gone: whose heartbeat is stale
/// by the database's clock, or who have no row at all, and whose liveness lock no session
/// holds. `_now` (this host's clock) is not used. A beat counts as no older than the
/// server's start: a restart ends every lock session and no host could beat while the
/// server was down, so for `STALE_AFTER` after it nobody is taken for gone — every live
/// host has beaten (and taken its lock again) by then.
pub async fn dead_owners(db: &PgDb, me: &Me, _now: DateTime<Utc>) -> Result<Vec<String>> {
    Ok(sqlx::query_scalar(concat!(
        "WITH held AS (", held_keys!("$3"), ")
         SELECT DISTINCT r.owner FROM reservations r LEFT JOIN processes p ON p.id = r.owner
         WHERE r.owner <> $1 AND (p.id IS NULL OR GREATEST(p.seen_at, pg_postmaster_start_time()) < clock_timestamp() - make_interval(secs => $2))
         AND ", key_of!("r.owner"), "::oid NOT IN (SELECT objid FROM held)"
    ))
    .bind(&me.id)
    .bind(stale_secs())
    .bind(LIVENESS_NS)
    .fetch_all(&db.pool)
    .await?)
}

/// The gateways running on the database (as `store::processes::running_in`): those whose
/// liveness lock is held, or whose heartbeat is within `STALE_AFTER` by the database's
/// clock (a process killed a moment ago counts until then: its row cannot tell).
pub async fn running_in(conn: &mut PgConnection) -> Result<Vec<String>> {
    Ok(sqlx::query_scalar(concat!(
        "WITH held AS (",
        held_keys!("$2"),
        ")
         SELECT host || ' pid ' || pid FROM processes
         WHERE seen_at >= clock_timestamp() - make_interval(secs => $1)
            OR ",
        key_of!("processes.id"),
        "::oid IN (SELECT objid FROM held)
         ORDER BY id"
    ))
    .bind(stale_secs())
    .bind(LIVENESS_NS)
    .fetch_all(conn)
    .await?)
}

/// Removes process rows that are gone (stale heartbeat by the database's clock, counted
/// from the server's start at the earliest as in `dead_owners`; liveness lock not held)
/// and that hold no reservation any more.
pub async fn prune(db: &PgDb, _me: &Me, _now: DateTime<Utc>) -> Result<()> {
    sqlx::query(concat!(
        "WITH held AS (",
        held_keys!("$2"),
        ")
         DELETE FROM processes WHERE GREATEST(seen_at, pg_postmaster_start_time()) < clock_timestamp() - make_interval(secs => $1)
         AND NOT EXISTS (SELECT 1 FROM reservations r WHERE r.owner = processes.id)
         AND ",
        key_of!("processes.id"),
        "::oid NOT IN (SELECT objid FROM held)"
    ))
    .bind(stale_secs())
    .bind(LIVENESS_NS)
    .execute(&db.pool)
    .await?;
    Ok(())
}

/// The namespace (first key) of every liveness lock: a fixed int4, so the two-int4 keys
/// never meet the store's bigint-keyed advisory locks (`ADMIN_WRITE_LOCK`, the audit
/// chain's), which `pg_locks` tells apart by `objsubid` (1 for a bigint key, 2 for two
/// int4 keys).
pub const LIVENESS_NS: i32 = 0x0511_CE17;

/// How often the lock's session is checked; a lost one is connected again and the lock
/// taken again, waiting at most `RETAKE_MAX` between tries.
const LOCK_CHECK: Duration = Duration::from_secs(2);
const LOCK_CHECK_TIMEOUT: Duration = Duration::from_secs(10);
const RETAKE_MAX: Duration = Duration::from_secs(5);

/// This process's liveness lock, held by a task of its own on one dedicated connection
/// (see the module doc). Dropping it ends the task and the session, which frees the lock.
#[derive(Debug)]
pub struct Liveness {
    task: JoinHandle<()>,
}

impl Drop for Liveness {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Takes `me`'s liveness lock on a connection of its own and keeps it for as long as the
/// returned `Liveness` lives, taking it again (connecting again with a bounded backoff)
/// when its session is lost. Fails when the first connection cannot be opened; a lock
/// another session holds (a key collision) is tried again in the background, not waited
/// for.
pub async fn hold_liveness(db: &PgDb, me: &Me) -> Result<Liveness> {
    let opts = db.pool.connect_options();
    let first = take(&opts, &me.id).await?;
    let task = tokio::spawn(keep(opts, me.id.clone(), first));
    Ok(Liveness { task })
}

/// Keeps the lock: checks its session every `LOCK_CHECK` (tries the lock again while
/// another session holds its key), and when the session is lost connects again — with a
/// backoff doubling up to `RETAKE_MAX` while the database is out of reach — and takes it
/// again.
async fn keep(
    opts: std::sync::Arc<sqlx::postgres::PgConnectOptions>,
    id: String,
    first: (PgConnection, bool),
) {
    let (mut conn, mut held) = first;
    loop {
        tokio::time::sleep(LOCK_CHECK).await;
        let checked = if held {
            tokio::time::timeout(LOCK_CHECK_TIMEOUT, conn.ping())
                .await
                .map(|r| r.map(|()| true).map_err(StoreError::from))
        } else {
            tokio::time::timeout(LOCK_CHECK_TIMEOUT, try_lock(&mut conn, &id)).await
        };
        match checked {
            Ok(Ok(now_held)) => {
                if now_held && !held {
                    tracing::info!(process = %id, "liveness lock taken");
                }
                held = now_held;
                continue;
            }
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "liveness lock's session lost; connecting again")
            }
            Err(_) => tracing::warn!("liveness lock's session did not answer; connecting again"),
        }
        drop(conn);
        let mut backoff = LOCK_CHECK;
        (conn, held) = loop {
            match take(&opts, &id).await {
                Ok(c) => break c,
                Err(e) => {
                    tracing::warn!(error = %e, retry_in = ?backoff, "liveness lock: cannot connect");
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(RETAKE_MAX);
                }
            }
        };
        if held {
            tracing::info!(process = %id, "liveness lock taken again");
        }
    }
}

/// Opens the lock's connection and tries the lock once: the connection and whether the
/// lock is held.
async fn take(opts: &sqlx::postgres::PgConnectOptions, id: &str) -> Result<(PgConnection, bool)> {
    let mut conn = tokio::time::timeout(LOCK_CHECK_TIMEOUT, super::open_session(opts))
        .await
        .map_err(|_| {
            sqlx::Error::Io(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "connecting for the liveness lock timed out",
            ))
        })??;
    // Its keepalives (`pg::KEEPALIVES`) come with the session's settings.
    // An operator's `idle_session_timeout` must not end the session of a paused host
    // (PostgreSQL 14 on; an older server does not know the setting, nor ends idle sessions).
    if let Err(e) = sqlx::query("SET idle_session_timeout = 0")
        .execute(&mut conn)
        .await
    {
        tracing::debug!(error = %e, "idle_session_timeout not set on the liveness lock's session");
    }
    let held = try_lock(&mut conn, id).await?;
    if !held {
        tracing::warn!(process = %id, "liveness lock held by another session (a key collision?); tried again in the background");
    }
    Ok((conn, held))
}

/// Tries `id`'s liveness lock once on `conn` (never waits: another session holding it is
/// a key collision, or this process's previous session not yet ended).
async fn try_lock(conn: &mut PgConnection, id: &str) -> Result<bool> {
    Ok(sqlx::query_scalar(concat!(
        "SELECT pg_try_advisory_lock($1, ",
        key_of!("$2::text"),
        ")"
    ))
    .bind(LIVENESS_NS)
    .bind(id)
    .fetch_one(&mut *conn)
    .await?)
}

/// Whether `me` may take other hosts for gone: its own liveness lock is held by a session
/// that began at least `STALE_AFTER` ago by the database's clock. A crash-restart of the
/// server (one backend killed), a long crash recovery or a failover to a standby ends every
/// session, this host's too, and none of it moves the server's start time that
/// `dead_owners` counts from; a host that has held its lock again for the window has seen
/// every live host get the time to beat and take its own again. A host just started waits
/// the window too: it cannot tell a restart of the server just before it.
pub async fn may_judge(db: &PgDb, me: &Me) -> Result<bool> {
    Ok(sqlx::query_scalar(concat!(
        "SELECT EXISTS (SELECT 1 FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
         WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 2
         AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
         AND l.classid = $1::int4::oid AND l.objid = ",
        key_of!("$2::text"),
        "::oid AND a.backend_start < clock_timestamp() - make_interval(secs => $3))"
    ))
    .bind(LIVENESS_NS)
    .bind(&me.id)
    .bind(stale_secs())
    .fetch_one(&db.pool)
    .await?)
}

/// The backend pid of the session holding process `id`'s liveness lock in this database,
/// if one does (`pg_stat_activity.pid`: what `pg_terminate_backend` takes).
pub async fn liveness_session(db: &PgDb, id: &str) -> Result<Option<i32>> {
    Ok(sqlx::query_scalar(concat!(
        "SELECT l.pid FROM pg_locks l WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 2
         AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
         AND l.classid = $1::int4::oid AND l.objid = ",
        key_of!("$2::text"),
        "::oid"
    ))
    .bind(LIVENESS_NS)
    .bind(id)
    .fetch_optional(&db.pool)
    .await?)
}

/// `STALE_AFTER` in seconds, for `make_interval`.
fn stale_secs() -> f64 {
    STALE_AFTER.num_milliseconds() as f64 / 1000.0
}
