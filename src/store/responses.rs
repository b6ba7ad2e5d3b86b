//! Stored responses of the Responses API (`POST /v1/responses` with `store`): the
//! conversation up to one response, kept for `previous_response_id`, `GET` and `DELETE`.
//! Every read and delete is scoped to the token that made the row and the tokens it was
//! rotated to (`tokens.successor_id`, however many): another
//! token's id is not found, as a missing one is. A rotation writes nothing here — moving a
//! token's rows rewrote whole conversations on the one write connection, and missed a row
//! stored by a request in flight across the rotation (s23 attack #1).

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

/// The tokens that reach the row `?1`: the one that stored it and those it was rotated
/// to, in order, each step a primary-key read of `tokens`. Unbounded — a token rotated
/// daily outlives any bound within the retention (s23 attack, third batch #4: a bound of 16
/// lost the conversation at the 17th rotation) — and finite: a successor is always a newer
/// token, so the walk only climbs ids.
macro_rules! owners {
    ($id:literal) => {
        concat!(
            "WITH RECURSIVE owners(id) AS (
                SELECT token_id FROM stored_responses WHERE id = ",
            $id,
            "
                UNION ALL
                SELECT t.successor_id FROM owners o JOIN tokens t ON t.id = o.id
                WHERE t.successor_id > o.id) "
        )
    };
}
pub(super) use owners;

const GET: &str = concat!(
    owners!("?1"),
    "SELECT id, token_id, created_at, input, response FROM stored_responses
     WHERE id = ?1 AND created_at > ?3 AND ?2 IN (SELECT id FROM owners)"
);

const DELETE: &str = concat!(
    owners!("?1"),
    "DELETE FROM stored_responses WHERE id = ?1 AND created_at > ?3 AND ?2 IN (SELECT id FROM owners)"
);

/// The row `id` if `token_id` made it (or a token rotated to it) and it is younger than
/// `since`.
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
    Ok(sqlx::query_as(GET)
        .bind(id)
        .bind(token_id)
        .bind(db_time(since))
        .fetch_optional(&sqlite.read)
        .await?)
}

/// Deletes the row `id` if `token_id` made it (or a token rotated to it) and it is younger than `since` (an older one
/// is gone for every verb, as for `get`, swept yet or not); whether there was one.
pub async fn delete(db: &super::Db, id: &str, token_id: i64, since: DateTime<Utc>) -> Result<bool> {
    let sqlite = match &db.backend {
        super::Backend::Sqlite(sqlite) => sqlite,
        super::Backend::Postgres(pg) => {
            return super::pg::responses::delete(&pg.pool, id, token_id, since).await
        }
    };
    Ok(sqlx::query(DELETE)
        .bind(id)
        .bind(token_id)
        .bind(db_time(since))
        .execute(&sqlite.write)
        .await?
        .rows_affected()
        > 0)
}

/// Rows the retention sweep deletes per statement.
pub const SWEEP_BATCH: usize = 500;

/// Deletes the rows stored before `before` (the retention), `SWEEP_BATCH` at a time, each
/// batch its own statement: a backlog deleted in one held the write connection the money
/// path shares (SQLite) for as long as it took; between batches the connection goes to
/// whoever waits for it. How many.
pub async fn sweep(db: &super::Db, before: DateTime<Utc>) -> Result<u64> {
    let mut deleted = 0;
    loop {
        let n = sweep_batch(db, before).await?;
        deleted += n;
        if n < SWEEP_BATCH as u64 {
            return Ok(deleted);
        }
        tokio::task::yield_now().await;
    }
}

/// Deletes at most `SWEEP_BATCH` of the rows stored before `before`; how many.
pub async fn sweep_batch(db: &super::Db, before: DateTime<Utc>) -> Result<u64> {
    let sqlite = match &db.backend {
        super::Backend::Sqlite(sqlite) => sqlite,
        super::Backend::Postgres(pg) => {
            return super::pg::responses::sweep_batch(&pg.pool, before, SWEEP_BATCH).await
        }
    };
    Ok(sqlx::query(
        "DELETE FROM stored_responses WHERE id IN
             (SELECT id FROM stored_responses WHERE created_at <= ? LIMIT ?)",
    )
    .bind(db_time(before))
    .bind(SWEEP_BATCH as i64)
    .execute(&sqlite.write)
    .await?
    .rows_affected())
}
