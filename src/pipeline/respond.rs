//! Response headers every proxied answer carries, and the request's deadline.

use std::time::{Duration, Instant};

use actix_web::http::header::{HeaderName, HeaderValue};
use actix_web::{HttpResponse, HttpResponseBuilder};

use crate::auth::TokenAuth;
use crate::config::RetrySettings;
use crate::quota::pricing;
use crate::ratelimit::{openai_duration, Decision};

pub fn request_id(resp: &mut HttpResponse, id: &str) {
    if let Ok(v) = actix_web::http::header::HeaderValue::from_str(id) {
        resp.headers_mut().insert(
            actix_web::http::header::HeaderName::from_static("x-request-id"),
            v,
        );
    }
}

/// The headers of every answer; `dropped` names the client fields the upstream's request
/// left out (hints and bookkeeping, `dispatch::fit`): announced, and counted.
pub fn gateway_headers(
    resp: &mut HttpResponseBuilder,
    id: &str,
    upstream: &str,
    remaining: Option<i64>,
    cache: &str,
    auth: &TokenAuth,
    dropped: &[&'static str],
) {
    resp.insert_header(("x-request-id", id));
    resp.insert_header(("x-sluice-upstream", upstream));
    resp.insert_header(("x-sluice-cache", cache));
    if let Some(r) = remaining {
        resp.insert_header(("x-sluice-budget-remaining-usd", pricing::usd(r)));
    }
    if !dropped.is_empty() {
        resp.insert_header(("x-sluice-dropped", dropped.join(", ")));
        crate::ops::metrics::dropped(dropped);
    }
    if auth.past_threshold() {
        let warning = format!("{}% of this token's budget is used", auth.percent_used());
        resp.insert_header(("x-sluice-budget-warning", warning));
    }
}

/// OpenAI's `x-ratelimit-*` headers for the token's own window.
pub fn ratelimit_headers(resp: &mut HttpResponse, d: &Decision) {
    let mut put = |name: &'static str, value: String| {
        if let Ok(v) = HeaderValue::from_str(&value) {
            resp.headers_mut().insert(HeaderName::from_static(name), v);
        }
    };
    if d.requests_limit > 0 {
        put("x-ratelimit-limit-requests", d.requests_limit.to_string());
        put(
            "x-ratelimit-remaining-requests",
            d.requests_limit.saturating_sub(d.requests_used).to_string(),
        );
        put(
            "x-ratelimit-reset-requests",
            openai_duration(d.requests_reset),
        );
    }
    if d.tokens_limit > 0 {
        put("x-ratelimit-limit-tokens", d.tokens_limit.to_string());
        put(
            "x-ratelimit-remaining-tokens",
            d.tokens_limit.saturating_sub(d.tokens_used).to_string(),
        );
        put("x-ratelimit-reset-tokens", openai_duration(d.tokens_reset));
    }
}

/// How long the request waited for admission.
pub fn queue_wait(resp: &mut HttpResponse, waited: std::time::Duration) {
    if let Ok(v) = HeaderValue::from_str(&waited.as_millis().to_string()) {
        resp.headers_mut()
            .insert(HeaderName::from_static("x-sluice-queue-wait-ms"), v);
    }
}

/// `x-sluice-request-deadline-ms` when the client sent one (`limits::client_headers`),
/// never above the configured deadline, else `retry.request_deadline_ms`.
pub fn deadline(asked_ms: Option<u64>, cfg: &RetrySettings, started: Instant) -> Instant {
    let ms = asked_ms.map_or(cfg.request_deadline_ms, |a| a.min(cfg.request_deadline_ms));
    // A configured deadline past what `Instant` holds means "no deadline": a year will do.
    started
        .checked_add(Duration::from_millis(ms))
        .unwrap_or_else(|| started + Duration::from_secs(365 * 24 * 3600))
}
