//! Sluice's tokens next to OpenAI's usage export, per (UTC day, model, account): where the
//! cost reconciliation (`reconcile`) says *that* a day's bill differs, this says in which
//! count. Sluice's side is Σ `input_tokens`, `output_tokens` and `cached_input_tokens` of
//! the request log's completions requests (not embeddings: another export) by day, the
//! model the upstream was sent and its deployment's account;
//! OpenAI's is the export's `input_tokens`, `output_tokens` and `input_cached_tokens`.
//! Keys and days are met as in `reconcile` (models without a snapshot date, a figure's
//! account the first of its ids a deployment names, only the export's days). Counts are
//! integers both sides took from the same reports, so a cell is flagged when any of its
//! three counts differs at all: a request the upstream answered without usage (counted by
//! the gateway), or one made with the key outside the gateway, shows here. An export whose
//! figures name no account is refused while a deployment names one (`unattributed`).

use std::collections::BTreeMap;
use std::path::PathBuf;

use chrono::NaiveDate;
use serde::Serialize;

use super::exports::openai_usage::{self, TokenLine, Tokens};
use super::exports::{base_model, in_file, Figures, Part};
use super::reconcile::{ungrouped, Accounts};
use super::run::Download;
use super::FinanceError;
use crate::config::{Provider, Settings};
use crate::store::finance::{self, UpstreamTokens};
use crate::store::Db;

/// One (day, model, account) either side has.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TokenRow {
    pub day: String,
    pub model: String,
    pub account: String,
    pub sluice: Counts,
    pub provider: Counts,
    pub flagged: bool,
}

/// A cell's three counts.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Counts {
    pub input_tokens: i64,
    pub output_tokens: i64,
    pub cached_input_tokens: i64,
}

impl Counts {
    fn add(&mut self, t: Tokens) {
        self.input_tokens = self.input_tokens.saturating_add(t.input);
        self.output_tokens = self.output_tokens.saturating_add(t.output);
        self.cached_input_tokens = self.cached_input_tokens.saturating_add(t.cached_input);
    }
}

/// A comparison: the export's days and its rows.
pub struct TokenRun {
    pub source: String,
    pub first_day: NaiveDate,
    pub last_day: NaiveDate,
    pub rows: Vec<TokenRow>,
}

impl TokenRun {
    pub fn flagged(&self) -> usize {
        self.rows.iter().filter(|r| r.flagged).count()
    }
}

/// One row per (day, model, account) either side has, in that order, inside `days` (the
/// first and last the export covers, `exports::Figures::days`).
pub fn compare(
    lines: &[TokenLine],
    (first, last): (NaiveDate, NaiveDate),
    logged: &[UpstreamTokens],
    accounts: &Accounts,
) -> Vec<TokenRow> {
    let (first, last) = (first.to_string(), last.to_string());
    let mut cells: BTreeMap<(String, String, String), (Counts, Counts)> = BTreeMap::new();
    for t in logged {
        let Some(account) = accounts.of_upstream(&t.upstream) else {
            continue; // another provider's deployment
        };
        if t.day < first || t.day > last {
            continue;
        }
        let key = (
            t.day.clone(),
            base_model(&t.model).to_string(),
            account.clone(),
        );
        cells.entry(key).or_default().0.add(Tokens {
            input: t.input_tokens,
            output: t.output_tokens,
            cached_input: t.cached_input_tokens,
        });
    }
    for l in lines {
        let key = (
            l.day.to_string(),
            base_model(&l.model).to_string(),
            accounts.of_line(&l.accounts),
        );
        cells.entry(key).or_default().1.add(l.tokens);
    }
    cells
        .into_iter()
        .map(|((day, model, account), (sluice, provider))| TokenRow {
            day,
            model,
            account,
            sluice,
            provider,
            flagged: sluice != provider,
        })
        .collect()
}

/// Why an export cannot be compared by account: it was not grouped by the kind of account
/// the deployments bill to (`reconcile::ungrouped`) — not by account at all, or by
/// project while a deployment names an API key, or by key while one names a project.
/// Its figures would meet the wrong accounts (`*`, or a project's sum against one key's
/// log) and the claimed ones read as unbilled; with no account claimed anywhere
/// everything is `*` on both sides and the export compares as it is.
/// Judged per page (`reconcile::ungrouped`); the message names the page.
pub fn unattributed(lines: &[TokenLine], parts: &[Part], accounts: &Accounts) -> Option<String> {
    let missing = ungrouped(
        lines.iter().map(|l| (l.accounts.as_slice(), l.named)),
        parts,
        accounts,
    )?;
    Some(in_file(
        &missing.place,
        format!(
            "{}: download the usage again with group_by=api_key_id and group_by=project_id \
             added to the query (besides group_by=model) so each figure names its account, \
             as every page of the download must be",
            missing.describe()
        ),
    ))
}

/// Reads `files` (one download's pages, as `run::reconcile_file` reads a cost export's)
/// and compares them with the request log of OpenAI's deployments. Nothing is stored: the
/// run changes no state (the cost reconciliation's runs are the stored ones).
pub async fn reconcile_usage(
    db: &Db,
    settings: &Settings,
    files: &[PathBuf],
) -> Result<TokenRun, FinanceError> {
    let download = Download::read(files)?;
    let source = &download.source;
    let Figures { lines, parts, days } = openai_usage::read_files(&download.files())
        .map_err(|e| FinanceError::Unreadable(e.to_string()))?;
    // The days the export covers, its days without usage included (`reconcile_file`).
    let Some((first, last)) = days else {
        return Err(FinanceError::Unreadable(format!(
            "{source}: the export covers no day — no page holds a bucket"
        )));
    };
    let accounts = Accounts::new(super::run::deployments(db, settings, Provider::Openai).await?);
    if let Some(why) = unattributed(&lines, &parts, &accounts) {
        return Err(FinanceError::Unreadable(why));
    }
    let (from, to) = download.log_span(first, last)?;
    let logged = finance::tokens_by_upstream(db, &from, &to).await?;
    Ok(TokenRun {
        source: download.source,
        first_day: first,
        last_day: last,
        rows: compare(&lines, (first, last), &logged, &accounts),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::finance::exports::Named;

    #[test]
    fn cells_differing_in_any_count_and_only_those_are_flagged() {
        let accounts = Accounts::new([("a".to_string(), Some("key_a".to_string()))]);
        let day = |d| NaiveDate::from_ymd_opt(2026, 3, d).unwrap();
        let logged = |d: u32, model: &str, input, output, cached| UpstreamTokens {
            day: day(d).to_string(),
            upstream: "a".into(),
            model: model.into(),
            input_tokens: input,
            output_tokens: output,
            cached_input_tokens: cached,
        };
        let line = |d, model: &str, input, output, cached_input| TokenLine {
            day: day(d),
            model: model.into(),
            accounts: vec!["key_a".into(), "proj_1".into()],
            named: Named::of(Some("key_a"), Some("proj_1")),
            tokens: Tokens {
                input,
                output,
                cached_input,
            },
        };
        let rows = compare(
            &[
                line(1, "gpt-4o-mini-2024-07-18", 100, 10, 5),
                line(2, "gpt-4o-mini-2024-07-18", 100, 10, 5),
                line(2, "gpt-4o", 7, 1, 0),
            ],
            (day(1), day(2)),
            &[
                logged(1, "gpt-4o-mini", 100, 10, 5),
                logged(2, "gpt-4o-mini", 100, 10, 6),
                logged(2, "gpt-4o", 7, 1, 0),
                logged(3, "gpt-4o", 9, 9, 9), // past the export's days
            ],
            &accounts,
        );
        let flagged: Vec<_> = rows
            .iter()
            .map(|r| (r.day.as_str(), r.model.as_str(), r.flagged))
            .collect();
        assert_eq!(
            flagged,
            vec![
                ("2026-03-01", "gpt-4o-mini", false),
                ("2026-03-02", "gpt-4o", false),
                ("2026-03-02", "gpt-4o-mini", true),
            ]
        );
        assert!(rows.iter().all(|r| r.account == "key_a"));
    }

    #[test]
    fn figures_naming_no_account_are_refused_only_while_a_deployment_names_one() {
        let line = |ids: &[&str]| TokenLine {
            day: NaiveDate::from_ymd_opt(2026, 3, 1).unwrap(),
            model: "gpt-4o".into(),
            accounts: ids.iter().map(|i| i.to_string()).collect(),
            named: Named {
                api_key: false,
                project: !ids.is_empty(),
            },
            tokens: Tokens::default(),
        };
        let claimed = Accounts::new([
            ("a".to_string(), Some("proj_a".to_string())),
            ("b".to_string(), None),
        ]);
        // The lines as one page.
        let check = |lines: &[TokenLine], accounts: &Accounts| {
            let page = Part {
                place: "page 1".into(),
                named: lines.iter().fold(Named::default(), |n, l| n.or(l.named)),
            };
            unattributed(lines, &[page], accounts)
        };
        let why = check(&[line(&[]), line(&[])], &claimed).unwrap();
        assert!(
            why.starts_with("page 1: ")
                && why.contains("group_by=api_key_id")
                && why.contains("proj_a"),
            "{why}"
        );
        assert_eq!(check(&[line(&[]), line(&["proj_b"])], &claimed), None);
        let unclaimed = Accounts::new([("b".to_string(), None)]);
        assert_eq!(check(&[line(&[])], &unclaimed), None);
    }
}
