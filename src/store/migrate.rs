//! `sluice migrate-store`'s store side: every table of a SQLite database copied into an
//! empty PostgreSQL database in one PostgreSQL transaction, and compared before it commits.
//!
//! The copy is generic over the schema: for each table, the columns PostgreSQL has (in its
//! order, from `information_schema`) are read from SQLite and written in multi-row
//! `INSERT`s, each value decoded by the PostgreSQL column's type (SQLite's 0/1 become
//! booleans). Ids are kept; identity sequences are moved past them; an `id` SQLite's table
//! lacks is its rowid (`login_failures`, `cache_entries`); `meta` (which the PostgreSQL migration seeds) is overwritten; the
//! spend-by-day rollup is rebuilt from the copied request log (`pg::requests::rebuild_days`).
//! Not copied: `processes` (no gateway runs on the source: its rows are stale by
//! definition) and the migration bookkeeping. Before the commit, every table is read back
//! from both sides and compared — every balance, ledger row and audit hash value for value
//! (the request log and cache by count and sums: they can be large).

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
];

/// What was copied: rows per table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Copied {
    pub tables: Vec<(String, u64)>,
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
        // PostgreSQL's id stands for SQLite's rowid (`login_failures`, `cache_entries`).
        Ok("rowid".into())
    } else {
        Err(StoreError::Conflict(format!(
            "the SQLite table {table} has no column {col}: migrate the SQLite database with this version first"
        )))
    }
}

/// The SQLite rows of `table`, PostgreSQL's columns, ordered by the first (the key of every
/// copied table; some are `WITHOUT ROWID`).
async fn lite_rows(
    lite: &sqlx::SqlitePool,
    table: &str,
    cols: &[(String, Kind)],
) -> Result<Vec<Vec<Val>>> {
    let lite_cols: Vec<String> =
        sqlx::query_scalar(&format!("SELECT name FROM pragma_table_info('{table}')"))
            .fetch_all(lite)
            .await?;
    let exprs = cols
        .iter()
        .map(|(c, _)| lite_expr(table, c, &lite_cols))
        .collect::<Result<Vec<_>>>()?;
    let rows = sqlx::query(&format!(
        "SELECT {} FROM {table} ORDER BY 1",
        exprs.join(", ")
    ))
    .fetch_all(lite)
    .await?;
    rows.iter()
        .map(|r| {
            cols.iter()
                .enumerate()
                .map(|(i, (_, k))| lite_val(r, i, *k))
                .collect()
        })
        .collect()
}

/// The PostgreSQL rows of `table`, ordered as `lite_rows` orders SQLite's.
async fn pg_rows(
    conn: &mut PgConnection,
    table: &str,
    cols: &[(String, Kind)],
) -> Result<Vec<Vec<Val>>> {
    let names: Vec<String> = cols.iter().map(|(c, _)| format!("\"{c}\"")).collect();
    let rows = sqlx::query(&format!(
        "SELECT {} FROM {table} ORDER BY 1",
        names.join(", ")
    ))
    .fetch_all(&mut *conn)
    .await?;
    rows.iter()
        .map(|r| {
            cols.iter()
                .enumerate()
                .map(|(i, (_, k))| pg_val(r, i, *k))
                .collect()
        })
        .collect()
}

/// Writes `rows` into `table` in multi-row `INSERT`s (PostgreSQL takes at most 65 535
/// parameters a statement).
async fn insert(
    conn: &mut PgConnection,
    table: &str,
    cols: &[(String, Kind)],
    rows: &[Vec<Val>],
) -> Result<()> {
    let per = (60_000 / cols.len().max(1)).clamp(1, 1000);
    let names: Vec<String> = cols.iter().map(|(c, _)| format!("\"{c}\"")).collect();
    for chunk in rows.chunks(per) {
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

/// Copies every table of the SQLite database `from` into the empty PostgreSQL database `to`
/// in one transaction, and compares both sides before it commits (see the module doc). The
/// caller makes sure no gateway runs on `from`.
pub async fn sqlite_to_postgres(from: &Db, to: &Db) -> Result<Copied> {
    let (Backend::Sqlite(lite), Backend::Postgres(pg)) = (&from.backend, &to.backend) else {
        return Err(StoreError::Conflict(
            "migrate-store copies a SQLite database (--from sqlite://…) into a PostgreSQL one (--to postgres://…)".into(),
        ));
    };
    let lite = &lite.read;
    let mut tx = pg.pool.begin().await?;
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
    let mut copied = Vec::new();
    for (table, _) in TABLES {
        let cols = pg_columns(&mut tx, table).await?;
        let rows = lite_rows(lite, table, &cols).await?;
        insert(&mut tx, table, &cols, &rows).await?;
        move_sequence(&mut tx, table).await?;
        copied.push((table.to_string(), rows.len() as u64));
    }
    super::pg::requests::rebuild_days(&mut tx).await?;
    for (table, row_for_row) in TABLES {
        let same = if *row_for_row {
            let cols = pg_columns(&mut tx, table).await?;
            let mut a = lite_rows(lite, table, &cols).await?;
            // Text keys: sorted alike on both sides, whatever the collations say.
            if matches!(
                *table,
                "meta" | "admin_sessions" | "reservations" | "orphaned"
            ) {
                a.sort_by(|x, y| format!("{:?}", x[0]).cmp(&format!("{:?}", y[0])));
            }
            let mut b = pg_rows(&mut tx, table, &cols).await?;
            if matches!(
                *table,
                "meta" | "admin_sessions" | "reservations" | "orphaned"
            ) {
                b.sort_by(|x, y| format!("{:?}", x[0]).cmp(&format!("{:?}", y[0])));
            }
            a == b
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
    Ok(Copied { tables: copied })
}
