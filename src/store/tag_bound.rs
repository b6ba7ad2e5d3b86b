//! The spend rollup's bound on tag cardinality: at most `[finance] max_tag_values_per_day`
//! distinct values of one tag key on one UTC day get their own rows in `spend_days`; a
//! later value of that key rolls up under `tags::OTHER`. Without it a tag unique to each
//! request (`trace:<id>`) makes the rollup one row per request and reports slow down. The
//! request row keeps its exact tags; only its rollup row's tag text differs, so spend by
//! tag still sums to the total.
//!
//! `spend_tag_values` holds the values admitted per (day, key); `spend_tag_bound` the bound
//! (written from the config at start, so every writer reads it in its own transaction). A
//! value is admitted in the transaction that writes its request row: on SQLite one writer
//! at a time, so the bound is exact; on PostgreSQL two hosts' batches committing at once can
//! each admit the last free places (at most one batch's new values per concurrent writer
//! past the bound).

use crate::tags::Tags;

use super::raw::Param;
use super::writer::Tx;
use super::Result;

/// Admits (day, key, value) while the day's key has room (a known value is left as it is) …
const ADMIT: &str = "INSERT OR IGNORE INTO spend_tag_values (day, key, value)
     SELECT ?1, ?2, ?3 WHERE (SELECT COUNT(*) FROM spend_tag_values WHERE day = ?1 AND key = ?2)
                             < (SELECT max_values FROM spend_tag_bound)";
/// … and whether it is admitted, now or before.
const ADMITTED: &str =
    "SELECT COUNT(*) FROM spend_tag_values WHERE day = ?1 AND key = ?2 AND value = ?3";

/// The UTC day of a database time (`YYYY-MM-DD…`), as the rollup keys it.
pub fn day(created_at: &str) -> &str {
    created_at.get(..10).unwrap_or(created_at)
}

/// The rollup's tag text of a request logged at `created_at` with `tags` (the writer's
/// transaction, SQLite).
pub fn bounded_tx(tx: &mut Tx<'_>, created_at: &str, tags: &str) -> Result<String> {
    let parsed = Tags::stored(tags);
    let mut over = Vec::new();
    for (key, value) in parsed.pairs() {
        let params = [Param::Text(day(created_at)), key.into(), value.into()];
        tx.execute(ADMIT, &params)?;
        if tx
            .query_row(ADMITTED, &params, |r| r.int(0))?
            .flatten()
            .unwrap_or(0)
            == 0
        {
            over.push(key.to_string());
        }
    }
    Ok(rolled(parsed, tags, over))
}

/// `bounded_tx` in a transaction of the pool (SQLite, `requests::insert_batch`).
pub async fn bounded(
    conn: &mut sqlx::SqliteConnection,
    created_at: &str,
    tags: &str,
) -> Result<String> {
    let parsed = Tags::stored(tags);
    let mut over = Vec::new();
    for (key, value) in parsed.pairs() {
        sqlx::query(ADMIT)
            .bind(day(created_at))
            .bind(key)
            .bind(value)
            .execute(&mut *conn)
            .await?;
        let admitted: i64 = sqlx::query_scalar(ADMITTED)
            .bind(day(created_at))
            .bind(key)
            .bind(value)
            .fetch_one(&mut *conn)
            .await?;
        if admitted == 0 {
            over.push(key.to_string());
        }
    }
    Ok(rolled(parsed, tags, over))
}

/// The text with the keys past the bound rolled up (the same text when none is).
pub(crate) fn rolled(parsed: Tags, text: &str, over: Vec<String>) -> String {
    if over.is_empty() {
        return text.to_string();
    }
    parsed.rolled_up(&over).canonical()
}

/// Writes the configured bound (at start; the last replica started sets it for all).
pub async fn set_bound(db: &super::Db, max_values: u32) -> Result<()> {
    let n = i64::from(max_values);
    match &db.backend {
        super::Backend::Postgres(pg) => {
            sqlx::query("UPDATE spend_tag_bound SET max_values = $1")
                .bind(n)
                .execute(&pg.pool)
                .await?;
        }
        super::Backend::Sqlite(_) => {
            let mut tx = db.begin().await?;
            sqlx::query("UPDATE spend_tag_bound SET max_values = ?")
                .bind(n)
                .execute(tx.sqlite()?)
                .await?;
            tx.commit().await?;
        }
    }
    Ok(())
}
