//! Admin sessions, admin API keys and sign-in attempts (PostgreSQL; see `store::sessions`).
//! `login_failures.id` stands for SQLite's rowid.

use chrono::{DateTime, Duration, Utc};
use sqlx::{PgConnection, PgPool};

use super::text;
use crate::clock::db_time;
use crate::store::sessions::{AdminRow, ApiKeyRow};
use crate::store::Result;

const ADMIN_COLS: &str =
    "a.id, a.username, a.role, a.team_id, a.password_hash, a.disabled, a.oidc_issuer, a.oidc_subject, a.break_glass";

pub async fn admin_by_name(pool: &PgPool, username: &str) -> Result<Option<AdminRow>> {
    if !text::storable(username) {
        return Ok(None);
    }
    Ok(sqlx::query_as(&format!(
        "SELECT {ADMIN_COLS} FROM admins a WHERE a.username = $1"
    ))
    .bind(username)
    .fetch_optional(pool)
    .await?)
}

pub async fn admin_by_id(pool: &PgPool, id: i64) -> Result<Option<AdminRow>> {
    Ok(sqlx::query_as(&format!(
        "SELECT {ADMIN_COLS} FROM admins a WHERE a.id = $1"
    ))
    .bind(id)
    .fetch_optional(pool)
    .await?)
}

/// The admin's row inside the caller's transaction (`store::sessions::admin_in`).
pub async fn admin_in(conn: &mut PgConnection, id: i64) -> Result<Option<AdminRow>> {
    Ok(sqlx::query_as(&format!(
        "SELECT {ADMIN_COLS} FROM admins a WHERE a.id = $1"
    ))
    .bind(id)
    .fetch_optional(conn)
    .await?)
}

/// The hash replaced only while it still is `old` (`store::sessions::replace_password_hash`).
pub async fn replace_password_hash(
    conn: &mut PgConnection,
    id: i64,
    old: &str,
    new: &str,
) -> Result<bool> {
    text::check(&[("password hash", Some(new))])?;
    if !text::storable(old) {
        return Ok(false);
    }
    Ok(sqlx::query(
        "UPDATE admins SET password_hash = $1 WHERE id = $2 AND password_hash = $3 AND NOT disabled",
    )
    .bind(new)
    .bind(id)
    .bind(old)
    .execute(conn)
    .await?
    .rows_affected()
        == 1)
}

pub async fn set_password_hash(conn: &mut PgConnection, id: i64, hash: &str) -> Result<()> {
    text::check(&[("password hash", Some(hash))])?;
    sqlx::query("UPDATE admins SET password_hash = $1 WHERE id = $2")
        .bind(hash)
        .bind(id)
        .execute(conn)
        .await?;
    Ok(())
}

/// The database's time as stored text (`clock::db_time`'s format), `$ago` seconds back, at
/// the statement. Sessions are stamped, judged and pruned by it here: hosts' clocks may
/// disagree by any amount, and judged by each host's own, a host an hour ahead took every
/// other host's session for idle — and its sign-ins' prune deleted them all — while one
/// behind kept idle sessions for longer (s30 identity attack F2).
fn db_time_ago(ago: &str) -> String {
    format!(
        "to_char((statement_timestamp() - make_interval(secs => {ago})) AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.MS\"Z\"')"
    )
}

/// Opens a session, stamped by the database's clock (`db_time_ago`).
pub async fn create_session(
    conn: &mut PgConnection,
    id_hash: &str,
    admin_id: i64,
    address: &str,
) -> Result<()> {
    text::check(&[("session", Some(id_hash)), ("address", Some(address))])?;
    let now = db_time_ago("0");
    sqlx::query(&format!(
        "INSERT INTO admin_sessions (id_hash, admin_id, address, created_at, last_seen_at) VALUES ($1, $2, $3, {now}, {now})",
    ))
    .bind(id_hash)
    .bind(admin_id)
    .bind(address)
    .execute(conn)
    .await?;
    Ok(())
}

/// The (admin id, created at, last seen at, the database's time now) of a session
/// (`store::sessions::find_session` reads its admin).
pub async fn session(
    pool: &PgPool,
    id_hash: &str,
) -> Result<Option<(i64, String, String, String)>> {
    if !text::storable(id_hash) {
        return Ok(None);
    }
    Ok(sqlx::query_as(&format!(
        "SELECT admin_id, created_at, last_seen_at, {} FROM admin_sessions WHERE id_hash = $1",
        db_time_ago("0")
    ))
    .bind(id_hash)
    .fetch_optional(pool)
    .await?)
}

/// Marks a session used, by the database's clock.
pub async fn touch_session(pool: &PgPool, id_hash: &str) -> Result<()> {
    sqlx::query(&format!(
        "UPDATE admin_sessions SET last_seen_at = {} WHERE id_hash = $1",
        db_time_ago("0")
    ))
    .bind(id_hash)
    .execute(pool)
    .await?;
    Ok(())
}

pub async fn delete_session(conn: &mut PgConnection, id_hash: &str) -> Result<bool> {
    Ok(sqlx::query("DELETE FROM admin_sessions WHERE id_hash = $1")
        .bind(id_hash)
        .execute(conn)
        .await?
        .rows_affected()
        > 0)
}

/// Whether the session `id_hash` still exists (`store::sessions::session_live`).
pub async fn session_live(conn: &mut PgConnection, id_hash: &str) -> Result<bool> {
    if !text::storable(id_hash) {
        return Ok(false);
    }
    Ok(
        sqlx::query_scalar::<_, i32>("SELECT 1 FROM admin_sessions WHERE id_hash = $1")
            .bind(id_hash)
            .fetch_optional(conn)
            .await?
            .is_some(),
    )
}

/// Whether the API key of this hash exists unrevoked (`store::sessions::api_key_live`).
pub async fn api_key_live(
    conn: &mut PgConnection,
    hash: &[u8],
    (role, team_id): (&str, Option<i64>),
) -> Result<bool> {
    Ok(sqlx::query_scalar::<_, i32>(
        "SELECT 1 FROM admin_api_keys k JOIN admins a ON a.id = k.admin_id \
         WHERE k.key_hash = $1 AND k.revoked_at IS NULL AND NOT a.disabled \
           AND a.role = $2 AND a.team_id IS NOT DISTINCT FROM $3",
    )
    .bind(hash)
    .bind(role)
    .bind(team_id)
    .fetch_optional(conn)
    .await?
    .is_some())
}

/// Ends every session of an admin except `keep`.
pub async fn delete_sessions_of(
    conn: &mut PgConnection,
    admin_id: i64,
    keep: Option<&str>,
) -> Result<u64> {
    Ok(
        sqlx::query("DELETE FROM admin_sessions WHERE admin_id = $1 AND id_hash <> $2")
            .bind(admin_id)
            .bind(keep.unwrap_or(""))
            .execute(conn)
            .await?
            .rows_affected(),
    )
}

/// Drops sessions that can no longer be used (idle or too old), by the database's clock.
pub async fn prune_sessions(
    conn: &mut PgConnection,
    idle: chrono::Duration,
    absolute: chrono::Duration,
) -> Result<()> {
    sqlx::query(&format!(
        "DELETE FROM admin_sessions WHERE last_seen_at < {} OR created_at < {}",
        db_time_ago("$1"),
        db_time_ago("$2")
    ))
    .bind(idle.num_milliseconds() as f64 / 1000.0)
    .bind(absolute.num_milliseconds() as f64 / 1000.0)
    .execute(conn)
    .await?;
    Ok(())
}

/// As `store::sessions`: the newest attempts a sweep never touches.
const ATTEMPTS_KEPT: i64 = 100_000;

/// Records one admitted sign-in attempt under `key`; returns its row id (see
/// `store::sessions::record_attempt` for the sweep).
pub async fn record_attempt(conn: &mut PgConnection, key: &str, now: DateTime<Utc>) -> Result<i64> {
    let id =
        sqlx::query_scalar("INSERT INTO login_failures (key, at) VALUES ($1, $2) RETURNING id")
            .bind(text::key(key))
            .bind(db_time(now))
            .fetch_one(&mut *conn)
            .await?;
    sqlx::query(
        "DELETE FROM login_failures WHERE at < $1 \
         AND id <= (SELECT max(id) FROM login_failures) - $2",
    )
    .bind(db_time(now - Duration::days(1)))
    .bind(ATTEMPTS_KEPT)
    .execute(conn)
    .await?;
    Ok(id)
}

/// Deletes exactly these attempt rows (an attempt withdrawn), never others of their keys.
pub async fn delete_attempts(conn: &mut PgConnection, rows: &[i64]) -> Result<()> {
    sqlx::query("DELETE FROM login_failures WHERE id = ANY($1)")
        .bind(rows)
        .execute(conn)
        .await?;
    Ok(())
}

/// Deletes every attempt recorded under `key`; how many.
pub async fn delete_attempts_of(conn: &mut PgConnection, key: &str) -> Result<u64> {
    Ok(sqlx::query("DELETE FROM login_failures WHERE key = $1")
        .bind(text::key(key))
        .execute(conn)
        .await?
        .rows_affected())
}

/// Deletes every attempt stamped after `now` (by a clock that ran ahead); how many.
pub async fn delete_attempts_after(conn: &mut PgConnection, now: DateTime<Utc>) -> Result<u64> {
    Ok(sqlx::query("DELETE FROM login_failures WHERE at > $1")
        .bind(db_time(now))
        .execute(conn)
        .await?
        .rows_affected())
}

/// The times of `key`'s attempts since `since`, newest first, at most `limit` of them.
pub async fn recent_attempts(
    conn: &mut PgConnection,
    key: &str,
    since: DateTime<Utc>,
    limit: usize,
) -> Result<Vec<String>> {
    Ok(sqlx::query_scalar(
        "SELECT at FROM login_failures WHERE key = $1 AND at >= $2 ORDER BY at DESC LIMIT $3",
    )
    .bind(text::key(key))
    .bind(db_time(since))
    .bind(i64::try_from(limit).unwrap_or(i64::MAX))
    .fetch_all(conn)
    .await?)
}

pub async fn create_api_key(
    conn: &mut PgConnection,
    admin_id: i64,
    hash: &[u8],
    prefix: &str,
    name: &str,
    now: DateTime<Utc>,
) -> Result<i64> {
    text::check(&[("key name", Some(name)), ("key prefix", Some(prefix))])?;
    Ok(sqlx::query_scalar(
        "INSERT INTO admin_api_keys (admin_id, key_hash, prefix, name, created_at) VALUES ($1, $2, $3, $4, $5) RETURNING id",
    )
    .bind(admin_id)
    .bind(hash)
    .bind(prefix)
    .bind(name)
    .bind(db_time(now))
    .fetch_one(conn)
    .await?)
}

pub async fn api_keys_of(pool: &PgPool, admin_id: i64) -> Result<Vec<ApiKeyRow>> {
    Ok(sqlx::query_as(
        "SELECT id, prefix, name, created_at, revoked_at FROM admin_api_keys WHERE admin_id = $1 ORDER BY id DESC",
    )
    .bind(admin_id)
    .fetch_all(pool)
    .await?)
}

/// Revokes one of `admin_id`'s keys; `false` when there is no such live key of theirs.
pub async fn revoke_api_key(
    conn: &mut PgConnection,
    admin_id: i64,
    id: i64,
    now: DateTime<Utc>,
) -> Result<bool> {
    Ok(sqlx::query(
        "UPDATE admin_api_keys SET revoked_at = $1 WHERE id = $2 AND admin_id = $3 AND revoked_at IS NULL",
    )
    .bind(db_time(now))
    .bind(id)
    .bind(admin_id)
    .execute(conn)
    .await?
    .rows_affected()
        == 1)
}

/// Revokes every live API key of an admin; how many.
pub async fn revoke_api_keys_of(
    conn: &mut PgConnection,
    admin_id: i64,
    now: DateTime<Utc>,
) -> Result<u64> {
    Ok(sqlx::query(
        "UPDATE admin_api_keys SET revoked_at = $1 WHERE admin_id = $2 AND revoked_at IS NULL",
    )
    .bind(db_time(now))
    .bind(admin_id)
    .execute(conn)
    .await?
    .rows_affected())
}

/// The owner of a live API key, by the key's hash.
pub async fn admin_by_api_key(pool: &PgPool, hash: &[u8]) -> Result<Option<AdminRow>> {
    Ok(sqlx::query_as(&format!(
        "SELECT {ADMIN_COLS} FROM admin_api_keys k JOIN admins a ON a.id = k.admin_id
         WHERE k.key_hash = $1 AND k.revoked_at IS NULL"
    ))
    .bind(hash)
    .fetch_optional(pool)
    .await?)
}
