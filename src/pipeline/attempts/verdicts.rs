//! What a failed attempt's tier does beyond the run: a key disabled (an alert and an audit
//! row), a breaker failure or opening (an alert), an upstream client error passed back to
//! the client in its format.

use actix_web::HttpResponse;

use crate::error::{ApiError, WireFormat};
use crate::pipeline::Failure;
use crate::state::AppState;
use crate::store::audit::{self, AuditEntry};
use crate::upstream::breaker::Permit;
use crate::upstream::pool::Disabled;
use crate::upstream::providers;
use crate::upstream::UpstreamError;

/// Disables a key after a quota or auth failure: an alert, and an audit row.
pub(super) fn disable_key(state: &AppState, d: usize, why: Disabled) {
    if !state.pool().disable(d, why) {
        return;
    }
    let id = state.catalog().deployments[d].id.clone();
    state.alerts.raise(
        "key_disabled",
        &id,
        &format!("upstream key disabled ({}); other keys serve", why.as_str()),
    );
    let (db, now) = (state.db.clone(), state.clock.now());
    tokio::spawn(async move {
        let target = format!("upstream:{id}");
        let e = AuditEntry {
            actor: "system",
            address: "",
            action: "upstream.disable",
            target: &target,
            before: None,
            after: Some(why.as_str()),
        };
        if let Err(err) = audit::record(&db, &e, now).await {
            tracing::error!(error = %err, "audit row for a disabled key failed");
        }
    });
}

pub(super) fn breaker_failure(state: &AppState, d: usize, permit: Permit<'_>) {
    if permit.failure() {
        breaker_opened(state, d);
    }
}

pub(super) fn breaker_opened(state: &AppState, d: usize) {
    state.alerts.raise(
        "breaker_open",
        &state.catalog().deployments[d].id,
        "circuit breaker opened after repeated failures",
    );
}

/// An upstream client error (400/404/413/422) goes back to the client as it is, in the
/// client's format.
pub(super) fn passthrough(
    err: UpstreamError,
    upstream: providers::Format,
    client: WireFormat,
) -> Failure {
    match err {
        UpstreamError::Status { status, body, .. } => {
            let body = providers::convert_error(upstream, client, status, body);
            let code = actix_web::http::StatusCode::from_u16(status)
                .unwrap_or(actix_web::http::StatusCode::BAD_REQUEST);
            let response = HttpResponse::build(code)
                .content_type("application/json")
                .insert_header(("x-should-retry", "false"))
                .body(body);
            Failure {
                error: ApiError::UpstreamClientError,
                response: Some(response),
            }
        }
        _ => ApiError::UpstreamError.into(),
    }
}
