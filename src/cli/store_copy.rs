//! `sluice migrate-store`: a SQLite install copied into an empty PostgreSQL database.

use chrono::{DateTime, Utc};

pub async fn migrate_store(from: &str, to: &str, now: DateTime<Utc>) -> anyhow::Result<()> {
    let done = crate::ops::migrate_store::migrate_store(from, to, now).await?;
    println!("copied {from} into the PostgreSQL database:\n{done}");
    Ok(())
}
