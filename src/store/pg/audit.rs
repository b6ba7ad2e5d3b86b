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
use sqlx::{PgConnection, PgPool, Row};

use super::text;
use crate::clock::db_time;
use crate::store::audit::{
    squeeze, written, AuditEntry, AuditKeys, ChainState, Triggers, GENESIS, HEAD_STARTED, KEYED,
};
use crate::store::Result;

/// The advisory lock of the chain's tip (an arbitrary constant: "sluice audit").
pub(crate) const CHAIN_LOCK: i64 = 0x736c_7569_6365_0a01;

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
            let (hash, chain): (&str, &str) = (r.get("hash"), r.get("chain"));
            if chain == KEYED && !crate::store::audit::signs(keys, r) {
                // Rows rewritten behind the hosts' backs (or a host of another key): the
                // head's exporter is woken as by an append, so its check of the chain
                // raises the `audit_head` alarm — a refused append alone tells no one.
                keys.appended();
                return Err(crate::secrets::SecretError::SharedKeyMismatch.into());
            }
            hash.to_string()
        }
    };
    let created_at = db_time(now);
    let hash = keys.row_mac(&prev, e, &created_at);
    // A deferred constraint trigger would fire at commit, after the check below that the
    // row was kept: from here on this transaction's constraint triggers fire at once.
    sqlx::query("SET CONSTRAINTS ALL IMMEDIATE")
        .execute(&mut *conn)
        .await?;
    let inserted: Option<(i64, String)> = sqlx::query_as(
        "INSERT INTO audit_log (actor, address, action, target, before, after, created_at, prev_hash, hash, chain)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10) RETURNING id, hash",
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
    .fetch_optional(&mut *conn)
    .await?;
    // A BEFORE trigger could also have changed the row's fields (not its MAC, computed
    // here): that the chain shows. What it cannot show, a row not kept, is refused here.
    let kept: Option<(i64, String)> = sqlx::query_as(crate::store::audit::TIP)
        .fetch_optional(&mut *conn)
        .await?;
    written(e.action, inserted, kept)?;
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
    Ok(crate::store::audit::walk(&rows, keys))
}

/// The schema's triggers on `audit_log` (0001): name, `tgtype` (row-level 1, BEFORE 2,
/// DELETE 8, UPDATE 16, TRUNCATE 32) and the function they call.
const GUARDS: [(&str, i32); 2] = [
    ("audit_append_only", 1 | 2 | 8 | 16),
    ("audit_no_truncate", 2 | 32),
];
/// The guards' function, as 0001 wrote its body (whitespace squeezed): replaced with one
/// that returns the row, the guards would guard nothing.
const GUARD_FN: &str = "sluice_append_only";
const GUARD_BODY: &str = "BEGIN RAISE EXCEPTION '% is append-only', TG_TABLE_NAME; END;";

/// The schema's own triggers on its other tables (the migrations'): any other trigger on a
/// table of the gateway's schema is named, whatever its function's text says — dynamic SQL
/// (`EXECUTE 'DELETE FROM audit' || '_log ...'`) reaches the log without naming it, from a
/// write the admin transaction makes after its audit row's own check.
const SCHEMA_TRIGGERS: [(&str, &str); 6] = [
    ("ledger_append_only", "ledger"),
    ("ledger_no_truncate", "ledger"),
    ("model_prices_append_only", "model_prices"),
    ("model_prices_no_truncate", "model_prices"),
    ("processes_seen_at", "processes"),
    ("spend_months_follow", "spend_days"),
];

/// Every dollar-quoted function body the PostgreSQL migrations define, whitespace
/// squeezed: a schema trigger's function must still be exactly one of them.
fn schema_bodies() -> &'static std::collections::HashSet<String> {
    static BODIES: std::sync::OnceLock<std::collections::HashSet<String>> =
        std::sync::OnceLock::new();
    BODIES.get_or_init(|| {
        sqlx::migrate!("./migrations/postgres")
            .migrations
            .iter()
            .flat_map(|m| {
                let sql = m.sql.to_string();
                sql.split("$$")
                    .skip(1)
                    .step_by(2)
                    .map(squeeze)
                    .collect::<Vec<_>>()
            })
            .collect()
    })
}

/// A user trigger that reaches `audit_log`, as `triggers` reads it from the catalog.
#[derive(sqlx::FromRow)]
struct TriggerRow {
    name: String,
    table_name: String,
    /// `tgtype` (as `GUARDS`).
    kind: i32,
    /// `tgenabled`: `O` fires in ordinary sessions, `A` always; `R` only in replica
    /// sessions, never the gateway's; `D` never.
    enabled: String,
    func: String,
    body: String,
    unconditional: bool,
    /// On the `audit_log` the gateway's search path finds, not a namesake in another schema
    /// (whose triggers would otherwise pass for the guards).
    ours: bool,
    /// On a table of the gateway's schema.
    in_schema: bool,
}

/// `store::audit::triggers` on PostgreSQL: every user trigger on a table of the schema or
/// whose function's text names `audit_log`, and the rules on the log (one `DO INSTEAD
/// NOTHING` drops every append); the log's guards present, firing for the gateway and
/// unchanged, every other trigger in the schema one of the schema's own, its function's
/// body as the migrations wrote it.
pub async fn triggers(pool: &PgPool) -> Result<Triggers> {
    let rows: Vec<TriggerRow> = sqlx::query_as(
        "SELECT t.tgname::text AS name, c.relname::text AS table_name, t.tgtype::int4 AS kind,
                t.tgenabled::text AS enabled, p.proname::text AS func, p.prosrc AS body,
                t.tgqual IS NULL AS unconditional,
                COALESCE(t.tgrelid = to_regclass('audit_log'), false) AS ours,
                n.nspname = current_schema() AS in_schema
         FROM pg_trigger t
         JOIN pg_class c ON c.oid = t.tgrelid
         JOIN pg_namespace n ON n.oid = c.relnamespace
         JOIN pg_proc p ON p.oid = t.tgfoid
         WHERE NOT t.tgisinternal
           AND (n.nspname = current_schema() OR p.prosrc ILIKE '%audit_log%')
         ORDER BY 1",
    )
    .fetch_all(pool)
    .await?;
    let mut out = Triggers::default();
    for r in &rows {
        let name = &r.name;
        let guard = GUARDS.iter().find(|(n, _)| n == name).filter(|_| r.ours);
        match guard {
            None if r.ours => out.unexpected(name, "added on audit_log"),
            None if r.in_schema
                && SCHEMA_TRIGGERS.contains(&(name.as_str(), r.table_name.as_str())) =>
            {
                if !schema_bodies().contains(&squeeze(&r.body)) {
                    out.unexpected(name, &format!("the body of {}() was changed", r.func));
                }
            }
            None if r.in_schema => out.unexpected(
                name,
                &format!(
                    "added on {}: its function may reach audit_log",
                    r.table_name
                ),
            ),
            None => out.unexpected(
                name,
                &format!("added on {}, its function names audit_log", r.table_name),
            ),
            Some((_, want)) if r.kind != *want || !r.unconditional || r.func != GUARD_FN => {
                out.unexpected(name, "its definition was changed")
            }
            Some(_) if squeeze(&r.body) != GUARD_BODY => {
                out.unexpected(name, &format!("the body of {GUARD_FN}() was changed"))
            }
            Some(_) if r.enabled == "D" => out.missing(name, "is disabled"),
            Some(_) if r.enabled == "R" => {
                out.missing(name, "fires only in replica sessions (ENABLE REPLICA)")
            }
            Some(_) => {}
        }
    }
    for (name, _) in GUARDS {
        if !rows.iter().any(|r| r.name == name && r.ours) {
            out.missing(name, "is missing");
        }
    }
    let rules: Vec<String> = sqlx::query_scalar(
        "SELECT rulename::text FROM pg_rewrite WHERE ev_class = to_regclass('audit_log') ORDER BY 1",
    )
    .fetch_all(pool)
    .await?;
    for rule in rules {
        out.unexpected(&rule, "a rule on audit_log");
    }
    Ok(out)
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
        if crate::store::audit::signs(keys, &r) {
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
