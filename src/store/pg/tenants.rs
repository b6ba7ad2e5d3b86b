//! Teams and users (PostgreSQL; see `store::tenants`).

use chrono::{DateTime, Utc};
use sqlx::PgConnection;

use super::text;
use crate::clock::db_time;
use crate::store::tenants::{NewBudget, NewUser};
use crate::store::{Result, StoreError};

pub async fn team_id(conn: &mut PgConnection, name: &str) -> Result<Option<i64>> {
    if !text::storable(name) {
        return Ok(None);
    }
    Ok(sqlx::query_scalar("SELECT id FROM teams WHERE name = $1")
        .bind(name)
        .fetch_optional(conn)
        .await?)
}

pub async fn create_team(
    conn: &mut PgConnection,
    name: &str,
    budget: &NewBudget,
    now: DateTime<Utc>,
) -> Result<i64> {
    text::check(&[("team name", Some(name))])?;
    if team_id(conn, name).await?.is_some() {
        return Err(StoreError::Conflict(format!(
            "team `{name}` already exists"
        )));
    }
    Ok(sqlx::query_scalar(
        "INSERT INTO teams (name, limit_micros, remaining_micros, reset, period, created_at)
         VALUES ($1, $2, $3, $4, $5, $6) RETURNING id",
    )
    .bind(name)
    .bind(budget.limit_micros)
    .bind(budget.limit_micros)
    .bind(budget.reset.as_str())
    .bind(budget.reset.period_key(now))
    .bind(db_time(now))
    .fetch_one(conn)
    .await?)
}

/// (user id, team id) of a username.
pub async fn user_ids(conn: &mut PgConnection, username: &str) -> Result<Option<(i64, i64)>> {
    if !text::storable(username) {
        return Ok(None);
    }
    Ok(
        sqlx::query_as("SELECT id, team_id FROM users WHERE username = $1")
            .bind(username)
            .fetch_optional(conn)
            .await?,
    )
}

pub async fn create_user(
    conn: &mut PgConnection,
    u: &NewUser<'_>,
    now: DateTime<Utc>,
) -> Result<i64> {
    text::check(&[("username", Some(u.username))])?;
    if user_ids(conn, u.username).await?.is_some() {
        return Err(StoreError::Conflict(format!(
            "user `{}` already exists",
            u.username
        )));
    }
    Ok(sqlx::query_scalar(
        "INSERT INTO users (username, team_id, rpm, tpm, limit_micros, remaining_micros, reset, period, created_at)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9) RETURNING id",
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
    .fetch_one(conn)
    .await?)
}
