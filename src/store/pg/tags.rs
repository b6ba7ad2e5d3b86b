//! Default tags of tokens and teams (PostgreSQL; see `store::tags`).

use sqlx::PgConnection;

use crate::store::tags::Owner;
use crate::store::Result;

/// Sets the row's tags; returns the rows changed (0: no such row).
pub async fn set(conn: &mut PgConnection, owner: Owner, tags: &str) -> Result<u64> {
    let (sql, id) = match owner {
        Owner::Token(id) => ("UPDATE tokens SET tags = $1 WHERE id = $2", id),
        Owner::Team(id) => ("UPDATE teams SET tags = $1 WHERE id = $2", id),
    };
    Ok(sqlx::query(sql)
        .bind(tags)
        .bind(id)
        .execute(conn)
        .await?
        .rows_affected())
}
