//! What the attempts of one request have learned (`Run`), whether another round is worth
//! it, and the client's answer when no attempt served.

use std::time::{Duration, Instant};

use super::candidates::{could_take, Candidate};
use super::departure::Departure;
use crate::error::ApiError;
use crate::pipeline::request::Prepared;
use crate::state::AppState;
use crate::upstream::providers::translate::TranslateError;
use crate::upstream::retry::{self, Tier};

/// What the attempts of one request have learned so far.
#[derive(Default)]
pub(super) struct Run {
    pub(super) attempts: u32,
    /// Candidates that answered "overloaded": the only ones worth a backoff and a retry.
    pub(super) overloaded: Vec<usize>,
    only_rate_limited: bool,
    /// Every attempt was rate limited or overloaded: the keys are only resting.
    only_cooling: bool,
    /// The soonest a skipped or cooling candidate may serve again.
    soonest: Option<Duration>,
    pub(super) busy: bool,
    /// A key's own window (`rpm_limit` / `tpm_limit`) passed it over: the gateway pacing a
    /// healthy key, no sign of an empty pool.
    pub(super) paced: bool,
    /// A candidate that could take the request was passed over as unavailable for now
    /// (busy, paced, out of the catalog since it was built, or out of time): a request
    /// another cannot translate is then no client error.
    pub(super) passed_over: bool,
    /// Candidates passed over before their body was built (resting, disabled,
    /// breaker-open, held, out of retries): whether they could take the request is asked
    /// only if the answer depends on it (`final_error`), not on every request.
    passed: Vec<usize>,
    pub(super) untranslatable: Option<TranslateError>,
    pub(super) cut_by_deadline: bool,
    /// The request's deadline ended the attempts (it may have passed before the first).
    pub(super) out_of_time: bool,
    /// The connections (each client's, by origin) an attempt waited on for room and never
    /// went out (`Tier::Held`): every key there shares it, so none is tried again.
    held: Vec<(bool, url::Origin)>,
    /// Every attempt was held.
    only_held: bool,
    /// The dearest departure (`departure_on`) of the attempts that may have billed: sent
    /// and not answered with a refusal that bills nothing (`bills_nothing`).
    pub(super) billable: Departure,
}

impl Run {
    pub(super) fn new() -> Self {
        Run {
            only_rate_limited: true,
            only_cooling: true,
            only_held: true,
            ..Run::default()
        }
    }

    /// Notes candidate `i` passed over as unavailable for now, before its body was built.
    pub(super) fn unavailable(&mut self, i: usize) {
        self.passed.push(i);
    }

    pub(super) fn wait(&mut self, d: Duration) {
        self.soonest = Some(self.soonest.map_or(d, |s| s.min(d)));
    }

    /// Notes an attempt to `url` (of a deployment `allow_private` or not) that failed so.
    pub(super) fn failed(&mut self, tier: Tier, (allow_private, url): (bool, &reqwest::Url)) {
        self.only_held &= tier == Tier::Held;
        if tier == Tier::Held {
            self.held.push((allow_private, url.origin()));
        }
        self.only_rate_limited &= tier == Tier::RateLimited;
        // A held attempt is a connection full for now: come back later, as for a key resting.
        self.only_cooling &= matches!(tier, Tier::RateLimited | Tier::Overloaded | Tier::Held);
    }

    /// Whether an attempt to `url` would wait on a connection an earlier one was held on.
    pub(super) fn held_at(&self, (allow_private, url): (bool, &reqwest::Url)) -> bool {
        !self.held.is_empty() && self.held.contains(&(allow_private, url.origin()))
    }

    /// The client's answer when attempts were made and none served.
    pub(super) fn tried(&self) -> ApiError {
        let retry_after = seconds(self.soonest);
        if self.only_held {
            // Every attempt waited for room on a full connection: the gateway is busy there.
            ApiError::UpstreamBusy { retry_after: 1 }
        } else if self.only_rate_limited {
            ApiError::UpstreamRateLimited { retry_after }
        } else if self.only_cooling {
            // Every key that answered is resting past the deadline: say when to come back.
            ApiError::ServiceDegraded { retry_after }
        } else {
            ApiError::UpstreamError
        }
    }
}

/// How long to wait before another round, if one is worth it: only overloaded keys are
/// retried, within the attempt cap, once the first of them has rested its cooldown and
/// then after a jittered backoff — the jitter comes after the rest, or every request put
/// off by one cooldown would retry at the instant it ends — and only if that still ends
/// before the deadline.
pub(super) fn next_round(
    state: &AppState,
    candidates: &[Candidate],
    run: &Run,
    round: u32,
    deadline: Instant,
) -> Option<Duration> {
    let cfg = &state.settings.retry;
    if run.overloaded.is_empty() || run.attempts >= cfg.max_attempts {
        return None;
    }
    let now_ms = state.clock.monotonic_ms();
    let rested = run
        .overloaded
        .iter()
        .map(|&i| {
            state
                .pool()
                .cooling_ms(candidates[i].route.deployment, now_ms)
        })
        .min()
        .map_or(Duration::ZERO, Duration::from_millis);
    let wait = rested + retry::backoff(Duration::from_millis(cfg.base_delay_ms), round);
    (Instant::now() + wait < deadline).then_some(wait)
}

/// A `Retry-After` in whole seconds, at least one.
fn seconds(d: Option<Duration>) -> u64 {
    d.map_or(1, |d| (d.as_millis() as u64).div_ceil(1000).max(1))
}

/// The client's answer when no attempt served.
pub(super) fn final_error(
    state: &AppState,
    p: &Prepared,
    candidates: &[Candidate],
    run: &mut Run,
) -> ApiError {
    // Whether a candidate passed over before its build could take the request: one that
    // could makes a refusal to translate no client error; one that could not says why, as
    // an attempt would have.
    if run.attempts == 0 && !run.passed_over {
        for i in std::mem::take(&mut run.passed) {
            match could_take(state, p, &candidates[i]) {
                Some(Ok(())) => {
                    run.passed_over = true;
                    break;
                }
                Some(Err(e)) => {
                    run.untranslatable.get_or_insert(e);
                }
                None => {}
            }
        }
    }
    // A candidate's refusal to translate is the client's 400 only when no other candidate
    // was passed over as unavailable: with the keys that could take it resting, the answer
    // is the outage (503, which the SDKs retry), not a 400 the client takes for its own
    // fault (s24 attack, translation #1).
    let untranslatable = run.untranslatable.take().filter(|_| !run.passed_over);
    match (run.attempts, untranslatable) {
        (0, Some(e)) => ApiError::InvalidRequest {
            message: e.message,
            param: e.param,
        },
        (0, None) if run.busy => ApiError::UpstreamBusy { retry_after: 1 },
        // The request's own time ran out before any key was tried: a timeout of this
        // request (502, as a timeout is), not a sign that no key can serve — no alert a
        // client could raise with a short deadline.
        (0, None) if run.out_of_time => ApiError::UpstreamError,
        (0, None) if run.paced => ApiError::ServiceDegraded {
            retry_after: seconds(run.soonest),
        },
        (0, None) => {
            state.alerts.raise(
                "pool_empty",
                &p.model.name,
                "no upstream key of this model can serve: all cooling, disabled or breaker-open",
            );
            ApiError::ServiceDegraded {
                retry_after: seconds(run.soonest),
            }
        }
        _ => run.tried(),
    }
}
