//! `sluice secrets rotate`: moves the database to a new master key. In order:
//!
//! 1. the new key is not the current one, and `sluice audit verify` passes under the
//!    current key (the chain and the signed head: a head that says rows were deleted is
//!    not signed again over the shortened log);
//! 2. one transaction (`store::rotate`): no gateway running, every sealed upstream key and
//!    the check value re-sealed, the chain verified again and signed under the new key,
//!    with its `secrets.rotate` row;
//! 3. after the commit, the database opened again under the new key — with a gateway's
//!    checks at start, so a rotation that left anything unopenable fails here, loudly —
//!    and the head in the backup folder signed again under it, then verified.
//!
//! Nothing is written outside the database before the commit, and the key files are never
//! written: the operator puts the new key where the gateway reads it after the command
//! says it is done (README "Managing keys"). A crash before the commit leaves the old state
//! whole (the old key still opens everything); a crash after it leaves a database that
//! only the new key opens, which the operator holds — and the head is re-signed by running
//! `sluice audit rearm` with the new key.

use std::path::Path;

use chrono::{DateTime, Utc};

use super::audit_head::{self, Found, HeadError};
use crate::config::Settings;
use crate::secrets::{MasterKey, SecretError};
use crate::store::rotate::{self, Refused, Rotated};
use crate::store::{Db, StoreError};

#[derive(Debug, thiserror::Error)]
pub enum RotateError {
    #[error(transparent)]
    Secret(#[from] SecretError),
    #[error(transparent)]
    Refused(#[from] Refused),
    #[error("the audit log does not verify under the current master key, so it is not carried over to a new one (nothing was changed):\n{}\nLook into it first (`sluice audit verify`, `sluice audit rearm`)", .0.join("\n"))]
    Unverified(Vec<String>),
    #[error(transparent)]
    Head(#[from] HeadError),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("the database was rotated to the new key, but after it: {0}")]
    After(String),
}

/// Who rotated, for the audit row: the CLI and the OS user running it.
pub fn actor() -> String {
    let user = std::env::var("USER")
        .ok()
        .filter(|u| !u.is_empty())
        .unwrap_or_else(|| format!("uid {}", rustix::process::geteuid().as_raw()));
    format!("cli ({user})")
}

/// The current master key, from where the gateway reads it (`SLUICE_SECRET_KEY`, else the
/// key file beside the SQLite database or `[database] key_file`).
fn current_key(settings: &Settings) -> Result<MasterKey, SecretError> {
    match settings.database_postgres_url() {
        Some(_) => MasterKey::for_shared_database(settings.database.key_file.as_deref()),
        None => MasterKey::for_database(&settings.database_path()),
    }
}

/// Rotates the database `settings` name from the current master key to `new`, then signs
/// the head in `[backup] dir` again.
pub async fn rotate(
    settings: &Settings,
    new: &MasterKey,
    now: DateTime<Utc>,
) -> Result<Rotated, RotateError> {
    let current = current_key(settings)?;
    let dir = Path::new(&settings.backup.dir);
    let db = Db::connect(settings).await?;
    let name = &settings.backup.head_name;
    let done = rotate_db(&db, dir, name, &current, new, now).await;
    db.close().await;
    let done = done?;
    let db = Db::connect_with_key(settings, new)
        .await
        .map_err(|e| RotateError::After(e.to_string()))?;
    let after = after(&db, dir, name, now).await;
    db.close().await;
    after?;
    Ok(done)
}

async fn rotate_db(
    db: &Db,
    dir: &Path,
    name: &str,
    current: &MasterKey,
    new: &MasterKey,
    now: DateTime<Utc>,
) -> Result<Rotated, RotateError> {
    if current.same_as(new) {
        return Err(SecretError::SameKey.into());
    }
    let report = audit_head::verify(db, dir, name).await?;
    // A log no head was ever started over (a database no gateway served) has none yet.
    let unstarted = report.head == Found::Missing && report.started.is_none();
    let problems: Vec<String> = report
        .problems()
        .into_iter()
        .filter(|p| !(unstarted && p.starts_with("audit head missing")))
        .collect();
    if !problems.is_empty() {
        return Err(RotateError::Unverified(problems));
    }
    Ok(rotate::rotate(db, new, &actor(), now).await?)
}

/// The head signed again under the new key, and the whole log verified under it.
async fn after(db: &Db, dir: &Path, name: &str, now: DateTime<Utc>) -> Result<(), RotateError> {
    audit_head::resign(db, dir, name, now)
        .await
        .map_err(|e| RotateError::After(format!("{e}; with the new key, `sluice audit rearm --reason \"secrets rotate\"` signs the head again")))?;
    let problems = audit_head::verify(db, dir, name).await?.problems();
    if !problems.is_empty() {
        return Err(RotateError::After(problems.join("\n")));
    }
    Ok(())
}
