//! The admin JSON API under `/admin/api/v1`: the same operations and permission checks as
//! the pages (it calls the very same functions), answered as JSON. Authenticated by an admin
//! session (with its CSRF token on writes) or an admin API key (`Authorization: Bearer
//! sk-sl-admin-…`). Token texts appear only in the answers to issue and rotate.

use actix_web::{web, HttpResponse};
use serde_json::{json, Value};

use super::actor::Actor;
use super::error::AdminError;
use super::input::Input;
use super::input::Query;
use super::reports::{self, ReportQuery};
use super::requests::{self, RequestQuery};
use super::token_ops::{self, Edit, Issue, Issued, Rotate, TopUp};
use super::{account, audit, cache, dashboard, teams, upstream_ops, upstreams, user_ops as users};
use crate::state::AppState;

type Res = Result<HttpResponse, AdminError>;

pub fn configure(cfg: &mut web::ServiceConfig) {
    cfg.service(
        web::scope("/api/v1")
            .route("/me", web::get().to(me))
            .route("/dashboard", web::get().to(dashboard_json))
            .route("/teams", web::get().to(teams_list))
            .route("/teams", web::post().to(teams_create))
            .route("/teams/{id}", web::patch().to(teams_budget))
            .route("/users", web::get().to(users_list))
            .route("/users", web::post().to(users_create))
            .route("/users/{id}", web::patch().to(users_patch))
            .route("/logins/{id}", web::patch().to(logins_patch))
            .route("/tokens", web::get().to(tokens_list))
            .route("/tokens", web::post().to(tokens_issue))
            .route("/tokens/{id}", web::patch().to(tokens_edit))
            .route("/tokens/{id}/revoke", web::post().to(tokens_revoke))
            .route("/tokens/{id}/rotate", web::post().to(tokens_rotate))
            .route("/tokens/{id}/top-up", web::post().to(tokens_top_up))
            .route("/reports/spend", web::get().to(spend))
            .route("/reports/reconciliation", web::get().to(reconciliation))
            .route("/reports/forecast", web::get().to(forecast))
            .route("/requests", web::get().to(requests_list))
            .route("/audit", web::get().to(audit_list))
            .route("/upstreams", web::get().to(upstreams_list))
            .route("/upstreams", web::post().to(upstreams_add))
            .route("/upstreams/{id}", web::delete().to(upstreams_delete))
            .route("/upstreams/{id}/rotate", web::post().to(upstreams_rotate))
            .route("/upstreams/{id}/test", web::post().to(upstreams_test))
            .route("/upstreams/{id}/{action}", web::post().to(upstreams_toggle))
            .route("/models", web::get().to(models_list))
            .route("/models/{name}", web::put().to(models_put))
            .route("/models/{name}", web::delete().to(models_delete))
            .route("/models/{name}/prices", web::get().to(prices_list))
            .route("/models/{name}/prices", web::post().to(prices_add))
            .route("/keys", web::post().to(keys_create))
            .route("/cache/invalidate", web::post().to(cache_invalidate)),
    );
}

fn ok(v: serde_json::Value) -> Res {
    Ok(HttpResponse::Ok().json(v))
}

fn created(v: serde_json::Value) -> Res {
    Ok(HttpResponse::Created().json(v))
}

async fn me(actor: Actor) -> Res {
    ok(
        json!({"id": actor.id, "username": actor.username, "role": actor.role.as_str(), "team_id": actor.team_id}),
    )
}

async fn dashboard_json(actor: Actor, state: web::Data<AppState>) -> Res {
    ok(json!(dashboard::stats_for(&state, &actor).await?))
}

async fn teams_list(actor: Actor, state: web::Data<AppState>) -> Res {
    ok(json!({"teams": teams::list(&state, &actor).await?}))
}

async fn teams_create(
    actor: Actor,
    state: web::Data<AppState>,
    Input(t): Input<teams::NewTeam>,
) -> Res {
    created(json!(teams::create(&state, &actor, t).await?))
}

async fn teams_budget(
    actor: Actor,
    state: web::Data<AppState>,
    id: web::Path<i64>,
    Input(p): Input<teams::TeamPatch>,
) -> Res {
    ok(json!(
        teams::patch(&state, &actor, id.into_inner(), p).await?
    ))
}

#[derive(serde::Deserialize)]
struct TeamFilter {
    #[serde(default, deserialize_with = "super::input::de::opt_i64")]
    team: Option<i64>,
}

async fn users_list(actor: Actor, state: web::Data<AppState>, q: Query<TeamFilter>) -> Res {
    ok(json!({
        "members": users::members(&state, &actor, q.team).await?,
        "logins": users::logins(&state, &actor).await?,
    }))
}

async fn users_create(
    actor: Actor,
    state: web::Data<AppState>,
    Input(u): Input<users::NewUser>,
) -> Res {
    created(json!(users::create(&state, &actor, u).await?))
}

async fn users_patch(
    actor: Actor,
    state: web::Data<AppState>,
    id: web::Path<i64>,
    Input(p): Input<users::MemberPatch>,
) -> Res {
    ok(json!(
        users::update_member(&state, &actor, id.into_inner(), p).await?
    ))
}

async fn logins_patch(
    actor: Actor,
    state: web::Data<AppState>,
    id: web::Path<i64>,
    Input(p): Input<users::LoginPatch>,
) -> Res {
    ok(json!(
        users::update_login(&state, &actor, id.into_inner(), p).await?
    ))
}

#[derive(serde::Deserialize)]
struct UserFilter {
    #[serde(default, deserialize_with = "super::input::de::opt_i64")]
    user: Option<i64>,
}

fn token_json(t: &crate::store::token_admin::TokenRow) -> serde_json::Value {
    let mut v = json!(t);
    v["models"] = json!(t.models());
    v
}

async fn tokens_list(actor: Actor, state: web::Data<AppState>, q: Query<UserFilter>) -> Res {
    let listed = token_ops::list(&state, &actor, q.user).await?;
    ok(
        json!({"tokens": listed.rows.iter().map(token_json).collect::<Vec<_>>(), "more": listed.more}),
    )
}

fn issued(i: Issued) -> Res {
    let mut v = token_json(&i.row);
    v["token"] = json!(i.text);
    created(v)
}

async fn tokens_issue(actor: Actor, state: web::Data<AppState>, Input(i): Input<Issue>) -> Res {
    issued(token_ops::issue(&state, &actor, i).await?)
}

async fn tokens_edit(
    actor: Actor,
    state: web::Data<AppState>,
    id: web::Path<i64>,
    Input(e): Input<Edit>,
) -> Res {
    ok(token_json(
        &token_ops::edit(&state, &actor, id.into_inner(), e).await?,
    ))
}

async fn tokens_revoke(actor: Actor, state: web::Data<AppState>, id: web::Path<i64>) -> Res {
    ok(token_json(
        &token_ops::revoke(&state, &actor, id.into_inner()).await?,
    ))
}

async fn tokens_rotate(
    actor: Actor,
    state: web::Data<AppState>,
    id: web::Path<i64>,
    Input(r): Input<Rotate>,
) -> Res {
    issued(token_ops::rotate(&state, &actor, id.into_inner(), r).await?)
}

async fn tokens_top_up(
    actor: Actor,
    state: web::Data<AppState>,
    id: web::Path<i64>,
    Input(t): Input<TopUp>,
) -> Res {
    ok(token_json(
        &token_ops::top_up(&state, &actor, id.into_inner(), t).await?,
    ))
}

#[derive(serde::Deserialize)]
struct SpendQuery {
    #[serde(flatten)]
    q: ReportQuery,
    #[serde(default)]
    format: Option<String>,
}

async fn spend(actor: Actor, state: web::Data<AppState>, q: Query<SpendQuery>) -> Res {
    let r = reports::report(&state, &actor, &q.q).await?;
    match q.format.as_deref() {
        Some("csv") => Ok(reports::csv_response(&r)),
        None | Some("json") => ok(reports::to_json(&r)),
        Some(other) => Err(AdminError::invalid(format!(
            "format: json or csv, not `{other}`"
        ))),
    }
}

/// The last reconciliation (`null` before the first) and its rows.
async fn reconciliation(actor: Actor, state: web::Data<AppState>) -> Res {
    let last = super::finance::last_run(&state, &actor).await?;
    ok(match last {
        Some((run, rows)) => json!({"reconciliation": run, "rows": rows}),
        None => json!({"reconciliation": null, "rows": []}),
    })
}

/// Every budget in the caller's reach with its burn rate and projected exhaustion
/// (`finance::budgets`); a lead sees their own team's.
async fn forecast(actor: Actor, state: web::Data<AppState>) -> Res {
    let now = state.clock.now();
    let budgets = crate::finance::budgets::forecasts(&state.db, actor.scope(), now).await?;
    ok(json!({"as_of": now.date_naive().to_string(), "budgets": budgets}))
}

async fn requests_list(actor: Actor, state: web::Data<AppState>, q: Query<RequestQuery>) -> Res {
    let f = requests::search(&state, &actor, &q).await?;
    ok(json!({"requests": f.rows, "page": f.page, "more": f.more}))
}

async fn audit_list(actor: Actor, state: web::Data<AppState>, q: Query<audit::AuditQuery>) -> Res {
    let (rows, page, more) = audit::search(&state, &actor, &q).await?;
    ok(json!({"audit": rows, "page": page, "more": more}))
}

async fn upstreams_list(actor: Actor, state: web::Data<AppState>) -> Res {
    ok(json!({"upstreams": upstreams::list(&state, &actor)?}))
}

async fn upstreams_toggle(
    actor: Actor,
    state: web::Data<AppState>,
    path: web::Path<(String, String)>,
) -> Res {
    let (id, action) = path.into_inner();
    let enable = match action.as_str() {
        "enable" => true,
        "disable" => false,
        _ => return Err(AdminError::NotFound),
    };
    ok(json!(
        upstreams::set_enabled(&state, &actor, &id, enable).await?
    ))
}

async fn upstreams_add(actor: Actor, state: web::Data<AppState>, Input(t): Input<Value>) -> Res {
    let id = t
        .get("id")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    upstream_ops::add(&state, &actor, t).await?;
    created(json!(upstreams::view(&state, &actor, &id)?))
}

#[derive(serde::Deserialize)]
struct NewKey {
    api_key: String,
}

async fn upstreams_rotate(
    actor: Actor,
    state: web::Data<AppState>,
    id: web::Path<String>,
    Input(k): Input<NewKey>,
) -> Res {
    upstream_ops::rotate(&state, &actor, &id, &k.api_key).await?;
    ok(json!(upstreams::view(&state, &actor, &id)?))
}

async fn upstreams_test(actor: Actor, state: web::Data<AppState>, id: web::Path<String>) -> Res {
    ok(json!(upstream_ops::test(&state, &actor, &id).await?))
}

async fn upstreams_delete(actor: Actor, state: web::Data<AppState>, id: web::Path<String>) -> Res {
    upstream_ops::delete(&state, &actor, &id).await?;
    ok(json!({"id": id.into_inner(), "deleted": true}))
}

async fn models_list(actor: Actor, state: web::Data<AppState>) -> Res {
    ok(json!({"models": upstream_ops::models(&state, &actor)?}))
}

async fn models_put(
    actor: Actor,
    state: web::Data<AppState>,
    name: web::Path<String>,
    Input(t): Input<Value>,
) -> Res {
    upstream_ops::put_model(&state, &actor, &name, t).await?;
    let models = upstream_ops::models(&state, &actor)?;
    let m = models.into_iter().find(|m| m["name"] == name.as_str());
    ok(m.ok_or(AdminError::NotFound)?)
}

async fn models_delete(actor: Actor, state: web::Data<AppState>, name: web::Path<String>) -> Res {
    upstream_ops::delete_model(&state, &actor, &name).await?;
    ok(json!({"name": name.into_inner(), "deleted": true}))
}

async fn prices_list(actor: Actor, state: web::Data<AppState>, name: web::Path<String>) -> Res {
    ok(super::price_ops::history(&state, &actor, &name).await?)
}

async fn prices_add(
    actor: Actor,
    state: web::Data<AppState>,
    name: web::Path<String>,
    Input(t): Input<Value>,
) -> Res {
    let row = upstream_ops::put_price(&state, &actor, &name, t).await?;
    created(super::price_ops::row_view(&row))
}

async fn cache_invalidate(
    actor: Actor,
    state: web::Data<AppState>,
    Input(c): Input<cache::Invalidate>,
) -> Res {
    let deleted = cache::invalidate(&state, &actor, &c.tag).await?;
    ok(json!({"tag": c.tag, "deleted": deleted}))
}

async fn keys_create(
    actor: Actor,
    state: web::Data<AppState>,
    Input(k): Input<account::NewKey>,
) -> Res {
    let (id, text) = account::create_key(&state, &actor, k).await?;
    created(json!({"id": id, "key": text}))
}
