//! Default tags of tokens and teams (canonical text, validated by the caller with
//! `tags::Tags`). Every change bumps the token epoch, so each replica's auth cache —
//! which holds both a token's and its team's defaults — drops the stale row within a second.
//! A change after which a live token's tags and its team's would pass `MAX_TAGS` together is
//! refused here, in its transaction, whoever makes it (admin API, UI, CLI): otherwise every
//! request of that token would be refused with a 400 about a header its client never sent.

use super::tokens::bump_epoch;
use super::{Result, StoreError};
use crate::tags::{Tags, MAX_TAGS};

/// (token tags, team tags) of one token, or of every live token of one team.
const OF_TOKEN: [&str; 2] = [
    "SELECT t.tags, tm.tags FROM tokens t JOIN users u ON u.id = t.user_id JOIN teams tm ON tm.id = u.team_id
     WHERE t.id = ?",
    "SELECT t.tags, tm.tags FROM tokens t JOIN users u ON u.id = t.user_id JOIN teams tm ON tm.id = u.team_id
     WHERE t.id = $1",
];
const OF_USER: [&str; 2] = [
    "SELECT t.tags, tm.tags FROM tokens t JOIN users u ON u.id = t.user_id JOIN teams tm ON tm.id = u.team_id
     WHERE u.id = ? AND t.revoked_at IS NULL",
    "SELECT t.tags, tm.tags FROM tokens t JOIN users u ON u.id = t.user_id JOIN teams tm ON tm.id = u.team_id
     WHERE u.id = $1 AND t.revoked_at IS NULL",
];
const OF_TEAM: [&str; 2] = [
    "SELECT t.tags, tm.tags FROM tokens t JOIN users u ON u.id = t.user_id JOIN teams tm ON tm.id = u.team_id
     WHERE u.team_id = ? AND t.revoked_at IS NULL",
    "SELECT t.tags, tm.tags FROM tokens t JOIN users u ON u.id = t.user_id JOIN teams tm ON tm.id = u.team_id
     WHERE u.team_id = $1 AND t.revoked_at IS NULL",
];

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
    let reach = match owner {
        Owner::Token(id) => (OF_TOKEN, id),
        Owner::Team(id) => (OF_TEAM, id),
    };
    fits(tx, reach).await?;
    bump_epoch(tx).await
}

/// After a user moved to another team: their live tokens' tags still fit with the new
/// team's (`directory::update_member`, in its transaction).
pub async fn user_fits(tx: &mut super::Tx, user_id: i64) -> Result<()> {
    fits(tx, (OF_USER, user_id)).await
}

/// Whether every token the query reaches still fits `MAX_TAGS` with its team's tags.
async fn fits(tx: &mut super::Tx, (sql, id): ([&str; 2], i64)) -> Result<()> {
    let pairs: Vec<(String, String)> = if let Some((conn, _)) = tx.pg() {
        sqlx::query_as(sql[1]).bind(id).fetch_all(conn).await?
    } else {
        sqlx::query_as(sql[0])
            .bind(id)
            .fetch_all(tx.sqlite()?)
            .await?
    };
    for (token, team) in pairs {
        if Tags::stored(&token).over(&Tags::stored(&team)).is_err() {
            return Err(StoreError::Invalid(format!(
                "tags: a token's default tags and its team's together would be more than {MAX_TAGS} keys (each request carries both)"
            )));
        }
    }
    Ok(())
}
