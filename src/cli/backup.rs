//! `sluice backup` and `sluice restore`.

use std::path::{Path, PathBuf};

use chrono::{DateTime, Utc};

use crate::config::Settings;
use crate::ops::backup;
use crate::store::Db;

/// `backup`: a hot backup into `to` (default: `[backup] dir`).
pub async fn backup_now(
    db: &Db,
    settings: &Settings,
    to: Option<PathBuf>,
    now: DateTime<Utc>,
) -> anyhow::Result<()> {
    let dir = to.unwrap_or_else(|| PathBuf::from(&settings.backup.dir));
    let path = backup::backup_now_locked(db, &dir, settings.backup.keep, now).await?;
    println!("backup written to {}", path.display());
    Ok(())
}

/// `restore`: `file` into the config's database path, checked, then a new audit head
/// started over the restored log.
pub async fn restore(settings: &Settings, file: &Path, now: DateTime<Utc>) -> anyhow::Result<()> {
    let target = backup::restore_target(settings)?;
    let r = backup::restore(file, &target, now).await?;
    println!(
        "restored {} into {}: integrity {}, ledger invariant holds for {} tokens",
        file.display(),
        target.display(),
        r.integrity,
        r.tokens_checked
    );
    let dir = PathBuf::from(&settings.backup.dir);
    let db = Db::connect(settings).await?;
    let why = format!("restore of {}", file.display());
    let rearmed = super::audit_rearm(
        &db,
        &dir,
        &settings.backup.head_name,
        &why,
        "before-restore",
        now,
    )
    .await;
    db.close().await;
    println!("{}", rearmed?);
    Ok(())
}
