//! Teams and users (members who hold sub-tokens).

use chrono::{DateTime, Utc};

use super::{Result, StoreError};
use crate::clock::db_time;
use crate::quota::period::Reset;

/// The team that users land in when none is named.
pub const DEFAULT_TEAM: &str = "default";

pub struct NewBudget {
    pub limit_micros: Option<i64>,
    pub reset: Reset,
}

pub async fn team_id(tx: &mut super::Tx, name: &str) -> Result<Option<i64>> {
    if let Some((conn, _)) = tx.pg() {
        return super::pg::tenants::team_id(conn, name).await;
    }
    Ok(sqlx::query_scalar("SELECT id FROM teams WHERE name = ?")
        .bind(name)
        .fetch_optional(tx.sqlite()?)
        .await?)
}

pub async fn create_team(
    tx: &mut super::Tx,
    name: &str,
    budget: &NewBudget,
    now: DateTime<Utc>,
) -> Result<i64> {
    if let Some((conn, _)) = tx.pg() {
        return super::pg::tenants::create_team(conn, name, budget, now).await;
    }
    if team_id(tx, name).await?.is_some() {
        return Err(StoreError::Conflict(format!(
            "team `{name}` already exists"
        )));
    }
    let id = sqlx::query_scalar(
        "INSERT INTO teams (name, limit_micros, remaining_micros, reset, period, created_at)
         VALUES (?, ?, ?, ?, ?, ?) RETURNING id",
    )
    .bind(name)
    .bind(budget.limit_micros)
    .bind(budget.limit_micros)
    .bind(budget.reset.as_str())
    .bind(budget.reset.period_key(now))
    .bind(db_time(now))
    .fetch_one(tx.sqlite()?)
    .await?;
    Ok(id)
}

pub struct NewUser<'a> {
    pub username: &'a str,
    pub team_id: i64,
    pub rpm: Option<i64>,
    pub tpm: Option<i64>,
    pub budget: NewBudget,
}

/// (user id, team id) of a username.
pub async fn user_ids(tx: &mut super::Tx, username: &str) -> Result<Option<(i64, i64)>> {
    if let Some((conn, _)) = tx.pg() {
        return super::pg::tenants::user_ids(conn, username).await;
    }
    Ok(
        sqlx::query_as("SELECT id, team_id FROM users WHERE username = ?")
            .bind(username)
            .fetch_optional(tx.sqlite()?)
            .await?,
    )
}

pub async fn create_user(tx: &mut super::Tx, u: &NewUser<'_>, now: DateTime<Utc>) -> Result<i64> {
    if let Some((conn, _)) = tx.pg() {
        return super::pg::tenants::create_user(conn, u, now).await;
    }
    if user_ids(tx, u.username).await?.is_some() {
        return Err(StoreError::Conflict(format!(
            "user `{}` already exists",
            u.username
        )));
    }
    let id = sqlx::query_scalar(
        "INSERT INTO users (username, team_id, rpm, tpm, limit_micros, remaining_micros, reset, period, created_at)
         VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) RETURNING id",
    )
    .bind(u.username)
    .bind(u.team_id)
    .bind(u.rpm)
    .bind(u.tpm)
    .bind(u.budget.limit_micros)
    .bind(u.budget.limit_micros)
    .bind(u.budget.reset.as_str())
    .bind(u.budget.reset.period_key(now))
    .bind(db_time(now))
    .fetch_one(tx.sqlite()?)
    .await?;
    Ok(id)
}
