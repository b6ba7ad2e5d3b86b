//! Sub-tokens as the admin surface lists and edits them. Budgets are not edited here
//! (that is `ledger::set_limit` / `top_up`); every edit bumps the token epoch so each
//! replica's auth cache drops the stale row within a second.

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::FromRow;

use super::tokens::bump_epoch;
use super::{Result, StoreError};
use crate::clock::db_time;

#[derive(Debug, Clone, Serialize, FromRow)]
pub struct TokenRow {
    pub id: i64,
    pub prefix: String,
    pub name: String,
    pub user_id: i64,
    pub user: String,
    pub team_id: i64,
    pub team: String,
    pub limit_micros: Option<i64>,
    pub remaining_micros: Option<i64>,
    pub reserved_micros: i64,
    pub spent_micros: i64,
    pub reset: String,
    pub period: String,
    pub rpm: Option<i64>,
    pub tpm: Option<i64>,
    #[serde(skip)]
    pub models_json: Option<String>,
    pub max_priority: i64,
    pub downgrade_model: Option<String>,
    pub expires_at: Option<String>,
    pub revoked_at: Option<String>,
    pub last_used_at: Option<String>,
    pub created_at: String,
    /// Default tags, canonical (`pipeline::tags`).
    pub tags: String,
    /// The token this one was rotated to: during its overlap this one's text works as it.
    pub successor_id: Option<i64>,
}

impl TokenRow {
    pub fn models(&self) -> Option<Vec<String>> {
        self.models_json
            .as_deref()
            .and_then(|m| serde_json::from_str(m).ok())
    }
}

const SELECT: &str = "SELECT t.id, t.prefix, t.name, t.user_id, u.username AS user, u.team_id, tm.name AS team,
        t.limit_micros, t.remaining_micros, t.reserved_micros, t.reset, t.period, t.rpm, t.tpm, t.models AS models_json,
        t.max_priority, t.downgrade_model, t.expires_at, t.revoked_at, t.last_used_at, t.created_at, t.tags, t.successor_id,
        COALESCE((SELECT SUM(l.amount_micros) FROM ledger l WHERE l.token_id = t.id AND l.period = t.period
                  AND l.kind IN ('reserve', 'settle', 'adjust')), 0) - t.reserved_micros AS spent_micros
     FROM tokens t JOIN users u ON u.id = t.user_id JOIN teams tm ON tm.id = u.team_id";

/// The most tokens a list holds (`Listed::more` says when there were more).
pub const LIST_MAX: usize = 1000;

/// A list of tokens, and whether it was cut at `LIST_MAX`.
#[derive(Debug)]
pub struct Listed {
    pub rows: Vec<TokenRow>,
    pub more: bool,
}

impl Listed {
    fn of(mut rows: Vec<TokenRow>) -> Listed {
        let more = rows.len() > LIST_MAX;
        rows.truncate(LIST_MAX);
        Listed { rows, more }
    }
}

/// Tokens in scope (of `user` alone when given), live ones first — not revoked, rotated or
/// expired at `now` — then newest first; at most `LIST_MAX`. The user filter is the
/// query's: filtered after the cut, a user's live token among the dead ones past it was in
/// no list (s29 admin attack F2).
pub async fn list(
    db: &super::Db,
    scope: Option<i64>,
    user: Option<i64>,
    now: DateTime<Utc>,
) -> Result<Listed> {
    let sqlite = match &db.backend {
        super::Backend::Sqlite(s) => s,
        super::Backend::Postgres(pg) => {
            return super::pg::token_admin::list(&pg.pool, scope, user, now)
                .await
                .map(Listed::of)
        }
    };
    let pool = &sqlite.read;
    let rows = sqlx::query_as(&format!(
        "{SELECT} WHERE (?1 IS NULL OR u.team_id = ?1) AND (?2 IS NULL OR t.user_id = ?2)
         ORDER BY (t.revoked_at IS NOT NULL OR t.successor_id IS NOT NULL OR COALESCE(t.expires_at <= ?3, 0)), t.id DESC
         LIMIT {}",
        LIST_MAX + 1
    ))
    .bind(scope)
    .bind(user)
    .bind(db_time(now))
    .fetch_all(pool)
    .await?;
    Ok(Listed::of(rows))
}

pub async fn get(tx: &mut super::Tx, id: i64) -> Result<Option<TokenRow>> {
    if let Some((conn, _)) = tx.pg() {
        return super::pg::token_admin::get(conn, id).await;
    }
    Ok(sqlx::query_as(&format!("{SELECT} WHERE t.id = ?"))
        .bind(id)
        .fetch_optional(tx.sqlite()?)
        .await?)
}

/// Everything but the budget that an admin may change on a live token.
#[derive(Debug, Clone, Serialize)]
pub struct Limits {
    pub rpm: Option<i64>,
    pub tpm: Option<i64>,
    pub models: Option<Vec<String>>,
    pub max_priority: i64,
    pub downgrade_model: Option<String>,
    pub expires_at: Option<DateTime<Utc>>,
}

pub async fn set_limits(tx: &mut super::Tx, id: i64, l: &Limits) -> Result<()> {
    if let Some((conn, _)) = tx.pg() {
        return super::pg::token_admin::set_limits(conn, id, l).await;
    }
    let models = match &l.models {
        Some(m) => Some(serde_json::to_string(m).map_err(|e| StoreError::Conflict(e.to_string()))?),
        None => None,
    };
    let done = sqlx::query(
        "UPDATE tokens SET rpm = ?, tpm = ?, models = ?, max_priority = ?, downgrade_model = ?, expires_at = ?
         WHERE id = ? AND revoked_at IS NULL",
    )
    .bind(l.rpm)
    .bind(l.tpm)
    .bind(models)
    .bind(l.max_priority)
    .bind(&l.downgrade_model)
    .bind(l.expires_at.map(db_time))
    .bind(id)
    .execute(tx.sqlite()?)
    .await?
    .rows_affected();
    if done == 0 {
        return Err(StoreError::NotFound(format!("live token {id}")));
    }
    bump_epoch(tx).await
}

/// Shortens a token's life to `at` (never lengthens it): the old half of a rotation.
pub async fn expire_at(tx: &mut super::Tx, id: i64, at: DateTime<Utc>) -> Result<()> {
    if let Some((conn, _)) = tx.pg() {
        return super::pg::token_admin::expire_at(conn, id, at).await;
    }
    let at = db_time(at);
    sqlx::query(
        "UPDATE tokens SET expires_at = CASE WHEN expires_at IS NULL OR expires_at > ?1 THEN ?1 ELSE expires_at END
         WHERE id = ?2",
    )
    .bind(&at)
    .bind(id)
    .execute(tx.sqlite()?)
    .await?;
    bump_epoch(tx).await
}

/// Holds token `id`'s row until `tx` ends, so what `tx` reads of it next (its remaining
/// budget) no reservation changes meanwhile. On SQLite the transaction already holds the
/// write lock; on PostgreSQL the row lock the money path takes too.
pub async fn lock(tx: &mut super::Tx, id: i64) -> Result<()> {
    if let Some((conn, _)) = tx.pg() {
        return super::pg::token_admin::lock(conn, id).await;
    }
    Ok(())
}

/// Names the token `id` was rotated to: during its overlap `id` authenticates as it.
pub async fn set_successor(tx: &mut super::Tx, id: i64, successor: i64) -> Result<()> {
    if let Some((conn, _)) = tx.pg() {
        return super::pg::token_admin::set_successor(conn, id, successor).await;
    }
    sqlx::query("UPDATE tokens SET successor_id = ? WHERE id = ?")
        .bind(successor)
        .bind(id)
        .execute(tx.sqlite()?)
        .await?;
    Ok(())
}

pub async fn set_name(tx: &mut super::Tx, id: i64, name: &str) -> Result<()> {
    if let Some((conn, _)) = tx.pg() {
        return super::pg::token_admin::set_name(conn, id, name).await;
    }
    sqlx::query("UPDATE tokens SET name = ? WHERE id = ?")
        .bind(name)
        .bind(id)
        .execute(tx.sqlite()?)
        .await?;
    Ok(())
}
