//! Stored responses on PostgreSQL (see `store::responses`). An id holding a NUL cannot be
//! stored, so it is not found without asking.

use chrono::{DateTime, Utc};
use sqlx::PgPool;

use super::text;
use crate::clock::db_time;
use crate::store::responses::{owners, StoredResponse};
use crate::store::Result;

/// As `store::responses`' (the owners, then the row).
const GET: &str = concat!(
    owners!("$1"),
    "SELECT id, token_id, created_at, input, response FROM stored_responses
     WHERE id = $1 AND created_at > $3 AND $2 IN (SELECT id FROM owners)"
);

const DELETE: &str = concat!(
    owners!("$1"),
    "DELETE FROM stored_responses WHERE id = $1 AND created_at > $3 AND $2 IN (SELECT id FROM owners)"
);

pub async fn put(pool: &PgPool, row: &StoredResponse) -> Result<()> {
    text::check(&[
        ("input", Some(&row.input)),
        ("response", Some(&row.response)),
    ])?;
    sqlx::query("INSERT INTO stored_responses (id, token_id, created_at, input, response) VALUES ($1, $2, $3, $4, $5)")
        .bind(&row.id)
        .bind(row.token_id)
        .bind(&row.created_at)
        .bind(&row.input)
        .bind(&row.response)
        .execute(pool)
        .await?;
    Ok(())
}

pub async fn get(
    pool: &PgPool,
    id: &str,
    token_id: i64,
    since: DateTime<Utc>,
) -> Result<Option<StoredResponse>> {
    if !text::storable(id) {
        return Ok(None);
    }
    Ok(sqlx::query_as(GET)
        .bind(id)
        .bind(token_id)
        .bind(db_time(since))
        .fetch_optional(pool)
        .await?)
}

pub async fn delete(pool: &PgPool, id: &str, token_id: i64, since: DateTime<Utc>) -> Result<bool> {
    if !text::storable(id) {
        return Ok(false);
    }
    Ok(sqlx::query(DELETE)
        .bind(id)
        .bind(token_id)
        .bind(db_time(since))
        .execute(pool)
        .await?
        .rows_affected()
        > 0)
}

/// At most `limit` of the rows stored before `before` (`store::responses::sweep`).
pub async fn sweep_batch(pool: &PgPool, before: DateTime<Utc>, limit: usize) -> Result<u64> {
    Ok(sqlx::query(
        "DELETE FROM stored_responses WHERE id IN
             (SELECT id FROM stored_responses WHERE created_at <= $1 LIMIT $2)",
    )
    .bind(db_time(before))
    .bind(limit as i64)
    .execute(pool)
    .await?
    .rows_affected())
}
