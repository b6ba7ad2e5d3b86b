//! The engine's side of backups and restores (`ops::backup` owns the folder, the schedule
//! and the pruning). On SQLite a backup is a file: `VACUUM INTO` writes a consistent copy
//! while the gateway serves, and a copy is checked by opening it read-only.

use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use chrono::{DateTime, Utc};
use sqlx::sqlite::SqliteConnectOptions;
use sqlx::{ConnectOptions, Connection};

use super::{Backend, Db, Result};
use crate::clock::db_time;

/// Why `sluice backup` (and the scheduled backup) writes no file on PostgreSQL, and what
/// to use instead: the server's own tools back up a live database better than a copy
/// through one client connection could (docs/DESIGN.md "PostgreSQL: backup and restore").
pub const NO_FILE_BACKUP: &str = "`sluice backup` writes a SQLite file; this database is PostgreSQL: back it up with `pg_dump --format=custom` (restore with `pg_restore`) or with continuous WAL archiving for point-in-time recovery — see docs/DESIGN.md \"PostgreSQL: backup and restore\"";

/// Why `sluice restore` does not restore into PostgreSQL, and what to use instead.
pub const NO_FILE_RESTORE: &str = "`sluice restore` restores a SQLite backup file; this database is PostgreSQL: restore a `pg_dump` archive with `pg_restore` (or recover to a point in time from the WAL archive), then start the gateways — see docs/DESIGN.md \"PostgreSQL: backup and restore\"; to move a SQLite install onto PostgreSQL use `sluice migrate-store`";

impl Db {
    /// Whether this engine backs up into a file (`backup_into`): SQLite does; PostgreSQL is
    /// backed up by its own tools (`NO_FILE_BACKUP`).
    pub fn backs_up_to_file(&self) -> bool {
        matches!(self.backend, Backend::Sqlite(_))
    }

    /// Writes a consistent copy of the whole database into `path` (an empty file, whose
    /// mode the copy keeps) while the gateway goes on serving.
    pub async fn backup_into(&self, path: &Path) -> Result<()> {
        let Backend::Sqlite(sqlite) = &self.backend else {
            return Err(super::StoreError::Unsupported(NO_FILE_BACKUP.into()));
        };
        sqlx::query("VACUUM INTO ?")
            .bind(path.to_string_lossy().to_string())
            .execute(&sqlite.read)
            .await?;
        Ok(())
    }
}

/// The integrity check of the database file at `path` (a backup), opened read-only: "ok"
/// or the first problem found.
pub async fn file_integrity(path: &Path) -> Result<String> {
    let mut conn = SqliteConnectOptions::new()
        .filename(path)
        .read_only(true)
        .connect()
        .await?;
    let ok: String = sqlx::query_scalar("PRAGMA integrity_check")
        .fetch_one(&mut conn)
        .await?;
    conn.close().await?;
    Ok(ok)
}

/// How many gateways have heartbeaten on the database file at `path` since `since` (0 when
/// there is no such file, or it holds no registrations to read). Opened read-only, without
/// migrating it.
pub async fn gateways_alive_on(path: &Path, since: DateTime<Utc>) -> Result<i64> {
    if !path.exists() {
        return Ok(0);
    }
    let mut conn = SqliteConnectOptions::new()
        .filename(path)
        .read_only(true)
        .connect()
        .await?;
    let live: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM processes WHERE heartbeat_at >= ?")
        .bind(db_time(since))
        .fetch_one(&mut conn)
        .await
        .unwrap_or(0);
    conn.close().await?;
    Ok(live)
}

/// Whether the file is a whole SQLite database: its header there and the file as long as
/// the header says. A backup cut short (the process killed during `VACUUM INTO`) is not,
/// and is neither the newest backup nor one of the `keep`.
pub fn is_whole_copy(path: &Path) -> bool {
    use std::io::Read;
    let mut head = [0u8; 100];
    let Ok(len) = std::fs::File::open(path)
        .and_then(|mut f| f.read_exact(&mut head).and(f.metadata()))
        .map(|m| m.len())
    else {
        return false;
    };
    if &head[..16] != b"SQLite format 3\0" {
        return false;
    }
    let page = match u16::from_be_bytes([head[16], head[17]]) {
        1 => 65_536,
        n => u64::from(n),
    };
    let pages = u64::from(u32::from_be_bytes([head[28], head[29], head[30], head[31]]));
    pages > 0 && len >= page * pages
}

/// Puts the backup file `backup` in the place of the database file `target` (creating its
/// folder): the old file and its stale `-wal` and `-shm` go first, and the copy is 0600.
pub fn copy_over(backup: &Path, target: &Path) -> std::io::Result<()> {
    if let Some(dir) = target.parent().filter(|d| !d.as_os_str().is_empty()) {
        crate::private_fs::create_dir_all(dir)?;
    }
    for suffix in ["", "-wal", "-shm"] {
        let p = PathBuf::from(format!("{}{suffix}", target.display()));
        if p.exists() {
            std::fs::remove_file(&p)?;
        }
    }
    let mut copy = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(target)?;
    std::io::copy(&mut std::fs::File::open(backup)?, &mut copy)?;
    Ok(())
}
