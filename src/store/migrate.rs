//! `sluice migrate-store`'s store side: every table of a SQLite database copied into an
//! empty PostgreSQL database in one PostgreSQL transaction, and compared before it commits.
//!
//! The copy is generic over the schema: for each table, the columns PostgreSQL has (in its
//! order, from `information_schema`) are read from SQLite and written in multi-row
//! `INSERT`s, each value decoded by the PostgreSQL column's type (SQLite's 0/1 become
//! booleans). Ids are kept; identity sequences are moved past them; an `id` SQLite's table
//! lacks is its rowid (`login_failures`); `meta` (which the PostgreSQL migration seeds) is overwritten; the
//! spend-by-day rollups are rebuilt from the copied request log (`pg::requests::rebuild_days`).
//! Not copied: `processes` (no gateway runs on the source: its rows are stale by
//! definition), `finance_notices` (which alerts went out today: at worst one is sent again) and the migration bookkeeping. Before the commit, every table is read back
//! from both sides and compared — every balance, ledger row and audit hash value for value
//! (the request log and cache by count and sums: they can be large), and every stored
//! response of the Responses API (its conversation and answer as JSON text).
//!
//! Memory stays bounded whatever the install's size: rows are streamed from SQLite (sqlx's
//! SQLite worker hands them over a bounded channel) and written in chunks of at most
//! `CHUNK` rows; the comparison streams both sides side by side in key order (the key of
//! every compared table is an integer id, or `stored_responses`' text id ordered bytewise on
//! both engines: the same order on both), except the few
//! small tables with text keys (`SORTED`), read whole and sorted alike.
//!
//! NUL: SQLite keeps a NUL byte inside text, PostgreSQL's text cannot hold one. An install
//! written by an older version may have one in text of tables no MAC covers (a sign-in
//! throttle key, a request-log field): it is copied with U+FFFD in its place — as the sign-in
//! path records it today and as `pg::text` maps lookups — and the output says how many per
//! table (`Copied::replaced`). In an audit row the MAC covers the original text, so it
//! cannot be rewritten: the copy refuses, naming the row id (nothing is kept).

use futures_util::TryStreamExt;
use sqlx::postgres::PgRow;
use sqlx::sqlite::SqliteRow;
use sqlx::{PgConnection, Postgres, QueryBuilder, Row};

use super::{Backend, Db, Result, StoreError};

/// Tables in the order their foreign keys allow, and whether they are compared row for row.
const TABLES: &[(&str, bool)] = &[
    ("teams", true),
    ("users", true),
    ("tokens", true),
    ("admins", true),
    ("admin_sessions", true),
    ("admin_api_keys", true),
    ("login_failures", true),
    ("meta", true),
    ("requests", false),
    ("ledger", true),
    ("reservations", true),
    ("orphaned", true),
    ("audit_log", true),
    ("cache_entries", false),
    // Compared value for value: a conversation is customer data the copy must not alter.
    // Its text key is streamed in key order like the integer ones: every id is text the
    // gateway wrote (`resp_…`), ordered bytewise on both sides (SQLite's BINARY, the
    // column's `COLLATE "C"` on PostgreSQL), and the table can be large.
    ("stored_responses", true),
    // Managed upstream keys (sealed: copied as bytes, they open under the same master key
    // the audit chain already requires), managed models, and the seal's check value.
    ("managed_upstreams", true),
    ("managed_models", true),
    ("seal_check", true),
    // Prices admins appended: compared value for value (they price the ledger's rows).
    ("model_prices", true),
    // Reconciliation runs and their rows (`store::finance`).
    ("reconciliations", true),
    ("reconciliation_rows", true),
];

/// Tables whose key is text: read whole and sorted alike on both sides for the comparison
/// (SQLite orders a number stored in a text column before every text). Small by nature:
/// `meta`'s counters, live sessions, reservations in flight, orphan records, the managed
/// upstreams and models.
const SORTED: &[&str] = &[
    "meta",
    "admin_sessions",
    "reservations",
    "orphaned",
    "managed_upstreams",
    "managed_models",
];

/// Rows read, written or compared at a time (the copy's memory bound).
const CHUNK: usize = 1_000;

/// What was copied: rows per table, and per table the text values that held a NUL byte and
/// were copied with U+FFFD in its place (tables with none are not listed).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Copied {
    pub tables: Vec<(String, u64)>,
    pub replaced: Vec<(String, u64)>,
}

/// One value, typed by its PostgreSQL column.
#[derive(Debug, Clone, PartialEq)]
enum Val {
    Int(Option<i64>),
    Bool(Option<bool>),
    Float(Option<f64>),
    Text(Option<String>),
    Bytes(Option<Vec<u8>>),
}

#[derive(Clone, Copy)]
enum Kind {
    Int,
    Bool,
    Float,
    Text,
    Bytes,
}

fn kind_of(pg_type: &str) -> Result<Kind> {
    Ok(match pg_type {
        "bigint" | "integer" | "smallint" => Kind::Int,
        "boolean" => Kind::Bool,
        "double precision" | "real" => Kind::Float,
        "text" | "character varying" => Kind::Text,
        "bytea" => Kind::Bytes,
        other => {
            return Err(StoreError::Conflict(format!(
                "migrate-store cannot copy a column of type {other}"
            )))
        }
    })
}

fn lite_val(r: &SqliteRow, i: usize, k: Kind) -> Result<Val> {
    Ok(match k {
        Kind::Int => Val::Int(r.try_get(i)?),
        Kind::Bool => Val::Bool(r.try_get::<Option<i64>, _>(i)?.map(|v| v != 0)),
        Kind::Float => Val::Float(r.try_get(i)?),
        Kind::Text => Val::Text(match r.try_get::<Option<String>, _>(i) {
            Ok(v) => v,
            // A number stored in a text column (SQLite's types are per value).
            Err(_) => r.try_get::<Option<i64>, _>(i)?.map(|v| v.to_string()),
        }),
        Kind::Bytes => Val::Bytes(r.try_get(i)?),
    })
}

fn pg_val(r: &PgRow, i: usize, k: Kind) -> Result<Val> {
    Ok(match k {
        Kind::Int => Val::Int(match r.try_get::<Option<i64>, _>(i) {
            Ok(v) => v,
            Err(_) => r.try_get::<Option<i32>, _>(i)?.map(i64::from),
        }),
        Kind::Bool => Val::Bool(r.try_get(i)?),
        Kind::Float => Val::Float(match r.try_get::<Option<f64>, _>(i) {
            Ok(v) => v,
            Err(_) => r.try_get::<Option<f32>, _>(i)?.map(f64::from),
        }),
        Kind::Text => Val::Text(r.try_get(i)?),
        Kind::Bytes => Val::Bytes(r.try_get(i)?),
    })
}

/// A table's columns on PostgreSQL (name, kind), in their order.
async fn pg_columns(conn: &mut PgConnection, table: &str) -> Result<Vec<(String, Kind)>> {
    let cols: Vec<(String, String)> = sqlx::query_as(
        "SELECT column_name::TEXT, data_type::TEXT FROM information_schema.columns
         WHERE table_schema = current_schema() AND table_name = $1 ORDER BY ordinal_position",
    )
    .bind(table)
    .fetch_all(&mut *conn)
    .await?;
    cols.into_iter()
        .map(|(c, t)| Ok((c, kind_of(&t)?)))
        .collect()
}

/// The SQLite expression that reads PostgreSQL's column `col` of `table`.
fn lite_expr(table: &str, col: &str, lite_cols: &[String]) -> Result<String> {
    if lite_cols.iter().any(|c| c == col) {
        Ok(format!("\"{col}\""))
    } else if col == "id" {
        // PostgreSQL's id stands for SQLite's rowid (`login_failures`).
        Ok("rowid".into())
    } else {
        Err(StoreError::Conflict(format!(
            "the SQLite table {table} has no column {col}: migrate the SQLite database with this version first"
        )))
    }
}

/// The SQLite query reading `table`'s rows as PostgreSQL's columns, ordered by the first
/// (the key of every copied table; some are `WITHOUT ROWID`).
async fn lite_select(
    lite: &sqlx::SqlitePool,
    table: &str,
    cols: &[(String, Kind)],
) -> Result<String> {
    let lite_cols: Vec<String> =
        sqlx::query_scalar(&format!("SELECT name FROM pragma_table_info('{table}')"))
            .fetch_all(lite)
            .await?;
    let exprs = cols
        .iter()
        .map(|(c, _)| lite_expr(table, c, &lite_cols))
        .collect::<Result<Vec<_>>>()?;
    Ok(format!(
        "SELECT {} FROM {table} ORDER BY 1",
        exprs.join(", ")
    ))
}

/// The PostgreSQL query reading `table` as `lite_select` reads SQLite's.
fn pg_select(table: &str, cols: &[(String, Kind)]) -> String {
    let names: Vec<String> = cols.iter().map(|(c, _)| format!("\"{c}\"")).collect();
    format!("SELECT {} FROM {table} ORDER BY 1", names.join(", "))
}

/// One SQLite row as PostgreSQL's values, its text made storable there (see the module
/// doc on NUL); returns how many values held a NUL.
fn lite_row(table: &str, r: &SqliteRow, cols: &[(String, Kind)]) -> Result<(Vec<Val>, u64)> {
    let mut row = cols
        .iter()
        .enumerate()
        .map(|(i, (_, k))| lite_val(r, i, *k))
        .collect::<Result<Vec<_>>>()?;
    let mut replaced = 0;
    for (i, v) in row.iter_mut().enumerate() {
        let Val::Text(Some(text)) = v else { continue };
        if !text.contains('\0') {
            continue;
        }
        if table == "audit_log" {
            let id = match r.try_get::<Option<i64>, _>(0) {
                Ok(Some(id)) => id.to_string(),
                _ => "?".into(),
            };
            return Err(StoreError::Conflict(format!(
                "audit log row {id} holds a NUL byte in {}, which PostgreSQL's text cannot store, and its MAC covers the text as it is: it cannot be copied unchanged, so nothing was kept",
                cols[i].0
            )));
        }
        *text = text.replace('\0', "\u{FFFD}");
        replaced += 1;
    }
    Ok((row, replaced))
}

fn pg_row(r: &PgRow, cols: &[(String, Kind)]) -> Result<Vec<Val>> {
    cols.iter()
        .enumerate()
        .map(|(i, (_, k))| pg_val(r, i, *k))
        .collect()
}

/// Copies `table` from SQLite into PostgreSQL, `CHUNK` rows at a time; returns (rows,
/// text values whose NUL became U+FFFD).
async fn copy_table(
    lite: &sqlx::SqlitePool,
    conn: &mut PgConnection,
    table: &str,
    cols: &[(String, Kind)],
) -> Result<(u64, u64)> {
    let sql = lite_select(lite, table, cols).await?;
    let mut stream = sqlx::query(&sql).fetch(lite);
    let (mut rows, mut replaced) = (0u64, 0u64);
    let mut chunk = Vec::with_capacity(CHUNK);
    while let Some(r) = stream.try_next().await? {
        let (row, n) = lite_row(table, &r, cols)?;
        replaced += n;
        chunk.push(row);
        if chunk.len() == CHUNK {
            insert(conn, table, cols, &chunk)
                .await
                .map_err(|e| collided(e, table, replaced))?;
            rows += chunk.len() as u64;
            chunk.clear();
        }
    }
    insert(conn, table, cols, &chunk)
        .await
        .map_err(|e| collided(e, table, replaced))?;
    rows += chunk.len() as u64;
    Ok((rows, replaced))
}

/// A unique violation in a table where a NUL became U+FFFD: the mapped text now equals
/// another row's (SQLite held both, one with a NUL, one with U+FFFD). Said as such rather
/// than as PostgreSQL's bare "duplicate key value", so the operator knows what to rename.
fn collided(e: StoreError, table: &str, replaced: u64) -> StoreError {
    let unique = match &e {
        StoreError::Sql(sqlx::Error::Database(d)) => d.code().as_deref() == Some("23505"),
        _ => false,
    };
    if !unique || replaced == 0 {
        return e;
    }
    let detail = match &e {
        StoreError::Sql(sqlx::Error::Database(d)) => d
            .try_downcast_ref::<sqlx::postgres::PgDatabaseError>()
            .and_then(|p| p.detail().map(str::to_string))
            .unwrap_or_default(),
        _ => String::new(),
    };
    StoreError::Conflict(format!(
        "{table}: a text value whose NUL byte becomes U+FFFD on PostgreSQL then equals another row's, where each must be unique ({detail}): rename one of them on the SQLite database (the one with the NUL), then migrate again; nothing was kept"
    ))
}

/// Whether `table` holds the same rows on both sides (SQLite's read as `lite_row` copies
/// them): streamed side by side in key order, or read whole and sorted (`SORTED`).
async fn same_rows(
    lite: &sqlx::SqlitePool,
    conn: &mut PgConnection,
    table: &str,
    cols: &[(String, Kind)],
) -> Result<bool> {
    let lite_sql = lite_select(lite, table, cols).await?;
    let pg_sql = pg_select(table, cols);
    let mut a = sqlx::query(&lite_sql).fetch(lite);
    let mut b = sqlx::query(&pg_sql).fetch(&mut *conn);
    if SORTED.contains(&table) {
        let key = |x: &Vec<Val>| format!("{:?}", x[0]);
        let mut xs = Vec::new();
        while let Some(r) = a.try_next().await? {
            xs.push(lite_row(table, &r, cols)?.0);
        }
        let mut ys = Vec::new();
        while let Some(r) = b.try_next().await? {
            ys.push(pg_row(&r, cols)?);
        }
        xs.sort_by_key(key);
        ys.sort_by_key(key);
        return Ok(xs == ys);
    }
    loop {
        match (a.try_next().await?, b.try_next().await?) {
            (None, None) => return Ok(true),
            (Some(x), Some(y)) => {
                if lite_row(table, &x, cols)?.0 != pg_row(&y, cols)? {
                    return Ok(false);
                }
            }
            _ => return Ok(false),
        }
    }
}

/// Writes `rows` into `table` in multi-row `INSERT`s (PostgreSQL takes at most 65 535
/// parameters a statement).
async fn insert(
    conn: &mut PgConnection,
    table: &str,
    cols: &[(String, Kind)],
    rows: &[Vec<Val>],
) -> Result<()> {
    let per = (60_000 / cols.len().max(1)).clamp(1, CHUNK);
    let names: Vec<String> = cols.iter().map(|(c, _)| format!("\"{c}\"")).collect();
    for chunk in rows.chunks(per).filter(|c| !c.is_empty()) {
        let mut q: QueryBuilder<Postgres> =
            QueryBuilder::new(format!("INSERT INTO {table} ({}) ", names.join(", ")));
        q.push_values(chunk, |mut b, row| {
            for v in row {
                match v {
                    Val::Int(v) => b.push_bind(*v),
                    Val::Bool(v) => b.push_bind(*v),
                    Val::Float(v) => b.push_bind(*v),
                    Val::Text(v) => b.push_bind(v.clone()),
                    Val::Bytes(v) => b.push_bind(v.clone()),
                };
            }
        });
        if table == "meta" {
            q.push(" ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value");
        }
        q.build().execute(&mut *conn).await?;
    }
    Ok(())
}

/// Moves `table`'s identity sequence (if it has one) past the ids copied into it.
async fn move_sequence(conn: &mut PgConnection, table: &str) -> Result<()> {
    // Asked only of tables with an `id` column: for another, the error would abort the
    // transaction.
    let seq: Option<String> = sqlx::query_scalar(
        "SELECT pg_get_serial_sequence($1, 'id') FROM information_schema.columns
         WHERE table_schema = current_schema() AND table_name = $1 AND column_name = 'id'",
    )
    .bind(table)
    .fetch_optional(&mut *conn)
    .await?
    .flatten();
    if let Some(seq) = seq {
        sqlx::query(&format!(
            "SELECT setval($1, COALESCE((SELECT max(id) FROM {table}), 0) + 1, false)"
        ))
        .bind(seq)
        .execute(&mut *conn)
        .await?;
    }
    Ok(())
}

/// `(rows, Σ cost)` of a table compared by sums (`cost_micros` where it has one).
async fn sums_pg(conn: &mut PgConnection, table: &str) -> Result<(i64, i64)> {
    let sum = if table == "requests" {
        "COALESCE(SUM(cost_micros), 0)::BIGINT"
    } else {
        "0::BIGINT"
    };
    Ok(
        sqlx::query_as(&format!("SELECT COUNT(*), {sum} FROM {table}"))
            .fetch_one(conn)
            .await?,
    )
}

async fn sums_lite(lite: &sqlx::SqlitePool, table: &str) -> Result<(i64, i64)> {
    let sum = if table == "requests" {
        "COALESCE(SUM(cost_micros), 0)"
    } else {
        "0"
    };
    Ok(
        sqlx::query_as(&format!("SELECT COUNT(*), {sum} FROM {table}"))
            .fetch_one(lite)
            .await?,
    )
}

/// SQLite's write lock on the source file, held from before the source is verified until
/// after the copy is committed and checked: every read of the copy and of its comparison
/// then sees one state of the file, and a write meanwhile (a `sluice` command run against
/// the file, a gateway whose heartbeat looked stale) waits and fails as busy instead of
/// landing between a table's comparison and the commit, where the copy would have lost it
/// while saying it verified everything.
pub struct SourceHeld(sqlx::SqliteConnection);

/// Takes the write lock on the SQLite file at `path` (`BEGIN IMMEDIATE`, waiting as a
/// writer does for a write in progress).
pub async fn hold_source(path: &std::path::Path) -> Result<SourceHeld> {
    use sqlx::ConnectOptions;
    let mut conn = sqlx::sqlite::SqliteConnectOptions::new()
        .filename(path)
        .busy_timeout(std::time::Duration::from_secs(10))
        .connect()
        .await?;
    sqlx::query("BEGIN IMMEDIATE").execute(&mut conn).await?;
    Ok(SourceHeld(conn))
}

impl SourceHeld {
    /// Lets writers in again (nothing was written under the lock).
    pub async fn release(mut self) {
        let _ = sqlx::query("ROLLBACK").execute(&mut self.0).await;
        let _ = sqlx::Connection::close(self.0).await;
    }
}

/// Copies every table of the SQLite database `from` into the empty PostgreSQL database `to`
/// in one transaction, and compares both sides before it commits (see the module doc). The
/// caller makes sure no gateway runs on `from`, and holds its write lock (`hold_source`).
pub async fn sqlite_to_postgres(from: &Db, to: &Db) -> Result<Copied> {
    let (Backend::Sqlite(lite), Backend::Postgres(pg)) = (&from.backend, &to.backend) else {
        return Err(StoreError::Conflict(
            "migrate-store copies a SQLite database (--from sqlite://…) into a PostgreSQL one (--to postgres://…)".into(),
        ));
    };
    let lite = &lite.read;
    let mut tx = pg.pool.begin().await?;
    // Between its statements the copy reads and sums the SQLite side, a long while for a
    // large table: not the idle transaction of a frozen host (`pg::IDLE_IN_TRANSACTION_TIMEOUT`).
    sqlx::query("SET LOCAL idle_in_transaction_session_timeout = 0")
        .execute(&mut *tx)
        .await?;
    // No other writer meanwhile: the gateways' admin writes take this lock too.
    sqlx::query("SELECT pg_advisory_xact_lock($1)")
        .bind(super::pg::ADMIN_WRITE_LOCK)
        .execute(&mut *tx)
        .await?;
    for (table, _) in TABLES.iter().filter(|(t, _)| *t != "meta") {
        let n: i64 = sqlx::query_scalar(&format!("SELECT COUNT(*) FROM {table}"))
            .fetch_one(&mut *tx)
            .await?;
        if n > 0 {
            return Err(StoreError::Conflict(format!(
                "the PostgreSQL database is not empty ({table} has {n} rows): migrate-store only copies into a new, empty database"
            )));
        }
    }
    let (mut copied, mut replaced) = (Vec::new(), Vec::new());
    for (table, _) in TABLES {
        let cols = pg_columns(&mut tx, table).await?;
        let (rows, nul) = copy_table(lite, &mut tx, table, &cols).await?;
        move_sequence(&mut tx, table).await?;
        copied.push((table.to_string(), rows));
        if nul > 0 {
            replaced.push((table.to_string(), nul));
        }
    }
    super::pg::requests::rebuild_days(&mut tx).await?;
    for (table, row_for_row) in TABLES {
        let same = if *row_for_row {
            let cols = pg_columns(&mut tx, table).await?;
            same_rows(lite, &mut tx, table, &cols).await?
        } else {
            sums_lite(lite, table).await? == sums_pg(&mut tx, table).await?
        };
        if !same {
            return Err(StoreError::Conflict(format!(
                "the copy of {table} differs from the SQLite database; nothing was kept"
            )));
        }
    }
    tx.commit().await?;
    Ok(Copied {
        tables: copied,
        replaced,
    })
}
