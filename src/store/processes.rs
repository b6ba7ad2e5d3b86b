//! Gateway processes sharing the database. Each one registers with a heartbeat; a process
//! is gone when its heartbeat is stale, or when it ran on this host and its pid is no
//! longer alive (so a restart after `kill -9` recovers at once instead of after the timeout).

use chrono::{DateTime, Duration, Utc};
use sqlx::SqlitePool;

use super::Result;
use crate::clock::db_time;

/// A heartbeat older than this means the process is gone.
pub const STALE_AFTER: Duration = Duration::seconds(15);

pub async fn register(
    pool: &SqlitePool,
    id: &str,
    host: &str,
    pid: u32,
    now: DateTime<Utc>,
) -> Result<()> {
    sqlx::query(
        "INSERT INTO processes (id, host, pid, started_at, heartbeat_at) VALUES (?, ?, ?, ?, ?)",
    )
    .bind(id)
    .bind(host)
    .bind(pid)
    .bind(db_time(now))
    .bind(db_time(now))
    .execute(pool)
    .await?;
    Ok(())
}

pub async fn heartbeat(pool: &SqlitePool, id: &str, now: DateTime<Utc>) -> Result<()> {
    sqlx::query("UPDATE processes SET heartbeat_at = ? WHERE id = ?")
        .bind(db_time(now))
        .bind(id)
        .execute(pool)
        .await?;
    Ok(())
}

pub async fn unregister(pool: &SqlitePool, id: &str) -> Result<()> {
    sqlx::query("DELETE FROM processes WHERE id = ?")
        .bind(id)
        .execute(pool)
        .await?;
    Ok(())
}

/// Owners of reservations that are no longer running: a stale heartbeat, a dead pid on this
/// host, or no process row at all.
pub async fn dead_owners(
    pool: &SqlitePool,
    me: &str,
    host: &str,
    now: DateTime<Utc>,
) -> Result<Vec<String>> {
    // (owner, host, pid, heartbeat_at) of every other owner of open reservations.
    type OwnerRow = (String, Option<String>, Option<i64>, Option<String>);
    let rows: Vec<OwnerRow> = sqlx::query_as(
        "SELECT DISTINCT r.owner, p.host, p.pid, p.heartbeat_at FROM reservations r LEFT JOIN processes p ON p.id = r.owner
         WHERE r.owner <> ?",
    )
    .bind(me)
    .fetch_all(pool)
    .await?;
    let stale = db_time(now - STALE_AFTER);
    Ok(rows
        .into_iter()
        .filter(|(_, p_host, pid, beat)| match (p_host, pid, beat) {
            (Some(h), Some(pid), Some(beat)) => {
                beat.as_str() < stale.as_str() || (h == host && !pid_alive(*pid))
            }
            _ => true,
        })
        .map(|(owner, ..)| owner)
        .collect())
}

/// Removes process rows that are gone and hold nothing any more.
pub async fn prune(pool: &SqlitePool, now: DateTime<Utc>) -> Result<()> {
    sqlx::query("DELETE FROM processes WHERE heartbeat_at < ? AND id NOT IN (SELECT owner FROM reservations)")
        .bind(db_time(now - STALE_AFTER))
        .execute(pool)
        .await?;
    Ok(())
}

fn pid_alive(pid: i64) -> bool {
    std::path::Path::new(&format!("/proc/{pid}")).exists()
}
