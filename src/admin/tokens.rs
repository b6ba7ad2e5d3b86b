//! The tokens page: issue (shown once, with a copy button), list with spend against budget,
//! revoke, rotate, edit limits, top up. The operations are in `token_ops`.

use actix_web::{web, HttpResponse};
use askama::Template;
use serde::Deserialize;

use super::actor::Actor;
use super::error::AdminError;
use super::input::Query;
use super::input::{de, Input};
use super::token_ops::{self, Edit, Issue, Issued, Rotate, TopUp};
use super::view::{self, filters, Chrome};
use crate::state::AppState;
use crate::store::directory::{self, MemberRow};
use crate::store::token_admin::TokenRow;

pub fn configure(cfg: &mut web::ServiceConfig) {
    cfg.route("/tokens", web::get().to(page))
        .route("/tokens", web::post().to(issue_html))
        .route("/tokens/{id}/revoke", web::post().to(revoke_html))
        .route("/tokens/{id}/rotate", web::post().to(rotate_html))
        .route("/tokens/{id}/limits", web::post().to(edit_html))
        .route("/tokens/{id}/top-up", web::post().to(top_up_html));
}

#[derive(Template)]
#[template(path = "admin/tokens.html")]
struct TokensPage {
    c: Chrome,
    tokens: Vec<TokenRow>,
    /// The list was cut at `token_admin::LIST_MAX`.
    more: bool,
    members: Vec<MemberRow>,
    models: Vec<String>,
    now: String,
    filter_user: Option<i64>,
    oob: bool,
}

#[derive(Template)]
#[template(path = "admin/_tokens_table.html")]
struct TokensTable {
    c: Chrome,
    tokens: Vec<TokenRow>,
    /// The list was cut at `token_admin::LIST_MAX`.
    more: bool,
    models: Vec<String>,
    now: String,
    oob: bool,
}

#[derive(Template)]
#[template(path = "admin/_token_issued.html")]
struct IssuedFragment {
    row: TokenRow,
    text: String,
    rotated_from: Option<i64>,
    table: TokensTable,
}

#[derive(Deserialize)]
pub struct TokensQuery {
    #[serde(default, deserialize_with = "de::opt_i64")]
    user: Option<i64>,
}

async fn table(state: &AppState, actor: &Actor, oob: bool) -> Result<TokensTable, AdminError> {
    let listed = token_ops::list(state, actor, None).await?;
    Ok(TokensTable {
        c: Chrome::new(actor, "tokens"),
        tokens: listed.rows,
        more: listed.more,
        models: state.catalog().names.clone(),
        now: crate::clock::db_time(state.clock.now()),
        oob,
    })
}

pub async fn page(
    actor: Actor,
    state: web::Data<AppState>,
    q: Query<TokensQuery>,
) -> Result<HttpResponse, AdminError> {
    let members = directory::members(&state.db, actor.scope()).await?;
    let listed = token_ops::list(&state, &actor, q.user).await?;
    view::html(&TokensPage {
        c: Chrome::new(&actor, "tokens"),
        tokens: listed.rows,
        more: listed.more,
        members: members.into_iter().filter(|m| !m.disabled).collect(),
        models: state.catalog().names.clone(),
        now: crate::clock::db_time(state.clock.now()),
        filter_user: q.user,
        oob: false,
    })
}

async fn issued(
    state: &AppState,
    actor: &Actor,
    i: Issued,
    rotated_from: Option<i64>,
) -> Result<HttpResponse, AdminError> {
    let frag = IssuedFragment {
        row: i.row,
        text: i.text,
        rotated_from,
        table: table(state, actor, true).await?,
    };
    view::html(&frag)
}

async fn issue_html(
    actor: Actor,
    state: web::Data<AppState>,
    Input(i): Input<Issue>,
) -> Result<HttpResponse, AdminError> {
    let t = token_ops::issue(&state, &actor, i).await?;
    issued(&state, &actor, t, None).await
}

async fn rotate_html(
    actor: Actor,
    state: web::Data<AppState>,
    id: web::Path<i64>,
    Input(r): Input<Rotate>,
) -> Result<HttpResponse, AdminError> {
    let id = id.into_inner();
    let t = token_ops::rotate(&state, &actor, id, r).await?;
    issued(&state, &actor, t, Some(id)).await
}

async fn revoke_html(
    actor: Actor,
    state: web::Data<AppState>,
    id: web::Path<i64>,
) -> Result<HttpResponse, AdminError> {
    let t = token_ops::revoke(&state, &actor, id.into_inner()).await?;
    view::html_with_flash(
        &table(&state, &actor, false).await?,
        &format!("Token {}… revoked.", t.prefix),
    )
}

async fn edit_html(
    actor: Actor,
    state: web::Data<AppState>,
    id: web::Path<i64>,
    Input(e): Input<Edit>,
) -> Result<HttpResponse, AdminError> {
    let t = token_ops::edit(&state, &actor, id.into_inner(), e).await?;
    view::html_with_flash(
        &table(&state, &actor, false).await?,
        &format!("Limits of {}… saved.", t.prefix),
    )
}

async fn top_up_html(
    actor: Actor,
    state: web::Data<AppState>,
    id: web::Path<i64>,
    Input(t): Input<TopUp>,
) -> Result<HttpResponse, AdminError> {
    let t = token_ops::top_up(&state, &actor, id.into_inner(), t).await?;
    view::html_with_flash(
        &table(&state, &actor, false).await?,
        &format!("Budget of {}… topped up.", t.prefix),
    )
}
