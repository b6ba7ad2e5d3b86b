//! `sluice secrets rotate`: every sealed key and audit signature under a new master key.

use std::path::Path;

use chrono::{DateTime, Utc};

use crate::config::Settings;
use crate::secrets::{self, MasterKey};

pub async fn rotate(
    settings: &Settings,
    new_key_file: Option<&Path>,
    now: DateTime<Utc>,
) -> anyhow::Result<()> {
    let new = MasterKey::new_for_rotation(new_key_file)?;
    let done = crate::ops::rotate::rotate(settings, &new, now).await?;
    println!(
        "rotated to the new master key: {} upstream keys sealed again, {} audit rows signed again, the audit head signed again",
        done.upstream_keys, done.audit_rows
    );
    println!("now put the new key where the gateway reads it ({} or the key file), then start the gateways; keep the old key with the backups made before (they open only under it)", secrets::ENV);
    Ok(())
}
