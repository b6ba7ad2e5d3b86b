//! Epoch changes heard at once across hosts: PostgreSQL `LISTEN/NOTIFY` on `sluice_epoch`.
//!
//! Every bump of `meta.token_epoch` or `meta.cache_epoch` notifies the channel in the same
//! statement (`bump`), so the notification is sent when — and only if — the change commits.
//! Each host runs one `listen` task on a connection of its own (not one of the pool's); its
//! callback drops the auth cache or the cache index at once. Nothing relies on it alone: a
//! notification sent while the listener was reconnecting is lost, so the epoch poll every
//! host runs anyway (`auth::Authenticator::refresh`, `cache::…::refresh`) stays the fallback,
//! and after every reconnection the callback hears `Heard::Lost` (drop everything: what was
//! missed is unknown).

use std::time::Duration;

use sqlx::postgres::{PgListener, PgPoolOptions};
use sqlx::{PgConnection, PgPool};

use crate::store::Result;

/// The channel every host listens on.
pub const CHANNEL: &str = "sluice_epoch";

/// The change counters hosts poll and hear.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Epoch {
    /// `token_epoch`: a credential may be stale (revocation, edit, disabled user).
    Token,
    /// `cache_epoch`: cache entries were invalidated.
    Cache,
    /// `catalog_epoch`: upstream keys, deployments or models managed in the admin changed.
    Catalog,
}

impl Epoch {
    fn key(self) -> &'static str {
        match self {
            Epoch::Token => "token_epoch",
            Epoch::Cache => "cache_epoch",
            Epoch::Catalog => "catalog_epoch",
        }
    }

    /// The notification's payload.
    pub fn payload(self) -> &'static str {
        match self {
            Epoch::Token => "token",
            Epoch::Cache => "cache",
            Epoch::Catalog => "catalog",
        }
    }

    fn parse(payload: &str) -> Option<Epoch> {
        [Epoch::Token, Epoch::Cache, Epoch::Catalog]
            .into_iter()
            .find(|e| e.payload() == payload)
    }
}

/// What the listener tells its callback.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Heard {
    Bumped(Epoch),
    /// An audit row was appended (by any host): each host's audit head follows the chain
    /// (`ops::audit_head`).
    AuditAppended,
    /// The listening connection was (re)established: notifications may have been missed,
    /// so every epoch should be treated as bumped.
    Lost,
}

/// Bumps an epoch and notifies `CHANNEL`, in one statement of the caller's transaction.
pub async fn bump(conn: &mut PgConnection, which: Epoch) -> Result<()> {
    sqlx::query(
        "WITH b AS (UPDATE meta SET value = value + 1 WHERE key = $1 RETURNING value)
         SELECT pg_notify($2, $3) FROM b",
    )
    .bind(which.key())
    .bind(CHANNEL)
    .bind(which.payload())
    .execute(conn)
    .await?;
    Ok(())
}

/// The payload of an audit append's notification (`audit_appended`).
const AUDIT: &str = "audit";

/// Notifies `CHANNEL` that an audit row was appended, sent when the caller's transaction
/// commits (no counter: a missed one is made up by the next, or by `Heard::Lost`).
pub async fn audit_appended(conn: &mut PgConnection) -> Result<()> {
    sqlx::query("SELECT pg_notify($1, $2)")
        .bind(CHANNEL)
        .bind(AUDIT)
        .execute(conn)
        .await?;
    Ok(())
}

/// The first pause before reconnecting the listener after an error.
const MIN_BACKOFF: Duration = Duration::from_millis(100);
/// The longest pause between two attempts to reconnect the listener.
const MAX_BACKOFF: Duration = Duration::from_secs(5);

/// Starts the listening task on a connection of its own, opened with `pool`'s options. It
/// ends when `pool` is closed. `on` runs on the task: it should be quick (drop a cache).
pub fn listen(
    pool: &PgPool,
    on: impl Fn(Heard) + Send + Sync + 'static,
) -> tokio::task::JoinHandle<()> {
    let main = pool.clone();
    let own = PgPoolOptions::new()
        .max_connections(1)
        .min_connections(0)
        .acquire_timeout(Duration::from_secs(5))
        // Its keepalives and bounds as every gateway session's (a load balancer's idle
        // timeout would drop it silently otherwise: s30 final attack F5).
        .after_connect(|conn, _| Box::pin(super::session_settings(conn, true)))
        .connect_lazy_with((*pool.connect_options()).clone());
    tokio::spawn(async move {
        let mut backoff = MIN_BACKOFF;
        while !main.is_closed() {
            let e = tokio::select! {
                _ = main.close_event() => break,
                e = session(&own, &on, &mut backoff) => e,
            };
            tracing::warn!(error = %e, channel = CHANNEL, "epoch listener lost its connection; the epoch poll covers meanwhile");
            tokio::select! {
                _ = main.close_event() => break,
                _ = tokio::time::sleep(backoff) => {}
            }
            backoff = (backoff * 2).min(MAX_BACKOFF);
        }
        own.close().await;
    })
}

/// One listener, until it fails (its error). sqlx re-establishes a lost connection (and its LISTEN)
/// itself before `try_recv` answers `None`; `Lost` is told only once LISTEN is in place
/// again, so anything bumped after the callback heard it is heard too.
async fn session(
    pool: &PgPool,
    on: &(impl Fn(Heard) + Send + Sync),
    backoff: &mut Duration,
) -> sqlx::Error {
    let mut listener = match PgListener::connect_with(pool).await {
        Ok(l) => l,
        Err(e) => return e,
    };
    if let Err(e) = listener.listen(CHANNEL).await {
        return e;
    }
    *backoff = MIN_BACKOFF;
    on(Heard::Lost);
    loop {
        let next = match listener.try_recv().await {
            Ok(next) => next,
            Err(e) => return e,
        };
        match next {
            Some(n) if n.payload() == AUDIT => on(Heard::AuditAppended),
            Some(n) => match Epoch::parse(n.payload()) {
                Some(e) => on(Heard::Bumped(e)),
                None => on(Heard::Lost),
            },
            None => on(Heard::Lost),
        }
    }
}
