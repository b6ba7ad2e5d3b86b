//! One candidate tried (`try_candidate`): its gates, the upstream call, and what the
//! failure's tier does (the retry table acted on).

use std::sync::Arc;
use std::time::{Duration, Instant};

use actix_web::http::header::HeaderMap;
use bytes::Bytes;

use super::candidates::{build, Candidate};
use super::departure::{bills_nothing, dearer, Departure};
use super::run::Run;
use super::verdicts::{judge, passthrough, still_in_use};
use super::Success;
use crate::endpoint::Endpoint;
use crate::error::ApiError;
use crate::ops::metrics;
use crate::ops::traces::Trace;
use crate::pipeline::recheck::RECHECK_AFTER;
use crate::pipeline::request::Prepared;
use crate::pipeline::Failure;
use crate::ratelimit::WindowSpec;
use crate::state::AppState;
use crate::upstream::catalog::Deployment;
use crate::upstream::client::UpstreamHeaders;
use crate::upstream::providers::{self, translate::stream::Corrupt, Format};
use crate::upstream::retry::{self, Tier};
use crate::upstream::UpstreamError;

#[allow(clippy::large_enum_variant)] // as `Outcome`
pub(super) enum Step {
    Served(Success),
    ClientError(Failure),
    /// No candidate can serve, for a reason none of them caused (`Tier::LocalResources`).
    Stop(Failure),
    Next,
}

/// `Retry-After` when the gateway itself ran short: descriptors come back as soon as the
/// load that took them ends.
const LOCAL_RETRY_AFTER_SECONDS: u64 = 1;

/// One call of candidate `c`; `reached` is told whether the request reached the upstream
/// (`UpstreamClient::post`).
async fn attempt(
    state: &AppState,
    (c, dep): (&Candidate, &Arc<Deployment>),
    url: Option<&reqwest::Url>,
    body: Vec<u8>,
    (stream, headers, reached): (bool, UpstreamHeaders<'_>, impl FnMut(bool)),
    (started, deadline, sent_ms): (Instant, Instant, i64),
) -> Result<Success, UpstreamError> {
    let d = c.route.deployment;
    let in_flight = state.pool().enter(d);
    let sent = Instant::now();
    let resp = state
        .upstream
        .post(dep, url, Bytes::from(body), deadline, (headers, reached))
        .await;
    metrics::upstream_answer(dep.provider.as_str(), &dep.id, sent.elapsed().as_secs_f64());
    let resp = resp?;
    state.pool().observe_headers(
        d,
        resp.headers(),
        (
            state.clock.monotonic_ms(),
            state.clock.now().timestamp_millis(),
        ),
        Duration::from_secs(state.settings.retry.max_cooldown_seconds),
    );
    let ttfb_ms = started.elapsed().as_millis() as i64;
    let success = |body, answer, response| Success {
        model: c.model.clone(),
        route: c.route.clone(),
        prices: c.prices,
        dep: dep.clone(),
        body,
        answer,
        read: None,
        response,
        ttfb_ms,
        sent_ms,
        in_flight,
        slot: None,
        key_booking: None,
        dropped: Box::default(),
        permit: None,
    };
    if stream {
        return Ok(success(None, None, Some(resp)));
    }
    // The whole answer by the first-byte bound from its send, or the request's deadline if
    // that comes first (s30 upstream attack F1: a body trickled after early headers was
    // read with no bound but a chunk's idle time). A provider that sends its headers with
    // the answer is bound so already; one that sends them at once (OpenRouter, keeping the
    // connection alive with spaces) gets no longer. Past the deadline the request's own
    // time ran out (`Deadline`, as for headers); past the first-byte bound the key was too
    // slow (`Timeout`, a breaker failure), so a key hanging behind its headers can open.
    let first_byte = Duration::from_millis(state.upstream.timeouts.first_byte_timeout_ms);
    let by = sent + first_byte;
    let bound = match deadline <= by {
        true => (deadline, UpstreamError::Deadline),
        false => (by, UpstreamError::Timeout),
    };
    let body = state
        .upstream
        .read_body_by(resp, state.settings.upstream.max_response_bytes, bound)
        .await?;
    let Ok(answer) = serde_json::from_slice::<serde_json::Value>(&body) else {
        return Err(UpstreamError::Garbage("answer is not JSON"));
    };
    Ok(success(Some(body), Some(answer), None))
}

/// A served chat or Responses answer the gateway cannot relay (`providers::relayable`) is
/// an attempt failure like a body that is not JSON: the next route is tried, and all
/// failing is a 502 `upstream_error` that costs nothing (DESIGN "Bounds against a lying
/// upstream"; s29 responses attack F1: a Responses answer was not judged, and one the
/// gateway could not read was a charged and stored empty response). One well-formed but
/// holding a part the gateway does not model is `Unsupported`: alike, but no failure of
/// its key (`try_candidate`). A translated answer is kept as read (`Success::read`), for
/// `convert_answer` or `responses::answer` to write: read once per request.
fn relayable(p: &Prepared, mut s: Success) -> Result<Success, UpstreamError> {
    let Some(answer) = s.answer.as_ref() else {
        return Ok(s);
    };
    let provider = s.dep.provider;
    let (upstream, client) = match p.endpoint {
        Endpoint::Chat | Endpoint::Messages => {
            (providers::format_of(provider), p.endpoint.format().into())
        }
        Endpoint::Responses => (providers::responses_format(provider), Format::Responses),
        Endpoint::Completions | Endpoint::Embeddings => return Ok(s),
    };
    match providers::relayable(upstream, client, answer) {
        Ok(read) => {
            s.read = read.map(Box::new);
            Ok(s)
        }
        Err(Corrupt::Unsupported) => Err(UpstreamError::Unsupported),
        Err(_) => Err(UpstreamError::Garbage(
            "answer is not one the gateway can read",
        )),
    }
}

/// Tries one candidate: its gates first, then the upstream call. Right before the call,
/// `sent` is told what a departure costs from then on: the dearer of this candidate's
/// (`here`) and every earlier attempt's that may have billed; after a refusal that bills
/// nothing, that earlier figure again.
pub(super) async fn try_candidate(
    state: &AppState,
    p: &Prepared,
    (c, i): (&Candidate, usize),
    run: &mut Run,
    ctx: ((&str, &Trace), Instant, Instant, &HeaderMap),
    (here, sent): (Departure, &mut impl FnMut(Departure)),
) -> Step {
    let ((request_id, trace), deadline, started, credential) = ctx;
    let d = c.route.deployment;
    // One deployment for the whole attempt (key, URL, body, the answer's reading), the one
    // of the moment (taken before the attempt's gates): a key rotated before this attempt
    // began is not sent.
    let dep = state.catalog().deployments[d].clone();
    // The route's model is no longer served there (a model edited since the request was
    // prepared): nothing to send, and no verdict on the upstream, which is healthy.
    let Some(url) = dep.url(&c.route, p.endpoint, p.stream) else {
        return Step::Next;
    };
    if run.held_at((dep.allow_private, url)) {
        run.unavailable(i);
        return Step::Next;
    }
    let pool = state.pool();
    // Every early return below drops the permit, which abandons it (frees a probe slot);
    // a client leaving once the call is sent frees it too, as a probe left unanswered.
    let mut permit = match pool.breakers[d].permit() {
        Ok(permit) => permit,
        Err(after) => {
            run.wait(after);
            run.unavailable(i);
            return Step::Next;
        }
    };
    if run.attempts > 0 && !state.pool().budgets[d].try_retry() {
        tracing::warn!(upstream = %dep.id, "retry budget spent; not retrying on this key");
        run.unavailable(i);
        return Step::Next;
    }
    let (body, dropped) = match build(&dep, p, c) {
        Ok(b) => (b.body, b.dropped),
        Err(e) => {
            run.untranslatable = Some(e);
            return Step::Next;
        }
    };
    let entered = Instant::now();
    let slot = match state.pool().gates[d].enter(deadline).await {
        Ok(s) => s,
        Err(_) => {
            run.busy = true;
            run.passed_over = true;
            return Step::Next;
        }
    };
    // The gate may have waited up to the deadline: a token revoked meanwhile goes no
    // further (`recheck`; s25 final attack F1). A shorter wait than the token cache's poll
    // is within a revocation's own bound.
    if entered.elapsed() >= RECHECK_AFTER {
        if let Err(e) = crate::pipeline::recheck::still_admitted(state, credential, deadline).await
        {
            return Step::Stop(e.into());
        }
    }
    // The gate may have waited up to the deadline: a key rotated, disabled or deleted
    // meanwhile must not go out. The attempt goes on with the deployment of the moment.
    let fresh;
    let (dep, url, body, dropped) = if still_in_use(state, &dep) {
        (&dep, url, body, dropped)
    } else {
        let catalog = state.catalog();
        if !catalog.usable(d) {
            run.passed_over = true;
            return Step::Next;
        }
        fresh = catalog.deployments[d].clone();
        let Some(url) = fresh.url(&c.route, p.endpoint, p.stream) else {
            return Step::Next;
        };
        match build(&fresh, p, c) {
            Ok(b) => (&fresh, url, b.body, b.dropped),
            Err(e) => {
                run.untranslatable = Some(e);
                return Step::Next;
            }
        }
    };
    // The key's window, booked at the worst case once the attempt is sure to go out (built,
    // through its gate, its key still in use): an attempt that never reached the key must
    // leave no request in its RPM log, which nothing removes (s24 attack, resilience #2).
    // Dropped, the booking corrects it to what it recorded: 0 unless this attempt is
    // answered. A refusal passes the key over for this attempt only: it is read on the
    // worst-case bookings of requests still running, corrected when they end — a cooldown
    // rested the key a whole window while it was nearly empty.
    let (rpm, tpm) = (dep.rpm_limit, dep.tpm_limit);
    let mut key_booking = None;
    if rpm > 0 || tpm > 0 {
        let spec = vec![WindowSpec::upstream(&dep.id, rpm, tpm)];
        // At the input this candidate's provider may read (documents at their pages, images
        // by its rule), as the token's window is (`pipeline::window_input`).
        let reader = p.reader(&c.route, dep.provider);
        let input = p.estimated_input_on(c.route.image_rule, c.model.max_input_tokens, reader);
        let estimated = input.saturating_add(p.output_cap()).max(0) as u64;
        let (decision, booking) = state
            .windows
            .admit(spec, &format!("{request_id}:{}", run.attempts), estimated)
            .await;
        key_booking = booking;
        if decision.refused.is_some() {
            run.wait(decision.retry_after);
            run.paced = true;
            run.passed_over = true;
            return Step::Next;
        }
    }
    if run.attempts == 0 {
        state.pool().budgets[d].first_attempt();
    }
    run.attempts += 1;
    // From here a request dropped mid-call leaves its permit unanswered, not abandoned, and
    // a probe's maximum wait runs: not while it waited at the gate, sending nothing.
    permit.sent();
    let sent_ms = state.clock.monotonic_ms();
    let mut span = trace.attempt(&dep.id, url);
    let headers = (p.anthropic_beta.as_ref(), span.traceparent());
    let mut reached = false;
    let billable = run.billable;
    // From the request's arrival (`upstream::on_wire`) the upstream may be working: a
    // request that ends before its answer pays this candidate's input, or an earlier one's
    // that may have billed when dearer, and has used its input in the key's window. Not
    // before: a client that leaves, or a deadline that runs out, while the connection or
    // the credential is being made costs nothing — nor after a 401 that billed nothing,
    // while the next request is being made (`UpstreamClient::post`).
    let on_wire = |on: bool| {
        reached = on;
        sent(if on { dearer(billable, here) } else { billable });
        if let Some(b) = key_booking.as_mut() {
            b.used(if on { p.input_tokens } else { 0 });
        }
    };
    let err = match attempt(
        state,
        (c, dep),
        Some(url),
        body,
        (p.stream, headers, on_wire),
        (started, deadline, sent_ms),
    )
    .await
    .and_then(|s| relayable(p, s))
    {
        Ok(mut s) => {
            // A success is a 2xx (`UpstreamClient::post`), and every provider's is a 200.
            span.outcome(Some(200), "served");
            trace.served_by(dep.provider, Some(url));
            // A stream's verdict waits for its end (`verdicts::stream_ended`); a probe holds
            // its slot while the stream progresses, up to the half-open maximum wait.
            if p.stream {
                permit.streaming(crate::pipeline::stream::probe_bound(state));
                s.permit = Some(permit);
            } else {
                permit.success();
                state.pool().succeeded(d);
            }
            s.slot = slot;
            s.key_booking = key_booking;
            s.dropped = dropped.into_boxed_slice();
            return Step::Served(s);
        }
        Err(e) => e,
    };
    let tier = retry::classify(&err);
    let status = match &err {
        UpstreamError::Status { status, .. } => Some(*status),
        _ => None,
    };
    span.outcome(status, tier.as_str());
    drop(span);
    // A failed attempt used nothing of the key's window — unless the request's own
    // deadline cut it off after the upstream had it (it keeps the input booked then). One
    // cut off before it reached the upstream cut nothing: the request failed.
    run.cut_by_deadline |= reached && tier == Tier::OutOfTime;
    // A request that never reached the upstream (cut off before it did, or
    // `UpstreamError::Connect`) billed nothing whatever its tier.
    let billed = reached && !bills_nothing(tier) && !matches!(err, UpstreamError::Connect(_));
    if billed {
        run.billable = dearer(run.billable, here);
    } else if reached {
        sent(run.billable);
    }
    if let Some(b) = key_booking.as_mut() {
        if !reached || tier != Tier::OutOfTime {
            b.used(0);
        }
    }
    if tier != Tier::LocalResources {
        tracing::warn!(upstream = %dep.id, tier = ?tier, error = %err, "upstream attempt failed");
    }
    run.failed(tier, (dep.allow_private, url));
    // The key was replaced while the call was out (a rotation, an admin's enable): what
    // its answer says — cool down, disable, a breaker failure — is not the new key's.
    if !still_in_use(state, dep) && tier != Tier::ClientError && tier != Tier::LocalResources {
        permit.abandon();
        if matches!(tier, Tier::RateLimited | Tier::Overloaded) {
            run.overloaded.push(i);
        }
        return Step::Next;
    }
    // The upstream answered well; only the gateway cannot read its answer: nothing of the
    // key's health (s28 diff attack F1: three such answers by any token opened a shared key).
    if matches!(err, UpstreamError::Unsupported) {
        permit.abandon();
        return Step::Next;
    }
    let retry_after = match &err {
        UpstreamError::Status { retry_after, .. } => *retry_after,
        _ => None,
    };
    if let Some(cool) = judge(state, (d, dep), tier, (retry_after, sent_ms), permit) {
        run.wait(cool);
    }
    if tier == Tier::Overloaded {
        run.overloaded.push(i);
    }
    match tier {
        // The gateway's own shortage: the request never left it. No verdict on the key, and
        // no other key (each would fail alike): the client retries in a moment. The alert
        // is the log line: nothing here is the upstream's.
        Tier::LocalResources => {
            let why = format!(
                "{err}: answered 503 without any upstream call; raise the gateway's limit \
                 (open files: `LimitNOFILE`, `ulimit -n`) or shed load"
            );
            state.alerts.raise("local_resources", "gateway", &why);
            Step::Stop(
                ApiError::ServiceDegraded {
                    retry_after: LOCAL_RETRY_AFTER_SECONDS,
                }
                .into(),
            )
        }
        Tier::ClientError => Step::ClientError(passthrough(
            err,
            providers::format_of(dep.provider),
            p.endpoint.format(),
        )),
        _ => Step::Next,
    }
}
