//! What a failed attempt's tier does beyond the run: a key rested, disabled (an alert and
//! an audit row), a breaker failure or opening (an alert), an upstream client error passed
//! back to the client in its format; and the verdict on a stream's key when it ends.

use std::time::Duration;

use actix_web::HttpResponse;

use crate::error::{ApiError, WireFormat};
use crate::ops::metrics;
use crate::pipeline::Failure;
use crate::state::AppState;
use crate::store::audit::{self, AuditEntry};
use crate::upstream::breaker::Permit;
use crate::upstream::catalog::Deployment;
use crate::upstream::pool::Disabled;
use crate::upstream::providers;
use crate::upstream::retry::{self, Tier};
use crate::upstream::UpstreamError;

/// What a failure of `tier` on key `d` (`dep`) does to the key, as the retry table says: its
/// rest (returned: the run waits it out before trying the key again), its breaker, its
/// disabling. `retry_after`: the upstream's own, if it sent one; `sent_ms`: when the
/// attempt went out (`Pool::rate_limited`).
pub(super) fn judge(
    state: &AppState,
    (d, dep): (usize, &Deployment),
    tier: Tier,
    (retry_after, sent_ms): (Option<Duration>, i64),
    permit: Permit,
) -> Option<Duration> {
    match tier {
        Tier::RateLimited | Tier::Overloaded => {
            if tier == Tier::RateLimited {
                metrics::upstream_429(&dep.id);
            }
            let cap = Duration::from_secs(state.settings.retry.max_cooldown_seconds);
            let now = state.clock.monotonic_ms();
            let cool = state.pool().rate_limited(d, (sent_ms, now), |streak| {
                retry::cooldown(retry_after, streak, cap)
            });
            if tier == Tier::Overloaded {
                breaker_failure(state, d, permit);
            } else {
                permit.abandon();
            }
            return Some(cool);
        }
        Tier::QuotaExhausted => {
            permit.abandon();
            disable_key(state, d, Disabled::Quota);
        }
        Tier::AuthFailed => {
            permit.abandon();
            disable_key(state, d, Disabled::Auth);
        }
        Tier::ServerError => breaker_failure(state, d, permit),
        // The gateway's own connection to that host was full (`Held`), a conflict (transient)
        // or the gateway's own shortage (`LocalResources`): nothing of the key's health.
        Tier::Held | Tier::Conflict | Tier::LocalResources => permit.abandon(),
        // Running out of the request's own time is the client's limit, no failure — but
        // probes that keep ending so re-open the breaker (`UNANSWERED_PROBES_REOPEN`).
        Tier::OutOfTime => {
            if permit.unanswered() {
                breaker_opened(state, d);
            }
        }
        // The upstream answered sensibly: for the breaker that is a success.
        Tier::ClientError => permit.success(),
    }
    None
}

/// How a stream ended, for its key's verdict (`stream_ended`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StreamEnd {
    /// The answer was whole: its finish came, whatever followed it (s26 stop attack #5: a
    /// server that sends no usage or no `[DONE]` after the finish answered all the same).
    Whole,
    /// Nothing of the key's health: the client left or the shutdown ended it before the
    /// answer was whole, or the upstream's error event named no fault of its own (`Fault`).
    Unjudged,
    /// The upstream failed it after its 200, before its finish: a stall, a break, an
    /// unreadable event or the hold limit (`ServerError`), or its own error event naming
    /// its own fault (`retry::of_fault`).
    Failed(Tier),
}

/// The verdict on a stream's key, given when the stream ends (its 200 gave none): a whole
/// answer is its success, a failure after the 200 is judged as that tier's failure before
/// it would be — a 529's rest, a breaker failure — but tries no other key (the client has
/// the stream's first events). A key replaced while the stream ran (a rotation) is not
/// judged by its predecessor's stream (as `try_candidate`). `sent_ms`: when the stream's
/// attempt went out (`Success::sent_ms`).
pub fn stream_ended(
    state: &AppState,
    (d, dep, sent_ms): (usize, &Deployment, i64),
    permit: Permit,
    end: StreamEnd,
) {
    match end {
        StreamEnd::Whole => {
            permit.success();
            state.pool().succeeded(d);
        }
        StreamEnd::Unjudged => permit.abandon(),
        StreamEnd::Failed(_) if !still_in_use(state, dep) => permit.abandon(),
        StreamEnd::Failed(tier) => {
            tracing::warn!(upstream = %dep.id, tier = ?tier, "upstream stream failed after its 200");
            judge(state, (d, dep), tier, (None, sent_ms), permit);
        }
    }
}

/// Whether `dep`'s key is still the one its deployment sends (`Deployment::sealing` tells
/// an admin's action on a managed key).
pub(super) fn still_in_use(state: &AppState, dep: &Deployment) -> bool {
    let catalog = state.catalog();
    catalog
        .position(&dep.id)
        .map(|d| &catalog.deployments[d])
        .is_some_and(|now| {
            now.sealing == dep.sealing
                && now.shared_tag() == dep.shared_tag()
                && now.api_key.expose() == dep.api_key.expose()
        })
}

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

pub(super) fn breaker_failure(state: &AppState, d: usize, permit: Permit) {
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
