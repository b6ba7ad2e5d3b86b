//! Appending to the audit chain on PostgreSQL, for the money path's own audit rows (a
//! period rollover). Merged with `pg::audit` at integration: the same row MAC as
//! `audit::append` (`AuditKeys::chain_mac` over prev, actor, address, action, target,
//! before, after, created_at), computed here because PostgreSQL does not hold the key.
//!
//! Appends are serialized by a transaction-scoped advisory lock taken before the previous
//! hash is read: two transactions (of this host or another) appending at once would both
//! read the same previous hash and fork the chain. The lock is held until COMMIT, so ids
//! follow the chain's order too.

use chrono::{DateTime, Utc};
use sqlx::PgConnection;

use crate::clock::db_time;
use crate::store::audit::{AuditEntry, AuditKeys, KEYED};
use crate::store::Result;

/// The advisory lock key of the audit chain (any constant every appender agrees on).
pub const AUDIT_LOCK: i64 = 0x5_11CE_A0D1;

const GENESIS: &str = "0000000000000000000000000000000000000000000000000000000000000000";

pub async fn append(
    conn: &mut PgConnection,
    keys: &AuditKeys,
    e: &AuditEntry<'_>,
    now: DateTime<Utc>,
) -> Result<()> {
    sqlx::query("SELECT pg_advisory_xact_lock($1)")
        .bind(AUDIT_LOCK)
        .execute(&mut *conn)
        .await?;
    let prev: Option<String> =
        sqlx::query_scalar("SELECT hash FROM audit_log ORDER BY id DESC LIMIT 1")
            .fetch_optional(&mut *conn)
            .await?;
    let prev = prev.unwrap_or_else(|| GENESIS.to_string());
    let created_at = db_time(now);
    let hash = keys.chain_mac(&[
        Some(prev.as_bytes()),
        Some(e.actor.as_bytes()),
        Some(e.address.as_bytes()),
        Some(e.action.as_bytes()),
        Some(e.target.as_bytes()),
        e.before.map(str::as_bytes),
        e.after.map(str::as_bytes),
        Some(created_at.as_bytes()),
    ]);
    sqlx::query(
        "INSERT INTO audit_log (actor, address, action, target, before, after, created_at, prev_hash, hash, chain)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)",
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
    .bind(KEYED)
    .execute(&mut *conn)
    .await?;
    keys.appended();
    Ok(())
}
