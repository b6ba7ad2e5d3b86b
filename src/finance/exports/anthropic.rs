//! Anthropic's Cost Report (`GET /v1/organizations/cost_report`, saved as JSON): pages of
//! daily buckets (`data[].starting_at`, RFC 3339), each with `results[]` of `amount` (a
//! decimal string in cents: "123.45" is $1.2345), `currency`, `model` and `cost_type`
//! (when grouped by `description`) and `workspace_id` (when grouped by it; null is the
//! default workspace). A non-token cost (`web_search`, `code_execution`) names no model: it
//! is its own row, under its cost type.

use serde::Deserialize;
use serde_json::value::RawValue;

use super::{pages, ExportError, Line};
use crate::finance::decimal;

#[derive(Deserialize)]
struct Page<'a> {
    #[serde(borrow)]
    data: Vec<Bucket<'a>>,
}

#[derive(Deserialize)]
struct Bucket<'a> {
    starting_at: String,
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
    let mut lines = Vec::new();
    for (p, page) in pages::<Page>(text)?.into_iter().enumerate() {
        for (i, bucket) in page.data.into_iter().enumerate() {
            let at = format!("page {}, data[{i}]", p + 1);
            let day = chrono::DateTime::parse_from_rfc3339(&bucket.starting_at)
                .map_err(|_| {
                    ExportError::at(
                        &format!("{at}.starting_at"),
                        format!("`{}` is not an RFC 3339 time", bucket.starting_at),
                    )
                })?
                .with_timezone(&chrono::Utc)
                .date_naive();
            for (j, cost) in bucket.results.into_iter().enumerate() {
                lines.push(line(&format!("{at}.results[{j}]"), day, cost)?);
            }
        }
    }
    Ok(lines)
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
