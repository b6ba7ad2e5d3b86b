//! Cache entries on PostgreSQL (see `store::cache`). What differs from SQLite:
//!
//! - A batch of entries is one upsert over arrays (`unnest`). SQLite's `INSERT OR REPLACE`
//!   deletes the old row and inserts a new one: the entry gets a new rowid and its hit
//!   count starts over. Here the upsert gives the row a new `id` (`id = DEFAULT`) and
//!   `hits = 0`, and a key twice in one batch keeps its last version, as the sequential
//!   SQLite statements do (PostgreSQL refuses to upsert one row twice in a statement).
//! - `cache_entries.id` is SQLite's rowid, which the in-memory indexes follow ("entries
//!   after id N"). That only works if ids become visible in order; with several hosts
//!   writing, a smaller id could commit after a larger one was already read past. Every
//!   batch takes a transaction-scoped advisory lock (`CACHE_LOCK`) before it draws ids, so
//!   batches commit one after another in id order.
//! - Every statement that writes many rows takes `CACHE_LOCK` too (`lock_writes`): entry
//!   batches lock rows in the order they arrive, hit counts in the join's, deletions in the
//!   scan's, so two of them running at once could each wait for a row the other holds —
//!   a deadlock, one of them failed (an admin's tag invalidation among them). One at a time,
//!   they never wait in a circle (s39 attack H2, H3).
//! - Tags are matched with `strpos`, exact and case-sensitive like SQLite's `instr`.

use chrono::{DateTime, Utc};
use sqlx::{PgConnection, PgPool};

use super::notify::{self, Epoch};
use super::text;
use crate::clock::db_time;
use crate::store::cache::{BudgetRow, EntryRow, IndexRow, KeyRow, NewEntry};
use crate::store::ledger::Owner;
use crate::store::Result;

/// The advisory lock cache writers take (an arbitrary constant: "sluice cache").
const CACHE_LOCK: i64 = 0x736c_7569_6365_0a02;

/// Takes `CACHE_LOCK` for the rest of the caller's transaction.
async fn lock_writes(conn: &mut PgConnection) -> Result<()> {
    sqlx::query("SELECT pg_advisory_xact_lock($1)")
        .bind(CACHE_LOCK)
        .execute(conn)
        .await?;
    Ok(())
}

/// The advisory lock the eviction past the cap takes, one host at a time (another constant).
const EVICT_LOCK: i64 = 0x736c_7569_6365_0a03;

pub async fn get(pool: &PgPool, key: &[u8], now: DateTime<Utc>) -> Result<Option<EntryRow>> {
    Ok(sqlx::query_as("SELECT key, answer, input_tokens, output_tokens, expires_at, version FROM cache_entries WHERE key = $1 AND expires_at > $2")
        .bind(key)
        .bind(db_time(now))
        .fetch_optional(pool)
        .await?)
}

/// An entry is written only while the table's epoch is the one it was planned under
/// (`NewEntry::epoch`; NULL: unknown, written as it is). The check sees every invalidation
/// committed before: both take `CACHE_LOCK` first, and the statement's snapshot is taken
/// after it.
const PUT: &str = "INSERT INTO cache_entries (key, scope, model, format, context_hash, vector, answer, input_tokens, output_tokens, tags, created_at, expires_at, version)
     SELECT key, scope, model, format, context_hash, vector, answer, input_tokens, output_tokens, tags, created_at, expires_at, version
     FROM unnest($1::bytea[], $2::text[], $3::text[], $4::text[], $5::bytea[], $6::bytea[], $7::text[],
                 $8::bigint[], $9::bigint[], $10::text[], $11::text[], $12::text[], $13::bigint[], $14::bigint[])
          AS e(key, scope, model, format, context_hash, vector, answer, input_tokens, output_tokens, tags, created_at, expires_at, version, epoch)
     WHERE e.epoch IS NULL OR e.epoch = (SELECT value FROM meta WHERE key = 'cache_epoch')
     ON CONFLICT (key) DO UPDATE SET id = DEFAULT, scope = EXCLUDED.scope, model = EXCLUDED.model, format = EXCLUDED.format,
        context_hash = EXCLUDED.context_hash, vector = EXCLUDED.vector, answer = EXCLUDED.answer,
        input_tokens = EXCLUDED.input_tokens, output_tokens = EXCLUDED.output_tokens, tags = EXCLUDED.tags,
        created_at = EXCLUDED.created_at, expires_at = EXCLUDED.expires_at, version = EXCLUDED.version, hits = 0";

/// Stores a batch of entries inside the caller's transaction, in one statement.
pub async fn put_batch_tx(conn: &mut PgConnection, entries: &[NewEntry]) -> Result<()> {
    // The last version of each key, in batch order otherwise; an entry PostgreSQL cannot
    // store (`pg::text`) is left out rather than failing the batch with it.
    let mut seen = std::collections::HashSet::with_capacity(entries.len());
    let mut last: Vec<&NewEntry> = entries
        .iter()
        .rev()
        .filter(|e| seen.insert(e.key))
        .filter(|e| {
            let ok = [&e.scope, &e.model, &e.answer, &e.tags]
                .iter()
                .all(|t| text::storable(t));
            if !ok {
                tracing::warn!("a cache entry with a NUL character is not stored");
            }
            ok
        })
        .collect();
    last.reverse();
    if last.is_empty() {
        return Ok(());
    }
    lock_writes(conn).await?;
    let text = |f: fn(&NewEntry) -> String| last.iter().map(|e| f(e)).collect::<Vec<String>>();
    let written = sqlx::query(PUT)
        .bind(last.iter().map(|e| e.key.to_vec()).collect::<Vec<_>>())
        .bind(text(|e| e.scope.clone()))
        .bind(text(|e| e.model.clone()))
        .bind(text(|e| e.format.to_string()))
        .bind(
            last.iter()
                .map(|e| e.context_hash.map(|c| c.to_vec()))
                .collect::<Vec<_>>(),
        )
        .bind(last.iter().map(|e| e.vector.clone()).collect::<Vec<_>>())
        .bind(text(|e| e.answer.clone()))
        .bind(last.iter().map(|e| e.input_tokens).collect::<Vec<_>>())
        .bind(last.iter().map(|e| e.output_tokens).collect::<Vec<_>>())
        .bind(text(|e| e.tags.clone()))
        .bind(text(|e| db_time(e.created_at)))
        .bind(text(|e| db_time(e.expires_at)))
        .bind(last.iter().map(|e| e.version).collect::<Vec<_>>())
        .bind(last.iter().map(|e| e.epoch).collect::<Vec<_>>())
        .execute(conn)
        .await?
        .rows_affected();
    crate::store::cache::refused((last.len() as u64).saturating_sub(written));
    Ok(())
}

/// Live entries stored after id `after` (0: all), oldest first (as `store::cache`).
pub async fn index_rows(
    pool: &PgPool,
    after: i64,
    now: DateTime<Utc>,
    limit: i64,
) -> Result<Vec<IndexRow>> {
    Ok(sqlx::query_as(
        "SELECT id, key, context_hash, vector FROM cache_entries WHERE id > $1 AND expires_at > $2 ORDER BY id LIMIT $3",
    )
    .bind(after)
    .bind(db_time(now))
    .bind(limit)
    .fetch_all(pool)
    .await?)
}

/// (id, key) of the live entries stored after id `after`.
pub async fn keys_after(pool: &PgPool, after: i64, now: DateTime<Utc>) -> Result<Vec<KeyRow>> {
    Ok(sqlx::query_as(
        "SELECT id, key, version FROM cache_entries WHERE id > $1 AND expires_at > $2 ORDER BY id",
    )
    .bind(after)
    .bind(db_time(now))
    .fetch_all(pool)
    .await?)
}

/// Deletes every entry carrying `tag` (the exact string `,tag,` inside `tags`, as on
/// SQLite: no wildcards, case-sensitive); returns the deleted keys. Bumps and notifies the
/// cache epoch, even when nothing went (as `store::cache::delete_tag`).
pub async fn delete_tag(pool: &PgPool, tag: &str) -> Result<Vec<Vec<u8>>> {
    let mut tx = pool.begin().await?;
    let keys = delete_tag_in(&mut tx, tag).await?;
    tx.commit().await?;
    Ok(keys)
}

/// `delete_tag` inside the caller's transaction (an admin's, with its audit row).
pub async fn delete_tag_in(conn: &mut PgConnection, tag: &str) -> Result<Vec<Vec<u8>>> {
    lock_writes(conn).await?;
    // A tag PostgreSQL cannot hold names no entry (none with it is stored, `put_batch_tx`).
    let keys: Vec<Vec<u8>> = if text::storable(tag) {
        sqlx::query_scalar("DELETE FROM cache_entries WHERE strpos(tags, $1) > 0 RETURNING key")
            .bind(format!(",{tag},"))
            .fetch_all(&mut *conn)
            .await?
    } else {
        Vec::new()
    };
    notify::bump(conn, Epoch::Cache).await?;
    Ok(keys)
}

/// Deletes the entries expired by the database's clock; returns their keys. `now` (the
/// host's time on the database's clock) can only hold it back: a host whose clock runs
/// ahead deleted every entry with less than its lead left, every host's, each minute
/// (s31 cache attack F3).
pub async fn evict_expired(pool: &PgPool, now: DateTime<Utc>) -> Result<Vec<Vec<u8>>> {
    let mut tx = pool.begin().await?;
    lock_writes(&mut tx).await?;
    let keys = sqlx::query_scalar(concat!(
        "DELETE FROM cache_entries WHERE expires_at <= LEAST($1, ",
        db_now!(),
        ") RETURNING key"
    ))
    .bind(db_time(now))
    .fetch_all(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(keys)
}

/// Deletes the entries past `max_entries` (`store::cache::past_cap`); returns their keys.
/// One host evicts at a time: the others, finding the lock taken, leave it to that one
/// (each counted and then deleted its own surplus, so hosts whose minutes met deleted it
/// once each; s31 cache attack F2).
pub async fn evict_over_cap(
    pool: &PgPool,
    max_entries: u64,
    now: DateTime<Utc>,
) -> Result<Vec<Vec<u8>>> {
    let cap = i64::try_from(max_entries).unwrap_or(i64::MAX);
    let mut tx = pool.begin().await?;
    let ours: bool = sqlx::query_scalar("SELECT pg_try_advisory_xact_lock($1)")
        .bind(EVICT_LOCK)
        .fetch_one(&mut *tx)
        .await?;
    if !ours {
        return Ok(Vec::new());
    }
    let count: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM cache_entries")
        .fetch_one(&mut *tx)
        .await?;
    if count <= cap {
        return Ok(Vec::new());
    }
    lock_writes(&mut tx).await?;
    let past = crate::store::cache::past_cap("$1", "$2");
    // One statement: the surplus is the one it sees, whatever another host did before.
    let keys = sqlx::query_scalar(&format!(
        "DELETE FROM cache_entries WHERE id IN ({past}) RETURNING key"
    ))
    .bind(cap)
    .bind(db_time(now))
    .fetch_all(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(keys)
}

/// `cache_epoch` as the caller's transaction sees it.
pub async fn epoch_in(conn: &mut PgConnection) -> Result<i64> {
    Ok(
        sqlx::query_scalar("SELECT value FROM meta WHERE key = 'cache_epoch'")
            .fetch_one(conn)
            .await?,
    )
}

pub async fn epoch(pool: &PgPool) -> Result<i64> {
    Ok(
        sqlx::query_scalar("SELECT value FROM meta WHERE key = 'cache_epoch'")
            .fetch_one(pool)
            .await?,
    )
}

/// Counts the hits of `keys` (a key once per hit) inside the caller's transaction, in one
/// statement, one write of many rows at a time (`lock_writes`).
pub async fn count_hits_tx(conn: &mut PgConnection, keys: &[[u8; 32]]) -> Result<()> {
    let (keys, counts): (Vec<Vec<u8>>, Vec<i64>) = crate::store::cache::tally(keys)
        .into_iter()
        .map(|(k, n)| (k.to_vec(), n))
        .unzip();
    lock_writes(conn).await?;
    sqlx::query(
        "UPDATE cache_entries AS c SET hits = c.hits + v.n
         FROM unnest($1::bytea[], $2::bigint[]) AS v(key, n) WHERE c.key = v.key",
    )
    .bind(keys)
    .bind(counts)
    .execute(conn)
    .await?;
    Ok(())
}

/// The budget rows of a token, its user and its team, for `store::cache::budget_remaining`
/// (which picks the tightest).
pub async fn budget_rows(pool: &PgPool, owner: &Owner) -> Result<Vec<BudgetRow>> {
    let rows = sqlx::query_as(
        "SELECT 0::BIGINT, limit_micros, remaining_micros, period FROM tokens WHERE id = $1
         UNION ALL SELECT 1::BIGINT, limit_micros, remaining_micros, period FROM users WHERE id = $2
         UNION ALL SELECT 2::BIGINT, limit_micros, remaining_micros, period FROM teams WHERE id = $3",
    )
    .bind(owner.token_id)
    .bind(owner.user_id)
    .bind(owner.team_id)
    .fetch_all(pool)
    .await?;
    Ok(rows)
}
