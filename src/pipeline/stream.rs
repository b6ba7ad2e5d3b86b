//! Streams. The upstream's SSE events are read by a pump task, converted to the client's
//! format event by event (`providers::translate::stream`; unchanged when the formats
//! match), and forwarded through a small bounded channel (backpressure: a slow client slows
//! the pump, it does not grow memory). The pump ends when the upstream finishes, stalls
//! past the idle timeout, breaks, or the client goes away — the channel closes, or the
//! client takes no frame for the same idle timeout (a peer that stopped reading, half-closed
//! its socket or vanished without a reset looks the same, and actix-http would never drop
//! the body of such a connection) — then it drops the upstream response, which closes that
//! connection and cancels generation, and settles the reservation: the upstream's usage
//! when it arrived, else the counted input plus the output counted with the tokenizer from
//! the deltas received (the exact rule: `translate::stream`'s module doc). After the
//! upstream's finish, its body's end, break or stall completes the stream (Gemini has no
//! end event; the usage may follow the finish). A client that leaves after the finish left
//! a whole answer: the pump reads on without it for the usage, at most `AFTER_THE_FINISH`,
//! and settles the whole answer (its usage, else the estimate), never a departure — unless
//! the upstream fails meanwhile (its body's end or break without the usage asked for, its
//! stall, an unreadable or error event): a fault is settled and logged as it would be with
//! the client there; only the gateway's own `AFTER_THE_FINISH` settles on the estimate. The
//! shutdown that reaches a stream whose answer is whole reads on the same way, at most
//! `AFTER_THE_FINISH` from the drain's start, and a client still there gets a whole
//! stream's closing events: the upstream's if they come, else the gateway's with what it is
//! charged (`StreamConverter::close`). A client merely behind on such an answer (its
//! channel full) is waited for within the same deadline (`ClientSink::send_whole`), never
//! past it, then cut; before the finish the shutdown cuts the stream, and a frame waiting
//! for room waits no more. A stream that breaks before its finish ends with an error event
//! and no `[DONE]` / `message_stop`; a stream given up on a stalled client ends its body
//! with an error, so the connection is cut rather than closed as if complete. Once the
//! upstream's body is dropped, and before the client's ends, the serving key gets its
//! verdict, which its 200 did not give (`attempts::stream_ended`): an answer whole (its
//! finish came, whatever followed) its success; a stall, a break, an unreadable event, the
//! hold limit or the upstream's error event naming its own fault before the finish its
//! failure; a client gone, the shutdown or an error event naming no fault of the
//! upstream's none. A half-open probe's slot is held meanwhile, its progress marked
//! (`Pump::progress`).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix_web::{web, HttpResponse};
use bytes::Bytes;
use eventsource_stream::{EventStreamError, Eventsource};
use futures_util::StreamExt;
use tokio::sync::mpsc;

use super::attempts::{stream_ended, StreamEnd, Success};
use super::drain::Drain;
use super::event_cap::{BodyError, EventCap};
use super::kinds::Turn;
use super::long_context::{self, Reader};
use super::request::Prepared;
use super::respond;
use super::USAGE_ESTIMATED;
use crate::auth::TokenAuth;
use crate::cache::replay::Assembler;
use crate::cache::Plan;
use crate::config::Provider;
use crate::queue::Slot;
use crate::quota::pricing::{InputKinds, LongTier, Prices};
use crate::quota::reservation::Held;
use crate::ratelimit::Booking;
use crate::state::AppState;
use crate::store::requests::RequestRow;
use crate::upstream::breaker::Permit;
use crate::upstream::catalog::Deployment;
use crate::upstream::providers::bedrock::eventstream::BROKE;
use crate::upstream::providers::formats::responses;
use crate::upstream::providers::translate::stream::{Progress, ResponsesOut};
use crate::upstream::providers::{self, translate::stream::StreamConverter};
use crate::upstream::retry::{self, Tier};
use crate::usage::Usage;

/// The error event of a stream the shutdown ended.
const SHUTTING_DOWN: &str =
    "The gateway is shutting down; the stream was ended. Retry the request.";

/// How long a stream whose client left after the upstream's finish is read on for the usage
/// that follows it (at most the idle timeout): the usage comes within milliseconds of the
/// finish; past this the whole answer is settled without it, on the input estimate — the
/// gateway chose to stop reading, the upstream did nothing wrong. An upstream fault before
/// it is charged as with the client there (`Pump::run`). At the shutdown it runs from the
/// drain's start and bounds both the read-on and a send waiting for a client behind
/// (`ClientSink::send_whole`): it must end before the workers stop (`startup::SETTLE_MARGIN`).
pub const AFTER_THE_FINISH: Duration = Duration::from_secs(2);

/// Chunks buffered between the pump and a slow client.
const CHANNEL_DEPTH: usize = 16;

/// Everything a request settles and records when it ends.
pub struct Books {
    pub held: Held,
    pub log: RequestRow,
    pub started: Instant,
    pub auth: Arc<TokenAuth>,
    pub booking: Option<Booking>,
    /// Where to store the answer, if the request is cacheable.
    pub cache: Option<Plan>,
}

/// How an upstream frames its stream events: SSE (OpenAI, Anthropic), or AWS's binary
/// event stream (Bedrock, `providers::bedrock::eventstream`). Either way the converter
/// gets (event type, payload) pairs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Framing {
    Sse,
    AwsEventStream,
}

impl Framing {
    fn of(p: Provider) -> Framing {
        match p {
            Provider::Bedrock => Framing::AwsEventStream,
            _ => Framing::Sse,
        }
    }
}

/// The upstream's events as (type, payload) pairs; an item `Err(message)` ends the stream
/// with that message in the client's error event.
type Events = std::pin::Pin<
    Box<dyn futures_util::Stream<Item = Result<(String, String), &'static str>> + Send>,
>;

/// The upstream's events, and for SSE the count of body chunks heard (`EventCap::heard`).
fn events(
    framing: Framing,
    upstream: reqwest::Response,
    most: usize,
) -> (Events, Option<Arc<AtomicU64>>) {
    match framing {
        Framing::AwsEventStream => (
            Box::pin(providers::bedrock::eventstream::events(
                upstream.bytes_stream(),
                most,
            )),
            None,
        ),
        Framing::Sse => {
            let cap = EventCap::new(upstream.bytes_stream(), most);
            let heard = cap.heard();
            (Box::pin(cap.eventsource().map(
            |e| match e {
                Ok(ev) => Ok((ev.event, ev.data)),
                Err(EventStreamError::Transport(BodyError::TooLarge(_))) => Err(
                    "The upstream sent an event larger than the gateway accepts; the stream was ended by the gateway.",
                ),
                Err(EventStreamError::Transport(BodyError::NotUtf8)) => Err(
                    "The upstream sent an event that is not UTF-8 text; the stream was ended by the gateway.",
                ),
                Err(_) => Err(BROKE),
            })), Some(heard))
        }
    }
}

struct Pump {
    framing: Framing,
    state: web::Data<AppState>,
    books: Books,
    prices: Prices,
    /// The serving route's long-context tier: it prices an answer reported past it.
    long_context: Option<LongTier>,
    /// The cache writes the request marked: unsplit writes are priced at the worst
    /// lifetime it allows (`Usage::at_worst_lifetime`).
    may: InputKinds,
    converter: StreamConverter,
    /// Who reads the input on the serving upstream: its kind, whose answers name a tier to
    /// check (`kinds::served_tier`), and how far its tokenizer may count past the
    /// gateway's (`long_context::provider_may_count`).
    reader: Reader,
    /// The input reserved for the request on the serving route
    /// (`Prepared::reserved_input_on`): what a stream that ends before its answer is whole
    /// without the input reported is charged — the upstream had the whole request.
    reserved_input: i64,
    /// The request's counted input (`Prepared::input_tokens`): what a departure books in
    /// its windows, as a non-streamed one does — the money is the reserved input, the
    /// windows keep what was counted.
    counted_input: i64,
    /// Rebuilds the answer the client received, for the cache.
    assembler: Option<Assembler>,
    /// The serving key's own token window.
    key_booking: Option<Booking>,
    /// A Responses request's conversation: its response is stored when complete.
    conversation: Option<super::responses::Ctx>,
    /// A server-tool turn (its calls, the searches it may make, its output cap): without
    /// its usage it is charged as far as it may have run (`left_turn`, `cut_turn`).
    turn: (Turn, i64, i64),
    /// The serving key (its position and deployment, and when the attempt went out) and its
    /// breaker permit, reported once when the stream ends (`judge`).
    key: (usize, Arc<Deployment>, i64),
    permit: Option<Permit>,
}

/// How many stall limits of wait a client may owe a stream: the waits for room, less what
/// its reading earned back (`FLOOR_BYTES_PER_SEC`). A slow link taking a long, fast answer
/// waits far less than it earns (15 MB at 1 Mbit/s: two minutes of waiting, 15 000 s
/// earned).
const WAIT_BUDGET_STALLS: u32 = 5;

/// The floor rate of a client's reading: every byte handed on repays 1 ms of the wait it
/// owes, down to nothing owed (earnings never pile up above the budget it started with). A
/// reader that averages above it is never given up for its waits; a trickle below it is,
/// once it owes `WAIT_BUDGET_STALLS` stall limits — after 5 / (1 − its rate / the floor)
/// stall limits of waiting (s26 final attack #4: a budget that never refilled cut a steady
/// 150 kbit/s reader of a 10 MB answer).
const FLOOR_BYTES_PER_SEC: u64 = 1_000;

/// The wait, in µs, one byte handed on repays (`FLOOR_BYTES_PER_SEC`).
const US_PER_BYTE: u64 = 1_000_000 / FLOOR_BYTES_PER_SEC;

/// Where a stream's frames go: the bounded channel the response body drains.
pub(super) struct ClientSink {
    tx: mpsc::Sender<Bytes>,
    /// How long the client may take no frame before it counts as gone.
    stall: Duration,
    /// The wait, in µs, the client owes the stream: its waits for room, each repaid by the
    /// bytes handed on since (`US_PER_BYTE`) down to 0. A client that reads just often
    /// enough that no frame waits `stall` would otherwise hold the request's admission and
    /// gate slots, and its reservation, for as long as it liked (s26 attack streams F3).
    /// Touched only when the channel is full.
    owed_us: AtomicU64,
    /// The bytes handed on to the channel: the one count a frame that finds room costs.
    handed: AtomicU64,
    /// `handed` when the debt was last repaid.
    repaid_at: AtomicU64,
    /// Set when the stream was given up on a stalled client: the body then ends with an
    /// error, so the client's connection is cut, never closed as if the stream were complete.
    cut: Arc<AtomicBool>,
    /// The shutdown's end of running requests: a frame waiting for the client waits no more.
    pub(super) drain: Drain,
}

impl ClientSink {
    /// Hands a frame on; false when the client is gone or has taken nothing for the stall
    /// limit (then the stream is given up), or when the shutdown ends the stream: a frame
    /// waiting for room waits no more once the drain started.
    pub(super) async fn send(&self, frame: Bytes) -> bool {
        self.send_by(frame, false).await
    }

    /// `send` of a frame of an answer already whole (after the upstream's finish): at the
    /// shutdown it waits for room until `AFTER_THE_FINISH` after the drain started — the
    /// same deadline the pump reads on to — so a client merely behind gets the stream's end
    /// rather than a cut connection, which its SDK would retry, paying twice.
    pub(super) async fn send_whole(&self, frame: Bytes) -> bool {
        self.send_by(frame, true).await
    }

    async fn send_by(&self, frame: Bytes, whole: bool) -> bool {
        // While the client keeps up there is room: no timer per frame, one count of its
        // bytes (lossless: usize has at most 64 bits on every target Rust supports).
        let len = frame.len() as u64;
        let frame = match self.tx.try_send(frame) {
            Ok(()) => {
                self.handed.fetch_add(len, Ordering::Relaxed);
                return true;
            }
            Err(mpsc::error::TrySendError::Closed(_)) => return false,
            Err(mpsc::error::TrySendError::Full(frame)) => frame,
        };
        // `Some(handed on)`, or `None`: the client took nothing for the stall limit, or owes
        // the stream `WAIT_BUDGET_STALLS` stall limits of wait, or the shutdown ends the
        // stream.
        // A frame of an answer already whole has twice the budget: the pump has read the
        // upstream's finish, what is left is its last frames, and a cut would take an answer
        // its client pays for, which its SDK would then ask for again (s26 diff attack #3);
        // yet not without end, or an answer whose finish leaves many frames behind (a
        // Responses answer's closing events) would hold its slots as a trickle did (s26 stop
        // attack #4).
        let owed = self.repaid();
        let budget = self.stall * WAIT_BUDGET_STALLS * if whole { 2 } else { 1 };
        let bound = self.stall.min(budget.saturating_sub(owed));
        let started = Instant::now();
        let sent = tokio::select! {
            biased;
            sent = tokio::time::timeout(bound, self.tx.send(frame)) => sent.ok().map(|r| r.is_ok()),
            _ = self.waited_out(whole) => None,
        };
        let micros = u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX);
        self.owed_us.fetch_add(micros, Ordering::Relaxed);
        if sent == Some(true) {
            self.handed.fetch_add(len, Ordering::Relaxed);
        }
        sent.unwrap_or_else(|| {
            self.cut.store(true, Ordering::Release);
            false
        })
    }

    /// The wait the client owes, once the bytes handed on since the last time repaid it.
    /// Repaid only here, when a frame must wait: between two waits nothing adds to the
    /// debt, so capping the repayment at 0 now is capping it at every frame.
    fn repaid(&self) -> Duration {
        let handed = self.handed.load(Ordering::Relaxed);
        let earned = handed.saturating_sub(self.repaid_at.swap(handed, Ordering::Relaxed));
        let owed = self
            .owed_us
            .load(Ordering::Relaxed)
            .saturating_sub(earned.saturating_mul(US_PER_BYTE));
        self.owed_us.store(owed, Ordering::Relaxed);
        Duration::from_micros(owed)
    }

    /// Resolves when the shutdown waits no more for the client to make room: at the drain's
    /// start, or for a frame of a whole answer `AFTER_THE_FINISH` after it.
    async fn waited_out(&self, whole: bool) {
        if whole {
            self.drain.after(AFTER_THE_FINISH).await;
        } else {
            self.drain.started().await;
        }
    }

    /// Hands a last frame on only if there is room at once (the shutdown's error event: a
    /// client that does not take it gets a cut connection instead).
    pub(super) fn send_now(&self, frame: Bytes) {
        if self.tx.try_send(frame).is_err() {
            self.cut.store(true, Ordering::Release);
        }
    }

    /// Resolves when the response body is dropped (actix-http saw the client go).
    pub(super) async fn closed(&self) {
        self.tx.closed().await
    }
}

/// The channel a stream's frames go through, and the response body that drains it. `stall`
/// is how long the client may take no frame before it counts as gone.
pub(super) fn sse_channel(
    stall: Duration,
    drain: Drain,
) -> (
    ClientSink,
    impl futures_util::Stream<Item = Result<Bytes, std::io::Error>> + 'static,
) {
    let (tx, mut rx) = mpsc::channel::<Bytes>(CHANNEL_DEPTH);
    let cut = Arc::new(AtomicBool::new(false));
    let sink = ClientSink {
        tx,
        stall,
        owed_us: AtomicU64::new(0),
        handed: AtomicU64::new(0),
        repaid_at: AtomicU64::new(0),
        cut: cut.clone(),
        drain,
    };
    let body = async_stream::stream! {
        while let Some(chunk) = rx.recv().await {
            yield Ok(chunk);
        }
        if cut.load(Ordering::Acquire) {
            yield Err(std::io::Error::other("the client took no data for the stall limit"));
        }
    };
    (sink, body)
}

/// The stall limit of a stream, in either direction: `upstream.stream_idle_timeout_ms`.
pub(super) fn stall_limit(state: &AppState) -> Duration {
    Duration::from_millis(state.settings.upstream.stream_idle_timeout_ms)
}

/// How long a half-open probe that is a stream may make no progress before its breaker
/// reads it as hung (`Permit::streaming`): each wait of the pump — for an upstream event,
/// for room at the client — ends within one stall limit, and the pump marks progress after
/// each (`Pump::progress`), so twice that without any is a pump stuck, not a slow stream.
pub(super) fn probe_bound(state: &AppState) -> Duration {
    stall_limit(state).saturating_mul(2)
}

pub(super) fn sse_response(
    log: &RequestRow,
    remaining: Option<i64>,
    auth: &TokenAuth,
    dropped: &[&'static str],
) -> actix_web::HttpResponseBuilder {
    let mut resp = HttpResponse::Ok();
    resp.content_type("text/event-stream")
        .insert_header(("cache-control", "no-cache"));
    respond::gateway_headers(
        &mut resp,
        &log.id,
        &log.upstream,
        remaining,
        log.cache,
        auth,
        dropped,
    );
    resp
}

pub fn start(
    state: &web::Data<AppState>,
    p: &Prepared,
    s: Success,
    books: Books,
    admission: Slot,
    drain: Drain,
) -> HttpResponse {
    let (sink, body) = sse_channel(stall_limit(state), drain);
    let mut resp = sse_response(&books.log, books.held.remaining(), &books.auth, &s.dropped);
    tokio::spawn(serve(state.clone(), p, s, books, sink, admission));
    resp.streaming(body)
}

/// Runs the pump for an upstream that answered, holding the in-flight count, the gate slot
/// and the admission slot until the stream ends.
pub(super) fn serve(
    state: web::Data<AppState>,
    p: &Prepared,
    s: Success,
    mut books: Books,
    sink: ClientSink,
    admission: Slot,
) -> impl std::future::Future<Output = ()> + Send + 'static {
    // Only the asked model's own answer is stored (`Success::as_planned`).
    if !s.as_planned(p) {
        books.cache = None;
    }
    let deployment = &s.dep;
    let upstream_format = providers::format_of(deployment.provider);
    let client = p.endpoint.format();
    // One bound for every buffer of a stream: no event, held-back block or cached answer
    // may be larger than a whole non-streamed answer may be.
    let most = state.settings.upstream.max_response_bytes;
    let reader = p.reader(&s.route, deployment.provider);
    let mut converter = StreamConverter::new(
        upstream_format,
        client,
        p.include_usage,
        p.estimated_input_on(s.route.image_rule, s.model.max_input_tokens, reader),
    )
    .hold_limit(most)
    // A translated request asks for one choice (`n` is refused there).
    .choices(if upstream_format == providers::Format::from(client) {
        p.choices()
    } else {
        1
    });
    // A server the gateway does not ask for its usage (`quirks.include_usage = false`).
    if upstream_format == providers::Format::OpenAiChat && !deployment.include_usage {
        converter = converter.usage_not_asked();
    }
    if let Some(ctx) = &p.responses {
        converter = converter.responses(if responses::native(deployment.provider) {
            ResponsesOut::Native(responses::stream::Native::new(ctx.stamp.clone()))
        } else {
            ResponsesOut::Translated(Box::new(responses::adapter::EventWriter::new(
                p.body.clone(),
                ctx.stamp.clone(),
            )))
        });
    }
    let pump = Pump {
        framing: Framing::of(deployment.provider),
        state,
        prices: s.prices,
        long_context: s.route.long_context,
        may: p.kinds.input,
        converter,
        reader,
        reserved_input: p.reserved_input_on(s.route.image_rule, s.model.max_input_tokens, reader),
        counted_input: p.input_tokens,
        conversation: p.responses.clone(),
        assembler: books.cache.as_ref().map(|_| Assembler::new(client, most)),
        books,
        key_booking: s.key_booking,
        turn: (
            p.kinds.server_tools,
            p.kinds.web_search_calls,
            p.output_cap(),
        ),
        key: (s.route.deployment, s.dep.clone(), s.sent_ms),
        permit: s.permit,
    };
    // Guarded from here: a task dropped before its first poll settles by the rule too.
    let mut pump = Unsettled(Some(pump));
    async move {
        let _held = (s.in_flight, s.slot, admission);
        if let (Some(upstream), Some(running)) = (s.response, pump.0.as_mut()) {
            let (failed, ending, may_have_run_on) = running.run(upstream, sink).await;
            if let Some(done) = pump.0.take() {
                // Boxed: the settlement's future (the store's writes, 9 KB in a debug
                // build) would otherwise sit in every open stream's task for its whole life.
                Box::pin(done.settle(failed, ending, may_have_run_on)).await;
            }
        }
    }
}

/// A pump until it settles. Dropped before — its worker stopped under it: a client that
/// left at the finish holds no connection, so at the shutdown its idle worker stops while
/// the pump reads on for the usage (or a panic) — it settles by the rule of where it was,
/// on the gateway's own runtime (`AppState::runtime`, which outlives the workers): a whole
/// answer on its usage if it came, else on the estimate; one cut short as a cut stream.
/// Without it the task went with its runtime: no row, and the reservation released
/// uncharged — the answer given away.
struct Unsettled(Option<Pump>);

impl Drop for Unsettled {
    fn drop(&mut self) {
        let Some(mut pump) = self.0.take() else {
            return;
        };
        let whole = pump.converter.finished();
        pump.judge(if whole {
            StreamEnd::Whole
        } else {
            StreamEnd::Unjudged
        });
        let runtime = pump.state.runtime.clone();
        runtime.spawn(pump.settle(!whole, (!whole).then_some("shutting_down"), true));
    }
}

impl Pump {
    /// Reads the stream to its end: whether it failed, the row's code and whether the
    /// upstream may have run on (`settle`'s arguments).
    async fn run(
        &mut self,
        upstream: reqwest::Response,
        sink: ClientSink,
    ) -> (bool, Option<&'static str>, bool) {
        let idle = stall_limit(&self.state);
        let most = self.state.settings.upstream.max_response_bytes;
        let (mut events, heard) = events(self.framing, upstream, most);
        // The client left before the answer was whole: a departure.
        let mut client_gone = false;
        // The client left after the finish (its answer whole), at this instant: the pump
        // reads on, for the client no more, until the usage or the upstream's end, at most
        // `AFTER_THE_FINISH` (`left_after_the_finish`).
        let mut left: Option<Instant> = None;
        // The shutdown ended the stream before its answer was whole (see `pipeline::drain`).
        let mut drained = false;
        // The shutdown reached the stream whole (after its finish), at this instant: the
        // pump reads on for the usage, at most `AFTER_THE_FINISH`, as for a client that
        // left at the finish, and the client, if still there, gets the closing events.
        let mut drain_at: Option<Instant> = None;
        let mut failure: Option<&'static str> = None;
        // The upstream itself broke the stream off (its body's end or break before the
        // finish, its error event): it ran no further than what was seen. Any other end
        // without usage (the gateway leaving, or a finish without it) may have run more.
        let mut upstream_ended = false;
        let mut frames = Vec::with_capacity(4);
        // One wait on the shutdown for the whole stream, not one per event.
        let drain = sink.drain.clone();
        let shutdown = drain.started();
        tokio::pin!(shutdown);
        // After the finish: since when the upstream told no more of the answer (see below).
        let mut quiet: Option<(Instant, Progress)> = None;
        'read: loop {
            // After its finish an upstream that sends on but tells no more of the answer —
            // pings, a usage again, new or not — is idle: its events do not hold the stream open past
            // the idle timeout, which then completes it.
            let stall = match &quiet {
                Some((since, _)) => idle.saturating_sub(since.elapsed()),
                None => idle,
            };
            // The gateway's own limit on reading on after the answer was whole, for a client
            // that left at the finish or for the shutdown. Reached before the upstream
            // stalled, it is the gateway's choice to stop, not the upstream's fault: the
            // whole answer is settled on its usage if it came, else on the estimate, and a
            // client still there gets its closing events. Everything else — the upstream's
            // stall, end, break, unreadable or error event — is settled as with the client
            // there and no shutdown.
            let capped = [left, drain_at]
                .into_iter()
                .flatten()
                .map(|at| AFTER_THE_FINISH.saturating_sub(at.elapsed()))
                .min()
                .filter(|cap| *cap <= stall);
            let wait = capped.unwrap_or(stall);
            let heard_before = heard.as_ref().map(|h| h.load(Ordering::Relaxed));
            if wait.is_zero() {
                if capped.is_some() {
                    self.converter.close(&mut frames);
                } else {
                    failure = self.end(
                        &mut frames,
                        "The upstream stopped sending; the stream was ended by the gateway.",
                    );
                }
                break;
            }
            // Once the client left after the finish its closed channel is not waited on: it
            // would be ready at every turn, and the pump would spin.
            let next = tokio::select! {
                biased;
                _ = sink.closed(), if left.is_none() => {
                    if self.left_after_the_finish(&mut left) {
                        // At the shutdown a client gone holds no worker for the read-on:
                        // settled at once, as the `shutdown` arm settles one gone before it.
                        if sink.drain.is_draining() {
                            break;
                        }
                        continue;
                    }
                    client_gone = true;
                    break;
                }
                // Polled once: a finished future is not polled again.
                at = &mut shutdown, if drain_at.is_none() => {
                    // A client still there holds its connection, and so its worker, open
                    // while the pump reads on; one that left at the finish holds neither,
                    // and its worker may stop before the read: its whole answer is settled
                    // now, on its usage if it came, else on the estimate.
                    if self.converter.finished() && left.is_some() {
                        break;
                    }
                    // From the drain's start, not from now: a send that waited for room
                    // since (`ClientSink::send_whole`) used up as much of the read-on.
                    if self.converter.finished() {
                        drain_at = Some(at);
                        continue;
                    }
                    drained = true;
                    break;
                }
                n = tokio::time::timeout(wait, events.next()) => n,
            };
            // The upstream's body ended, broke off or stalled: after its finish that is
            // the stream's end (`StreamConverter::end`), before it a cut.
            let event = match next {
                Ok(Some(Ok(ev))) => {
                    self.progress();
                    ev
                }
                // The gateway's limit after the answer was whole (above).
                Err(_) if capped.is_some() => {
                    self.converter.close(&mut frames);
                    break;
                }
                // Before the finish, a wait that heard bytes but no event (comment lines: an
                // upstream saying it is still working, as OpenRouter's `: OPENROUTER
                // PROCESSING`) is waited again: a live upstream is not cut as stalled and
                // counted against its key (s30 streams attack F4). Pings do as much; after
                // the finish neither holds the stream open (`quiet`).
                Err(_)
                    if quiet.is_none()
                        && heard.as_ref().map(|h| h.load(Ordering::Relaxed)) != heard_before =>
                {
                    self.progress();
                    continue;
                }
                Err(_) => {
                    failure = self.end(
                        &mut frames,
                        "The upstream stopped sending; the stream was ended by the gateway.",
                    );
                    break;
                }
                Ok(None) => {
                    upstream_ended = true;
                    failure = self.end(
                        &mut frames,
                        "The upstream ended the stream before it was complete.",
                    );
                    break;
                }
                // A break is its body's end; an event it cannot read (too large, not UTF-8,
                // a frame failing its checks) a cut, also after the finish: it may be the
                // usage.
                Ok(Some(Err(message))) => {
                    failure = if message == BROKE {
                        upstream_ended = true;
                        self.end(&mut frames, message)
                    } else {
                        Some(message)
                    };
                    break;
                }
            };
            self.converter.event(&event.0, &event.1, &mut frames);
            // So too for an answer whole at its end (`StreamConverter::whole_at_end`): a
            // choice that starts there tells more of it, and is held to the idle timeout
            // between events like any choice before its finish.
            if self.converter.finished() || self.converter.whole_at_end() {
                let told = self.converter.progress();
                if quiet.as_ref().is_none_or(|(_, before)| *before != told) {
                    quiet = Some((Instant::now(), told));
                }
            } else {
                quiet = None;
            }
            if left.is_some() {
                // Read for its usage only: nothing more goes to the client.
                self.keep_conversation(&sink.drain).await;
                frames.clear();
            } else if !self.pass(&mut frames, &sink).await {
                // A client that did not take a frame at the shutdown is cut: at once before
                // the finish, after it once `AFTER_THE_FINISH` from the drain went by
                // (`ClientSink::send_whole`). After the finish it left a whole answer, as a
                // client that left there: read on for, or at the shutdown settled at once
                // (the `shutdown` arm above: its 2 s are over, or the client is gone).
                if !self.left_after_the_finish(&mut left) {
                    drained = sink.drain.is_draining();
                    client_gone = !drained;
                    break 'read;
                }
                // Likewise (the `closed` arm above).
                if sink.drain.is_draining() {
                    break;
                }
                frames.clear();
            }
            // An error event ended the client's stream: stop reading. The upstream's own
            // broke the stream off; the gateway's (an event it could not read, the hold
            // limit) left an upstream that may have run on (s26 streams attack F5: charged
            // as if the upstream had cut it, a server-tool turn paid the lower rule).
            if self.converter.upstream_failed() {
                upstream_ended = !self.converter.ended_by_the_gateway();
                failure = Some("The upstream sent an error event mid-stream.");
                break;
            }
            // The answer is complete: whatever the upstream sends or breaks after it is
            // not the client's.
            if self.converter.done() {
                break;
            }
        }
        // The closing events of a stream its body's end completed, or of a whole answer the
        // gateway stopped reading (`StreamConverter::close`). A client that does not take
        // them (gone, or still full `AFTER_THE_FINISH` after the drain) left after the
        // finish: a whole answer still.
        if !frames.is_empty()
            && !client_gone
            && !drained
            && left.is_none()
            && !self.pass(&mut frames, &sink).await
            && !self.left_after_the_finish(&mut left)
        {
            drained = sink.drain.is_draining();
            client_gone = !drained;
        }
        // The shutdown ended it before its answer was whole (also one blocked on its
        // client): the error event if the client has room for it, at once, else a cut
        // connection; charged as a cut stream.
        let shutting_down = drained;
        if shutting_down {
            if let Some(frame) = self.converter.end_frame(SHUTTING_DOWN, "shutting_down") {
                sink.send_now(frame);
            }
            failure = Some(SHUTTING_DOWN);
        } else if let (Some(frame), false) = (
            failure.and_then(|m| self.converter.error_frame(m)),
            client_gone || left.is_some(),
        ) {
            sink.send(frame).await;
        }
        drop(events);
        // The key's verdict, once the upstream's body is dropped (nothing the verdict does
        // waits on it) and before the client's body ends: its next request finds the key
        // judged.
        let end = if self.converter.finished() {
            // The answer is whole: what follows its finish (no usage, no `[DONE]`, a stall,
            // a break) is no failure of the key's (s26 stop attack #5).
            StreamEnd::Whole
        } else if shutting_down || client_gone {
            StreamEnd::Unjudged
        } else if failure.is_some() {
            self.failed_as()
        } else {
            StreamEnd::Whole
        };
        self.judge(end);
        drop(sink);
        let ending = match (shutting_down, failure, client_gone) {
            (true, ..) => Some("shutting_down"),
            (_, Some(_), _) => Some("upstream_error"),
            (_, None, true) => Some("client_disconnected"),
            _ => None,
        };
        let all_seen = failure.is_some() && upstream_ended;
        (failure.is_some(), ending, !all_seen)
    }

    /// How the upstream failed the stream before its finish, for its key: its own error
    /// event by the fault it names, none if it names no fault of the upstream's own (the
    /// client's, its account's, a type not known: s26 stop attack #2); a stall, a break, an
    /// event the gateway could not read or the hold limit a server error, as garbage before
    /// the 200 is — but none for a well-formed event of a kind the gateway does not model
    /// (`StreamConverter::unsupported`, s28 diff attack F1).
    fn failed_as(&self) -> StreamEnd {
        if self.converter.upstream_failed() && !self.converter.ended_by_the_gateway() {
            return self.converter.fault().map_or(StreamEnd::Unjudged, |f| {
                StreamEnd::Failed(retry::of_fault(f))
            });
        }
        if self.converter.unsupported() {
            return StreamEnd::Unjudged;
        }
        StreamEnd::Failed(Tier::ServerError)
    }

    /// A half-open probe that is a stream made progress: its slot is no hung probe's
    /// (`Permit::progress`, bounded by `probe_bound`).
    fn progress(&self) {
        if let Some(permit) = &self.permit {
            permit.progress();
        }
    }

    /// Reports the stream's end to its key's breaker and pool, once
    /// (`attempts::stream_ended`).
    fn judge(&mut self, end: StreamEnd) {
        if let Some(permit) = self.permit.take() {
            stream_ended(
                &self.state,
                (self.key.0, &self.key.1, self.key.2),
                permit,
                end,
            );
        }
    }

    /// The client is gone: after the upstream's finish its answer was whole, so the pump
    /// reads on for the usage that follows (OpenAI's usage chunk, Bedrock's `metadata`)
    /// rather than settling a departure; true then (`left` set). The answer is not cached:
    /// the frames the client did not take never reached the assembler.
    fn left_after_the_finish(&mut self, left: &mut Option<Instant>) -> bool {
        if !self.converter.finished() {
            return false;
        }
        *left = Some(Instant::now());
        self.assembler = None;
        true
    }

    /// A complete Responses response is stored (by `pass`, and though its client left),
    /// at the shutdown waited on at most `responses::STORED_BY` after the drain.
    async fn keep_conversation(&mut self, drain: &Drain) {
        let Some(ctx) = &self.conversation else {
            return;
        };
        let Some(r) = self.converter.completed_response() else {
            return;
        };
        super::responses::keep(&self.state, ctx, &r, drain).await;
    }

    /// The upstream's body ended (or broke off, or stalled): `None` when that completed the
    /// stream (its closing events are in `frames`), else the failure, `message`.
    fn end(&mut self, frames: &mut Vec<Bytes>, message: &'static str) -> Option<&'static str> {
        (!self.converter.end(frames)).then_some(message)
    }

    /// Hands the converter's frames to the client (and the cache's assembler); false when
    /// the client is gone. A complete response is stored before its last event reaches the
    /// client, so its id works as soon as the client has it.
    async fn pass(&mut self, frames: &mut Vec<Bytes>, sink: &ClientSink) -> bool {
        self.keep_conversation(&sink.drain).await;
        // After the finish the answer is whole: a client behind at the shutdown is waited
        // for, within the read-on's deadline, rather than cut (`ClientSink::send_whole`).
        let whole = self.converter.finished();
        for f in frames.drain(..) {
            if let Some(a) = self.assembler.as_mut() {
                a.push(&f);
            }
            let sent = if whole {
                sink.send_whole(f).await
            } else {
                sink.send(f).await
            };
            if !sent {
                return false;
            }
            self.progress();
        }
        true
    }

    /// `failed`: the stream did not complete (never cached); `ending`: the log row's code;
    /// `may_have_run_on`: the upstream did not break the stream off itself — the gateway
    /// left it (the client left, a stall, a corrupt event, the shutdown) or it finished —
    /// so without its usage a server-tool turn is charged as far as it may have run
    /// (`left_turn`); one the upstream broke off, as far as it showed (`cut_turn`).
    ///
    /// The row is recorded before the settlement is awaited: its cost is decided here (the
    /// settlement charges the same, capped at the reservation with the excess absorbed),
    /// and once handed to the store's writer the settlement lands whatever becomes of this
    /// task — but the task itself may not outlive a slow store at the shutdown (its worker
    /// is stopped `startup::SETTLE_MARGIN` after the drain), and a row written after the
    /// wait would then be lost.
    async fn settle(self, failed: bool, ending: Option<&'static str>, may_have_run_on: bool) {
        let Pump {
            framing: _,
            state,
            books,
            prices,
            long_context,
            may,
            converter,
            reader,
            reserved_input,
            counted_input,
            assembler,
            mut key_booking,
            conversation: _,
            turn,
            key: _,
            permit: _,
        } = self;
        let Books {
            held,
            mut log,
            started,
            auth,
            mut booking,
            cache,
        } = books;
        let _settle = log.trace.stage("settle");
        super::kinds::served_tier(reader.provider, &log.upstream, converter.served_tier());
        let input_reported = converter.input_reported();
        let output_final = converter.usage_final();
        let mut usage = converter.usage().at_worst_lifetime(may);
        // Without the input reported, a stream that ended before its answer was whole (its
        // client left, a stall, a cut, the shutdown) is charged the input reserved for it:
        // the upstream had the whole request and may bill all of it. Only a whole answer
        // without its usage is charged the estimate (its documents at their estimate).
        let departed = !input_reported && ending.is_some();
        if departed {
            usage.input = reserved_input;
        }
        if !converter.usage_final() {
            let seen = converter.server_calls_seen();
            usage = if may_have_run_on {
                left_turn(usage, turn, seen)
            } else {
                cut_turn(usage, turn.0, seen)
            };
        }
        let cost = if departed {
            long_context::priced_departed(usage, (prices, may), long_context, reader)
        } else if !input_reported {
            long_context::priced_counted(usage, prices, long_context, reader)
        } else {
            long_context::priced(usage, prices, long_context)
        };
        // Every window the request booked, corrected (off this path) to what was counted:
        // a departure's input as counted, not the reserved input it pays (DESIGN: the
        // upstream had the whole request, its windows keep the counted input).
        let input_used = if departed { counted_input } else { usage.input };
        let used = input_used.saturating_add(usage.output);
        for b in [booking.as_mut(), key_booking.as_mut()]
            .into_iter()
            .flatten()
        {
            b.used(used);
        }
        // The usage the stream was charged — the upstream's, or the gateway's count of a
        // side it did not report, as the entry records it — for a whole answer whose client
        // did not see a usage chunk: an OpenAI-compatible server that reports none was
        // never cached (a stream of it is charged its count all the same).
        let charged = Some((usage.input, usage.output));
        // A translated stream the upstream paused or cut is not stored, though its client's
        // format may call it complete (`StreamConverter::ended_whole`, late attack L5).
        let cache = cache.filter(|_| converter.ended_whole());
        if let (Some(plan), Some(answer), false) =
            (&cache, assembler.and_then(|a| a.finish(charged)), failed)
        {
            let now = state.cache_now();
            state
                .cache
                .store(plan.clone(), answer, (usage.input, usage.output), now);
        }
        log.cost_micros = held.cost_of(cost);
        log.input_tokens = usage.input;
        log.output_tokens = usage.output;
        log.kinds = usage.parts();
        log.latency_ms = started.elapsed().as_millis() as i64;
        log.status = 200;
        // A side the upstream did not report by its finish (its input, or its output: a
        // running figure, or none, under the count of the text) is the gateway's count:
        // the row says so. A stream that ended well without the input reported says it in
        // its code too (its documents at their estimate), as before.
        log.usage_estimated = !input_reported || !output_final;
        log.error_code = match ending {
            None if !input_reported => Some(USAGE_ESTIMATED),
            ending => ending,
        };
        state.request_log.record(log).await;
        let s = held.settle(cost).await;
        super::account(&state, &auth, s.token_remaining, s.absorbed);
    }
}

/// A server-tool turn without its usage that the upstream did not break off itself (`turn`:
/// its calls, the searches it may make, its output cap), of which the stream showed
/// `calls_seen` calls start: the turn ran at most those and the one it may have been
/// starting as the stream was left (closing cancels the rest) — every step's input from
/// the first step's as reported (or counted), each call's result at the turn's largest page
/// (`Turn::at_most`), and as many searches, no more than allowed. A non-streamed request
/// shows nothing of how far it got: it pays the whole turn (`attempts::departure_on`;
/// `pipeline::finish` for a whole answer without usage).
fn left_turn(
    mut usage: Usage,
    (turn, searches, output): (Turn, i64, i64),
    calls_seen: i64,
) -> Usage {
    if turn.calls > 0 {
        let ran = calls_seen.saturating_add(1);
        let turn = turn.at_most(ran);
        usage.input = turn.billed_input(usage.input, output).max(usage.input);
        usage.web_search_calls = usage.web_search_calls.max(searches.min(ran));
    }
    usage
}

/// A server-tool turn without its usage that the upstream broke off itself (its error
/// event, its body's break or end before the finish), of which the stream showed
/// `calls_seen` calls start: the upstream ran no further than it showed, but each call it
/// showed was run and the step after it sampled — every step's input from the first
/// step's as reported (or counted), each call's result at the turn's largest page
/// (`Turn::at_most`), the output seen re-read by each step after the first. The searches
/// are those shown and not answered with an error (the converter's count).
fn cut_turn(mut usage: Usage, turn: Turn, calls_seen: i64) -> Usage {
    let turn = turn.at_most(calls_seen);
    usage.input = turn
        .billed_input(usage.input, usage.output)
        .max(usage.input);
    usage
}
