//! The request log: filter by team, user, token, model, status and date range, paginated on
//! the server (newest first). A lead's filter is always their own team.

use actix_web::{web, HttpRequest, HttpResponse};
use askama::Template;
use chrono::Datelike;
use serde::Deserialize;

use super::actor::Actor;
use super::error::AdminError;
use super::input::de;
use super::input::Query;
use super::view::{self, filters, Chrome};
use crate::state::AppState;
use crate::store::directory::{self, MemberRow, TeamRow};
use crate::store::reports::{self, RequestFilter, RequestLine};

pub const PAGE_SIZE: i64 = 50;

#[derive(Debug, Default, Clone, Deserialize, serde::Serialize)]
pub struct RequestQuery {
    #[serde(default, deserialize_with = "de::opt_i64")]
    pub team: Option<i64>,
    #[serde(default, deserialize_with = "de::opt_i64")]
    pub user: Option<i64>,
    #[serde(default, deserialize_with = "de::opt_i64")]
    pub token: Option<i64>,
    #[serde(default, deserialize_with = "de::opt_text")]
    pub model: Option<String>,
    /// `429`, or a class: `2xx`, `4xx`, `5xx`.
    #[serde(default, deserialize_with = "de::opt_text")]
    pub status: Option<String>,
    /// First day (UTC, YYYY-MM-DD), inclusive.
    #[serde(default, deserialize_with = "de::opt_text")]
    pub from: Option<String>,
    /// Last day (UTC, YYYY-MM-DD), inclusive.
    #[serde(default, deserialize_with = "de::opt_text")]
    pub to: Option<String>,
    #[serde(default, deserialize_with = "de::opt_i64")]
    pub page: Option<i64>,
}

pub struct Found {
    pub rows: Vec<RequestLine>,
    pub page: i64,
    pub more: bool,
}

fn status_filter(s: &str) -> Result<(i64, bool), AdminError> {
    let bad = || AdminError::invalid("status: a code like 429 or a class like 4xx");
    if let Some(c) = s.strip_suffix("xx") {
        let c: i64 = c.parse().map_err(|_| bad())?;
        return if (1..=5).contains(&c) {
            Ok((c, true))
        } else {
            Err(bad())
        };
    }
    let code: i64 = s.parse().map_err(|_| bad())?;
    if (100..=599).contains(&code) {
        Ok((code, false))
    } else {
        Err(bad())
    }
}

pub async fn search(
    state: &AppState,
    actor: &Actor,
    q: &RequestQuery,
) -> Result<Found, AdminError> {
    if let Some(t) = q.team {
        actor.see_team(t)?;
    }
    if let Some(m) = &q.model {
        if m.len() > 200 {
            return Err(AdminError::invalid("model: too long"));
        }
    }
    let from = q
        .from
        .as_deref()
        .map(|d| view::parse_date("from", d))
        .transpose()?;
    let to =
        q.to.as_deref()
            .map(|d| view::parse_date("to", d))
            .transpose()?;
    let f = RequestFilter {
        team_id: actor.scope().or(q.team),
        user_id: q.user,
        token_id: q.token,
        model: q.model.clone(),
        status: q.status.as_deref().map(status_filter).transpose()?,
        from: from.map(view::day_start),
        // The day after 9999-12-31 has no four-digit year: that `to` bounds nothing.
        to: to
            .and_then(|d| d.succ_opt())
            .filter(|d| d.year() <= 9999)
            .map(view::day_start),
    };
    let page = q.page.unwrap_or(1).clamp(1, 100_000);
    let mut rows = reports::requests(&state.db, &f, PAGE_SIZE, (page - 1) * PAGE_SIZE).await?;
    let more = rows.len() as i64 > PAGE_SIZE;
    rows.truncate(PAGE_SIZE as usize);
    Ok(Found { rows, page, more })
}

#[derive(Template)]
#[template(path = "admin/requests.html")]
struct RequestsPage {
    c: Chrome,
    q: RequestQuery,
    f: Found,
    teams: Vec<TeamRow>,
    members: Vec<MemberRow>,
    models: Vec<String>,
    prev: String,
    next: String,
}

#[derive(Template)]
#[template(path = "admin/_requests_table.html")]
struct RequestsTable {
    f: Found,
    prev: String,
    next: String,
}

/// The query string of another page of the same search.
fn page_link(q: &RequestQuery, page: i64) -> String {
    let mut q = q.clone();
    q.page = Some(page);
    let v = serde_json::to_value(&q).unwrap_or_default();
    let mut ser = url::form_urlencoded::Serializer::new(String::new());
    if let Some(map) = v.as_object() {
        for (k, v) in map {
            match v {
                serde_json::Value::Null => {}
                serde_json::Value::String(s) => {
                    ser.append_pair(k, s);
                }
                other => {
                    ser.append_pair(k, &other.to_string());
                }
            }
        }
    }
    format!("/admin/requests?{}", ser.finish())
}

pub async fn page(
    actor: Actor,
    state: web::Data<AppState>,
    req: HttpRequest,
    q: Query<RequestQuery>,
) -> Result<HttpResponse, AdminError> {
    let q = q.into_inner();
    let f = search(&state, &actor, &q).await?;
    let (prev, next) = (page_link(&q, f.page - 1), page_link(&q, f.page + 1));
    if req.headers().contains_key("hx-request") && !req.headers().contains_key("hx-boosted") {
        return view::html(&RequestsTable { f, prev, next });
    }
    view::html(&RequestsPage {
        c: Chrome::new(&actor, "requests"),
        teams: directory::teams(&state.db, actor.scope()).await?,
        members: directory::members(&state.db, actor.scope()).await?,
        models: state.catalog().names.clone(),
        q,
        f,
        prev,
        next,
    })
}
