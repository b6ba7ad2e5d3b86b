//! Admin sessions, admin API keys and the sign-in attempts that throttle guessing
//! (`auth::throttle`).
//! Sessions and keys are found by the SHA-256 of their secret; the secret is never stored.

use chrono::{DateTime, Duration, Utc};
use sqlx::FromRow;

use super::Result;
use crate::clock::db_time;

/// Who is behind a session or an API key.
#[derive(Debug, Clone, FromRow)]
pub struct AdminRow {
    pub id: i64,
    pub username: String,
    pub role: String,
    pub team_id: Option<i64>,
    pub password_hash: String,
    pub disabled: bool,
    /// The provider and subject of a login made by single sign-on (it has no password).
    pub oidc_issuer: Option<String>,
    pub oidc_subject: Option<String>,
    /// May sign in with its password when `[oidc] password_login = false`.
    pub break_glass: bool,
}

const ADMIN_COLS: &str =
    "a.id, a.username, a.role, a.team_id, a.password_hash, a.disabled, a.oidc_issuer, a.oidc_subject, a.break_glass";

pub async fn admin_by_name(db: &super::Db, username: &str) -> Result<Option<AdminRow>> {
    let sqlite = match &db.backend {
        super::Backend::Sqlite(s) => s,
        super::Backend::Postgres(pg) => {
            return super::pg::sessions::admin_by_name(&pg.pool, username).await
        }
    };
    let pool = &sqlite.read;
    Ok(sqlx::query_as(&format!(
        "SELECT {ADMIN_COLS} FROM admins a WHERE a.username = ?"
    ))
    .bind(username)
    .fetch_optional(pool)
    .await?)
}

pub async fn admin_by_id(db: &super::Db, id: i64) -> Result<Option<AdminRow>> {
    let sqlite = match &db.backend {
        super::Backend::Sqlite(s) => s,
        super::Backend::Postgres(pg) => {
            return super::pg::sessions::admin_by_id(&pg.pool, id).await
        }
    };
    let pool = &sqlite.read;
    Ok(
        sqlx::query_as(&format!("SELECT {ADMIN_COLS} FROM admins a WHERE a.id = ?"))
            .bind(id)
            .fetch_optional(pool)
            .await?,
    )
}

/// The admin's row as `tx` sees it. Every admin write transaction holds the admin write
/// lock (SQLite's `BEGIN IMMEDIATE`, PostgreSQL's `ADMIN_WRITE_LOCK`), so this is the row
/// the last committed change left, and no other change lands before `tx` ends: what a
/// sign-in checks here still holds when its session is written.
pub async fn admin_in(tx: &mut super::Tx, id: i64) -> Result<Option<AdminRow>> {
    if let Some((conn, _)) = tx.pg() {
        return super::pg::sessions::admin_in(conn, id).await;
    }
    Ok(
        sqlx::query_as(&format!("SELECT {ADMIN_COLS} FROM admins a WHERE a.id = ?"))
            .bind(id)
            .fetch_optional(tx.sqlite()?)
            .await?,
    )
}

/// Replaces the hash only while it still is `old` and the login is not disabled (a
/// compare-and-set); whether it did. A rehash or a change verified against `old` must not
/// land over a password set since, or arm a login disabled since.
pub async fn replace_password_hash(
    tx: &mut super::Tx,
    id: i64,
    old: &str,
    new: &str,
) -> Result<bool> {
    if let Some((conn, _)) = tx.pg() {
        return super::pg::sessions::replace_password_hash(conn, id, old, new).await;
    }
    Ok(sqlx::query(
        "UPDATE admins SET password_hash = ? WHERE id = ? AND password_hash = ? AND NOT disabled",
    )
    .bind(new)
    .bind(id)
    .bind(old)
    .execute(tx.sqlite()?)
    .await?
    .rows_affected()
        == 1)
}

pub async fn set_password_hash(tx: &mut super::Tx, id: i64, hash: &str) -> Result<()> {
    if let Some((conn, _)) = tx.pg() {
        return super::pg::sessions::set_password_hash(conn, id, hash).await;
    }
    sqlx::query("UPDATE admins SET password_hash = ? WHERE id = ?")
        .bind(hash)
        .bind(id)
        .execute(tx.sqlite()?)
        .await?;
    Ok(())
}

pub async fn create_session(
    tx: &mut super::Tx,
    id_hash: &str,
    admin_id: i64,
    address: &str,
    now: DateTime<Utc>,
) -> Result<()> {
    if let Some((conn, _)) = tx.pg() {
        return super::pg::sessions::create_session(conn, id_hash, admin_id, address).await;
    }
    sqlx::query(
        "INSERT INTO admin_sessions (id_hash, admin_id, address, created_at, last_seen_at) VALUES (?, ?, ?, ?, ?)",
    )
    .bind(id_hash)
    .bind(admin_id)
    .bind(address)
    .bind(db_time(now))
    .bind(db_time(now))
    .execute(tx.sqlite()?)
    .await?;
    Ok(())
}

/// A live session: its owner (not disabled) and when it started and was last seen.
pub struct SessionRow {
    pub admin: AdminRow,
    pub created_at: String,
    pub last_seen_at: String,
    /// The store's time when read, the clock sessions are judged by: the database's on
    /// PostgreSQL (hosts' clocks may disagree), none on SQLite (the one host's).
    pub now: Option<String>,
}

pub async fn find_session(db: &super::Db, id_hash: &str) -> Result<Option<SessionRow>> {
    let row: Option<(i64, String, String, Option<String>)> = match &db.backend {
        super::Backend::Sqlite(sqlite) => sqlx::query_as(
            "SELECT admin_id, created_at, last_seen_at, NULL FROM admin_sessions WHERE id_hash = ?",
        )
        .bind(id_hash)
        .fetch_optional(&sqlite.read)
        .await?,
        super::Backend::Postgres(pg) => super::pg::sessions::session(&pg.pool, id_hash)
            .await?
            .map(|(a, c, s, now)| (a, c, s, Some(now))),
    };
    let Some((admin_id, created_at, last_seen_at, now)) = row else {
        return Ok(None);
    };
    Ok(admin_by_id(db, admin_id).await?.map(|admin| SessionRow {
        admin,
        created_at,
        last_seen_at,
        now,
    }))
}

pub async fn touch_session(db: &super::Db, id_hash: &str, now: DateTime<Utc>) -> Result<()> {
    let sqlite = match &db.backend {
        super::Backend::Sqlite(s) => s,
        super::Backend::Postgres(pg) => {
            return super::pg::sessions::touch_session(&pg.pool, id_hash).await
        }
    };
    let pool = &sqlite.write;
    sqlx::query("UPDATE admin_sessions SET last_seen_at = ? WHERE id_hash = ?")
        .bind(db_time(now))
        .bind(id_hash)
        .execute(pool)
        .await?;
    Ok(())
}

pub async fn delete_session(tx: &mut super::Tx, id_hash: &str) -> Result<bool> {
    if let Some((conn, _)) = tx.pg() {
        return super::pg::sessions::delete_session(conn, id_hash).await;
    }
    Ok(sqlx::query("DELETE FROM admin_sessions WHERE id_hash = ?")
        .bind(id_hash)
        .execute(tx.sqlite()?)
        .await?
        .rows_affected()
        > 0)
}

/// Whether the session `id_hash` still exists, read inside `tx` (`Actor::hold`).
pub async fn session_live(tx: &mut super::Tx, id_hash: &str) -> Result<bool> {
    if let Some((conn, _)) = tx.pg() {
        return super::pg::sessions::session_live(conn, id_hash).await;
    }
    Ok(
        sqlx::query_scalar::<_, i64>("SELECT 1 FROM admin_sessions WHERE id_hash = ?")
            .bind(id_hash)
            .fetch_optional(tx.sqlite()?)
            .await?
            .is_some(),
    )
}

/// Whether the admin API key of this hash exists unrevoked and its owner is not disabled
/// (disabling revokes no key) and still has the role and team `(role, team_id)` the
/// request was authorized for (a role change revokes no key either), read inside `tx`
/// (`Actor::hold`).
pub async fn api_key_live(
    tx: &mut super::Tx,
    hash: &[u8],
    (role, team_id): (&str, Option<i64>),
) -> Result<bool> {
    if let Some((conn, _)) = tx.pg() {
        return super::pg::sessions::api_key_live(conn, hash, (role, team_id)).await;
    }
    Ok(sqlx::query_scalar::<_, i64>(
        "SELECT 1 FROM admin_api_keys k JOIN admins a ON a.id = k.admin_id \
         WHERE k.key_hash = ? AND k.revoked_at IS NULL AND a.disabled = 0 \
           AND a.role = ? AND a.team_id IS ?",
    )
    .bind(hash)
    .bind(role)
    .bind(team_id)
    .fetch_optional(tx.sqlite()?)
    .await?
    .is_some())
}

/// Ends every session of an admin except `keep` (password change, disabling, role change).
pub async fn delete_sessions_of(
    tx: &mut super::Tx,
    admin_id: i64,
    keep: Option<&str>,
) -> Result<u64> {
    if let Some((conn, _)) = tx.pg() {
        return super::pg::sessions::delete_sessions_of(conn, admin_id, keep).await;
    }
    Ok(
        sqlx::query("DELETE FROM admin_sessions WHERE admin_id = ? AND id_hash <> ?")
            .bind(admin_id)
            .bind(keep.unwrap_or(""))
            .execute(tx.sqlite()?)
            .await?
            .rows_affected(),
    )
}

/// Drops sessions that can no longer be used (idle or too old).
/// Drops sessions idle for `idle` or opened `absolute` ago, at `now` (on PostgreSQL by the
/// database's clock, as sessions are judged there).
pub async fn prune_sessions(
    tx: &mut super::Tx,
    now: DateTime<Utc>,
    (idle, absolute): (chrono::Duration, chrono::Duration),
) -> Result<()> {
    if let Some((conn, _)) = tx.pg() {
        return super::pg::sessions::prune_sessions(conn, idle, absolute).await;
    }
    sqlx::query("DELETE FROM admin_sessions WHERE last_seen_at < ? OR created_at < ?")
        .bind(db_time(now - idle))
        .bind(db_time(now - absolute))
        .execute(tx.sqlite()?)
        .await?;
    Ok(())
}

/// Rows of `login_failures` a sweep never touches however old they look: the newest
/// `ATTEMPTS_KEPT` (by row id, which grows with every insert whatever the clocks say).
const ATTEMPTS_KEPT: i64 = 100_000;

/// Records one admitted sign-in attempt under `key` (`user:<name>` or `addr:<ip>`); returns
/// its row id. Rows older than a day are swept here, unless among the newest
/// `ATTEMPTS_KEPT`: "a day old" is this process's clock's opinion, and a process whose clock
/// runs a day ahead would otherwise sweep every attempt the others still count. (The table
/// stays bounded: a day of attempts beyond the newest `ATTEMPTS_KEPT`. `login_failures` holds
/// attempts that have not been withdrawn: failures, and attempts still being verified.)
pub async fn record_attempt(tx: &mut super::Tx, key: &str, now: DateTime<Utc>) -> Result<i64> {
    if let Some((conn, _)) = tx.pg() {
        return super::pg::sessions::record_attempt(conn, key, now).await;
    }
    let id =
        sqlx::query_scalar("INSERT INTO login_failures (key, at) VALUES (?, ?) RETURNING rowid")
            .bind(key)
            .bind(db_time(now))
            .fetch_one(tx.sqlite()?)
            .await?;
    sqlx::query(
        "DELETE FROM login_failures WHERE at < ? \
         AND rowid <= (SELECT max(rowid) FROM login_failures) - ?",
    )
    .bind(db_time(now - Duration::days(1)))
    .bind(ATTEMPTS_KEPT)
    .execute(tx.sqlite()?)
    .await?;
    Ok(id)
}

/// Deletes exactly these attempt rows (an attempt withdrawn), never others of their keys.
pub async fn delete_attempts(tx: &mut super::Tx, rows: &[i64]) -> Result<()> {
    if let Some((conn, _)) = tx.pg() {
        return super::pg::sessions::delete_attempts(conn, rows).await;
    }
    for id in rows {
        sqlx::query("DELETE FROM login_failures WHERE rowid = ?")
            .bind(id)
            .execute(tx.sqlite()?)
            .await?;
    }
    Ok(())
}

/// Deletes every attempt recorded under `key` (an operator lifting a lock); how many.
pub async fn delete_attempts_of(tx: &mut super::Tx, key: &str) -> Result<u64> {
    if let Some((conn, _)) = tx.pg() {
        return super::pg::sessions::delete_attempts_of(conn, key).await;
    }
    Ok(sqlx::query("DELETE FROM login_failures WHERE key = ?")
        .bind(key)
        .execute(tx.sqlite()?)
        .await?
        .rows_affected())
}

/// Deletes every attempt stamped after `now` (by a clock that ran ahead); how many.
pub async fn delete_attempts_after(tx: &mut super::Tx, now: DateTime<Utc>) -> Result<u64> {
    if let Some((conn, _)) = tx.pg() {
        return super::pg::sessions::delete_attempts_after(conn, now).await;
    }
    Ok(sqlx::query("DELETE FROM login_failures WHERE at > ?")
        .bind(db_time(now))
        .execute(tx.sqlite()?)
        .await?
        .rows_affected())
}

/// The times of `key`'s attempts since `since`, newest first, at most `limit` of them.
pub async fn recent_attempts(
    tx: &mut super::Tx,
    key: &str,
    since: DateTime<Utc>,
    limit: usize,
) -> Result<Vec<String>> {
    if let Some((conn, _)) = tx.pg() {
        return super::pg::sessions::recent_attempts(conn, key, since, limit).await;
    }
    Ok(sqlx::query_scalar(
        "SELECT at FROM login_failures WHERE key = ? AND at >= ? ORDER BY at DESC LIMIT ?",
    )
    .bind(key)
    .bind(db_time(since))
    .bind(i64::try_from(limit).unwrap_or(i64::MAX))
    .fetch_all(tx.sqlite()?)
    .await?)
}

#[derive(Debug, Clone, FromRow, serde::Serialize)]
pub struct ApiKeyRow {
    pub id: i64,
    pub prefix: String,
    pub name: String,
    pub created_at: String,
    pub revoked_at: Option<String>,
}

pub async fn create_api_key(
    tx: &mut super::Tx,
    admin_id: i64,
    hash: &[u8],
    prefix: &str,
    name: &str,
    now: DateTime<Utc>,
) -> Result<i64> {
    if let Some((conn, _)) = tx.pg() {
        return super::pg::sessions::create_api_key(conn, admin_id, hash, prefix, name, now).await;
    }
    Ok(sqlx::query_scalar(
        "INSERT INTO admin_api_keys (admin_id, key_hash, prefix, name, created_at) VALUES (?, ?, ?, ?, ?) RETURNING id",
    )
    .bind(admin_id)
    .bind(hash)
    .bind(prefix)
    .bind(name)
    .bind(db_time(now))
    .fetch_one(tx.sqlite()?)
    .await?)
}

pub async fn api_keys_of(db: &super::Db, admin_id: i64) -> Result<Vec<ApiKeyRow>> {
    let sqlite = match &db.backend {
        super::Backend::Sqlite(s) => s,
        super::Backend::Postgres(pg) => {
            return super::pg::sessions::api_keys_of(&pg.pool, admin_id).await
        }
    };
    let pool = &sqlite.read;
    Ok(sqlx::query_as(
        "SELECT id, prefix, name, created_at, revoked_at FROM admin_api_keys WHERE admin_id = ? ORDER BY id DESC",
    )
    .bind(admin_id)
    .fetch_all(pool)
    .await?)
}

/// Revokes one of `admin_id`'s keys; `false` when there is no such live key of theirs.
pub async fn revoke_api_key(
    tx: &mut super::Tx,
    admin_id: i64,
    id: i64,
    now: DateTime<Utc>,
) -> Result<bool> {
    if let Some((conn, _)) = tx.pg() {
        return super::pg::sessions::revoke_api_key(conn, admin_id, id, now).await;
    }
    Ok(sqlx::query(
        "UPDATE admin_api_keys SET revoked_at = ? WHERE id = ? AND admin_id = ? AND revoked_at IS NULL",
    )
    .bind(db_time(now))
    .bind(id)
    .bind(admin_id)
    .execute(tx.sqlite()?)
    .await?
    .rows_affected()
        == 1)
}

/// Revokes every live API key of an admin (their password changed or was reset); returns
/// how many.
pub async fn revoke_api_keys_of(
    tx: &mut super::Tx,
    admin_id: i64,
    now: DateTime<Utc>,
) -> Result<u64> {
    if let Some((conn, _)) = tx.pg() {
        return super::pg::sessions::revoke_api_keys_of(conn, admin_id, now).await;
    }
    Ok(sqlx::query(
        "UPDATE admin_api_keys SET revoked_at = ? WHERE admin_id = ? AND revoked_at IS NULL",
    )
    .bind(db_time(now))
    .bind(admin_id)
    .execute(tx.sqlite()?)
    .await?
    .rows_affected())
}

/// The owner of a live API key, by the key's hash.
pub async fn admin_by_api_key(db: &super::Db, hash: &[u8]) -> Result<Option<AdminRow>> {
    let sqlite = match &db.backend {
        super::Backend::Sqlite(s) => s,
        super::Backend::Postgres(pg) => {
            return super::pg::sessions::admin_by_api_key(&pg.pool, hash).await
        }
    };
    let pool = &sqlite.read;
    Ok(sqlx::query_as(&format!(
        "SELECT {ADMIN_COLS} FROM admin_api_keys k JOIN admins a ON a.id = k.admin_id
         WHERE k.key_hash = ? AND k.revoked_at IS NULL"
    ))
    .bind(hash)
    .fetch_optional(pool)
    .await?)
}
