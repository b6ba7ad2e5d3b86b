//! Spend reports for a chosen month, grouped by token, user, team, model or day; a
//! spend-per-day chart drawn on the server as inline SVG; and CSV of exactly the rows the
//! table shows (one function produces both).

use actix_web::http::header;
use actix_web::{web, HttpRequest, HttpResponse};
use askama::Template;
use chrono::{Datelike, Duration, NaiveDate};
use serde::Deserialize;

use super::actor::Actor;
use super::error::AdminError;
use super::input::de;
use super::view::{self, filters, Chrome};
use crate::quota::pricing;
use crate::state::AppState;
use crate::store::reports::{self, GroupBy, SpendRow};

#[derive(Debug, Default, Deserialize)]
pub struct ReportQuery {
    /// `YYYY-MM`; default: the current month (UTC).
    #[serde(default, deserialize_with = "de::opt_text")]
    pub month: Option<String>,
    /// token (default), user, team, model or day.
    #[serde(default, deserialize_with = "de::opt_text")]
    pub by: Option<String>,
}

pub struct Report {
    pub month: String,
    pub by: GroupBy,
    pub rows: Vec<SpendRow>,
    pub total_micros: i64,
    pub total_requests: i64,
    /// Spend per day of the month, every day present.
    pub days: Vec<(NaiveDate, i64)>,
}

pub async fn report(
    state: &AppState,
    actor: &Actor,
    q: &ReportQuery,
) -> Result<Report, AdminError> {
    let month = q
        .month
        .clone()
        .unwrap_or_else(|| state.clock.now().format("%Y-%m").to_string());
    let by = match q.by.as_deref() {
        None => GroupBy::Token,
        Some(b) => GroupBy::parse(b)
            .ok_or_else(|| AdminError::invalid("by: token, user, team, model or day"))?,
    };
    let (first, from, to) = view::month_range(&month)?;
    let scope = actor.scope();
    let rows = reports::spend(&state.db, scope, by, &from, &to).await?;
    let per_day = reports::spend(&state.db, scope, GroupBy::Day, &from, &to).await?;
    let mut days = Vec::new();
    let mut d = first;
    while d.month() == first.month() {
        let key = d.format("%Y-%m-%d").to_string();
        let spend = per_day
            .iter()
            .find(|r| r.label == key)
            .map_or(0, |r| r.spend_micros);
        days.push((d, spend));
        d += Duration::days(1);
    }
    Ok(Report {
        total_micros: rows.iter().map(|r| r.spend_micros).sum(),
        total_requests: rows.iter().map(|r| r.requests).sum(),
        month,
        by,
        rows,
        days,
    })
}

/// The CSV of a report: the table's columns and rows, nothing more.
pub fn to_csv(r: &Report) -> String {
    let mut out = format!(
        "{},requests,input_tokens,output_tokens,spend_usd\n",
        r.by.as_str()
    );
    for row in &r.rows {
        out.push_str(&format!(
            "{},{},{},{},{}\n",
            csv_cell(&row.label),
            row.requests,
            row.input_tokens,
            row.output_tokens,
            pricing::usd(row.spend_micros)
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
    groups: [GroupBy; 5],
    csv_link: String,
}

#[derive(Template)]
#[template(path = "admin/_report.html")]
struct ReportFragment {
    r: Report,
    chart: Chart,
    csv_link: String,
}

fn csv_link(r: &Report) -> String {
    format!("/admin/reports.csv?month={}&by={}", r.month, r.by.as_str())
}

pub async fn page(
    actor: Actor,
    state: web::Data<AppState>,
    req: HttpRequest,
    q: web::Query<ReportQuery>,
) -> Result<HttpResponse, AdminError> {
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
        groups: GroupBy::ALL,
        csv_link,
    })
}

pub fn csv_response(r: &Report) -> HttpResponse {
    HttpResponse::Ok()
        .content_type("text/csv; charset=utf-8")
        .insert_header((
            header::CONTENT_DISPOSITION,
            format!(
                "attachment; filename=\"sluice-spend-{}-by-{}.csv\"",
                r.month,
                r.by.as_str()
            ),
        ))
        .body(to_csv(r))
}

pub async fn csv(
    actor: Actor,
    state: web::Data<AppState>,
    q: web::Query<ReportQuery>,
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
