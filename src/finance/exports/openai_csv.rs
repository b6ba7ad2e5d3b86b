//! OpenAI's usage dashboard export (Usage → Export → "Cost data", grouped by line item,
//! 1-day interval, CSV): one row per day and line item, the columns of the Costs API
//! flattened — `start_time` (Unix seconds; an ISO date or RFC 3339 time is read too),
//! `end_time` (read alike, when given), `amount_value` (USD as decimal text, read exactly),
//! `amount_currency`, `line_item` (`"<model>, <kind>"`), `project_id`, `api_key_id` (when
//! grouped by key) and `organization_id`. Other columns (names) are ignored.

use std::collections::HashMap;

use chrono::{DateTime, NaiveDate, Utc};

use super::{covering, in_file, ExportError, Figures, Line, Named, Part};
use crate::finance::decimal;

/// Whether `text` looks like this export rather than the JSON of the Costs API.
pub fn is_csv(text: &str) -> bool {
    !matches!(text.trim_start().chars().next(), Some('{' | '[') | None)
}

pub fn read(text: &str) -> Result<Vec<Line>, ExportError> {
    read_files(&[("", text)]).map(|f| f.lines)
}

/// What tells one figure of the bill from another: its organisation (when the file has the
/// column), its time slice (instants: an ISO date and the Unix seconds of its midnight are
/// one start), its line item and its account. Two rows of a download with one identity
/// cannot be told apart — one figure given twice, or two figures the files do not
/// distinguish — so they are refused (`read_files`), never merged or summed.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
struct RowId {
    organization: Option<String>,
    start: DateTime<Utc>,
    end: Option<DateTime<Utc>>,
    item: String,
    api_key: Option<String>,
    project: Option<String>,
}

/// One row read: its identity, its number in its file (the header is row 1), its figure.
struct Row {
    id: RowId,
    number: usize,
    line: Line,
}

impl Row {
    fn describe(&self) -> String {
        let id = &self.id;
        let mut out = format!("`{}` from {}", id.item, id.start.to_rfc3339());
        for (what, v) in [
            ("API key", &id.api_key),
            ("project", &id.project),
            ("organisation", &id.organization),
        ] {
            if let Some(v) = v {
                out.push_str(&format!(", {what} {v}"));
            }
        }
        out
    }
}

/// Several of these exports as one (a download split in files, each with its header): an
/// error names its file and the row inside it. **Every row is a figure of the bill**:
/// rows of other organisations or other hours are other figures, however equal their day,
/// line item, account and amount (they are summed into their day). A file given again
/// whole (the same rows, in any order: a file saved twice) counts once. Any other repeat
/// of a row's identity (`RowId`) — inside one file, or across files (overlapping exports,
/// two organisations' exports without `organization_id`) — is refused naming both rows,
/// whatever the amounts: taken as one figure it could drop a real one, taken as two it
/// could double one. Each file with rows is a `Part` (one dashboard export, one grouping).
pub fn read_files(files: &[super::File]) -> Result<Figures<Line>, ExportError> {
    let mut read = Vec::new();
    for (name, text) in files {
        let rows = read_one(text).map_err(|e| ExportError(in_file(name, e)))?;
        read.push((*name, rows));
    }
    // Each counted file's rows (identity and amount), sorted: a file given twice.
    let mut counted: Vec<Vec<(RowId, i64)>> = Vec::new();
    let mut seen: HashMap<RowId, String> = HashMap::new();
    let (mut lines, mut parts) = (Vec::new(), Vec::new());
    // The rows' days: a header-only file (days without spend) names no day it covers.
    let mut days = None;
    for (name, rows) in read {
        if rows.is_empty() {
            continue; // a header only: a range without spend
        }
        let mut content: Vec<(RowId, i64)> =
            rows.iter().map(|r| (r.id.clone(), r.line.micros)).collect();
        content.sort();
        if counted.contains(&content) {
            continue;
        }
        counted.push(content);
        let mut named = Named::default();
        for row in rows {
            let place = in_file(name, format!("row {}", row.number));
            if let Some(before) = seen.get(&row.id) {
                return Err(ExportError(format!(
                    "{place}: {} is also {before} — an overlapping export, or another organisation's without its organization_id column: the two cannot be told from one figure given twice; give each row once (a file given twice whole counts once)",
                    row.describe()
                )));
            }
            named = named.or(row.line.named);
            days = covering(days, row.line.day);
            seen.insert(row.id, place);
            lines.push(row.line);
        }
        parts.push(Part {
            place: name.to_string(),
            named,
        });
    }
    if lines.is_empty() {
        let names: Vec<&str> = files.iter().map(|f| f.0).collect();
        return Err(ExportError(in_file(
            &names.join(", "),
            "not a cost export: the file has no rows",
        )));
    }
    Ok(Figures { lines, parts, days })
}

/// One file's rows; errors name the row (its header is row 1). A row repeating another's
/// identity is refused here, naming both.
fn read_one(text: &str) -> Result<Vec<Row>, ExportError> {
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
    let (end, currency, project, key, organization) = (
        column("end_time"),
        column("amount_currency"),
        column("project_id"),
        column("api_key_id"),
        column("organization_id"),
    );
    let mut out = Vec::new();
    let mut seen: HashMap<RowId, usize> = HashMap::new();
    for (i, row) in rows.records().enumerate() {
        let number = i + 2;
        let at = format!("row {number}");
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
        let from = instant_of(field(Some(start)).unwrap_or_default())
            .ok_or_else(|| ExportError::at(&format!("{at}, start_time"), "not a time"))?;
        let to = match field(end) {
            None => None,
            Some(text) => Some(within_its_day(from, text).map_err(|why| {
                ExportError::at(&format!("{at}, end_time"), format!("`{text}`: {why}"))
            })?),
        };
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
        let row = Row {
            id: RowId {
                organization: field(organization).map(str::to_string),
                start: from,
                end: to,
                item: item.to_string(),
                api_key: field(key).map(str::to_string),
                project: field(project).map(str::to_string),
            },
            number,
            line: Line {
                day: from.date_naive(),
                model: model.to_string(),
                accounts: [field(key), field(project)]
                    .into_iter()
                    .flatten()
                    .map(str::to_string)
                    .collect(),
                named: Named::of(field(key), field(project)),
                micros,
            },
        };
        if let Some(before) = seen.get(&row.id) {
            return Err(ExportError::at(
                &at,
                format!(
                    "{} is also row {before} of this file — one figure given twice, or two the file does not tell apart: refused rather than one dropped or doubled",
                    row.describe()
                ),
            ));
        }
        seen.insert(row.id.clone(), number);
        out.push(row);
    }
    Ok(out)
}

/// A row's end, which must not pass its start's UTC day (the next midnight): a row of
/// several days would land whole on its first, where Sluice's spend is only that day's.
/// A shorter row (an hour) is part of its day.
fn within_its_day(start: DateTime<Utc>, text: &str) -> Result<DateTime<Utc>, String> {
    let end = instant_of(text).ok_or("not a time")?;
    if !super::ends_in_its_day(start, end) {
        return Err(format!(
            "the row must lie within its start's UTC day ({}): export with a 1-day interval",
            start.date_naive()
        ));
    }
    Ok(end)
}

/// Unix seconds, an ISO date (its midnight) or an RFC 3339 time, as a UTC instant.
fn instant_of(text: &str) -> Option<DateTime<Utc>> {
    if let Ok(secs) = text.parse::<i64>() {
        return DateTime::from_timestamp(secs, 0);
    }
    if let Ok(day) = NaiveDate::parse_from_str(text, "%Y-%m-%d") {
        return Some(day.and_time(chrono::NaiveTime::MIN).and_utc());
    }
    DateTime::parse_from_rfc3339(text)
        .ok()
        .map(|t| t.with_timezone(&Utc))
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
        // The same file given twice counts once — in another order, with ISO dates for
        // the Unix seconds too.
        let iso = CSV.replace("1730419200,", "2024-11-01,");
        assert_eq!(read(&iso).unwrap(), lines);
        let mut reordered: Vec<&str> = iso.lines().collect();
        reordered[1..].reverse();
        let reordered = reordered.join("\n");
        let twice = read_files(&[("a.csv", CSV), ("b.csv", &reordered)]).unwrap();
        assert_eq!(twice.lines, lines);
        assert_eq!(twice.parts.len(), 1);
        // Its rows repeated inside one file are refused, naming both.
        let repeated = format!(
            "{CSV}{}",
            CSV.lines().skip(1).collect::<Vec<_>>().join("\n")
        );
        let e = read(&repeated).unwrap_err().to_string();
        assert!(e.starts_with("row 4: ") && e.contains("row 2"), "{e}");
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

    /// Rows equal in day, line item, account and amount are other figures when their
    /// organisation or hour differs — in one file or across files: all count.
    #[test]
    fn rows_of_other_organisations_or_hours_all_count() {
        let row = CSV.lines().nth(1).unwrap();
        let org_2 = format!(
            "{}\n{}\n",
            CSV.lines().next().unwrap(),
            row.replace("org_1", "org_2")
        );
        let both = read_files(&[("a.csv", CSV), ("b.csv", &org_2)]).unwrap();
        assert_eq!(both.lines.len(), 3);
        let hours = CSV
            .replace("1730419200,1730505600,0.06", "1730419200,1730422800,0.06")
            .replace(
                "1730419200,1730505600,1.0000005,usd,\"gpt-4o-mini-2024-07-18, output\",",
                "1730422800,1730426400,0.06,usd,\"gpt-4o-mini-2024-07-18, input\",proj_abc",
            );
        let lines = read(&hours).unwrap();
        assert_eq!(lines.len(), 2);
        assert!(lines
            .iter()
            .all(|l| l.micros == 60_000 && l.day == lines[0].day));
    }

    /// The days a download of CSV files covers are its rows'; a header-only file (days
    /// without spend) holds no date, so it names none.
    #[test]
    fn the_days_covered_are_the_rows() {
        let day = |n| NaiveDate::from_ymd_opt(2024, 11, n).unwrap();
        let later = CSV.replace("1730419200,1730505600", "1730592000,1730678400");
        let header = CSV.lines().next().unwrap();
        let read = read_files(&[("a.csv", CSV), ("h.csv", header), ("b.csv", &later)]).unwrap();
        assert_eq!(read.days, Some((day(1), day(3))));
        assert!(read_files(&[("h.csv", header)]).is_err());
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
            e(&other).starts_with("row 3: ") && e(&other).contains("also row 2"),
            "{}",
            e(&other)
        );
        // A row past its start's UTC day (a week's) would land whole on its first day.
        let week = CSV.replace("1730419200,1730505600,0.06", "1730419200,1731024000,0.06");
        assert!(e(&week).contains("row 2, end_time"), "{}", e(&week));
        assert!(e("start_time,amount_value,line_item\n").contains("no rows"));
    }
}
