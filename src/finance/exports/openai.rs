//! OpenAI's Costs API (`GET /v1/organization/costs`, saved as JSON): pages of daily
//! buckets (`data[].start_time`, Unix seconds), each with `results[]` of
//! `amount.value` (USD, a JSON number read from its text: exact), `line_item`
//! (`"<model>, <kind>"`; the export must be grouped by `line_item` so each figure names its
//! model), `project_id` and `api_key_id` (when grouped by them).

use serde::Deserialize;
use serde_json::value::RawValue;

use super::{self as exports, walk, ExportError, Figures, Line};
use crate::finance::decimal;

#[derive(Deserialize)]
struct Bucket<'a> {
    start_time: i64,
    end_time: Option<i64>,
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
    walk::<Bucket>(text)
}

/// The pages of one download saved as `files` (`exports::walk_files`), each a `Part`.
pub fn read_files(files: &[exports::File]) -> Result<Figures<Line>, ExportError> {
    exports::walk_files::<Bucket>(files)
}

impl exports::Bucket for Bucket<'_> {
    fn start(&self) -> String {
        self.start_time.to_string()
    }

    fn end(&self) -> Option<String> {
        self.end_time.map(|t| t.to_string())
    }

    const START: &'static str = "start_time";
    const END: &'static str = "end_time";

    fn instant(written: &str) -> Option<chrono::DateTime<chrono::Utc>> {
        exports::openai_instant(written)
    }

    type Item = Line;

    fn lines(self, at: &str, day: chrono::NaiveDate) -> Result<Vec<Line>, ExportError> {
        exports::openai_bucket_lines(at, day, self.results, line)
    }
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
        named: exports::Named::of(cost.api_key_id.as_deref(), cost.project_id.as_deref()),
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
                    named: exports::Named::of(None, Some("proj_abc")),
                    micros: 60_000
                },
                Line {
                    day,
                    model: "gpt-4o-mini-2024-07-18".into(),
                    accounts: vec![],
                    named: exports::Named::default(),
                    micros: 1_000_001
                },
            ]
        );
        // Two pages one after another, and an array of them, read alike.
        let next = PAGE.replace("1730419200", "1730505600");
        assert_eq!(read(&format!("{PAGE}\n{next}")).unwrap().len(), 4);
        assert_eq!(read(&format!("[{PAGE},{next}]")).unwrap().len(), 4);
    }

    #[test]
    fn an_incomplete_or_repeated_download_is_caught() {
        let first = PAGE.replace("\"has_more\":false", "\"has_more\":true");
        let e = read(&first).unwrap_err().to_string();
        assert!(e.contains("has_more"), "{e}");
        // The first page, then the last: complete — in either order (files named page-10
        // and page-2 come in the shell's order, not the download's).
        let next = PAGE.replace("1730419200", "1730505600");
        assert_eq!(read(&format!("{first}\n{next}")).unwrap().len(), 4);
        assert_eq!(read(&format!("{next}\n{first}")).unwrap().len(), 4);
        // The same page twice counts once; the same bucket with other figures is refused.
        assert_eq!(read(&format!("{first}\n{first}\n{next}")).unwrap().len(), 4);
        let other = PAGE.replace("0.06", "0.07");
        let e = read(&format!("{first}\n{other}")).unwrap_err().to_string();
        assert!(e.contains("page 2, data[0]") && e.contains("twice"), "{e}");
    }

    /// A page that says `has_more` is followed, somewhere in the file, by the page that
    /// starts where it ends (each page's buckets are consecutive days, empty ones
    /// included): a middle page missing is named, not read as days without spend.
    #[test]
    fn a_missing_middle_page_is_named() {
        let day = |n: i64| (1730419200 + 86_400 * n).to_string();
        let page = |n: i64, more: bool| {
            PAGE.replace("1730505600", &day(n + 1))
                .replace("1730419200", &day(n))
                .replace("\"has_more\":false", &format!("\"has_more\":{more}"))
        };
        let (one, two, three) = (page(0, true), page(1, true), page(2, false));
        assert_eq!(read(&format!("{one}\n{two}\n{three}")).unwrap().len(), 6);
        let e = read(&format!("{one}\n{three}")).unwrap_err().to_string();
        assert!(e.starts_with("page 1:") && e.contains(&day(1)), "{e}");
        // A page saved twice is still followed by its successor.
        assert_eq!(
            read(&format!("{one}\n{one}\n{two}\n{three}"))
                .unwrap()
                .len(),
            6
        );
    }

    /// Each page with figures is a part of the download, named with its file and place
    /// and what its figures name; a page of empty buckets is none.
    #[test]
    fn each_page_with_figures_is_a_part() {
        let keyed = PAGE
            .replace("\"has_more\":false", "\"has_more\":true")
            .replace(
                "\"project_id\":\"proj_abc\"",
                "\"project_id\":\"proj_abc\",\"api_key_id\":\"key_1\"",
            );
        let next = PAGE.replace("1730419200", "1730505600");
        let empty = r#"{"data":[{"start_time":1730592000,"end_time":1730678400,"results":[]}],"has_more":false}"#;
        let read =
            read_files(&[("a.json", &keyed), ("b.json", &format!("{next}\n{empty}"))]).unwrap();
        assert_eq!(read.lines.len(), 4);
        let parts: Vec<_> = read
            .parts
            .iter()
            .map(|p| (p.place.as_str(), p.named))
            .collect();
        assert_eq!(
            parts,
            vec![
                (
                    "a.json: page 1",
                    exports::Named::of(Some("key_1"), Some("proj_abc"))
                ),
                ("b.json: page 1", exports::Named::of(None, Some("proj_abc"))),
            ]
        );
    }

    /// A bucket is one UTC day or part of one, as a CSV row is: a week's bucket, or a day
    /// starting off UTC midnight (a query from local midnight), would land whole on its
    /// start's day. Refused naming the bucket and `end_time`; an hour's is part of its day.
    #[test]
    fn a_bucket_longer_than_its_utc_day_is_refused() {
        let start = 1730419200_i64;
        let with = |from: i64, to: i64| {
            PAGE.replace("1730505600", &to.to_string())
                .replace("1730419200", &from.to_string())
        };
        for (from, to) in [
            (start, start + 7 * 86_400),
            (start + 8 * 3_600, start + 32 * 3_600),
        ] {
            let e = read(&with(from, to)).unwrap_err().to_string();
            assert!(
                e.starts_with("page 1, data[0].end_time: ") && e.contains("UTC day"),
                "{e}"
            );
            assert!(e.contains("UTC-midnight start_time"), "{e}");
        }
        // Ending before it starts: not a slice of its day either.
        let e = read(&with(start, start - 1)).unwrap_err().to_string();
        assert!(e.contains("data[0].end_time"), "{e}");
        // A day, an hour, and the last hour of a day: accepted, on their start's day.
        for (from, to) in [
            (start, start + 86_400),
            (start + 3_600, start + 7_200),
            (start + 23 * 3_600, start + 86_400),
        ] {
            let lines = read(&with(from, to)).unwrap();
            assert!(
                lines
                    .iter()
                    .all(|l| l.day == chrono::NaiveDate::from_ymd_opt(2024, 11, 1).unwrap()),
                "{lines:?}"
            );
        }
    }

    /// The days a download covers are its buckets' — empty ones included (days without
    /// spend) — not its figures': Sluice's spend on an empty first or last day is compared.
    #[test]
    fn the_days_covered_are_the_buckets_empty_ones_included() {
        let day = |n: i64| (1730419200 + 86_400 * n).to_string();
        let empty = |n: i64| {
            format!(
                r#"{{"data":[{{"start_time":{},"end_time":{},"results":[]}}],"has_more":false}}"#,
                day(n),
                day(n + 1)
            )
        };
        let first = PAGE
            .replace("1730505600", &day(2))
            .replace("1730419200", &day(1))
            .replace("\"has_more\":false", "\"has_more\":true");
        let read = read_files(&[
            ("a.json", &empty(0).replace("false", "true")),
            ("b.json", &first),
            ("c.json", &empty(2)),
        ])
        .unwrap();
        let d = |n: u32| chrono::NaiveDate::from_ymd_opt(2024, 11, n).unwrap();
        assert!(read.lines.iter().all(|l| l.day == d(2)));
        assert_eq!(read.days, Some((d(1), d(3))));
        // Empty buckets only: their days, no figure; no bucket at all: no day.
        assert_eq!(
            read_files(&[("", &empty(0))]).unwrap().days,
            Some((d(1), d(1)))
        );
        let none = read_files(&[("", r#"{"data":[],"has_more":false}"#)]).unwrap();
        assert_eq!(none.days, None);
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
