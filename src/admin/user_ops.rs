//! User operations shared by the UI and the API: members (who hold sub-tokens, no login)
//! and logins (admin, lead, finance).
//! Admins manage both everywhere; a lead creates and edits members of their own team only,
//! within its budget, and never touches a login or a role; nobody changes their own role.
//! The team of a lead's new member is the lead's own, never one taken from the request.

use serde::Deserialize;
use serde_json::json;

use super::actor::{Actor, Role};
use super::error::AdminError;
use super::input::de;
use super::teams::{check_within_team, parse_reset};
use super::view;
use crate::quota::period::Reset;
use crate::state::AppState;
use crate::store::directory::{self, LoginEdit, LoginRow, MemberEdit, MemberRow, TeamRow};
use crate::store::ledger::{self, Level};
use crate::store::tenants::{self, NewBudget, NewUser as StoreUser};
use crate::store::{admins, sessions, tokens};

#[derive(Debug, Deserialize)]
pub struct NewUser {
    #[serde(default, deserialize_with = "de::opt_text")]
    pub username: Option<String>,
    /// member (default), lead, finance or admin.
    #[serde(default, deserialize_with = "de::opt_text")]
    pub role: Option<String>,
    #[serde(default, deserialize_with = "de::opt_i64")]
    pub team_id: Option<i64>,
    #[serde(default, deserialize_with = "de::opt_secret")]
    pub password: Option<String>,
    #[serde(default, deserialize_with = "de::opt_i64")]
    pub rpm: Option<i64>,
    #[serde(default, deserialize_with = "de::opt_i64")]
    pub tpm: Option<i64>,
    #[serde(default, deserialize_with = "de::opt_text")]
    pub budget_usd: Option<String>,
    #[serde(default, deserialize_with = "de::opt_text")]
    pub reset: Option<String>,
}

/// A member edit: absent fields stay as they are; empty ones are cleared.
#[derive(Debug, Deserialize)]
pub struct MemberPatch {
    #[serde(default, deserialize_with = "de::opt_flag")]
    pub disabled: Option<bool>,
    #[serde(default, deserialize_with = "de::opt_i64")]
    pub team_id: Option<i64>,
    #[serde(default, deserialize_with = "de::patch_i64")]
    pub rpm: Option<Option<i64>>,
    #[serde(default, deserialize_with = "de::patch_i64")]
    pub tpm: Option<Option<i64>>,
    #[serde(default, deserialize_with = "de::patch_text")]
    pub budget_usd: Option<Option<String>>,
}

#[derive(Debug, Deserialize)]
pub struct LoginPatch {
    #[serde(default, deserialize_with = "de::opt_text")]
    pub role: Option<String>,
    #[serde(default, deserialize_with = "de::patch_i64")]
    pub team_id: Option<Option<i64>>,
    #[serde(default, deserialize_with = "de::opt_flag")]
    pub disabled: Option<bool>,
    /// An admin sets a new password for someone else (e.g. finance, who cannot change theirs).
    #[serde(default, deserialize_with = "de::opt_secret")]
    pub password: Option<String>,
}

#[derive(Debug, serde::Serialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum Created {
    Member(MemberRow),
    Login(LoginRow),
}

pub async fn members(
    state: &AppState,
    actor: &Actor,
    team: Option<i64>,
) -> Result<Vec<MemberRow>, AdminError> {
    if let Some(t) = team {
        actor.see_team(t)?;
    }
    Ok(directory::members(&state.db, team.or(actor.scope())).await?)
}

pub async fn logins(state: &AppState, actor: &Actor) -> Result<Vec<LoginRow>, AdminError> {
    Ok(directory::logins(&state.db, actor.scope()).await?)
}

fn check_rate(field: &str, v: Option<i64>) -> Result<(), AdminError> {
    match v {
        Some(n) if n < 1 => Err(AdminError::invalid(format!("{field} must be at least 1"))),
        _ => Ok(()),
    }
}

async fn team_of(tx: &mut crate::store::Tx, actor: &Actor, id: i64) -> Result<TeamRow, AdminError> {
    actor.see_team(id)?;
    directory::team(tx, id).await?.ok_or(AdminError::NotFound)
}

/// Names the audit log gives actors that are not logins: no login may be called so.
pub(super) fn reserved(name: &str) -> bool {
    matches!(name, "cli" | "system")
}

pub async fn create(state: &AppState, actor: &Actor, u: NewUser) -> Result<Created, AdminError> {
    actor.require_write()?;
    let username = u.username.unwrap_or_default();
    view::check_name("username", &username)?;
    if reserved(&username) {
        return Err(AdminError::invalid(
            "username: `cli` and `system` are reserved",
        ));
    }
    let role = u.role.as_deref().unwrap_or("member");
    let login_role = match role {
        "member" => None,
        r => Some(
            Role::parse(r)
                .ok_or_else(|| AdminError::invalid("role: member, lead, finance or admin"))?,
        ),
    };
    if login_role.is_some() {
        actor.require_session("create logins")?;
    }
    if login_role.is_some() && actor.role != Role::Admin {
        return Err(AdminError::Forbidden(
            "Only an admin can create logins or give roles.".into(),
        ));
    }
    // A lead's new member always joins the lead's team.
    let team_id = match actor.scope() {
        Some(own) => {
            if u.team_id.is_some_and(|t| t != own) {
                return Err(AdminError::NotFound);
            }
            Some(own)
        }
        None => u.team_id,
    };
    check_rate("rpm", u.rpm)?;
    check_rate("tpm", u.tpm)?;
    let limit = view::opt_usd("budget_usd", u.budget_usd.as_deref())?;
    let reset = parse_reset(u.reset.as_deref(), Reset::Monthly)?;
    let hash = match login_role {
        Some(_) => Some(
            state
                .passwords
                .hash(u.password.clone().unwrap_or_default())
                .await?,
        ),
        None => None,
    };
    let now = state.clock.now();
    let mut tx = state.db.begin().await?;
    if directory::username_taken(&mut tx, &username).await? {
        return Err(AdminError::Conflict(format!(
            "`{username}` already exists."
        )));
    }
    let team = match team_id {
        Some(t) => Some(team_of(&mut tx, actor, t).await?),
        None => None,
    };
    let created = match (login_role, hash) {
        (Some(r), Some(hash)) => {
            if r == Role::Lead && team.is_none() {
                return Err(AdminError::invalid("team_id: a lead needs a team"));
            }
            let tid = team.as_ref().map(|t| t.id);
            let id = admins::create(&mut tx, &username, &hash, r.as_str(), tid, now).await?;
            let after =
                json!({"username": username, "role": r.as_str(), "team_id": tid}).to_string();
            actor
                .audit(
                    &mut tx,
                    "admin.create",
                    &format!("admin:{id}"),
                    None,
                    Some(&after),
                    now,
                )
                .await?;
            Created::Login(
                directory::login(&mut tx, id)
                    .await?
                    .ok_or(AdminError::NotFound)?,
            )
        }
        _ => {
            let team = team.ok_or_else(|| AdminError::invalid("team_id: a member needs a team"))?;
            check_within_team(actor, &team, limit, false)?;
            let nu = StoreUser {
                username: &username,
                team_id: team.id,
                rpm: u.rpm,
                tpm: u.tpm,
                budget: NewBudget {
                    limit_micros: limit,
                    reset,
                },
            };
            let id = tenants::create_user(&mut tx, &nu, now).await?;
            let after = json!({"username": username, "team_id": team.id, "rpm": u.rpm, "tpm": u.tpm, "limit_micros": limit}).to_string();
            actor
                .audit(
                    &mut tx,
                    "user.create",
                    &format!("user:{id}"),
                    None,
                    Some(&after),
                    now,
                )
                .await?;
            Created::Member(
                directory::member(&mut tx, id)
                    .await?
                    .ok_or(AdminError::NotFound)?,
            )
        }
    };
    tx.commit().await?;
    Ok(created)
}

pub async fn update_member(
    state: &AppState,
    actor: &Actor,
    id: i64,
    p: MemberPatch,
) -> Result<MemberRow, AdminError> {
    actor.require_write()?;
    let now = state.clock.now();
    let mut tx = state.db.begin().await?;
    let before = directory::member(&mut tx, id)
        .await?
        .ok_or(AdminError::NotFound)?;
    actor.see_team(before.team_id)?;
    let team_id = p.team_id.unwrap_or(before.team_id);
    if team_id != before.team_id && actor.role != Role::Admin {
        return Err(AdminError::Forbidden(
            "Only an admin can move a user to another team.".into(),
        ));
    }
    let team = team_of(&mut tx, actor, team_id).await?;
    let edit = MemberEdit {
        team_id,
        disabled: p.disabled.unwrap_or(before.disabled),
        rpm: p.rpm.unwrap_or(before.rpm),
        tpm: p.tpm.unwrap_or(before.tpm),
    };
    check_rate("rpm", edit.rpm)?;
    check_rate("tpm", edit.tpm)?;
    directory::update_member(&mut tx, id, &edit).await?;
    if let Some(b) = &p.budget_usd {
        let limit = view::opt_usd("budget_usd", b.as_deref())?;
        check_within_team(actor, &team, limit, false)?;
        let reset = Reset::parse(&before.reset).unwrap_or(Reset::Monthly);
        ledger::set_limit(&mut tx, Level::User, id, reset, limit, now).await?;
    }
    tokens::bump_epoch(&mut tx).await?;
    let after = directory::member(&mut tx, id)
        .await?
        .ok_or(AdminError::NotFound)?;
    let snap = |m: &MemberRow| {
        json!({"team_id": m.team_id, "disabled": m.disabled, "rpm": m.rpm, "tpm": m.tpm, "limit_micros": m.limit_micros}).to_string()
    };
    let action = match (before.disabled, after.disabled) {
        (false, true) => "user.disable",
        (true, false) => "user.enable",
        _ => "user.update",
    };
    actor
        .audit(
            &mut tx,
            action,
            &format!("user:{id}"),
            Some(&snap(&before)),
            Some(&snap(&after)),
            now,
        )
        .await?;
    tx.commit().await?;
    Ok(after)
}

pub async fn update_login(
    state: &AppState,
    actor: &Actor,
    id: i64,
    p: LoginPatch,
) -> Result<LoginRow, AdminError> {
    if id == actor.id
        && (p.role.is_some() || p.team_id.is_some() || p.disabled.is_some() || p.password.is_some())
    {
        return Err(AdminError::Forbidden(
            "You cannot change your own role, team or status here (your password: Account).".into(),
        ));
    }
    actor.require_write()?;
    if p.role.is_some() || p.team_id.is_some() || p.password.is_some() {
        actor.require_session("set a login's password, role or team")?;
    }
    // Enabling arms a login as much as a password does (whoever knows its password, or
    // holds its keys, is back in); disabling stays open to a key (an incident script).
    if p.disabled == Some(false) {
        actor.require_session("enable a login")?;
    }
    let new_hash = match &p.password {
        Some(pw) if actor.is_admin() => Some(state.passwords.hash(pw.clone()).await?),
        _ => None,
    };
    let now = state.clock.now();
    let mut tx = state.db.begin().await?;
    let before = directory::login(&mut tx, id)
        .await?
        .ok_or(AdminError::NotFound)?;
    if let Some(t) = before.team_id {
        actor.see_team(t)?;
    } else if actor.role == Role::Lead {
        return Err(AdminError::NotFound);
    }
    if actor.role == Role::Lead {
        return Err(AdminError::Forbidden(
            "Only an admin can change logins and roles.".into(),
        ));
    }
    actor.require_admin()?;
    // The break-glass login outlives every other way in (single sign-on off or down): a
    // password set here would outlive its setter's removal at the provider.
    if before.break_glass && p.password.is_some() {
        return Err(AdminError::Forbidden(
            "The break-glass login's password is set from the CLI: `sluice admin reset-password`."
                .into(),
        ));
    }
    let role = match &p.role {
        Some(r) => {
            Role::parse(r).ok_or_else(|| AdminError::invalid("role: lead, finance or admin"))?
        }
        None => Role::parse(&before.role).ok_or(AdminError::Internal)?,
    };
    let team_id = p.team_id.unwrap_or(before.team_id);
    if let Some(t) = team_id {
        directory::team(&mut tx, t)
            .await?
            .ok_or(AdminError::NotFound)?;
    }
    if role == Role::Lead && team_id.is_none() {
        return Err(AdminError::invalid("team_id: a lead needs a team"));
    }
    let edit = LoginEdit {
        role: role.as_str(),
        team_id,
        disabled: p.disabled.unwrap_or(before.disabled),
    };
    directory::update_login(&mut tx, id, &edit).await?;
    if let Some(h) = &new_hash {
        sessions::set_password_hash(&mut tx, id, h).await?;
    }
    let changed = role.as_str() != before.role || team_id != before.team_id;
    if new_hash.is_some() || edit.disabled || changed {
        // A changed or disabled login signs in again with what it now is.
        sessions::delete_sessions_of(&mut tx, id, None).await?;
    }
    // A reset password ends what the old one opened: the login's API keys too. So does a
    // new role or team: a key acts as its login does now, and a lead's key (perhaps
    // leaked) became an admin's, or another team's, never confirmed in a session (s29
    // admin attack F1).
    let keys_revoked = if new_hash.is_some() || changed {
        sessions::revoke_api_keys_of(&mut tx, id, now).await?
    } else {
        0
    };
    let after = directory::login(&mut tx, id)
        .await?
        .ok_or(AdminError::NotFound)?;
    let snap = |l: &LoginRow| {
        json!({"role": l.role, "team_id": l.team_id, "disabled": l.disabled}).to_string()
    };
    let mut after_snap: serde_json::Value = serde_json::from_str(&snap(&after)).unwrap_or_default();
    if new_hash.is_some() {
        after_snap["password_reset"] = json!(true);
    }
    if new_hash.is_some() || changed {
        after_snap["api_keys_revoked"] = json!(keys_revoked);
    }
    actor
        .audit(
            &mut tx,
            "admin.update",
            &format!("admin:{id}"),
            Some(&snap(&before)),
            Some(&after_snap.to_string()),
            now,
        )
        .await?;
    tx.commit().await?;
    Ok(after)
}
