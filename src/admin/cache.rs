//! Cache invalidation by tag (`x-sluice-cache-tags`), for admins: the entries go on every
//! replica (the cache epoch moves), with an audit row.

use serde::Deserialize;
use serde_json::json;

use super::actor::Actor;
use super::error::AdminError;
use crate::cache::{invalidation_tag, Cache};
use crate::state::AppState;

#[derive(Deserialize)]
pub struct Invalidate {
    pub tag: String,
}

/// Deletes every entry tagged `tag`; returns how many.
pub async fn invalidate(state: &AppState, actor: &Actor, tag: &str) -> Result<usize, AdminError> {
    actor.require_write()?;
    actor.require_admin()?;
    let tag = invalidation_tag(tag).map_err(AdminError::invalid)?;
    let now = state.clock.now();
    // The entries go in the audit row's transaction: deleted first on their own, they
    // stayed deleted, unaudited, when the row could not be written.
    let mut tx = state.db.begin().await?;
    let gone = Cache::delete_tag(&mut tx, tag).await?;
    let deleted = gone.len();
    let after = json!({"tag": tag, "deleted": deleted}).to_string();
    actor
        .audit(
            &mut tx,
            "cache.invalidate",
            &format!("cache-tag:{tag}"),
            None,
            Some(&after),
            now,
        )
        .await?;
    tx.commit().await?;
    state.cache.forget_deleted(gone);
    Ok(deleted)
}
