//! Spend reports over whole UTC days — `from`/`to` (`[from, to)`, `YYYY-MM-DD`) or a
//! `month` — grouped by one or more of team, user, token, model, upstream, `tag:<key>`,
//! day, week and month (`group_by=tag:project,model`; the older `by=` names one), and
//! filtered by the same names (`team=<id>`, `user=<id>`, `token=<id>`, `model=`,
//! `upstream=`, `tag=key:value[,key:value]`); a spend-per-day chart drawn on the server as
//! inline SVG. One function (`report`) feeds the JSON API, the CSV and the page, read from
//! the rollup (`store::spend`).

use actix_web::http::header;
use actix_web::{web, HttpRequest, HttpResponse};
use askama::Template;
use chrono::{Datelike, Duration, NaiveDate};
use serde::Deserialize;

use super::actor::Actor;
use super::error::AdminError;
use super::input::de;
use super::input::Query;
use super::view::{self, filters, Chrome};
use crate::quota::pricing;
use crate::state::AppState;
use crate::store::spend::{self, Dim, Filters, Group, SpendQuery};
use crate::tags::Tags;

/// The longest report range: ten years of days.
const MAX_DAYS: i64 = 3660;
/// At most this many dimensions at once.
const MAX_DIMS: usize = 4;

#[derive(Debug, Default, Deserialize)]
pub struct ReportQuery {
    /// `YYYY-MM`; default: the current month (UTC). `from`/`to` win when given.
    #[serde(default, deserialize_with = "de::opt_text")]
    pub month: Option<String>,
    /// One dimension (the older name of `group_by`).
    #[serde(default, deserialize_with = "de::opt_text")]
    pub by: Option<String>,
    #[serde(default, deserialize_with = "de::opt_text")]
    pub group_by: Option<String>,
    /// `YYYY-MM-DD`, the first day in the report.
    #[serde(default, deserialize_with = "de::opt_text")]
    pub from: Option<String>,
    /// `YYYY-MM-DD`, the first day after it.
    #[serde(default, deserialize_with = "de::opt_text")]
    pub to: Option<String>,
    #[serde(default, deserialize_with = "de::opt_text")]
    pub team: Option<String>,
    #[serde(default, deserialize_with = "de::opt_text")]
    pub user: Option<String>,
    #[serde(default, deserialize_with = "de::opt_text")]
    pub token: Option<String>,
    #[serde(default, deserialize_with = "de::opt_text")]
    pub model: Option<String>,
    #[serde(default, deserialize_with = "de::opt_text")]
    pub upstream: Option<String>,
    #[serde(default, deserialize_with = "de::opt_text")]
    pub tag: Option<String>,
}

pub struct Report {
    pub from: NaiveDate,
    pub to: NaiveDate,
    /// The month asked for, when the range is one (`month=`).
    pub month: Option<String>,
    pub group_by: Vec<Dim>,
    pub rows: Vec<Group>,
    pub total_micros: i64,
    /// The part of `total_micros` whose usage was estimated (`Group::estimated_micros`).
    pub total_estimated_micros: i64,
    pub total_requests: i64,
    /// Requests and spend a tag filter could not place (`spend::Rows::rolled_up`).
    pub rolled_up: (i64, i64),
    /// Spend per day of the range, every day present.
    pub days: Vec<(NaiveDate, i64)>,
    /// The query string that gives this report again (for the CSV link).
    pub query: String,
    /// Asked with the older `by=`: JSON rows in their older shape (no `keys`).
    pub legacy: bool,
}

impl Report {
    /// The dimension names, joined by `,` (as `group_by` takes them).
    pub fn by(&self) -> String {
        let names: Vec<String> = self.group_by.iter().map(Dim::name).collect();
        names.join(",")
    }

    /// What the report covers, for headings and file names.
    pub fn span(&self) -> String {
        match &self.month {
            Some(m) => m.clone(),
            None => format!("{}..{}", self.from, self.to),
        }
    }
}

/// One row's label: its keys joined by ` / `.
pub fn label(g: &Group) -> String {
    g.keys.join(" / ")
}

fn id(name: &str, s: &Option<String>) -> Result<Option<i64>, AdminError> {
    s.as_deref()
        .map(|v| {
            v.parse()
                .map_err(|_| AdminError::invalid(format!("{name}: `{v}` is not an id")))
        })
        .transpose()
}

fn dims(q: &ReportQuery) -> Result<Vec<Dim>, AdminError> {
    const DIMS: &str = "team, user, token, model, upstream, tag:<key>, day, week or month";
    let text = q.group_by.as_deref().or(q.by.as_deref()).unwrap_or("token");
    let mut out: Vec<Dim> = Vec::new();
    for name in text.split(',').map(str::trim) {
        let d = Dim::parse(name).ok_or_else(|| {
            AdminError::invalid(format!("group_by: `{name}` is not one of {DIMS}"))
        })?;
        if out.contains(&d) {
            return Err(AdminError::invalid(format!(
                "group_by: `{name}` appears twice"
            )));
        }
        out.push(d);
    }
    if out.len() > MAX_DIMS {
        return Err(AdminError::invalid(format!(
            "group_by: at most {MAX_DIMS} dimensions"
        )));
    }
    Ok(out)
}

/// The range: `from`/`to` when given (both), else the month (default: this one).
fn range(
    state: &AppState,
    q: &ReportQuery,
) -> Result<(NaiveDate, NaiveDate, Option<String>), AdminError> {
    match (&q.from, &q.to) {
        (Some(f), Some(t)) => {
            let (from, to) = (view::parse_date("from", f)?, view::parse_date("to", t)?);
            if to <= from || (to - from).num_days() > MAX_DAYS {
                return Err(AdminError::invalid(format!(
                    "to must be after from, by at most {MAX_DAYS} days"
                )));
            }
            Ok((from, to, None))
        }
        (None, None) => {
            let month = q
                .month
                .clone()
                .unwrap_or_else(|| state.clock.now().format("%Y-%m").to_string());
            let (first, _, _) = view::month_range(&month)?;
            let next = first
                .checked_add_months(chrono::Months::new(1))
                .ok_or_else(|| AdminError::invalid("month out of range"))?;
            Ok((first, next, Some(month)))
        }
        _ => Err(AdminError::invalid("from and to go together")),
    }
}

/// The filters; a lead's view is limited to their team by `scope` as well.
fn filters_of(q: &ReportQuery) -> Result<Filters, AdminError> {
    let tags = match &q.tag {
        None => Vec::new(),
        Some(t) => {
            let parsed = Tags::parse(t).map_err(|e| AdminError::invalid(format!("tag: {e}")))?;
            parsed
                .canonical()
                .split(',')
                .filter_map(|p| p.split_once(':'))
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        }
    };
    // A NUL cannot be in a name (PostgreSQL's text cannot hold one): refused alike on
    // both engines rather than a store error on one.
    let name = |field: &str, v: &Option<String>| match v {
        Some(v) if v.contains('\0') => Err(AdminError::invalid(format!(
            "{field}: a NUL character is not allowed"
        ))),
        _ => Ok(v.clone()),
    };
    Ok(Filters {
        team: id("team", &q.team)?,
        user: id("user", &q.user)?,
        token: id("token", &q.token)?,
        model: name("model", &q.model)?,
        upstream: name("upstream", &q.upstream)?,
        tags,
    })
}

/// The query string of a report, from what was asked (URL-encoded).
fn query_string(
    q: &ReportQuery,
    month: &Option<String>,
    r: (&NaiveDate, &NaiveDate),
    by: &str,
) -> String {
    let mut pairs: Vec<(&str, String)> = match month {
        Some(m) => vec![("month", m.clone())],
        None => vec![("from", r.0.to_string()), ("to", r.1.to_string())],
    };
    pairs.push(("group_by", by.to_string()));
    for (k, v) in [
        ("team", &q.team),
        ("user", &q.user),
        ("token", &q.token),
        ("model", &q.model),
        ("upstream", &q.upstream),
        ("tag", &q.tag),
    ] {
        if let Some(v) = v {
            pairs.push((k, v.clone()));
        }
    }
    let mut ser = url::form_urlencoded::Serializer::new(String::new());
    ser.extend_pairs(pairs);
    ser.finish()
}

pub async fn report(
    state: &AppState,
    actor: &Actor,
    q: &ReportQuery,
) -> Result<Report, AdminError> {
    let group_by = dims(q)?;
    let (from, to, month) = range(state, q)?;
    let mut sq = SpendQuery {
        from,
        to,
        group_by,
        filters: filters_of(q)?,
        scope: actor.scope(),
    };
    let spend::Rows {
        groups: rows,
        rolled_up,
    } = spend::report_rows(&state.db, &sq).await?;
    let group_by = std::mem::replace(&mut sq.group_by, vec![Dim::Day]);
    let per_day = spend::report(&state.db, &sq).await?;
    let mut days = Vec::new();
    let mut d = from;
    while d < to {
        let key = d.format("%Y-%m-%d").to_string();
        let spend = per_day
            .iter()
            .find(|r| r.keys.first() == Some(&key))
            .map_or(0, |r| r.spend_micros);
        days.push((d, spend));
        d += Duration::days(1);
    }
    let by: Vec<String> = group_by.iter().map(Dim::name).collect();
    let query = query_string(q, &month, (&from, &to), &by.join(","));
    Ok(Report {
        total_micros: rows.iter().map(|r| r.spend_micros).sum(),
        total_estimated_micros: rows.iter().map(|r| r.estimated_micros).sum(),
        total_requests: rows.iter().map(|r| r.requests).sum(),
        rolled_up,
        from,
        to,
        month,
        group_by,
        rows,
        days,
        query,
        legacy: q.group_by.is_none() && q.by.is_some(),
    })
}

/// The report as JSON: its rows (each with its `keys` in `group_by` order, their `label`
/// and its `estimated_micros`; asked with `by=`, the label only, as before), totals (the
/// estimated part of the spend too), what a tag filter could not place (`rolled_up_…`)
/// and the spend of every day.
pub fn to_json(r: &Report) -> serde_json::Value {
    let rows: Vec<serde_json::Value> = r
        .rows
        .iter()
        .map(|g| {
            let mut row = serde_json::json!({"label": label(g), "requests": g.requests,
                "input_tokens": g.input_tokens, "output_tokens": g.output_tokens, "spend_micros": g.spend_micros});
            if !r.legacy {
                row["keys"] = serde_json::json!(g.keys);
                row["estimated_micros"] = serde_json::json!(g.estimated_micros);
            }
            row
        })
        .collect();
    let group_by: Vec<String> = r.group_by.iter().map(Dim::name).collect();
    serde_json::json!({
        "month": r.month, "from": r.from.to_string(), "to": r.to.to_string(),
        "by": r.by(), "group_by": group_by, "rows": rows,
        "total_micros": r.total_micros, "total_estimated_micros": r.total_estimated_micros,
        "total_requests": r.total_requests,
        "rolled_up_requests": r.rolled_up.0, "rolled_up_micros": r.rolled_up.1,
        "days": r.days.iter().map(|(d, s)| serde_json::json!({"day": d.format("%Y-%m-%d").to_string(), "spend_micros": s})).collect::<Vec<_>>(),
    })
}

/// The CSV of a report: one column per dimension, then the sums (the estimated spend
/// last); the table's rows.
pub fn to_csv(r: &Report) -> String {
    let head: Vec<String> = r.group_by.iter().map(|d| csv_cell(&d.name())).collect();
    let mut out = format!(
        "{},requests,input_tokens,output_tokens,spend_usd,estimated_usd\n",
        head.join(",")
    );
    for row in &r.rows {
        let keys: Vec<String> = row.keys.iter().map(|k| csv_cell(k)).collect();
        out.push_str(&format!(
            "{},{},{},{},{},{}\n",
            keys.join(","),
            row.requests,
            row.input_tokens,
            row.output_tokens,
            pricing::usd(row.spend_micros),
            pricing::usd(row.estimated_micros)
        ));
    }
    out
}

/// Quotes a cell when needed, and defuses text a spreadsheet would run as a formula.
fn csv_cell(s: &str) -> String {
    let s = if s.starts_with(['=', '+', '-', '@', '\t', '\r']) {
        format!("'{s}")
    } else {
        s.to_string()
    };
    if s.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s
    }
}

/// One bar of the chart, in SVG user units.
pub struct Bar {
    pub x: i64,
    pub y: i64,
    pub w: i64,
    pub h: i64,
    pub day: u32,
    pub title: String,
}

pub struct Chart {
    pub bars: Vec<Bar>,
    pub max_label: String,
    pub half_label: String,
    pub width: i64,
    pub height: i64,
    pub base: i64,
    pub left: i64,
}

pub fn chart(days: &[(NaiveDate, i64)]) -> Chart {
    let (width, height, left, top, bottom) = (760i64, 240i64, 70i64, 10i64, 30i64);
    let max = days.iter().map(|d| d.1).max().unwrap_or(0).max(1);
    let plot_h = height - top - bottom;
    let n = days.len().max(1) as i64;
    let slot = (width - left - 10) / n;
    let bars = days
        .iter()
        .enumerate()
        .map(|(i, (d, spend))| {
            let h = if *spend > 0 {
                (spend.saturating_mul(plot_h) / max).max(1)
            } else {
                0
            };
            Bar {
                x: left + i as i64 * slot + 1,
                y: top + plot_h - h,
                w: (slot - 2).max(1),
                h,
                day: d.day(),
                title: format!("{}: ${}", d.format("%Y-%m-%d"), pricing::usd(*spend)),
            }
        })
        .collect();
    Chart {
        bars,
        max_label: format!("${}", pricing::usd(max)),
        half_label: format!("${}", pricing::usd(max / 2)),
        width,
        height,
        base: top + plot_h,
        left,
    }
}

#[derive(Template)]
#[template(path = "admin/reports.html")]
struct ReportsPage {
    c: Chrome,
    r: Report,
    chart: Chart,
    csv_link: String,
    q: ReportQuery,
}

#[derive(Template)]
#[template(path = "admin/_report.html")]
struct ReportFragment {
    r: Report,
    chart: Chart,
    csv_link: String,
}

fn csv_link(r: &Report) -> String {
    format!("/admin/reports.csv?{}", r.query)
}

pub async fn page(
    actor: Actor,
    state: web::Data<AppState>,
    req: HttpRequest,
    q: Query<ReportQuery>,
) -> Result<HttpResponse, AdminError> {
    let q = q.into_inner();
    let r = report(&state, &actor, &q).await?;
    let chart = chart(&r.days);
    let csv_link = csv_link(&r);
    if req.headers().contains_key("hx-request") {
        return view::html(&ReportFragment { r, chart, csv_link });
    }
    view::html(&ReportsPage {
        c: Chrome::new(&actor, "reports"),
        r,
        chart,
        csv_link,
        q,
    })
}

pub fn csv_response(r: &Report) -> HttpResponse {
    let by = r.by().replace([':', ','], "-");
    HttpResponse::Ok()
        .content_type("text/csv; charset=utf-8")
        .insert_header((
            header::CONTENT_DISPOSITION,
            format!(
                "attachment; filename=\"sluice-spend-{}-by-{by}.csv\"",
                r.span().replace("..", "-to-")
            ),
        ))
        // Its rows are the report's: what a tag filter could not place is said beside them.
        .insert_header(("x-sluice-rolled-up-micros", r.rolled_up.1.to_string()))
        .body(to_csv(r))
}

pub async fn csv(
    actor: Actor,
    state: web::Data<AppState>,
    q: Query<ReportQuery>,
) -> Result<HttpResponse, AdminError> {
    Ok(csv_response(&report(&state, &actor, &q).await?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn csv_cells_are_quoted_and_defused() {
        assert_eq!(csv_cell("plain"), "plain");
        assert_eq!(csv_cell("a,b"), "\"a,b\"");
        assert_eq!(csv_cell("=HYPERLINK(\"x\")"), "\"'=HYPERLINK(\"\"x\"\")\"");
        assert_eq!(csv_cell("-1"), "'-1");
    }

    #[test]
    fn the_chart_scales_to_the_dearest_day() {
        let d = |n| NaiveDate::from_ymd_opt(2026, 11, n).unwrap();
        let c = chart(&[(d(1), 0), (d(2), 500_000), (d(3), 1_000_000)]);
        assert_eq!(c.bars.len(), 3);
        assert_eq!(c.bars[0].h, 0);
        assert_eq!(c.bars[2].h, 200);
        assert_eq!(c.bars[1].h, 100);
        assert_eq!(c.max_label, "$1.000000");
    }
}
