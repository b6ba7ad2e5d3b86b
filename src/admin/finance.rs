//! The finance page: the last reconciliation of a provider's bill against Sluice's spend
//! (`sluice reconcile` stores it), every (day, model, account) row with the flagged ones
//! marked. A read for admins and finance; a lead does not see it (404, like the audit log).

use actix_web::{web, HttpResponse};
use askama::Template;

use super::actor::Actor;
use super::error::AdminError;
use super::view::{self, filters, Chrome};
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
    last: Option<(Reconciliation, Vec<ReconciliationRow>)>,
}

impl FinancePage {
    /// The relative threshold as written in the config (`2.00 %`).
    fn pct(&self, bp: &i64) -> String {
        format!("{}.{:02} %", bp / 100, bp % 100)
    }
}

pub async fn page(actor: Actor, state: web::Data<AppState>) -> Result<HttpResponse, AdminError> {
    let last = last_run(&state, &actor).await?;
    view::html(&FinancePage {
        c: Chrome::new(&actor, "finance"),
        last,
    })
}
