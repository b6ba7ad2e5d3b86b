//! The request path of DESIGN.md, stage by stage: authenticate → validate → reserve budget
//! → route, call and retry by tier → settle and log. Each stage is one call here; this file
//! only orders them and turns their errors into `ApiError` once.

pub mod attempts;
pub mod cached;
pub mod drain;
pub mod event_cap;
pub mod kinds;
pub mod limits;
mod long_context;
pub mod queued;
pub(crate) mod recheck;
pub mod request;
pub mod respond;
pub mod responses;
pub mod stream;
pub mod tags;

#[cfg(test)]
mod client_sink_test;

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use actix_web::{web, HttpRequest, HttpResponse};

use crate::auth::TokenAuth;
use crate::body::BodyError;
use crate::clock::db_time;
use crate::config::{Ladder, Provider};
use crate::endpoint::Endpoint;
use crate::error::ApiError;
use crate::ops::metrics;
use crate::ops::traces::Trace;
use crate::queue::Admit;
use crate::quota::estimate;
use crate::quota::pricing;
use crate::quota::QuotaError;
use crate::ratelimit::{Booking, Decision, Refused, WindowSpec};
use crate::state::AppState;
use crate::store::requests::RequestRow;
use crate::upstream::providers::{self, canonical::Reported};
use crate::usage::Usage;
use attempts::{Outcome, Success};
use drain::Drain;
use long_context::Reader;
use request::Prepared;

/// Request ids are UUIDv7: unique across replicas and sortable by time.
pub fn new_request_id() -> String {
    let mut buf = [0u8; uuid::fmt::Simple::LENGTH];
    format!(
        "req_{}",
        uuid::Uuid::now_v7().simple().encode_lower(&mut buf)
    )
}

/// Runs one `/v1/*` request to completion (or hands a stream to its pump).
pub async fn handle(
    state: web::Data<AppState>,
    req: HttpRequest,
    payload: web::Payload,
    endpoint: Endpoint,
) -> HttpResponse {
    let started = Instant::now();
    // The request's instant: its log row's and the one its prices are read at.
    let started_at = state.clock.now();
    // Owns the log row while the stages run: if actix-web drops this future (the client
    // closed its connection while a stage waited — in the queue, on the upstream), the
    // guard writes the row of a departure.
    let mut open = Open {
        state: state.clone(),
        started,
        log: RequestRow {
            id: new_request_id(),
            endpoint: endpoint.name(),
            created_at: db_time(started_at),
            cache: "off",
            trace: Trace::start(req.headers(), endpoint.gen_ai_operation()),
            ..RequestRow::default()
        },
        extras: Extras::default(),
        armed: true,
    };
    // At the shutdown's deadline a request still waiting (queued, on an upstream) is
    // ended here: `run` is dropped (its reservation settles as a departure's would) and the
    // client gets a 503 (see `drain`). One whose answer is in by then is not: it is charged
    // the answer, so it gets it (`finish` bounds what it still waits for by the drain).
    let drain = req.app_data::<Drain>().cloned().unwrap_or_default();
    let answered = AtomicBool::new(false);
    let result = tokio::select! {
        biased;
        r = run(
            &state,
            &req,
            payload,
            endpoint,
            (&mut open.log, &mut open.extras),
            (started, started_at),
            (&drain, &answered),
        ) => r,
        () = unanswered_at(&drain, &answered) => Err(ApiError::ShuttingDown.into()),
    };
    let (mut log, extras) = open.close();
    let mut resp = match result {
        Ok(Reply::Done(resp)) => {
            log.status = resp.status().as_u16();
            log.latency_ms = started.elapsed().as_millis() as i64;
            state.request_log.record(log).await;
            resp
        }
        Ok(Reply::Streaming(resp)) => resp,
        Err(Failure { error, response }) => {
            let mut resp = response.unwrap_or_else(|| error.render(endpoint.format()));
            respond::request_id(&mut resp, &log.id);
            log.status = resp.status().as_u16();
            log.error_code = Some(error.code());
            log.latency_ms = started.elapsed().as_millis() as i64;
            state.request_log.record(log).await;
            resp
        }
    };
    if let Some(d) = &extras.rate {
        respond::ratelimit_headers(&mut resp, d);
    }
    if let Some(w) = extras.queue_wait {
        respond::queue_wait(&mut resp, w);
    }
    resp
}

/// A request whose stages are running. Dropped before `close` — actix-web dropped the
/// handler because the client left — it records the request as a departure (499
/// `client_disconnected`) with what the row says it cost by then: the `Held` reservation
/// settles itself at that same amount (`Held::set_cost_if_dropped`).
struct Open {
    state: web::Data<AppState>,
    started: Instant,
    log: RequestRow,
    extras: Extras,
    armed: bool,
}

impl Open {
    fn close(mut self) -> (RequestRow, Extras) {
        self.armed = false;
        (
            std::mem::take(&mut self.log),
            std::mem::take(&mut self.extras),
        )
    }
}

impl Drop for Open {
    fn drop(&mut self) {
        // A stream handed to its pump took the row with it (its id is then empty).
        if !self.armed || self.log.id.is_empty() {
            return;
        }
        let mut log = std::mem::take(&mut self.log);
        log.status = ApiError::ClientGone.status().as_u16();
        log.error_code = Some(ApiError::ClientGone.code());
        log.latency_ms = self.started.elapsed().as_millis() as i64;
        let state = self.state.clone();
        // On the gateway's runtime: this may be the drop of a worker's runtime.
        let runtime = state.runtime.clone();
        runtime.spawn(async move { state.request_log.record(log).await });
    }
}

/// Resolves at the drain's start unless the request's answer is in by then (`answered`,
/// set by `finish`): then never.
async fn unanswered_at(drain: &Drain, answered: &AtomicBool) {
    drain.started().await;
    if answered.load(Ordering::Acquire) {
        std::future::pending::<()>().await;
    }
}

/// What the stages learned that every answer reports in its headers.
#[derive(Default)]
struct Extras {
    rate: Option<Decision>,
    queue_wait: Option<std::time::Duration>,
}

/// How a request that reached an upstream was answered.
enum Reply {
    /// Complete; `handle` writes the log row.
    Done(HttpResponse),
    /// A stream; its pump writes the log row when the stream ends.
    Streaming(HttpResponse),
}

/// A failed request: the error (for the log) and, for upstream client errors passed
/// through, the upstream's own answer.
pub struct Failure {
    pub error: ApiError,
    pub response: Option<HttpResponse>,
}

impl From<ApiError> for Failure {
    fn from(error: ApiError) -> Self {
        Failure {
            error,
            response: None,
        }
    }
}

impl From<QuotaError> for ApiError {
    fn from(e: QuotaError) -> Self {
        match e {
            QuotaError::Insufficient { retry_after, .. } => {
                ApiError::InsufficientQuota { retry_after }
            }
            QuotaError::TokenGone => ApiError::InvalidApiKey,
            // Rotated again under a request already moved to its successor once (`run`).
            QuotaError::Rotated(_) => ApiError::InvalidApiKey,
            // Nothing was reserved: the request is refused (fail closed), as a 503 the
            // client may retry when the database is only out of reach for now.
            QuotaError::Store(e) if e.is_unavailable() => {
                tracing::warn!(error = %e, "the budget ledger cannot be reached; request refused");
                ApiError::LedgerUnavailable { retry_after: 1 }
            }
            QuotaError::Store(e) => {
                tracing::error!(error = %e, "quota store failed");
                ApiError::Internal
            }
        }
    }
}

/// Reads a request body up to `server.max_body_bytes`, the whole of it within
/// `server.body_timeout_seconds` (`body::read_decoded`), as sent: a compressed body is
/// refused naming its coding. Inflated, 2 KB of gzip became 2 MB of JSON parsed and counted
/// before any window sees the request — every `/v1` body a thousand times cheaper to send
/// (s33 late attack F2; ignored before, a gzip body was "not valid JSON", s33 diff attack
/// F3). Every failure (too large, cut, too slow, compressed) becomes an `ApiError` the
/// route renders in its format. The body comes before any window or queue counts the
/// request.
pub(crate) async fn read_body(
    payload: web::Payload,
    req: &HttpRequest,
    server: &crate::config::ServerSettings,
) -> Result<web::Bytes, ApiError> {
    let limit = server.max_body_bytes;
    let within = std::time::Duration::from_secs(server.body_timeout_seconds);
    if let Some(coding) = crate::body::declared(req.headers()).filter(|c| c != "identity") {
        return Err(ApiError::InvalidRequest {
            message: format!(
                "content-encoding `{coding}` is not read here: send the body uncompressed"
            ),
            param: None,
        });
    }
    crate::body::read_decoded(
        payload,
        req.headers(),
        crate::body::Coding::Identity,
        limit,
        within,
    )
    .await
    .map_err(|e| match e {
        BodyError::TooLarge(limit) => ApiError::RequestTooLarge(limit),
        BodyError::Unreadable => ApiError::InvalidRequest {
            message: "The request body could not be read.".into(),
            param: None,
        },
        BodyError::TooSlow(within) => ApiError::InvalidRequest {
            message: BodyError::too_slow_message(within),
            param: None,
        },
    })
}

/// Who the request's row is logged for: the owner `auth` acts as, and the token presented.
fn log_owner(log: &mut RequestRow, auth: &TokenAuth) {
    log.token_id = Some(auth.owner.token_id);
    log.presented_token_id = auth.presented;
    log.user_id = Some(auth.owner.user_id);
    log.team_id = Some(auth.owner.team_id);
}

async fn run(
    state: &web::Data<AppState>,
    req: &HttpRequest,
    payload: web::Payload,
    endpoint: Endpoint,
    (log, extras): (&mut RequestRow, &mut Extras),
    (started, started_at): (Instant, chrono::DateTime<chrono::Utc>),
    (drain, answered): (&Drain, &AtomicBool),
) -> Result<Reply, Failure> {
    let ladder = state.settings.ladder;
    // 1. Authenticate.
    let span = log.trace.stage("auth");
    let auth = recheck::authenticate(state, req.headers()).await?;
    drop(span);
    let authenticated = Instant::now();
    log_owner(log, &auth);

    // 2. Validate.
    let mut raw = read_body(payload, req, &state.settings.server).await?;
    // Everything from here on acts for the credential as it is once the body is in.
    let (mut auth, mut checked) =
        recheck::after_body(state, req.headers(), (auth, authenticated)).await?;
    log_owner(log, &auth);
    let mut conversation = None;
    if endpoint == Endpoint::Responses {
        let (expanded, ctx) = responses::expand(state, &auth, raw).await?;
        (raw, conversation) = (expanded, Some(ctx));
    }
    let mut prepared = request::prepare(endpoint, &raw, &auth, &state.catalog(), started_at)?;
    prepared.kinds = kinds::read(endpoint, &mut prepared.body, &state.settings.finance)?;
    prepared.documents = crate::quota::documents::Documents::read(
        &prepared.body,
        state.settings.finance.document_tokens_per_page,
    );
    prepared.responses = conversation;
    log.trace.max_tokens(prepared.cap.map(|(_, cap)| cap));
    let asked = limits::client_headers(req.headers(), auth.max_priority)?;
    let cache_asked = crate::cache::Asked::read(req.headers())?;
    let (all_tags, fixed_tags) = tags::resolve(req.headers(), &auth.tags, &auth.team_tags)?;
    (log.tags, log.fixed_tags) = (all_tags.canonical(), fixed_tags.canonical());
    prepared.anthropic_beta = providers::anthropic::beta_header(req.headers());
    prepared.claude_1m =
        (prepared.anthropic_beta.as_ref()).is_some_and(providers::anthropic::asks_1m_window);
    if ladder.has(Ladder::All) {
        soft_limit(state, &auth, &mut prepared);
    }

    // 3. Rate-limit the token and its user. Dropped, the booking corrects their token
    // windows to what it recorded: 0 on every early return below.
    let span = log.trace.stage("window");
    let mut booking = if ladder.has(Ladder::Window) {
        rate_limit(state, &auth, &prepared, (&log.id, false), &mut extras.rate).await?
    } else {
        None
    };
    drop(span);
    log.model = prepared.requested_model.clone();
    log.stream = prepared.stream;

    // 4. Cache: a hit is answered at once and costs nothing.
    let deadline = respond::deadline(asked.deadline_ms, &state.settings.retry, started);
    let mut span = log.trace.stage("cache");
    let mut plan = cache_plan(state, &cache_asked, &prepared, &auth)?;
    if let Some(plan) = &plan {
        log.cache = "miss";
        if !plan.refresh {
            let now = state.cache_now();
            // An exact repeat held in memory is answered before its question is read: the
            // second pass over the request is for the lookups past the memory.
            let hit = match state.cache.held(plan, now) {
                Some(hit) => Some(hit),
                None => {
                    state.cache.read_question(plan, &prepared.body);
                    state.cache.get(plan, now, deadline).await
                }
            };
            let found = hit.and_then(|hit| cached::body(&prepared, &hit).map(|body| (hit, body)));
            if let Some((hit, body)) = found {
                // The lookup may have waited on the `http` embedder (up to 5 s): after such
                // a wait the credential is checked again, as after every other, so a token
                // revoked meanwhile gets no answer (s27 cache attack F7). Counted from the
                // last check, not the lookup's start: a slow body, window call and lookup,
                // each under the bound, add up past it (s28 diff attack F4).
                if checked.elapsed() >= recheck::RECHECK_AFTER {
                    recheck::still_admitted(state, req.headers(), deadline).await?;
                }
                span.set("sluice.cache", "hit");
                drop(span);
                state.cache.record_hit(&hit.entry.key);
                let resp = cached::answer(state, &prepared, &hit, body, log, &auth, deadline).await;
                return Ok(Reply::Done(resp));
            }
        }
    }

    // A miss stores its answer under its question's context: read now if the lookup did
    // not (a refresh, which never looks up; a hit held in memory that a stream cannot
    // replay).
    if let Some(plan) = &plan {
        state.cache.read_question(plan, &prepared.body);
    }
    span.set("sluice.cache", log.cache);
    drop(span);

    // 5. Reserve the worst case over every model that may serve (fallbacks included).
    let candidates = attempts::candidates(state, &prepared);
    if candidates.is_empty() {
        let message = format!(
            "The model `{}` cannot serve {}.",
            prepared.requested_model,
            endpoint.name()
        );
        return Err(ApiError::InvalidRequest {
            message,
            param: Some("model".into()),
        }
        .into());
    }
    // A router's billed pass-through fields: refused unless every candidate allows them.
    let live = state.live.snapshot();
    for c in &candidates {
        if let Some(d) = live.catalog.deployments.get(c.route.deployment) {
            kinds::billed_router_fields(endpoint, &prepared.body, d.provider, d.billed_fields)?;
        }
    }
    drop(live);
    let worst = reservation_amount(state, &prepared, &candidates);
    let span = log.trace.stage("reserve");
    let mut held = if ladder.has(Ladder::Quota) {
        match state.quota.reserve(&log.id, &auth.owner, worst).await {
            // The token was rotated after the last check (during the window call or the
            // semantic lookup's embedding, say) and nothing was reserved: its text works as
            // the successor now, whose budget the rotation handed the old one's — reserving
            // on the old row's copy let the pair spend it twice (s26 final attack #2). Once:
            // authenticated again, the request moves to the successor — its windows, its
            // cache scope, its log row — and reserves there.
            Err(QuotaError::Rotated(_)) => {
                auth = recheck::after_rotation(state, req.headers(), auth.owner.token_id).await?;
                checked = Instant::now();
                log_owner(log, &auth);
                if let Some(old) = booking.take() {
                    old.correct_now().await;
                }
                if ladder.has(Ladder::Window) {
                    let moved = (log.id.as_str(), true);
                    booking = rate_limit(state, &auth, &prepared, moved, &mut extras.rate).await?;
                }
                if plan.is_some() {
                    plan = cache_plan(state, &cache_asked, &prepared, &auth)?;
                    // A new plan, its question unread: read as at stage 4's end, or its
                    // answer was stored for exact matches only (s40 attack F1).
                    if let Some(plan) = &plan {
                        state.cache.read_question(plan, &prepared.body);
                    }
                }
                state
                    .quota
                    .reserve(&log.id, &auth.owner, worst)
                    .await
                    .map_err(ApiError::from)?
            }
            reserved => reserved.map_err(ApiError::from)?,
        }
    } else {
        state.quota.unreserved()
    };
    drop(span);
    account(state, &auth, held.token_remaining(), 0);

    // 6. Queue by priority. A request that leaves unserved releases its reservation.
    let priority = asked.priority;
    let queued = Instant::now();
    let span = log.trace.stage("queue");
    let admitted = match state.queue.enter(priority, auth.owner.token_id) {
        Ok(Admit::Now(slot)) => Ok(slot),
        Ok(Admit::Wait(ticket)) if prepared.stream => {
            let books = stream::Books {
                held,
                log: std::mem::take(log),
                started,
                auth,
                booking,
                cache: plan,
            };
            let waiting = queued::Waiting {
                prepared,
                ticket,
                credential: recheck::credential(req.headers()),
                books,
                candidates,
                deadline,
                queue_span: span,
            };
            return Ok(Reply::Streaming(queued::start(
                state,
                waiting,
                drain.clone(),
            )));
        }
        Ok(Admit::Wait(ticket)) => match ticket.granted(deadline).await {
            Ok(slot) => {
                let admitted = recheck::still_admitted(state, req.headers(), deadline).await;
                checked = Instant::now();
                admitted.map(|()| slot)
            }
            Err(refused) => Err(refused.into()),
        },
        Err(refused) => Err(refused.into()),
    };
    extras.queue_wait = Some(queued.elapsed());
    drop(span);
    let slot = match admitted {
        Ok(slot) => slot,
        Err(e) => {
            held.settle(0).await;
            return Err(e.into());
        }
    };
    // 7–9. Route, call, retry by tier. From each attempt on the upstream may be working: a
    // client that leaves pays the input reserved for it on the dearest candidate sent it
    // (`attempts::departure_on`), and its row says so (`Open`; every outcome below
    // rewrites it).
    let mut departure = attempts::Departure::default();
    let outcome = attempts::call(
        state,
        &prepared,
        &candidates,
        deadline,
        (&log.id, &log.trace),
        (req.headers(), checked),
        |sent| {
            held.set_cost_if_dropped(sent.cost);
            (log.input_tokens, log.cost_micros) = (sent.input, sent.cost);
            // A departure pays the input reserved for it: the gateway's count.
            log.usage_estimated = sent.input > 0;
            departure = sent;
            // Its windows: the input once a call reached an upstream that may bill it,
            // until the answer says what was used.
            if let Some(b) = booking.as_mut() {
                b.used(if sent.input > 0 {
                    prepared.input_tokens
                } else {
                    0
                });
            }
        },
    )
    .await;
    log.attempts = outcome.attempts;
    let success = match outcome.result {
        Outcome::Served(s) => s,
        // Nothing served costs nothing — unless the client's own deadline cut an attempt
        // off after the upstream had it: then, as when it disconnects, its input.
        Outcome::Failed(failure) if outcome.cut_by_deadline => {
            let settled = held.settle(departure.cost).await;
            log.input_tokens = departure.input;
            log.cost_micros = settled.charged + settled.absorbed;
            log.usage_estimated = departure.input > 0;
            return Err(failure);
        }
        Outcome::Failed(failure) => {
            if let Some(b) = booking.as_mut() {
                b.used(0);
            }
            (log.input_tokens, log.cost_micros) = (0, 0);
            log.usage_estimated = false;
            held.settle(0).await;
            return Err(failure);
        }
    };
    log.upstream = success.dep.id.clone();
    log.served_model = success.model.name.clone();
    log.upstream_model = success.route.upstream_model.clone();
    if prepared.stream {
        let books = stream::Books {
            held,
            log: std::mem::take(log),
            started,
            auth,
            booking,
            cache: plan,
        };
        Ok(Reply::Streaming(stream::start(
            state,
            &prepared,
            success,
            books,
            slot,
            drain.clone(),
        )))
    } else {
        let at_drain = (drain, answered);
        finish(
            state,
            &prepared,
            success,
            held,
            log,
            &auth,
            booking,
            (plan, at_drain),
        )
        .await
        .map(Reply::Done)
    }
}

/// After a reservation or settlement: the token's balance for the soft limit and the
/// metrics, the budget alert when it first crosses its threshold, absorbed cost.
pub(crate) fn account(
    state: &AppState,
    auth: &TokenAuth,
    token_remaining: Option<i64>,
    absorbed: i64,
) {
    if auth.note_remaining(token_remaining) {
        let message = format!(
            "token passed its alert threshold: {}% of its budget used",
            auth.percent_used()
        );
        state.alerts.raise(
            "budget_threshold",
            &format!("token:{}", auth.owner.token_id),
            &message,
        );
    }
    if let (Some(r), Some(limit)) = (token_remaining, auth.limit_micros) {
        let used = if limit > 0 {
            (limit - r) as f64 / limit as f64
        } else {
            1.0
        };
        metrics::remaining(auth.owner.token_id, r, Some(used));
    }
    metrics::absorbed(absorbed);
}

/// Stage 4's plan: whether and under which keys the answer is looked up in the cache and
/// stored, for the token `auth` acts as (its scope, its TTL).
fn cache_plan(
    state: &AppState,
    asked: &crate::cache::Asked<'_>,
    prepared: &Prepared,
    auth: &TokenAuth,
) -> Result<Option<crate::cache::Plan>, ApiError> {
    let endpoint = prepared.endpoint;
    if !matches!(endpoint, Endpoint::Chat | Endpoint::Messages)
        || !state.settings.ladder.has(Ladder::Cache)
    {
        return Ok(None);
    }
    state.cache.plan(
        asked,
        &prepared.body,
        endpoint.format(),
        &prepared.model.name,
        (auth.owner.token_id, auth.owner.team_id),
        auth.cache_ttl_seconds,
        prepared.model.cache_similarity_threshold,
        prepared.model.cache_ignore_identifiers,
    )
}

/// Stage 3: checks (and books) the token's and the user's windows; `None` when neither has
/// a limit (no round trip at all) or neither counts tokens (nothing to correct). The
/// booking corrects their token windows when dropped (see `ratelimit::Booking`).
/// Checks and books the request's windows. `moved`: the request moves to a rotated token's
/// successor (stage 5) and was counted in its user's request window already — the old
/// booking's correction gives back its tokens, not its request — so the user's requests
/// are not checked or counted again (s27 diff attack F2: a user at its limit with it got a
/// 429 for a request already admitted).
async fn rate_limit(
    state: &AppState,
    auth: &TokenAuth,
    p: &Prepared,
    (request_id, moved): (&str, bool),
    rate: &mut Option<Decision>,
) -> Result<Option<Booking>, ApiError> {
    let n = |v: Option<i64>| v.unwrap_or(0).max(0) as u64;
    let limited = |a: Option<i64>, b: Option<i64>| n(a) > 0 || n(b) > 0;
    // Most tokens have no window: no key strings, no allocation, no round trip.
    if !limited(auth.rpm, auth.tpm) && !limited(auth.user_rpm, auth.user_tpm) {
        return Ok(None);
    }
    let mut specs = Vec::with_capacity(2);
    // The token's window always comes first: the headers report it.
    let user = auth.owner.user_id;
    specs.push(WindowSpec::token(
        user,
        auth.owner.token_id,
        n(auth.rpm),
        n(auth.tpm),
    ));
    if auth.user_rpm.is_some() || auth.user_tpm.is_some() {
        let requests = if moved { 0 } else { n(auth.user_rpm) };
        specs.push(WindowSpec::user(user, requests, n(auth.user_tpm)));
    }
    let estimated = window_input(state, p).saturating_add(p.output_cap());
    let (d, booking) = state
        .windows
        .admit(specs, request_id, estimated.max(0) as u64)
        .await;
    *rate = Some(d);
    if let Some(why) = d.refused {
        let retry_after = (d.retry_after.as_millis() as u64).div_ceil(1000).max(1);
        return Err(ApiError::RateLimited {
            retry_after,
            tokens: why == Refused::Tokens,
        });
    }
    Ok(booking)
}

/// The input a request's token and user windows are booked at: what the provider reading
/// the most of it may read, over every route of its model and of the fallbacks the token
/// may use that serves the endpoint — its documents at their pages, its images as that
/// provider bills them, on Gemini its digits once more (`Prepared::estimated_input_on`, the input an answer without
/// usage is charged). Not the counted input alone: a PDF's bytes are left to its pages and
/// an image is counted at a flat figure, so twenty 50-page PDFs at once were booked ~150
/// tokens each and all passed a 10 000-token window (s29 limits attack F1). Not the
/// reservation's bound either (`Prepared::reserved_input_on`, with a document the model's
/// whole input): one question about a file would fill a token's window for a minute.
/// The routes are read from the catalog, not `attempts::candidates`, which turns the pool's
/// rotation for each call.
fn window_input(state: &AppState, p: &Prepared) -> i64 {
    let live = state.live.snapshot();
    let models = std::iter::once(&p.model).chain(p.fallbacks(&live.catalog));
    let mut most = p.input_tokens;
    for m in models {
        for r in &m.routes {
            let Some(d) = live.catalog.deployments.get(r.deployment) else {
                continue;
            };
            if providers::path(p.endpoint, d.provider).is_none() {
                continue;
            }
            let reader = p.reader(r, d.provider);
            most = most.max(p.estimated_input_on(r.image_rule, m.max_input_tokens, reader));
        }
    }
    most
}

/// The soft limit: past its alert threshold, a token with a `downgrade_model` is served by
/// that model instead (its output cap clamped to that model's).
fn soft_limit(state: &AppState, auth: &TokenAuth, p: &mut Prepared) {
    if !auth.past_threshold() {
        return;
    }
    let catalog = state.catalog();
    let Some(to) = auth
        .downgrade_model
        .as_deref()
        .and_then(|m| catalog.model(m))
    else {
        return;
    };
    p.cap = p.cap.map(|(field, c)| (field, c.min(to.max_output_tokens)));
    p.model = to.clone();
}

/// The `error_code` of a served request's row whose usage the upstream did not report in
/// whole (no usage, or a side of it absent): the side not reported was charged the
/// gateway's own count (the input at its estimate, its documents too,
/// `Prepared::estimated_input_on`; the output counted from the answer's text), not a
/// provider's figure. The row's `usage_estimated` column says the same of every row
/// charged such a count, this code or another (a departure's `client_disconnected`): the
/// code is written only on a row that has no other.
pub(crate) const USAGE_ESTIMATED: &str = "usage_estimated";

/// The worst-case cost: the margin-padded input at the dearest input price the request may
/// be billed (cache writes and audio only when it asks for them, `kinds`), the full output
/// cap (× n) at the dearest output price, and the web-search fee for every call it may
/// make — priced at the dearest route that may serve, each at its price in force when the
/// request started. A server-tool turn is billed every step's context as input
/// (`kinds::Turn`): the margin-padded input once per step, plus the results and output
/// the later steps re-read. A route with a long-context tier is reserved at the tier's
/// rates when the provider's tokenizer may count that input past its threshold
/// (`long_context::provider_may_count`): the only long-context rule — no request is
/// refused for the tier (a document reserves the model's whole input, which on a tiered
/// model passes it).
fn reservation_amount(state: &AppState, p: &Prepared, candidates: &[attempts::Candidate]) -> i64 {
    let live = state.live.snapshot();
    // Deployments keep their position across rebuilds; one not found (it cannot be) is
    // taken as Anthropic's: Claude's readers count the most.
    let provider_of = |c: &attempts::Candidate| {
        live.catalog
            .deployments
            .get(c.route.deployment)
            .map_or(Provider::Anthropic, |d| d.provider)
    };
    // Server tools run only where the request reaches its upstream in its own format: a
    // translated route refuses them (a 400, nothing billed), so it is no worst case.
    // Priced, an OpenAI fallback reserved a Claude turn's searches and their pages at its
    // own rates, eight times what the turn can cost on Claude (s33 diff attack F2).
    let tools = p.kinds.server_tools.calls > 0 || p.kinds.web_search_calls > 0;
    let can_run = |c: &&attempts::Candidate| {
        !tools || providers::format_of(provider_of(c)) == p.endpoint.format().into()
    };
    let worst_at = |c: &attempts::Candidate| {
        let provider = provider_of(c);
        let reader = p.reader(&c.route, provider).reserving();
        let first = first_step(state, p, c, reader);
        let usage = Usage {
            input: p.kinds.server_tools.billed_input(first, p.output_cap()),
            output: p.output_cap(),
            web_search_calls: p.kinds.web_search_calls,
            ..Usage::default()
        };
        let prices = c.prices;
        let dearest = pricing::Prices {
            input: prices.dearest_input(p.kinds.input),
            output: prices.dearest_output(p.kinds.audio_output),
            web_search_per_1k_calls: prices.web_search_per_1k_calls,
            ..pricing::Prices::default()
        };
        let tier_at = long_context::provider_may_count(reader, usage.input);
        pricing::cost(usage, dearest.for_input(tier_at, c.route.long_context))
    };
    candidates
        .iter()
        .filter(can_run)
        .map(worst_at)
        .max()
        .unwrap_or(0)
}

/// The input a request's first (or only) step reserves for on a candidate read by
/// `reader`: counted (its images by the route's rule, its documents for the candidate's
/// model, on Gemini its digits once more: `Prepared::reserved_input_on`), with the
/// configured margin. Server-tool results and output re-read by later steps are the
/// provider's own tokens: no margin.
fn first_step(state: &AppState, p: &Prepared, c: &attempts::Candidate, reader: Reader) -> i64 {
    let q = &state.settings.quota;
    pricing::input_with_margin(
        p.reserved_input_on(c.route.image_rule, c.model.max_input_tokens, reader),
        q.input_margin_ratio,
        q.input_margin_tokens,
    )
}

/// A whole answer's usage: each side as the upstream reported it (a zero is its word), a
/// side it did not report counted by the gateway — the input at its `estimate`
/// (`Prepared::estimated_input_on`; of a server-tool turn every step's input and every
/// search allowed, `kinds::Turn`), the output from the answer's `text`.
fn answer_usage(
    p: &Prepared,
    estimate: i64,
    reported: Reported,
    text: impl FnOnce() -> String,
) -> Usage {
    let mut usage = Usage {
        web_search_calls: p.kinds.web_search_calls,
        ..Usage::default()
    };
    if reported.input.is_none() {
        usage.input = (p.kinds.server_tools).billed_input(estimate, p.output_cap());
    }
    if reported.output.is_none() {
        usage.output = estimate::count_text(&text());
    }
    reported.apply(&mut usage);
    usage
}

/// A translated answer's `usage` in the `client`'s format with the sides the upstream did
/// not report (`reported`) written as the gateway charged them (`usage`, `answer_usage`),
/// and its total to match; the sides reported are left as translated.
fn show_counted(
    client: providers::Format,
    answer: &mut serde_json::Value,
    reported: Reported,
    usage: Usage,
) {
    let (input, output, total) = match client {
        providers::Format::OpenAiChat => ("prompt_tokens", "completion_tokens", true),
        providers::Format::Responses => ("input_tokens", "output_tokens", true),
        providers::Format::Anthropic => ("input_tokens", "output_tokens", false),
        providers::Format::Gemini | providers::Format::Bedrock => return,
    };
    let Some(u) = answer
        .get_mut("usage")
        .and_then(serde_json::Value::as_object_mut)
    else {
        return;
    };
    if reported.input.is_none() {
        u.insert(input.into(), usage.input.into());
    }
    if reported.output.is_none() {
        u.insert(output.into(), usage.output.into());
    }
    if total {
        let n = |k: &str| u.get(k).and_then(serde_json::Value::as_i64).unwrap_or(0);
        let sum = n(input).saturating_add(n(output));
        u.insert("total_tokens".into(), sum.into());
    }
}

/// A non-streamed answer: price it from its usage, settle, answer with the upstream's bytes.
#[allow(clippy::too_many_arguments)]
async fn finish(
    state: &AppState,
    p: &Prepared,
    s: Success,
    mut held: crate::quota::reservation::Held,
    log: &mut RequestRow,
    auth: &TokenAuth,
    mut booking: Option<Booking>,
    (plan, (drain, answered)): (Option<crate::cache::Plan>, (&Drain, &AtomicBool)),
) -> Result<HttpResponse, Failure> {
    let plan = plan.filter(|_| s.as_planned(p));
    let reader = p.reader(&s.route, s.dep.provider);
    let estimate = p.estimated_input_on(s.route.image_rule, s.model.max_input_tokens, reader);
    let mut key_booking = s.key_booking;
    let raw = s.body.unwrap_or_default();
    let answer = s.answer.unwrap_or_default();
    let upstream = providers::format_of(s.dep.provider);
    kinds::served_tier(s.dep.provider, &s.dep.id, providers::tier::served(&answer));
    let (reported, read_as, body, to_keep) = match &p.responses {
        Some(ctx) => {
            let (usage, read_as, body, response) =
                responses::answer(p, ctx, s.dep.provider, (&answer, s.read.as_deref()));
            (usage, read_as, body, Some((ctx, response)))
        }
        None => (
            providers::answer_usage(upstream, &answer),
            upstream,
            providers::convert_answer(
                upstream,
                p.endpoint.format(),
                raw,
                (&answer, s.read.as_deref()),
            ),
            None,
        ),
    };
    // An embedding has no output: its usage reports the input alone, and that is whole.
    let mut reported = reported;
    if p.endpoint == Endpoint::Embeddings {
        reported.output.get_or_insert_with(Default::default);
    }
    log.usage_estimated = reported.input.is_none() || reported.output.is_none();
    if log.usage_estimated {
        log.error_code = Some(USAGE_ESTIMATED);
    }
    let usage = answer_usage(p, estimate, reported, || {
        providers::answer_text(read_as, &answer)
    })
    .at_worst_lifetime(p.kinds.input);
    // A translated answer shows a side its upstream left out as charged, not as the 0 the
    // translation wrote; an answer passed through keeps the upstream's own figures.
    let client = match p.endpoint {
        Endpoint::Responses => providers::Format::Responses,
        endpoint => endpoint.format().into(),
    };
    let partial = reported.input.is_none() || reported.output.is_none();
    let (body, to_keep) = match to_keep {
        _ if !partial || read_as == client => (body, to_keep),
        Some((ctx, mut response)) => {
            show_counted(client, &mut response, reported, usage);
            (
                bytes::Bytes::from(response.to_string()),
                Some((ctx, response)),
            )
        }
        None => match serde_json::from_slice::<serde_json::Value>(&body) {
            Ok(mut v) => {
                show_counted(client, &mut v, reported, usage);
                (bytes::Bytes::from(v.to_string()), None)
            }
            Err(_) => (body, None),
        },
    };
    if let Some(plan) = plan {
        // Stored in the client's format, off the request path. A translated answer is
        // stored only if its upstream ended it whole: the client format's reason is written
        // from the upstream's, and calls a paused or cut answer complete (late attack L5).
        // Judged on `relayable`'s read of it (`Success::read`).
        let whole = || match s.read.as_deref() {
            Some(read) => read.ended_whole(),
            None => providers::read_answer(upstream, &answer).is_ok_and(|a| a.ended_whole()),
        };
        let stored = if upstream == p.endpoint.format().into() {
            Some(answer)
        } else if whole() {
            serde_json::from_slice(&body).ok()
        } else {
            None
        };
        if let Some(stored) = stored {
            let now = state.cache_now();
            state
                .cache
                .store(plan, stored, (usage.input, usage.output), now);
        }
    }
    // An input the upstream left out is the gateway's count: its tier is decided as the
    // reservation's, with what the provider's tokenizer may count.
    let cost = match reported.input {
        Some(_) => long_context::priced(usage, s.prices, s.route.long_context),
        None => long_context::priced_counted(usage, s.prices, s.route.long_context, reader),
    };
    // The request's windows and the serving key's, corrected off the path when dropped.
    let used = usage.input + usage.output;
    for b in [booking.as_mut(), key_booking.as_mut()]
        .into_iter()
        .flatten()
    {
        b.used(used);
    }
    // The answer is in: from here the settlement lands at its cost even if the client
    // leaves (or the shutdown ends the request) while it waits on the store, so the row a
    // departure writes (`Open`) must say that cost, not the input alone.
    log.input_tokens = usage.input;
    log.output_tokens = usage.output;
    log.kinds = usage.parts();
    log.cost_micros = held.cost_of(cost);
    // Charged the answer from here, the client gets it: the shutdown's drain no longer
    // ends the request with a 503 (its SDK would retry, paying twice); it bounds what the
    // answer still waits on the store for instead (below).
    answered.store(true, Ordering::Release);
    held.set_cost_if_dropped(cost);
    // A stored response is written before the answer, so its id works at once; a client
    // that leaves while it is written is charged the answer, not the input alone. At the
    // shutdown the write is waited on until `responses::STORED_BY` after the drain.
    if let Some((ctx, response)) = to_keep {
        responses::keep(state, ctx, &response, drain).await;
    }
    // At the shutdown a store slower than `STORED_BY` after the drain is not waited for:
    // the settlement goes on in the background, the answer goes out without the balances —
    // before the worker is stopped under it, which would cut the connection. (A store
    // still held when the process leaves, 5 s after the workers, has the settlement land
    // as an orphan at the reserved amount: `Application::run_until_stopped`.)
    let span = log.trace.stage("settle");
    let decided = held.decided(cost);
    let settled = tokio::select! {
        biased;
        settled = held.settle(cost) => settled,
        () = drain.after(responses::STORED_BY) => {
            tracing::warn!(request_id = %log.id, "the shutdown came before the settlement landed: it goes on in the background");
            decided
        }
    };
    drop(span);
    account(state, auth, settled.token_remaining, settled.absorbed);
    log.cost_micros = settled.charged + settled.absorbed;
    log.ttfb_ms = Some(s.ttfb_ms);
    let mut resp = HttpResponse::Ok();
    resp.content_type("application/json");
    respond::gateway_headers(
        &mut resp,
        &log.id,
        &log.upstream,
        settled.remaining,
        log.cache,
        auth,
        &s.dropped,
    );
    Ok(resp.body(body))
}
