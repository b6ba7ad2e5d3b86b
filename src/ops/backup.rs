//! Hot backups and restore. A backup is `VACUUM INTO` a new file (a consistent snapshot
//! taken while the gateway serves), mode 0600, checked with `PRAGMA integrity_check` after
//! writing; the newest `keep` are kept (by the time in their names, one in the future
//! counted oldest; files not named as a backup are left alone). A restore refuses while a gateway runs on the
//! target database, removes stale `-wal`/`-shm` files, copies the backup in, migrates it,
//! and checks integrity and the ledger invariant.
//!
//! Scheduled (`backup_if_due`, every `[backup] interval_hours` from the housekeeping): due
//! when the folder's newest backup — by the time in its name — is an interval old, so a
//! restart does not take one early and replicas sharing the folder take one between them
//! (the check and the copy run under the folder's advisory lock `backup.lock`).

use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use crate::store::{self, Db, StoreError};
use chrono::{DateTime, Utc};

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
    #[error("{}", store::backup::NO_FILE_RESTORE)]
    NotAFileDatabase,
}

/// The database file `sluice restore` writes into: the config's SQLite path; refused (with
/// what to use instead) when the config names a PostgreSQL database.
pub fn restore_target(settings: &crate::config::Settings) -> Result<PathBuf, BackupError> {
    match settings.database_postgres_url() {
        Some(_) => Err(BackupError::NotAFileDatabase),
        None => Ok(settings.database_path()),
    }
}

async fn integrity_of(path: &Path) -> Result<String, BackupError> {
    Ok(store::backup::file_integrity(path).await?)
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
    if let Err(e) = db.backup_into(&path).await {
        let _ = std::fs::remove_file(&path);
        return Err(e.into());
    }
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))?;
    // A copy that failed its check is no backup: left under a backup's name, it would
    // count as the newest and put off the next one for an interval.
    let ok = match integrity_of(&path).await {
        Ok(ok) => ok,
        Err(e) => {
            let _ = std::fs::remove_file(&path);
            return Err(e);
        }
    };
    if ok != "ok" {
        let _ = std::fs::remove_file(&path);
        return Err(BackupError::Corrupt(ok));
    }
    // Only files named as a backup count; one stamped in the future (written while the
    // clock ran ahead) goes before any taken up to now, so it can never evict this one.
    let (mut backups, cut): (Vec<_>, Vec<_>) = std::fs::read_dir(dir)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter_map(|p| taken_at(&p).map(|t| (t <= now, t, p)))
        .partition(|(_, _, p)| store::backup::is_whole_copy(p));
    backups.sort();
    let excess = backups.len().saturating_sub(keep.max(1) as usize);
    for (_, _, old) in &backups[..excess] {
        std::fs::remove_file(old)?;
    }
    // A backup cut short (a crash during its `VACUUM INTO`) is none of the `keep`, and
    // nothing else removes it: once stamped before every backup kept (so no backup still
    // being written, e.g. by `sluice backup`), it goes.
    if let Some(oldest_kept) = backups[excess..]
        .iter()
        .filter(|(past, _, _)| *past)
        .map(|(_, t, _)| *t)
        .min()
    {
        for (_, t, p) in &cut {
            if *t < oldest_kept && p != &path {
                let _ = std::fs::remove_file(p);
            }
        }
    }
    Ok(path)
}

/// The time a backup's file name carries (`sluice-20261201T120000.000Z.db`).
fn taken_at(path: &Path) -> Option<DateTime<Utc>> {
    let name = path.file_name()?.to_str()?;
    let stamp = name.strip_prefix("sluice-")?.strip_suffix("Z.db")?;
    chrono::NaiveDateTime::parse_from_str(stamp, "%Y%m%dT%H%M%S%.3f")
        .ok()
        .map(|t| t.and_utc())
}

/// Whether a backup is due at `now`: none yet, the newest an interval old, or the newest
/// more than an interval in the future (the clock stepped back: waiting for it to catch up
/// would leave the database without a fresh backup for as long as the step).
fn due(newest: Option<DateTime<Utc>>, interval: chrono::Duration, now: DateTime<Utc>) -> bool {
    match newest {
        None => true,
        Some(t) => now - t >= interval || t - now > interval,
    }
}

/// How long a scheduled backup waits for another process's `backup.lock` before it fails
/// (and raises `backup_failed`): a backup of a large database can take minutes.
const LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(10 * 60);

/// Takes a backup if one is due (see the module doc); the path of the one taken.
pub async fn backup_if_due(
    db: &Db,
    dir: &Path,
    keep: u32,
    interval: chrono::Duration,
    now: DateTime<Utc>,
) -> Result<Option<PathBuf>, BackupError> {
    crate::private_fs::create_dir_all(dir)?;
    // Held until dropped at the end: one replica checks and copies at a time.
    let _lock = crate::private_fs::lock(&dir.join("backup.lock"), LOCK_WAIT).await?;
    // One stamped more than an interval in the future is left out: it was taken under a
    // clock that has since stepped back (or is no backup of ours), and once one is taken
    // now, counting it would make every check due.
    let newest = std::fs::read_dir(dir)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter_map(|p| taken_at(&p).filter(|_| store::backup::is_whole_copy(&p)))
        .filter(|t| *t - now <= interval)
        .max();
    if !due(newest, interval, now) {
        return Ok(None);
    }
    backup_now(db, dir, keep, now).await.map(Some)
}

/// `sluice backup`: a backup now, under the folder's `backup.lock` like a scheduled one (it
/// prunes the same folder: unlocked, it could delete a scheduled backup between its
/// `VACUUM INTO` and its integrity check).
pub async fn backup_now_locked(
    db: &Db,
    dir: &Path,
    keep: u32,
    now: DateTime<Utc>,
) -> Result<PathBuf, BackupError> {
    crate::private_fs::create_dir_all(dir)?;
    let _lock = crate::private_fs::lock(&dir.join("backup.lock"), LOCK_WAIT).await?;
    backup_now(db, dir, keep, now).await
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
    let since = now - store::processes::STALE_AFTER;
    if store::backup::gateways_alive_on(target, since).await? > 0 {
        return Err(BackupError::InUse(target.to_path_buf()));
    }
    store::backup::copy_over(backup, target)?;
    let db = Db::open(target, false).await?;
    store::processes::forget_all(&db).await?;
    let integrity = db.integrity_check().await?;
    let violations = store::ledger::invariant_violations(&db).await?;
    let tokens_checked = store::tokens::count(&db).await?;
    db.close().await;
    if let Some(v) = violations.first() {
        return Err(BackupError::Invariant(v.clone()));
    }
    Ok(Restored {
        integrity,
        tokens_checked,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(s).unwrap().with_timezone(&Utc)
    }

    #[test]
    fn a_backups_name_gives_back_the_time_it_was_taken() {
        let t = at("2026-12-01T12:34:56.789Z");
        let name = format!("sluice-{}.db", t.format("%Y%m%dT%H%M%S%.3fZ"));
        assert_eq!(taken_at(Path::new(&name)), Some(t));
        for other in [
            "audit.head",
            "sluice-x.db",
            "backup.lock",
            "sluice-20261201T123456.789Z.db-wal",
        ] {
            assert_eq!(taken_at(Path::new(other)), None, "{other}");
        }
    }

    #[test]
    fn a_backup_is_due_an_interval_after_the_newest_or_after_a_step_back() {
        let day = chrono::Duration::hours(24);
        let now = at("2026-12-01T12:00:00Z");
        assert!(due(None, day, now), "none yet");
        assert!(!due(Some(now - chrono::Duration::hours(23)), day, now));
        assert!(due(Some(now - day), day, now));
        // The clock stepped back an hour: the newest is in the future, not due yet.
        assert!(!due(Some(now + chrono::Duration::hours(1)), day, now));
        // Stepped back more than an interval: due, not a wait as long as the step.
        assert!(due(Some(now + chrono::Duration::hours(30)), day, now));
    }
}
