//! `sluice audit verify` and `sluice audit rearm`: each closes the database before it
//! prints its verdict (no audit head is exported after them).

use std::path::PathBuf;

use chrono::{DateTime, Utc};

use crate::config::Settings;
use crate::store::Db;

/// `audit verify`: the verdict, or an error naming the first bad row or the head mismatch.
pub async fn verify(db: Db, settings: &Settings) -> anyhow::Result<()> {
    let dir = PathBuf::from(&settings.backup.dir);
    let verdict = super::audit_verify(&db, &dir, &settings.backup.head_name).await;
    db.close().await;
    println!("{}", verdict?);
    Ok(())
}

/// `audit rearm`: a new signed head over the log as it is, for `reason`.
pub async fn rearm(
    db: Db,
    settings: &Settings,
    reason: &str,
    now: DateTime<Utc>,
) -> anyhow::Result<()> {
    let dir = PathBuf::from(&settings.backup.dir);
    let rearmed = super::audit_rearm(
        &db,
        &dir,
        &settings.backup.head_name,
        reason,
        "before-rearm",
        now,
    )
    .await;
    db.close().await;
    println!("{}", rearmed?);
    Ok(())
}
