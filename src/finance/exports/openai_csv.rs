//! OpenAI's usage dashboard export (Usage → Export → "Cost data", grouped by line item,
//! 1-day interval, CSV): one row per day and line item, the columns of the Costs API
//! flattened — `start_time` (Unix seconds; an ISO date or RFC 3339 time is read too),
//! `amount_value` (USD as decimal text, read exactly), `amount_currency`, `line_item`
//! (`"<model>, <kind>"`), `project_id` and, when grouped by key, `api_key_id`. Other columns
//! (`end_time`, `organization_id`, names) are ignored.

use std::collections::HashMap;

use chrono::NaiveDate;

use super::{in_file, ExportError, Figures, Line, Named, Part};
use crate::finance::decimal;

/// Whether `text` looks like this export rather than the JSON of the Costs API.
pub fn is_csv(text: &str) -> bool {
    !matches!(text.trim_start().chars().next(), Some('{' | '[') | None)
}

pub fn read(text: &str) -> Result<Vec<Line>, ExportError> {
    read_files(&[("", text)]).map(|f| f.lines)
}

/// A day, line item and account: a row's identity (`seen`).
type RowId = (NaiveDate, String, Vec<String>);

/// Several of these exports as one (a download split in files, each with its header): an
/// error names its file and the row inside it. A row given twice (a file saved twice)
/// counts once; the same day, line item and account with another figure is refused —
/// which one is the bill? — in one file or across them. Each file with rows is a `Part`
/// (one dashboard export, one grouping).
pub fn read_files(files: &[super::File]) -> Result<Figures<Line>, ExportError> {
    let mut seen: HashMap<RowId, i64> = HashMap::new();
    let mut lines = Vec::new();
    let mut parts = Vec::new();
    for (name, text) in files {
        let named =
            read_one(text, &mut seen, &mut lines).map_err(|e| ExportError(in_file(name, e)))?;
        if let Some(named) = named {
            parts.push(Part {
                place: name.to_string(),
                named,
            });
        }
    }
    if lines.is_empty() {
        let names: Vec<&str> = files.iter().map(|f| f.0).collect();
        return Err(ExportError(in_file(
            &names.join(", "),
            "not a cost export: the file has no rows",
        )));
    }
    Ok(Figures { lines, parts })
}

/// One file's rows added to `lines`; errors name the row (its header is row 1). What its
/// rows name (`Part::named`), `None` when it has none.
fn read_one(
    text: &str,
    seen: &mut HashMap<RowId, i64>,
    lines: &mut Vec<Line>,
) -> Result<Option<Named>, ExportError> {
    let mut rows = csv::ReaderBuilder::new()
        .trim(csv::Trim::All)
        .from_reader(text.as_bytes());
    let headers = rows
        .headers()
        .map_err(|e| ExportError(format!("not a cost export: {e}")))?
        .clone();
    let column = |name: &str| headers.iter().position(|h| h == name);
    let need = |name: &str| {
        column(name).ok_or_else(|| {
            ExportError(format!(
                "not OpenAI's cost CSV: no `{name}` column (export \"Cost data\" grouped by line item)"
            ))
        })
    };
    let (start, amount, item) = (
        need("start_time")?,
        need("amount_value")?,
        need("line_item")?,
    );
    let (currency, project, key) = (
        column("amount_currency"),
        column("project_id"),
        column("api_key_id"),
    );
    let mut named_by_file: Option<Named> = None;
    for (i, row) in rows.records().enumerate() {
        let at = format!("row {}", i + 2);
        let row = row.map_err(|e| ExportError::at(&at, e))?;
        let field = |c: Option<usize>| c.and_then(|c| row.get(c)).filter(|v| !v.is_empty());
        if let Some(c) = field(currency) {
            if !c.eq_ignore_ascii_case("usd") {
                return Err(ExportError::at(
                    &format!("{at}, amount_currency"),
                    format!("`{c}`: only USD figures can be reconciled"),
                ));
            }
        }
        let day = day_of(field(Some(start)).unwrap_or_default())
            .ok_or_else(|| ExportError::at(&format!("{at}, start_time"), "not a time"))?;
        let text = field(Some(amount)).unwrap_or_default();
        let micros = decimal::usd_to_micros(text).ok_or_else(|| {
            ExportError::at(
                &format!("{at}, amount_value"),
                format!("`{text}` is not a decimal amount"),
            )
        })?;
        let item = field(Some(item))
            .ok_or_else(|| ExportError::at(&format!("{at}, line_item"), "empty"))?;
        // "gpt-4o-mini-2024-07-18, input" → the model; a line item without a kind is the model.
        let model = item.split_once(", ").map_or(item, |(m, _)| m).trim();
        let accounts: Vec<String> = [field(key), field(project)]
            .into_iter()
            .flatten()
            .map(str::to_string)
            .collect();
        let named = Named::of(field(key), field(project));
        named_by_file = Some(named_by_file.unwrap_or_default().or(named));
        let id = (day, item.to_string(), accounts.clone());
        match seen.get(&id) {
            Some(before) if *before == micros => continue,
            Some(_) => {
                return Err(ExportError::at(
                    &at,
                    format!("`{item}` on {day} appears twice with different amounts"),
                ))
            }
            None => {}
        }
        seen.insert(id, micros);
        lines.push(Line {
            day,
            model: model.to_string(),
            accounts,
            named,
            micros,
        });
    }
    Ok(named_by_file)
}

/// The UTC day of Unix seconds, an ISO date or an RFC 3339 time.
fn day_of(text: &str) -> Option<NaiveDate> {
    if let Ok(secs) = text.parse::<i64>() {
        return chrono::DateTime::from_timestamp(secs, 0).map(|t| t.date_naive());
    }
    if let Ok(day) = NaiveDate::parse_from_str(text, "%Y-%m-%d") {
        return Some(day);
    }
    chrono::DateTime::parse_from_rfc3339(text)
        .ok()
        .map(|t| t.with_timezone(&chrono::Utc).date_naive())
}

#[cfg(test)]
mod tests {
    use super::*;

    const CSV: &str = "start_time,end_time,amount_value,amount_currency,line_item,project_id,organization_id,project_name,organization_name
1730419200,1730505600,0.06,usd,\"gpt-4o-mini-2024-07-18, input\",proj_abc,org_1,Apollo,Acme
1730419200,1730505600,1.0000005,usd,\"gpt-4o-mini-2024-07-18, output\",,org_1,,Acme
";

    #[test]
    fn a_dashboard_export_reads_exactly() {
        let day = NaiveDate::from_ymd_opt(2024, 11, 1).unwrap();
        let lines = read(CSV).unwrap();
        assert_eq!(
            lines,
            vec![
                Line {
                    day,
                    model: "gpt-4o-mini-2024-07-18".into(),
                    accounts: vec!["proj_abc".into()],
                    named: crate::finance::exports::Named::of(None, Some("proj_abc")),
                    micros: 60_000
                },
                Line {
                    day,
                    model: "gpt-4o-mini-2024-07-18".into(),
                    accounts: vec![],
                    named: crate::finance::exports::Named::default(),
                    micros: 1_000_001
                },
            ]
        );
        assert!(is_csv(CSV) && !is_csv("  {\"data\": []}") && !is_csv("[]"));
        // The same rows twice count once; ISO dates read as the Unix seconds do.
        let twice = format!(
            "{CSV}{}",
            CSV.lines().skip(1).collect::<Vec<_>>().join("\n")
        );
        assert_eq!(read(&twice).unwrap(), lines);
        let iso = CSV.replace("1730419200,", "2024-11-01,");
        assert_eq!(read(&iso).unwrap(), lines);
    }

    /// A spreadsheet saved as "CSV UTF-8" starts with a byte-order mark: the header still
    /// reads, and so does a JSON export with one.
    #[test]
    fn a_leading_byte_order_mark_is_no_part_of_the_header() {
        use crate::finance::run::Export;
        let bom = format!("\u{feff}{CSV}");
        assert_eq!(bom.as_bytes()[..3], [0xEF, 0xBB, 0xBF]);
        assert_eq!(Export::Openai.read(&bom).unwrap(), read(CSV).unwrap());
        let page = r#"{"data":[],"has_more":false}"#;
        assert!(Export::Openai.read(&format!("\u{feff}{page}")).is_ok());
    }

    #[test]
    fn a_bad_file_names_its_problem() {
        let e = |text: &str| read(text).unwrap_err().to_string();
        assert!(e("date,cost\n2024-11-01,3\n").contains("no `start_time` column"));
        assert!(e(&CSV.replace("0.06", "zero")).contains("row 2, amount_value"));
        assert!(e(&CSV.replace(
            "usd,\"gpt-4o-mini-2024-07-18, input",
            "eur,\"gpt-4o-mini-2024-07-18, input"
        ))
        .contains("row 2, amount_currency"));
        assert!(
            e(&CSV.replace("1730419200,1730505600,0.06", "soon,1730505600,0.06"))
                .contains("row 2, start_time")
        );
        let other = CSV.replace(
            "1.0000005,usd,\"gpt-4o-mini-2024-07-18, output\",",
            "0.07,usd,\"gpt-4o-mini-2024-07-18, input\",proj_abc",
        );
        assert!(
            e(&other).contains("appears twice with different amounts"),
            "{}",
            e(&other)
        );
        assert!(e("start_time,amount_value,line_item\n").contains("no rows"));
    }
}
