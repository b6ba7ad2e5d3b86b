//! The finance page: the last reconciliation of a provider's bill against Sluice's spend
//! (`sluice reconcile` stores it), every (day, model, account) row with the flagged ones
//! marked — and every budget's forecast: a chart of its last 28 days of spend and the next 7
//! projected, and the day it is expected to run out (`finance::budgets`). A read for admins
//! and finance; a lead sees their own team's forecasts only — the reconciliation is of the
//! whole provider account, which a lead does not see (as the audit log).

use actix_web::{web, HttpResponse};
use askama::Template;

use super::actor::Actor;
use super::error::AdminError;
use super::reports::{chart, Chart};
use super::view::{self, filters, Chrome};
use crate::finance::budgets::{self, BudgetForecast};
use crate::state::AppState;
use crate::store::finance::{self, Reconciliation, ReconciliationRow};

/// The last run and its rows, if any.
pub async fn last_run(
    state: &AppState,
    actor: &Actor,
) -> Result<Option<(Reconciliation, Vec<ReconciliationRow>)>, AdminError> {
    actor.require_global_reader()?;
    Ok(finance::last(&state.db).await?)
}

#[derive(Template)]
#[template(path = "admin/finance.html")]
struct FinancePage {
    c: Chrome,
    /// The caller may see the reconciliation (not a lead).
    reconciles: bool,
    last: Option<(Reconciliation, Vec<ReconciliationRow>)>,
    budgets: Vec<BudgetView>,
}

/// A budget's forecast and its chart: 28 bars of spend, then 7 projected (`PROJECTED_FROM`).
struct BudgetView {
    f: BudgetForecast,
    chart: Chart,
}

/// The first projected bar's index in a budget's chart.
const PROJECTED_FROM: usize = crate::finance::forecast::WINDOW;

fn budget_view(f: BudgetForecast) -> BudgetView {
    let days: Vec<(chrono::NaiveDate, i64)> = f
        .history
        .iter()
        .chain(&f.projected)
        .filter_map(|d| Some((d.day.parse().ok()?, d.spend_micros)))
        .collect();
    BudgetView {
        chart: chart(&days),
        f,
    }
}

impl FinancePage {
    /// The relative threshold as written in the config (`2.00 %`).
    fn pct(&self, bp: &i64) -> String {
        format!("{}.{:02} %", bp / 100, bp % 100)
    }

    /// The class of a chart's bar: spent, or projected.
    fn bar_class(&self, i: &usize) -> &'static str {
        if *i >= PROJECTED_FROM {
            "bar projected"
        } else {
            "bar"
        }
    }
}

pub async fn page(actor: Actor, state: web::Data<AppState>) -> Result<HttpResponse, AdminError> {
    let reconciles = actor.require_global_reader().is_ok();
    let last = match reconciles {
        true => last_run(&state, &actor).await?,
        false => None,
    };
    let now = state.clock.now();
    let budgets = budgets::forecasts(&state.db, actor.scope(), now)
        .await?
        .into_iter()
        .map(budget_view)
        .collect();
    view::html(&FinancePage {
        c: Chrome::new(&actor, "finance"),
        reconciles,
        last,
        budgets,
    })
}
