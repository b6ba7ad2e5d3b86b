//! The dashboard: spend today and this month, requests and error rate today, the tokens
//! that spent most this month. The figures refresh themselves (htmx polls `stats`).

use actix_web::{web, HttpResponse};
use askama::Template;
use chrono::Datelike;
use serde::Serialize;

use super::actor::Actor;
use super::error::AdminError;
use super::view::{self, filters, Chrome};
use crate::state::AppState;
use crate::store::reports::{self, TopToken, Totals};

#[derive(Debug, Serialize)]
pub struct Stats {
    pub today: Totals,
    pub month: Totals,
    /// Non-2xx answers today, in tenths of a percent.
    pub error_permille: i64,
    pub top_tokens: Vec<TopToken>,
    pub as_of: String,
}

pub async fn stats_for(state: &AppState, actor: &Actor) -> Result<Stats, AdminError> {
    let now = state.clock.now();
    let today = now.date_naive();
    let month_start = today.with_day(1).unwrap_or(today);
    let (day_from, month_from) = (view::day_start(today), view::day_start(month_start));
    let scope = actor.scope();
    let today_totals = reports::totals(&state.db, scope, &day_from).await?;
    let month = reports::totals(&state.db, scope, &month_from).await?;
    let error_permille = if today_totals.requests > 0 {
        today_totals.errors * 1000 / today_totals.requests
    } else {
        0
    };
    Ok(Stats {
        error_permille,
        today: today_totals,
        month,
        top_tokens: reports::top_tokens(&state.db, scope, &month_from, 5).await?,
        as_of: crate::clock::db_time(now),
    })
}

#[derive(Template)]
#[template(path = "admin/dashboard.html")]
struct DashboardPage {
    c: Chrome,
    s: Stats,
}

#[derive(Template)]
#[template(path = "admin/_dashboard_stats.html")]
struct StatsFragment {
    s: Stats,
}

pub async fn page(actor: Actor, state: web::Data<AppState>) -> Result<HttpResponse, AdminError> {
    let s = stats_for(&state, &actor).await?;
    view::html(&DashboardPage {
        c: Chrome::new(&actor, "dashboard"),
        s,
    })
}

pub async fn stats(actor: Actor, state: web::Data<AppState>) -> Result<HttpResponse, AdminError> {
    view::html(&StatsFragment {
        s: stats_for(&state, &actor).await?,
    })
}
