//! Single sign-on routes (`auth::oidc` does the protocol):
//! - `GET /admin/oidc/login` sends the browser to the provider, with the flow cookie;
//! - `GET /admin/oidc/callback` finishes: the provider's identity is mapped to a role and
//!   team by `[[oidc.roles]]` (the first matching row), the login keyed by issuer + subject
//!   is made at the first sign-in and its role and team rewritten at every one, and a
//!   session starts. No matching row: refused with a page saying so; no login is made, and
//!   an existing one loses its sessions (it lost its group at the provider). A login an
//!   admin disabled in Sluice stays disabled. Every sign-in, every refusal of an identity
//!   the provider vouched for, and every ID token failing its checks is audited (naming
//!   the provider's subject and issuer when the token was good); what anyone can send —
//!   a forged flow, a provider `error`, a code the provider would not exchange — is logged.

use actix_web::cookie::{Cookie, SameSite};
use actix_web::{web, HttpRequest, HttpResponse};
use chrono::{DateTime, Utc};
use serde::Deserialize;
use serde_json::json;

use super::actor::{peer, sso_audit_name};
use super::error::AdminError;
use super::login::{self, LoginPage};
use crate::auth::oidc::{self, Identity, Sso, SsoError};
use crate::auth::{csrf, session, throttle};
use crate::state::AppState;
use crate::store::oidc::{self as store, NewSsoAdmin};
use crate::store::{sessions, tenants};

pub fn configure(cfg: &mut web::ServiceConfig) {
    cfg.route("/admin/oidc/login", web::get().to(begin))
        .route("/admin/oidc/callback", web::get().to(callback));
}

async fn begin(req: HttpRequest, state: web::Data<AppState>) -> HttpResponse {
    let Some(sso) = state.sso.as_ref() else {
        return refused(&state, &req, AdminError::NotFound.to_string(), 404);
    };
    sso.discover_if_missing().await;
    match sso.begin(state.clock.now()) {
        Ok((url, flow)) => {
            let secure = session::secure(&state.settings.server.public_url);
            let mut resp = login::see_other(url.as_str());
            let _ = resp.add_cookie(&flow_cookie(flow, secure));
            login::with_headers(resp)
        }
        Err(e) => refused(&state, &req, e.to_string(), 503),
    }
}

#[derive(Deserialize)]
struct Callback {
    code: Option<String>,
    state: Option<String>,
    error: Option<String>,
    error_description: Option<String>,
}

async fn callback(req: HttpRequest, state: web::Data<AppState>) -> HttpResponse {
    let Some(sso) = state.sso.as_ref() else {
        return refused(&state, &req, AdminError::NotFound.to_string(), 404);
    };
    let secure = session::secure(&state.settings.server.public_url);
    let address = peer(&req);
    let now = state.clock.now();
    let q = web::Query::<Callback>::from_query(req.query_string())
        .map(|q| q.into_inner())
        .unwrap_or(Callback {
            code: None,
            state: None,
            error: None,
            error_description: None,
        });
    // Anyone can call this address with any query: what no verified sign-in flow vouches
    // for (a provider's `error`, a missing or forged flow cookie) is logged, not audited —
    // the audit log is never trimmed, and is no one's to fill — and the page shows only a
    // plain OAuth error code, never the caller's text.
    let vouched = q.error.is_none();
    // An address whose sign-ins keep being refused waits: nothing is asked of the provider,
    // written or audited meanwhile (`throttle::sso_held`).
    match throttle::sso_held(&state.db, &address, now).await {
        Ok(None) => {}
        Ok(Some(retry_after)) => {
            tracing::warn!(address, "single sign-on throttled");
            let mut resp = refused(
                &state,
                &req,
                AdminError::Throttled { retry_after }.to_string(),
                429,
            );
            resp.headers_mut().insert(
                actix_web::http::header::RETRY_AFTER,
                actix_web::http::header::HeaderValue::from(retry_after),
            );
            let _ = resp.add_cookie(&removal(secure));
            return resp;
        }
        Err(e) => return AdminError::from(e).page(),
    }
    let result = match (&q.error, &q.code, &q.state) {
        (Some(e), _, _) => {
            let plain = !e.is_empty()
                && e.len() <= 64
                && e.bytes().all(|b| b.is_ascii_lowercase() || b == b'_');
            tracing::warn!(
                error = e.chars().take(64).collect::<String>(),
                description = q
                    .error_description
                    .as_deref()
                    .map(|d| d.chars().take(200).collect::<String>()),
                "the identity provider refused a sign-in"
            );
            Err(SsoError::Provider(if plain {
                e.clone()
            } else {
                "an error it did not name plainly".into()
            }))
        }
        (None, Some(code), Some(st)) => {
            let flow = req.cookie(oidc::flow_cookie_name(secure));
            sso.finish(flow.as_ref().map(|c| c.value()), st, code, now)
                .await
        }
        _ => Err(SsoError::Flow),
    };
    let mut resp = match result {
        Ok(identity) => match sign_in(&req, &state, sso, &identity, &address, now).await {
            Ok(resp) => resp,
            Err(Refusal::Page(msg, status)) => refused(&state, &req, msg, status),
            Err(Refusal::Error(e)) => e.page(),
        },
        Err(e) => {
            tracing::warn!(error = %e, address, "single sign-on refused");
            let status = match e {
                SsoError::Unavailable => 503,
                SsoError::Flow => 400,
                SsoError::Provider(_) | SsoError::Token(_) => 401,
            };
            let detail = json!({"reason": e.to_string()}).to_string();
            // A flow cookie is anyone's for the asking, so it vouches for nothing: only a
            // token the provider issued — a real sign-in there — that then failed its
            // checks is audited. A code the provider would not exchange (junk, replayed,
            // expired) is logged.
            let vouched = vouched && matches!(e, SsoError::Token(_));
            if vouched {
                if let Err(e) = audit_token_refused(&state, &address, &detail, now).await {
                    return e.page();
                }
            }
            refused(&state, &req, e.to_string(), status)
        }
    };
    let _ = resp.add_cookie(&removal(secure));
    resp
}

/// Ends every way in of a login whose grant the provider took away: its sessions and its
/// API keys (a key would otherwise keep the old role for ever, the person never needing to
/// sign in again).
async fn end_access(
    tx: &mut crate::store::Tx,
    admin_id: i64,
    now: DateTime<Utc>,
) -> Result<(), AdminError> {
    sessions::delete_sessions_of(tx, admin_id, None).await?;
    sessions::revoke_api_keys_of(tx, admin_id, now).await?;
    Ok(())
}

/// A sign-in refused with a 403 `page`: audited (`login.sso_refused` with `why`, by `who` =
/// (actor, address, target)) in the transaction, which commits with what it did before.
async fn refuse(
    mut tx: crate::store::Tx,
    who: (&str, &str, &str),
    why: &str,
    page: String,
    now: DateTime<Utc>,
) -> Result<Refusal, AdminError> {
    let (actor, address, target) = who;
    let detail = json!({ "reason": why }).to_string();
    append(
        &mut tx,
        actor,
        address,
        "login.sso_refused",
        target,
        &detail,
        now,
    )
    .await?;
    throttle::sso_refused(&mut tx, address, now).await?;
    tx.commit().await?;
    Ok(Refusal::Page(page, 403))
}

enum Refusal {
    Page(String, u16),
    Error(AdminError),
}

impl<E: Into<AdminError>> From<E> for Refusal {
    fn from(e: E) -> Self {
        Refusal::Error(e.into())
    }
}

async fn sign_in(
    req: &HttpRequest,
    state: &AppState,
    sso: &Sso,
    who: &Identity,
    address: &str,
    now: DateTime<Utc>,
) -> Result<HttpResponse, Refusal> {
    let actor = sso_audit_name(&who.name, &who.issuer, &who.subject);
    let grants = sso.settings.grants(&who.claims);
    let mut tx = state.db.begin().await?;
    let existing = store::admin_by_identity(&mut tx, &who.issuer, &who.subject).await?;
    if grants.is_empty() {
        // Removed from every mapped group: the login (if any) keeps no way in.
        if let Some(a) = &existing {
            end_access(&mut tx, a.id, now).await?;
        }
        let page = format!(
            "You signed in at the identity provider as {}, but none of your groups or claims \
             grants a role in Sluice. Ask an administrator to add you to a mapped group.",
            who.name
        );
        let why = "no [[oidc.roles]] row matches";
        let target = existing
            .as_ref()
            .map(|a| format!("admin:{}", a.id))
            .unwrap_or_default();
        return Err(refuse(tx, (&actor, address, &target), why, page, now).await?);
    }
    // The first grant Sluice can give: a lead's team must exist here.
    let mut given = None;
    let mut missing = None;
    for g in grants {
        match &g.team {
            Some(team) => match tenants::team_id(&mut tx, team).await? {
                Some(id) => {
                    given = Some((g, Some(id)));
                    break;
                }
                None => {
                    missing.get_or_insert_with(|| team.clone());
                }
            },
            None => {
                given = Some((g, None));
                break;
            }
        }
    }
    let Some((grant, team_id)) = given else {
        // The provider no longer grants what the login holds (the new grant cannot be
        // given): it keeps no way in with the old one either.
        if let Some(a) = &existing {
            end_access(&mut tx, a.id, now).await?;
        }
        let team = missing.unwrap_or_default();
        let page = format!("Your group makes you a lead of team `{team}`, which does not exist in Sluice. Ask an administrator to create it.");
        let why = format!("team `{team}` does not exist");
        let target = existing
            .as_ref()
            .map(|a| format!("admin:{}", a.id))
            .unwrap_or_default();
        return Err(refuse(tx, (&actor, address, &target), &why, page, now).await?);
    };
    let mut keys_revoked = 0;
    let (id, before) = match &existing {
        Some(a) if a.disabled => {
            let page = "Your Sluice login is disabled. Ask an administrator.".to_string();
            let target = format!("admin:{}", a.id);
            let why = "login disabled in Sluice";
            return Err(refuse(tx, (&actor, address, &target), why, page, now).await?);
        }
        Some(a) => {
            if a.role != grant.role || a.team_id != team_id {
                store::set_grant(&mut tx, a.id, &grant.role, team_id).await?;
                // A changed grant ends the sessions opened under the old one, and the API
                // keys made under it, as an admin's edit of a login's role or team does
                // (`user_ops`): a lead's key (perhaps leaked) became an admin's, or another
                // team's, never confirmed in a session (s30 identity attack F1). This
                // sign-in's own session is made below.
                sessions::delete_sessions_of(&mut tx, a.id, None).await?;
                keys_revoked = sessions::revoke_api_keys_of(&mut tx, a.id, now).await?;
            }
            let before = json!({"role": a.role, "team_id": a.team_id}).to_string();
            (a.id, Some(before))
        }
        None => {
            let username = free_username(&mut tx, who).await?;
            let new = NewSsoAdmin {
                username: &username,
                issuer: &who.issuer,
                subject: &who.subject,
                role: &grant.role,
                team_id,
            };
            (store::create_sso_admin(&mut tx, &new, now).await?, None)
        }
    };
    let mut after = json!({"role": grant.role, "team_id": team_id});
    if keys_revoked > 0 {
        after["api_keys_revoked"] = keys_revoked.into();
    }
    let after = after.to_string();
    let sid = session::new_secret();
    let secure = session::secure(&state.settings.server.public_url);
    if let Some(old) = req.cookie(session::cookie_name(secure)) {
        // A session id presented at login is never kept (fixation).
        sessions::delete_session(&mut tx, &session::id_hash(old.value())).await?;
    }
    sessions::create_session(&mut tx, &session::id_hash(&sid), id, address, now).await?;
    sessions::prune_sessions(&mut tx, now, (session::IDLE, session::ABSOLUTE)).await?;
    let entry = crate::store::audit::AuditEntry {
        actor: &actor,
        address,
        action: "login.sso",
        target: &format!("admin:{id}"),
        before: before.as_deref(),
        after: Some(&after),
    };
    crate::store::audit::append(&mut tx, &entry, now).await?;
    tx.commit().await?;
    // A page, not a redirect: the browser arrives here from the provider's site, and a
    // redirect would carry that cross-site origin on, so the SameSite=Strict session cookie
    // would not be sent with `/admin/`. The page's own navigation is same-site.
    let mut resp = login::with_headers(
        HttpResponse::Ok()
            .content_type("text/html; charset=utf-8")
            .body(
                "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\">\
                 <meta http-equiv=\"refresh\" content=\"0;url=/admin/\"><title>Signed in · Sluice</title></head>\
                 <body><p>Signed in. <a href=\"/admin/\">Continue to Sluice</a>.</p></body></html>",
            ),
    );
    let _ = resp.add_cookie(&session::cookie(session::cookie_name(secure), sid, secure));
    Ok(resp)
}

/// The login's name: the provider's readable name, or with a suffix from the identity when
/// another login holds it (a local login named like the person keeps its name).
async fn free_username(tx: &mut crate::store::Tx, who: &Identity) -> Result<String, Refusal> {
    // `who.name` is readable already (`auth::oidc::readable`).
    let name = who.name.clone();
    // A name the audit log gives actors that are not logins (`cli`, `system`) is taken.
    if !super::user_ops::reserved(&name)
        && !crate::store::directory::username_taken(tx, &name).await?
    {
        return Ok(name);
    }
    // Someone may have taken the tagged name too (knowing the subject): a longer tag then.
    for len in [8, 16, 64] {
        let tagged = format!(
            "{name}~{}",
            oidc::identity_tag(&who.issuer, &who.subject, len)
        );
        if !crate::store::directory::username_taken(tx, &tagged).await? {
            return Ok(tagged);
        }
    }
    Err(Refusal::Page(
        format!("no free login name for `{name}`: ask an admin"),
        409,
    ))
}

fn refused(state: &AppState, req: &HttpRequest, msg: String, status: u16) -> HttpResponse {
    let pre = session::new_secret();
    let page = LoginPage::new(state, req, csrf::token_for(&pre), Some(msg));
    let secure = session::secure(&state.settings.server.public_url);
    let mut resp = login::render(&page, status);
    let _ = resp.add_cookie(&session::cookie(
        session::login_cookie_name(secure),
        pre,
        secure,
    ));
    resp
}

/// The flow cookie is `SameSite=Lax`: it must come back on the provider's redirect, a
/// top-level navigation from another site (a `Strict` cookie would not).
fn flow_cookie(value: String, secure: bool) -> Cookie<'static> {
    Cookie::build(oidc::flow_cookie_name(secure), value)
        .path("/")
        .http_only(true)
        .same_site(SameSite::Lax)
        .secure(secure)
        .max_age(actix_web::cookie::time::Duration::seconds(
            oidc::FLOW_LIFETIME.as_secs() as i64,
        ))
        .finish()
}

fn removal(secure: bool) -> Cookie<'static> {
    let mut c = flow_cookie(String::new(), secure);
    c.make_removal();
    c
}

/// Audits a provider's token that failed its checks, and counts it against the address
/// (`throttle::sso_refused`).
async fn audit_token_refused(
    state: &AppState,
    address: &str,
    detail: &str,
    now: DateTime<Utc>,
) -> Result<(), AdminError> {
    let mut tx = state.db.begin().await?;
    append(
        &mut tx,
        "oidc",
        address,
        "login.sso_refused",
        "",
        detail,
        now,
    )
    .await?;
    throttle::sso_refused(&mut tx, address, now).await?;
    tx.commit().await?;
    Ok(())
}

async fn append(
    tx: &mut crate::store::Tx,
    actor: &str,
    address: &str,
    action: &str,
    target: &str,
    after: &str,
    now: DateTime<Utc>,
) -> Result<(), AdminError> {
    let entry = crate::store::audit::AuditEntry {
        actor,
        address,
        action,
        target,
        before: None,
        after: Some(after),
    };
    crate::store::audit::append(tx, &entry, now).await?;
    Ok(())
}
