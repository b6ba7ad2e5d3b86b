//! The audit log: append-only (triggers refuse UPDATE and DELETE) and hash-chained — each
//! row's hash is SHA-256 over the previous hash and the row's fields, so editing any row
//! breaks the chain from that row on, and `verify` names it.

use sha2::{Digest, Sha256};
use sqlx::{Row, SqliteConnection};

use super::raw::Conn;
use super::Result;
use crate::clock::db_time;

pub struct AuditEntry<'a> {
    pub actor: &'a str,
    pub address: &'a str,
    pub action: &'a str,
    pub target: &'a str,
    pub before: Option<&'a str>,
    pub after: Option<&'a str>,
}

const GENESIS: &str = "0000000000000000000000000000000000000000000000000000000000000000";

fn row_hash(prev: &str, e: &AuditEntry<'_>, created_at: &str) -> String {
    let mut h = Sha256::new();
    for part in [
        prev,
        e.actor,
        e.address,
        e.action,
        e.target,
        e.before.unwrap_or("\u{0}"),
        e.after.unwrap_or("\u{0}"),
        created_at,
    ] {
        h.update((part.len() as u64).to_be_bytes());
        h.update(part.as_bytes());
    }
    hex::encode(h.finalize())
}

/// Appends one row inside the caller's transaction, so the action and its audit row commit
/// together or not at all.
pub async fn append(
    conn: &mut SqliteConnection,
    e: &AuditEntry<'_>,
    now: chrono::DateTime<chrono::Utc>,
) -> Result<()> {
    let prev: Option<String> =
        sqlx::query_scalar("SELECT hash FROM audit_log ORDER BY id DESC LIMIT 1")
            .fetch_optional(&mut *conn)
            .await?;
    let prev = prev.unwrap_or_else(|| GENESIS.to_string());
    let created_at = db_time(now);
    let hash = row_hash(&prev, e, &created_at);
    sqlx::query(
        "INSERT INTO audit_log (actor, address, action, target, before, after, created_at, prev_hash, hash)
         VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
    )
    .bind(e.actor)
    .bind(e.address)
    .bind(e.action)
    .bind(e.target)
    .bind(e.before)
    .bind(e.after)
    .bind(&created_at)
    .bind(&prev)
    .bind(&hash)
    .execute(&mut *conn)
    .await?;
    Ok(())
}

/// `append` for a transaction run through the raw handle (`writer`).
pub fn append_tx(
    tx: &mut Conn<'_>,
    e: &AuditEntry<'_>,
    now: chrono::DateTime<chrono::Utc>,
) -> Result<()> {
    let prev = tx
        .query_row(
            "SELECT hash FROM audit_log ORDER BY id DESC LIMIT 1",
            &[],
            |r| r.text(0),
        )?
        .flatten()
        .unwrap_or_else(|| GENESIS.to_string());
    let created_at = db_time(now);
    let hash = row_hash(&prev, e, &created_at);
    tx.execute(
        "INSERT INTO audit_log (actor, address, action, target, before, after, created_at, prev_hash, hash)
         VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
        &[
            e.actor.into(),
            e.address.into(),
            e.action.into(),
            e.target.into(),
            e.before.into(),
            e.after.into(),
            (&created_at).into(),
            (&prev).into(),
            (&hash).into(),
        ],
    )?;
    Ok(())
}

/// Walks the chain; `Ok(None)` when intact, else the id of the first row that does not match.
pub async fn verify(pool: &sqlx::SqlitePool) -> Result<(u64, Option<i64>)> {
    let rows = sqlx::query("SELECT id, actor, address, action, target, before, after, created_at, prev_hash, hash FROM audit_log ORDER BY id")
        .fetch_all(pool)
        .await?;
    let mut prev = GENESIS.to_string();
    let mut checked = 0;
    for r in &rows {
        let (before, after): (Option<String>, Option<String>) = (r.get("before"), r.get("after"));
        let e = AuditEntry {
            actor: r.get("actor"),
            address: r.get("address"),
            action: r.get("action"),
            target: r.get("target"),
            before: before.as_deref(),
            after: after.as_deref(),
        };
        let stored_prev: &str = r.get("prev_hash");
        let stored: &str = r.get("hash");
        if stored_prev != prev || row_hash(&prev, &e, r.get("created_at")) != stored {
            return Ok((checked, Some(r.get("id"))));
        }
        prev = stored.to_string();
        checked += 1;
    }
    Ok((checked, None))
}

/// Appends one row in its own transaction (for events outside an admin transaction, such
/// as the gateway disabling an upstream key).
pub async fn record(
    pool: &sqlx::SqlitePool,
    e: &AuditEntry<'_>,
    now: chrono::DateTime<chrono::Utc>,
) -> Result<()> {
    let mut tx = pool.begin_with("BEGIN IMMEDIATE").await?;
    append(&mut tx, e, now).await?;
    tx.commit().await?;
    Ok(())
}
