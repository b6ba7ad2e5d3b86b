//! Anthropic's Cost Report (`GET /v1/organizations/cost_report`, saved as JSON): pages of
//! daily buckets (`data[].starting_at`, RFC 3339), each with `results[]` of `amount` (a
//! decimal string in cents: "123.45" is $1.2345), `currency`, `model` and `cost_type`
//! (when grouped by `description`) and `workspace_id` (when grouped by it; null is the
//! default workspace). A non-token cost (`web_search`, `code_execution`) names no model: it
//! is its own row, under its cost type — except web search, folded into the model (see
//! `fold_search`).

use std::collections::BTreeSet;

use serde::Deserialize;
use serde_json::value::RawValue;

use super::{self as exports, walk, ExportError, Figures, Line};
use crate::finance::decimal;

/// The report's cost type of a web search.
const WEB_SEARCH: &str = "web_search";

#[derive(Deserialize)]
struct Bucket<'a> {
    starting_at: String,
    ending_at: Option<String>,
    #[serde(borrow)]
    results: Vec<Cost<'a>>,
}

#[derive(Deserialize)]
struct Cost<'a> {
    #[serde(borrow)]
    amount: Option<&'a RawValue>,
    currency: Option<String>,
    model: Option<String>,
    cost_type: Option<String>,
    workspace_id: Option<String>,
}

pub fn read(text: &str) -> Result<Vec<Line>, ExportError> {
    walk::<Bucket>(text)
}

/// The pages of one download saved as `files` (`exports::walk_files`).
pub fn read_files(files: &[exports::File]) -> Result<Figures<Line>, ExportError> {
    exports::walk_files::<Bucket>(files)
}

impl exports::Bucket for Bucket<'_> {
    fn start(&self) -> String {
        self.starting_at.clone()
    }

    fn end(&self) -> Option<String> {
        self.ending_at.clone()
    }

    const START: &'static str = "starting_at";
    const END: &'static str = "ending_at";

    /// RFC 3339, its offset normalised: a day starting at local midnight is judged by the
    /// UTC day it lies in.
    fn instant(written: &str) -> Option<chrono::DateTime<chrono::Utc>> {
        chrono::DateTime::parse_from_rfc3339(written)
            .ok()
            .map(|t| t.with_timezone(&chrono::Utc))
    }

    type Item = Line;

    fn lines(self, at: &str, day: chrono::NaiveDate) -> Result<Vec<Line>, ExportError> {
        let mut lines = Vec::new();
        let mut searches = Vec::new();
        // (workspace, model) of the figures that name a model.
        let mut models: BTreeSet<(Vec<String>, String)> = BTreeSet::new();
        for (j, cost) in self.results.into_iter().enumerate() {
            let named = cost.model.is_some();
            let search = !named && cost.cost_type.as_deref() == Some(WEB_SEARCH);
            let line = line(&format!("{at}.results[{j}]"), day, cost)?;
            if named {
                models.insert((line.accounts.clone(), line.model.clone()));
            }
            if search {
                searches.push(line);
            } else {
                lines.push(line);
            }
        }
        lines.extend(searches.into_iter().map(|s| fold_search(s, &models)));
        Ok(lines)
    }
}

/// Sluice prices a web search into the cost of the model that ran it; the report gives it
/// its own row naming no model. The row is folded into its bucket's model in the same
/// workspace when there is exactly one; with several, each one's share is not in the
/// report, so it stays its own row (`web_search`) and shows as a difference.
fn fold_search(search: Line, models: &BTreeSet<(Vec<String>, String)>) -> Line {
    let mut mine = models.iter().filter(|(a, _)| *a == search.accounts);
    match (mine.next(), mine.next()) {
        (Some((_, model)), None) => Line {
            model: model.clone(),
            ..search
        },
        _ => search,
    }
}

fn line(at: &str, day: chrono::NaiveDate, cost: Cost) -> Result<Line, ExportError> {
    if let Some(c) = cost.currency.as_deref() {
        if !c.eq_ignore_ascii_case("usd") {
            return Err(ExportError::at(
                &format!("{at}.currency"),
                format!("`{c}`: only USD figures can be reconciled"),
            ));
        }
    }
    let raw = cost
        .amount
        .ok_or_else(|| ExportError::at(&format!("{at}.amount"), "missing"))?;
    let micros = decimal::raw_text(raw)
        .and_then(|t| decimal::cents_to_micros(&t))
        .ok_or_else(|| {
            ExportError::at(
                &format!("{at}.amount"),
                format!("`{}` is not a decimal amount in cents", raw.get()),
            )
        })?;
    let model = match (cost.model, cost.cost_type.as_deref()) {
        (Some(m), _) => m,
        (None, Some(kind)) if kind != "tokens" => kind.to_string(),
        (None, _) => {
            return Err(ExportError::at(
                &format!("{at}.model"),
                "missing: export the cost report grouped by description (group_by[]=description) so each figure names its model",
            ))
        }
    };
    Ok(Line {
        day,
        model,
        accounts: cost.workspace_id.into_iter().collect(),
        named: exports::Named::default(),
        micros,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const PAGE: &str = r#"{"data":[{"starting_at":"2025-08-01T00:00:00Z","ending_at":"2025-08-02T00:00:00Z",
        "results":[{"currency":"USD","amount":"123.45","workspace_id":"wrkspc_1","description":"x",
                    "cost_type":"tokens","context_window":"0-200k","model":"claude-sonnet-4-20250514",
                    "service_tier":"standard","token_type":"uncached_input_tokens"},
                   {"currency":"USD","amount":"50","workspace_id":null,"cost_type":"web_search","model":null}]}],
        "has_more":false,"next_page":null}"#;

    #[test]
    fn a_cost_report_reads_exactly_in_cents() {
        let lines = read(PAGE).unwrap();
        let day = chrono::NaiveDate::from_ymd_opt(2025, 8, 1).unwrap();
        assert_eq!(lines[0].micros, 1_234_500);
        assert_eq!(lines[0].day, day);
        assert_eq!(lines[0].model, "claude-sonnet-4-20250514");
        assert_eq!(lines[0].accounts, vec!["wrkspc_1".to_string()]);
        assert_eq!(lines[1].micros, 500_000);
        assert_eq!(lines[1].model, "web_search");
        assert!(lines[1].accounts.is_empty());
    }

    #[test]
    fn a_web_search_row_folds_into_the_model_of_its_workspace() {
        let page = PAGE.replace("\"workspace_id\":null", "\"workspace_id\":\"wrkspc_1\"");
        let lines = read(&page).unwrap();
        assert_eq!(lines.len(), 2);
        assert_eq!(lines[1].model, "claude-sonnet-4-20250514");
        assert_eq!(lines[1].micros, 500_000);
        // Two models in the workspace: the report does not say whose searches they were.
        let two = page.replace(
            "{\"currency\":\"USD\",\"amount\":\"50\"",
            "{\"currency\":\"USD\",\"amount\":\"1\",\"workspace_id\":\"wrkspc_1\",\"model\":\"claude-opus-4\"},{\"currency\":\"USD\",\"amount\":\"50\"",
        );
        let lines = read(&two).unwrap();
        assert_eq!(lines.last().unwrap().model, "web_search");
    }

    /// As OpenAI's: a page saying `has_more` whose successor (the page starting at its
    /// last bucket's `ending_at`) is not in the file is named.
    #[test]
    fn a_missing_middle_page_is_named() {
        let page = |from: &str, to: &str, more: bool| {
            PAGE.replace("2025-08-02T00:00:00Z", to)
                .replace("2025-08-01T00:00:00Z", from)
                .replace("\"has_more\":false", &format!("\"has_more\":{more}"))
        };
        let one = page("2025-08-01T00:00:00Z", "2025-08-02T00:00:00Z", true);
        let two = page("2025-08-02T00:00:00Z", "2025-08-03T00:00:00Z", true);
        let three = page("2025-08-03T00:00:00Z", "2025-08-04T00:00:00Z", false);
        assert!(read(&format!("{one}\n{two}\n{three}")).is_ok());
        let e = read(&format!("{one}\n{three}")).unwrap_err().to_string();
        assert!(
            e.starts_with("page 1:") && e.contains("2025-08-02T00:00:00Z"),
            "{e}"
        );
    }

    /// A bucket is one UTC day or part of one: `starting_at` at local midnight (an offset)
    /// runs past its UTC day, as does a week's bucket; each is refused naming `ending_at`.
    /// A day or an hour written with an offset of zero is accepted.
    #[test]
    fn a_bucket_not_at_utc_midnight_is_refused() {
        let with = |from: &str, to: &str| {
            PAGE.replace("2025-08-02T00:00:00Z", to)
                .replace("2025-08-01T00:00:00Z", from)
        };
        for (from, to) in [
            ("2025-08-01T00:00:00-08:00", "2025-08-02T00:00:00-08:00"),
            ("2025-08-01T00:00:00Z", "2025-08-08T00:00:00Z"),
        ] {
            let e = read(&with(from, to)).unwrap_err().to_string();
            assert!(
                e.starts_with("page 1, data[0].ending_at: ") && e.contains("UTC day"),
                "{e}"
            );
            assert!(e.contains("starting_at"), "{e}");
        }
        let e = read(&with("2025-08-01T00:00:00Z", "tomorrow"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("data[0].ending_at"), "{e}");
        let day = chrono::NaiveDate::from_ymd_opt(2025, 8, 1).unwrap();
        for (from, to) in [
            ("2025-08-01T00:00:00+00:00", "2025-08-02T00:00:00+00:00"),
            ("2025-08-01T05:00:00Z", "2025-08-01T06:00:00Z"),
            // 23:00 to midnight UTC, written in another zone.
            ("2025-08-02T01:00:00+02:00", "2025-08-02T02:00:00+02:00"),
        ] {
            let lines = read(&with(from, to)).unwrap();
            assert!(lines.iter().all(|l| l.day == day), "{from}: {lines:?}");
        }
    }

    #[test]
    fn a_bad_report_names_its_problem() {
        let e = read(&PAGE.replace("\"123.45\"", "\"12,5\""))
            .unwrap_err()
            .to_string();
        assert!(e.contains("data[0].results[0].amount"), "{e}");
        let e = read(&PAGE.replace("2025-08-01T00:00:00Z", "yesterday"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("starting_at"), "{e}");
        let e = read(&PAGE.replace("\"claude-sonnet-4-20250514\"", "null"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("results[0].model"), "{e}");
        let e = read("{\"data\": 5}").unwrap_err().to_string();
        assert!(e.contains("line 1"), "{e}");
    }
}
