//! People who log in to the admin surface (PostgreSQL; see `store::admins`).

use chrono::{DateTime, Utc};
use sqlx::PgConnection;

use super::text;
use crate::clock::db_time;
use crate::store::{Result, StoreError};

pub async fn create(
    conn: &mut PgConnection,
    username: &str,
    password_hash: &str,
    role: &str,
    team_id: Option<i64>,
    now: DateTime<Utc>,
) -> Result<i64> {
    text::check(&[
        ("username", Some(username)),
        ("password hash", Some(password_hash)),
        ("role", Some(role)),
    ])?;
    let exists: Option<i64> = sqlx::query_scalar("SELECT id FROM admins WHERE username = $1")
        .bind(username)
        .fetch_optional(&mut *conn)
        .await?;
    if exists.is_some() {
        return Err(StoreError::Conflict(format!(
            "admin `{username}` already exists"
        )));
    }
    Ok(sqlx::query_scalar(
        "INSERT INTO admins (username, password_hash, role, team_id, created_at) VALUES ($1, $2, $3, $4, $5) RETURNING id",
    )
    .bind(username)
    .bind(password_hash)
    .bind(role)
    .bind(team_id)
    .bind(db_time(now))
    .fetch_one(conn)
    .await?)
}
