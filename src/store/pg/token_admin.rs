//! Sub-tokens as the admin surface lists and edits them (PostgreSQL; see
//! `store::token_admin`). Every edit bumps the token epoch (and notifies, `pg::notify`).

use chrono::{DateTime, Utc};
use sqlx::{PgConnection, PgPool};

use super::text;
use super::tokens::bump_epoch;
use crate::clock::db_time;
use crate::store::token_admin::{Limits, TokenRow};
use crate::store::{Result, StoreError};

const SELECT: &str = "SELECT t.id, t.prefix, t.name, t.user_id, u.username AS user, u.team_id, tm.name AS team,
        t.limit_micros, t.remaining_micros, t.reserved_micros, t.reset, t.period, t.rpm, t.tpm, t.models AS models_json,
        t.max_priority, t.downgrade_model, t.expires_at, t.revoked_at, t.last_used_at, t.created_at, t.tags, t.successor_id,
        COALESCE((SELECT SUM(l.amount_micros) FROM ledger l WHERE l.token_id = t.id AND l.period = t.period
                  AND l.kind IN ('reserve', 'settle', 'adjust')), 0)::BIGINT - t.reserved_micros AS spent_micros
     FROM tokens t JOIN users u ON u.id = t.user_id JOIN teams tm ON tm.id = u.team_id";

/// Tokens in scope, live ones first, newest first.
/// `store::token_admin::list`'s rows, one past its `LIST_MAX` when there are more.
pub async fn list(
    pool: &PgPool,
    scope: Option<i64>,
    user: Option<i64>,
    now: DateTime<Utc>,
) -> Result<Vec<TokenRow>> {
    Ok(sqlx::query_as(&format!(
        "{SELECT} WHERE ($1::BIGINT IS NULL OR u.team_id = $1) AND ($2::BIGINT IS NULL OR t.user_id = $2)
         ORDER BY (t.revoked_at IS NOT NULL OR t.successor_id IS NOT NULL OR COALESCE(t.expires_at <= $3, FALSE)), t.id DESC
         LIMIT {}",
        crate::store::token_admin::LIST_MAX + 1
    ))
    .bind(scope)
    .bind(user)
    .bind(db_time(now))
    .fetch_all(pool)
    .await?)
}

pub async fn get(conn: &mut PgConnection, id: i64) -> Result<Option<TokenRow>> {
    Ok(sqlx::query_as(&format!("{SELECT} WHERE t.id = $1"))
        .bind(id)
        .fetch_optional(conn)
        .await?)
}

pub async fn set_limits(conn: &mut PgConnection, id: i64, l: &Limits) -> Result<()> {
    text::check(&[("downgrade model", l.downgrade_model.as_deref())])?;
    let models = match &l.models {
        Some(m) => Some(serde_json::to_string(m).map_err(|e| StoreError::Conflict(e.to_string()))?),
        None => None,
    };
    let done = sqlx::query(
        "UPDATE tokens SET rpm = $1, tpm = $2, models = $3, max_priority = $4, downgrade_model = $5, expires_at = $6
         WHERE id = $7 AND revoked_at IS NULL",
    )
    .bind(l.rpm)
    .bind(l.tpm)
    .bind(models)
    .bind(l.max_priority)
    .bind(&l.downgrade_model)
    .bind(l.expires_at.map(db_time))
    .bind(id)
    .execute(&mut *conn)
    .await?
    .rows_affected();
    if done == 0 {
        return Err(StoreError::NotFound(format!("live token {id}")));
    }
    bump_epoch(conn).await
}

/// Shortens a token's life to `at` (never lengthens it): the old half of a rotation.
pub async fn expire_at(conn: &mut PgConnection, id: i64, at: DateTime<Utc>) -> Result<()> {
    sqlx::query(
        "UPDATE tokens SET expires_at = CASE WHEN expires_at IS NULL OR expires_at > $1 THEN $1 ELSE expires_at END
         WHERE id = $2",
    )
    .bind(db_time(at))
    .bind(id)
    .execute(&mut *conn)
    .await?;
    bump_epoch(conn).await
}

/// `store::token_admin::lock`.
pub async fn lock(conn: &mut PgConnection, id: i64) -> Result<()> {
    sqlx::query("SELECT 1 FROM tokens WHERE id = $1 FOR NO KEY UPDATE")
        .bind(id)
        .execute(conn)
        .await?;
    Ok(())
}

/// As `store::token_admin::set_successor`.
pub async fn set_successor(conn: &mut PgConnection, id: i64, successor: i64) -> Result<()> {
    sqlx::query("UPDATE tokens SET successor_id = $1 WHERE id = $2")
        .bind(successor)
        .bind(id)
        .execute(&mut *conn)
        .await?;
    Ok(())
}

pub async fn set_name(conn: &mut PgConnection, id: i64, name: &str) -> Result<()> {
    text::check(&[("token name", Some(name))])?;
    sqlx::query("UPDATE tokens SET name = $1 WHERE id = $2")
        .bind(name)
        .bind(id)
        .execute(conn)
        .await?;
    Ok(())
}
