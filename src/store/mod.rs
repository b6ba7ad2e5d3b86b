//! All SQL lives below this module. SQLite in WAL mode: one writer connection per process
//! (writers queue in-process instead of fighting over the file lock; other processes wait
//! on `busy_timeout`), and a small pool of readers that never block it.

pub mod admins;
pub mod audit;
mod audit_mac;
pub mod cache;
pub mod directory;
pub mod ledger;
pub mod lingering;
pub mod processes;
pub mod raw;
pub mod reports;
pub mod requests;
pub mod sessions;
pub mod tenants;
pub mod token_admin;
pub mod tokens;
pub mod writer;

// Temporary: folded into `pg/mod.rs` at merge.
#[path = "pg/rest.rs"]
pub mod pg_rest;

#[cfg(test)]
mod writer_test;

use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous,
};

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("database error: {0}")]
    Sql(#[from] sqlx::Error),
    #[error("migration failed: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    #[error("cannot create database folder: {0}")]
    Io(#[from] std::io::Error),
    #[error("{0} not found")]
    NotFound(String),
    #[error("{0}")]
    Conflict(String),
    /// A statement run through the raw handle (`raw`) failed.
    #[error("database error: {message} (code {code})")]
    Sqlite { code: i32, message: String },
    /// The write batch this operation was part of failed as a whole; nothing of it was kept.
    #[error("write batch failed: {0}")]
    Batch(String),
    #[error("the store writer is gone")]
    WriterGone,
    #[error(transparent)]
    Secret(#[from] crate::secrets::SecretError),
}

pub type Result<T> = std::result::Result<T, StoreError>;

#[derive(Clone, Debug)]
pub struct Db {
    /// Exactly one connection: every write transaction in this process goes through it.
    pub write: SqlitePool,
    pub read: SqlitePool,
    /// The audit chain's keys (its write connections hold them too: `audit_mac`).
    pub audit: Arc<audit::AuditKeys>,
}

/// How long a writer waits for another process's lock before giving up.
const BUSY_TIMEOUT: Duration = Duration::from_secs(10);

impl Db {
    /// Opens (creating the file and its folder when missing) and migrates.
    pub async fn open(path: &Path, synchronous_full: bool) -> Result<Db> {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            crate::private_fs::create_dir_all(dir)?;
        }
        private_files(path)?;
        let keys = Arc::new(audit::AuditKeys::derive(
            &crate::secrets::MasterKey::for_database(path)?,
        ));
        let signer = keys.clone();
        let opts = SqliteConnectOptions::from_str("sqlite://")?
            .filename(path)
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(if synchronous_full {
                SqliteSynchronous::Full
            } else {
                SqliteSynchronous::Normal
            })
            .busy_timeout(BUSY_TIMEOUT)
            .foreign_keys(true)
            .pragma("temp_store", "memory")
            // A backstop only: the store writer's checkpointer copies the WAL back every
            // 250 ms off the write path (see `writer::checkpointer`).
            .pragma("wal_autocheckpoint", "10000")
            .pragma("cache_size", "-16000");
        // No ping before each acquire: the connection is in-process (a dead worker thread
        // fails the next statement anyway), and the ping is a round trip to its thread.
        let write = SqlitePoolOptions::new()
            .max_connections(1)
            .min_connections(1)
            .test_before_acquire(false)
            .acquire_timeout(Duration::from_secs(30))
            .idle_timeout(None)
            .max_lifetime(None)
            .after_connect(move |conn, _meta| {
                let keys = signer.clone();
                Box::pin(async move {
                    let mut handle = conn.lock_handle().await?;
                    audit_mac::register(&mut handle, keys)
                        .map_err(|e| sqlx::Error::Configuration(e.into()))?;
                    Ok(())
                })
            })
            .connect_with(opts.clone())
            .await?;
        sqlx::migrate!("./migrations/sqlite").run(&write).await?;
        let read = SqlitePoolOptions::new()
            .max_connections(4)
            .min_connections(1)
            .acquire_timeout(Duration::from_secs(30))
            .idle_timeout(None)
            .max_lifetime(None)
            .connect_with(opts.read_only(true))
            .await?;
        Ok(Db {
            write,
            read,
            audit: keys,
        })
    }

    /// `PRAGMA integrity_check`: "ok" or the first problem found.
    pub async fn integrity_check(&self) -> Result<String> {
        Ok(sqlx::query_scalar("PRAGMA integrity_check")
            .fetch_one(&self.read)
            .await?)
    }

    pub async fn close(&self) {
        self.read.close().await;
        self.write.close().await;
    }
}

/// The database file and its `-wal` and `-shm` are for the gateway's user only (they hold
/// token hashes, the ledger and the audit log). SQLite creates `-wal` and `-shm` with the
/// mode of the database file, so a missing database is created 0600 before SQLite opens
/// it; files an older version left readable by others are tightened, with a warning.
fn private_files(path: &Path) -> Result<()> {
    match std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
    {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(e.into()),
    }
    for suffix in ["", "-wal", "-shm"] {
        let p = PathBuf::from(format!("{}{suffix}", path.display()));
        let Ok(meta) = std::fs::metadata(&p) else {
            continue;
        };
        let mode = meta.permissions().mode();
        if mode & 0o077 != 0 {
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600))?;
            tracing::warn!(file = %p.display(), mode = format!("{:o}", mode & 0o777), "database file was readable by others; its mode is now 0600");
        }
    }
    Ok(())
}

/// Whether every migration this binary carries has been applied to the database.
pub async fn migrations_applied(pool: &SqlitePool) -> Result<bool> {
    let applied: i64 =
        sqlx::query_scalar("SELECT COUNT(*) FROM _sqlx_migrations WHERE success = 1")
            .fetch_one(pool)
            .await?;
    Ok(applied as usize >= sqlx::migrate!("./migrations/sqlite").migrations.len())
}
