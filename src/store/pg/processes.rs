//! Gateway processes sharing a PostgreSQL database, across hosts (`store::processes`'s
//! functions, function for function). On PostgreSQL liveness is the heartbeat alone: a
//! process is gone when its heartbeat has not moved for `STALE_AFTER`, or when it has no
//! row — whatever its pid, which means nothing on another host (and hosts may share pid
//! numbers). A process stalled past `STALE_AFTER` cannot be told from a crash: its
//! reservations are settled as orphans by any surviving process, and its late settlements
//! correct them (`ledger::settle_tx`); its next heartbeat registers it again.
//!
//! "Has not moved for `STALE_AFTER`" is measured by the watching process's own clock,
//! from the moment it first saw the current value (`Beats`): a heartbeat is stamped by the
//! beating host's clock, and comparing it with another host's clock took every live
//! process for gone from a host whose clock ran 15 s ahead (its sweep orphaned their live
//! reservations every 5 s, its prune deleted their rows), and kept a crashed one alive
//! from a host whose clock lagged (`clocks::a_gateway_whose_clock_runs_ahead_orphans_…`).

use std::collections::HashMap;
use std::sync::Mutex;

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

/// The other processes' heartbeats as one process has watched them: each one's latest
/// value and when — by the watcher's clock — it first saw that value.
#[derive(Debug, Default)]
pub struct Beats(Mutex<HashMap<String, (String, DateTime<Utc>)>>);

impl Beats {
    /// Notes that `id`'s heartbeat reads `beat` at `now`; whether it has read so, unmoved,
    /// for `STALE_AFTER` of this clock.
    fn unmoved(&self, id: &str, beat: &str, now: DateTime<Utc>) -> bool {
        // A panic elsewhere while the map was held leaves it whole (plain inserts).
        let mut seen = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let since = match seen.get(id) {
            Some((value, since)) if value == beat => *since,
            _ => {
                seen.insert(id.to_string(), (beat.to_string(), now));
                now
            }
        };
        now - since >= STALE_AFTER
    }

    /// Forgets every process not in `ids` (their rows are gone).
    fn keep_only(&self, ids: &[&str]) {
        let mut seen = self.0.lock().unwrap_or_else(|e| e.into_inner());
        seen.retain(|id, _| ids.contains(&id.as_str()));
    }
}

/// Owners of open reservations (other than `me`) whose heartbeat has not moved for
/// `STALE_AFTER` (by `me`'s clock) or who have no row at all.
pub async fn dead_owners(db: &PgDb, me: &Me, now: DateTime<Utc>) -> Result<Vec<String>> {
    let owners: Vec<(String, Option<String>)> = sqlx::query_as(
        "SELECT DISTINCT r.owner, p.heartbeat_at FROM reservations r LEFT JOIN processes p ON p.id = r.owner
         WHERE r.owner <> $1",
    )
    .bind(&me.id)
    .fetch_all(&db.pool)
    .await?;
    Ok(owners
        .into_iter()
        .filter(|(owner, beat)| match beat {
            None => true,
            Some(beat) => me.beats.unmoved(owner, beat, now),
        })
        .map(|(owner, _)| owner)
        .collect())
}

/// Removes the rows of processes whose heartbeat has not moved for `STALE_AFTER` (by
/// `me`'s clock) and that hold no reservation any more.
pub async fn prune(db: &PgDb, me: &Me, now: DateTime<Utc>) -> Result<()> {
    let rows: Vec<(String, String)> =
        sqlx::query_as("SELECT id, heartbeat_at FROM processes WHERE id <> $1")
            .bind(&me.id)
            .fetch_all(&db.pool)
            .await?;
    me.beats
        .keep_only(&rows.iter().map(|(id, _)| id.as_str()).collect::<Vec<_>>());
    for (id, beat) in rows {
        if !me.beats.unmoved(&id, &beat, now) {
            continue;
        }
        // Only the beat watched: one that lands meanwhile keeps the row.
        sqlx::query(
            "DELETE FROM processes WHERE id = $1 AND heartbeat_at = $2
             AND NOT EXISTS (SELECT 1 FROM reservations r WHERE r.owner = processes.id)",
        )
        .bind(&id)
        .bind(&beat)
        .execute(&db.pool)
        .await?;
    }
    Ok(())
}
