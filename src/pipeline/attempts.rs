//! Stages 7–9: pick routes, send, and act on each failure by its tier (`upstream::retry`).
//! Routes of the asked model come first (least busy first), then its fallbacks' routes in
//! order. Every attempt goes through `call`; nothing else retries.

use std::sync::Arc;
use std::time::{Duration, Instant};

use actix_web::HttpResponse;
use bytes::Bytes;

use super::request::Prepared;
use super::Failure;
use crate::error::ApiError;
use crate::error::WireFormat;
use crate::state::AppState;
use crate::upstream::catalog::{Model, Route};
use crate::upstream::pool::{Disabled, InFlight};
use crate::upstream::providers::{self, translate::TranslateError};
use crate::upstream::retry::{self, Tier};
use crate::upstream::UpstreamError;

#[derive(Debug, Clone)]
pub struct Candidate {
    pub model: Arc<Model>,
    pub route: Route,
}

/// The routes that may serve a request, in the order they are tried.
pub fn candidates(state: &AppState, p: &Prepared) -> Vec<Candidate> {
    let mut out = Vec::with_capacity(p.model.routes.len());
    let mut push_model = |m: &Arc<Model>| {
        let start = out.len();
        for r in &m.routes {
            // A route whose provider has no such endpoint (embeddings on Anthropic) is skipped.
            if providers::path(p.endpoint, state.catalog.deployments[r.deployment].provider)
                .is_some()
            {
                out.push(Candidate {
                    model: m.clone(),
                    route: r.clone(),
                });
            }
        }
        out[start..].sort_by_key(|c| state.pool.in_flight(c.route.deployment));
    };
    push_model(&p.model);
    for f in &p.model.fallbacks {
        if let Some(m) = state.catalog.model(f) {
            push_model(m);
        }
    }
    out
}

/// A successful attempt. For non-streams the body has been read (and checked to be JSON);
/// for streams the response is handed to the pump unread.
pub struct Success {
    pub model: Arc<Model>,
    pub route: Route,
    pub body: Option<Bytes>,
    /// The parsed non-streamed answer.
    pub answer: Option<serde_json::Value>,
    pub response: Option<reqwest::Response>,
    pub ttfb_ms: i64,
    pub in_flight: InFlight,
}

pub enum Outcome {
    Served(Success),
    Failed(Failure),
}

pub struct Called {
    pub result: Outcome,
    pub attempts: u32,
}

async fn attempt(
    state: &AppState,
    p: &Prepared,
    c: &Candidate,
    (path, body): (&str, Vec<u8>),
    started: Instant,
) -> Result<Success, UpstreamError> {
    let dep = &state.catalog.deployments[c.route.deployment];
    let in_flight = state.pool.enter(c.route.deployment);
    let resp = state.upstream.post(dep, path, Bytes::from(body)).await?;
    let ttfb_ms = started.elapsed().as_millis() as i64;
    if p.stream {
        return Ok(Success {
            model: c.model.clone(),
            route: c.route.clone(),
            body: None,
            answer: None,
            response: Some(resp),
            ttfb_ms,
            in_flight,
        });
    }
    let body = state
        .upstream
        .read_body(resp, state.settings.upstream.max_response_bytes)
        .await?;
    let Ok(answer) = serde_json::from_slice::<serde_json::Value>(&body) else {
        return Err(UpstreamError::Garbage("answer is not JSON"));
    };
    Ok(Success {
        model: c.model.clone(),
        route: c.route.clone(),
        body: Some(body),
        answer: Some(answer),
        response: None,
        ttfb_ms,
        in_flight,
    })
}

/// Tries candidates until one answers, following the retry table.
pub async fn call(
    state: &AppState,
    p: &Prepared,
    candidates: &[Candidate],
    deadline: Instant,
) -> Called {
    let cfg = &state.settings.retry;
    let cap = Duration::from_secs(cfg.max_cooldown_seconds);
    let started = Instant::now();
    let mut attempts = 0u32;
    let mut round = 0u32;
    // Candidates that answered "overloaded": the only ones worth a backoff and a retry.
    let mut overloaded: Vec<usize> = Vec::new();
    let mut only_rate_limited = true;
    let mut shortest_cooldown: Option<u64> = None;
    // A candidate that cannot express the request (e.g. `n > 1` for Anthropic) is skipped;
    // if none could, the client hears why.
    let mut untranslatable: Option<TranslateError> = None;
    loop {
        round += 1;
        let now_ms = state.clock.now().timestamp_millis();
        let eligible: Vec<usize> = (0..candidates.len())
            .filter(|&i| {
                let d = candidates[i].route.deployment;
                !state.pool.is_disabled(d)
                    && (if round == 1 {
                        state.pool.cooling_ms(d, now_ms) == 0
                    } else {
                        overloaded.contains(&i)
                    })
            })
            .collect();
        if round == 1 && eligible.is_empty() {
            let wait = candidates
                .iter()
                .filter(|c| !state.pool.is_disabled(c.route.deployment))
                .map(|c| state.pool.cooling_ms(c.route.deployment, now_ms))
                .min()
                .map(|ms| ms.div_ceil(1000).max(1))
                .unwrap_or(cfg.max_cooldown_seconds.max(1));
            return Called {
                result: Outcome::Failed(ApiError::ServiceDegraded { retry_after: wait }.into()),
                attempts,
            };
        }
        overloaded.clear();
        for i in eligible {
            if attempts >= cfg.max_attempts.max(1) || Instant::now() >= deadline {
                break;
            }
            let c = &candidates[i];
            let d = c.route.deployment;
            let dep = &state.catalog.deployments[d];
            let Some(path) = providers::path(p.endpoint, dep.provider) else {
                continue;
            };
            let body = match providers::build_request(
                p.endpoint.format(),
                dep.provider,
                &p.body,
                &c.route.upstream_model,
                p.cap,
                p.stream,
            ) {
                Ok(b) => b,
                Err(e) => {
                    untranslatable = Some(e);
                    continue;
                }
            };
            attempts += 1;
            let err = match attempt(state, p, c, (path, body), started).await {
                Ok(s) => {
                    state.pool.succeeded(d);
                    return Called {
                        result: Outcome::Served(s),
                        attempts,
                    };
                }
                Err(e) => e,
            };
            let tier = retry::classify(&err);
            let dep_id = &state.catalog.deployments[d].id;
            tracing::warn!(upstream = %dep_id, tier = ?tier, error = %err, "upstream attempt failed");
            only_rate_limited &= tier == Tier::RateLimited;
            match tier {
                Tier::RateLimited | Tier::Overloaded => {
                    let streak = state.pool.rate_limited(d);
                    let retry_after = if let UpstreamError::Status { retry_after, .. } = &err {
                        *retry_after
                    } else {
                        None
                    };
                    let cool = retry::cooldown(retry_after, streak, cap);
                    state
                        .pool
                        .cool_down(d, state.clock.now().timestamp_millis(), cool);
                    let secs = cool.as_millis().div_ceil(1000).max(1) as u64;
                    shortest_cooldown = Some(shortest_cooldown.map_or(secs, |s| s.min(secs)));
                    if tier == Tier::Overloaded {
                        overloaded.push(i);
                    }
                }
                Tier::QuotaExhausted => {
                    tracing::error!(upstream = %dep_id, "upstream key is out of quota; disabled until re-enabled");
                    state.pool.disable(d, Disabled::Quota);
                }
                Tier::AuthFailed => {
                    tracing::error!(upstream = %dep_id, "upstream refused its key; disabled (possible leak or revocation)");
                    state.pool.disable(d, Disabled::Auth);
                }
                Tier::ServerError => {}
                Tier::ClientError => {
                    let failure =
                        passthrough(err, providers::format_of(dep.provider), p.endpoint.format());
                    return Called {
                        result: Outcome::Failed(failure),
                        attempts,
                    };
                }
            }
        }
        let backoff = retry::backoff(Duration::from_millis(cfg.base_delay_ms), round);
        let more = !overloaded.is_empty()
            && attempts < cfg.max_attempts
            && Instant::now() + backoff < deadline;
        if !more {
            break;
        }
        tokio::time::sleep(backoff).await;
    }
    if let (0, Some(e)) = (attempts, untranslatable) {
        let error = ApiError::InvalidRequest {
            message: e.message,
            param: Some(e.param),
        };
        return Called {
            result: Outcome::Failed(error.into()),
            attempts,
        };
    }
    let error = if only_rate_limited && attempts > 0 {
        ApiError::UpstreamRateLimited {
            retry_after: shortest_cooldown.unwrap_or(1),
        }
    } else {
        ApiError::UpstreamError
    };
    Called {
        result: Outcome::Failed(error.into()),
        attempts,
    }
}

/// An upstream client error (400/404/413/422) goes back to the client as it is.
fn passthrough(err: UpstreamError, upstream: WireFormat, client: WireFormat) -> Failure {
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
