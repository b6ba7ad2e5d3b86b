//! Stages 7–9: pick routes, send, and act on each failure by its tier (`upstream::retry`).
//! Routes of the asked model come first (least busy first), then its fallbacks' routes in
//! order. Before an attempt, a candidate must pass its circuit breaker, its retry budget
//! (for retries), its own upstream window (`rpm_limit` / `tpm_limit`) and its concurrency
//! gate. Every attempt goes through `call`; nothing else retries.
//!
//! Time: the request's deadline bounds everything — each attempt waits for its headers at
//! most until the deadline, and a backoff round that would end past it is not started. A
//! key cooling down is never attempted inside its cooldown, in any round: a later round
//! waits for the cooldown to end and then a jittered backoff (or gives up if that ends past
//! the deadline).

use std::sync::Arc;
use std::time::{Duration, Instant};

use actix_web::HttpResponse;
use bytes::Bytes;
use tokio::sync::OwnedSemaphorePermit;

use super::long_context;
use super::request::Prepared;
use super::Failure;
use crate::config::Provider;
use crate::error::{ApiError, WireFormat};
use crate::ops::metrics;
use crate::ops::traces::Trace;
use crate::quota::pricing::Prices;
use crate::ratelimit::{Booking, WindowSpec};
use crate::state::AppState;
use crate::store::audit::{self, AuditEntry};
use crate::upstream::breaker::Permit;
use crate::upstream::catalog::{Deployment, Model, Route};
use crate::upstream::client::UpstreamHeaders;
use crate::upstream::pool::{Disabled, InFlight};
use crate::upstream::providers::{self, translate::TranslateError, Built};
use crate::upstream::retry::{self, Tier};
use crate::upstream::UpstreamError;
use crate::usage::Usage;

#[derive(Debug, Clone)]
pub struct Candidate {
    pub model: Arc<Model>,
    pub route: Route,
    /// The route's prices in force when the request started (`Prepared::started_at`); its
    /// long-context tier, too, is the one in force then (`Route::at`).
    pub prices: Prices,
}

/// What a request that reached the upstream is charged when it ends without an answer — its
/// client left, its own deadline cut the attempt off, the shutdown ended it: `input` tokens
/// costing `cost` micro-dollars.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Departure {
    pub input: i64,
    pub cost: i64,
}

/// What a request sent to candidate `c` costs if it ends before the answer (its client
/// leaves, its deadline cuts the attempt off, the shutdown ends it): the upstream had the
/// whole request and may bill all of it, which the gateway cannot know, so the input
/// reserved for it there (`Prepared::reserved_input_on`: with documents, at least the
/// model's whole input, within the window the provider serves; on Gemini each digit once
/// more, as the reservation counts it), at its price — at the dearest cache write the
/// request marked, and at a long-context tier's rates where the provider's tokenizer may
/// count that input past its threshold, as the reservation decides
/// (`long_context::priced_departed`, `provider_may_count`). A server-tool turn may have run
/// whole meanwhile (the upstream goes on without its client): every step's input
/// (`kinds::Turn::billed_input` of that input) and every search it was allowed. Never more
/// than the reservation (the same input without its margin). `call` takes the dearest of
/// the candidates a request was sent to, never one it was not.
fn departure_on(state: &AppState, p: &Prepared, c: &Candidate) -> Departure {
    // Deployments keep their position across rebuilds; one not found (it cannot be) is
    // taken at the largest count, as the reservation takes it.
    let provider = (state.live.snapshot().catalog.deployments)
        .get(c.route.deployment)
        .map_or(Provider::Anthropic, |d| d.provider);
    let turn = p.kinds.server_tools;
    let reader = p.reader(&c.route, provider);
    let reserved = p.reserved_input_on(c.route.image_rule, c.model.max_input_tokens, reader);
    let input = Usage {
        input: turn.billed_input(reserved, p.output_cap()),
        web_search_calls: p.kinds.web_search_calls,
        ..Usage::default()
    };
    Departure {
        input: input.input,
        cost: long_context::priced_departed(
            input,
            (c.prices, p.kinds.input),
            c.route.long_context,
            reader,
        ),
    }
}

/// The routes that may serve a request, in the order they are tried, each with its price
/// at the request's start. A route without one there is left out, never served at zero
/// (none is: a catalog is built only when every route has a price from then on,
/// `Settings::check_priced`).
pub fn candidates(state: &AppState, p: &Prepared) -> Vec<Candidate> {
    let mut out = Vec::with_capacity(p.model.routes.len());
    let live = state.live.snapshot();
    let turn = live.pool.next_turn();
    let mut push_model = |m: &Arc<Model>| {
        let start = out.len();
        let n = m.routes.len().max(1);
        for r in &m.routes {
            // A route whose provider has no such endpoint (embeddings on Anthropic) is skipped.
            let provider = live.catalog.deployments[r.deployment].provider;
            if providers::path(p.endpoint, provider).is_none() {
                continue;
            }
            match r.schedule.rates_at(p.started_at) {
                Some(prices) => out.push(Candidate {
                    model: m.clone(),
                    route: r.at(p.started_at),
                    prices,
                }),
                None => {
                    tracing::error!(model = %m.name, upstream_model = %r.upstream_model, "a route has no price in force: left out")
                }
            }
        }
        // Least in flight first; among equals, a rotating start spreads load over the pool.
        let mut keyed: Vec<(u32, usize, Candidate)> = out
            .drain(start..)
            .enumerate()
            .map(|(i, c)| {
                (
                    live.pool.in_flight(c.route.deployment),
                    (i + n - turn % n) % n,
                    c,
                )
            })
            .collect();
        keyed.sort_by_key(|(load, order, _)| (*load, *order));
        out.extend(keyed.into_iter().map(|(_, _, c)| c));
    };
    push_model(&p.model);
    for f in &p.model.fallbacks {
        if let Some(m) = live.catalog.model(f) {
            push_model(m);
        }
    }
    out
}

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
    pub response: Option<reqwest::Response>,
    pub ttfb_ms: i64,
    pub in_flight: InFlight,
    pub slot: Option<OwnedSemaphorePermit>,
    /// This key's own token window, to correct to the usage when the answer is settled.
    pub key_booking: Option<Booking>,
    /// The client fields left out of the upstream's request (`x-sluice-dropped`); a boxed
    /// slice, as every served answer carries this struct by value.
    pub dropped: Box<[&'static str]>,
}

/// The body for candidate `c`'s upstream, and the client fields it leaves out.
fn build(dep: &Deployment, p: &Prepared, c: &Candidate) -> Result<Built, TranslateError> {
    let cap = p.cap.map(|(_, cap)| (c.route.cap_field(p.endpoint), cap));
    if p.responses.is_some() {
        providers::build_responses_request(
            dep.provider,
            &p.body,
            &c.route.upstream_model,
            cap,
            (p.stream, dep.include_usage),
        )
    } else {
        providers::build_request_with(
            p.endpoint.format(),
            providers::Destination::of(dep.provider, p.endpoint),
            &p.body,
            &c.route.upstream_model,
            cap,
            (p.stream, dep.include_usage),
        )
    }
}

/// What any candidate's upstream would leave out of the request: the announcement of a
/// stream whose headers leave before a route is taken (a queued stream), which any of
/// them may serve.
pub fn dropped_by_any(
    state: &AppState,
    p: &Prepared,
    candidates: &[Candidate],
) -> Vec<&'static str> {
    let mut out: Vec<&'static str> = Vec::new();
    let catalog = state.catalog();
    let built = candidates
        .iter()
        .filter_map(|c| build(&catalog.deployments[c.route.deployment], p, c).ok());
    for built in built {
        for field in built.dropped {
            if !out.contains(&field) {
                out.push(field);
            }
        }
    }
    out
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

/// What the attempts of one request have learned so far.
#[derive(Default)]
struct Run {
    attempts: u32,
    /// Candidates that answered "overloaded": the only ones worth a backoff and a retry.
    overloaded: Vec<usize>,
    only_rate_limited: bool,
    /// Every attempt was rate limited or overloaded: the keys are only resting.
    only_cooling: bool,
    /// The soonest a skipped or cooling candidate may serve again.
    soonest: Option<Duration>,
    busy: bool,
    untranslatable: Option<TranslateError>,
    cut_by_deadline: bool,
    /// The request's deadline ended the attempts (it may have passed before the first).
    out_of_time: bool,
    /// The connections (each client's, by origin) an attempt waited on for room and never
    /// went out (`Tier::Held`): every key there shares it, so none is tried again.
    held: Vec<(bool, url::Origin)>,
    /// Every attempt was held.
    only_held: bool,
    /// The dearest departure (`departure_on`) of the attempts that may have billed: sent
    /// and not answered with a refusal that bills nothing (`bills_nothing`).
    billable: Departure,
}

impl Run {
    fn new() -> Self {
        Run {
            only_rate_limited: true,
            only_cooling: true,
            only_held: true,
            ..Run::default()
        }
    }

    fn wait(&mut self, d: Duration) {
        self.soonest = Some(self.soonest.map_or(d, |s| s.min(d)));
    }

    /// Notes an attempt to `url` (of a deployment `allow_private` or not) that failed so.
    fn failed(&mut self, tier: Tier, (allow_private, url): (bool, &reqwest::Url)) {
        self.only_held &= tier == Tier::Held;
        if tier == Tier::Held {
            self.held.push((allow_private, url.origin()));
        }
        self.only_rate_limited &= tier == Tier::RateLimited;
        // A held attempt is a connection full for now: come back later, as for a key resting.
        self.only_cooling &= matches!(tier, Tier::RateLimited | Tier::Overloaded | Tier::Held);
    }

    /// Whether an attempt to `url` would wait on a connection an earlier one was held on.
    fn held_at(&self, (allow_private, url): (bool, &reqwest::Url)) -> bool {
        !self.held.is_empty() && self.held.contains(&(allow_private, url.origin()))
    }

    /// The client's answer when attempts were made and none served.
    fn tried(&self) -> ApiError {
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

#[allow(clippy::large_enum_variant)] // as `Outcome`
enum Step {
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
    (started, deadline): (Instant, Instant),
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
    state
        .pool()
        .observe_headers(d, resp.headers(), state.clock.now().timestamp_millis());
    let ttfb_ms = started.elapsed().as_millis() as i64;
    let success = |body, answer, response| Success {
        model: c.model.clone(),
        route: c.route.clone(),
        prices: c.prices,
        dep: dep.clone(),
        body,
        answer,
        response,
        ttfb_ms,
        in_flight,
        slot: None,
        key_booking: None,
        dropped: Box::default(),
    };
    if stream {
        return Ok(success(None, None, Some(resp)));
    }
    let body = state
        .upstream
        .read_body(resp, state.settings.upstream.max_response_bytes)
        .await?;
    let Ok(answer) = serde_json::from_slice::<serde_json::Value>(&body) else {
        return Err(UpstreamError::Garbage("answer is not JSON"));
    };
    Ok(success(Some(body), Some(answer), None))
}

/// Disables a key after a quota or auth failure: an alert, and an audit row.
fn disable_key(state: &AppState, d: usize, why: Disabled) {
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

/// Tries one candidate: its gates first, then the upstream call. Right before the call,
/// `sent` is told what a departure costs from then on: the dearer of this candidate's
/// (`here`) and every earlier attempt's that may have billed; after a refusal that bills
/// nothing, that earlier figure again.
async fn try_candidate(
    state: &AppState,
    p: &Prepared,
    (c, i): (&Candidate, usize),
    run: &mut Run,
    ctx: ((&str, &Trace), Instant, Instant),
    (here, sent): (Departure, &mut impl FnMut(Departure)),
) -> Step {
    let ((request_id, trace), deadline, started) = ctx;
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
        return Step::Next;
    }
    let pool = state.pool();
    // Every early return below drops the permit, which abandons it (frees a probe slot);
    // a client leaving once the call is sent frees it too, as a probe left unanswered.
    let mut permit = match pool.breakers[d].permit() {
        Ok(permit) => permit,
        Err(after) => {
            run.wait(after);
            return Step::Next;
        }
    };
    if run.attempts > 0 && !state.pool().budgets[d].try_retry() {
        tracing::warn!(upstream = %dep.id, "retry budget spent; not retrying on this key");
        return Step::Next;
    }
    let (rpm, tpm) = (dep.rpm_limit, dep.tpm_limit);
    // The key's window, booked at the worst case; dropped, the booking corrects it to what
    // it recorded: 0 unless this attempt is answered.
    let mut key_booking = None;
    if rpm > 0 || tpm > 0 {
        let spec = vec![WindowSpec::upstream(&dep.id, rpm, tpm)];
        let estimated = (p.input_tokens + p.cap.map_or(0, |(_, c)| c) * p.n).max(0) as u64;
        let (decision, booking) = state
            .windows
            .admit(spec, &format!("{request_id}:{}", run.attempts), estimated)
            .await;
        key_booking = booking;
        if decision.refused.is_some() {
            state.pool().cool_down(
                d,
                state.clock.now().timestamp_millis(),
                decision.retry_after,
            );
            run.wait(decision.retry_after);
            return Step::Next;
        }
    }
    let (body, dropped) = match build(&dep, p, c) {
        Ok(b) => (b.body, b.dropped),
        Err(e) => {
            run.untranslatable = Some(e);
            return Step::Next;
        }
    };
    let slot = match state.pool().gates[d].enter(deadline).await {
        Ok(s) => s,
        Err(_) => {
            run.busy = true;
            return Step::Next;
        }
    };
    // The gate may have waited up to the deadline: a key rotated, disabled or deleted
    // meanwhile must not go out. The attempt goes on with the deployment of the moment.
    let fresh;
    let (dep, url, body, dropped) = if still_in_use(state, &dep) {
        (&dep, url, body, dropped)
    } else {
        let catalog = state.catalog();
        if !catalog.usable(d) {
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
    if run.attempts == 0 {
        state.pool().budgets[d].first_attempt();
    }
    run.attempts += 1;
    // From here a request dropped mid-call leaves its permit unanswered, not abandoned.
    permit.sent();
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
        (started, deadline),
    )
    .await
    {
        Ok(mut s) => {
            // A success is a 2xx (`UpstreamClient::post`), and every provider's is a 200.
            span.outcome(Some(200), "served");
            trace.served_by(dep.provider, Some(url));
            permit.success();
            state.pool().succeeded(d);
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
    match tier {
        Tier::RateLimited | Tier::Overloaded => {
            if tier == Tier::RateLimited {
                metrics::upstream_429(&dep.id);
            }
            let streak = state.pool().rate_limited(d);
            let retry_after = if let UpstreamError::Status { retry_after, .. } = &err {
                *retry_after
            } else {
                None
            };
            let cool = retry::cooldown(
                retry_after,
                streak,
                Duration::from_secs(state.settings.retry.max_cooldown_seconds),
            );
            state
                .pool()
                .cool_down(d, state.clock.now().timestamp_millis(), cool);
            run.wait(cool);
            if tier == Tier::Overloaded {
                run.overloaded.push(i);
                breaker_failure(state, d, permit);
            } else {
                permit.abandon();
            }
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
        // The gateway's own connection to that host was full: no verdict on the key, no
        // rest (the next request may find room), no other key of that host (`Run::held`).
        Tier::Held => permit.abandon(),
        // A conflict is transient and says nothing of the upstream's health.
        Tier::Conflict => permit.abandon(),
        // Running out of the request's own time is the client's limit, no failure — but
        // probes that keep ending so re-open the breaker (`UNANSWERED_PROBES_REOPEN`).
        Tier::OutOfTime => {
            if permit.unanswered() {
                breaker_opened(state, d);
            }
        }
        // The gateway's own shortage: the request never left it. No verdict on the key, and
        // no other key (each would fail alike): the client retries in a moment. The alert
        // is the log line: nothing here is the upstream's.
        Tier::LocalResources => {
            permit.abandon();
            let why = format!(
                "{err}: answered 503 without any upstream call; raise the gateway's limit \
                 (open files: `LimitNOFILE`, `ulimit -n`) or shed load"
            );
            state.alerts.raise("local_resources", "gateway", &why);
            return Step::Stop(
                ApiError::ServiceDegraded {
                    retry_after: LOCAL_RETRY_AFTER_SECONDS,
                }
                .into(),
            );
        }
        Tier::ClientError => {
            // The upstream answered sensibly: for the breaker that is a success.
            permit.success();
            return Step::ClientError(passthrough(
                err,
                providers::format_of(dep.provider),
                p.endpoint.format(),
            ));
        }
    }
    Step::Next
}

/// Whether `dep`'s key is still the one its deployment sends (`Deployment::sealing` tells
/// an admin's action on a managed key).
fn still_in_use(state: &AppState, dep: &Deployment) -> bool {
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

fn breaker_failure(state: &AppState, d: usize, permit: Permit<'_>) {
    if permit.failure() {
        breaker_opened(state, d);
    }
}

fn breaker_opened(state: &AppState, d: usize) {
    state.alerts.raise(
        "breaker_open",
        &state.catalog().deployments[d].id,
        "circuit breaker opened after repeated failures",
    );
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
    mut sent: impl FnMut(Departure),
) -> Called {
    let cfg = &state.settings.retry;
    let started = Instant::now();
    let mut run = Run::new();
    let mut round = 0u32;
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
                break;
            }
            // Checked right before each attempt: an earlier attempt of this request may
            // just have put the same key (routed twice) to rest.
            if !ready(state, &candidates[i], &mut run) {
                // An overloaded key whose rest another request lengthened meanwhile is
                // waited for again in the next round (within the deadline), not given up.
                if round > 1 && !off(state, candidates[i].route.deployment) {
                    run.overloaded.push(i);
                }
                continue;
            }
            let ctx = ((request_id, trace), deadline, started);
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
    let error = final_error(state, p, &mut run);
    called(Outcome::Failed(error.into()), &run)
}

/// Whether an attempt that failed so billed nothing: the upstream refused the request
/// before working on it (a rate limit, an overload, a spent quota, a refused key, a
/// conflict, the client's own error), or it never left the gateway. A server error, a
/// timeout or a broken answer may come after the work, and the request's own deadline
/// cuts off an upstream that had it: those keep their input.
fn bills_nothing(tier: Tier) -> bool {
    match tier {
        Tier::RateLimited
        | Tier::Overloaded
        | Tier::QuotaExhausted
        | Tier::AuthFailed
        | Tier::Conflict
        | Tier::ClientError
        | Tier::LocalResources
        | Tier::Held => true,
        Tier::ServerError | Tier::OutOfTime => false,
    }
}

/// The dearer of two departures.
fn dearer(a: Departure, b: Departure) -> Departure {
    if (b.cost, b.input) > (a.cost, a.input) {
        b
    } else {
        a
    }
}

fn called(result: Outcome, run: &Run) -> Called {
    Called {
        result,
        attempts: run.attempts,
        cut_by_deadline: run.cut_by_deadline,
    }
}

/// Whether a candidate may be attempted now: not disabled, not cooling down (a cooling
/// one only tells when it may serve again).
fn ready(state: &AppState, c: &Candidate, run: &mut Run) -> bool {
    let d = c.route.deployment;
    let cooling = state
        .pool()
        .cooling_ms(d, state.clock.now().timestamp_millis());
    if cooling > 0 {
        run.wait(Duration::from_millis(cooling));
    }
    !off(state, d) && cooling == 0
}

/// Whether deployment `d` takes no new attempt: disabled on this replica (quota, refused
/// key, an admin's switch), or, in the catalog of the moment, disabled by an admin for
/// every replica or removed (its requests in flight finish; no new one starts).
fn off(state: &AppState, d: usize) -> bool {
    state.pool().is_disabled(d) || !state.catalog().usable(d)
}

/// How long to wait before another round, if one is worth it: only overloaded keys are
/// retried, within the attempt cap, once the first of them has rested its cooldown and
/// then after a jittered backoff — the jitter comes after the rest, or every request put
/// off by one cooldown would retry at the instant it ends — and only if that still ends
/// before the deadline.
fn next_round(
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
    let now_ms = state.clock.now().timestamp_millis();
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
fn final_error(state: &AppState, p: &Prepared, run: &mut Run) -> ApiError {
    match (run.attempts, run.untranslatable.take()) {
        (0, Some(e)) => ApiError::InvalidRequest {
            message: e.message,
            param: e.param,
        },
        (0, None) if run.busy => ApiError::UpstreamBusy { retry_after: 1 },
        // The request's own time ran out before any key was tried: a timeout of this
        // request (502, as a timeout is), not a sign that no key can serve — no alert a
        // client could raise with a short deadline.
        (0, None) if run.out_of_time => ApiError::UpstreamError,
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

/// An upstream client error (400/404/413/422) goes back to the client as it is, in the
/// client's format.
fn passthrough(err: UpstreamError, upstream: providers::Format, client: WireFormat) -> Failure {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn url(s: &str) -> reqwest::Url {
        reqwest::Url::parse(s).expect("url")
    }

    /// Review finding (s19-final, N1): an attempt held at its connection's stream cap never
    /// went out. It bills nothing, and no other key of that host (the same connection, by
    /// client and origin) is tried; every attempt held is the gateway busy, not the
    /// upstream failing.
    #[test]
    fn an_attempt_held_on_a_full_connection_spares_that_hosts_other_keys() {
        assert!(bills_nothing(Tier::Held));
        assert_eq!(
            retry::classify(&UpstreamError::Held),
            Tier::Held,
            "no breaker count: `ServerError` is the tier that counts"
        );
        let mut run = Run::new();
        let openai = url("https://api.openai.com/v1/chat/completions");
        run.failed(Tier::Held, (false, &openai));
        assert!(run.held_at((false, &url("https://api.openai.com:443/v1/responses"))));
        assert!(
            !run.held_at((true, &openai)),
            "another client, another pool"
        );
        assert!(!run.held_at((false, &url("https://api.anthropic.com/v1/messages"))));
        assert!(!run.held_at((false, &url("http://api.openai.com/v1/chat/completions"))));
        assert!(matches!(
            run.tried(),
            ApiError::UpstreamBusy { retry_after: 1 }
        ));

        // Held and rate limited elsewhere (review finding, s20, S6): every key only resting.
        let anthropic = url("https://api.anthropic.com/v1/messages");
        let mut limited = Run::new();
        limited.failed(Tier::Held, (false, &openai));
        limited.wait(Duration::from_millis(2500));
        limited.failed(Tier::RateLimited, (false, &anthropic));
        assert!(matches!(
            limited.tried(),
            ApiError::ServiceDegraded { retry_after: 3 }
        ));

        run.failed(Tier::ServerError, (false, &anthropic));
        assert!(matches!(run.tried(), ApiError::UpstreamError));
        assert!(!Run::new().held_at((false, &openai)));
    }
}
