//! Default tags of tokens and teams (canonical text, validated by the caller with
//! `pipeline::tags`). Every change bumps the token epoch, so each replica's auth cache —
//! which holds both a token's and its team's defaults — drops the stale row within a second.

use super::tokens::bump_epoch;
use super::{Result, StoreError};

/// Which row's default tags to set.
#[derive(Debug, Clone, Copy)]
pub enum Owner {
    Token(i64),
    Team(i64),
}

pub async fn set(tx: &mut super::Tx, owner: Owner, tags: &str) -> Result<()> {
    let (sql, id, what) = match owner {
        Owner::Token(id) => ("UPDATE tokens SET tags = ? WHERE id = ?", id, "token"),
        Owner::Team(id) => ("UPDATE teams SET tags = ? WHERE id = ?", id, "team"),
    };
    let done = if let Some((conn, _)) = tx.pg() {
        super::pg::tags::set(conn, owner, tags).await?
    } else {
        sqlx::query(sql)
            .bind(tags)
            .bind(id)
            .execute(tx.sqlite()?)
            .await?
            .rows_affected()
    };
    if done == 0 {
        return Err(StoreError::NotFound(format!("{what} {id}")));
    }
    bump_epoch(tx).await
}
