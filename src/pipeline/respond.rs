//! Response headers every proxied answer carries, and the request's deadline.

use std::time::{Duration, Instant};

use actix_web::{HttpRequest, HttpResponse, HttpResponseBuilder};

use crate::auth::TokenAuth;
use crate::config::RetrySettings;
use crate::quota::pricing;

pub fn request_id(resp: &mut HttpResponse, id: &str) {
    if let Ok(v) = actix_web::http::header::HeaderValue::from_str(id) {
        resp.headers_mut().insert(
            actix_web::http::header::HeaderName::from_static("x-request-id"),
            v,
        );
    }
}

pub fn gateway_headers(
    resp: &mut HttpResponseBuilder,
    id: &str,
    upstream: &str,
    remaining: Option<i64>,
    cache: &str,
    auth: &TokenAuth,
) {
    resp.insert_header(("x-request-id", id));
    resp.insert_header(("x-sluice-upstream", upstream));
    resp.insert_header(("x-sluice-cache", cache));
    if let Some(r) = remaining {
        resp.insert_header(("x-sluice-budget-remaining-usd", pricing::usd(r)));
    }
    if auth.past_threshold() {
        let warning = format!("{}% of this token's budget is used", auth.percent_used());
        resp.insert_header(("x-sluice-budget-warning", warning));
    }
}

/// `x-sluice-request-deadline-ms` when the client sends one (never above the configured
/// deadline), else `retry.request_deadline_ms`.
pub fn deadline(req: &HttpRequest, cfg: &RetrySettings, started: Instant) -> Instant {
    let asked = req
        .headers()
        .get("x-sluice-request-deadline-ms")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    let ms = asked.map_or(cfg.request_deadline_ms, |a| a.min(cfg.request_deadline_ms));
    started + Duration::from_millis(ms)
}
