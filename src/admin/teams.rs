//! Teams: list (a lead sees their own), create and set a team's budget (admins only).

use actix_web::{web, HttpResponse};
use askama::Template;
use serde::Deserialize;
use serde_json::{json, Map, Value};

use super::actor::{Actor, Role};
use super::error::AdminError;
use super::input::{de, Input};
use super::token_ops::default_tags;
use super::view::{self, filters, Chrome};
use crate::quota::period::Reset;
use crate::state::AppState;
use crate::store::directory::{self, TeamRow};
use crate::store::ledger::{self, Level};
use crate::store::tags::{self as tag_store, Owner};
use crate::store::tenants::{self, NewBudget};
use crate::store::tokens;

#[derive(Debug, Deserialize)]
pub struct NewTeam {
    #[serde(default, deserialize_with = "de::opt_text")]
    pub name: Option<String>,
    #[serde(default, deserialize_with = "de::opt_text")]
    pub budget_usd: Option<String>,
    #[serde(default, deserialize_with = "de::opt_text")]
    pub reset: Option<String>,
    /// Default tags of the team's requests, `key:value,key:value` (`pipeline::tags`).
    #[serde(default, deserialize_with = "de::opt_text")]
    pub tags: Option<String>,
}

#[derive(Debug, Deserialize)]
pub struct TeamBudget {
    /// Empty or absent: no limit.
    #[serde(default, deserialize_with = "de::opt_text")]
    pub budget_usd: Option<String>,
}

/// The JSON API's edit of a team: each field given is set, each absent one kept —
/// `budget_usd` (null or empty: no limit) and `tags` (null or empty: none). A body with
/// neither is refused: it would change nothing, and reading it as "no limit" once cleared
/// budgets by accident.
#[derive(Debug, Deserialize)]
pub struct TeamPatch {
    #[serde(default, deserialize_with = "de::patch_text")]
    pub budget_usd: Option<Option<String>>,
    #[serde(default, deserialize_with = "de::patch_text")]
    pub tags: Option<Option<String>>,
}

pub async fn list(state: &AppState, actor: &Actor) -> Result<Vec<TeamRow>, AdminError> {
    Ok(directory::teams(&state.db, actor.scope()).await?)
}

pub async fn create(state: &AppState, actor: &Actor, t: NewTeam) -> Result<TeamRow, AdminError> {
    if actor.role == Role::Lead {
        return Err(AdminError::Forbidden(
            "Only an admin can create teams.".into(),
        ));
    }
    actor.require_admin()?;
    let name = t.name.unwrap_or_default();
    view::check_name("name", &name)?;
    let tags = default_tags(t.tags.as_deref())?;
    let reset = parse_reset(t.reset.as_deref(), Reset::Monthly)?;
    let budget = NewBudget {
        limit_micros: view::opt_usd("budget_usd", t.budget_usd.as_deref())?,
        reset,
    };
    let now = state.clock.now();
    let mut tx = state.db.begin().await?;
    let id = tenants::create_team(&mut tx, &name, &budget, now).await?;
    if !tags.is_empty() {
        tag_store::set(&mut tx, Owner::Team(id), &tags).await?;
    }
    let after = json!({"name": name, "limit_micros": budget.limit_micros, "reset": reset.as_str(), "tags": tags})
        .to_string();
    actor
        .audit(
            &mut tx,
            "team.create",
            &format!("team:{id}"),
            None,
            Some(&after),
            now,
        )
        .await?;
    let row = directory::team(&mut tx, id)
        .await?
        .ok_or(AdminError::NotFound)?;
    tx.commit().await?;
    Ok(row)
}

/// Who may edit a team's budget or tags: admins only (a lead of the team is told so).
fn may_edit(actor: &Actor, id: i64, what: &str) -> Result<(), AdminError> {
    actor.see_team(id)?;
    if actor.role == Role::Lead {
        return Err(AdminError::Forbidden(format!(
            "Only an admin can change a team's {what}."
        )));
    }
    actor.require_admin()
}

/// A team's budget: only admins; spend is kept (the new remaining is the new limit minus
/// this period's ledger sum).
pub async fn set_budget(
    state: &AppState,
    actor: &Actor,
    id: i64,
    b: TeamBudget,
) -> Result<TeamRow, AdminError> {
    edit(state, actor, id, Some(b.budget_usd), None).await
}

/// A team's default tags (admins only): stored canonical, the auth caches told (the
/// token epoch moves, `store::tags`), one audit row.
pub async fn set_tags(
    state: &AppState,
    actor: &Actor,
    id: i64,
    tags: Option<&str>,
) -> Result<TeamRow, AdminError> {
    edit(state, actor, id, None, Some(tags)).await
}

/// The JSON API's team edit (`TeamPatch`): budget and tags in one transaction, so a
/// refused part leaves the other as it was.
pub async fn patch(
    state: &AppState,
    actor: &Actor,
    id: i64,
    p: TeamPatch,
) -> Result<TeamRow, AdminError> {
    if p.budget_usd.is_none() && p.tags.is_none() {
        return Err(AdminError::invalid(
            "The body changes nothing: give `budget_usd` (null for no limit), `tags` or both.",
        ));
    }
    edit(
        state,
        actor,
        id,
        p.budget_usd,
        p.tags.as_ref().map(Option::as_deref),
    )
    .await
}

/// Sets what is given — the budget (`Some(None)`: no limit) and the tags (`Some(None)`:
/// none) — validated first, then in one transaction with one audit row: `budget.set_limit`
/// or `team.tags`, or `team.update` carrying both changes when both are given (one action,
/// one row).
async fn edit(
    state: &AppState,
    actor: &Actor,
    id: i64,
    budget: Option<Option<String>>,
    tags: Option<Option<&str>>,
) -> Result<TeamRow, AdminError> {
    may_edit(actor, id, if budget.is_some() { "budget" } else { "tags" })?;
    let limit = match &budget {
        Some(b) => Some(view::opt_usd("budget_usd", b.as_deref())?),
        None => None,
    };
    let tags = tags.map(default_tags).transpose()?;
    let now = state.clock.now();
    let mut tx = state.db.begin().await?;
    let before = directory::team(&mut tx, id)
        .await?
        .ok_or(AdminError::NotFound)?;
    let (mut b, mut a) = (Map::new(), Map::new());
    if let Some(limit) = limit {
        let reset = Reset::parse(&before.reset).unwrap_or(Reset::Monthly);
        ledger::set_limit(&mut tx, Level::Team, id, reset, limit, now).await?;
        tokens::bump_epoch(&mut tx).await?;
        b.insert("limit_micros".into(), json!(before.limit_micros));
        a.insert("limit_micros".into(), json!(limit));
    }
    if let Some(tags) = &tags {
        tag_store::set(&mut tx, Owner::Team(id), tags).await?;
        b.insert("tags".into(), json!(before.tags));
        a.insert("tags".into(), json!(tags));
    }
    let action = match (limit.is_some(), tags.is_some()) {
        (true, true) => "team.update",
        (true, false) => "budget.set_limit",
        _ => "team.tags",
    };
    let (b, a) = (Value::Object(b).to_string(), Value::Object(a).to_string());
    actor
        .audit(
            &mut tx,
            action,
            &format!("team:{id}"),
            Some(&b),
            Some(&a),
            now,
        )
        .await?;
    let row = directory::team(&mut tx, id)
        .await?
        .ok_or(AdminError::NotFound)?;
    tx.commit().await?;
    Ok(row)
}

pub fn parse_reset(s: Option<&str>, default: Reset) -> Result<Reset, AdminError> {
    match s {
        None => Ok(default),
        Some(r) => Reset::parse(r).ok_or_else(|| {
            AdminError::invalid(format!("reset: daily, weekly, monthly or never, not `{r}`"))
        }),
    }
}

// ---- HTML ----

pub fn configure(cfg: &mut web::ServiceConfig) {
    cfg.route("/teams", web::get().to(page))
        .route("/teams", web::post().to(create_html))
        .route("/teams/{id}/budget", web::post().to(budget_html))
        .route("/teams/{id}/tags", web::post().to(tags_html));
}

#[derive(Template)]
#[template(path = "admin/teams.html")]
struct TeamsPage {
    c: Chrome,
    teams: Vec<TeamRow>,
}

#[derive(Template)]
#[template(path = "admin/_teams_table.html")]
struct TeamsTable {
    c: Chrome,
    teams: Vec<TeamRow>,
}

pub async fn page(actor: Actor, state: web::Data<AppState>) -> Result<HttpResponse, AdminError> {
    let teams = list(&state, &actor).await?;
    view::html(&TeamsPage {
        c: Chrome::new(&actor, "teams"),
        teams,
    })
}

async fn table(state: &AppState, actor: &Actor, msg: &str) -> Result<HttpResponse, AdminError> {
    let teams = list(state, actor).await?;
    view::html_with_flash(
        &TeamsTable {
            c: Chrome::new(actor, "teams"),
            teams,
        },
        msg,
    )
}

async fn create_html(
    actor: Actor,
    state: web::Data<AppState>,
    Input(t): Input<NewTeam>,
) -> Result<HttpResponse, AdminError> {
    let row = create(&state, &actor, t).await?;
    table(&state, &actor, &format!("Team {} created.", row.name)).await
}

async fn budget_html(
    actor: Actor,
    state: web::Data<AppState>,
    id: web::Path<i64>,
    Input(b): Input<TeamBudget>,
) -> Result<HttpResponse, AdminError> {
    let row = set_budget(&state, &actor, id.into_inner(), b).await?;
    table(&state, &actor, &format!("Budget of {} updated.", row.name)).await
}

#[derive(Debug, Deserialize)]
pub struct TeamTags {
    /// Empty or absent: none.
    #[serde(default, deserialize_with = "de::opt_text")]
    pub tags: Option<String>,
}

async fn tags_html(
    actor: Actor,
    state: web::Data<AppState>,
    id: web::Path<i64>,
    Input(t): Input<TeamTags>,
) -> Result<HttpResponse, AdminError> {
    let row = set_tags(&state, &actor, id.into_inner(), t.tags.as_deref()).await?;
    table(&state, &actor, &format!("Tags of {} updated.", row.name)).await
}

/// A lead may only hand out budget inside their team's: with a team limit, a budget they set
/// may not be larger than it, and a token (`required`) must have one — it cannot be broader
/// than its team. Admins are not held to it (the team level of the quota CAS still caps the
/// team's spend either way).
pub fn check_within_team(
    actor: &Actor,
    team: &TeamRow,
    limit: Option<i64>,
    required: bool,
) -> Result<(), AdminError> {
    if actor.role != Role::Lead {
        return Ok(());
    }
    match (team.limit_micros, limit) {
        (Some(t), None) if required => Err(AdminError::Forbidden(format!(
            "A budget is required, at most the team's {}.",
            crate::quota::pricing::usd(t)
        ))),
        (Some(t), Some(l)) if l > t => Err(AdminError::Forbidden(format!(
            "That is more than the team's budget of {} USD.",
            crate::quota::pricing::usd(t)
        ))),
        _ => Ok(()),
    }
}
