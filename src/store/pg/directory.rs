//! Teams, members and logins as the admin surface lists and edits them (PostgreSQL; see
//! `store::directory`). `SUM` of a BIGINT is NUMERIC on PostgreSQL: every sum is cast back.

use sqlx::{PgConnection, PgPool};

use super::text;
use crate::store::directory::{LoginEdit, LoginRow, MemberEdit, MemberRow, TeamRow};
use crate::store::{Result, StoreError};

const TEAM_SELECT: &str = "SELECT tm.id, tm.name, tm.tags, tm.limit_micros, tm.remaining_micros, tm.reserved_micros, tm.reset, tm.period,
        COALESCE((SELECT SUM(l.amount_micros) FROM ledger l WHERE l.team_id = tm.id AND l.team_period = tm.period
                  AND l.kind IN ('reserve', 'settle', 'adjust')), 0)::BIGINT - tm.reserved_micros AS spent_micros,
        (SELECT COUNT(*) FROM users u WHERE u.team_id = tm.id) AS members, tm.created_at
     FROM teams tm";

pub async fn teams(pool: &PgPool, scope: Option<i64>) -> Result<Vec<TeamRow>> {
    Ok(sqlx::query_as(&format!(
        "{TEAM_SELECT} WHERE ($1::BIGINT IS NULL OR tm.id = $1) ORDER BY tm.name"
    ))
    .bind(scope)
    .fetch_all(pool)
    .await?)
}

pub async fn team(conn: &mut PgConnection, id: i64) -> Result<Option<TeamRow>> {
    Ok(sqlx::query_as(&format!("{TEAM_SELECT} WHERE tm.id = $1"))
        .bind(id)
        .fetch_optional(conn)
        .await?)
}

const MEMBER_SELECT: &str = "SELECT u.id, u.username, u.team_id, tm.name AS team, u.disabled, u.rpm, u.tpm, u.limit_micros, u.reset, u.period,
        COALESCE((SELECT SUM(l.amount_micros) FROM ledger l WHERE l.user_id = u.id AND l.user_period = u.period
                  AND l.kind IN ('reserve', 'settle', 'adjust')), 0)::BIGINT - u.reserved_micros AS spent_micros,
        (SELECT COUNT(*) FROM tokens t WHERE t.user_id = u.id AND t.revoked_at IS NULL) AS tokens, u.created_at
     FROM users u JOIN teams tm ON tm.id = u.team_id";

pub async fn members(pool: &PgPool, scope: Option<i64>) -> Result<Vec<MemberRow>> {
    Ok(sqlx::query_as(&format!(
        "{MEMBER_SELECT} WHERE ($1::BIGINT IS NULL OR u.team_id = $1) ORDER BY tm.name, u.username"
    ))
    .bind(scope)
    .fetch_all(pool)
    .await?)
}

pub async fn member(conn: &mut PgConnection, id: i64) -> Result<Option<MemberRow>> {
    Ok(sqlx::query_as(&format!("{MEMBER_SELECT} WHERE u.id = $1"))
        .bind(id)
        .fetch_optional(conn)
        .await?)
}

const LOGIN_SELECT: &str =
    "SELECT a.id, a.username, a.role, a.team_id, tm.name AS team, a.disabled, a.created_at, a.break_glass
     FROM admins a LEFT JOIN teams tm ON tm.id = a.team_id";

pub async fn logins(pool: &PgPool, scope: Option<i64>) -> Result<Vec<LoginRow>> {
    Ok(sqlx::query_as(&format!(
        "{LOGIN_SELECT} WHERE ($1::BIGINT IS NULL OR a.team_id = $1) ORDER BY a.username"
    ))
    .bind(scope)
    .fetch_all(pool)
    .await?)
}

pub async fn login(conn: &mut PgConnection, id: i64) -> Result<Option<LoginRow>> {
    Ok(sqlx::query_as(&format!("{LOGIN_SELECT} WHERE a.id = $1"))
        .bind(id)
        .fetch_optional(conn)
        .await?)
}

/// Whether a username names a member or a login.
pub async fn username_taken(conn: &mut PgConnection, username: &str) -> Result<bool> {
    if !text::storable(username) {
        return Ok(false);
    }
    let n: i64 = sqlx::query_scalar(
        "SELECT (SELECT COUNT(*) FROM users WHERE username = $1) + (SELECT COUNT(*) FROM admins WHERE username = $1)",
    )
    .bind(username)
    .fetch_one(conn)
    .await?;
    Ok(n > 0)
}

pub async fn update_member(conn: &mut PgConnection, id: i64, e: &MemberEdit) -> Result<()> {
    let done = sqlx::query(
        "UPDATE users SET team_id = $1, disabled = $2, rpm = $3, tpm = $4 WHERE id = $5",
    )
    .bind(e.team_id)
    .bind(e.disabled)
    .bind(e.rpm)
    .bind(e.tpm)
    .bind(id)
    .execute(conn)
    .await?
    .rows_affected();
    if done == 0 {
        return Err(StoreError::NotFound(format!("user {id}")));
    }
    Ok(())
}

pub async fn update_login(conn: &mut PgConnection, id: i64, e: &LoginEdit<'_>) -> Result<()> {
    text::check(&[("role", Some(e.role))])?;
    let done =
        sqlx::query("UPDATE admins SET role = $1, team_id = $2, disabled = $3 WHERE id = $4")
            .bind(e.role)
            .bind(e.team_id)
            .bind(e.disabled)
            .bind(id)
            .execute(conn)
            .await?
            .rows_affected();
    if done == 0 {
        return Err(StoreError::NotFound(format!("login {id}")));
    }
    Ok(())
}
