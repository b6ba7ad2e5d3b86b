//! The audit log, newest first, filterable by action prefix and actor; the keyed chain and
//! its signed head can be checked from the page (a read: nothing is written). Admins and
//! finance only.

use actix_web::{web, HttpRequest, HttpResponse};
use askama::Template;
use serde::Deserialize;

use super::actor::Actor;
use super::error::{escape, AdminError};
use super::input::de;
use super::input::Query;
use super::view::{self, filters, Chrome};
use crate::ops::audit_head;
use crate::state::AppState;
use crate::store::reports::{self, AuditLine};

pub const PAGE_SIZE: i64 = 50;

#[derive(Debug, Default, Clone, Deserialize)]
pub struct AuditQuery {
    #[serde(default, deserialize_with = "de::opt_text")]
    pub action: Option<String>,
    #[serde(default, deserialize_with = "de::opt_text")]
    pub actor: Option<String>,
    #[serde(default, deserialize_with = "de::opt_i64")]
    pub page: Option<i64>,
}

pub async fn search(
    state: &AppState,
    actor: &Actor,
    q: &AuditQuery,
) -> Result<(Vec<AuditLine>, i64, bool), AdminError> {
    actor.require_global_reader()?;
    if q.action.as_ref().is_some_and(|a| a.len() > 100)
        || q.actor.as_ref().is_some_and(|a| a.len() > 200)
    {
        return Err(AdminError::invalid("filter too long"));
    }
    let page = q.page.unwrap_or(1).clamp(1, 100_000);
    let mut rows = reports::audit(
        &state.db,
        q.action.as_deref(),
        q.actor.as_deref(),
        PAGE_SIZE,
        (page - 1) * PAGE_SIZE,
    )
    .await?;
    let more = rows.len() as i64 > PAGE_SIZE;
    rows.truncate(PAGE_SIZE as usize);
    Ok((rows, page, more))
}

#[derive(Template)]
#[template(path = "admin/audit.html")]
struct AuditPage {
    c: Chrome,
    q: AuditQuery,
    rows: Vec<AuditLine>,
    page: i64,
    more: bool,
    prev: String,
    next: String,
}

#[derive(Template)]
#[template(path = "admin/_audit_table.html")]
struct AuditTable {
    rows: Vec<AuditLine>,
    page: i64,
    more: bool,
    prev: String,
    next: String,
}

fn link(q: &AuditQuery, page: i64) -> String {
    let mut s = url::form_urlencoded::Serializer::new(String::new());
    if let Some(a) = &q.action {
        s.append_pair("action", a);
    }
    if let Some(a) = &q.actor {
        s.append_pair("actor", a);
    }
    s.append_pair("page", &page.to_string());
    format!("/admin/audit?{}", s.finish())
}

pub async fn page(
    actor: Actor,
    state: web::Data<AppState>,
    req: HttpRequest,
    q: Query<AuditQuery>,
) -> Result<HttpResponse, AdminError> {
    let q = q.into_inner();
    let (rows, page, more) = search(&state, &actor, &q).await?;
    let (prev, next) = (link(&q, page - 1), link(&q, page + 1));
    if req.headers().contains_key("hx-request") {
        return view::html(&AuditTable {
            rows,
            page,
            more,
            prev,
            next,
        });
    }
    view::html(&AuditPage {
        c: Chrome::new(&actor, "audit"),
        q,
        rows,
        page,
        more,
        prev,
        next,
    })
}

/// Checks rows, chain and the signed head, and says what broke (a fragment for the page).
pub async fn verify(actor: Actor, state: web::Data<AppState>) -> Result<HttpResponse, AdminError> {
    actor.require_global_reader()?;
    let dir = std::path::Path::new(&state.settings.backup.dir);
    let report = audit_head::verify(&state.db, dir, &state.settings.backup.head_name)
        .await
        .map_err(|e| {
            tracing::error!(error = %e, "audit verify failed");
            AdminError::Internal
        })?;
    let mut html = String::new();
    match &report.chain.broken {
        None => html.push_str(&format!(
            "<p class=\"flash ok\" role=\"status\">Chain intact: {} rows verified.</p>",
            report.chain.rows
        )),
        Some(b) => html.push_str(&format!(
            "<p class=\"flash error\" role=\"alert\">Chain broken at row {}: {} ({} rows before it verified).</p>",
            b.id,
            escape(b.why),
            report.chain.rows
        )),
    }
    // The chain's own problem is shown above; the head's follow it, then the triggers'.
    let problems = report.problems();
    let head_problems = problems.iter().filter(|p| p.starts_with("audit head"));
    let mut any = false;
    for p in head_problems {
        any = true;
        html.push_str(&format!(
            "<p class=\"flash error\" role=\"alert\">{}</p>",
            escape(p)
        ));
    }
    for p in report.triggers.problems() {
        html.push_str(&format!(
            "<p class=\"flash error\" role=\"alert\">{}</p>",
            escape(&p)
        ));
    }
    if !any {
        html.push_str(
            "<p class=\"flash ok\" role=\"status\">Signed head matches the database.</p>",
        );
    }
    Ok(HttpResponse::Ok()
        .content_type("text/html; charset=utf-8")
        .body(html))
}
