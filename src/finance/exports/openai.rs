//! OpenAI's Costs API (`GET /v1/organization/costs`, saved as JSON): pages of daily
//! buckets (`data[].start_time`, Unix seconds), each with `results[]` of
//! `amount.value` (USD, a JSON number read from its text: exact), `line_item`
//! (`"<model>, <kind>"`; the export must be grouped by `line_item` so each figure names its
//! model), `project_id` and `api_key_id` (when grouped by them).

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
    start_time: i64,
    #[serde(borrow)]
    results: Vec<Cost<'a>>,
}

#[derive(Deserialize)]
struct Cost<'a> {
    #[serde(borrow)]
    amount: Option<Amount<'a>>,
    line_item: Option<String>,
    project_id: Option<String>,
    api_key_id: Option<String>,
}

#[derive(Deserialize)]
struct Amount<'a> {
    #[serde(borrow)]
    value: &'a RawValue,
    currency: Option<String>,
}

pub fn read(text: &str) -> Result<Vec<Line>, ExportError> {
    let mut lines = Vec::new();
    for (p, page) in pages::<Page>(text)?.into_iter().enumerate() {
        for (i, bucket) in page.data.into_iter().enumerate() {
            let at = format!("page {}, data[{i}]", p + 1);
            let day = chrono::DateTime::from_timestamp(bucket.start_time, 0)
                .ok_or_else(|| ExportError::at(&format!("{at}.start_time"), "not a time"))?
                .date_naive();
            for (j, cost) in bucket.results.into_iter().enumerate() {
                let at = format!("{at}.results[{j}]");
                lines.push(line(&at, day, cost)?);
            }
        }
    }
    Ok(lines)
}

fn line(at: &str, day: chrono::NaiveDate, cost: Cost) -> Result<Line, ExportError> {
    let amount = cost
        .amount
        .ok_or_else(|| ExportError::at(&format!("{at}.amount"), "missing"))?;
    if let Some(c) = amount.currency.as_deref() {
        if !c.eq_ignore_ascii_case("usd") {
            return Err(ExportError::at(
                &format!("{at}.amount.currency"),
                format!("`{c}`: only USD figures can be reconciled"),
            ));
        }
    }
    let text = decimal::raw_text(amount.value).unwrap_or_default();
    let micros = decimal::usd_to_micros(&text).ok_or_else(|| {
        ExportError::at(
            &format!("{at}.amount.value"),
            format!("`{}` is not a decimal amount", amount.value.get()),
        )
    })?;
    let item = cost.line_item.ok_or_else(|| {
        ExportError::at(
            &format!("{at}.line_item"),
            "missing: export the costs grouped by line_item (group_by=line_item) so each figure names its model",
        )
    })?;
    // "gpt-4o-mini-2024-07-18, input" → the model; a line item without a kind is the model.
    let model = item.split_once(", ").map_or(item.as_str(), |(m, _)| m);
    Ok(Line {
        day,
        model: model.trim().to_string(),
        accounts: [cost.api_key_id, cost.project_id]
            .into_iter()
            .flatten()
            .collect(),
        micros,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const PAGE: &str = r#"{"object":"page","data":[{"object":"bucket","start_time":1730419200,"end_time":1730505600,
        "results":[{"object":"organization.costs.result","amount":{"value":0.06,"currency":"usd"},
                    "line_item":"gpt-4o-mini-2024-07-18, input","project_id":"proj_abc"},
                   {"object":"organization.costs.result","amount":{"value":1.0000005,"currency":"usd"},
                    "line_item":"gpt-4o-mini-2024-07-18, output","project_id":null}]}],
        "has_more":false,"next_page":null}"#;

    #[test]
    fn a_costs_page_reads_exactly() {
        let lines = read(PAGE).unwrap();
        let day = chrono::NaiveDate::from_ymd_opt(2024, 11, 1).unwrap();
        assert_eq!(
            lines,
            vec![
                Line {
                    day,
                    model: "gpt-4o-mini-2024-07-18".into(),
                    accounts: vec!["proj_abc".into()],
                    micros: 60_000
                },
                Line {
                    day,
                    model: "gpt-4o-mini-2024-07-18".into(),
                    accounts: vec![],
                    micros: 1_000_001
                },
            ]
        );
        // Two pages one after another, and an array of them, read alike.
        assert_eq!(read(&format!("{PAGE}\n{PAGE}")).unwrap().len(), 4);
        assert_eq!(read(&format!("[{PAGE},{PAGE}]")).unwrap().len(), 4);
    }

    #[test]
    fn a_bad_file_names_its_problem() {
        let e = read("{\"data\": [}").unwrap_err().to_string();
        assert!(e.contains("line 1"), "{e}");
        let e = read(&PAGE.replace("0.06", "\"zero\""))
            .unwrap_err()
            .to_string();
        assert!(e.contains("data[0].results[0].amount.value"), "{e}");
        let e = read(&PAGE.replace("\"usd\"", "\"eur\""))
            .unwrap_err()
            .to_string();
        assert!(e.contains("amount.currency"), "{e}");
        let e = read(&PAGE.replace("\"gpt-4o-mini-2024-07-18, input\"", "null"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("line_item"), "{e}");
        let e = read("   ").unwrap_err().to_string();
        assert!(e.contains("empty"), "{e}");
    }
}
