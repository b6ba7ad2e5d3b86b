//! All SQL lives below this module, and nothing above it knows the engine (`Db`, `Tx`; the
//! guard is `tests/api/store_boundary.rs`). SQLite in WAL mode: one writer connection per process
//! (writers queue in-process instead of fighting over the file lock; other processes wait
//! on `busy_timeout`), and a small pool of readers that never block it.

pub mod admins;
pub mod audit;
mod audit_mac;
pub mod backup;
pub mod cache;
pub mod directory;
pub mod finance;
pub mod ledger;
pub mod lingering;
pub mod managed;
pub mod migrate;
pub mod oidc;
pub mod pg;
pub mod prices;
pub mod processes;
pub mod raw;
mod readers;
pub mod reports;
pub mod requests;
pub mod responses;
pub mod rotate;
pub mod sessions;
pub mod spend;
pub mod tag_bound;
pub mod tags;
pub mod tenants;
pub mod token_admin;
pub mod tokens;
pub mod writer;

#[cfg(test)]
mod cache_evict_test;
#[cfg(test)]
mod cache_ids_test;
#[cfg(test)]
mod tx_test;
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
    /// A change the store refuses as it stands (it names the field): a 400 at the edge.
    #[error("{0}")]
    Invalid(String),
    /// A statement run through the raw handle (`raw`) failed.
    #[error("database error: {message} (code {code})")]
    Sqlite { code: i32, message: String },
    /// The write batch this operation was part of failed as a whole; nothing of it was kept.
    #[error("write batch failed: {0}")]
    Batch(String),
    /// The write batch's COMMIT was sent but its answer never came (the connection broke,
    /// or the batch timed out while committing): it may have landed or not. Otherwise as
    /// `Batch` (`is_unavailable`); the money path remembers such a reservation and has its
    /// sweep settle it at 0 (`quota::reservation::Quota::settle_unsure`).
    #[error("write batch's COMMIT got no answer (it may have landed): {0}")]
    CommitUnknown(String),
    #[error("the store writer is gone")]
    WriterGone,
    /// An operation given a bound (a cache hit's budget read) not done within it.
    #[error("{0} was not done in time")]
    NotInTime(&'static str),
    #[error(transparent)]
    Secret(#[from] crate::secrets::SecretError),
    /// What this engine does not do (a file backup of a PostgreSQL database: `pg_dump`'s
    /// job), named for the operator.
    #[error("{0}")]
    Unsupported(String),
    /// The audit log as it stands cannot be trusted to record: an appended row that was
    /// not written as it was, or triggers on the table that are not the schema's.
    #[error("{0}")]
    Audit(String),
}

impl StoreError {
    /// A store operation this engine does not do (yet); `what` names it for the operator.
    pub(crate) fn unsupported(what: &str) -> StoreError {
        StoreError::Unsupported(format!("{what} is not available on this database engine"))
    }
}

impl StoreError {
    /// Whether the database was out of reach (a connection refused or cut, no connection
    /// in time, a write batch whose BEGIN or COMMIT failed, SQLite busy past its timeout,
    /// PostgreSQL's transient SQLSTATEs: `pg::is_transient`) rather than refusing this
    /// operation: the caller may try again shortly. On the money
    /// path nothing was reserved then (`quota::reservation`), and the gateway answers 503.
    pub fn is_unavailable(&self) -> bool {
        match self {
            StoreError::Sql(
                sqlx::Error::Io(_)
                | sqlx::Error::Tls(_)
                | sqlx::Error::Protocol(_)
                | sqlx::Error::PoolTimedOut
                | sqlx::Error::PoolClosed
                | sqlx::Error::WorkerCrashed,
            )
            | StoreError::Batch(_)
            | StoreError::CommitUnknown(_)
            | StoreError::WriterGone
            | StoreError::NotInTime(_) => true,
            // SQLITE_BUSY and SQLITE_LOCKED (and their extended codes).
            StoreError::Sqlite { code, .. } => code & 0xff == 5 || code & 0xff == 6,
            StoreError::Sql(sqlx::Error::Database(db)) => {
                let Some(code) = db.code() else {
                    return false;
                };
                if db
                    .try_downcast_ref::<sqlx::postgres::PgDatabaseError>()
                    .is_some()
                {
                    // PostgreSQL's SQLSTATEs for "not now" (`pg::is_transient`). Its codes
                    // are SQLSTATEs, never SQLite result codes: 22021 (a NUL in text) is a
                    // refusal, though its low byte is 5.
                    pg::is_transient(&code)
                } else {
                    // SQLite's busy and locked (and their extended codes).
                    code.parse::<i32>()
                        .is_ok_and(|n| n & 0xff == 5 || n & 0xff == 6)
                }
            }
            _ => false,
        }
    }
}

pub type Result<T> = std::result::Result<T, StoreError>;

/// The database, whichever engine holds it. Nothing above the store knows which: callers
/// open it, begin transactions on it (`begin`) and hand it (or a `Tx`) to the store's
/// functions, which dispatch on the engine inside. Today SQLite is the only engine; another
/// is another `Backend` arm, added inside `src/store/` only.
#[derive(Clone, Debug)]
pub struct Db {
    backend: Backend,
    /// The audit chain's keys (its write connections hold them too: `audit_mac`).
    pub audit: Arc<audit::AuditKeys>,
    /// Seals and opens the upstream keys stored here (`managed`).
    pub seal: Arc<crate::secrets::seal::Sealer>,
    /// Slots for cache hits' budget reads (`cache::budget_remaining`).
    budget_reads: Arc<tokio::sync::Semaphore>,
}

#[derive(Clone, Debug)]
enum Backend {
    Sqlite(SqlitePools),
    Postgres(pg::PgDb),
}

/// The SQLite engine's two pools. Code outside the store never sees them; tests reach them
/// through `Db::sqlite` to check what was written.
#[derive(Clone, Debug)]
pub struct SqlitePools {
    /// Exactly one connection: every write transaction in this process goes through it.
    pub write: SqlitePool,
    pub read: SqlitePool,
    /// Read-only connections of the store's own, for the request path's short reads
    /// (`readers::Readers`).
    readers: Arc<readers::Readers>,
}

/// A write transaction begun by `Db::begin` (on SQLite: `BEGIN IMMEDIATE` on the one write
/// connection, so it waits for the lock up front instead of failing at its first write).
/// Store functions that take `&mut Tx` run inside it; dropped without `commit`, it rolls
/// back.
pub struct Tx {
    inner: TxInner,
}

enum TxInner {
    Sqlite(sqlx::Transaction<'static, sqlx::Sqlite>),
    Postgres {
        tx: sqlx::Transaction<'static, sqlx::Postgres>,
        audit: Arc<audit::AuditKeys>,
    },
}

impl Tx {
    pub async fn commit(self) -> Result<()> {
        match self.inner {
            TxInner::Sqlite(tx) => Ok(tx.commit().await?),
            TxInner::Postgres { tx, .. } => Ok(tx.commit().await?),
        }
    }

    pub async fn rollback(self) -> Result<()> {
        match self.inner {
            TxInner::Sqlite(tx) => Ok(tx.rollback().await?),
            TxInner::Postgres { tx, .. } => Ok(tx.rollback().await?),
        }
    }

    /// The SQLite connection this transaction runs on (store functions only); an error
    /// naming `what` on another engine.
    pub(in crate::store) fn sqlite(&mut self) -> Result<&mut sqlx::SqliteConnection> {
        match &mut self.inner {
            TxInner::Sqlite(tx) => Ok(tx),
            TxInner::Postgres { .. } => Err(StoreError::unsupported("this operation")),
        }
    }

    /// The PostgreSQL connection this transaction runs on and the audit chain's keys (store
    /// functions only), or `None` on SQLite.
    pub(in crate::store) fn pg(
        &mut self,
    ) -> Option<(&mut sqlx::PgConnection, &Arc<audit::AuditKeys>)> {
        match &mut self.inner {
            TxInner::Postgres { tx, audit } => Some((tx, audit)),
            TxInner::Sqlite(_) => None,
        }
    }
}

/// How long a writer waits for another process's lock before giving up.
const BUSY_TIMEOUT: Duration = Duration::from_secs(10);

/// The same wait on PostgreSQL, for the admin advisory lock and every lock after it in the
/// transaction (`Db::begin`).
pub(crate) const ADMIN_LOCK_TIMEOUT: &str = "SET LOCAL lock_timeout = '10s'";

impl Db {
    /// Opens the database `[database] url` names (creating a SQLite file and its folder
    /// when missing) and migrates it.
    pub async fn connect(settings: &crate::config::Settings) -> Result<Db> {
        Db::connect_to_verify(settings).await?.checked().await
    }

    /// `connect` under the master key `key` instead of the one the settings name (the new
    /// key, right after `sluice secrets rotate`), with the same checks.
    pub async fn connect_with_key(
        settings: &crate::config::Settings,
        key: &crate::secrets::MasterKey,
    ) -> Result<Db> {
        let db = match settings.database_postgres_url() {
            Some(url) => Db::open_postgres(url, key).await?,
            None => {
                let synchronous_full = settings.quota.synchronous == "full";
                Db::open_with_key(&settings.database_path(), synchronous_full, key).await?
            }
        };
        db.checked().await
    }

    /// The checks of `connect` on an opened database: closed and refused if it fails them.
    async fn checked(self) -> Result<Db> {
        let db = self;
        // A trigger that is not the schema's can drop or rewrite audit rows as they are
        // written, which neither the chain nor the head would show (`audit::triggers`):
        // nothing starts on such a database. A guard that is only missing or disabled
        // hides nothing the chain and the head do not show; it is named here and by
        // `sluice audit verify`, which fails on it.
        match audit::triggers(&db).await {
            Ok(t) if !t.unexpected.is_empty() => {
                db.close().await;
                return Err(StoreError::Audit(t.problems().join("\n")));
            }
            Ok(t) => {
                for m in &t.missing {
                    tracing::warn!(problem = %m, "audit log guard");
                }
            }
            Err(e) => {
                db.close().await;
                return Err(e);
            }
        }
        // On PostgreSQL, a host with another key would sign rows no other host can verify
        // (the first one at once: its audit head's start): refused before it writes
        // anything.
        if db.postgres().is_some() && audit::signed_with(&db, &db.audit).await? == Some(false) {
            db.close().await;
            return Err(crate::secrets::SecretError::SharedKeyMismatch.into());
        }
        if let Err(e) = managed::check_master_key(&db).await {
            db.close().await;
            return Err(e);
        }
        Ok(db)
    }

    /// `connect` without its refusal of a key that signed no audit row, for `sluice audit
    /// verify`, which appends nothing: a chain rewritten under another key from its first
    /// row looks like a host of another key, and verify is how the operator with the right
    /// key finds out which (it names the rows and the head that fail, and the key when
    /// every one does).
    pub async fn connect_to_verify(settings: &crate::config::Settings) -> Result<Db> {
        if let Some(url) = settings.database_postgres_url() {
            let key = crate::secrets::MasterKey::for_shared_database(
                settings.database.key_file.as_deref(),
            )?;
            return Db::open_postgres(url, &key).await;
        }
        let synchronous_full = settings.quota.synchronous == "full";
        Db::open(&settings.database_path(), synchronous_full).await
    }

    /// Connects to the PostgreSQL database at `url` (`postgres://…`) and migrates it. Every
    /// host on it must hold the same master key (`key`): it keys the audit chain they all
    /// append to.
    pub async fn open_postgres(url: &str, key: &crate::secrets::MasterKey) -> Result<Db> {
        let keys = Arc::new(audit::AuditKeys::derive(key));
        let pg = pg::PgDb::connect(url, keys.clone()).await?;
        Ok(Db {
            backend: Backend::Postgres(pg),
            audit: keys,
            seal: Arc::new(crate::secrets::seal::Sealer::new(key)),
            budget_reads: cache::budget_read_slots(),
        })
    }

    /// Opens (creating the file and its folder when missing) and migrates the SQLite
    /// database at `path`.
    pub async fn open(path: &Path, synchronous_full: bool) -> Result<Db> {
        let master = crate::secrets::MasterKey::for_database(path)?;
        Db::open_with_key(path, synchronous_full, &master).await
    }

    /// `open` under the master key `master`, whatever the environment or the key file say.
    pub async fn open_with_key(
        path: &Path,
        synchronous_full: bool,
        master: &crate::secrets::MasterKey,
    ) -> Result<Db> {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            crate::private_fs::create_dir_all(dir)?;
        }
        private_files(path)?;
        let keys = Arc::new(audit::AuditKeys::derive(master));
        let seal = Arc::new(crate::secrets::seal::Sealer::new(master));
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
        // No ping before each acquire, on either pool: the connection is in-process (a
        // dead worker thread fails the next statement anyway), and the ping is a round trip
        // to its thread — before every read too, a cache hit's budget read among them.
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
            .test_before_acquire(false)
            .acquire_timeout(Duration::from_secs(30))
            .idle_timeout(None)
            .max_lifetime(None)
            .connect_with(opts.read_only(true))
            .await?;
        Ok(Db {
            backend: Backend::Sqlite(SqlitePools {
                write,
                read,
                readers: Arc::new(readers::Readers::new(path.to_path_buf())),
            }),
            audit: keys,
            seal,
            budget_reads: cache::budget_read_slots(),
        })
    }

    /// The SQLite pools, for tests that check what was written. Production code never
    /// calls it: it would tie its caller to the engine (`tests/api/store_boundary.rs`).
    #[doc(hidden)]
    pub fn sqlite(&self) -> &SqlitePools {
        match &self.backend {
            Backend::Sqlite(p) => p,
            // Tests only: a test that checks SQLite's files was handed another engine.
            Backend::Postgres(_) => panic!("a SQLite check on a PostgreSQL database"),
        }
    }

    /// The PostgreSQL database, for tests that check what was written (`None` on SQLite).
    /// Production code never calls it (`tests/api/store_boundary.rs`).
    #[doc(hidden)]
    pub fn postgres(&self) -> Option<&pg::PgDb> {
        match &self.backend {
            Backend::Postgres(p) => Some(p),
            Backend::Sqlite(_) => None,
        }
    }

    /// Which engine holds the database, for the operator (logs, `/readyz`, `sluice status`).
    pub fn engine(&self) -> &'static str {
        match &self.backend {
            Backend::Sqlite(_) => "sqlite",
            Backend::Postgres(_) => "postgres",
        }
    }

    /// Begins a write transaction (see `Tx`). On PostgreSQL every host's admin and CLI
    /// write transactions take one advisory lock first, so they run one at a time as they
    /// do on SQLite's single writer (their read-then-write checks stay true until commit);
    /// the money path does not take it (its rows are locked one by one, `pg::ledger`).
    pub async fn begin(&self) -> Result<Tx> {
        match &self.backend {
            Backend::Sqlite(p) => Ok(Tx {
                inner: TxInner::Sqlite(p.write.begin_with("BEGIN IMMEDIATE").await?),
            }),
            Backend::Postgres(p) => {
                let mut tx = p.pool.begin().await?;
                // Bounded like SQLite's busy timeout: a transaction stuck holding the lock
                // (a frozen host, a connection idle in transaction) fails this one with
                // `lock_not_available` (55P03, `is_unavailable`) instead of blocking every
                // admin and CLI write on every host for ever.
                sqlx::query(ADMIN_LOCK_TIMEOUT).execute(&mut *tx).await?;
                sqlx::query("SELECT pg_advisory_xact_lock($1)")
                    .bind(pg::ADMIN_WRITE_LOCK)
                    .execute(&mut *tx)
                    .await?;
                Ok(Tx {
                    inner: TxInner::Postgres {
                        tx,
                        audit: p.audit.clone(),
                    },
                })
            }
        }
    }

    /// Begins a read-only transaction on a reader: one snapshot, and it never waits for a
    /// writer (nor makes one wait). Dropped, it ends.
    pub async fn begin_read(&self) -> Result<Tx> {
        match &self.backend {
            Backend::Sqlite(p) => Ok(Tx {
                inner: TxInner::Sqlite(p.read.begin().await?),
            }),
            Backend::Postgres(p) => {
                let tx = p
                    .pool
                    .begin_with("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
                    .await?;
                Ok(Tx {
                    inner: TxInner::Postgres {
                        tx,
                        audit: p.audit.clone(),
                    },
                })
            }
        }
    }

    /// Begins a read that sees every audit row whose signing was announced
    /// (`AuditKeys::wait_appended` wakes before the row's transaction commits). On SQLite:
    /// a deferred `BEGIN` on this process's write connection, so it begins only once the
    /// write transaction in flight (if any) has ended. On PostgreSQL: READ COMMITTED (each
    /// statement sees what committed before it began), after a shared hold of the chain's
    /// advisory lock, which every append keeps until its commit: it waits for the appends
    /// in flight on every host. A snapshot (`begin_read`) would be taken before the lock is
    /// granted and miss the very row that woke the caller. It takes no write lock.
    pub async fn begin_read_after_writes(&self) -> Result<Tx> {
        match &self.backend {
            Backend::Sqlite(p) => Ok(Tx {
                inner: TxInner::Sqlite(p.write.begin().await?),
            }),
            Backend::Postgres(p) => {
                let mut tx = p
                    .pool
                    .begin_with("BEGIN ISOLATION LEVEL READ COMMITTED READ ONLY")
                    .await?;
                sqlx::query("SELECT pg_advisory_xact_lock_shared($1)")
                    .bind(pg::audit::CHAIN_LOCK)
                    .execute(&mut *tx)
                    .await?;
                Ok(Tx {
                    inner: TxInner::Postgres {
                        tx,
                        audit: p.audit.clone(),
                    },
                })
            }
        }
    }

    /// `PRAGMA integrity_check` on SQLite: "ok" or the first problem found. PostgreSQL
    /// checks its own pages (data checksums, `amcheck`); there it answers "ok" once the
    /// server answers at all.
    pub async fn integrity_check(&self) -> Result<String> {
        match &self.backend {
            Backend::Sqlite(p) => Ok(sqlx::query_scalar("PRAGMA integrity_check")
                .fetch_one(&p.read)
                .await?),
            Backend::Postgres(p) => {
                sqlx::query("SELECT 1").execute(&p.pool).await?;
                Ok("ok".into())
            }
        }
    }

    pub async fn close(&self) {
        match &self.backend {
            Backend::Sqlite(p) => {
                p.readers.close();
                p.read.close().await;
                p.write.close().await;
            }
            Backend::Postgres(p) => p.close().await,
        }
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

/// A change committed elsewhere (another host, the CLI) that cached state must follow.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    /// A credential may be stale (revocation, edit, disabled user): drop the token cache.
    Tokens,
    /// Cache entries were invalidated.
    Cache,
    /// Managed upstream keys, deployments or models changed: rebuild the catalog.
    Catalog,
    /// Changes may have been missed (the listener (re)connected): treat everything as
    /// changed.
    Unknown,
}

impl Db {
    /// Hears changes as other hosts commit them, where the engine can tell (PostgreSQL:
    /// `LISTEN sluice_epoch`, `pg::notify`), and calls `on` for each; the task ends when the
    /// database is closed. `None` where it cannot (SQLite: the epoch polls are the only
    /// way, and on one host they are enough). Either way the polls stay the fallback.
    pub fn hear_changes(
        &self,
        on: impl Fn(Change) + Send + Sync + 'static,
    ) -> Option<tokio::task::JoinHandle<()>> {
        use pg::notify::{Epoch, Heard};
        let keys = self.audit.clone();
        match &self.backend {
            Backend::Sqlite(_) => None,
            Backend::Postgres(p) => Some(pg::notify::listen(&p.pool, move |h| {
                on(match h {
                    Heard::Bumped(Epoch::Token) => Change::Tokens,
                    Heard::Bumped(Epoch::Cache) => Change::Cache,
                    Heard::Bumped(Epoch::Catalog) => Change::Catalog,
                    // Another host's audit row: this host's head exporter follows it.
                    Heard::AuditAppended => return keys.appended(),
                    Heard::Lost => {
                        keys.appended();
                        Change::Unknown
                    }
                })
            })),
        }
    }
}

/// Whether every migration this binary carries has been applied to the database.
pub async fn migrations_applied(db: &Db) -> Result<bool> {
    const APPLIED: &str = "SELECT COUNT(*) FROM _sqlx_migrations WHERE success";
    Ok(match &db.backend {
        Backend::Sqlite(p) => {
            let applied: i64 = sqlx::query_scalar(APPLIED).fetch_one(&p.read).await?;
            applied as usize >= sqlx::migrate!("./migrations/sqlite").migrations.len()
        }
        Backend::Postgres(p) => {
            let applied: i64 = sqlx::query_scalar(APPLIED).fetch_one(&p.pool).await?;
            applied as usize >= sqlx::migrate!("./migrations/postgres").migrations.len()
        }
    })
}
