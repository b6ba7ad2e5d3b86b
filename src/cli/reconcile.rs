//! `sluice reconcile`: a provider's cost export against Sluice's spend, its exit code.

use std::path::{Path, PathBuf};

use chrono::{DateTime, Utc};

use crate::config::Settings;
use crate::finance::run::Export;
use crate::finance::usage_reconcile::{self, TokenRun};
use crate::finance::FinanceError;
use crate::store::Db;

/// `sluice reconcile`: the report printed, `reconcile_mismatch` sent when a row is flagged;
/// the exit code (0 all match, 2 unreadable export, 3 flagged). A usage export
/// (`openai-usage`) is compared by tokens (`tokens`).
pub async fn run(
    settings: &Settings,
    export: Export,
    files: &[PathBuf],
    json: bool,
    now: DateTime<Utc>,
) -> anyhow::Result<i32> {
    let db = Db::connect(settings).await?;
    if export == Export::OpenaiUsage {
        let done = usage_reconcile::reconcile_usage(&db, settings, files).await;
        db.close().await;
        return tokens(settings, done, json).await;
    }
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
    super::export_audit_head(&db, dir, &settings.backup.head_name, now).await;
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

/// `sluice reconcile --provider openai-usage`: the token comparison printed (a table, or
/// with `json` its rows), `reconcile_mismatch` sent when a cell differs; the exit code as
/// the cost reconciliation's.
async fn tokens(
    settings: &Settings,
    done: Result<TokenRun, FinanceError>,
    json: bool,
) -> anyhow::Result<i32> {
    let r = match done {
        Ok(r) => r,
        Err(FinanceError::Unreadable(why)) => {
            eprintln!("error: {why}");
            return Ok(2);
        }
        Err(e) => return Err(e.into()),
    };
    print!("{}", token_report(&r, json));
    let flagged = r.flagged();
    if flagged == 0 {
        return Ok(0);
    }
    let message = format!(
        "{flagged} of {} (day, model, account) cells of the OpenAI usage export {} differ from Sluice's token counts",
        r.rows.len(),
        r.source
    );
    let subject = format!("usage:{}..{}", r.first_day, r.last_day);
    crate::ops::alerts::send_now(&settings.alerts, "reconcile_mismatch", &subject, &message).await;
    Ok(3)
}

/// The token comparison as a table (a flagged row marked `!`), or as JSON.
fn token_report(r: &TokenRun, json: bool) -> String {
    if json {
        return serde_json::json!({
            "source": r.source, "first_day": r.first_day.to_string(),
            "last_day": r.last_day.to_string(), "flagged": r.flagged(), "rows": r.rows,
        })
        .to_string();
    }
    let mut out = format!(
        "token reconciliation (openai-usage export {}, {} to {}): {} of {} rows flagged\n",
        r.source,
        r.first_day,
        r.last_day,
        r.flagged(),
        r.rows.len()
    );
    out.push_str(&format!(
        "  {:<10}  {:<28} {:<20} {:>25} {:>25} {:>25}\n",
        "day",
        "model",
        "account",
        "input sluice/provider",
        "output sluice/provider",
        "cached sluice/provider"
    ));
    for row in &r.rows {
        let pair = |a: i64, b: i64| format!("{a}/{b}");
        out.push_str(&format!(
            "{} {:<10}  {:<28} {:<20} {:>25} {:>25} {:>25}\n",
            if row.flagged { "!" } else { " " },
            row.day,
            row.model,
            row.account,
            pair(row.sluice.input_tokens, row.provider.input_tokens),
            pair(row.sluice.output_tokens, row.provider.output_tokens),
            pair(
                row.sluice.cached_input_tokens,
                row.provider.cached_input_tokens
            ),
        ));
    }
    out
}
