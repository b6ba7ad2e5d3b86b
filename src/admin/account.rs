//! The signed-in person's own account: change password (throttled like a sign-in; every
//! session and API key of theirs ends; this browser gets a fresh session) and admin API
//! keys (`sk-sl-admin-…`, shown once, acting with the owner's role, created only in a
//! signed-in browser session). Finance, who changes nothing, only reads this page.

use actix_web::{web, HttpResponse};
use askama::Template;
use serde::Deserialize;
use serde_json::json;

use super::actor::{Actor, Via};
use super::error::AdminError;
use super::input::{de, Input};
use super::view::{self, Chrome};
use crate::auth::throttle::{self, Admission};
use crate::auth::{password, session, token};
use crate::state::AppState;
use crate::store::sessions::{self, ApiKeyRow};

#[derive(Deserialize)]
pub struct PasswordChange {
    #[serde(default, deserialize_with = "de::opt_secret")]
    current_password: Option<String>,
    #[serde(default, deserialize_with = "de::opt_secret")]
    new_password: Option<String>,
}

#[derive(Deserialize)]
pub struct NewKey {
    #[serde(default, deserialize_with = "de::opt_text")]
    pub name: Option<String>,
}

pub fn configure(cfg: &mut web::ServiceConfig) {
    cfg.route("/account", web::get().to(page))
        .route("/account/password", web::post().to(change_password))
        .route("/account/keys", web::post().to(create_key_html))
        .route("/account/keys/{id}/revoke", web::post().to(revoke_key_html));
}

#[derive(Template)]
#[template(path = "admin/account.html")]
struct AccountPage {
    c: Chrome,
    keys: Vec<ApiKeyRow>,
    new_key: Option<String>,
}

#[derive(Template)]
#[template(path = "admin/_api_keys.html")]
struct KeysFragment {
    keys: Vec<ApiKeyRow>,
    new_key: Option<String>,
}

pub async fn page(actor: Actor, state: web::Data<AppState>) -> Result<HttpResponse, AdminError> {
    let keys = sessions::api_keys_of(&state.db, actor.id).await?;
    view::html(&AccountPage {
        c: Chrome::new(&actor, "account"),
        keys,
        new_key: None,
    })
}

/// Creates an API key for the actor; returns its id and text (shown once). Only a signed-in
/// browser session may: a key that could mint keys would let whoever leaks one keep access
/// after it is revoked.
pub async fn create_key(
    state: &AppState,
    actor: &Actor,
    k: NewKey,
) -> Result<(i64, String), AdminError> {
    actor.require_write()?;
    actor.require_session("create API keys (the Account page does)")?;
    let name = k.name.unwrap_or_default();
    super::input::check_name(&name)?;
    let key = token::generate_admin_key();
    let now = state.clock.now();
    let mut tx = state.db.begin().await?;
    let id = sessions::create_api_key(
        &mut tx,
        actor.id,
        &key.hash,
        &key.display_prefix,
        &name,
        now,
    )
    .await?;
    let after = json!({"prefix": key.display_prefix, "name": name}).to_string();
    actor
        .audit(
            &mut tx,
            "apikey.create",
            &format!("apikey:{id}"),
            None,
            Some(&after),
            now,
        )
        .await?;
    tx.commit().await?;
    Ok((id, key.text))
}

async fn create_key_html(
    actor: Actor,
    state: web::Data<AppState>,
    Input(k): Input<NewKey>,
) -> Result<HttpResponse, AdminError> {
    let (_, text) = create_key(&state, &actor, k).await?;
    let keys = sessions::api_keys_of(&state.db, actor.id).await?;
    view::html(&KeysFragment {
        keys,
        new_key: Some(text),
    })
}

async fn revoke_key_html(
    actor: Actor,
    state: web::Data<AppState>,
    id: web::Path<i64>,
) -> Result<HttpResponse, AdminError> {
    actor.require_write()?;
    let id = id.into_inner();
    let now = state.clock.now();
    let mut tx = state.db.begin().await?;
    // The credential is checked before the revoke: a key may revoke itself, which a check
    // after it would find revoked and roll back.
    actor.hold(&mut tx).await?;
    if !sessions::revoke_api_key(&mut tx, actor.id, id, now).await? {
        return Err(AdminError::NotFound);
    }
    actor
        .audit_held(
            &mut tx,
            "apikey.revoke",
            &format!("apikey:{id}"),
            None,
            None,
            now,
        )
        .await?;
    tx.commit().await?;
    let keys = sessions::api_keys_of(&state.db, actor.id).await?;
    view::html_with_flash(
        &KeysFragment {
            keys,
            new_key: None,
        },
        "API key revoked.",
    )
}

/// Changes the actor's password after checking the current one, which is a guess like a
/// sign-in's: admitted by the same throttle first (per username and address), so a stolen
/// session cannot try current passwords faster than the sign-in form allows. A change ends
/// what the old password opened: every session of the admin (this browser gets a new one,
/// so the page reloads with a new CSRF token) and every API key of theirs.
async fn change_password(
    actor: Actor,
    state: web::Data<AppState>,
    Input(p): Input<PasswordChange>,
) -> Result<HttpResponse, AdminError> {
    actor.require_write()?;
    if !matches!(actor.via, Via::Session { .. }) {
        return Err(AdminError::Forbidden(
            "Change a password in the browser, not with an API key.".into(),
        ));
    }
    let new_password = p.new_password.unwrap_or_default();
    // A new password that could never be accepted costs no attempt.
    password::check_length(&new_password)?;
    let now = state.clock.now();
    let attempt = match throttle::admit(&state.db, &actor.username, &actor.address, &*state.clock)
        .await?
    {
        Admission::Admitted(a) => a,
        Admission::Refused { retry_after } => return Err(AdminError::Throttled { retry_after }),
    };
    let admin = sessions::admin_by_id(&state.db, actor.id)
        .await?
        .ok_or(AdminError::Unauthorized)?;
    let current = p.current_password.unwrap_or_default();
    let checked = state
        .passwords
        .verify(current, Some(admin.password_hash.clone()))
        .await;
    let hash = match checked {
        Ok(true) => state.passwords.hash(new_password).await,
        Ok(false) => {
            // The attempt stays recorded: one of the window's failures.
            let mut tx = state.db.begin().await?;
            actor
                .audit(
                    &mut tx,
                    "admin.password_change_failed",
                    &format!("admin:{}", actor.id),
                    None,
                    None,
                    now,
                )
                .await?;
            tx.commit().await?;
            return Err(AdminError::Forbidden(
                "The current password is wrong.".into(),
            ));
        }
        Err(e) => Err(e),
    };
    let hash = match hash {
        Ok(h) => h,
        Err(e) => {
            // Hashing was busy (or failed): no guess was wrong, nothing counts.
            attempt.withdraw_now(&state.db).await?;
            return Err(e.into());
        }
    };
    let id = session::new_secret();
    let mut tx = state.db.begin().await?;
    // This session still exists (it ends below with the others, so the audit row after
    // that is `audit_held`): a change by a session ended meanwhile changes nothing.
    if let Err(e) = actor.hold(&mut tx).await {
        // Nor does it count: the password typed was right (final review F6).
        tx.rollback().await?;
        attempt.withdraw_now(&state.db).await?;
        return Err(e);
    }
    // The password typed was right when checked: not a failed guess, whatever follows.
    attempt.withdraw(&mut tx).await?;
    // Only over the hash the current password was checked against: a reset (or another
    // session's change) that landed meanwhile stands, and this change, proven only against
    // a password that no longer counts, changes nothing.
    if !sessions::replace_password_hash(&mut tx, actor.id, &admin.password_hash, &hash).await? {
        tx.commit().await?;
        return Err(AdminError::Conflict(
            "Your password was changed meanwhile (another session or an admin's reset); \
             nothing was changed. Sign in with the current password."
                .into(),
        ));
    }
    let ended = sessions::delete_sessions_of(&mut tx, actor.id, None).await?;
    let revoked = sessions::revoke_api_keys_of(&mut tx, actor.id, now).await?;
    sessions::create_session(
        &mut tx,
        &session::id_hash(&id),
        actor.id,
        &actor.address,
        now,
    )
    .await?;
    let after = json!({"sessions_ended": ended, "api_keys_revoked": revoked}).to_string();
    actor
        .audit_held(
            &mut tx,
            "admin.password_change",
            &format!("admin:{}", actor.id),
            None,
            Some(&after),
            now,
        )
        .await?;
    tx.commit().await?;
    let secure = session::secure(&state.settings.server.public_url);
    let mut resp = HttpResponse::Ok()
        .insert_header(("HX-Refresh", "true"))
        .content_type("text/html; charset=utf-8")
        .body("<p class=\"flash ok\" role=\"status\">Password changed; every other session has ended and your API keys are revoked.</p>");
    let _ = resp.add_cookie(&session::cookie(session::cookie_name(secure), id, secure));
    Ok(resp)
}
