//! Logins made by single sign-on (PostgreSQL; see `store::oidc`).

use chrono::{DateTime, Utc};
use sqlx::PgConnection;

use super::text;
use crate::clock::db_time;
use crate::store::oidc::NewSsoAdmin;
use crate::store::sessions::AdminRow;
use crate::store::{Result, StoreError};

const COLS: &str =
    "id, username, role, team_id, password_hash, disabled, oidc_issuer, oidc_subject, break_glass";

pub async fn admin_by_identity(
    conn: &mut PgConnection,
    issuer: &str,
    subject: &str,
) -> Result<Option<AdminRow>> {
    if !text::storable(issuer) || !text::storable(subject) {
        return Ok(None);
    }
    Ok(sqlx::query_as(&format!(
        "SELECT {COLS} FROM admins WHERE oidc_issuer = $1 AND oidc_subject = $2"
    ))
    .bind(issuer)
    .bind(subject)
    .fetch_optional(conn)
    .await?)
}

pub async fn create_sso_admin(
    conn: &mut PgConnection,
    a: &NewSsoAdmin<'_>,
    now: DateTime<Utc>,
) -> Result<i64> {
    text::check(&[
        ("username", Some(a.username)),
        ("issuer", Some(a.issuer)),
        ("subject", Some(a.subject)),
    ])?;
    let taken: Option<i64> = sqlx::query_scalar("SELECT id FROM admins WHERE username = $1")
        .bind(a.username)
        .fetch_optional(&mut *conn)
        .await?;
    if taken.is_some() {
        return Err(StoreError::Conflict(format!(
            "admin `{}` already exists",
            a.username
        )));
    }
    Ok(sqlx::query_scalar(
        "INSERT INTO admins (username, password_hash, role, team_id, created_at, oidc_issuer, oidc_subject) \
         VALUES ($1, '', $2, $3, $4, $5, $6) RETURNING id",
    )
    .bind(a.username)
    .bind(a.role)
    .bind(a.team_id)
    .bind(db_time(now))
    .bind(a.issuer)
    .bind(a.subject)
    .fetch_one(conn)
    .await?)
}

pub async fn set_grant(
    conn: &mut PgConnection,
    id: i64,
    role: &str,
    team_id: Option<i64>,
) -> Result<()> {
    sqlx::query("UPDATE admins SET role = $1, team_id = $2 WHERE id = $3")
        .bind(role)
        .bind(team_id)
        .bind(id)
        .execute(conn)
        .await?;
    Ok(())
}

pub async fn set_break_glass(conn: &mut PgConnection, id: i64) -> Result<()> {
    sqlx::query("UPDATE admins SET break_glass = TRUE WHERE id = $1")
        .bind(id)
        .execute(conn)
        .await?;
    Ok(())
}
