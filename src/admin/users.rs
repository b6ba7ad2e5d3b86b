//! The users page: members and logins in two tables, a create form, and per-row edits.
//! The operations (with every permission rule) are in `user_ops`.

use actix_web::{web, HttpResponse};
use askama::Template;
use serde::Deserialize;

use super::actor::Actor;
use super::error::AdminError;
use super::input::Query;
use super::input::{de, Input};
use super::user_ops::{self, Created, LoginPatch, MemberPatch, NewUser};
use super::view::{self, filters, Chrome};
use crate::state::AppState;
use crate::store::directory::{self, LoginRow, MemberRow, TeamRow};

pub fn configure(cfg: &mut web::ServiceConfig) {
    cfg.route("/users", web::get().to(page))
        .route("/users", web::post().to(create_html))
        .route("/users/{id}", web::post().to(member_html))
        .route("/logins/{id}", web::post().to(login_html));
}

#[derive(Template)]
#[template(path = "admin/users.html")]
struct UsersPage {
    c: Chrome,
    members: Vec<MemberRow>,
    logins: Vec<LoginRow>,
    teams: Vec<TeamRow>,
    me: i64,
    filter_team: Option<i64>,
}

#[derive(Template)]
#[template(path = "admin/_users_tables.html")]
struct UsersTables {
    c: Chrome,
    members: Vec<MemberRow>,
    logins: Vec<LoginRow>,
    teams: Vec<TeamRow>,
    me: i64,
    filter_team: Option<i64>,
}

#[derive(Deserialize)]
pub struct UsersQuery {
    #[serde(default, deserialize_with = "de::opt_i64")]
    team: Option<i64>,
}

async fn tables(
    state: &AppState,
    actor: &Actor,
    team: Option<i64>,
) -> Result<UsersTables, AdminError> {
    Ok(UsersTables {
        c: Chrome::new(actor, "users"),
        members: user_ops::members(state, actor, team).await?,
        logins: user_ops::logins(state, actor).await?,
        teams: directory::teams(&state.db, actor.scope()).await?,
        me: actor.id,
        filter_team: team,
    })
}

pub async fn page(
    actor: Actor,
    state: web::Data<AppState>,
    q: Query<UsersQuery>,
) -> Result<HttpResponse, AdminError> {
    let t = tables(&state, &actor, q.team).await?;
    view::html(&UsersPage {
        c: t.c,
        members: t.members,
        logins: t.logins,
        teams: t.teams,
        me: t.me,
        filter_team: t.filter_team,
    })
}

async fn create_html(
    actor: Actor,
    state: web::Data<AppState>,
    Input(u): Input<NewUser>,
) -> Result<HttpResponse, AdminError> {
    let msg = match user_ops::create(&state, &actor, u).await? {
        Created::Member(m) => format!("User {} created in {}.", m.username, m.team),
        Created::Login(l) => format!("Login {} ({}) created.", l.username, l.role),
    };
    view::html_with_flash(&tables(&state, &actor, None).await?, &msg)
}

async fn member_html(
    actor: Actor,
    state: web::Data<AppState>,
    id: web::Path<i64>,
    Input(p): Input<MemberPatch>,
) -> Result<HttpResponse, AdminError> {
    let m = user_ops::update_member(&state, &actor, id.into_inner(), p).await?;
    view::html_with_flash(
        &tables(&state, &actor, None).await?,
        &format!("User {} updated.", m.username),
    )
}

async fn login_html(
    actor: Actor,
    state: web::Data<AppState>,
    id: web::Path<i64>,
    Input(p): Input<LoginPatch>,
) -> Result<HttpResponse, AdminError> {
    let l = user_ops::update_login(&state, &actor, id.into_inner(), p).await?;
    view::html_with_flash(
        &tables(&state, &actor, None).await?,
        &format!("Login {} updated.", l.username),
    )
}
