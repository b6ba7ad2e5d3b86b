//! Sub-token operations shared by the UI and the API: issue (the text is returned once and
//! never stored), revoke, rotate (a new token with the same settings; the old text keeps
//! working for the chosen overlap, as the new token), edit limits, top up. A lead acts only
//! on tokens of their own team's users, never beyond the team's budget, and cannot grant
//! CRITICAL priority.

use chrono::Duration;
use serde::Deserialize;
use serde_json::json;

use super::actor::{Actor, Role};
use super::error::AdminError;
use super::input::de;
use super::teams::{check_within_team, parse_reset};
use super::view;
use crate::auth::token;
use crate::quota::period::Reset;
use crate::state::AppState;
use crate::store::directory;
use crate::store::ledger::{self, Level};
use crate::store::tags::{self as tag_store, Owner};
use crate::store::token_admin::{self, Limits, TokenRow};
use crate::store::tokens::{self, NewTokenRow};
use crate::tags::Tags;

/// Longest rotation overlap: 30 days.
pub const MAX_OVERLAP_SECONDS: i64 = 30 * 24 * 3600;

#[derive(Debug, Deserialize)]
pub struct Issue {
    #[serde(default, deserialize_with = "de::opt_i64")]
    pub user_id: Option<i64>,
    #[serde(default, deserialize_with = "de::opt_text")]
    pub name: Option<String>,
    #[serde(default, deserialize_with = "de::opt_text")]
    pub budget_usd: Option<String>,
    #[serde(default, deserialize_with = "de::opt_text")]
    pub reset: Option<String>,
    /// RFC 3339, or a `datetime-local` value with `tz_offset` (minutes, as JavaScript gives it).
    #[serde(default, deserialize_with = "de::opt_text")]
    pub expires: Option<String>,
    #[serde(default, deserialize_with = "de::opt_i64")]
    pub tz_offset: Option<i64>,
    #[serde(default, deserialize_with = "de::opt_i64")]
    pub rpm: Option<i64>,
    #[serde(default, deserialize_with = "de::opt_i64")]
    pub tpm: Option<i64>,
    #[serde(default, deserialize_with = "de::opt_list")]
    pub models: Option<Vec<String>>,
    #[serde(default, deserialize_with = "de::opt_i64")]
    pub max_priority: Option<i64>,
    #[serde(default, deserialize_with = "de::opt_text")]
    pub downgrade_model: Option<String>,
    /// Default tags, `key:value,key:value` (`pipeline::tags`).
    #[serde(default, deserialize_with = "de::opt_text")]
    pub tags: Option<String>,
}

/// An edit of a live token: absent fields stay, empty ones are cleared.
#[derive(Debug, Deserialize)]
pub struct Edit {
    #[serde(default, deserialize_with = "de::patch_text")]
    pub budget_usd: Option<Option<String>>,
    #[serde(default, deserialize_with = "de::patch_text")]
    pub expires: Option<Option<String>>,
    #[serde(default, deserialize_with = "de::opt_i64")]
    pub tz_offset: Option<i64>,
    #[serde(default, deserialize_with = "de::patch_i64")]
    pub rpm: Option<Option<i64>>,
    #[serde(default, deserialize_with = "de::patch_i64")]
    pub tpm: Option<Option<i64>>,
    #[serde(default, deserialize_with = "de::opt_list")]
    pub models: Option<Vec<String>>,
    /// With `models` absent, `all_models = true` clears the model list.
    #[serde(default, deserialize_with = "de::flag")]
    pub all_models: bool,
    #[serde(default, deserialize_with = "de::opt_i64")]
    pub max_priority: Option<i64>,
    #[serde(default, deserialize_with = "de::patch_text")]
    pub downgrade_model: Option<Option<String>>,
    /// Default tags; empty clears them.
    #[serde(default, deserialize_with = "de::patch_text")]
    pub tags: Option<Option<String>>,
}

#[derive(Debug, Deserialize)]
pub struct Rotate {
    #[serde(default, deserialize_with = "de::opt_i64")]
    pub overlap_seconds: Option<i64>,
}

#[derive(Debug, Deserialize)]
pub struct TopUp {
    #[serde(default, deserialize_with = "de::opt_text")]
    pub amount_usd: Option<String>,
}

/// A new token: its row, and its text, which exists only in this answer.
pub struct Issued {
    pub row: TokenRow,
    pub text: String,
}

pub async fn list(
    state: &AppState,
    actor: &Actor,
    user: Option<i64>,
) -> Result<token_admin::Listed, AdminError> {
    Ok(token_admin::list(&state.db, actor.scope(), user, state.clock.now()).await?)
}

/// Checks limits a token is given; `had` is the priority it had before (an edit), `None`
/// for a new token. CRITICAL is refused to all but an admin when it is granted, not when a
/// token an admin made CRITICAL keeps it: a lead lowering such a token's rpm or budget was
/// refused, while a rotation kept it CRITICAL (s29 admin attack F3).
fn check_limits(
    state: &AppState,
    actor: &Actor,
    l: &Limits,
    had: Option<i64>,
) -> Result<(), AdminError> {
    for (f, v) in [("rpm", l.rpm), ("tpm", l.tpm)] {
        if v.is_some_and(|v| v < 1) {
            return Err(AdminError::invalid(format!("{f} must be at least 1")));
        }
    }
    if !(1..=4).contains(&l.max_priority) {
        return Err(AdminError::invalid("max_priority: 1 (CRITICAL) to 4 (LOW)"));
    }
    let granted = had.is_none_or(|had| l.max_priority < had);
    if l.max_priority < 2 && granted && actor.role != Role::Admin {
        return Err(AdminError::Forbidden(
            "Only an admin can grant CRITICAL priority.".into(),
        ));
    }
    for m in l.models.iter().flatten().chain(l.downgrade_model.iter()) {
        if state.catalog().model(m).is_none() {
            return Err(AdminError::invalid(format!(
                "model `{m}` is not configured"
            )));
        }
    }
    Ok(())
}

/// Default tags as given by an admin, in canonical form (`pipeline::tags`'s rules).
pub fn default_tags(text: Option<&str>) -> Result<String, AdminError> {
    Tags::parse(text.unwrap_or(""))
        .map(|t| t.canonical())
        .map_err(|e| AdminError::invalid(format!("tags: {e}")))
}

/// The token, if the actor may see it (another team's token does not exist for a lead).
async fn visible(
    tx: &mut crate::store::Tx,
    actor: &Actor,
    id: i64,
) -> Result<TokenRow, AdminError> {
    let t = token_admin::get(tx, id)
        .await?
        .ok_or(AdminError::NotFound)?;
    actor.see_team(t.team_id)?;
    Ok(t)
}

/// A rotated token works as its successor until its overlap ends: its own settings and
/// budget no longer apply, so a change to them (or a second rotation) would be accepted and
/// do nothing — or hand its budget out again. Only a revocation still acts on it.
fn refuse_if_rotated(t: &TokenRow) -> Result<(), AdminError> {
    match t.successor_id {
        Some(next) => Err(AdminError::Conflict(format!(
            "This token was rotated to token {next}: until its overlap ends it works as that token. Change token {next}, or revoke this one."
        ))),
        None => Ok(()),
    }
}

async fn team_row(tx: &mut crate::store::Tx, id: i64) -> Result<directory::TeamRow, AdminError> {
    directory::team(tx, id).await?.ok_or(AdminError::NotFound)
}

pub async fn issue(state: &AppState, actor: &Actor, i: Issue) -> Result<Issued, AdminError> {
    actor.require_write()?;
    let user_id = i
        .user_id
        .ok_or_else(|| AdminError::invalid("user_id is required"))?;
    let limit = view::opt_usd("budget_usd", i.budget_usd.as_deref())?;
    let reset = parse_reset(i.reset.as_deref(), Reset::Never)?;
    let now = state.clock.now();
    let expires = i
        .expires
        .as_deref()
        .map(|e| view::parse_expiry(e, i.tz_offset))
        .transpose()?;
    // In the future on the clock the expiry is judged by (the database's on PostgreSQL),
    // not this host's: a host whose clock is off refused a good expiry or issued a token
    // dead from the start (s25 final attack F3).
    if expires.is_some_and(|e| e <= state.auth.on_db_clock(now)) {
        return Err(AdminError::invalid("expires must be in the future"));
    }
    let limits = Limits {
        rpm: i.rpm,
        tpm: i.tpm,
        models: i.models,
        max_priority: i.max_priority.unwrap_or(2),
        downgrade_model: i.downgrade_model,
        expires_at: expires,
    };
    let name = i.name.unwrap_or_default();
    super::input::check_name(&name)?;
    let tags = default_tags(i.tags.as_deref())?;
    let new = token::generate();
    let mut tx = state.db.begin().await?;
    let user = directory::member(&mut tx, user_id)
        .await?
        .ok_or(AdminError::NotFound)?;
    actor.see_team(user.team_id)?;
    check_limits(state, actor, &limits, None)?;
    check_within_team(actor, &team_row(&mut tx, user.team_id).await?, limit, true)?;
    let row = NewTokenRow {
        user_id,
        hash: &new.hash,
        prefix: &new.display_prefix,
        models: limits.models.as_deref(),
        rpm: limits.rpm,
        tpm: limits.tpm,
        max_priority: limits.max_priority,
        downgrade_model: limits.downgrade_model.as_deref(),
        limit_micros: limit,
        reset,
        expires_at: expires,
    };
    let id = tokens::insert(&mut tx, &row, now).await?;
    token_admin::set_name(&mut tx, id, &name).await?;
    if !tags.is_empty() {
        tag_store::set(&mut tx, Owner::Token(id), &tags).await?;
    }
    let after = json!({"user_id": user_id, "prefix": new.display_prefix, "name": name, "limit_micros": limit,
        "reset": reset.as_str(), "limits": limits, "tags": tags}).to_string();
    let row = audited(tx, actor, "token.issue", id, None, Some(&after), now).await?;
    Ok(Issued {
        row,
        text: new.text,
    })
}

pub async fn revoke(state: &AppState, actor: &Actor, id: i64) -> Result<TokenRow, AdminError> {
    let now = state.clock.now();
    let mut tx = state.db.begin().await?;
    let t = visible(&mut tx, actor, id).await?;
    actor.require_write()?;
    if !tokens::revoke(&mut tx, id, now).await? {
        return Err(AdminError::Conflict(
            "That token is already revoked.".into(),
        ));
    }
    let before = json!({"prefix": t.prefix, "revoked": false}).to_string();
    let row = audited(
        tx,
        actor,
        "token.revoke",
        id,
        Some(&before),
        Some("{\"revoked\":true}"),
        now,
    )
    .await?;
    Ok(row)
}

/// A new token with the old one's settings. Its budget: the same limit for a periodic budget,
/// the period going on where the old one was (its spend carried, `ledger::carry_to_successor`:
/// a rotation refilled the period); for a budget that never resets, what the old one had left. The old token's text stays
/// valid `overlap_seconds` more, then expires — as the new token: its successor's budget,
/// windows and limits, its requests logged and charged as the new token's, so the pair
/// never spends more than the new token's budget (review s21 #7: with two budgets it could
/// spend the old one's remaining twice).
pub async fn rotate(
    state: &AppState,
    actor: &Actor,
    id: i64,
    r: Rotate,
) -> Result<Issued, AdminError> {
    let overlap = r.overlap_seconds.unwrap_or(0);
    if !(0..=MAX_OVERLAP_SECONDS).contains(&overlap) {
        return Err(AdminError::invalid(
            "overlap_seconds: 0 to 2592000 (30 days)",
        ));
    }
    let now = state.clock.now();
    // The old text's cut-off, and whether the token is still live, on the clock expiry is
    // judged by (the database's on PostgreSQL: `Authenticator::on_db_clock`), so an admin
    // host whose clock is off neither ends the overlap early nor leaves the old text valid
    // past it.
    let expiry_now = state.auth.on_db_clock(now);
    let new = token::generate();
    let mut tx = state.db.begin().await?;
    // Locked before it is read: a never-resetting budget's successor takes the remaining
    // read here, which a reservation committed between this read and the lock would leave
    // on the old token too (s26 attack money F4, PostgreSQL).
    token_admin::lock(&mut tx, id).await?;
    let old = visible(&mut tx, actor, id).await?;
    actor.require_write()?;
    let expired = old
        .expires_at
        .as_deref()
        .is_some_and(|e| e <= crate::clock::db_time(expiry_now).as_str());
    if old.revoked_at.is_some() || expired {
        return Err(AdminError::Conflict(
            "Only a live token can be rotated.".into(),
        ));
    }
    // Rotated again, its budget (unspent since: the old text spends the successor's) would
    // be handed out twice, and a revoked successor's old text brought back.
    refuse_if_rotated(&old)?;
    let reset = Reset::parse(&old.reset).unwrap_or(Reset::Never);
    let limit = match reset {
        Reset::Never => old.remaining_micros.map(|r| r.max(0)),
        _ => old.limit_micros,
    };
    let models = old.models();
    let expires = old
        .expires_at
        .as_deref()
        .and_then(|e| chrono::DateTime::parse_from_rfc3339(e).ok())
        .map(|e| e.with_timezone(&chrono::Utc));
    let row = NewTokenRow {
        user_id: old.user_id,
        hash: &new.hash,
        prefix: &new.display_prefix,
        models: models.as_deref(),
        rpm: old.rpm,
        tpm: old.tpm,
        max_priority: old.max_priority,
        downgrade_model: old.downgrade_model.as_deref(),
        limit_micros: limit,
        reset,
        expires_at: expires,
    };
    let new_id = tokens::insert(&mut tx, &row, now).await?;
    token_admin::set_name(&mut tx, new_id, &old.name).await?;
    if !old.tags.is_empty() {
        tag_store::set(&mut tx, Owner::Token(new_id), &old.tags).await?;
    }
    token_admin::set_successor(&mut tx, id, new_id).await?;
    token_admin::expire_at(&mut tx, id, expiry_now + Duration::seconds(overlap)).await?;
    let carried = ledger::carry_to_successor(&mut tx, id, new_id, now).await?;
    let after = json!({"new_token_id": new_id, "new_prefix": new.display_prefix, "overlap_seconds": overlap, "limit_micros": limit, "carried_micros": carried}).to_string();
    let before = json!({"prefix": old.prefix, "expires_at": old.expires_at}).to_string();
    actor
        .audit(
            &mut tx,
            "token.rotate",
            &format!("token:{id}"),
            Some(&before),
            Some(&after),
            now,
        )
        .await?;
    let row = token_admin::get(&mut tx, new_id)
        .await?
        .ok_or(AdminError::NotFound)?;
    tx.commit().await?;
    Ok(Issued {
        row,
        text: new.text,
    })
}

pub async fn edit(
    state: &AppState,
    actor: &Actor,
    id: i64,
    e: Edit,
) -> Result<TokenRow, AdminError> {
    let now = state.clock.now();
    let mut tx = state.db.begin().await?;
    let before = visible(&mut tx, actor, id).await?;
    actor.require_write()?;
    if before.revoked_at.is_some() {
        return Err(AdminError::Conflict(
            "A revoked token cannot be changed.".into(),
        ));
    }
    refuse_if_rotated(&before)?;
    let expires = match &e.expires {
        None => before
            .expires_at
            .as_deref()
            .and_then(|x| chrono::DateTime::parse_from_rfc3339(x).ok())
            .map(|x| x.with_timezone(&chrono::Utc)),
        Some(None) => None,
        Some(Some(x)) => Some(view::parse_expiry(x, e.tz_offset)?),
    };
    let limits = Limits {
        rpm: e.rpm.unwrap_or(before.rpm),
        tpm: e.tpm.unwrap_or(before.tpm),
        models: match (e.models, e.all_models) {
            (Some(m), _) => Some(m),
            (None, true) => None,
            (None, false) => before.models(),
        },
        max_priority: e.max_priority.unwrap_or(before.max_priority),
        downgrade_model: e.downgrade_model.unwrap_or(before.downgrade_model.clone()),
        expires_at: expires,
    };
    check_limits(state, actor, &limits, Some(before.max_priority))?;
    token_admin::set_limits(&mut tx, id, &limits).await?;
    let mut after = json!({"limits": limits});
    if let Some(t) = &e.tags {
        let tags = default_tags(t.as_deref())?;
        tag_store::set(&mut tx, Owner::Token(id), &tags).await?;
        after["tags"] = json!(tags);
    }
    if let Some(b) = &e.budget_usd {
        let limit = view::opt_usd("budget_usd", b.as_deref())?;
        check_within_team(
            actor,
            &team_row(&mut tx, before.team_id).await?,
            limit,
            true,
        )?;
        let reset = Reset::parse(&before.reset).unwrap_or(Reset::Never);
        ledger::set_limit(&mut tx, Level::Token, id, reset, limit, now).await?;
        after["limit_micros"] = json!(limit);
    }
    let snap = json!({"rpm": before.rpm, "tpm": before.tpm, "models": before.models(), "max_priority": before.max_priority,
        "downgrade_model": before.downgrade_model, "expires_at": before.expires_at, "limit_micros": before.limit_micros,
        "tags": before.tags}).to_string();
    let row = audited(
        tx,
        actor,
        "token.update",
        id,
        Some(&snap),
        Some(&after.to_string()),
        now,
    )
    .await?;
    Ok(row)
}

pub async fn top_up(
    state: &AppState,
    actor: &Actor,
    id: i64,
    t: TopUp,
) -> Result<TokenRow, AdminError> {
    let amount = view::parse_usd("amount_usd", t.amount_usd.as_deref().unwrap_or(""))?;
    if amount <= 0 {
        return Err(AdminError::invalid("amount_usd must be more than 0"));
    }
    let now = state.clock.now();
    let mut tx = state.db.begin().await?;
    let before = visible(&mut tx, actor, id).await?;
    actor.require_write()?;
    refuse_if_rotated(&before)?;
    let Some(limit) = before.limit_micros else {
        return Err(AdminError::invalid(
            "This token has no budget to top up; set one instead.",
        ));
    };
    let new_limit = limit
        .checked_add(amount)
        .ok_or_else(|| AdminError::invalid("amount too large"))?;
    check_within_team(
        actor,
        &team_row(&mut tx, before.team_id).await?,
        Some(new_limit),
        true,
    )?;
    if !ledger::top_up(&mut tx, Level::Token, id, amount).await? {
        return Err(AdminError::Conflict(
            "The token's budget changed; reload and try again.".into(),
        ));
    }
    tokens::bump_epoch(&mut tx).await?;
    let (b, a) = (
        json!({"limit_micros": limit}).to_string(),
        json!({"limit_micros": new_limit, "top_up_micros": amount}).to_string(),
    );
    let row = audited(tx, actor, "budget.top_up", id, Some(&b), Some(&a), now).await?;
    Ok(row)
}

/// The end of every token operation: its one audit row, the token read back, the commit.
async fn audited(
    mut tx: crate::store::Tx,
    actor: &Actor,
    action: &str,
    id: i64,
    before: Option<&str>,
    after: Option<&str>,
    now: chrono::DateTime<chrono::Utc>,
) -> Result<TokenRow, AdminError> {
    actor
        .audit(&mut tx, action, &format!("token:{id}"), before, after, now)
        .await?;
    let row = token_admin::get(&mut tx, id)
        .await?
        .ok_or(AdminError::NotFound)?;
    tx.commit().await?;
    Ok(row)
}
