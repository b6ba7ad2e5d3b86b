//! Managed upstreams, models and the seal check on PostgreSQL (see `store::managed`).

use sqlx::{PgConnection, PgPool};

use super::text;
use crate::store::managed::{ModelRow, UpstreamRow};
use crate::store::{Result, StoreError};

const UPSTREAMS: &str = "SELECT id, settings, key_sealed, key_last4, enabled FROM managed_upstreams ORDER BY created_at, id";

pub async fn seal_check(pool: &PgPool) -> Result<Option<Vec<u8>>> {
    Ok(
        sqlx::query_scalar("SELECT sealed FROM seal_check WHERE id = 1")
            .fetch_optional(pool)
            .await?,
    )
}

pub async fn seal_check_in(conn: &mut PgConnection) -> Result<Option<Vec<u8>>> {
    Ok(
        sqlx::query_scalar("SELECT sealed FROM seal_check WHERE id = 1")
            .fetch_optional(conn)
            .await?,
    )
}

pub async fn put_seal_check(conn: &mut PgConnection, sealed: &[u8]) -> Result<()> {
    sqlx::query("INSERT INTO seal_check (id, sealed) VALUES (1, $1) ON CONFLICT (id) DO NOTHING")
        .bind(sealed)
        .execute(conn)
        .await?;
    Ok(())
}

pub async fn replace_seal_check(conn: &mut PgConnection, sealed: &[u8]) -> Result<()> {
    sqlx::query(
        "INSERT INTO seal_check (id, sealed) VALUES (1, $1) ON CONFLICT (id) DO UPDATE SET sealed = EXCLUDED.sealed",
    )
    .bind(sealed)
    .execute(conn)
    .await?;
    Ok(())
}

pub async fn upstreams(pool: &PgPool) -> Result<Vec<UpstreamRow>> {
    Ok(sqlx::query_as(UPSTREAMS).fetch_all(pool).await?)
}

pub async fn upstreams_in(conn: &mut PgConnection) -> Result<Vec<UpstreamRow>> {
    Ok(sqlx::query_as(UPSTREAMS).fetch_all(conn).await?)
}

const MODELS: &str = "SELECT name, settings FROM managed_models ORDER BY name";

pub async fn models(pool: &PgPool) -> Result<Vec<ModelRow>> {
    Ok(sqlx::query_as(MODELS).fetch_all(pool).await?)
}

pub async fn models_in(conn: &mut PgConnection) -> Result<Vec<ModelRow>> {
    Ok(sqlx::query_as(MODELS).fetch_all(conn).await?)
}

pub async fn insert_upstream(conn: &mut PgConnection, row: &UpstreamRow, now: &str) -> Result<()> {
    text::check(&[("id", Some(&row.id)), ("settings", Some(&row.settings))])?;
    let done = sqlx::query(
        "INSERT INTO managed_upstreams (id, settings, key_sealed, key_last4, enabled, created_at, updated_at)
         VALUES ($1, $2, $3, $4, $5, $6, $6) ON CONFLICT (id) DO NOTHING",
    )
    .bind(&row.id)
    .bind(&row.settings)
    .bind(&row.key_sealed)
    .bind(&row.key_last4)
    .bind(row.enabled)
    .bind(now)
    .execute(conn)
    .await?
    .rows_affected();
    if done == 0 {
        return Err(StoreError::Conflict(format!(
            "an upstream `{}` exists already",
            row.id
        )));
    }
    Ok(())
}

pub async fn update_upstream(
    conn: &mut PgConnection,
    row: &UpstreamRow,
    now: &str,
) -> Result<bool> {
    if !text::storable(&row.id) {
        return Ok(false);
    }
    Ok(sqlx::query(
        "UPDATE managed_upstreams SET key_sealed = $1, key_last4 = $2, enabled = $3, updated_at = $4 WHERE id = $5",
    )
    .bind(&row.key_sealed)
    .bind(&row.key_last4)
    .bind(row.enabled)
    .bind(now)
    .bind(&row.id)
    .execute(conn)
    .await?
    .rows_affected()
        == 1)
}

pub async fn delete_upstream(conn: &mut PgConnection, id: &str) -> Result<bool> {
    if !text::storable(id) {
        return Ok(false);
    }
    Ok(sqlx::query("DELETE FROM managed_upstreams WHERE id = $1")
        .bind(id)
        .execute(conn)
        .await?
        .rows_affected()
        == 1)
}

pub async fn put_model(conn: &mut PgConnection, row: &ModelRow, now: &str) -> Result<()> {
    text::check(&[("name", Some(&row.name)), ("settings", Some(&row.settings))])?;
    sqlx::query(
        "INSERT INTO managed_models (name, settings, updated_at) VALUES ($1, $2, $3)
         ON CONFLICT (name) DO UPDATE SET settings = EXCLUDED.settings, updated_at = EXCLUDED.updated_at",
    )
    .bind(&row.name)
    .bind(&row.settings)
    .bind(now)
    .execute(conn)
    .await?;
    Ok(())
}

pub async fn delete_model(conn: &mut PgConnection, name: &str) -> Result<bool> {
    if !text::storable(name) {
        return Ok(false);
    }
    Ok(sqlx::query("DELETE FROM managed_models WHERE name = $1")
        .bind(name)
        .execute(conn)
        .await?
        .rows_affected()
        == 1)
}

pub async fn epoch(pool: &PgPool) -> Result<i64> {
    Ok(
        sqlx::query_scalar("SELECT value FROM meta WHERE key = 'catalog_epoch'")
            .fetch_one(pool)
            .await?,
    )
}
