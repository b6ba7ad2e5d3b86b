//! `sluice reconcile`: a provider's cost export against Sluice's spend, its exit code.

use std::path::{Path, PathBuf};

use chrono::{DateTime, Utc};

use crate::config::Settings;
use crate::finance::run::Export;
use crate::finance::FinanceError;
use crate::store::Db;

/// `sluice reconcile`: the report printed, `reconcile_mismatch` sent when a row is flagged;
/// the exit code (0 all match, 2 unreadable export, 3 flagged).
pub async fn run(
    settings: &Settings,
    export: Export,
    files: &[PathBuf],
    json: bool,
    now: DateTime<Utc>,
) -> anyhow::Result<i32> {
    let db = Db::connect(settings).await?;
    let done = crate::finance::run::reconcile_file(&db, settings, export, files, "cli", now).await;
    let dir = Path::new(&settings.backup.dir);
    let r = match done {
        Ok(r) => r,
        Err(FinanceError::Unreadable(why)) => {
            db.close().await;
            eprintln!("error: {why}");
            return Ok(2);
        }
        Err(e) => {
            db.close().await;
            return Err(e.into());
        }
    };
    super::export_audit_head(&db, dir, now).await;
    db.close().await;
    print!("{}", super::reconcile_report(&r, json));
    if r.run.flagged == 0 {
        return Ok(0);
    }
    let message = format!(
        "{} of {} rows of the {} export {} differ from Sluice's spend past the threshold (reconciliation {})",
        r.run.flagged,
        r.rows.len(),
        r.run.provider,
        r.run.source,
        r.run.id
    );
    let subject = format!("reconciliation:{}", r.run.id);
    crate::ops::alerts::send_now(&settings.alerts, "reconcile_mismatch", &subject, &message).await;
    Ok(3)
}
