//! PostgreSQL: the pool, its migrations (`migrations/postgres`), and what every PostgreSQL
//! store module shares — running a transaction again on a serialization failure or a
//! deadlock, and telling such an error from the rest.
//!
//! The money path (`ledger`, `writer`, `processes`) mirrors the SQLite modules of the same
//! names function for function, with `&PgDb` (or the PostgreSQL `Writer`) where they take
//! the SQLite pool, connection or writer; docs/DESIGN.md "Money on PostgreSQL".

/// The database's time, as the stored text (`clock::db_time`'s format), at the start of the
/// current statement: what a token's expiry, and a cache entry's, is compared with. Hosts' clocks may disagree
/// by any amount ("Clock tolerance"); the database's is the one they share. The
/// statement's time (not `now()`, the transaction's start: a batch may wait on its locks;
/// not `clock_timestamp()`, which moves within a statement, so the check of a CTE and the
/// re-check of its `UPDATE` could disagree) is one value per statement, and fresh at each.
macro_rules! db_now {
    () => {
        "to_char(statement_timestamp() AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.MS\"Z\"')"
    };
}

pub mod admins;
pub mod audit;
pub mod cache;
pub mod directory;
pub mod finance;
pub mod ledger;
pub mod lingering;
pub mod managed;
pub mod notify;
pub mod oidc;
pub mod prices;
pub mod processes;
pub mod reports;
pub mod requests;
pub mod responses;
pub mod rotate;
pub mod sessions;
pub mod tag_bound;
pub mod tags;
pub mod tenants;
pub mod text;
pub mod token_admin;
pub mod tokens;
pub mod writer;

use std::future::Future;
use std::pin::Pin;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgConnection, PgPool, PgPoolOptions};
use sqlx::Connection;

use super::audit::AuditKeys;
use super::{Result, StoreError};

/// A PostgreSQL database: a pool of connections and the audit chain's keys (the gateway
/// signs audit rows itself; the key is never in the database).
#[derive(Clone, Debug)]
pub struct PgDb {
    pub pool: PgPool,
    pub audit: Arc<AuditKeys>,
}

/// How long a caller waits for a connection before the store answers with an error: the
/// money path fails closed (nothing is admitted without a committed reservation), and it
/// should say so quickly when the database is unreachable.
const ACQUIRE_TIMEOUT: Duration = Duration::from_secs(3);

/// How long a gateway session waits for any one lock (a row, an advisory lock) before the
/// statement fails with 55P03 `lock_not_available` (`is_transient`: a 503 on the money
/// path), well below the writer's `BATCH_TIMEOUT`. A lock wait is then ended by the server,
/// which releases everything the waiting transaction holds: a batch dropped by the client
/// alone left its backend queued on the lock, holding its budget rows, until the lock came
/// (s30 multi-host attack F3). `Db::begin` waits longer for the admin lock
/// (`ADMIN_LOCK_TIMEOUT`); migrations wait as long as they must (`PgDb::connect`).
pub const LOCK_TIMEOUT: &str = "2s";

/// How long a gateway session may sit idle inside a transaction before the server ends it
/// (25P03, `is_broken`), with its locks: a host paused (SIGSTOP, a frozen VM) between an
/// audit append and its commit keeps its TCP session alive, and held the chain's lock and
/// its batch's budget rows for as long as the pause. No transaction of the gateway or the
/// CLI waits on anything but the database between its statements (the long ones,
/// `migrate-store` and `secrets rotate`, turn it off for their own transaction).
pub const IDLE_IN_TRANSACTION_TIMEOUT: &str = "30s";

/// Server-side TCP keepalives on every gateway session, in seconds (idle, interval, count):
/// PostgreSQL ends the session of a host that vanished (power loss, a partition) after
/// about idle + interval × count = 30 s, and frees its locks (the liveness lock among
/// them, `processes`); a paused host's kernel still answers them. (No effect over a Unix
/// socket, where a vanished host cannot be.)
pub const KEEPALIVES: (u32, u32, u32) = (10, 5, 4);

/// Sets a gateway session up, right after it connects: READ COMMITTED whatever the
/// server's or the role's default (an audit append reads the chain's tip after it waits for
/// the chain lock, and a REPEATABLE READ snapshot fixed before that wait forked the chain:
/// s30 multi-host attack F1; the money path's "why READ COMMITTED is enough", `ledger`,
/// rests on it too) and `KEEPALIVES`; with `bounded`, `LOCK_TIMEOUT` and
/// `IDLE_IN_TRANSACTION_TIMEOUT` too, so no host frozen or cut off holds a lock others wait
/// for longer than about 30 s, and nobody waits on it longer than `LOCK_TIMEOUT`. `SET`s,
/// not startup `options`: a session-mode pooler (PgBouncer) refuses startup parameters it
/// does not track, so the gateway could not connect through one (s30 diff attack F4).
pub async fn session_settings(conn: &mut PgConnection, bounded: bool) -> sqlx::Result<()> {
    // A text without arguments goes as one simple query: the statements in one round trip.
    sqlx::Executor::execute(conn, SETTINGS[usize::from(bounded)].as_str()).await?;
    Ok(())
}

/// `session_settings`' statements: without, then with the bounds.
static SETTINGS: std::sync::LazyLock<[String; 2]> = std::sync::LazyLock::new(|| {
    let (idle, interval, count) = KEEPALIVES;
    let base = format!(
        "SET default_transaction_isolation = 'read committed'; \
         SET tcp_keepalives_idle = {idle}; SET tcp_keepalives_interval = {interval}; \
         SET tcp_keepalives_count = {count};"
    );
    let bounded = format!(
        "{base} SET lock_timeout = '{LOCK_TIMEOUT}'; \
         SET idle_in_transaction_session_timeout = '{IDLE_IN_TRANSACTION_TIMEOUT}';"
    );
    [base, bounded]
});

/// Opens one gateway session with `opts`, set up (`session_settings`, bounded).
pub async fn open_session(opts: &PgConnectOptions) -> sqlx::Result<PgConnection> {
    let mut conn = PgConnection::connect_with(opts).await?;
    session_settings(&mut conn, true).await?;
    Ok(conn)
}

/// The indexes the migrations build `CONCURRENTLY` (0020–0023), so that writes go on while
/// they build.
const BUILT_CONCURRENTLY: [&str; 4] = [
    "ledger_rollback_carries_token",
    "ledger_rollback_carries_user",
    "ledger_rollback_carries_team",
    "ledger_reserve_request",
];

/// Builds again, still without stopping writes, any of `BUILT_CONCURRENTLY` an
/// interrupted build left INVALID — never read, yet kept up on every write, and passed over
/// by its migration's `IF NOT EXISTS` when it ran again: dropped and created anew from its
/// own definition, both CONCURRENTLY. (`REINDEX … CONCURRENTLY` cut off in turn leaves a
/// `_ccnew` copy nothing would ever drop: s33 stop attack F2.) Only the indexes of the
/// schema the gateway's tables are found in.
async fn rebuild_invalid(conn: &mut PgConnection) -> Result<()> {
    let invalid: Vec<(String, String)> = sqlx::query_as(
        "SELECT c.relname::text, pg_get_indexdef(i.indexrelid)
         FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
         WHERE NOT i.indisvalid AND c.relname = ANY($1) AND pg_table_is_visible(c.oid)",
    )
    .bind(&BUILT_CONCURRENTLY[..])
    .fetch_all(&mut *conn)
    .await?;
    for (name, definition) in invalid {
        tracing::warn!(index = %name, "building again an index an interrupted migration left invalid");
        // The name is one of `BUILT_CONCURRENTLY` (no quoting needed); the definition is
        // PostgreSQL's own, `CREATE INDEX name ON …`.
        let Some(rest) = definition.strip_prefix("CREATE INDEX ") else {
            continue;
        };
        sqlx::query(&format!("DROP INDEX CONCURRENTLY IF EXISTS {name}"))
            .execute(&mut *conn)
            .await?;
        sqlx::query(&format!("CREATE INDEX CONCURRENTLY {rest}"))
            .execute(&mut *conn)
            .await?;
    }
    Ok(())
}

/// The lock one host holds while it migrates and rebuilds: the others wait by trying it
/// again every `MIGRATION_POLL`, each try a statement that ends at once. Waiting in sqlx's
/// own blocking `pg_advisory_lock` instead, a second host's statement stayed open for the
/// whole migration — and `CREATE INDEX CONCURRENTLY` waits for every transaction older than
/// its build to end, so the two deadlocked and PostgreSQL aborted one: a host failing to
/// start, or an index left invalid (s33 stop attack F1). Holding this one first, a host
/// reaches sqlx's lock only when no other host is migrating.
const MIGRATION_LOCK: i64 = 0x5_11CE_AD02;
const MIGRATION_POLL: Duration = Duration::from_millis(100);

async fn migrate(conn: &mut PgConnection) -> Result<()> {
    while !sqlx::query_scalar::<_, bool>("SELECT pg_try_advisory_lock($1)")
        .bind(MIGRATION_LOCK)
        .fetch_one(&mut *conn)
        .await?
    {
        tokio::time::sleep(MIGRATION_POLL).await;
    }
    let done = async {
        sqlx::migrate!("./migrations/postgres")
            .run(&mut *conn)
            .await?;
        rebuild_invalid(&mut *conn).await
    }
    .await;
    // The session's end releases it too, should this statement fail.
    sqlx::query("SELECT pg_advisory_unlock($1)")
        .bind(MIGRATION_LOCK)
        .execute(&mut *conn)
        .await?;
    done
}

impl PgDb {
    /// Connects to `url` (`postgres://…`) and applies the migrations. Every session the
    /// gateway opens is set up by `session_settings`: the pool's as it connects, the
    /// writer's and the liveness lock's through `open_session`.
    pub async fn connect(url: &str, audit: Arc<AuditKeys>) -> Result<PgDb> {
        let opts = PgConnectOptions::from_str(url)?;
        // Migrations run on a session of their own without the lock timeout: a host
        // starting while another migrates waits for sqlx's migration lock, and a schema
        // change waits for the transactions in flight, as long as they take.
        let mut migrating = PgConnection::connect_with(&opts).await?;
        session_settings(&mut migrating, false).await?;
        migrate(&mut migrating).await?;
        migrating.close().await?;
        let pool = PgPoolOptions::new()
            .max_connections(16)
            .min_connections(1)
            .acquire_timeout(ACQUIRE_TIMEOUT)
            .after_connect(|conn, _| Box::pin(session_settings(conn, true)))
            .connect_with(opts)
            .await?;
        Ok(PgDb { pool, audit })
    }

    pub async fn close(&self) {
        self.pool.close().await;
    }
}

/// The advisory lock every admin and CLI write transaction takes first (`Db::begin`), so
/// they run one at a time across hosts, as on SQLite's single writer.
pub const ADMIN_WRITE_LOCK: i64 = 0x5_11CE_AD01;

/// SQLSTATEs after which a transaction is run again from the start: nothing of it was kept,
/// and a second run, in another order of arrival, succeeds.
const SERIALIZATION_FAILURE: &str = "40001";
const DEADLOCK_DETECTED: &str = "40P01";
/// A lock wait past `lock_timeout`.
const LOCK_NOT_AVAILABLE: &str = "55P03";

/// Whether `e` is a serialization failure or a deadlock (see `transact`).
pub fn is_retryable(e: &StoreError) -> bool {
    match e {
        StoreError::Sql(sqlx::Error::Database(db)) => db
            .code()
            .is_some_and(|c| c == SERIALIZATION_FAILURE || c == DEADLOCK_DETECTED),
        _ => false,
    }
}

/// Whether a PostgreSQL SQLSTATE means "not now" rather than "no": the statement or
/// session was stopped by something other than its own content, and the same operation may
/// succeed shortly. `StoreError::is_unavailable` reads these as the database out of reach
/// (503 `service_degraded` on the money path, a retried request-log batch); every other
/// SQLSTATE is a refusal of this operation (a constraint, a NUL in text, a permission: a
/// 4xx or a 500 that names a bug). Pinned against a real server's errors:
/// `pg_transient::every_transient_postgres_error_is_unavailable_and_refusals_are_not`.
///
/// - class 08, connection exception (the connection failed or broke);
/// - 57014 `query_canceled` (`statement_timeout`, `pg_cancel_backend`: a cancel, or a
///   statement slower than the operator allows — a 500 before);
/// - 57P0x: 57P01 `admin_shutdown` (also `pg_terminate_backend`), 57P02 `crash_shutdown`,
///   57P03 `cannot_connect_now` (starting or in recovery), 57P04 `database_dropped`, 57P05
///   `idle_session_timeout`; 25P03 `idle_in_transaction_session_timeout`;
/// - 55P03 `lock_not_available` (a wait past `lock_timeout`, `Db::begin`);
/// - class 40 once `transact` and the writer have spent their retries (40001
///   serialization failure, 40P01 deadlock, 40003 statement completion unknown — the
///   transaction was rolled back, nothing of it kept);
/// - class 53, insufficient resources (53000, 53100 disk full, 53200 out of memory, 53300
///   too many connections, 53400 configuration limit exceeded);
/// - 58000 `system_error` and 58030 `io_error` (the server's own I/O failed).
///
/// A retry of these is the caller's (the client after `Retry-After`, `quota::reservation`'s
/// settlement loop, `pg::lingering`); the writer does not rerun a job that met one (a
/// statement timeout rerun at once meets the same load), it fails that job alone.
pub fn is_transient(code: &str) -> bool {
    code.starts_with("08")
        || code.starts_with("53")
        || code.starts_with("57P0")
        || code.starts_with("40")
        || matches!(code, "57014" | "25P03" | "55P03" | "58000" | "58030")
}

/// Whether `e` is a lock wait that ran past `LOCK_TIMEOUT` (55P03 `lock_not_available`).
pub fn is_lock_timeout(e: &StoreError) -> bool {
    matches!(e, StoreError::Sql(sqlx::Error::Database(db)) if db.code().is_some_and(|c| c == LOCK_NOT_AVAILABLE))
}

/// Whether `e` says the connection itself is unusable (the server went away, a network
/// error, or the server said so: SQLSTATE class 08, connection exception, 57P0x, the
/// server shutting down, and 25P03, a session ended for idling in a transaction): the
/// connection is dropped and a new one opened for the next
/// transaction.
pub fn is_broken(e: &StoreError) -> bool {
    if let StoreError::Sql(sqlx::Error::Database(db)) = e {
        return db
            .code()
            .is_some_and(|c| c.starts_with("08") || c.starts_with("57P0") || c == "25P03");
    }
    matches!(
        e,
        StoreError::Sql(
            sqlx::Error::Io(_)
                | sqlx::Error::Tls(_)
                | sqlx::Error::Protocol(_)
                | sqlx::Error::PoolTimedOut
                | sqlx::Error::PoolClosed
                | sqlx::Error::WorkerCrashed
        )
    )
}

/// How many times a transaction runs at most when it keeps meeting serialization failures
/// or deadlocks.
pub const MAX_ATTEMPTS: u32 = 8;

/// A pause before attempt `n` (1-based) of a transaction that failed on a serialization
/// failure or deadlock: exponential from 2 ms, capped at 100 ms, with full jitter, so the
/// transactions that collided do not collide again in step.
pub fn backoff(attempt: u32) -> Duration {
    use rand::Rng;
    let cap = 2u64.saturating_pow(attempt.min(6)).min(100);
    Duration::from_millis(rand::thread_rng().gen_range(1..=cap.max(1)))
}

/// The body of a transaction: it may run more than once (see `transact`).
pub type Body<'c, T> = Pin<Box<dyn Future<Output = Result<T>> + Send + 'c>>;

/// Runs `f` in a transaction (READ COMMITTED) on a connection of the pool, again on a
/// serialization failure or deadlock (bounded, `MAX_ATTEMPTS`, with jittered backoff).
/// Anything else is the caller's error; nothing of a failed run is kept.
pub async fn transact<T, F>(pool: &PgPool, mut f: F) -> Result<T>
where
    F: for<'c> FnMut(&'c mut PgConnection) -> Body<'c, T>,
{
    let mut attempt = 1;
    loop {
        let mut conn = pool.acquire().await?;
        let mut tx = conn.begin().await?;
        let out = match f(&mut tx).await {
            Ok(v) => tx.commit().await.map(|()| v).map_err(StoreError::from),
            Err(e) => {
                // A rollback that fails leaves the connection to sqlx, which closes it.
                let _ = tx.rollback().await;
                Err(e)
            }
        };
        match out {
            Err(e) if is_retryable(&e) && attempt < MAX_ATTEMPTS => {
                tracing::debug!(error = %e, attempt, "transaction runs again");
                tokio::time::sleep(backoff(attempt)).await;
                attempt += 1;
            }
            out => return out,
        }
    }
}
