//! Sub-token rows. The token text is never stored: rows are found by the SHA-256 of it.

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::FromRow;

use super::Result;
use crate::auth::token::TokenHash;
use crate::clock::db_time;
use crate::quota::period::Reset;

pub struct NewTokenRow<'a> {
    pub user_id: i64,
    pub hash: &'a TokenHash,
    pub prefix: &'a str,
    pub models: Option<&'a [String]>,
    pub rpm: Option<i64>,
    pub tpm: Option<i64>,
    pub max_priority: i64,
    pub downgrade_model: Option<&'a str>,
    pub limit_micros: Option<i64>,
    pub reset: Reset,
    pub expires_at: Option<DateTime<Utc>>,
}

pub async fn insert(tx: &mut super::Tx, t: &NewTokenRow<'_>, now: DateTime<Utc>) -> Result<i64> {
    if let Some((conn, _)) = tx.pg() {
        return super::pg::tokens::insert(conn, t, now).await;
    }
    let models = t
        .models
        .map(|m| serde_json::to_string(m).unwrap_or_else(|_| "[]".into()));
    let id = sqlx::query_scalar(
        "INSERT INTO tokens (user_id, token_hash, prefix, models, rpm, tpm, max_priority, downgrade_model,
                             limit_micros, remaining_micros, reset, period, expires_at, created_at)
         VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) RETURNING id",
    )
    .bind(t.user_id)
    .bind(&t.hash[..])
    .bind(t.prefix)
    .bind(models)
    .bind(t.rpm)
    .bind(t.tpm)
    .bind(t.max_priority)
    .bind(t.downgrade_model)
    .bind(t.limit_micros)
    .bind(t.limit_micros)
    .bind(t.reset.as_str())
    .bind(t.reset.period_key(now))
    .bind(t.expires_at.map(db_time))
    .bind(db_time(now))
    .fetch_one(tx.sqlite()?)
    .await?;
    Ok(id)
}

/// Everything the request path needs to know about a token, read once and cached.
#[derive(Debug, Clone, FromRow)]
pub struct TokenAuthRow {
    pub id: i64,
    pub user_id: i64,
    pub team_id: i64,
    pub prefix: String,
    pub models: Option<String>,
    pub rpm: Option<i64>,
    pub tpm: Option<i64>,
    pub user_rpm: Option<i64>,
    pub user_tpm: Option<i64>,
    pub max_priority: i64,
    pub downgrade_model: Option<String>,
    pub alert_percent: i64,
    pub limit_micros: Option<i64>,
    pub remaining_micros: Option<i64>,
    pub cache_ttl_seconds: Option<i64>,
    pub reset: String,
    pub user_reset: String,
    pub team_reset: String,
    pub expires_at: Option<String>,
    /// The token's and its team's default tags, canonical (`pipeline::tags`).
    pub tags: String,
    pub team_tags: String,
    /// The token it was rotated to: during the overlap this one authenticates as that one
    /// (`auth::Authenticator::authenticate`).
    pub successor_id: Option<i64>,
}

/// `find_auth`'s row, where `{key}` picks the token: by hash on the request path, by id for
/// a rotated token's successor.
macro_rules! auth_select {
    ($key:literal) => {
        concat!(
            "SELECT t.id, t.user_id, u.team_id, t.prefix, t.models, t.rpm, t.tpm, u.rpm AS user_rpm, u.tpm AS user_tpm,
                t.max_priority, t.downgrade_model, t.alert_percent, t.limit_micros, t.remaining_micros, t.cache_ttl_seconds, t.reset,
                u.reset AS user_reset, tm.reset AS team_reset, t.expires_at, t.tags, tm.tags AS team_tags, t.successor_id
         FROM tokens t JOIN users u ON u.id = t.user_id JOIN teams tm ON tm.id = u.team_id
         WHERE ",
            $key,
            " AND t.revoked_at IS NULL AND NOT u.disabled"
        )
    };
}
pub(crate) use auth_select;

/// A live token (not revoked, user not disabled) by hash. Expiry is checked by the caller
/// against the clock on every request, since cached rows outlive the moment of expiry.
pub async fn find_auth(db: &super::Db, hash: &TokenHash) -> Result<Option<TokenAuthRow>> {
    let sqlite = match &db.backend {
        super::Backend::Sqlite(s) => s,
        super::Backend::Postgres(pg) => return super::pg::tokens::find_auth(&pg.pool, hash).await,
    };
    let pool = &sqlite.read;
    Ok(sqlx::query_as(auth_select!("t.token_hash = ?"))
        .bind(&hash[..])
        .fetch_optional(pool)
        .await?)
}

/// A live token by id, as `find_auth` reads it: a rotated token's successor.
pub async fn find_auth_by_id(db: &super::Db, id: i64) -> Result<Option<TokenAuthRow>> {
    let sqlite = match &db.backend {
        super::Backend::Sqlite(s) => s,
        super::Backend::Postgres(pg) => {
            return super::pg::tokens::find_auth_by_id(&pg.pool, id).await
        }
    };
    Ok(sqlx::query_as(auth_select!("t.id = ?"))
        .bind(id)
        .fetch_optional(&sqlite.read)
        .await?)
}

/// One line of `token list --json` (DESIGN.md's "CLI JSON").
#[derive(Debug, Serialize, FromRow)]
pub struct TokenSummary {
    pub id: i64,
    pub prefix: String,
    pub user: String,
    pub team: String,
    pub limit_micros: Option<i64>,
    pub remaining_micros: Option<i64>,
    pub reserved_micros: i64,
    pub spent_micros: i64,
    pub period: String,
    pub reset: String,
    pub expires_at: Option<String>,
    pub revoked: bool,
    pub rpm: Option<i64>,
    pub tpm: Option<i64>,
    #[sqlx(skip)]
    pub models: Option<Vec<String>>,
    #[serde(skip)]
    pub models_json: Option<String>,
    /// Set once rotated: the token its text works as (not in the CLI JSON's contract).
    #[serde(skip)]
    pub successor_id: Option<i64>,
}

/// Tokens with their spend in the current period. `spent = limit − remaining − reserved`
/// when the token has a limit; from the ledger otherwise.
pub async fn list(db: &super::Db) -> Result<Vec<TokenSummary>> {
    let sqlite = match &db.backend {
        super::Backend::Sqlite(s) => s,
        super::Backend::Postgres(pg) => return super::pg::tokens::list(&pg.pool).await,
    };
    let pool = &sqlite.read;
    let mut rows: Vec<TokenSummary> = sqlx::query_as(
        "SELECT t.id, t.prefix, u.username AS user, tm.name AS team, t.limit_micros, t.remaining_micros,
                t.reserved_micros, t.period, t.reset, t.expires_at, t.revoked_at IS NOT NULL AS revoked,
                t.rpm, t.tpm, t.models AS models_json, t.successor_id,
                CASE WHEN t.limit_micros IS NOT NULL THEN t.limit_micros - t.remaining_micros - t.reserved_micros
                     ELSE COALESCE((SELECT SUM(l.amount_micros) FROM ledger l WHERE l.token_id = t.id AND l.period = t.period
                                    AND l.kind IN ('reserve', 'settle', 'adjust')), 0) - t.reserved_micros END AS spent_micros
         FROM tokens t JOIN users u ON u.id = t.user_id JOIN teams tm ON tm.id = u.team_id
         ORDER BY t.id",
    )
    .fetch_all(pool)
    .await?;
    for r in &mut rows {
        r.models = r
            .models_json
            .as_deref()
            .and_then(|m| serde_json::from_str(m).ok());
    }
    Ok(rows)
}

/// Marks a token revoked and bumps the change counter replicas poll. `false` if there was
/// no such live token.
pub async fn revoke(tx: &mut super::Tx, id: i64, now: DateTime<Utc>) -> Result<bool> {
    if let Some((conn, _)) = tx.pg() {
        return super::pg::tokens::revoke(conn, id, now).await;
    }
    let done = sqlx::query("UPDATE tokens SET revoked_at = ? WHERE id = ? AND revoked_at IS NULL")
        .bind(db_time(now))
        .bind(id)
        .execute(tx.sqlite()?)
        .await?
        .rows_affected()
        == 1;
    if done {
        bump_epoch(tx).await?;
    }
    Ok(done)
}

/// Every change that could make a cached credential stale bumps this counter.
pub async fn bump_epoch(tx: &mut super::Tx) -> Result<()> {
    if let Some((conn, _)) = tx.pg() {
        return super::pg::tokens::bump_epoch(conn).await;
    }
    sqlx::query("UPDATE meta SET value = value + 1 WHERE key = 'token_epoch'")
        .execute(tx.sqlite()?)
        .await?;
    Ok(())
}

pub async fn epoch(db: &super::Db) -> Result<i64> {
    let sqlite = match &db.backend {
        super::Backend::Sqlite(s) => s,
        super::Backend::Postgres(pg) => return super::pg::tokens::epoch(&pg.pool).await,
    };
    let pool = &sqlite.read;
    Ok(
        sqlx::query_scalar("SELECT value FROM meta WHERE key = 'token_epoch'")
            .fetch_one(pool)
            .await?,
    )
}

/// The token epoch and, on PostgreSQL, the database's clock read in the same statement
/// (milliseconds since the Unix epoch): the token cache's poll learns from it how far this
/// host's clock is from the database's (`auth::Authenticator::refresh`). `None` on SQLite,
/// where the one host's clock is the only one.
pub async fn epoch_and_clock(db: &super::Db) -> Result<(i64, Option<i64>)> {
    match &db.backend {
        super::Backend::Sqlite(_) => Ok((epoch(db).await?, None)),
        super::Backend::Postgres(pg) => {
            let (epoch, at) = super::pg::tokens::epoch_and_clock(&pg.pool).await?;
            Ok((epoch, Some(at)))
        }
    }
}

/// How many tokens the database holds (revoked ones too).
pub async fn count(db: &super::Db) -> Result<i64> {
    let sqlite = match &db.backend {
        super::Backend::Sqlite(s) => s,
        super::Backend::Postgres(pg) => return super::pg::tokens::count(&pg.pool).await,
    };
    Ok(sqlx::query_scalar("SELECT COUNT(*) FROM tokens")
        .fetch_one(&sqlite.read)
        .await?)
}
