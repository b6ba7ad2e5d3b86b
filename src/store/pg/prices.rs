//! Prices admins set, on PostgreSQL (see `store::prices`).

use sqlx::{PgConnection, PgPool};

use super::text;
use crate::store::prices::{conflict_unless, PriceRow, ALL};
use crate::store::Result;

pub async fn all(pool: &PgPool) -> Result<Vec<PriceRow>> {
    Ok(sqlx::query_as(ALL).fetch_all(pool).await?)
}

pub async fn all_in(conn: &mut PgConnection) -> Result<Vec<PriceRow>> {
    Ok(sqlx::query_as(ALL).fetch_all(conn).await?)
}

pub async fn append(conn: &mut PgConnection, row: &PriceRow) -> Result<()> {
    text::check(&[
        ("model", Some(&row.model)),
        ("created_by", Some(&row.created_by)),
    ])?;
    let done = sqlx::query(
        "INSERT INTO model_prices (model, effective_from, prices, created_by, created_at)
         VALUES ($1, $2, $3, $4, $5) ON CONFLICT (model, effective_from) DO NOTHING",
    )
    .bind(&row.model)
    .bind(&row.effective_from)
    .bind(&row.prices)
    .bind(&row.created_by)
    .bind(&row.created_at)
    .execute(conn)
    .await?
    .rows_affected();
    conflict_unless(done == 1, row)
}
