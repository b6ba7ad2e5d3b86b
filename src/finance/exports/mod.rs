//! Providers' cost exports read into one form: a `Line` per (UTC day, model, account)
//! figure, amounts in exact micro-dollars (`finance::decimal`). A file that cannot be read
//! is an `ExportError` naming the problem and where it is (a line and column from the JSON
//! parser, or the field's path). Both providers page their exports alike (`data[]` of time
//! buckets, `has_more`); `walk` reads the pages and checks that none is missing, each
//! provider's module its bucket.

pub mod anthropic;
pub mod openai;
pub mod openai_csv;
pub mod openai_usage;

use std::collections::HashMap;

use chrono::{DateTime, Duration, NaiveDate, NaiveTime, Utc};
use serde::Deserialize;

/// One figure of a provider's bill.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Line {
    pub day: NaiveDate,
    /// The model as the provider names it.
    pub model: String,
    /// The account ids this figure could belong to, most specific first (an OpenAI API key
    /// id, then its project; an Anthropic workspace); empty for the organisation's default.
    pub accounts: Vec<String>,
    /// Which of OpenAI's account fields the figure names (`reconcile::ungrouped`).
    pub named: Named,
    pub micros: i64,
}

/// Which of OpenAI's account fields a figure names — the export was grouped by them:
/// `api_key` its `api_key_id` (then `accounts[0]`), `project` its `project_id` (then the
/// last of `accounts`). Anthropic's figures name neither (a workspace is their account).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Named {
    pub api_key: bool,
    pub project: bool,
}

impl Named {
    /// Of a figure whose `api_key_id` and `project_id` are these.
    pub fn of(api_key: Option<&str>, project: Option<&str>) -> Named {
        Named {
            api_key: api_key.is_some(),
            project: project.is_some(),
        }
    }

    /// The fields either names: what some figure of a part names.
    pub fn or(self, other: Named) -> Named {
        Named {
            api_key: self.api_key || other.api_key,
            project: self.project || other.project,
        }
    }
}

/// A figure of an export: which of OpenAI's account fields it names.
pub trait Figure {
    fn named(&self) -> Named;
}

impl Figure for Line {
    fn named(&self) -> Named {
        self.named
    }
}

/// One part of a download that a single query produced — a JSON page (one API response),
/// a CSV file (one dashboard export) — and the account fields some figure of it names.
/// Parts are grouped independently (pages of two queries, files of two exports), so the
/// grouping is judged per part (`reconcile::ungrouped`); a part without figures (a page of
/// days without spend) makes no claim and is not listed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Part {
    /// Where it is, as errors name it: `{file}: page N`, or a CSV's file.
    pub place: String,
    pub named: Named,
}

/// A download's figures, its parts (`Part`), and the days it covers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Figures<T> {
    pub lines: Vec<T>,
    pub parts: Vec<Part>,
    /// Its first and last UTC day: of every bucket (a JSON page's, empty ones included: a
    /// day the provider billed nothing is a day the export covers) or CSV row; `None` when
    /// it has none. What is compared (`run::reconcile_file`), not the figures' days: an
    /// empty first or last day would drop Sluice's spend on it from the comparison.
    pub days: Option<(NaiveDate, NaiveDate)>,
}

/// `days` widened to hold `day`.
pub(crate) fn covering(
    days: Option<(NaiveDate, NaiveDate)>,
    day: NaiveDate,
) -> Option<(NaiveDate, NaiveDate)> {
    Some(days.map_or((day, day), |(first, last)| (first.min(day), last.max(day))))
}

#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct ExportError(pub String);

impl ExportError {
    pub fn at(path: &str, what: impl std::fmt::Display) -> ExportError {
        ExportError(format!("{path}: {what}"))
    }
}

/// One page of a paginated cost export: its buckets, and whether the API had more.
#[derive(Deserialize)]
struct Page<B> {
    data: Vec<B>,
    has_more: Option<bool>,
}

/// A provider's bucket (one time slice of a page) as the walker reads it.
pub(crate) trait Bucket {
    /// The bucket's start as the export writes it: two buckets with one start are one.
    fn start(&self) -> String;
    /// Its end, written as the starts are (the next bucket's start), when the export gives
    /// it: how a page's successor is known (`successors`).
    fn end(&self) -> Option<String>;
    /// The fields its start and its end are in, as errors name them.
    const START: &'static str;
    const END: &'static str;
    /// A start or end as the export writes it (`start`, `end`) as a UTC instant; `None`
    /// when it is not a time.
    fn instant(written: &str) -> Option<DateTime<Utc>>;
    /// What one figure of it reads into: a `Line` of a cost export, a `TokenLine` of a
    /// usage export (`openai_usage`).
    type Item: Clone + PartialEq + Figure;
    /// Its figures, each of `day` (its start's UTC day, `day_of`); `at` is its path in the
    /// file, for errors.
    fn lines(self, at: &str, day: NaiveDate) -> Result<Vec<Self::Item>, ExportError>;
}

/// The UTC day of a bucket starting at `start` and ending at `end` (as the export writes
/// them; `at` is its path in the file). The bucket must lie within that day, as a CSV row
/// must (`ends_in_its_day`): a bucket of several days (a week's), or a day's starting off
/// UTC midnight (a query from local midnight, an Anthropic `starting_at` with an offset),
/// would land whole on its start's day, where Sluice's spend is only that day's. An
/// hour's is part of its day; a bucket without an end is its start's day.
fn day_of<B: Bucket>(at: &str, start: &str, end: Option<&str>) -> Result<NaiveDate, ExportError> {
    let (start_field, end_field) = (format!("{at}.{}", B::START), format!("{at}.{}", B::END));
    let from = B::instant(start)
        .ok_or_else(|| ExportError::at(&start_field, format!("`{start}` is not a time")))?;
    if let Some(end) = end {
        let to = B::instant(end)
            .ok_or_else(|| ExportError::at(&end_field, format!("`{end}` is not a time")))?;
        if !ends_in_its_day(from, to) {
            return Err(ExportError::at(
                &end_field,
                format!(
                    "`{end}`: a bucket must lie within its start's UTC day ({}; {} is {}), else its figures land whole on that day — query with a UTC-midnight {} and a 1-day (or 1-hour) bucket width",
                    from.date_naive(),
                    B::START,
                    from.to_rfc3339(),
                    B::START,
                ),
            ));
        }
    }
    Ok(from.date_naive())
}

/// Whether a slice of the bill from `start` to `end` lies within `start`'s UTC day: it
/// does not end before it starts nor after the next UTC midnight. The calendar's last day
/// has no next midnight: every later instant is in it (the run refuses that day, naming
/// it: `run::Download::log_span`).
pub(crate) fn ends_in_its_day(start: DateTime<Utc>, end: DateTime<Utc>) -> bool {
    let midnight = start
        .date_naive()
        .checked_add_signed(Duration::days(1))
        .map(|d| d.and_time(NaiveTime::MIN).and_utc());
    end >= start && midnight.is_none_or(|m| end <= m)
}

/// An OpenAI bucket's start or end (Unix seconds, as `Bucket::start` writes it) as an
/// instant: the Costs and the Usage API's alike.
pub(crate) fn openai_instant(written: &str) -> Option<DateTime<Utc>> {
    DateTime::from_timestamp(written.parse().ok()?, 0)
}

/// An OpenAI bucket's figures, the Costs and the Usage API's alike: each of `results` read
/// by `line` as a figure of `day`, named `{at}.results[j]` in errors.
pub(crate) fn openai_bucket_lines<R, L>(
    at: &str,
    day: NaiveDate,
    results: Vec<R>,
    line: impl Fn(&str, NaiveDate, R) -> Result<L, ExportError>,
) -> Result<Vec<L>, ExportError> {
    results
        .into_iter()
        .enumerate()
        .map(|(j, r)| line(&format!("{at}.results[{j}]"), day, r))
        .collect()
}

/// One file of a download: its name as errors give it ("" for a text of no file: then
/// errors begin with the position), and its text.
pub type File<'a> = (&'a str, &'a str);

/// `what` in `name` — `{name}: {what}`, or `what` alone for a text of no file.
pub(crate) fn in_file(name: &str, what: impl std::fmt::Display) -> String {
    if name.is_empty() {
        what.to_string()
    } else {
        format!("{name}: {what}")
    }
}

/// Every figure of the pages in `text` (`walk_files` of one unnamed text).
pub(crate) fn walk<'a, B>(text: &'a str) -> Result<Vec<B::Item>, ExportError>
where
    B: Bucket + Deserialize<'a>,
{
    walk_files::<B>(&[("", text)]).map(|f| f.lines)
}

/// Every figure of the pages in `files`, one download (`pages` of each file, in the order
/// given; a page's successor may be in another file). An error names the file it is in and
/// the position inside it: its parser's line and column, or `page N` counted in that file.
/// A download whose last page (`latest`)
/// says `has_more: true` is incomplete: comparing it would report the missing days' spend as
/// clean, so it is refused. A bucket given twice — a page saved twice — counts once when its
/// figures are the same and is refused when they differ (which one is the bill?). Each
/// bucket must lie within its start's UTC day (`day_of`). Each page with figures is a
/// `Part`; every bucket's day is a day the download covers (`Figures::days`).
pub(crate) fn walk_files<'a, B>(files: &[File<'a>]) -> Result<Figures<B::Item>, ExportError>
where
    B: Bucket + Deserialize<'a>,
{
    // Each page with its place: `{file}: page N`, N counted in its file.
    let mut pages: Vec<(String, Page<B>)> = Vec::new();
    for (name, text) in files {
        let of_file = self::pages::<Page<B>>(text).map_err(|e| ExportError(in_file(name, e)))?;
        for (n, page) in of_file.into_iter().enumerate() {
            pages.push((in_file(name, format!("page {}", n + 1)), page));
        }
    }
    if pages.is_empty() {
        let names: Vec<&str> = files.iter().map(|f| f.0).collect();
        return Err(ExportError(in_file(
            &names.join(", "),
            "not a cost export: the file is empty",
        )));
    }
    let last = latest(&pages);
    if let Some((place, page)) = pages.get(last) {
        if page.has_more == Some(true) {
            return Err(ExportError(format!(
                "{place}: `has_more` is true — the export is incomplete; save every page of the download (the last one says `has_more: false`)"
            )));
        }
    }
    let continuity = successors(&pages);
    let mut seen: HashMap<String, Vec<B::Item>> = HashMap::new();
    let mut lines = Vec::new();
    let mut parts = Vec::new();
    let mut days = None;
    for (place, page) in pages {
        let mut named: Option<Named> = None;
        for (i, bucket) in page.data.into_iter().enumerate() {
            let at = format!("{place}, data[{i}]");
            let start = bucket.start();
            let day = day_of::<B>(&at, &start, bucket.end().as_deref())?;
            days = covering(days, day);
            let figures = bucket.lines(&at, day)?;
            for f in &figures {
                named = Some(named.unwrap_or_default().or(f.named()));
            }
            match seen.get(&start) {
                Some(before) if *before == figures => continue,
                Some(_) => {
                    return Err(ExportError::at(
                        &at,
                        format!(
                            "the bucket starting at {start} appears twice with different figures"
                        ),
                    ))
                }
                None => {}
            }
            lines.extend(figures.iter().cloned());
            seen.insert(start, figures);
        }
        if let Some(named) = named {
            parts.push(Part { place, named });
        }
    }
    continuity?;
    Ok(Figures { lines, parts, days })
}

/// The index of the download's last page: the one holding the latest bucket (pages may
/// come in any order — files named `page-10` and `page-2` come in the shell's), else the
/// last given. Starts compare as the export writes them: Unix seconds by length, then
/// digits; RFC 3339 times as text.
fn latest<B: Bucket>(pages: &[(String, Page<B>)]) -> usize {
    pages
        .iter()
        .enumerate()
        .filter_map(|(i, (_, p))| p.data.last().map(|b| (i, b.start())))
        .max_by(|(_, a), (_, b)| (a.len(), a).cmp(&(b.len(), b)))
        .map_or(pages.len().saturating_sub(1), |(i, _)| i)
}

/// Every page that says `has_more` has its successor in the file: a page whose first
/// bucket starts where its last bucket ends. Both providers' daily buckets are
/// consecutive, days without spend included, and a page ends on a bucket, so a missing
/// middle page shows as a gap here — where it would otherwise read as days without spend
/// and flag them. The cursor (`next_page`) cannot tell: a page does not carry the cursor
/// it was fetched with. A page may be given twice (its successor is anywhere in the
/// file); a page without buckets or an end makes no claim. Checked after the buckets, so a bucket given twice with other
/// figures is named as such first.
fn successors<B: Bucket>(pages: &[(String, Page<B>)]) -> Result<(), ExportError> {
    let starts: Vec<String> = pages
        .iter()
        .filter_map(|(_, p)| p.data.first().map(Bucket::start))
        .collect();
    for (place, page) in pages {
        if page.has_more != Some(true) {
            continue;
        }
        let Some(end) = page.data.last().and_then(Bucket::end) else {
            continue;
        };
        if !starts.contains(&end) {
            return Err(ExportError(format!(
                "{place}: `has_more` is true but no page of the file starts at {end}, where it ends — a page of the download is missing; save every page"
            )));
        }
    }
    Ok(())
}

/// The JSON documents in `text` (one file): one page, several pages one after another (as
/// saved from a paginated API, one per line or not), or an array of pages; none in a file
/// of whitespace.
fn pages<'a, P: Deserialize<'a>>(text: &'a str) -> Result<Vec<P>, ExportError> {
    let bad = |e: serde_json::Error| ExportError(format!("not a cost export: {e}"));
    if text.trim_start().starts_with('[') {
        serde_json::from_str(text).map_err(bad)
    } else {
        serde_json::Deserializer::from_str(text)
            .into_iter::<P>()
            .collect::<Result<_, _>>()
            .map_err(bad)
    }
}

/// `gpt-4o-mini-2024-07-18` and `claude-3-5-haiku-20241022` name the model of the route
/// `gpt-4o-mini` / `claude-3-5-haiku`: a trailing snapshot date is not part of the name
/// reconciliation compares (a provider bills the snapshot an alias resolved to). Nor are
/// the aliases' own endings, `-latest` and Anthropic's `-0` (`claude-sonnet-4-0` is billed
/// as `claude-sonnet-4-20250514`): a route naming an alias never met its bill, both sides
/// flagged every day (s24 attack, finance F6).
pub fn base_model(name: &str) -> &str {
    if let Some(alias) = name.strip_suffix("-latest") {
        return alias;
    }
    if let Some(major) = name
        .strip_suffix("-0")
        .filter(|m| m.starts_with("claude-") && m.as_bytes().last().is_some_and(u8::is_ascii_digit))
    {
        return major;
    }
    let b = name.as_bytes();
    let digits = |s: &[u8]| s.iter().all(u8::is_ascii_digit);
    let n = b.len();
    // -YYYY-MM-DD
    if n > 11
        && b[n - 11] == b'-'
        && digits(&b[n - 10..n - 6])
        && b[n - 6] == b'-'
        && digits(&b[n - 5..n - 3])
        && b[n - 3] == b'-'
        && digits(&b[n - 2..])
    {
        return &name[..n - 11];
    }
    // -YYYYMMDD
    if n > 9 && b[n - 9] == b'-' && digits(&b[n - 8..]) && (b[n - 8] == b'1' || b[n - 8] == b'2') {
        return &name[..n - 9];
    }
    name
}

#[cfg(test)]
mod tests {
    use super::base_model;

    #[test]
    fn snapshot_dates_are_not_part_of_the_name() {
        assert_eq!(base_model("gpt-4o-mini-2024-07-18"), "gpt-4o-mini");
        assert_eq!(base_model("claude-3-5-haiku-20241022"), "claude-3-5-haiku");
        assert_eq!(base_model("gpt-4o-mini"), "gpt-4o-mini");
        assert_eq!(base_model("o1"), "o1");
        assert_eq!(
            base_model("text-embedding-3-small"),
            "text-embedding-3-small"
        );
    }

    /// A route naming an alias meets the snapshot it is billed as.
    #[test]
    fn an_alias_meets_the_snapshot_it_is_billed_as() {
        for (alias, billed) in [
            ("claude-3-5-haiku-latest", "claude-3-5-haiku-20241022"),
            ("claude-sonnet-4-0", "claude-sonnet-4-20250514"),
            ("claude-opus-4-0", "claude-opus-4-20250514"),
            ("claude-opus-4-1", "claude-opus-4-1-20250805"),
            ("chatgpt-4o-latest", "chatgpt-4o-latest"),
        ] {
            assert_eq!(base_model(alias), base_model(billed), "{alias}");
        }
        // A version that merely ends in 0 is its own model.
        assert_eq!(base_model("claude-opus-4-1"), "claude-opus-4-1");
        assert_eq!(base_model("gpt-4-0613"), "gpt-4-0613");
    }
}
