//! People who log in to the admin surface.

use chrono::{DateTime, Utc};

use super::{Result, StoreError};
use crate::clock::db_time;

pub async fn create(
    tx: &mut super::Tx,
    username: &str,
    password_hash: &str,
    role: &str,
    team_id: Option<i64>,
    now: DateTime<Utc>,
) -> Result<i64> {
    if let Some((conn, _)) = tx.pg() {
        return super::pg::admins::create(conn, username, password_hash, role, team_id, now).await;
    }
    let exists: Option<i64> = sqlx::query_scalar("SELECT id FROM admins WHERE username = ?")
        .bind(username)
        .fetch_optional(tx.sqlite()?)
        .await?;
    if exists.is_some() {
        return Err(StoreError::Conflict(format!(
            "admin `{username}` already exists"
        )));
    }
    Ok(sqlx::query_scalar(
        "INSERT INTO admins (username, password_hash, role, team_id, created_at) VALUES (?, ?, ?, ?, ?) RETURNING id",
    )
    .bind(username)
    .bind(password_hash)
    .bind(role)
    .bind(team_id)
    .bind(db_time(now))
    .fetch_one(tx.sqlite()?)
    .await?)
}
