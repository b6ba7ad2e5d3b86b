//! What the CLI commands do (`args` is the command line, `dispatch` hands each command to
//! its implementation, `main.rs` only calls them). Every command that changes
//! something runs in one `BEGIN IMMEDIATE` transaction with its audit row. The modules
//! below are the commands' own work and what they print; this file is what they change.

pub mod admin_commands;
pub mod args;
pub mod audit_commands;
pub mod backup;
pub mod cache;
pub mod check_config;
pub mod demo;
pub mod dispatch;
pub mod mock;
pub mod prompt;
pub mod reconcile;
pub mod rotate;
pub mod serve;
pub mod signals;
pub mod store_copy;
pub mod tenant_commands;
pub mod token_commands;

use std::path::Path;

use chrono::{DateTime, Utc};
use serde_json::json;

use crate::auth::{password, throttle, token};
use crate::ops::audit_head::{self, Exported, HeadError};
use crate::quota::period::Reset;
use crate::quota::pricing;
use crate::store::audit::{self, AuditEntry};
use crate::store::tags::{self as tag_store, Owner};
use crate::store::tenants::{self, NewBudget, NewUser, DEFAULT_TEAM};
use crate::store::{admins, ledger, sessions, token_admin, tokens, Db, StoreError};
use crate::tags::Tags;

#[derive(Debug, thiserror::Error)]
pub enum CliError {
    #[error("{0}")]
    Invalid(String),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Password(#[from] password::PasswordError),
    #[error(transparent)]
    Head(#[from] HeadError),
    /// `audit verify` found these problems (one per line).
    #[error("{}", .0.join("\n"))]
    Tampered(Vec<String>),
}

const ACTOR: &str = "cli";

fn budget(usd: Option<&str>) -> Result<Option<i64>, CliError> {
    usd.map(|u| {
        pricing::parse_usd(u)
            .ok_or_else(|| CliError::Invalid(format!("`{u}` is not a USD amount like 12.50")))
    })
    .transpose()
}

fn reset(r: Option<&str>, default: Reset) -> Result<Reset, CliError> {
    r.map(|r| {
        Reset::parse(r).ok_or_else(|| {
            CliError::Invalid(format!(
                "--reset must be daily, weekly, monthly or never, not `{r}`"
            ))
        })
    })
    .transpose()
    .map(|r| r.unwrap_or(default))
}

/// The team named `name`, made (and audited, as the web surface audits it) when missing:
/// a command that makes a team on the way leaves the same trace as one that makes it on
/// purpose (s26 attack admin #5).
async fn team_for(
    tx: &mut crate::store::Tx,
    name: &str,
    now: DateTime<Utc>,
) -> Result<i64, CliError> {
    if let Some(id) = tenants::team_id(tx, name).await? {
        return Ok(id);
    }
    let budget = NewBudget {
        limit_micros: None,
        reset: Reset::Monthly,
    };
    let id = tenants::create_team(tx, name, &budget, now).await?;
    let after =
        json!({"name": name, "limit_micros": null, "reset": budget.reset.as_str(), "tags": ""})
            .to_string();
    audit::append(
        tx,
        &audit_entry("team.create", &format!("team:{id}"), Some(&after)),
        now,
    )
    .await?;
    Ok(id)
}

/// Makes user `u` and audits it (`user.create`).
async fn user_made(
    tx: &mut crate::store::Tx,
    u: &NewUser<'_>,
    now: DateTime<Utc>,
) -> Result<i64, CliError> {
    let id = tenants::create_user(tx, u, now).await?;
    let after = json!({"username": u.username, "team_id": u.team_id, "rpm": u.rpm, "tpm": u.tpm, "limit_micros": u.budget.limit_micros}).to_string();
    audit::append(
        tx,
        &audit_entry("user.create", &format!("user:{id}"), Some(&after)),
        now,
    )
    .await?;
    Ok(id)
}

fn audit_entry<'a>(action: &'a str, target: &'a str, after: Option<&'a str>) -> AuditEntry<'a> {
    AuditEntry {
        actor: ACTOR,
        address: "",
        action,
        target,
        before: None,
        after,
    }
}

pub async fn team_create(
    db: &Db,
    name: &str,
    budget_usd: Option<&str>,
    now: DateTime<Utc>,
) -> Result<i64, CliError> {
    team_create_tagged(db, name, budget_usd, None, now).await
}

/// Default tags given on the command line (`--tags k:v,…`), canonical.
fn default_tags(text: Option<&str>) -> Result<String, CliError> {
    Tags::parse(text.unwrap_or(""))
        .map(|t| t.canonical())
        .map_err(|e| CliError::Invalid(format!("--tags: {e}")))
}

/// `team create --tags`: a team with default tags for its requests.
pub async fn team_create_tagged(
    db: &Db,
    name: &str,
    budget_usd: Option<&str>,
    tags: Option<&str>,
    now: DateTime<Utc>,
) -> Result<i64, CliError> {
    let b = NewBudget {
        limit_micros: budget(budget_usd)?,
        reset: Reset::Monthly,
    };
    let tags = default_tags(tags)?;
    let mut tx = db.begin().await?;
    let id = tenants::create_team(&mut tx, name, &b, now).await?;
    if !tags.is_empty() {
        tag_store::set(&mut tx, Owner::Team(id), &tags).await?;
    }
    let after = json!({"name": name, "limit_micros": b.limit_micros, "tags": tags}).to_string();
    audit::append(
        &mut tx,
        &audit_entry("team.create", &format!("team:{id}"), Some(&after)),
        now,
    )
    .await?;
    tx.commit().await?;
    Ok(id)
}

/// `team edit NAME --tags k:v,…` (empty clears them); running gateways follow within a
/// second (the token epoch moves).
pub async fn team_edit_tags(
    db: &Db,
    name: &str,
    tags: &str,
    now: DateTime<Utc>,
) -> Result<i64, CliError> {
    let tags = default_tags(Some(tags))?;
    let mut tx = db.begin().await?;
    let id = tenants::team_id(&mut tx, name)
        .await?
        .ok_or_else(|| CliError::Invalid(format!("no team named `{name}`")))?;
    tag_store::set(&mut tx, Owner::Team(id), &tags).await?;
    let after = json!({"tags": tags}).to_string();
    audit::append(
        &mut tx,
        &audit_entry("team.tags", &format!("team:{id}"), Some(&after)),
        now,
    )
    .await?;
    tx.commit().await?;
    Ok(id)
}

pub struct UserArgs<'a> {
    pub username: &'a str,
    pub team: Option<&'a str>,
    pub rpm: Option<i64>,
    pub tpm: Option<i64>,
    pub budget_usd: Option<&'a str>,
    pub reset: Option<&'a str>,
}

pub async fn user_create(db: &Db, a: &UserArgs<'_>, now: DateTime<Utc>) -> Result<i64, CliError> {
    let b = NewBudget {
        limit_micros: budget(a.budget_usd)?,
        reset: reset(a.reset, Reset::Monthly)?,
    };
    let mut tx = db.begin().await?;
    let team_id = team_for(&mut tx, a.team.unwrap_or(DEFAULT_TEAM), now).await?;
    let u = NewUser {
        username: a.username,
        team_id,
        rpm: a.rpm,
        tpm: a.tpm,
        budget: b,
    };
    let id = user_made(&mut tx, &u, now).await?;
    tx.commit().await?;
    Ok(id)
}

pub struct IssueArgs<'a> {
    pub user: &'a str,
    pub budget_usd: Option<&'a str>,
    pub reset: Option<&'a str>,
    pub expires: Option<&'a str>,
    pub rpm: Option<i64>,
    pub tpm: Option<i64>,
    pub models: Option<&'a str>,
    pub max_priority: i64,
    pub downgrade_model: Option<&'a str>,
}

pub struct Issued {
    pub id: i64,
    pub text: String,
    pub limit_micros: Option<i64>,
}

pub async fn token_issue(
    db: &Db,
    a: &IssueArgs<'_>,
    now: DateTime<Utc>,
) -> Result<Issued, CliError> {
    token_issue_tagged(db, a, None, now).await
}

/// `token issue --tags`: a token with default tags for its requests.
pub async fn token_issue_tagged(
    db: &Db,
    a: &IssueArgs<'_>,
    tags: Option<&str>,
    now: DateTime<Utc>,
) -> Result<Issued, CliError> {
    let tags = default_tags(tags)?;
    let limit = budget(a.budget_usd)?;
    let reset = reset(a.reset, Reset::Never)?;
    let expires = a
        .expires
        .map(|e| {
            DateTime::parse_from_rfc3339(e)
                .map(|d| d.with_timezone(&Utc))
                .ok()
                .filter(|&d| crate::clock::storable(d))
                .ok_or_else(|| {
                    CliError::Invalid(format!(
                        "--expires `{e}` is not an RFC 3339 time within the years 0000 to 9999"
                    ))
                })
        })
        .transpose()?;
    if !(1..=4).contains(&a.max_priority) {
        return Err(CliError::Invalid(
            "--max-priority must be 1 (CRITICAL) to 4 (LOW)".into(),
        ));
    }
    for (name, v) in [("--rpm", a.rpm), ("--tpm", a.tpm)] {
        if v.is_some_and(|v| v < 1) {
            return Err(CliError::Invalid(format!("{name} must be at least 1")));
        }
    }
    let models: Option<Vec<String>> = a.models.map(|m| {
        m.split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(String::from)
            .collect()
    });
    let new = token::generate();
    let mut tx = db.begin().await?;
    let user_id = match tenants::user_ids(&mut tx, a.user).await? {
        Some((id, _)) => id,
        None => {
            let team_id = team_for(&mut tx, DEFAULT_TEAM, now).await?;
            let u = NewUser {
                username: a.user,
                team_id,
                rpm: None,
                tpm: None,
                budget: NewBudget {
                    limit_micros: None,
                    reset: Reset::Monthly,
                },
            };
            user_made(&mut tx, &u, now).await?
        }
    };
    let row = tokens::NewTokenRow {
        user_id,
        hash: &new.hash,
        prefix: &new.display_prefix,
        models: models.as_deref(),
        rpm: a.rpm,
        tpm: a.tpm,
        max_priority: a.max_priority,
        downgrade_model: a.downgrade_model,
        limit_micros: limit,
        reset,
        expires_at: expires,
    };
    let id = tokens::insert(&mut tx, &row, now).await?;
    if !tags.is_empty() {
        tag_store::set(&mut tx, Owner::Token(id), &tags).await?;
    }
    let after = json!({"user_id": user_id, "prefix": new.display_prefix, "limit_micros": limit, "reset": reset.as_str(),
        "rpm": a.rpm, "tpm": a.tpm, "models": models, "expires_at": expires, "tags": tags}).to_string();
    audit::append(
        &mut tx,
        &audit_entry("token.issue", &format!("token:{id}"), Some(&after)),
        now,
    )
    .await?;
    tx.commit().await?;
    Ok(Issued {
        id,
        text: new.text,
        limit_micros: limit,
    })
}

pub async fn token_revoke(db: &Db, id: i64, now: DateTime<Utc>) -> Result<(), CliError> {
    let mut tx = db.begin().await?;
    if !tokens::revoke(&mut tx, id, now).await? {
        return Err(CliError::Invalid(format!("no live token with id {id}")));
    }
    audit::append(
        &mut tx,
        &audit_entry("token.revoke", &format!("token:{id}"), None),
        now,
    )
    .await?;
    tx.commit().await?;
    Ok(())
}

/// Changes a token's budget: a new limit (spend kept), a top-up, or an adjustment.
pub enum BudgetChange {
    Limit(Option<i64>),
    TopUp(i64),
    Adjust { micros: i64, reason: String },
}

pub async fn token_budget(
    db: &Db,
    id: i64,
    change: BudgetChange,
    now: DateTime<Utc>,
) -> Result<(), CliError> {
    let mut tx = db.begin().await?;
    // A rotated token works as its successor: its own budget no longer applies (as the
    // admin API refuses, `admin::token_ops`).
    let rotated = token_admin::get(&mut tx, id)
        .await?
        .and_then(|t| t.successor_id);
    ledger::refuse_rotated(id, rotated)?;
    if let BudgetChange::Adjust { micros, reason } = &change {
        // The adjustment's own transaction checks again (a rotation may commit between).
        tx.rollback().await?;
        return Ok(ledger::adjust(db, id, *micros, reason, ACTOR, now).await?);
    }
    let owner = ledger::owner_of(&mut tx, id).await?;
    let target = format!("token:{id}");
    match change {
        BudgetChange::Limit(limit) => {
            ledger::set_limit(
                &mut tx,
                ledger::Level::Token,
                id,
                owner.resets[0],
                limit,
                now,
            )
            .await?;
            let after = json!({"limit_micros": limit}).to_string();
            audit::append(
                &mut tx,
                &audit_entry("budget.set_limit", &target, Some(&after)),
                now,
            )
            .await?;
        }
        BudgetChange::TopUp(micros) => {
            if !ledger::top_up(&mut tx, ledger::Level::Token, id, micros).await? {
                return Err(CliError::Invalid(format!(
                    "token {id} has no budget to top up; set one with --budget-usd"
                )));
            }
            let after = json!({"top_up_micros": micros}).to_string();
            audit::append(
                &mut tx,
                &audit_entry("budget.top_up", &target, Some(&after)),
                now,
            )
            .await?;
        }
        BudgetChange::Adjust { .. } => {}
    }
    tokens::bump_epoch(&mut tx).await?;
    tx.commit().await?;
    Ok(())
}

pub async fn admin_create(
    db: &Db,
    username: &str,
    role: &str,
    team: Option<&str>,
    pw: String,
    now: DateTime<Utc>,
) -> Result<i64, CliError> {
    admin_create_with(db, (username, role, team), pw, false, now).await
}

/// `sluice admin create`: a login of `(username, role, team)`. A break-glass one's password
/// still signs in when `[oidc] password_login = false` (`admin::login`; each such sign-in
/// is audited as `login.break_glass`). One transaction: a login is never left half made.
pub async fn admin_create_with(
    db: &Db,
    (username, role, team): (&str, &str, Option<&str>),
    pw: String,
    break_glass: bool,
    now: DateTime<Utc>,
) -> Result<i64, CliError> {
    if !matches!(role, "admin" | "lead" | "finance") {
        return Err(CliError::Invalid(
            "--role must be admin, lead or finance".into(),
        ));
    }
    if role == "lead" && team.is_none() {
        return Err(CliError::Invalid("a lead needs --team".into()));
    }
    let hash = password::hash_blocking(pw).await?;
    let mut tx = db.begin().await?;
    let team_id = match team {
        Some(t) => Some(team_for(&mut tx, t, now).await?),
        None => None,
    };
    let id = admins::create(&mut tx, username, &hash, role, team_id, now).await?;
    if break_glass {
        crate::store::oidc::set_break_glass(&mut tx, id).await?;
    }
    let after =
        json!({"username": username, "role": role, "team_id": team_id, "break_glass": break_glass})
            .to_string();
    audit::append(
        &mut tx,
        &audit_entry("admin.create", &format!("admin:{id}"), Some(&after)),
        now,
    )
    .await?;
    tx.commit().await?;
    Ok(id)
}

/// The login named `username`, or an error naming it.
async fn login_named(db: &Db, username: &str) -> Result<i64, CliError> {
    sessions::admin_by_name(db, username)
        .await?
        .map(|a| a.id)
        .ok_or_else(|| CliError::Invalid(format!("no admin login named `{username}`")))
}

/// `sluice admin unlock`: lifts the sign-in throttle's lock on one name. Anyone who can
/// reach the sign-in form can keep a name locked (five wrong passwords per window); the
/// operator on the host needs no password to let its owner in again. Returns how many
/// counted attempts were forgotten.
pub async fn admin_unlock(db: &Db, username: &str, now: DateTime<Utc>) -> Result<u64, CliError> {
    let id = login_named(db, username).await?;
    let mut tx = db.begin().await?;
    let forgotten = throttle::unlock_name((&mut tx, &db.audit), username, now).await?;
    let after = json!({ "attempts_forgotten": forgotten }).to_string();
    audit::append(
        &mut tx,
        &audit_entry("admin.unlock", &format!("admin:{id}"), Some(&after)),
        now,
    )
    .await?;
    tx.commit().await?;
    Ok(forgotten)
}

/// `sluice admin reset-password`: a new password for a login, set from the host (a locked
/// out or forgotten admin). Like a password change, it ends every session of the login and
/// revokes its API keys — whatever the old password opened — and lifts the name's lock.
pub async fn admin_reset_password(
    db: &Db,
    username: &str,
    pw: String,
    now: DateTime<Utc>,
) -> Result<i64, CliError> {
    let id = login_named(db, username).await?;
    let hash = password::hash_blocking(pw).await?;
    let mut tx = db.begin().await?;
    sessions::set_password_hash(&mut tx, id, &hash).await?;
    let ended = sessions::delete_sessions_of(&mut tx, id, None).await?;
    let revoked = sessions::revoke_api_keys_of(&mut tx, id, now).await?;
    let forgotten = throttle::unlock_name((&mut tx, &db.audit), username, now).await?;
    let after = json!({
        "sessions_ended": ended,
        "api_keys_revoked": revoked,
        "attempts_forgotten": forgotten,
    })
    .to_string();
    audit::append(
        &mut tx,
        &audit_entry("admin.password_reset", &format!("admin:{id}"), Some(&after)),
        now,
    )
    .await?;
    tx.commit().await?;
    Ok(id)
}

/// `sluice audit verify`: every row's MAC, the chain's links, and the signed head in `dir`
/// (the backup folder), the head `name` names (`[backup] head_name`). `Ok` with a summary
/// when all agree, else every problem found.
pub async fn audit_verify(db: &Db, dir: &Path, name: &str) -> Result<String, CliError> {
    let report = audit_head::verify(db, dir, name).await?;
    let problems = report.problems();
    if !problems.is_empty() {
        return Err(CliError::Tampered(problems));
    }
    Ok(format!(
        "audit log intact: {} rows verified, the signed head in {} matches",
        report.chain.rows,
        dir.join(audit_head::FILE).display()
    ))
}

/// `sluice audit rearm` (and `restore`): a new signed head over the chain as it is now,
/// the old one kept aside as `audit.head.<aside>-<time>`, `reason` recorded in the chain.
pub async fn audit_rearm(
    db: &Db,
    dir: &Path,
    name: &str,
    reason: &str,
    aside: &str,
    now: DateTime<Utc>,
) -> Result<String, CliError> {
    let reason = reason.trim();
    if reason.is_empty() || reason.chars().count() > 500 {
        return Err(CliError::Invalid(
            "--reason must say why, in 1 to 500 characters".into(),
        ));
    }
    let done = audit_head::rearm(db, dir, name, now, ACTOR, reason, aside).await?;
    let kept = match &done.kept {
        Some(p) => format!("; the head before it is kept as {}", p.display()),
        None => String::new(),
    };
    Ok(format!(
        "audit head started over {} rows in {}{kept}",
        done.head.rows,
        dir.join(audit_head::FILE).display()
    ))
}

/// After a command: the audit head in `dir` (named `name`) follows the rows it wrote (a
/// warning, never a failure of the command, when it cannot).
pub async fn export_audit_head(db: &Db, dir: &Path, name: &str, now: DateTime<Utc>) {
    match audit_head::export(db, dir, name, now).await {
        Ok(Exported::Refused(why)) => {
            eprintln!("warning: {why}; audit.head left as it is (see `sluice audit verify`)")
        }
        Ok(Exported::Started(_, why)) => eprintln!("warning: {why}"),
        Ok(_) => {}
        Err(e) => eprintln!("warning: the audit head was not written: {e}"),
    }
}

/// `sluice reconcile`'s report: a table, or with `json` the run and its rows as JSON.
pub fn reconcile_report(r: &crate::finance::run::Run, json: bool) -> String {
    if json {
        return json!({"reconciliation": r.run, "rows": r.rows}).to_string();
    }
    let run = &r.run;
    let mut out = format!(
        "reconciliation {} ({} export {}, {} to {}): {} of {} rows flagged (threshold {} USD and {}.{:02} %)\n",
        run.id,
        run.provider,
        run.source,
        run.first_day,
        run.last_day,
        run.flagged,
        r.rows.len(),
        pricing::usd(run.threshold_micros),
        run.threshold_pct_bp / 100,
        run.threshold_pct_bp % 100
    );
    out.push_str(&format!(
        "  {:<10}  {:<28} {:<20} {:>16} {:>16} {:>16}\n",
        "day", "model", "account", "sluice_usd", "provider_usd", "difference_usd"
    ));
    for row in &r.rows {
        out.push_str(&format!(
            "{} {:<10}  {:<28} {:<20} {:>16} {:>16} {:>16}\n",
            if row.flagged { "!" } else { " " },
            row.day,
            row.model,
            row.account,
            pricing::usd(row.sluice_micros),
            pricing::usd(row.provider_micros),
            pricing::usd(row.diff_micros)
        ));
    }
    out.push_str(&format!(
        "  {:<10}  {:<28} {:<20} {:>16} {:>16} {:>16}\n",
        "total",
        "",
        "",
        pricing::usd(run.sluice_micros),
        pricing::usd(run.provider_micros),
        pricing::usd(run.sluice_micros.saturating_sub(run.provider_micros))
    ));
    out
}
