//! Gateway processes sharing a PostgreSQL database, across hosts (`store::processes`'s
//! functions, function for function). On PostgreSQL liveness is the heartbeat alone: a
//! process is gone when its heartbeat is older than `STALE_AFTER`, or when it has no row —
//! whatever its pid, which means nothing on another host (and hosts may share pid
//! numbers).
//!
//! Both ends of that comparison are the database's clock, not the hosts': a beat stamps
//! `seen_at = clock_timestamp()` (a trigger on every write of `heartbeat_at`, so a host
//! still running the previous version's heartbeat during a rolling upgrade is stamped
//! too: `migrations/postgres/0002`), and the dead check and the prune compare it with
//! `clock_timestamp()` (the `now` they take is not used here). Hosts' clocks may disagree
//! by any amount — a host a minute or a day ahead does not take the others for dead and
//! settle their live reservations as orphans (`pg_clock_skew`: it did, at 15 s ahead).
//! `heartbeat_at` keeps the host's own time: leases are judged against it, both sides by
//! the owner's clock (`ledger::settle_orphans`, `Orphans::LeaseExpired`). A process stalled past `STALE_AFTER` cannot be told from a crash: its
//! reservations are settled as orphans by any surviving process, and its late settlements
//! correct them (`ledger::settle_tx`); its next heartbeat registers it again.

use chrono::{DateTime, Utc};

use super::PgDb;
use crate::clock::db_time;
use crate::store::processes::{Me, STALE_AFTER};
use crate::store::Result;

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

/// Owners of open reservations (other than `me`) whose heartbeat is stale by the
/// database's clock or who have no row at all. `_now` (this host's clock) is not used.
pub async fn dead_owners(db: &PgDb, me: &Me, _now: DateTime<Utc>) -> Result<Vec<String>> {
    Ok(sqlx::query_scalar(
        "SELECT DISTINCT r.owner FROM reservations r LEFT JOIN processes p ON p.id = r.owner
         WHERE r.owner <> $1 AND (p.id IS NULL OR p.seen_at < clock_timestamp() - make_interval(secs => $2))",
    )
    .bind(&me.id)
    .bind(stale_secs())
    .fetch_all(&db.pool)
    .await?)
}

/// Removes process rows whose heartbeat is stale (by the database's clock) and that hold
/// no reservation any more.
pub async fn prune(db: &PgDb, _me: &Me, _now: DateTime<Utc>) -> Result<()> {
    sqlx::query(
        "DELETE FROM processes WHERE seen_at < clock_timestamp() - make_interval(secs => $1)
         AND NOT EXISTS (SELECT 1 FROM reservations r WHERE r.owner = processes.id)",
    )
    .bind(stale_secs())
    .execute(&db.pool)
    .await?;
    Ok(())
}

/// `STALE_AFTER` in seconds, for `make_interval`.
fn stale_secs() -> f64 {
    STALE_AFTER.num_milliseconds() as f64 / 1000.0
}
