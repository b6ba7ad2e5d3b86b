//! Spend reports over whole UTC days, read from the spend rollup only (never from
//! `requests`): grouped by any of team, user, token, model, upstream, a tag key, day, week
//! or month, and filtered by the same names. The rollup holds one row per day and every
//! dimension (the tags as the request's whole canonical text), added to in the
//! transaction that writes the request rows (`store::requests`, `pg::requests`), so a
//! report costs the same whatever the size of the request log; and the same per month
//! (`spend_months`, always the sum of its days: migration `0023`/`0012`), which a report
//! reads for the whole months of its range unless it groups by day or week (`Span`).
//!
//! The database sums per (day, team, user, token, model, upstream, tags) — only the
//! columns the report needs, the rest folded away — and this module groups those sums by
//! the report's dimensions in memory: a tag key's value (or `(untagged)`) is parsed from
//! the tag text here, with the exact rules that wrote it (`pipeline::tags`), so the rows of
//! a report by tag always add up to the total.

use std::collections::{BTreeMap, HashMap};

use chrono::{Datelike, NaiveDate};
use serde::Serialize;
use sqlx::{Database, Encode, FromRow, QueryBuilder, Type};

use super::Result;
use crate::tags::{self, Tags, OTHER};

/// The label of a request without the tag key a report groups by. (A value past the
/// rollup's daily bound reads as `tags::OTHER`, `(other)`: `store::tag_bound`.)
pub const UNTAGGED: &str = "(untagged)";

/// A dimension a report groups or filters by.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Dim {
    Team,
    User,
    Token,
    /// The model that answered, else the one asked for.
    Model,
    Upstream,
    Tag(String),
    Day,
    /// ISO week, `2026-W44`.
    Week,
    /// `2026-11`.
    Month,
}

impl Dim {
    pub fn parse(s: &str) -> Option<Dim> {
        Some(match s {
            "team" => Dim::Team,
            "user" => Dim::User,
            "token" => Dim::Token,
            "model" => Dim::Model,
            "upstream" => Dim::Upstream,
            "day" => Dim::Day,
            "week" => Dim::Week,
            "month" => Dim::Month,
            _ => {
                let key = s.strip_prefix("tag:")?;
                return tags::is_word(key).then(|| Dim::Tag(key.to_string()));
            }
        })
    }

    pub fn name(&self) -> String {
        match self {
            Dim::Team => "team".into(),
            Dim::User => "user".into(),
            Dim::Token => "token".into(),
            Dim::Model => "model".into(),
            Dim::Upstream => "upstream".into(),
            Dim::Tag(k) => format!("tag:{k}"),
            Dim::Day => "day".into(),
            Dim::Week => "week".into(),
            Dim::Month => "month".into(),
        }
    }

    fn is_time(&self) -> bool {
        matches!(self, Dim::Day | Dim::Week | Dim::Month)
    }
}

/// Filters: every one given must match. Team, user and token by id.
#[derive(Debug, Clone, Default)]
pub struct Filters {
    pub team: Option<i64>,
    pub user: Option<i64>,
    pub token: Option<i64>,
    pub model: Option<String>,
    pub upstream: Option<String>,
    /// `key:value` pairs the request's tags must all hold.
    pub tags: Vec<(String, String)>,
}

/// One report: `[from, to)` as `YYYY-MM-DD` UTC days; `scope` = `Some(team)` limits it
/// to one team (a lead's view) whatever the filters say.
#[derive(Debug, Clone)]
pub struct SpendQuery {
    pub from: NaiveDate,
    pub to: NaiveDate,
    pub group_by: Vec<Dim>,
    pub filters: Filters,
    pub scope: Option<i64>,
}

/// One row of a report: the value of each dimension, in `group_by` order, and its sums.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Group {
    pub keys: Vec<String>,
    pub requests: i64,
    pub input_tokens: i64,
    pub output_tokens: i64,
    pub spend_micros: i64,
    /// The part of `spend_micros` whose usage was estimated (`RequestRow::usage_estimated`):
    /// the cost of those requests, whole.
    pub estimated_micros: i64,
}

/// A row of the rollup, summed over the columns the report does not need.
#[derive(Debug, FromRow)]
struct Summed {
    /// The day, or the month of a row of `spend_months`.
    day: String,
    team_id: i64,
    user_id: i64,
    token_id: i64,
    model: String,
    upstream: String,
    tags: String,
    requests: i64,
    input_tokens: i64,
    output_tokens: i64,
    cost_micros: i64,
    estimated_micros: i64,
}

const MODEL: &str = "CASE WHEN served_model <> '' THEN served_model ELSE model END";

/// One read of the rollup: `[from, to)` from one of its levels, keyed `YYYY-MM-DD` or `YYYY-MM`.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Span {
    table: &'static str,
    column: &'static str,
    from: String,
    to: String,
}

impl Span {
    fn days(from: NaiveDate, to: NaiveDate) -> Span {
        let day = |d: NaiveDate| d.format("%Y-%m-%d").to_string();
        Span {
            table: "spend_days",
            column: "day",
            from: day(from),
            to: day(to),
        }
    }

    /// The report's range split into leading days, whole months and trailing days (those
    /// not empty); the days alone when the report groups by day or week, or holds no whole
    /// month. The months' sums are their days' (`spend_months`), so the report is the same.
    fn of(q: &SpendQuery) -> Vec<Span> {
        let month_start = |d: NaiveDate| d.with_day(1).unwrap_or(d);
        let first = match q.from.day() {
            1 => q.from,
            _ => month_start(q.from)
                .checked_add_months(chrono::Months::new(1))
                .unwrap_or(q.to),
        };
        let last = month_start(q.to);
        let by_days = q.group_by.iter().any(|d| matches!(d, Dim::Day | Dim::Week));
        if by_days || first >= last {
            return vec![Span::days(q.from, q.to)];
        }
        let month = |d: NaiveDate| d.format("%Y-%m").to_string();
        let months = Span {
            table: "spend_months",
            column: "month",
            from: month(first),
            to: month(last),
        };
        [Span::days(q.from, first), months, Span::days(last, q.to)]
            .into_iter()
            .filter(|s| s.from < s.to)
            .collect()
    }
}

/// The statement on either engine (the same text, placeholders aside): one `SELECT` per
/// span, joined by `UNION ALL` so the report reads one snapshot of the rollup.
fn query<'a, DB: Database>(q: &SpendQuery) -> QueryBuilder<'a, DB>
where
    i64: Encode<'a, DB> + Type<DB>,
    String: Encode<'a, DB> + Type<DB>,
{
    let mut b = QueryBuilder::new("");
    for (i, span) in Span::of(q).iter().enumerate() {
        if i > 0 {
            b.push(" UNION ALL ");
        }
        select(&mut b, q, span);
    }
    b
}

/// One span's `SELECT`, summed over the columns the report needs.
fn select<'a, DB: Database>(b: &mut QueryBuilder<'a, DB>, q: &SpendQuery, span: &Span)
where
    i64: Encode<'a, DB> + Type<DB>,
    String: Encode<'a, DB> + Type<DB>,
{
    let needs = |f: &dyn Fn(&Dim) -> bool| q.group_by.iter().any(f);
    let time = needs(&|d| d.is_time());
    let tagged = needs(&|d| matches!(d, Dim::Tag(_))) || !q.filters.tags.is_empty();
    // The ids are grouped as `+id`, an expression: SQLite then reads the day range in key
    // order and groups in a temporary table, instead of walking the `(team_id, day)` index
    // for the grouping's order and looking every row up (ten times slower over a year).
    let cols = [
        (span.column, time, "''"),
        ("+team_id", needs(&|d| *d == Dim::Team), "CAST(0 AS BIGINT)"),
        (
            "+user_id",
            needs(&|d| matches!(d, Dim::User | Dim::Token)),
            "CAST(0 AS BIGINT)",
        ),
        (
            "+token_id",
            needs(&|d| *d == Dim::Token),
            "CAST(0 AS BIGINT)",
        ),
        (MODEL, needs(&|d| *d == Dim::Model), "''"),
        ("upstream", needs(&|d| *d == Dim::Upstream), "''"),
        ("tags", tagged, "''"),
    ];
    let names = [
        "day", "team_id", "user_id", "token_id", "model", "upstream", "tags",
    ];
    b.push("SELECT ");
    for ((expr, used, constant), name) in cols.iter().zip(names) {
        b.push(if *used { expr } else { constant })
            .push(format!(" AS {name}, "));
    }
    b.push(
        "CAST(SUM(requests) AS BIGINT) AS requests, CAST(SUM(input_tokens) AS BIGINT) AS input_tokens,
         CAST(SUM(output_tokens) AS BIGINT) AS output_tokens, CAST(SUM(cost_micros) AS BIGINT) AS cost_micros,
         CAST(SUM(estimated_micros) AS BIGINT) AS estimated_micros
         FROM ",
    )
    .push(format!("{} WHERE {} >= ", span.table, span.column))
    .push_bind(span.from.clone())
    .push(format!(" AND {} < ", span.column))
    .push_bind(span.to.clone());
    let f = &q.filters;
    for (col, v) in [
        ("team_id", q.scope),
        ("team_id", f.team),
        ("user_id", f.user),
        ("token_id", f.token),
    ] {
        if let Some(v) = v {
            b.push(format!(" AND {col} = ")).push_bind(v);
        }
    }
    if let Some(m) = &f.model {
        b.push(format!(" AND {MODEL} = ")).push_bind(m.clone());
    }
    if let Some(u) = &f.upstream {
        b.push(" AND upstream = ").push_bind(u.clone());
    }
    // A coarse pre-filter (SQLite's LIKE ignores ASCII case); `fit` decides exactly. A
    // pair rolled up by the daily bound (`key:(other)`, `(other):(other)`) is read too:
    // the report says how much spend it could not place (`Rows::rolled_up`).
    let other = format!("%,{OTHER}:{OTHER},%");
    for (k, v) in &f.tags {
        b.push(" AND (");
        for (i, pattern) in [
            format!("%,{k}:{v},%"),
            format!("%,{k}:{OTHER},%"),
            other.clone(),
        ]
        .into_iter()
        .enumerate()
        {
            if i > 0 {
                b.push(" OR ");
            }
            b.push("',' || tags || ',' LIKE ")
                .push_bind(pattern.replace('_', "\\_"))
                .push(" ESCAPE '\\'");
        }
        b.push(")");
    }
    let grouped: Vec<&str> = cols
        .iter()
        .filter(|(_, used, _)| *used)
        .map(|(expr, _, _)| *expr)
        .collect();
    if !grouped.is_empty() {
        b.push(format!(" GROUP BY {}", grouped.join(", ")));
    }
}

/// Names for ids: teams, users and tokens (`prefix… (user)`), read once per report.
#[derive(Default)]
struct Names {
    teams: HashMap<i64, String>,
    users: HashMap<i64, String>,
    tokens: HashMap<i64, String>,
}

async fn names(db: &super::Db, q: &SpendQuery) -> Result<Names> {
    let wants = |d: Dim| q.group_by.contains(&d);
    let mut n = Names::default();
    let lists: [(bool, &str); 3] = [
        (wants(Dim::Team), "SELECT id, name FROM teams"),
        (
            wants(Dim::User) || wants(Dim::Token),
            "SELECT id, username FROM users",
        ),
        (wants(Dim::Token), "SELECT id, prefix FROM tokens"),
    ];
    for (i, (wanted, sql)) in lists.into_iter().enumerate() {
        if !wanted {
            continue;
        }
        let rows: Vec<(i64, String)> = match &db.backend {
            super::Backend::Sqlite(s) => sqlx::query_as(sql).fetch_all(&s.read).await?,
            super::Backend::Postgres(pg) => sqlx::query_as(sql).fetch_all(&pg.pool).await?,
        };
        let map = match i {
            0 => &mut n.teams,
            1 => &mut n.users,
            _ => &mut n.tokens,
        };
        map.extend(rows);
    }
    Ok(n)
}

/// The key of one rollup row for one dimension.
fn key(d: &Dim, r: &Summed, tags: &Tags, n: &Names) -> String {
    let or = |m: &HashMap<i64, String>, id: i64, none: &str| {
        m.get(&id).cloned().unwrap_or_else(|| none.to_string())
    };
    let day = || NaiveDate::parse_from_str(&r.day, "%Y-%m-%d").ok();
    match d {
        Dim::Team => or(&n.teams, r.team_id, "no team"),
        Dim::User => or(&n.users, r.user_id, "no user"),
        Dim::Token => match n.tokens.get(&r.token_id) {
            Some(prefix) => format!("{prefix}… ({})", or(&n.users, r.user_id, "no user")),
            None => "no token".into(),
        },
        Dim::Model => r.model.clone(),
        Dim::Upstream => r.upstream.clone(),
        Dim::Tag(k) => tags.get(k).unwrap_or(UNTAGGED).to_string(),
        Dim::Day => r.day.clone(),
        Dim::Week => day().map_or_else(
            || r.day.clone(),
            |d| format!("{}-W{:02}", d.iso_week().year(), d.iso_week().week()),
        ),
        Dim::Month => r.day.get(..7).unwrap_or(&r.day).to_string(),
    }
}

/// How a rollup row's tags meet a tag filter.
#[derive(Debug, PartialEq, Eq)]
enum Fit {
    /// Every pair of the filter.
    Exact,
    /// Every pair, or its key's value rolled up (`key:(other)`), or its key (`(other):
    /// (other)` without the key), with at least one rolled up: it may be the filter's.
    RolledUp,
    No,
}

fn fit(tags: &Tags, wanted: &[(String, String)]) -> Fit {
    let mut rolled_up = false;
    for (k, v) in wanted {
        match tags.get(k) {
            Some(have) if have == v => {}
            Some(OTHER) => rolled_up = true,
            None if tags.get(OTHER) == Some(OTHER) => rolled_up = true,
            _ => return Fit::No,
        }
    }
    if rolled_up {
        Fit::RolledUp
    } else {
        Fit::Exact
    }
}

/// A report's rows, and the spend a tag filter could not place.
#[derive(Debug, Default)]
pub struct Rows {
    pub groups: Vec<Group>,
    /// Requests and spend in range matching every other filter whose tags the daily bound
    /// rolled up where the filter looks (`store::tag_bound`): some of it may be the
    /// filter's, none of it is in `groups`. Zero without a tag filter.
    pub rolled_up: (i64, i64),
}

/// The report's rows (`report_rows`).
pub async fn report(db: &super::Db, q: &SpendQuery) -> Result<Vec<Group>> {
    Ok(report_rows(db, q).await?.groups)
}

/// The report's rows: ordered by their keys when the first dimension is a time, else
/// dearest first (then by keys). Sums are kept in i128 and reported saturated to i64.
pub async fn report_rows(db: &super::Db, q: &SpendQuery) -> Result<Rows> {
    let rows: Vec<Summed> = match &db.backend {
        super::Backend::Sqlite(s) => {
            let mut b = query::<sqlx::Sqlite>(q);
            b.build_query_as().fetch_all(&s.read).await?
        }
        super::Backend::Postgres(pg) => {
            let mut b = query::<sqlx::Postgres>(q);
            b.build_query_as().fetch_all(&pg.pool).await?
        }
    };
    let names = names(db, q).await?;
    let mut groups: BTreeMap<Vec<String>, [i128; 5]> = BTreeMap::new();
    let mut rolled_up = (0i128, 0i128);
    for r in &rows {
        let tags = Tags::stored(&r.tags);
        match fit(&tags, &q.filters.tags) {
            Fit::Exact => {}
            Fit::RolledUp => {
                rolled_up.0 += i128::from(r.requests);
                rolled_up.1 += i128::from(r.cost_micros);
                continue;
            }
            Fit::No => continue,
        }
        let keys = q
            .group_by
            .iter()
            .map(|d| key(d, r, &tags, &names))
            .collect();
        let sums = groups.entry(keys).or_default();
        for (s, v) in sums.iter_mut().zip([
            r.requests,
            r.input_tokens,
            r.output_tokens,
            r.cost_micros,
            r.estimated_micros,
        ]) {
            *s += i128::from(v);
        }
    }
    let clamp = |v: i128| i64::try_from(v).unwrap_or(if v < 0 { i64::MIN } else { i64::MAX });
    let mut out: Vec<Group> = groups
        .into_iter()
        .map(|(keys, [req, inp, outp, cost, estimated])| Group {
            keys,
            requests: clamp(req),
            input_tokens: clamp(inp),
            output_tokens: clamp(outp),
            spend_micros: clamp(cost),
            estimated_micros: clamp(estimated),
        })
        .collect();
    if !q.group_by.first().is_some_and(Dim::is_time) {
        out.sort_by(|a, b| {
            b.spend_micros
                .cmp(&a.spend_micros)
                .then_with(|| a.keys.cmp(&b.keys))
        });
    }
    Ok(Rows {
        groups: out,
        rolled_up: (clamp(rolled_up.0), clamp(rolled_up.1)),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(day: &str, tags: &str) -> Summed {
        Summed {
            day: day.into(),
            team_id: 1,
            user_id: 2,
            token_id: 3,
            model: "m".into(),
            upstream: "u".into(),
            tags: tags.into(),
            requests: 1,
            input_tokens: 0,
            output_tokens: 0,
            cost_micros: 0,
            estimated_micros: 0,
        }
    }

    #[test]
    fn dimensions_parse_by_name_and_tag_keys_by_the_tag_rules() {
        for name in [
            "team",
            "user",
            "token",
            "model",
            "upstream",
            "day",
            "week",
            "month",
            "tag:project",
        ] {
            assert_eq!(Dim::parse(name).map(|d| d.name()), Some(name.to_string()));
        }
        for bad in ["planet", "tag:", "tag:a b", "tag:a:b", "Team"] {
            assert_eq!(Dim::parse(bad), None, "{bad}");
        }
    }

    #[test]
    fn a_range_reads_its_whole_months_from_the_months_and_the_rest_from_the_days() {
        let spans = |from: &str, to: &str, by: Dim| {
            let day = |s: &str| NaiveDate::parse_from_str(s, "%Y-%m-%d").unwrap();
            let q = SpendQuery {
                from: day(from),
                to: day(to),
                group_by: vec![by],
                filters: Filters::default(),
                scope: None,
            };
            Span::of(&q)
                .into_iter()
                .map(|s| format!("{}:{}..{}", s.column, s.from, s.to))
                .collect::<Vec<_>>()
        };
        assert_eq!(
            spans("2026-01-15", "2026-04-03", Dim::Team),
            [
                "day:2026-01-15..2026-02-01",
                "month:2026-02..2026-04",
                "day:2026-04-01..2026-04-03"
            ]
        );
        assert_eq!(
            spans("2026-01-01", "2027-01-01", Dim::Month),
            ["month:2026-01..2027-01"]
        );
        // No whole month, or a grouping by day or week: the days alone.
        for (from, to, by) in [
            ("2026-01-02", "2026-02-28", Dim::Team),
            ("2026-01-01", "2026-01-31", Dim::Team),
            ("2026-01-01", "2027-01-01", Dim::Week),
            ("2026-01-01", "2027-01-01", Dim::Day),
        ] {
            assert_eq!(spans(from, to, by), [format!("day:{from}..{to}")]);
        }
    }

    #[test]
    fn weeks_are_iso_and_a_missing_tag_key_is_untagged() {
        let n = Names::default();
        let r = row("2027-01-01", "env:prod");
        let tags = Tags::stored(&r.tags);
        assert_eq!(key(&Dim::Week, &r, &tags, &n), "2026-W53");
        assert_eq!(key(&Dim::Month, &r, &tags, &n), "2027-01");
        assert_eq!(key(&Dim::Tag("env".into()), &r, &tags, &n), "prod");
        assert_eq!(key(&Dim::Tag("project".into()), &r, &tags, &n), UNTAGGED);
        assert_eq!(key(&Dim::Team, &r, &tags, &n), "no team");
        assert_eq!(fit(&tags, &[("env".into(), "prod".into())]), Fit::Exact);
        assert_eq!(
            fit(&tags, &[("env".into(), "Prod".into())]),
            Fit::No,
            "tags are case-sensitive"
        );
    }

    #[test]
    fn a_pair_rolled_up_may_be_the_filters_and_is_told_apart() {
        let want = |pairs: &[(&str, &str)]| -> Vec<(String, String)> {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        let fits = |stored: &str, pairs: &[(&str, &str)]| fit(&Tags::stored(stored), &want(pairs));
        let apollo = [("project", "apollo")];
        assert_eq!(fits("project:apollo", &apollo), Fit::Exact);
        assert_eq!(fits("project:(other)", &apollo), Fit::RolledUp, "its value");
        assert_eq!(
            fits("(other):(other),env:prod", &apollo),
            Fit::RolledUp,
            "its key"
        );
        assert_eq!(
            fits("env:prod", &apollo),
            Fit::No,
            "no such key, none rolled up"
        );
        assert_eq!(
            fits("project:hermes", &apollo),
            Fit::No,
            "another value admitted"
        );
        let both = [("env", "prod"), ("project", "apollo")];
        assert_eq!(fits("env:prod,project:(other)", &both), Fit::RolledUp);
        assert_eq!(
            fits("env:dev,project:(other)", &both),
            Fit::No,
            "one pair says no"
        );
        assert_eq!(fits("env:prod,project:apollo", &both), Fit::Exact);
    }
}
