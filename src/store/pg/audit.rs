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

use std::collections::HashMap;
use std::sync::OnceLock;

use chrono::{DateTime, Utc};
use futures_util::TryStreamExt;
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
    let mut rows = sqlx::query(crate::store::audit::VERIFY_ROWS).fetch(pool);
    let mut w = crate::store::audit::Walker::new(keys);
    while let Some(r) = rows.try_next().await? {
        if !w.step(&r) {
            break;
        }
    }
    Ok(w.finish())
}

/// A trigger of the schema, as its migrations create it.
struct SchemaTrigger {
    name: &'static str,
    table: &'static str,
    /// `tgtype`: row-level 1, BEFORE 2, INSERT 4, DELETE 8, UPDATE 16, TRUNCATE 32.
    kind: i32,
    func: &'static str,
    /// The columns of an `UPDATE OF` (none: every update fires it).
    columns: &'static [&'static str],
    /// Its `WHEN` condition as the migration writes it (compared by `condition_key`).
    when: Option<&'static str>,
}

/// The schema's triggers. Any other trigger on one of the gateway's tables is named,
/// whatever its function's text says — dynamic SQL (`EXECUTE 'DELETE FROM audit' ||
/// '_log ...'`) reaches the log without naming it, from a write the admin transaction makes
/// after its audit row's own check — and each of these must keep its whole definition
/// (timing, events, columns, condition, function), its function's body and fire for the
/// gateway: a guard dropped or disabled is named missing; one narrowed to a column, or
/// given a condition calling another function, is named changed (s23 attack #2).
const SCHEMA_TRIGGERS: [SchemaTrigger; 9] = [
    SchemaTrigger::guard("audit_append_only", "audit_log", 1 | 2 | 8 | 16),
    SchemaTrigger::guard("audit_no_truncate", "audit_log", 2 | 32),
    SchemaTrigger::guard("ledger_append_only", "ledger", 1 | 2 | 8 | 16),
    SchemaTrigger::guard("ledger_no_truncate", "ledger", 2 | 32),
    SchemaTrigger::guard("model_prices_append_only", "model_prices", 1 | 2 | 8 | 16),
    SchemaTrigger::guard("model_prices_no_truncate", "model_prices", 2 | 32),
    SchemaTrigger {
        name: "processes_seen_at",
        table: "processes",
        kind: 1 | 2 | 4 | 16,
        func: "processes_seen_at",
        columns: &["heartbeat_at"],
        when: None,
    },
    SchemaTrigger {
        name: "spend_months_follow",
        table: "spend_days",
        kind: 1 | 4 | 8 | 16,
        func: "spend_months_follow",
        columns: &[],
        when: Some("current_setting('sluice.spend_months', true) IS DISTINCT FROM 'written'"),
    },
    SchemaTrigger {
        name: "cache_entries_unversioned",
        table: "cache_entries",
        kind: 1 | 2 | 16,
        func: "cache_entries_unversioned",
        columns: &["id"],
        when: None,
    },
];

impl SchemaTrigger {
    /// An append-only guard (`sluice_append_only`), unconditional.
    const fn guard(name: &'static str, table: &'static str, kind: i32) -> SchemaTrigger {
        SchemaTrigger {
            name,
            table,
            kind,
            func: APPEND_ONLY,
            columns: &[],
            when: None,
        }
    }

    /// Whether the catalog's row is this trigger as its migration defined it.
    fn defined_as(&self, r: &TriggerRow) -> bool {
        r.kind == self.kind
            && r.func == self.func
            && r.own_function
            && r.columns
                .iter()
                .map(String::as_str)
                .eq(self.columns.iter().copied())
            && r.condition.as_deref().map(condition_key) == self.when.map(condition_key)
    }
}

/// A `WHEN` condition with what PostgreSQL's deparse adds (grouping parentheses, `::text`
/// casts of literals) and whitespace taken out, so the migration's text and the catalog's
/// compare alike across versions. The catalog's is `pg_get_triggerdef`'s text between
/// `WHEN` and the last `EXECUTE` (`pg_get_expr` cannot deparse `OLD`/`NEW`). A literal is
/// kept as written (`'writ ten'` is not `'written'`: s23 attack, third batch #1), and so is
/// a call's parenthesis (a name's character right before it): `tr(ue())` is not `true`,
/// nor `current_set(ting(…))` `current_setting(…)` (fourth batch #1). A closing one goes
/// either way: the calls' names and order stay.
fn condition_key(expr: &str) -> String {
    let mut key = String::with_capacity(expr.len());
    // Between single quotes (odd parts; `''` within a literal splits it in two, put back
    // alike on both sides).
    for (i, part) in expr.split('\'').enumerate() {
        if i % 2 == 1 {
            key.push('\'');
            key.push_str(part);
            key.push('\'');
            continue;
        }
        let part = part.replace("::text", "");
        let mut prev = ' ';
        for c in part.chars() {
            let call = c == '(' && (prev.is_alphanumeric() || prev == '_' || prev == '"');
            if call || !(c.is_whitespace() || c == '(' || c == ')') {
                key.push(c);
            }
            prev = c;
        }
    }
    key
}

const APPEND_ONLY: &str = "sluice_append_only";

/// What the PostgreSQL migrations define, read from their text: the tables they create,
/// and each function's bodies (every `CREATE [OR REPLACE] FUNCTION`'s dollar-quoted body,
/// whitespace squeezed) — a function must keep one of its own, not another's or an older.
struct Schema {
    tables: Vec<String>,
    functions: HashMap<String, Vec<String>>,
}

impl Schema {
    fn names(&self) -> Vec<String> {
        self.functions.keys().cloned().collect()
    }

    /// Whether `body` is the one the migrations last gave `func`.
    fn keeps(&self, func: &str, body: &str) -> bool {
        self.functions
            .get(func)
            .and_then(|bodies| bodies.last())
            .is_some_and(|b| *b == squeeze(body))
    }
}

fn schema() -> &'static Schema {
    static SCHEMA: OnceLock<Schema> = OnceLock::new();
    SCHEMA.get_or_init(|| {
        let mut s = Schema {
            tables: Vec::new(),
            functions: HashMap::new(),
        };
        for m in sqlx::migrate!("./migrations/postgres").migrations.iter() {
            let name = |t: &str| t.split('(').next().unwrap_or_default().to_string();
            let words: Vec<&str> = m.sql.split_whitespace().collect();
            let mut functions = Vec::new();
            for i in 0..words.len() {
                match &words[i..] {
                    ["CREATE", "TABLE", "IF", "NOT", "EXISTS", t, ..]
                    | ["CREATE", "TABLE", t, ..] => s.tables.push(name(t)),
                    ["CREATE", "FUNCTION", f, ..]
                    | ["CREATE", "OR", "REPLACE", "FUNCTION", f, ..] => functions.push(name(f)),
                    _ => {}
                }
            }
            // The migrations quote nothing but function bodies with `$$`: the n-th body of
            // a file is its n-th function's.
            let bodies = m.sql.split("$$").skip(1).step_by(2).map(squeeze);
            for (f, body) in functions.into_iter().zip(bodies) {
                s.functions.entry(f).or_default().push(body);
            }
        }
        s
    })
}

/// A user trigger on one of the gateway's tables or whose function names `audit_log`, as
/// `triggers` reads it from the catalog.
#[derive(sqlx::FromRow)]
struct TriggerRow {
    name: String,
    table_name: String,
    /// `tgtype` (as `SCHEMA_TRIGGERS`).
    kind: i32,
    /// `tgenabled`: `O` fires in ordinary sessions, `A` always; `R` only in replica
    /// sessions, never the gateway's (unless its role's `session_replication_role` was
    /// set, which this does not read); `D` never.
    enabled: String,
    func: String,
    body: String,
    /// The `UPDATE OF` columns, in order.
    columns: Vec<String>,
    /// The `WHEN` condition, deparsed.
    condition: Option<String>,
    /// Its function is the schema's own, with no settings of its own (`ALTER FUNCTION …
    /// SET search_path` would resolve what it calls elsewhere), and its `WHEN` calls no
    /// function or operator outside `pg_catalog` (`pg_depend`: an operator of the
    /// attacker's deparses as `IS DISTINCT FROM` all the same; final attack #1).
    own_function: bool,
}

/// The tables the gateway's writes reach: its own (`$1`, in its schema) and, through every
/// foreign key that writes on a delete or an update of the row it references, and every
/// table inheriting from one (a delete or update of the parent reaches its children's rows
/// and fires their triggers: final attack #2), those that hang off them — named as the schema names them (another schema's qualified).
const REACHED: &str = "WITH RECURSIVE reached(oid, name) AS (
        SELECT c.oid, c.relname::text FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE n.nspname = current_schema() AND c.relname = ANY($1)
      UNION
        SELECT c.oid, CASE WHEN n.nspname = current_schema() THEN c.relname::text
                           ELSE n.nspname || '.' || c.relname END
        FROM reached r
        JOIN (SELECT f.confrelid AS parent, f.conrelid AS child FROM pg_constraint f
              WHERE f.contype = 'f'
                AND (f.confdeltype IN ('c', 'n', 'd') OR f.confupdtype IN ('c', 'n', 'd'))
              UNION ALL
              SELECT i.inhparent, i.inhrelid FROM pg_inherits i) e ON e.parent = r.oid
        JOIN pg_class c ON c.oid = e.child JOIN pg_namespace n ON n.oid = c.relnamespace)";

/// `store::audit::triggers` on PostgreSQL: every user trigger on one of the gateway's
/// tables (those its migrations create, in its schema) must be one of `SCHEMA_TRIGGERS`,
/// unchanged and firing; every function its migrations create keeps its body; no rule on
/// any of its tables (one `DO INSTEAD NOTHING` on the log drops every append). A table a
/// write to the gateway's cascades into (a foreign key `ON DELETE` / `ON UPDATE` `CASCADE`,
/// `SET NULL` or `SET DEFAULT` to one of them, and on from there) is written by the
/// gateway's transactions too: no trigger or rule on it either (s23 attack #1: a logout's
/// session delete cascading into such a table fired a trigger there that deleted the
/// logout's audit row). Another application's tables are not judged otherwise: no
/// transaction of the gateway's writes them.
pub async fn triggers(pool: &PgPool) -> Result<Triggers> {
    let schema = schema();
    let rows: Vec<TriggerRow> = sqlx::query_as(&format!(
        "{REACHED}
         SELECT t.tgname::text AS name, r.name AS table_name, t.tgtype::int4 AS kind,
                t.tgenabled::text AS enabled, p.proname::text AS func, p.prosrc AS body,
                ARRAY(SELECT a.attname::text FROM unnest(t.tgattr::int2[]) WITH ORDINALITY k(num, i)
                      JOIN pg_attribute a ON a.attrelid = t.tgrelid AND a.attnum = k.num
                      ORDER BY k.i) AS columns,
                CASE WHEN t.tgqual IS NOT NULL
                     THEN substring(pg_get_triggerdef(t.oid) from ' WHEN (.*) EXECUTE ') END AS condition,
                pn.nspname = current_schema() AND p.proconfig IS NULL
                AND NOT EXISTS (
                    SELECT 1 FROM pg_depend d
                    LEFT JOIN pg_proc f ON d.refclassid = 'pg_proc'::regclass AND f.oid = d.refobjid
                    LEFT JOIN pg_operator o ON d.refclassid = 'pg_operator'::regclass AND o.oid = d.refobjid
                    JOIN pg_namespace fns ON fns.oid = COALESCE(f.pronamespace, o.oprnamespace)
                    WHERE d.classid = 'pg_trigger'::regclass AND d.objid = t.oid
                      AND d.refobjid <> t.tgfoid
                      AND fns.nspname <> 'pg_catalog') AS own_function
         FROM pg_trigger t
         JOIN reached r ON r.oid = t.tgrelid
         JOIN pg_proc p ON p.oid = t.tgfoid
         JOIN pg_namespace pn ON pn.oid = p.pronamespace
         WHERE NOT t.tgisinternal
         ORDER BY 1"
    ))
    .bind(&schema.tables)
    .fetch_all(pool)
    .await?;
    let mut out = Triggers::default();
    for r in &rows {
        let name = &r.name;
        let own = SCHEMA_TRIGGERS
            .iter()
            .find(|t| t.name == name && t.table == r.table_name);
        match own {
            None => out.unexpected(name, &format!("added on {}", r.table_name)),
            Some(own) if !own.defined_as(r) => out.unexpected(name, "its definition was changed"),
            Some(_) if !schema.keeps(&r.func, &r.body) => {
                out.unexpected(name, &format!("the body of {}() was changed", r.func))
            }
            Some(_) if r.enabled == "D" => out.missing(name, "is disabled"),
            Some(_) if r.enabled == "R" => {
                out.missing(name, "fires only in replica sessions (ENABLE REPLICA)")
            }
            Some(_) => {}
        }
    }
    for t in &SCHEMA_TRIGGERS {
        if !rows
            .iter()
            .any(|r| r.name == t.name && r.table_name == t.table)
        {
            out.missing(t.name, "is missing");
        }
    }
    // The schema's functions, its triggers' and those they call (`spend_months_add`): a
    // body rewritten to reach the log by dynamic SQL never names it.
    let functions: Vec<(String, String, bool)> = sqlx::query_as(
        "SELECT p.proname::text, p.prosrc, p.proconfig IS NOT NULL
         FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
         WHERE n.nspname = current_schema() AND p.proname = ANY($1) ORDER BY 1",
    )
    .bind(schema.names())
    .fetch_all(pool)
    .await?;
    for (func, body, configured) in functions {
        if !schema.keeps(&func, &body) {
            out.unexpected(&func, &format!("the body of {func}() was changed"));
        } else if configured {
            out.unexpected(
                &func,
                &format!("{func}() was given settings (ALTER FUNCTION … SET)"),
            );
        }
    }
    let rules: Vec<(String, String)> = sqlx::query_as(&format!(
        "{REACHED}
         SELECT w.rulename::text, r.name FROM pg_rewrite w JOIN reached r ON r.oid = w.ev_class
         ORDER BY 1"
    ))
    .bind(&schema.tables)
    .fetch_all(pool)
    .await?;
    for (rule, table) in rules {
        out.unexpected(&rule, &format!("a rule on {table}"));
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

/// How many `HEAD_STARTED` rows name a head other than `head`, or none (as
/// `store::audit::others_started`).
pub async fn others_started(conn: &mut PgConnection, head: &str) -> Result<i64> {
    let rows: Vec<Option<String>> =
        sqlx::query_scalar("SELECT after FROM audit_log WHERE action = $1")
            .bind(HEAD_STARTED)
            .fetch_all(conn)
            .await?;
    Ok(rows
        .iter()
        .filter(|after| !crate::store::audit::started_here(after.as_deref(), head))
        .count() as i64)
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

#[cfg(test)]
mod tests {
    use super::condition_key;

    /// The migration's condition and PostgreSQL's deparse of it have one key; a literal
    /// changed, or calls of other functions whose names spell the same letters, do not.
    #[test]
    fn a_condition_keys_alike_as_deparsed_but_not_with_other_literals_or_calls() {
        let migration = "current_setting('sluice.spend_months', true) IS DISTINCT FROM 'written'";
        let deparsed =
            "(current_setting('sluice.spend_months'::text, true) IS DISTINCT FROM 'written'::text)";
        assert_eq!(condition_key(migration), condition_key(deparsed));
        for other in [
            "(current_setting('sluice.spend_months'::text, true) IS DISTINCT FROM 'writ ten'::text)",
            "(current_setting('sluice.spend_months'::text, tr(ue())) IS DISTINCT FROM 'written'::text)",
            "(current_set(ting('sluice.spend_months'::text, true)) IS DISTINCT FROM 'written'::text)",
            "(current_setting('sluice.spend_months'::text, true) IS DISTINCT FROM 'written::text')",
        ] {
            assert_ne!(condition_key(migration), condition_key(other), "{other}");
        }
    }
}
