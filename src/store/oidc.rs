//! Logins made by single sign-on (`admin::oidc`): found by their provider's issuer and
//! subject, their role and team rewritten at every sign-in; and the break-glass mark.

use chrono::{DateTime, Utc};

use super::sessions::AdminRow;
use super::{Result, StoreError};
use crate::clock::db_time;

const COLS: &str =
    "id, username, role, team_id, password_hash, disabled, oidc_issuer, oidc_subject, break_glass";

pub async fn admin_by_identity(
    tx: &mut super::Tx,
    issuer: &str,
    subject: &str,
) -> Result<Option<AdminRow>> {
    if let Some((conn, _)) = tx.pg() {
        return super::pg::oidc::admin_by_identity(conn, issuer, subject).await;
    }
    Ok(sqlx::query_as(&format!(
        "SELECT {COLS} FROM admins WHERE oidc_issuer = ? AND oidc_subject = ?"
    ))
    .bind(issuer)
    .bind(subject)
    .fetch_optional(tx.sqlite()?)
    .await?)
}

/// A new login for an SSO identity. Its password hash is empty: no password verifies
/// against it, and password sign-in refuses SSO logins before trying.
pub struct NewSsoAdmin<'a> {
    pub username: &'a str,
    pub issuer: &'a str,
    pub subject: &'a str,
    pub role: &'a str,
    pub team_id: Option<i64>,
}

pub async fn create_sso_admin(
    tx: &mut super::Tx,
    a: &NewSsoAdmin<'_>,
    now: DateTime<Utc>,
) -> Result<i64> {
    if let Some((conn, _)) = tx.pg() {
        return super::pg::oidc::create_sso_admin(conn, a, now).await;
    }
    let r = sqlx::query_scalar(
        "INSERT INTO admins (username, password_hash, role, team_id, created_at, oidc_issuer, oidc_subject) \
         VALUES (?, '', ?, ?, ?, ?, ?) RETURNING id",
    )
    .bind(a.username)
    .bind(a.role)
    .bind(a.team_id)
    .bind(db_time(now))
    .bind(a.issuer)
    .bind(a.subject)
    .fetch_one(tx.sqlite()?)
    .await;
    match r {
        Err(sqlx::Error::Database(e)) if e.is_unique_violation() => Err(StoreError::Conflict(
            format!("admin `{}` already exists", a.username),
        )),
        r => Ok(r?),
    }
}

/// The role and team the provider's claims grant today.
pub async fn set_grant(
    tx: &mut super::Tx,
    id: i64,
    role: &str,
    team_id: Option<i64>,
) -> Result<()> {
    if let Some((conn, _)) = tx.pg() {
        return super::pg::oidc::set_grant(conn, id, role, team_id).await;
    }
    sqlx::query("UPDATE admins SET role = ?, team_id = ? WHERE id = ?")
        .bind(role)
        .bind(team_id)
        .bind(id)
        .execute(tx.sqlite()?)
        .await?;
    Ok(())
}

pub async fn set_break_glass(tx: &mut super::Tx, id: i64) -> Result<()> {
    if let Some((conn, _)) = tx.pg() {
        return super::pg::oidc::set_break_glass(conn, id).await;
    }
    sqlx::query("UPDATE admins SET break_glass = 1 WHERE id = ?")
        .bind(id)
        .execute(tx.sqlite()?)
        .await?;
    Ok(())
}
