//! Gateway processes sharing a PostgreSQL database, across hosts (`store::processes`'s
//! functions, function for function). On PostgreSQL liveness is the heartbeat alone: a
//! process is gone when its heartbeat is older than `STALE_AFTER`, or when it has no row —
//! whatever its pid, which means nothing on another host (and hosts may share pid
//! numbers). A process stalled past `STALE_AFTER` cannot be told from a crash: its
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

/// Owners of open reservations (other than `me`) whose heartbeat is stale or who have no
/// row at all.
pub async fn dead_owners(db: &PgDb, me: &Me, now: DateTime<Utc>) -> Result<Vec<String>> {
    Ok(sqlx::query_scalar(
        "SELECT DISTINCT r.owner FROM reservations r LEFT JOIN processes p ON p.id = r.owner
         WHERE r.owner <> $1 AND (p.id IS NULL OR p.heartbeat_at < $2)",
    )
    .bind(&me.id)
    .bind(db_time(now - STALE_AFTER))
    .fetch_all(&db.pool)
    .await?)
}

/// Removes process rows whose heartbeat is stale and that hold no reservation any more.
pub async fn prune(db: &PgDb, _me: &Me, now: DateTime<Utc>) -> Result<()> {
    sqlx::query(
        "DELETE FROM processes WHERE heartbeat_at < $1
         AND NOT EXISTS (SELECT 1 FROM reservations r WHERE r.owner = processes.id)",
    )
    .bind(db_time(now - STALE_AFTER))
    .execute(&db.pool)
    .await?;
    Ok(())
}
