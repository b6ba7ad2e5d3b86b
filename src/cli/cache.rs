//! `sluice cache invalidate`.

use crate::store::Db;

/// Deletes every entry tagged `tag`; running gateways follow within a second.
pub async fn invalidate(db: &Db, tag: &str) -> anyhow::Result<()> {
    let n = crate::store::cache::delete_tag(db, tag).await?.len();
    println!("{n} cache entries tagged {tag} deleted");
    Ok(())
}
