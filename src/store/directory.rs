//! Teams, members and logins as the admin surface lists and edits them. Every list takes
//! an optional team: `Some(t)` restricts it to team t (a lead's view), `None` is all teams.
//! Spend is this period's ledger sum minus what is still reserved, like `tokens::list`.

use serde::Serialize;
use sqlx::FromRow;

use super::{Result, StoreError};

#[derive(Debug, Clone, Serialize, FromRow)]
pub struct TeamRow {
    pub id: i64,
    pub name: String,
    /// Default tags, canonical (`pipeline::tags`).
    pub tags: String,
    pub limit_micros: Option<i64>,
    pub remaining_micros: Option<i64>,
    pub reserved_micros: i64,
    pub spent_micros: i64,
    pub reset: String,
    pub period: String,
    pub members: i64,
    pub created_at: String,
}

const TEAM_SELECT: &str = "SELECT tm.id, tm.name, tm.tags, tm.limit_micros, tm.remaining_micros, tm.reserved_micros, tm.reset, tm.period,
        COALESCE((SELECT SUM(l.amount_micros) FROM ledger l WHERE l.team_id = tm.id AND l.team_period = tm.period
                  AND l.kind IN ('reserve', 'settle', 'adjust')), 0) - tm.reserved_micros AS spent_micros,
        (SELECT COUNT(*) FROM users u WHERE u.team_id = tm.id) AS members, tm.created_at
     FROM teams tm";

pub async fn teams(db: &super::Db, scope: Option<i64>) -> Result<Vec<TeamRow>> {
    let sqlite = match &db.backend {
        super::Backend::Sqlite(s) => s,
        super::Backend::Postgres(pg) => return super::pg::directory::teams(&pg.pool, scope).await,
    };
    let pool = &sqlite.read;
    Ok(sqlx::query_as(&format!(
        "{TEAM_SELECT} WHERE (?1 IS NULL OR tm.id = ?1) ORDER BY tm.name"
    ))
    .bind(scope)
    .fetch_all(pool)
    .await?)
}

pub async fn team(tx: &mut super::Tx, id: i64) -> Result<Option<TeamRow>> {
    if let Some((conn, _)) = tx.pg() {
        return super::pg::directory::team(conn, id).await;
    }
    Ok(sqlx::query_as(&format!("{TEAM_SELECT} WHERE tm.id = ?"))
        .bind(id)
        .fetch_optional(tx.sqlite()?)
        .await?)
}

#[derive(Debug, Clone, Serialize, FromRow)]
pub struct MemberRow {
    pub id: i64,
    pub username: String,
    pub team_id: i64,
    pub team: String,
    pub disabled: bool,
    pub rpm: Option<i64>,
    pub tpm: Option<i64>,
    pub limit_micros: Option<i64>,
    /// The spend of `period` (the last one rolled into); a later period has spent nothing.
    pub spent_micros: i64,
    pub reset: String,
    #[serde(skip_serializing)]
    pub period: String,
    pub tokens: i64,
    pub created_at: String,
}

const MEMBER_SELECT: &str = "SELECT u.id, u.username, u.team_id, tm.name AS team, u.disabled, u.rpm, u.tpm, u.limit_micros, u.reset, u.period,
        COALESCE((SELECT SUM(l.amount_micros) FROM ledger l WHERE l.user_id = u.id AND l.user_period = u.period
                  AND l.kind IN ('reserve', 'settle', 'adjust')), 0) - u.reserved_micros AS spent_micros,
        (SELECT COUNT(*) FROM tokens t WHERE t.user_id = u.id AND t.revoked_at IS NULL) AS tokens, u.created_at
     FROM users u JOIN teams tm ON tm.id = u.team_id";

pub async fn members(db: &super::Db, scope: Option<i64>) -> Result<Vec<MemberRow>> {
    let sqlite = match &db.backend {
        super::Backend::Sqlite(s) => s,
        super::Backend::Postgres(pg) => {
            return super::pg::directory::members(&pg.pool, scope).await
        }
    };
    let pool = &sqlite.read;
    Ok(sqlx::query_as(&format!(
        "{MEMBER_SELECT} WHERE (?1 IS NULL OR u.team_id = ?1) ORDER BY tm.name, u.username"
    ))
    .bind(scope)
    .fetch_all(pool)
    .await?)
}

pub async fn member(tx: &mut super::Tx, id: i64) -> Result<Option<MemberRow>> {
    if let Some((conn, _)) = tx.pg() {
        return super::pg::directory::member(conn, id).await;
    }
    Ok(sqlx::query_as(&format!("{MEMBER_SELECT} WHERE u.id = ?"))
        .bind(id)
        .fetch_optional(tx.sqlite()?)
        .await?)
}

#[derive(Debug, Clone, Serialize, FromRow)]
pub struct LoginRow {
    pub id: i64,
    pub username: String,
    pub role: String,
    pub team_id: Option<i64>,
    pub team: Option<String>,
    pub disabled: bool,
    pub created_at: String,
    /// Kept for when single sign-on fails (`sluice admin create --break-glass`): its
    /// password is the CLI's to set.
    pub break_glass: bool,
}

const LOGIN_SELECT: &str =
    "SELECT a.id, a.username, a.role, a.team_id, tm.name AS team, a.disabled, a.created_at, a.break_glass
     FROM admins a LEFT JOIN teams tm ON tm.id = a.team_id";

pub async fn logins(db: &super::Db, scope: Option<i64>) -> Result<Vec<LoginRow>> {
    let sqlite = match &db.backend {
        super::Backend::Sqlite(s) => s,
        super::Backend::Postgres(pg) => return super::pg::directory::logins(&pg.pool, scope).await,
    };
    let pool = &sqlite.read;
    Ok(sqlx::query_as(&format!(
        "{LOGIN_SELECT} WHERE (?1 IS NULL OR a.team_id = ?1) ORDER BY a.username"
    ))
    .bind(scope)
    .fetch_all(pool)
    .await?)
}

pub async fn login(tx: &mut super::Tx, id: i64) -> Result<Option<LoginRow>> {
    if let Some((conn, _)) = tx.pg() {
        return super::pg::directory::login(conn, id).await;
    }
    Ok(sqlx::query_as(&format!("{LOGIN_SELECT} WHERE a.id = ?"))
        .bind(id)
        .fetch_optional(tx.sqlite()?)
        .await?)
}

/// The team a username belongs to, whether it names a member or a login.
pub async fn username_taken(tx: &mut super::Tx, username: &str) -> Result<bool> {
    if let Some((conn, _)) = tx.pg() {
        return super::pg::directory::username_taken(conn, username).await;
    }
    let n: i64 = sqlx::query_scalar(
        "SELECT (SELECT COUNT(*) FROM users WHERE username = ?1) + (SELECT COUNT(*) FROM admins WHERE username = ?1)",
    )
    .bind(username)
    .fetch_one(tx.sqlite()?)
    .await?;
    Ok(n > 0)
}

pub struct MemberEdit {
    pub team_id: i64,
    pub disabled: bool,
    pub rpm: Option<i64>,
    pub tpm: Option<i64>,
}

/// A member's edit; a move to a team whose tags and the member's tokens' would pass ten
/// together is refused (`store::tags`).
pub async fn update_member(tx: &mut super::Tx, id: i64, e: &MemberEdit) -> Result<()> {
    if let Some((conn, _)) = tx.pg() {
        super::pg::directory::update_member(conn, id, e).await?;
        return super::tags::user_fits(tx, id).await;
    }
    let done =
        sqlx::query("UPDATE users SET team_id = ?, disabled = ?, rpm = ?, tpm = ? WHERE id = ?")
            .bind(e.team_id)
            .bind(e.disabled)
            .bind(e.rpm)
            .bind(e.tpm)
            .bind(id)
            .execute(tx.sqlite()?)
            .await?
            .rows_affected();
    if done == 0 {
        return Err(StoreError::NotFound(format!("user {id}")));
    }
    super::tags::user_fits(tx, id).await
}

pub struct LoginEdit<'a> {
    pub role: &'a str,
    pub team_id: Option<i64>,
    pub disabled: bool,
}

pub async fn update_login(tx: &mut super::Tx, id: i64, e: &LoginEdit<'_>) -> Result<()> {
    if let Some((conn, _)) = tx.pg() {
        return super::pg::directory::update_login(conn, id, e).await;
    }
    let done = sqlx::query("UPDATE admins SET role = ?, team_id = ?, disabled = ? WHERE id = ?")
        .bind(e.role)
        .bind(e.team_id)
        .bind(e.disabled)
        .bind(id)
        .execute(tx.sqlite()?)
        .await?
        .rows_affected();
    if done == 0 {
        return Err(StoreError::NotFound(format!("login {id}")));
    }
    Ok(())
}
