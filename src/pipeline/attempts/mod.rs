//! Stages 7–9: pick routes, send, and act on each failure by its tier (`upstream::retry`).
//! Routes of the asked model come first (least busy first), then its fallbacks' routes in
//! order. Before an attempt, a candidate must pass its circuit breaker, its retry budget
//! (for retries), its own upstream window (`rpm_limit` / `tpm_limit`) and its concurrency
//! gate. Every attempt goes through `call`; nothing else retries.
//!
//! Time: the request's deadline bounds everything — each attempt waits for its headers,
//! and a non-streamed one for its whole body, at most until the deadline (an error body for
//! less: `UpstreamClient::post`), and a backoff round that would end past it is not started. A
//! key cooling down is never attempted inside its cooldown, in any round: a later round
//! waits for the cooldown to end and then a jittered backoff (or gives up if that ends past
//! the deadline).

mod attempt;
mod candidates;
mod departure;
mod run;
mod verdicts;

use std::sync::Arc;
use std::time::Instant;

use actix_web::http::header::HeaderMap;
use bytes::Bytes;

use super::recheck::RECHECK_AFTER;
use super::request::Prepared;
use super::Failure;
use crate::ops::traces::Trace;
use crate::quota::pricing::Prices;
use crate::ratelimit::Booking;
use crate::state::AppState;
use crate::upstream::breaker::Permit;
use crate::upstream::catalog::{Deployment, Model, Route};
use crate::upstream::gate::Slot;
use crate::upstream::pool::InFlight;
use crate::upstream::providers::canonical::Answer;
use attempt::{try_candidate, Step};
use candidates::{off, ready};
use departure::departure_on;
use run::{final_error, next_round, Run};

pub use candidates::{candidates, dropped_by_any, Candidate};
pub use departure::Departure;
pub use verdicts::{stream_ended, StreamEnd};

/// A successful attempt. For non-streams the body has been read (and checked to be JSON);
/// for streams the response is handed to the pump unread. The in-flight count and the
/// gate slot are held until the answer (or the stream) ends.
pub struct Success {
    pub model: Arc<Model>,
    pub route: Route,
    /// The route's prices at the request's start: what the answer is settled at.
    pub prices: Prices,
    /// The deployment as the attempt used it (its provider reads the answer): the catalog
    /// may have been rebuilt since.
    pub dep: Arc<Deployment>,
    pub body: Option<Bytes>,
    /// The parsed non-streamed answer.
    pub answer: Option<serde_json::Value>,
    /// A non-streamed answer from an upstream that does not speak the client's format, as
    /// `relayable` read it into the internal form: written in the client's format from it
    /// (`convert_answer`, `responses::answer`), and its end judged from it for the cache.
    /// `None` for one passed through. Boxed, as `dropped`.
    pub read: Option<Box<Answer>>,
    pub response: Option<reqwest::Response>,
    pub ttfb_ms: i64,
    /// When the attempt went out (`Clock::monotonic_ms`): a stream's rate
    /// limit counts into its key's streak only when sent after the key's last rest ended
    /// (`Pool::rate_limited`).
    pub sent_ms: i64,
    pub in_flight: InFlight,
    pub slot: Option<Slot>,
    /// This key's own token window, to correct to the usage when the answer is settled.
    pub key_booking: Option<Booking>,
    /// The client fields left out of the upstream's request (`x-sluice-dropped`); a boxed
    /// slice, as every served answer carries this struct by value.
    pub dropped: Box<[&'static str]>,
    /// A stream's breaker permit, reported when the stream ends (`stream_ended`); a
    /// non-streamed answer's success is reported at once.
    pub permit: Option<Permit>,
}

impl Success {
    /// Whether this is the answer a cache plan was made for: served by the asked model's
    /// own routes, under the output cap the request asked for. A fallback model's answer
    /// is an outage's answer, and may be cut by the lower cap its model holds to
    /// (`candidates::build`); stored under the asked model's key, it was served as that
    /// model's for its TTL after the model recovered (s27 cache attack F1). The log row
    /// names the model that served either way.
    pub fn as_planned(&self, p: &Prepared) -> bool {
        self.model.name == p.model.name
            && p.cap
                .is_none_or(|(_, cap)| cap <= self.model.max_output_tokens)
    }
}

// Served is the common outcome, moved once to its caller: boxing it would cost every
// request an allocation to save stack bytes on the rare failure.
#[allow(clippy::large_enum_variant)]
pub enum Outcome {
    Served(Success),
    Failed(Failure),
}

pub struct Called {
    pub result: Outcome,
    pub attempts: u32,
    /// An attempt was cut off by the request's own deadline after it was sent: the
    /// upstream had the request and may bill its input (the client's limit, as when it
    /// disconnects; an upstream that is merely slow costs nothing).
    pub cut_by_deadline: bool,
}

/// Tries candidates until one answers, following the retry table. `sent` is told what the
/// request costs if it ends before its answer whenever that changes: before each call, the
/// dearest departure (`departure_on`) of the candidates that may bill it — the one called,
/// and those called before and not answered with a refusal that bills nothing
/// (`try_candidate`). A candidate skipped before its call, or never reached, costs nothing.
pub async fn call(
    state: &AppState,
    p: &Prepared,
    candidates: &[Candidate],
    deadline: Instant,
    (request_id, trace): (&str, &Trace),
    (credential, mut checked): (&HeaderMap, Instant),
    mut sent: impl FnMut(Departure),
) -> Called {
    let cfg = &state.settings.retry;
    let started = Instant::now();
    let mut run = Run::new();
    let mut round = 0u32;
    // `checked`: when the credential was last known good — its authentication, or the
    // re-check after a wait before this call (s26 attack F2: the clock started here, so a
    // first attempt was never re-checked however long the request had waited since). A
    // request is checked again after any wait (`recheck`) — a slow failed attempt, a
    // round's sleep — before its next attempt.
    loop {
        round += 1;
        let pool: Vec<usize> = if round == 1 {
            (0..candidates.len()).collect()
        } else {
            std::mem::take(&mut run.overloaded)
        };
        for i in pool {
            if run.attempts >= cfg.max_attempts.max(1) {
                break;
            }
            if Instant::now() >= deadline {
                run.out_of_time = true;
                run.passed_over = true;
                break;
            }
            // Checked right before each attempt: an earlier attempt of this request may
            // just have put the same key (routed twice) to rest.
            if !ready(state, &candidates[i], &mut run) {
                run.unavailable(i);
                // An overloaded key whose rest another request lengthened meanwhile is
                // waited for again in the next round (within the deadline), not given up.
                if round > 1 && !off(state, candidates[i].route.deployment) {
                    run.overloaded.push(i);
                }
                continue;
            }
            // An earlier attempt or a round's sleep may have lasted up to the deadline: a
            // token revoked meanwhile goes no further (s25 attacks: the day's diff #1, the
            // stop attack F1 — the next key, ready at once, was called).
            if checked.elapsed() >= RECHECK_AFTER {
                if let Err(e) = super::recheck::still_admitted(state, credential, deadline).await {
                    return called(Outcome::Failed(e.into()), &run);
                }
                checked = Instant::now();
            }
            let ctx = ((request_id, trace), deadline, started, credential);
            let here = departure_on(state, p, &candidates[i]);
            let candidate = (&candidates[i], i);
            match try_candidate(state, p, candidate, &mut run, ctx, (here, &mut sent)).await {
                Step::Served(s) => return called(Outcome::Served(s), &run),
                Step::ClientError(f) | Step::Stop(f) => return called(Outcome::Failed(f), &run),
                Step::Next => {}
            }
        }
        match next_round(state, candidates, &run, round, deadline) {
            Some(wait) => tokio::time::sleep(wait).await,
            None => break,
        }
    }
    let error = final_error(state, p, candidates, &mut run);
    called(Outcome::Failed(error.into()), &run)
}

fn called(result: Outcome, run: &Run) -> Called {
    Called {
        result,
        attempts: run.attempts,
        cut_by_deadline: run.cut_by_deadline,
    }
}

#[cfg(test)]
mod tests;
