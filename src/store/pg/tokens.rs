//! Sub-token rows (PostgreSQL; see `store::tokens`). Bumping the token epoch also notifies
//! every listening host in the same transaction (`pg::notify`): they drop cached
//! credentials when it commits, instead of at their next poll.

use chrono::{DateTime, Utc};
use sqlx::{PgConnection, PgPool};

use super::notify::{self, Epoch};
use super::text;
use crate::auth::token::TokenHash;
use crate::clock::db_time;
use crate::store::tokens::{auth_select, NewTokenRow, TokenAuthRow, TokenSummary};
use crate::store::Result;

pub async fn insert(
    conn: &mut PgConnection,
    t: &NewTokenRow<'_>,
    now: DateTime<Utc>,
) -> Result<i64> {
    text::check(&[
        ("prefix", Some(t.prefix)),
        ("downgrade model", t.downgrade_model),
    ])?;
    let models = t
        .models
        .map(|m| serde_json::to_string(m).unwrap_or_else(|_| "[]".into()));
    Ok(sqlx::query_scalar(
        "INSERT INTO tokens (user_id, token_hash, prefix, models, rpm, tpm, max_priority, downgrade_model,
                             limit_micros, remaining_micros, reset, period, expires_at, created_at)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14) RETURNING id",
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
    .fetch_one(conn)
    .await?)
}

/// A live token (not revoked, user not disabled) by hash: the request path's auth read,
/// one indexed lookup (`tokens.token_hash` is unique).
pub async fn find_auth(pool: &PgPool, hash: &TokenHash) -> Result<Option<TokenAuthRow>> {
    Ok(sqlx::query_as(auth_select!("t.token_hash = $1"))
        .bind(&hash[..])
        .fetch_optional(pool)
        .await?)
}

/// A live token by id (as `store::tokens::find_auth_by_id`).
pub async fn find_auth_by_id(pool: &PgPool, id: i64) -> Result<Option<TokenAuthRow>> {
    Ok(sqlx::query_as(auth_select!("t.id = $1"))
        .bind(id)
        .fetch_optional(pool)
        .await?)
}

/// Tokens with their spend in the current period (as `store::tokens::list`).
pub async fn list(pool: &PgPool) -> Result<Vec<TokenSummary>> {
    let mut rows: Vec<TokenSummary> = sqlx::query_as(
        "SELECT t.id, t.prefix, u.username AS user, tm.name AS team, t.limit_micros, t.remaining_micros,
                t.reserved_micros, t.period, t.reset, t.expires_at, t.revoked_at IS NOT NULL AS revoked,
                t.rpm, t.tpm, t.models AS models_json, t.successor_id,
                CASE WHEN t.limit_micros IS NOT NULL THEN t.limit_micros - t.remaining_micros - t.reserved_micros
                     ELSE COALESCE((SELECT SUM(l.amount_micros) FROM ledger l WHERE l.token_id = t.id AND l.period = t.period
                                    AND l.kind IN ('reserve', 'settle', 'adjust')), 0)::BIGINT - t.reserved_micros END AS spent_micros
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

/// Marks a token revoked and bumps the token epoch. `false` if there was no such live token.
pub async fn revoke(conn: &mut PgConnection, id: i64, now: DateTime<Utc>) -> Result<bool> {
    let done =
        sqlx::query("UPDATE tokens SET revoked_at = $1 WHERE id = $2 AND revoked_at IS NULL")
            .bind(db_time(now))
            .bind(id)
            .execute(&mut *conn)
            .await?
            .rows_affected()
            == 1;
    if done {
        bump_epoch(conn).await?;
    }
    Ok(done)
}

/// Every change that could make a cached credential stale bumps this counter (and, on
/// commit, notifies the listeners).
pub async fn bump_epoch(conn: &mut PgConnection) -> Result<()> {
    notify::bump(conn, Epoch::Token).await
}

pub async fn epoch(pool: &PgPool) -> Result<i64> {
    Ok(
        sqlx::query_scalar("SELECT value FROM meta WHERE key = 'token_epoch'")
            .fetch_one(pool)
            .await?,
    )
}

/// `epoch` and the database's clock (`clock_timestamp()`, in ms since the Unix epoch) at
/// the read.
pub async fn epoch_and_clock(pool: &PgPool) -> Result<(i64, i64)> {
    Ok(sqlx::query_as(
        "SELECT value, (EXTRACT(EPOCH FROM clock_timestamp()) * 1000)::BIGINT FROM meta WHERE key = 'token_epoch'",
    )
    .fetch_one(pool)
    .await?)
}

/// How many tokens the database holds (revoked ones too).
pub async fn count(pool: &PgPool) -> Result<i64> {
    Ok(sqlx::query_scalar("SELECT COUNT(*) FROM tokens")
        .fetch_one(pool)
        .await?)
}
