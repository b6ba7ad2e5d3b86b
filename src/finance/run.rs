//! One `sluice reconcile` run: the export read, compared with the request log, and stored
//! with its audit row in one transaction.

use std::path::{Path, PathBuf};

use chrono::{DateTime, Duration, NaiveDate, NaiveTime, Utc};
use serde_json::json;

use super::exports::{self, Line};
use super::reconcile::{self, Accounts, Thresholds};
use super::FinanceError;
use crate::config::{Provider, Settings};
use crate::store::audit::{self, AuditEntry};
use crate::store::finance::{self, Reconciliation, ReconciliationRow};
use crate::store::{managed, Db};

/// Whose export it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Export {
    Openai,
    Anthropic,
    /// OpenAI's completions usage export: tokens, compared by `usage_reconcile`.
    OpenaiUsage,
}

impl Export {
    pub fn as_str(self) -> &'static str {
        match self {
            Export::Openai => "openai",
            Export::Anthropic => "anthropic",
            Export::OpenaiUsage => "openai-usage",
        }
    }

    fn provider(self) -> Provider {
        match self {
            Export::Openai | Export::OpenaiUsage => Provider::Openai,
            Export::Anthropic => Provider::Anthropic,
        }
    }

    /// The export's figures, or why the text is not one.
    pub fn read(self, text: &str) -> Result<Vec<Line>, FinanceError> {
        self.read_files(&[("", text)])
    }

    /// The figures of one download saved as `files` (`read_download`).
    pub fn read_files(self, files: &[exports::File]) -> Result<Vec<Line>, FinanceError> {
        self.read_download(files).map(|f| f.lines)
    }

    /// The figures and parts of one download saved as `files` (name, text): JSON pages
    /// read together (a page's successor may be in another file), CSV files likewise,
    /// never the two kinds together. An error names the file it is in and the position
    /// inside it. Anthropic's parts are not listed (no OpenAI grouping to judge).
    pub fn read_download(
        self,
        files: &[exports::File],
    ) -> Result<exports::Figures<Line>, FinanceError> {
        let files: Vec<exports::File> = files.iter().map(|&(n, t)| (n, unmarked(t))).collect();
        let csv: Vec<&str> = files
            .iter()
            .filter(|f| exports::openai_csv::is_csv(f.1))
            .map(|f| f.0)
            .collect();
        let some_csv = self == Export::Openai && !csv.is_empty();
        match self {
            _ if some_csv && csv.len() < files.len() => Err(exports::ExportError(
                exports::in_file(
                    &csv.join(", "),
                    "a CSV export is read with CSV files only, one at a time or several, never beside JSON pages",
                ),
            )),
            Export::Openai if some_csv => exports::openai_csv::read_files(&files),
            Export::Openai => exports::openai::read_files(&files),
            Export::Anthropic => {
                exports::anthropic::read_files(&files).map(|f| exports::Figures {
                    parts: Vec::new(),
                    ..f
                })
            }
            Export::OpenaiUsage => Err(exports::ExportError(
                "a usage export holds tokens, not costs: it is compared by `usage_reconcile`"
                    .into(),
            )),
        }
        .map_err(|e| FinanceError::Unreadable(e.to_string()))
    }
}

/// A stored run.
pub struct Run {
    pub run: Reconciliation,
    pub rows: Vec<ReconciliationRow>,
}

/// Reads `files` as `export` — one download: a paginated JSON export's pages may be saved a
/// file each, read together (so a page's successor may be in the next file), CSV files
/// likewise, an error naming its file and the position in it (`Export::read_files`) —
/// compares it and stores the run (audited as `actor`).
pub async fn reconcile_file(
    db: &Db,
    settings: &Settings,
    export: Export,
    files: &[PathBuf],
    actor: &str,
    now: DateTime<Utc>,
) -> Result<Run, FinanceError> {
    let names: Vec<String> = files
        .iter()
        .map(|f| {
            f.file_name().map_or_else(
                || f.display().to_string(),
                |n| n.to_string_lossy().into_owned(),
            )
        })
        .collect();
    let download = Download::read(files)?;
    let file = &download.source;
    let exports::Figures { lines, parts, days } = export.read_download(&download.files())?;
    // The days the export covers, its days without spend included: Sluice's spend on them
    // is compared. An export of no bucket covers none.
    let Some((first, last)) = days else {
        return Err(FinanceError::Unreadable(format!(
            "{file}: the export covers no day — no page holds a bucket"
        )));
    };
    let accounts = Accounts::new(deployments(db, settings, export.provider()).await?);
    if export == Export::Openai {
        let figures = lines.iter().map(|l| (l.accounts.as_slice(), l.named));
        if let Some(missing) = reconcile::ungrouped(figures, &parts, &accounts) {
            return Err(FinanceError::Unreadable(exports::in_file(
                &missing.place,
                format!("{}: {}", missing.describe(), costs_hint(&missing)),
            )));
        }
    }
    let (from, to) = download.log_span(first, last)?;
    let spend = finance::spend_by_upstream(db, &from, &to).await?;
    let t = Thresholds {
        micros: settings.finance.threshold_micros(),
        bp: settings.finance.threshold_bp(),
    };
    let rows = reconcile::compare(&lines, (first, last), &spend, &accounts, t);
    let sum = |f: fn(&ReconciliationRow) -> i64| {
        let s: i128 = rows.iter().map(|r| i128::from(f(r))).sum();
        i64::try_from(s).unwrap_or(i64::MAX)
    };
    let mut run = Reconciliation {
        id: 0,
        provider: export.as_str().into(),
        source: names.join(", "),
        first_day: first.to_string(),
        last_day: last.to_string(),
        threshold_micros: t.micros,
        threshold_pct_bp: t.bp,
        sluice_micros: sum(|r| r.sluice_micros),
        provider_micros: sum(|r| r.provider_micros),
        flagged: rows.iter().filter(|r| r.flagged).count() as i64,
        created_at: crate::clock::db_time(now),
    };
    let mut tx = db.begin().await?;
    run.id = finance::save(&mut tx, &run, &rows).await?;
    let after = json!({
        "provider": run.provider, "source": run.source, "first_day": run.first_day,
        "last_day": run.last_day, "rows": rows.len(), "flagged": run.flagged,
        "sluice_micros": run.sluice_micros, "provider_micros": run.provider_micros,
    })
    .to_string();
    let entry = AuditEntry {
        actor,
        address: "",
        action: "finance.reconcile",
        target: &format!("reconciliation:{}", run.id),
        before: None,
        after: Some(&after),
    };
    audit::append(&mut tx, &entry, now).await?;
    tx.commit().await?;
    Ok(Run { run, rows })
}

/// What to do about a part of a cost export that cannot meet the claimed accounts: download
/// it again grouped by what is missing — the Costs API groups by `project_id`, `api_key_id`
/// and `line_item` — as every other part of the download is (or name a key-billed
/// deployment's project instead; its tokens compare per key with `openai-usage`).
fn costs_hint(missing: &reconcile::Ungrouped) -> String {
    let mut by = Vec::new();
    if !missing.api_key.is_empty() {
        by.push("group_by=api_key_id");
    }
    if !missing.project.is_empty() {
        by.push("group_by=project_id");
    }
    let mut out = format!(
        "download this part again with {} added (besides group_by=line_item), as every page and file of the download must be",
        by.join(" and ")
    );
    if !missing.api_key.is_empty() {
        out.push_str(
            "; or name those deployments' project in provider_account (compare their tokens per key with --provider openai-usage)",
        );
    }
    out
}

/// One download saved as files (a paginated export's pages, a file each).
pub(super) struct Download {
    /// The files' paths joined: how an error names the download.
    pub(super) source: String,
    /// Each file's path, as errors name it, and its text, in the order given.
    names: Vec<String>,
    texts: Vec<String>,
}

impl Download {
    /// Reads every file, or says which one cannot be read. An empty file (nothing but
    /// whitespace, or a byte-order mark) is no part of any export — neither a JSON page
    /// nor a CSV, whose export of days without spend still has its header: it is refused
    /// naming it, not read as whichever kind its first byte suggests.
    pub(super) fn read(files: &[PathBuf]) -> Result<Download, FinanceError> {
        let names: Vec<String> = files.iter().map(|f| f.display().to_string()).collect();
        let texts: Vec<String> = files
            .iter()
            .map(|f| read_text(f))
            .collect::<Result<_, _>>()?;
        if let Some((name, _)) = names
            .iter()
            .zip(&texts)
            .find(|(_, t)| unmarked(t).trim().is_empty())
        {
            return Err(FinanceError::Unreadable(format!(
                "{name}: the file is empty — not an export (a download that failed to save?); a CSV export of days without spend still has its header row"
            )));
        }
        Ok(Download {
            source: names.join(", "),
            names,
            texts,
        })
    }

    /// Each file's name and text, each without its byte-order mark: what a reader takes
    /// (`exports::walk_files`), so an error names the file it is in and the position in
    /// it while a page's successor may be in the next file.
    pub(super) fn files(&self) -> Vec<exports::File<'_>> {
        self.names
            .iter()
            .zip(&self.texts)
            .map(|(n, t)| (n.as_str(), unmarked(t)))
            .collect()
    }

    /// The request log's times for the export's days `first..=last`: from the first's
    /// midnight to the midnight after the last. A day at the calendar's end (a hostile
    /// `start_time`) has no next day: the download is refused.
    pub(super) fn log_span(
        &self,
        first: NaiveDate,
        last: NaiveDate,
    ) -> Result<(String, String), FinanceError> {
        let next = last.checked_add_signed(Duration::days(1)).ok_or_else(|| {
            FinanceError::Unreadable(format!("{}: a day past the calendar's end", self.source))
        })?;
        let at = |d: NaiveDate| crate::clock::db_time(d.and_time(NaiveTime::MIN).and_utc());
        Ok((at(first), at(next)))
    }
}

/// `file`'s text, or why it cannot be read.
pub(super) fn read_text(file: &Path) -> Result<String, FinanceError> {
    let bytes = std::fs::read(file)
        .map_err(|e| FinanceError::Unreadable(format!("cannot read {}: {e}", file.display())))?;
    String::from_utf8(bytes).map_err(|e| {
        FinanceError::Unreadable(format!(
            "{}: not UTF-8 text (byte {})",
            file.display(),
            e.utf8_error().valid_up_to()
        ))
    })
}

/// `text` without a leading UTF-8 byte-order mark (a spreadsheet's "CSV UTF-8" writes one:
/// it is no part of the first column's name).
pub(super) fn unmarked(text: &str) -> &str {
    text.strip_prefix('\u{feff}').unwrap_or(text)
}

/// The deployments of `provider`, from the config file and the admin's managed ones: (id,
/// `provider_account`). A managed one's stored settings are its `[[upstreams]]` table.
pub(super) async fn deployments(
    db: &Db,
    settings: &Settings,
    provider: Provider,
) -> Result<Vec<(String, Option<String>)>, FinanceError> {
    let mut out: Vec<(String, Option<String>)> = settings
        .upstreams
        .iter()
        .filter(|u| u.provider == provider)
        .map(|u| (u.id.clone(), u.provider_account.clone()))
        .collect();
    for row in managed::upstreams(db).await? {
        let Ok(table) = serde_json::from_str::<serde_json::Value>(&row.settings) else {
            continue; // the catalog refuses such a row too (`upstream::live`)
        };
        let same = serde_json::from_value::<Provider>(table["provider"].clone())
            .is_ok_and(|p| p == provider);
        if same {
            let account = table["provider_account"].as_str().map(String::from);
            out.push((row.id, account));
        }
    }
    Ok(out)
}
