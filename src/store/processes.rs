//! Gateway processes sharing the database. Each one registers with a heartbeat; a process
//! is gone when
//! - it ran on this host and its pid is no longer alive — or is alive but started at
//!   another time (a reused pid) — so a restart after `kill -9` recovers at once;
//! - it ran on another host and its heartbeat is older than `STALE_AFTER` (nothing else
//!   can be seen from here);
//! - it has no row at all.
//!
//! On this host a live pid always counts as alive, however stale its heartbeat: a process
//! that was stopped (SIGSTOP, a frozen container, a disk stall) keeps its reservations.
//! Across hosts sharing a SQLite file a stall past `STALE_AFTER` cannot be told from a
//! crash: its reservations are settled as orphans, and its late settlements correct them
//! (`ledger::settle_tx`). On PostgreSQL each process also holds a liveness lock that a
//! paused host keeps, so a stall is not taken for a crash there (`pg::processes`).
//! The heartbeat is an upsert: a process whose row was pruned while it stalled registers
//! again at its next beat, so its new reservations are never taken for orphans.

use chrono::{DateTime, Duration, Utc};

use super::Result;
use crate::clock::db_time;

/// A heartbeat older than this means a process on another host is gone.
pub const STALE_AFTER: Duration = Duration::seconds(15);

/// Who this process is, as the process table knows it.
#[derive(Debug, Clone)]
pub struct Me {
    pub id: String,
    pub host: String,
    pub pid: u32,
    /// The pid's start time (`/proc/<pid>/stat`), to tell a reused pid from this process.
    pub pid_start: Option<i64>,
}

impl Me {
    pub fn new(id: String, host: String) -> Me {
        let pid = std::process::id();
        Me {
            id,
            host,
            pid,
            pid_start: pid_start(i64::from(pid)),
        }
    }
}

/// Registers this process, or — when its row is missing — registers it again, and records
/// a heartbeat. Returns `true` when the row had to be created (at start, or because
/// another process pruned it as gone while this one stalled).
pub async fn heartbeat(db: &super::Db, me: &Me, now: DateTime<Utc>) -> Result<bool> {
    let sqlite = match &db.backend {
        super::Backend::Sqlite(sqlite) => sqlite,
        super::Backend::Postgres(pg) => return super::pg::processes::heartbeat(pg, me, now).await,
    };
    let pool = &sqlite.write;
    let now = db_time(now);
    let beat = sqlx::query("UPDATE processes SET heartbeat_at = ? WHERE id = ?")
        .bind(&now)
        .bind(&me.id)
        .execute(pool)
        .await?;
    if beat.rows_affected() == 1 {
        return Ok(false);
    }
    sqlx::query(
        "INSERT INTO processes (id, host, pid, pid_start, started_at, heartbeat_at) VALUES (?, ?, ?, ?, ?, ?)
         ON CONFLICT (id) DO UPDATE SET heartbeat_at = excluded.heartbeat_at",
    )
    .bind(&me.id)
    .bind(&me.host)
    .bind(me.pid)
    .bind(me.pid_start)
    .bind(&now)
    .bind(&now)
    .execute(pool)
    .await?;
    Ok(true)
}

/// What keeps this process alive in the others' eyes besides its heartbeat, for as long as
/// it lives: on PostgreSQL its liveness lock (`pg::processes::hold_liveness`: a paused host
/// is not taken for gone); nothing on SQLite, where a live pid on this host says it.
#[derive(Debug)]
pub struct Liveness {
    _held: Option<super::pg::processes::Liveness>,
}

/// Takes this process's liveness lock (PostgreSQL; nothing to do on SQLite); it is held
/// until the returned value is dropped.
pub async fn hold_liveness(db: &super::Db, me: &Me) -> Result<Liveness> {
    match &db.backend {
        super::Backend::Sqlite(_) => Ok(Liveness { _held: None }),
        super::Backend::Postgres(pg) => Ok(Liveness {
            _held: Some(super::pg::processes::hold_liveness(pg, me).await?),
        }),
    }
}

/// Forgets every registration (a restored copy: the gateways registered in it ran on the
/// database it was taken from, not on this one).
pub async fn forget_all(db: &super::Db) -> Result<()> {
    let sqlite = match &db.backend {
        super::Backend::Sqlite(sqlite) => sqlite,
        super::Backend::Postgres(pg) => return super::pg::processes::forget_all(pg).await,
    };
    sqlx::query("DELETE FROM processes")
        .execute(&sqlite.write)
        .await?;
    Ok(())
}

pub async fn unregister(db: &super::Db, id: &str) -> Result<()> {
    let sqlite = match &db.backend {
        super::Backend::Sqlite(sqlite) => sqlite,
        super::Backend::Postgres(pg) => return super::pg::processes::unregister(pg, id).await,
    };
    let pool = &sqlite.write;
    sqlx::query("DELETE FROM processes WHERE id = ?")
        .bind(id)
        .execute(pool)
        .await?;
    Ok(())
}

/// Whether this process may take others for gone now: always on SQLite (a pid on this
/// host is checked exactly); on PostgreSQL once its own liveness lock has been held by one
/// session for `STALE_AFTER` (`pg::processes::may_judge`).
pub async fn may_judge(db: &super::Db, me: &Me) -> Result<bool> {
    match &db.backend {
        super::Backend::Sqlite(_) => Ok(true),
        super::Backend::Postgres(pg) => super::pg::processes::may_judge(pg, me).await,
    }
}

/// Owners of reservations that are no longer running (see the module doc).
pub async fn dead_owners(db: &super::Db, me: &Me, now: DateTime<Utc>) -> Result<Vec<String>> {
    let sqlite = match &db.backend {
        super::Backend::Sqlite(sqlite) => sqlite,
        super::Backend::Postgres(pg) => {
            return super::pg::processes::dead_owners(pg, me, now).await
        }
    };
    let pool = &sqlite.read;
    // (owner, host, pid, pid start, heartbeat_at) of every other owner of open reservations.
    type OwnerRow = (
        String,
        Option<String>,
        Option<i64>,
        Option<i64>,
        Option<String>,
    );
    let rows: Vec<OwnerRow> = sqlx::query_as(
        "SELECT DISTINCT r.owner, p.host, p.pid, p.pid_start, p.heartbeat_at FROM reservations r
         LEFT JOIN processes p ON p.id = r.owner WHERE r.owner <> ?",
    )
    .bind(&me.id)
    .fetch_all(pool)
    .await?;
    let stale = db_time(now - STALE_AFTER);
    Ok(rows
        .into_iter()
        .filter(|(_, host, pid, started, beat)| match (host, pid, beat) {
            (Some(h), Some(pid), _) if *h == me.host => !same_process_alive(*pid, *started),
            (Some(_), Some(_), Some(beat)) => beat.as_str() < stale.as_str(),
            _ => true,
        })
        .map(|(owner, ..)| owner)
        .collect())
}

/// The gateways running on the database, read inside `tx` (for commands that must run
/// alone, `sluice secrets rotate`), each as `host pid N`: on this host (`host`) a live
/// pid that is still the process that registered; on another, a heartbeat within
/// `STALE_AFTER` of `now`. On PostgreSQL, as its liveness rules say (`pg::processes`).
pub async fn running_in(tx: &mut super::Tx, host: &str, now: DateTime<Utc>) -> Result<Vec<String>> {
    if let Some((conn, _)) = tx.pg() {
        return super::pg::processes::running_in(conn).await;
    }
    type ProcRow = (String, i64, Option<i64>, String);
    let rows: Vec<ProcRow> =
        sqlx::query_as("SELECT host, pid, pid_start, heartbeat_at FROM processes ORDER BY id")
            .fetch_all(tx.sqlite()?)
            .await?;
    let stale = db_time(now - STALE_AFTER);
    Ok(rows
        .into_iter()
        .filter(|(h, pid, started, beat)| {
            if h == host {
                same_process_alive(*pid, *started)
            } else {
                beat.as_str() >= stale.as_str()
            }
        })
        .map(|(h, pid, ..)| format!("{h} pid {pid}"))
        .collect())
}

/// This host's name, as gateways register under it (`/etc/hostname`).
pub fn this_host() -> String {
    std::fs::read_to_string("/etc/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_else(|_| "localhost".into())
}

/// Removes process rows that are gone and hold nothing any more. A process on this host
/// whose pid is alive is kept, however stale its heartbeat.
pub async fn prune(db: &super::Db, me: &Me, now: DateTime<Utc>) -> Result<()> {
    let sqlite = match &db.backend {
        super::Backend::Sqlite(sqlite) => sqlite,
        super::Backend::Postgres(pg) => return super::pg::processes::prune(pg, me, now).await,
    };
    let pool = &sqlite.write;
    type ProcRow = (String, String, i64, Option<i64>);
    let stale: Vec<ProcRow> = sqlx::query_as(
        "SELECT id, host, pid, pid_start FROM processes
         WHERE heartbeat_at < ? AND id NOT IN (SELECT owner FROM reservations)",
    )
    .bind(db_time(now - STALE_AFTER))
    .fetch_all(pool)
    .await?;
    for (id, host, pid, started) in stale {
        if host == me.host && same_process_alive(pid, started) {
            continue;
        }
        sqlx::query("DELETE FROM processes WHERE id = ? AND heartbeat_at < ?")
            .bind(&id)
            .bind(db_time(now - STALE_AFTER))
            .execute(pool)
            .await?;
    }
    Ok(())
}

/// Whether `pid` on this host is still the process that registered (same start time).
fn same_process_alive(pid: i64, started: Option<i64>) -> bool {
    match (pid_start(pid), started) {
        (Some(now), Some(then)) => now == then,
        (Some(_), None) => true,
        (None, _) => false,
    }
}

/// A process's start time in clock ticks since boot (field 22 of `/proc/<pid>/stat`).
fn pid_start(pid: i64) -> Option<i64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may hold spaces and parentheses: count from its end.
    let after = &stat[stat.rfind(')')? + 1..];
    after.split_whitespace().nth(19)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_is_alive_and_a_reused_pid_is_not() {
        let me = Me::new("x".into(), "h".into());
        let started = me.pid_start;
        assert!(started.is_some());
        assert!(same_process_alive(i64::from(me.pid), started));
        assert!(!same_process_alive(
            i64::from(me.pid),
            started.map(|s| s + 1)
        ));
        assert!(!same_process_alive(i64::from(i32::MAX), None));
    }

    /// A pruned process registers again at its next beat; owners on another host are gone
    /// only once their heartbeat is stale, owners on this host only once their pid is.
    #[tokio::test]
    async fn heartbeats_come_back_and_liveness_is_judged_per_host() {
        use chrono::TimeZone;
        let dir = tempfile::tempdir().unwrap();
        let db = crate::store::Db::open(&dir.path().join("p.db"), false)
            .await
            .unwrap();
        let now = Utc.with_ymd_and_hms(2026, 12, 1, 12, 0, 0).unwrap();
        let me = Me::new("me".into(), "here".into());
        assert!(
            heartbeat(&db, &me, now).await.unwrap(),
            "first beat registers"
        );
        assert!(!heartbeat(&db, &me, now).await.unwrap());
        unregister(&db, "me").await.unwrap();
        assert!(
            heartbeat(&db, &me, now).await.unwrap(),
            "a pruned process registers again"
        );
        // Owners of open reservations: a fresh and a stale one elsewhere, a dead pid here,
        // this very process under another id here (alive however stale), and no row at all.
        let procs = [
            ("fresh-elsewhere", "there", 1, now - Duration::seconds(5)),
            ("stale-elsewhere", "there", 1, now - Duration::seconds(60)),
            ("dead-here", "here", i64::from(i32::MAX), now),
            (
                "stopped-here",
                "here",
                i64::from(me.pid),
                now - Duration::hours(1),
            ),
        ];
        for (id, host, pid, beat) in procs {
            let started = if id == "stopped-here" {
                me.pid_start
            } else {
                None
            };
            sqlx::query("INSERT INTO processes (id, host, pid, pid_start, started_at, heartbeat_at) VALUES (?, ?, ?, ?, ?, ?)")
                .bind(id).bind(host).bind(pid).bind(started).bind(db_time(beat)).bind(db_time(beat))
                .execute(&db.sqlite().write).await.unwrap();
        }
        for (i, owner) in [
            "fresh-elsewhere",
            "stale-elsewhere",
            "dead-here",
            "stopped-here",
            "unknown",
            "me",
        ]
        .iter()
        .enumerate()
        {
            sqlx::query("INSERT INTO reservations (request_id, token_id, user_id, team_id, period, user_period, team_period, amount_micros, owner, deadline, created_at)
                         VALUES (?, 1, 1, 1, 'never', 'never', 'never', 1, ?, '9999', '0')")
                .bind(format!("r{i}")).bind(owner)
                .execute(&db.sqlite().write).await.unwrap();
        }
        let mut dead = dead_owners(&db, &me, now).await.unwrap();
        dead.sort();
        assert_eq!(dead, ["dead-here", "stale-elsewhere", "unknown"]);
        // Pruning takes stale rows that hold nothing, but never a stopped process of this host
        // (a fresh row waits until it is stale).
        sqlx::query("DELETE FROM reservations")
            .execute(&db.sqlite().write)
            .await
            .unwrap();
        prune(&db, &me, now).await.unwrap();
        let mut left: Vec<String> = sqlx::query_scalar("SELECT id FROM processes")
            .fetch_all(&db.sqlite().read)
            .await
            .unwrap();
        left.sort();
        assert_eq!(left, ["dead-here", "fresh-elsewhere", "me", "stopped-here"]);
    }
}
