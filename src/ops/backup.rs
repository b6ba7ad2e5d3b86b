//! Hot backups and restore. A backup is `VACUUM INTO` a new file (a consistent snapshot
//! taken while the gateway serves), mode 0600, checked with `PRAGMA integrity_check` after
//! writing; the newest `keep` are kept. A restore refuses while a gateway runs on the
//! target database, removes stale `-wal`/`-shm` files, copies the backup in, migrates it,
//! and checks integrity and the ledger invariant.

use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use chrono::{DateTime, Utc};
use sqlx::sqlite::SqliteConnectOptions;
use sqlx::{ConnectOptions, Connection};

use crate::clock::db_time;
use crate::store::{self, Db, StoreError};

#[derive(Debug, thiserror::Error)]
pub enum BackupError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("backup file: {0}")]
    Io(#[from] std::io::Error),
    #[error("the copy failed its integrity check: {0}")]
    Corrupt(String),
    #[error("a gateway is running on {0} (heartbeat in the last 15 s); stop it before restoring")]
    InUse(PathBuf),
    #[error("the restored database breaks the ledger invariant: {0}")]
    Invariant(String),
}

impl From<sqlx::Error> for BackupError {
    fn from(e: sqlx::Error) -> Self {
        BackupError::Store(e.into())
    }
}

async fn integrity_of(path: &Path) -> Result<String, BackupError> {
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

/// Writes a backup into `dir` and prunes all but the newest `keep`; returns its path.
pub async fn backup_now(
    db: &Db,
    dir: &Path,
    keep: u32,
    now: DateTime<Utc>,
) -> Result<PathBuf, BackupError> {
    crate::private_fs::create_dir_all(dir)?;
    let path = dir.join(format!("sluice-{}.db", now.format("%Y%m%dT%H%M%S%.3fZ")));
    // Created empty and 0600 first (VACUUM INTO accepts an empty file and keeps its mode):
    // the copy is never readable by others, not even while it is being written.
    private_file(&path)?;
    if let Err(e) = sqlx::query("VACUUM INTO ?")
        .bind(path.to_string_lossy().to_string())
        .execute(&db.read)
        .await
    {
        let _ = std::fs::remove_file(&path);
        return Err(e.into());
    }
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))?;
    let ok = integrity_of(&path).await?;
    if ok != "ok" {
        return Err(BackupError::Corrupt(ok));
    }
    let mut backups: Vec<PathBuf> = std::fs::read_dir(dir)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("sluice-") && n.ends_with(".db"))
        })
        .collect();
    backups.sort();
    let excess = backups.len().saturating_sub(keep.max(1) as usize);
    for old in &backups[..excess] {
        std::fs::remove_file(old)?;
    }
    Ok(path)
}

/// A new, empty file only its owner can read.
fn private_file(path: &Path) -> std::io::Result<std::fs::File> {
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
}

/// What a restore found.
pub struct Restored {
    pub integrity: String,
    pub tokens_checked: i64,
}

/// Restores `backup` into `target` (the config's database path).
pub async fn restore(
    backup: &Path,
    target: &Path,
    now: DateTime<Utc>,
) -> Result<Restored, BackupError> {
    let ok = integrity_of(backup).await?;
    if ok != "ok" {
        return Err(BackupError::Corrupt(ok));
    }
    if target.exists() {
        let mut conn = SqliteConnectOptions::new()
            .filename(target)
            .read_only(true)
            .connect()
            .await?;
        let stale = db_time(now - store::processes::STALE_AFTER);
        let live: i64 =
            sqlx::query_scalar("SELECT COUNT(*) FROM processes WHERE heartbeat_at >= ?")
                .bind(&stale)
                .fetch_one(&mut conn)
                .await
                .unwrap_or(0);
        conn.close().await?;
        if live > 0 {
            return Err(BackupError::InUse(target.to_path_buf()));
        }
    }
    if let Some(dir) = target.parent().filter(|d| !d.as_os_str().is_empty()) {
        crate::private_fs::create_dir_all(dir)?;
    }
    for suffix in ["", "-wal", "-shm"] {
        let p = PathBuf::from(format!("{}{suffix}", target.display()));
        if p.exists() {
            std::fs::remove_file(&p)?;
        }
    }
    std::io::copy(
        &mut std::fs::File::open(backup)?,
        &mut private_file(target)?,
    )?;
    let db = Db::open(target, false).await?;
    sqlx::query("DELETE FROM processes")
        .execute(&db.write)
        .await?;
    let integrity = db.integrity_check().await?;
    let violations = store::ledger::invariant_violations(&db.read).await?;
    let tokens_checked: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM tokens")
        .fetch_one(&db.read)
        .await?;
    db.close().await;
    if let Some(v) = violations.first() {
        return Err(BackupError::Invariant(v.clone()));
    }
    Ok(Restored {
        integrity,
        tokens_checked,
    })
}
