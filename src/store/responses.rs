//! Stored responses of the Responses API (`POST /v1/responses` with `store`): the
//! conversation up to one response, kept for `previous_response_id`, `GET` and `DELETE`.
//! Every read and delete is scoped to the token that made the row: another token's id is
//! not found, as a missing one is.

use chrono::{DateTime, Utc};

use super::Result;
use crate::clock::db_time;

/// A row to store or one read back. `input` and `response` are JSON text.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct StoredResponse {
    pub id: String,
    pub token_id: i64,
    pub created_at: String,
    pub input: String,
    pub response: String,
}

pub async fn put(db: &super::Db, row: &StoredResponse) -> Result<()> {
    let sqlite = match &db.backend {
        super::Backend::Sqlite(sqlite) => sqlite,
        super::Backend::Postgres(pg) => return super::pg::responses::put(&pg.pool, row).await,
    };
    sqlx::query("INSERT INTO stored_responses (id, token_id, created_at, input, response) VALUES (?, ?, ?, ?, ?)")
        .bind(&row.id)
        .bind(row.token_id)
        .bind(&row.created_at)
        .bind(&row.input)
        .bind(&row.response)
        .execute(&sqlite.write)
        .await?;
    Ok(())
}

/// Hands every response `from` stored to `to` (a rotation: the new token, and the old text
/// working as it, continue the old token's conversations).
pub async fn hand_over(tx: &mut super::Tx, from: i64, to: i64) -> Result<()> {
    if let Some((conn, _)) = tx.pg() {
        return super::pg::responses::hand_over(conn, from, to).await;
    }
    sqlx::query("UPDATE stored_responses SET token_id = ? WHERE token_id = ?")
        .bind(to)
        .bind(from)
        .execute(tx.sqlite()?)
        .await?;
    Ok(())
}

/// The row `id` if `token_id` made it and it is younger than `since`.
pub async fn get(
    db: &super::Db,
    id: &str,
    token_id: i64,
    since: DateTime<Utc>,
) -> Result<Option<StoredResponse>> {
    let sqlite = match &db.backend {
        super::Backend::Sqlite(sqlite) => sqlite,
        super::Backend::Postgres(pg) => {
            return super::pg::responses::get(&pg.pool, id, token_id, since).await
        }
    };
    Ok(sqlx::query_as(
        "SELECT id, token_id, created_at, input, response FROM stored_responses WHERE id = ? AND token_id = ? AND created_at > ?",
    )
    .bind(id)
    .bind(token_id)
    .bind(db_time(since))
    .fetch_optional(&sqlite.read)
    .await?)
}

/// Deletes the row `id` if `token_id` made it and it is younger than `since` (an older one
/// is gone for every verb, as for `get`, swept yet or not); whether there was one.
pub async fn delete(db: &super::Db, id: &str, token_id: i64, since: DateTime<Utc>) -> Result<bool> {
    let sqlite = match &db.backend {
        super::Backend::Sqlite(sqlite) => sqlite,
        super::Backend::Postgres(pg) => {
            return super::pg::responses::delete(&pg.pool, id, token_id, since).await
        }
    };
    Ok(
        sqlx::query(
            "DELETE FROM stored_responses WHERE id = ? AND token_id = ? AND created_at > ?",
        )
        .bind(id)
        .bind(token_id)
        .bind(db_time(since))
        .execute(&sqlite.write)
        .await?
        .rows_affected()
            > 0,
    )
}

/// Deletes the rows stored before `before` (the retention); how many.
pub async fn sweep(db: &super::Db, before: DateTime<Utc>) -> Result<u64> {
    let sqlite = match &db.backend {
        super::Backend::Sqlite(sqlite) => sqlite,
        super::Backend::Postgres(pg) => return super::pg::responses::sweep(&pg.pool, before).await,
    };
    Ok(
        sqlx::query("DELETE FROM stored_responses WHERE created_at <= ?")
            .bind(db_time(before))
            .execute(&sqlite.write)
            .await?
            .rows_affected(),
    )
}
