//! Signing in and out. A failed sign-in answers exactly alike for an unknown user and a
//! wrong password (an unknown user is verified against a dummy hash, so it costs the same
//! time). Every attempt is admitted by `auth::throttle` before its password is verified —
//! past its limits (per username, per address) attempts get 429 with `Retry-After`, even
//! with the right password, until the window has passed — and verification waits for one
//! of `auth::password`'s few hashing permits (429 when none comes in time). Both refusals
//! answer with the sign-in form again, carrying the reason.

use actix_web::http::header;
use actix_web::{web, HttpRequest, HttpResponse};
use askama::Template;
use chrono::{DateTime, Utc};

use super::actor::{peer, Actor};
use super::error::AdminError;
use crate::auth::password;
use crate::auth::throttle::{self, Admission};
use crate::auth::{csrf, session};
use crate::state::AppState;
use crate::store::sessions;

const MAX_USERNAME: usize = 128;
/// The audit actor of a failed sign-in at a name that is no login.
const UNKNOWN_NAME: &str = "(unknown)";

#[derive(Template)]
#[template(path = "admin/login.html")]
pub(super) struct LoginPage {
    csrf: String,
    error: Option<String>,
    /// The single sign-on button's label, when `[oidc]` is configured.
    sso: Option<String>,
    /// Whether the password form is offered.
    password: bool,
    /// After an SSO login signed out: the provider's RP-initiated logout link.
    end_session: Option<String>,
}

impl LoginPage {
    /// The page as this gateway offers it: the SSO button when `[oidc]` is set, the password
    /// form unless `password_login = false` (then only at `?break-glass`).
    pub(super) fn new(
        state: &AppState,
        req: &HttpRequest,
        csrf: String,
        error: Option<String>,
    ) -> Self {
        let query = req.query_string();
        let flag =
            |name: &str| url::form_urlencoded::parse(query.as_bytes()).any(|(k, _)| k == name);
        let sso = state.sso.as_ref();
        LoginPage {
            csrf,
            error,
            sso: sso.map(|s| s.settings.label.clone()),
            password: password_login(state) || flag("break-glass"),
            end_session: sso
                .filter(|_| flag("signed-out"))
                .and_then(|s| s.end_session_url())
                .map(|u| u.to_string()),
        }
    }
}

/// Whether password sign-in is open to every login (else to break-glass logins only).
fn password_login(state: &AppState) -> bool {
    state.sso.as_ref().is_none_or(|s| s.settings.password_login)
}

/// Whether a login may be in at all, by any credential: with password sign-in switched
/// off, a local login that is not break-glass has no way in — its sessions and API keys,
/// made while passwords were on, cannot be ended at the provider (s30 identity attack F4).
pub(super) fn may_be_in(state: &AppState, a: &sessions::AdminRow) -> bool {
    a.oidc_subject.is_some() || a.break_glass || password_login(state)
}

pub const PASSWORD_OFF: &str = "Password sign-in is switched off: sign in with single sign-on. \
     (Only a break-glass login may use a password.)";

pub async fn form(req: HttpRequest, state: web::Data<AppState>) -> HttpResponse {
    let secure = session::secure(&state.settings.server.public_url);
    if let Some(c) = req.cookie(session::cookie_name(secure)) {
        let now = state.clock.now();
        if let Ok(Some(_)) = session::load(&state.db, c.value(), now).await {
            return see_other("/admin/");
        }
    }
    let pre = session::new_secret();
    let mut resp = render(
        &LoginPage::new(&state, &req, csrf::token_for(&pre), None),
        200,
    );
    let _ = resp.add_cookie(&session::cookie(
        session::login_cookie_name(secure),
        pre,
        secure,
    ));
    resp
}

/// The most a sign-in form's body may be: its fields are a name, a password and the CSRF
/// token, a few hundred bytes; anyone can post it, so little is read.
const MAX_SIGN_IN: usize = 16 * 1024;

pub async fn submit(
    req: HttpRequest,
    state: web::Data<AppState>,
    payload: web::Payload,
) -> HttpResponse {
    // No coding: inflated a chunk at a time before any limit applies, a 16 KiB gzip body
    // became megabytes for anyone who can reach the form (s32 stop attack F2); no browser
    // compresses a form.
    if req
        .headers()
        .get(header::CONTENT_ENCODING)
        .is_some_and(|c| !c.as_bytes().eq_ignore_ascii_case(b"identity"))
    {
        let e = AdminError::Unsupported("The sign-in form is read uncompressed.".into());
        return with_headers(e.page());
    }
    let body = match super::input::read_body(payload, &req, MAX_SIGN_IN).await {
        Ok(body) => body,
        Err(e) => return with_headers(e.page()),
    };
    let secure = session::secure(&state.settings.server.public_url);
    let pre = req
        .cookie(session::login_cookie_name(secure))
        .map(|c| c.value().to_string());
    let again = |error: String, status: u16| {
        let csrf = pre.as_deref().map(csrf::token_for).unwrap_or_default();
        let mut page = LoginPage::new(&state, &req, csrf, Some(error));
        // A refused break-glass attempt is shown its form again.
        page.password = true;
        render(&page, status)
    };
    let resp = match sign_in(&req, &state, &body, pre.as_deref(), secure).await {
        Ok(resp) => resp,
        // The same page, status and body for every wrong username/password pair.
        Err(AdminError::Unauthorized) if !password_login(&state) => again(PASSWORD_OFF.into(), 403),
        Err(AdminError::Unauthorized) => again("Invalid username or password.".into(), 401),
        Err(e @ (AdminError::Throttled { retry_after } | AdminError::Busy { retry_after })) => {
            let mut resp = again(e.to_string(), 429);
            resp.headers_mut()
                .insert(header::RETRY_AFTER, header::HeaderValue::from(retry_after));
            resp
        }
        Err(e) => e.page(),
    };
    with_headers(resp)
}

fn field(body: &[u8], name: &str) -> String {
    url::form_urlencoded::parse(body)
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.into_owned())
        .unwrap_or_default()
}

async fn sign_in(
    req: &HttpRequest,
    state: &AppState,
    body: &[u8],
    pre: Option<&str>,
    secure: bool,
) -> Result<HttpResponse, AdminError> {
    let scheme = req.connection_info().scheme().to_string();
    if !csrf::same_origin(req.headers(), &state.settings.server.public_url, &scheme) {
        return Err(AdminError::Forbidden("Cross-site request refused.".into()));
    }
    let supplied = field(body, csrf::FIELD);
    if !pre.is_some_and(|p| csrf::matches(p, &supplied)) {
        return Err(AdminError::Forbidden(
            "This sign-in form has expired; reload the page and try again.".into(),
        ));
    }
    let (username, pw) = (field(body, "username"), field(body, "password"));
    let address = peer(req);
    let now = state.clock.now();
    // Control characters stand as U+FFFD in what is recorded (the throttle key):
    // no admin name holds one, and a NUL kept verbatim by SQLite could never be copied to
    // PostgreSQL, whose text refuses it (`sluice migrate-store` failed on one such row).
    let username: String = username
        .chars()
        .take(MAX_USERNAME)
        .map(|c| if c.is_control() { '\u{FFFD}' } else { c })
        .collect();
    // Counted before it is verified: concurrent attempts cannot all pass the limit.
    let attempt = match throttle::admit(&state.db, &username, &address, &*state.clock).await? {
        Admission::Admitted(a) => a,
        Admission::Refused { retry_after } => {
            tracing::warn!(address, "admin sign-in throttled");
            return Err(AdminError::Throttled { retry_after });
        }
    };

    let admin = sessions::admin_by_name(&state.db, &username).await?;
    // A single sign-on login has no password hash: it is verified against the dummy, as
    // an unknown name is, so the answer's time does not tell which names are SSO logins.
    let phc = admin
        .as_ref()
        .filter(|a| !a.password_hash.is_empty())
        .map(|a| a.password_hash.clone());
    let verified = match state.passwords.verify(pw.clone(), phc).await {
        Ok(v) => v,
        Err(e) => {
            // Never evaluated: not a guess, so it does not count against the name.
            attempt.withdraw_now(&state.db).await?;
            return Err(e.into());
        }
    };
    // A single sign-on login has no password; with password sign-in switched off only a
    // break-glass login may use one. Both answer as a wrong password would.
    let open = |a: &sessions::AdminRow| {
        a.oidc_subject.is_none() && (password_login(state) || a.break_glass)
    };
    // Who a failed sign-in is audited as: a login's name, never text nobody vouches for.
    // The audit log is never trimmed and is no one's to fill, and a password or token
    // pasted into the name field would be kept there in clear for good (review s21 #6).
    let known = admin.as_ref().map(|a| a.username.clone());
    let failed_as = known.as_deref().unwrap_or(UNKNOWN_NAME);
    let Some(admin) = admin.filter(|a| verified && !a.disabled && open(a)) else {
        // The attempt stays recorded: it is one of the window's failures.
        let mut tx = state.db.begin().await?;
        audit(&mut tx, failed_as, &address, "login.failed", now).await?;
        tx.commit().await?;
        return Err(AdminError::Unauthorized);
    };
    // Raised parameters are applied now, or at a later sign-in when this one cannot (every
    // permit taken, or an old password shorter than today's minimum): the sign-in stands.
    let rehash = if password::needs_rehash(&admin.password_hash) {
        state
            .passwords
            .hash(pw.clone())
            .await
            .inspect_err(|e| tracing::warn!(error = %e, "password rehash postponed"))
            .ok()
    } else {
        None
    };
    let id = session::new_secret();
    // The hash the password was verified against.
    let mut verified = admin.password_hash.clone();
    let mut tx = state.db.begin().await?;
    // The row again, now under the admin write lock: what was verified is a copy read
    // before the wait for a hashing permit (up to 2 s) and the verification. A password
    // change, reset or disabling that committed meanwhile ended every session; this one
    // must not start after it with a password that no longer opens anything.
    let mut current = sessions::admin_in(&mut tx, admin.id).await?;
    // But another sign-in's rehash also replaces the hash — with one of the same password
    // (final review F5: a correct password was refused). A changed hash is verified once
    // more, outside the transaction (a verification must not hold the write lock): a
    // rehash passes, a real change fails as before.
    let changed = current
        .as_ref()
        .map(|c| c.password_hash.clone())
        .filter(|h| *h != verified && !h.is_empty());
    if let Some(newer) = changed {
        tx.rollback().await?;
        match state.passwords.verify(pw, Some(newer.clone())).await {
            Ok(true) => verified = newer,
            Ok(false) => {}
            Err(e) => {
                attempt.withdraw_now(&state.db).await?;
                return Err(e.into());
            }
        }
        tx = state.db.begin().await?;
        current = sessions::admin_in(&mut tx, admin.id).await?;
    }
    let still = current.is_some_and(|c| c.password_hash == verified && !c.disabled && open(&c));
    if !still {
        // Answered as a wrong password: the attempt stays recorded as one.
        audit(&mut tx, &admin.username, &address, "login.failed", now).await?;
        tx.commit().await?;
        return Err(AdminError::Unauthorized);
    }
    // Only this attempt's own rows: earlier failures at this name or address still count.
    attempt.withdraw(&mut tx).await?;
    if let Some(old) = req.cookie(session::cookie_name(secure)) {
        // A session id presented at login is never kept (fixation): it is ended.
        sessions::delete_session(&mut tx, &session::id_hash(old.value())).await?;
    }
    // Not over a hash another sign-in's rehash already replaced it with.
    if let Some(h) = rehash.filter(|_| verified == admin.password_hash) {
        // Only over the hash it was verified against (checked above; the write says so
        // again): a rehash of an old password never lands over a newer one.
        sessions::replace_password_hash(&mut tx, admin.id, &verified, &h).await?;
    }
    sessions::create_session(&mut tx, &session::id_hash(&id), admin.id, &address, now).await?;
    // Sessions nobody can use any more are swept here, so the table stays small.
    sessions::prune_sessions(&mut tx, now, (session::IDLE, session::ABSOLUTE)).await?;
    let action = if admin.break_glass && !password_login(state) {
        "login.break_glass"
    } else {
        "login.ok"
    };
    audit(&mut tx, &admin.username, &address, action, now).await?;
    tx.commit().await?;
    let mut resp = see_other("/admin/");
    let _ = resp.add_cookie(&session::cookie(session::cookie_name(secure), id, secure));
    let _ = resp.add_cookie(&session::removal(
        session::login_cookie_name(secure),
        secure,
    ));
    Ok(resp)
}

async fn audit(
    tx: &mut crate::store::Tx,
    actor: &str,
    address: &str,
    action: &str,
    now: DateTime<Utc>,
) -> Result<(), AdminError> {
    let entry = crate::store::audit::AuditEntry {
        actor,
        address,
        action,
        target: "",
        before: None,
        after: None,
    };
    crate::store::audit::append(tx, &entry, now).await?;
    Ok(())
}

/// Ends the caller's session; its cookie is dead from now on, on every replica.
pub async fn logout(
    actor: Actor,
    state: web::Data<AppState>,
    req: HttpRequest,
) -> Result<HttpResponse, AdminError> {
    let now = state.clock.now();
    let mut tx = state.db.begin().await?;
    // Audited while the session still exists (`Actor::audit` holds it first); a session
    // that ended meanwhile is logged out already and answers 401.
    actor.audit(&mut tx, "logout", "", None, None, now).await?;
    if let Some(h) = actor.session_hash() {
        sessions::delete_session(&mut tx, h).await?;
    }
    tx.commit().await?;
    let secure = session::secure(&state.settings.server.public_url);
    // A single sign-on login is offered the provider's own sign-out on the next page.
    let to = match &state.sso {
        Some(_) if actor.sso => "/admin/login?signed-out",
        _ => "/admin/login",
    };
    let mut resp = if req.headers().contains_key("hx-request") {
        HttpResponse::Ok()
            .insert_header(("HX-Redirect", to))
            .finish()
    } else {
        see_other(to)
    };
    let _ = resp.add_cookie(&session::removal(session::cookie_name(secure), secure));
    Ok(resp)
}

pub(super) fn see_other(to: &str) -> HttpResponse {
    HttpResponse::SeeOther()
        .insert_header((header::LOCATION, to))
        .finish()
}

pub(super) fn render(page: &LoginPage, status: u16) -> HttpResponse {
    let status = actix_web::http::StatusCode::from_u16(status).unwrap_or_default();
    match page.render() {
        Ok(body) => with_headers(
            HttpResponse::build(status)
                .content_type("text/html; charset=utf-8")
                .body(body),
        ),
        Err(e) => AdminError::from(e).page(),
    }
}

pub(super) fn with_headers(mut resp: HttpResponse) -> HttpResponse {
    for (k, v) in [
        ("cache-control", "no-store"),
        ("x-frame-options", "DENY"),
        ("x-content-type-options", "nosniff"),
        ("content-security-policy", "default-src 'self'; script-src 'self'; style-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"),
    ] {
        resp.headers_mut().insert(
            header::HeaderName::from_static(k),
            header::HeaderValue::from_static(v),
        );
    }
    resp
}
