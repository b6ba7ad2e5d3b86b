//! `sluice cache invalidate`.

use chrono::{DateTime, Utc};
use serde_json::json;

use super::{audit_entry, CliError};
use crate::store::{audit, cache, Db};

/// Deletes every entry tagged `tag`, with its audit row in the same transaction (as the
/// admin API's): running gateways follow within a second.
pub async fn invalidate(db: &Db, tag: &str, now: DateTime<Utc>) -> Result<(), CliError> {
    let tag = crate::cache::invalidation_tag(tag).map_err(CliError::Invalid)?;
    let mut tx = db.begin().await?;
    let n = cache::delete_tag_in(&mut tx, tag).await?.len();
    let after = json!({"tag": tag, "deleted": n}).to_string();
    let target = format!("cache-tag:{tag}");
    audit::append(
        &mut tx,
        &audit_entry("cache.invalidate", &target, Some(&after)),
        now,
    )
    .await?;
    tx.commit().await?;
    println!("{n} cache entries tagged {tag} deleted");
    Ok(())
}
