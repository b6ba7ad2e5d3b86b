//! The audit log on PostgreSQL (see `store::audit` for the chain and its rules). What
//! differs from SQLite:
//!
//! - The MAC is computed here, in Rust, not by a SQL function of the connection: the same
//!   bytes under the same key (`AuditKeys::chain_mac` over prev, actor, address, action,
//!   target, before, after, created_at), so a chain written on SQLite and copied row for
//!   row verifies here, and the reverse.
//! - Many hosts append at once. Each append takes a transaction-scoped advisory lock
//!   (`CHAIN_LOCK`) before it reads the newest hash, so two appends cannot both link to
//!   the same row: the second waits until the first commits and then, its next statement
//!   taking a new snapshot (READ COMMITTED), reads the first one's row. A row lock on the
//!   newest row would not do it: an empty table has no row to lock. Holding the lock to
//!   commit also makes ids commit in order, so `ORDER BY id` is chain order.
//!   Callers must run appends in READ COMMITTED transactions (the default).

use chrono::{DateTime, Utc};
use sha2::{Digest, Sha256};
use sqlx::postgres::PgRow;
use sqlx::{PgConnection, PgPool, Row};

use super::text;
use crate::clock::db_time;
use crate::store::audit::{
    AuditEntry, AuditKeys, Broken, ChainState, HEAD_STARTED, KEYED, SEAL, UNSIGNED,
};
use crate::store::Result;

/// The advisory lock of the chain's tip (an arbitrary constant: "sluice audit").
pub(crate) const CHAIN_LOCK: i64 = 0x736c_7569_6365_0a01;

/// The previous hash of the first row (as `store::audit`).
const GENESIS: &str = "0000000000000000000000000000000000000000000000000000000000000000";
/// `chain` of rows from before the chain was keyed (as `store::audit`).
const LEGACY: &str = "sha256";

fn entry_of(r: &PgRow) -> AuditEntry<'_> {
    AuditEntry {
        actor: r.get("actor"),
        address: r.get("address"),
        action: r.get("action"),
        target: r.get("target"),
        before: r.get("before"),
        after: r.get("after"),
    }
}

/// The row MAC: the field list `store::audit_mac` hands to `AuditKeys::chain_mac`.
fn row_mac(keys: &AuditKeys, prev: &str, e: &AuditEntry<'_>, created_at: &str) -> String {
    keys.chain_mac(&[
        Some(prev.as_bytes()),
        Some(e.actor.as_bytes()),
        Some(e.address.as_bytes()),
        Some(e.action.as_bytes()),
        Some(e.target.as_bytes()),
        e.before.map(str::as_bytes),
        e.after.map(str::as_bytes),
        Some(created_at.as_bytes()),
    ])
}

/// The chain before keying (as `store::audit`'s `legacy_hash`): rows copied from an old
/// SQLite database carry it.
fn legacy_hash(prev: &str, e: &AuditEntry<'_>, created_at: &str) -> String {
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

/// Whether `e` is the seal of exactly `legacy` unkeyed rows (as `store::audit`).
fn seals(e: &AuditEntry<'_>, legacy: i64) -> bool {
    e.action == SEAL
        && e.after
            .and_then(|a| serde_json::from_str::<serde_json::Value>(a).ok())
            .and_then(|v| v.get("legacy_rows").and_then(|n| n.as_i64()))
            == Some(legacy)
}

/// Appends one row inside the caller's transaction (READ COMMITTED), so the action and its
/// audit row commit together or not at all. Waits for any other append until it commits.
pub async fn append(
    conn: &mut PgConnection,
    keys: &AuditKeys,
    e: &AuditEntry<'_>,
    now: DateTime<Utc>,
) -> Result<()> {
    text::check(&[
        ("audit actor", Some(e.actor)),
        ("audit address", Some(e.address)),
        ("audit action", Some(e.action)),
        ("audit target", Some(e.target)),
        ("audit before", e.before),
        ("audit after", e.after),
    ])?;
    sqlx::query("SELECT pg_advisory_xact_lock($1)")
        .bind(CHAIN_LOCK)
        .execute(&mut *conn)
        .await?;
    let tip = sqlx::query(
        "SELECT actor, address, action, target, before, after, created_at, prev_hash, hash, chain
         FROM audit_log ORDER BY id DESC LIMIT 1",
    )
    .fetch_optional(&mut *conn)
    .await?;
    // Hosts share this chain: one holding another key (or two started at once on an empty
    // log with different keys, before either could check at connect) would fork it for
    // good. The tip must be signed with this host's key before anything is linked to it.
    let prev = match &tip {
        None => GENESIS.to_string(),
        Some(r) => {
            let (prev, hash, chain): (&str, &str, &str) =
                (r.get("prev_hash"), r.get("hash"), r.get("chain"));
            if chain == KEYED && row_mac(keys, prev, &entry_of(r), r.get("created_at")) != hash {
                return Err(crate::secrets::SecretError::SharedKeyMismatch.into());
            }
            hash.to_string()
        }
    };
    let created_at = db_time(now);
    let hash = row_mac(keys, &prev, e, &created_at);
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
    // Other hosts' heads follow on commit (`Db::hear_changes`); this host's at once.
    super::notify::audit_appended(conn).await?;
    keys.appended();
    Ok(())
}

/// Appends one row in its own transaction.
pub async fn record(
    pool: &PgPool,
    keys: &AuditKeys,
    e: &AuditEntry<'_>,
    now: DateTime<Utc>,
) -> Result<()> {
    let mut tx = pool.begin().await?;
    append(&mut tx, keys, e, now).await?;
    tx.commit().await?;
    Ok(())
}

/// Walks the whole chain, as `store::audit::verify` does on SQLite.
pub async fn verify(pool: &PgPool, keys: &AuditKeys) -> Result<ChainState> {
    let rows = sqlx::query("SELECT id, actor, address, action, target, before, after, created_at, prev_hash, hash, chain FROM audit_log ORDER BY id")
        .fetch_all(pool)
        .await?;
    let mut st = ChainState {
        rows: 0,
        last_id: 0,
        last_hash: GENESIS.to_string(),
        broken: None,
    };
    let (mut legacy, mut keyed) = (0i64, false);
    let mut first_legacy = None;
    for r in &rows {
        let id: i64 = r.get("id");
        let e = entry_of(r);
        let (stored_prev, stored, chain, created_at): (&str, &str, &str, &str) = (
            r.get("prev_hash"),
            r.get("hash"),
            r.get("chain"),
            r.get("created_at"),
        );
        let why = if stored_prev != st.last_hash {
            Some("it does not link to the row before it (a row was removed or inserted)")
        } else {
            match chain {
                LEGACY if keyed => Some("an unkeyed row after keyed ones"),
                LEGACY => {
                    legacy += 1;
                    first_legacy.get_or_insert(id);
                    (legacy_hash(&st.last_hash, &e, created_at) != stored)
                        .then_some("it was changed after it was written")
                }
                KEYED if !keyed && legacy > 0 && !seals(&e, legacy) => {
                    Some("the unkeyed rows before it are not sealed by an `audit.keyed` row")
                }
                KEYED => {
                    keyed = true;
                    (row_mac(keys, &st.last_hash, &e, created_at) != stored).then_some(UNSIGNED)
                }
                _ => Some("unknown chain kind"),
            }
        };
        if let Some(why) = why {
            st.broken = Some(Broken { id, why });
            return Ok(st);
        }
        st.rows += 1;
        st.last_id = id;
        st.last_hash = stored.to_string();
    }
    if let (Some(id), false) = (first_legacy, keyed) {
        st.broken = Some(Broken {
            id,
            why: "unkeyed rows with no `audit.keyed` seal after them",
        });
    }
    Ok(st)
}

/// Whether `keys` signed this log (as `store::audit::signed_with`).
pub async fn signed_with(pool: &PgPool, keys: &AuditKeys) -> Result<Option<bool>> {
    use futures_util::TryStreamExt;
    let mut rows = sqlx::query(
        "SELECT actor, address, action, target, before, after, created_at, prev_hash, hash FROM audit_log WHERE chain = $1 ORDER BY id DESC",
    )
    .bind(KEYED)
    .fetch(pool);
    let mut any = false;
    while let Some(r) = rows.try_next().await? {
        any = true;
        let e = entry_of(&r);
        let (prev, stored, created_at): (&str, &str, &str) =
            (r.get("prev_hash"), r.get("hash"), r.get("created_at"));
        if row_mac(keys, prev, &e, created_at) == stored {
            return Ok(Some(true));
        }
    }
    Ok(any.then_some(false))
}

/// The row count and the newest row, as a head exports them: one statement, one snapshot.
pub async fn tip(conn: &mut PgConnection) -> Result<(i64, i64, String)> {
    let row: (i64, Option<i64>, Option<String>) = sqlx::query_as(
        "SELECT (SELECT COUNT(*) FROM audit_log),
                (SELECT id FROM audit_log ORDER BY id DESC LIMIT 1),
                (SELECT hash FROM audit_log ORDER BY id DESC LIMIT 1)",
    )
    .fetch_one(&mut *conn)
    .await?;
    Ok((
        row.0,
        row.1.unwrap_or(0),
        row.2.unwrap_or_else(|| GENESIS.to_string()),
    ))
}

/// The newest `HEAD_STARTED` row of the head `head` (see `store::audit::head_started`): its
/// id and time. Such rows are few (one per head started or re-armed).
pub async fn head_started(conn: &mut PgConnection, head: &str) -> Result<Option<(i64, String)>> {
    let rows: Vec<(i64, String, Option<String>)> = sqlx::query_as(
        "SELECT id, created_at, after FROM audit_log WHERE action = $1 ORDER BY id DESC",
    )
    .bind(HEAD_STARTED)
    .fetch_all(conn)
    .await?;
    Ok(rows
        .into_iter()
        .find(|(_, _, after)| crate::store::audit::started_here(after.as_deref(), head))
        .map(|(id, at, _)| (id, at)))
}

/// Whether the database still holds an earlier head's newest row, with as many rows up to
/// it (as `store::audit::holds`).
pub async fn holds(
    conn: &mut PgConnection,
    rows: i64,
    last_id: i64,
    last_hash: &str,
) -> Result<bool> {
    if rows == 0 {
        return Ok(true);
    }
    let (hash, upto): (Option<String>, i64) = sqlx::query_as(
        "SELECT (SELECT hash FROM audit_log WHERE id = $1),
                (SELECT COUNT(*) FROM audit_log WHERE id <= $1)",
    )
    .bind(last_id)
    .fetch_one(&mut *conn)
    .await?;
    Ok(hash.as_deref() == Some(last_hash) && upto == rows)
}
