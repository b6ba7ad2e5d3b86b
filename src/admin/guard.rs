//! The one gate in front of every admin route except the login form and static files:
//! 1. state-changing requests from another site are refused (`Origin`, `Sec-Fetch-Site`);
//! 2. the caller is authenticated — `Authorization: Bearer sk-sl-admin-…` (an admin API key;
//!    when the header is present it is the only credential considered, and a data-plane
//!    sub-token never matches), else the session cookie;
//! 3. state-changing requests on a session carry its CSRF token (header or form field);
//! 4. the `Actor` is handed to the handler, and an `AdminError` coming back is rendered once,
//!    in the caller's format (JSON, htmx fragment or page), with the admin security headers.

use actix_web::body::{BoxBody, MessageBody};
use actix_web::dev::{Payload, ServiceRequest, ServiceResponse};
use actix_web::http::header::{self, HeaderValue};
use actix_web::http::Method;
use actix_web::middleware::Next;
use actix_web::{web, HttpMessage, HttpResponse};

use super::actor::{Actor, Via};
use super::error::AdminError;
use crate::auth::{csrf, session, token};
use crate::state::AppState;
use crate::store::sessions;

/// How the caller wants answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Api,
    Fragment,
    Page,
}

impl Kind {
    pub fn of(path: &str, headers: &header::HeaderMap) -> Kind {
        if path.starts_with("/admin/api/") {
            Kind::Api
        } else if headers.get("hx-request").is_some_and(|v| v == "true") {
            Kind::Fragment
        } else {
            Kind::Page
        }
    }

    pub fn render(self, e: &AdminError) -> HttpResponse {
        match self {
            Kind::Api => e.json(),
            Kind::Fragment => e.fragment(),
            Kind::Page => e.page(),
        }
    }
}

/// How long an admin write's answer waits for the token epoch poll (`guard`).
const EPOCH_POLL_BOUND: std::time::Duration = std::time::Duration::from_millis(500);

/// Largest form body the gate buffers to read a `csrf_token` field.
const MAX_FORM: usize = 256 * 1024;

pub fn is_safe(m: &Method) -> bool {
    matches!(*m, Method::GET | Method::HEAD)
}

pub async fn guard(
    mut req: ServiceRequest,
    next: Next<impl MessageBody + 'static>,
) -> Result<ServiceResponse<BoxBody>, actix_web::Error> {
    let kind = Kind::of(req.path(), req.headers());
    match admit(&mut req).await {
        Ok(actor) => {
            req.extensions_mut().insert(actor);
        }
        Err(e) => {
            let resp = kind.render(&e);
            return Ok(secure_headers(req.into_response(resp)));
        }
    }
    let writes = !is_safe(req.method());
    let state = req.app_data::<web::Data<AppState>>().cloned();
    let res = next.call(req).await?.map_into_boxed_body();
    // A write that revoked, rotated or changed a token (or its user or team) takes effect
    // on this host before its answer: the token cache waited for its next epoch poll (or,
    // on PostgreSQL, its own notice), so a request right after a revoke's 200 could still
    // be let in from the cache. Other hosts: the notice, or the 250 ms poll.
    let status = res.status();
    if writes && !status.is_client_error() && !status.is_server_error() {
        if let Some(state) = state {
            // Bounded: a busy store must not hold the write's answer (a new token's text is
            // only in it); past the bound the 250 ms poll does it (s25 final attack F4).
            let refresh = state.auth.refresh(&*state.clock);
            match tokio::time::timeout(EPOCH_POLL_BOUND, refresh).await {
                Ok(Ok(_)) => {}
                Ok(Err(e)) => {
                    tracing::warn!(error = %e, "token cache refresh after an admin write failed")
                }
                Err(_) => tracing::warn!("token cache refresh after an admin write timed out"),
            }
        }
    }
    let err = res
        .response()
        .error()
        .and_then(|e| e.as_error::<AdminError>())
        .map(|e| kind.render(e));
    let res = match err {
        Some(resp) => {
            let (req, _) = res.into_parts();
            ServiceResponse::new(req, resp)
        }
        None => res,
    };
    Ok(secure_headers(res))
}

async fn admit(req: &mut ServiceRequest) -> Result<Actor, AdminError> {
    let state = req
        .app_data::<web::Data<AppState>>()
        .cloned()
        .ok_or(AdminError::Internal)?;
    let unsafe_method = !is_safe(req.method());
    let scheme = req.connection_info().scheme().to_string();
    if unsafe_method
        && !csrf::same_origin(req.headers(), &state.settings.server.public_url, &scheme)
    {
        return Err(AdminError::Forbidden("Cross-site request refused.".into()));
    }
    let address = crate::client_addr::client_ip(req.request());
    // A bearer is the only credential when there is one; any other `Authorization` (a
    // fronting proxy's basic auth, sent by the browser on every request) leaves the session
    // cookie in charge — it answered 401 on every page, and the sign-in looped.
    let bearer = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim);
    if let Some(key) = bearer {
        let hash = token::parse_admin(key).ok_or(AdminError::Unauthorized)?;
        let row = sessions::admin_by_api_key(&state.db, &hash)
            .await?
            .filter(|a| !a.disabled && super::login::may_be_in(&state, a))
            .ok_or(AdminError::Unauthorized)?;
        let via = Via::ApiKey {
            key_hash: hash,
            prefix: token::admin_display_prefix(key)
                .unwrap_or_default()
                .to_string(),
        };
        return Actor::from_row(row, address, via).ok_or(AdminError::Unauthorized);
    }
    let secure = session::secure(&state.settings.server.public_url);
    let id = req
        .cookie(session::cookie_name(secure))
        .map(|c| c.value().to_string())
        .ok_or(AdminError::Unauthorized)?;
    let now = state.clock.now();
    let row = session::load(&state.db, &id, now)
        .await?
        .filter(|a| super::login::may_be_in(&state, a))
        .ok_or(AdminError::Unauthorized)?;
    if unsafe_method {
        let supplied = match req.headers().get(csrf::HEADER) {
            Some(v) => v.to_str().unwrap_or("").to_string(),
            None => form_field(req, csrf::FIELD).await?.unwrap_or_default(),
        };
        if !csrf::matches(&id, &supplied) {
            return Err(AdminError::Forbidden(
                "Missing or wrong CSRF token; reload the page and try again.".into(),
            ));
        }
    }
    let via = Via::Session {
        id_hash: session::id_hash(&id),
        csrf: csrf::token_for(&id),
    };
    Actor::from_row(row, address, via).ok_or(AdminError::Unauthorized)
}

/// Reads one field of a url-encoded body and puts the body back for the handler.
async fn form_field(req: &mut ServiceRequest, name: &str) -> Result<Option<String>, AdminError> {
    let is_form = req
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/x-www-form-urlencoded"));
    if !is_form {
        return Ok(None);
    }
    let payload = req.take_payload();
    let body = super::input::read_body(payload, req.request(), MAX_FORM).await?;
    let value = url::form_urlencoded::parse(&body)
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.into_owned());
    req.set_payload(Payload::from(body));
    Ok(value)
}

/// Headers on every admin answer: nothing cached, nothing framed, scripts only from here.
pub fn secure_headers(mut res: ServiceResponse<BoxBody>) -> ServiceResponse<BoxBody> {
    let h = res.headers_mut();
    for (k, v) in [
        ("cache-control", "no-store"),
        ("x-content-type-options", "nosniff"),
        ("x-frame-options", "DENY"),
        ("referrer-policy", "same-origin"),
        (
            "content-security-policy",
            "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; \
             connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
        ),
    ] {
        h.insert(
            header::HeaderName::from_static(k),
            HeaderValue::from_static(v),
        );
    }
    res
}
