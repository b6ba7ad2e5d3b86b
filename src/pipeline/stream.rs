//! Streams. The upstream's SSE events are read by a pump task, converted to the client's
//! format event by event (`providers::translate::stream`; unchanged when the formats
//! match), and forwarded through a small bounded channel (backpressure: a slow client slows
//! the pump, it does not grow memory). The pump ends when the upstream finishes, stalls
//! past the idle timeout, breaks, or the client goes away (the channel closes) — then it
//! drops the upstream response, which closes that connection and cancels generation, and
//! settles the reservation: the upstream's usage when it arrived, else the counted input
//! plus the output counted with the tokenizer from the deltas received. A stream that
//! breaks ends with an error event and no `[DONE]` / `message_stop`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use actix_web::{web, HttpResponse};
use bytes::Bytes;
use eventsource_stream::Eventsource;
use futures_util::StreamExt;
use tokio::sync::mpsc;

use super::attempts::Success;
use super::request::Prepared;
use super::respond;
use crate::auth::TokenAuth;
use crate::queue::Slot;
use crate::quota::pricing::{self, Prices};
use crate::quota::reservation::Held;
use crate::ratelimit::Booking;
use crate::state::AppState;
use crate::store::requests::RequestRow;
use crate::upstream::providers::{self, translate::stream::StreamConverter};

/// Chunks buffered between the pump and a slow client.
const CHANNEL_DEPTH: usize = 16;

struct Pump {
    state: web::Data<AppState>,
    held: Held,
    log: RequestRow,
    started: Instant,
    prices: Prices,
    auth: Arc<TokenAuth>,
    booking: Option<Booking>,
    converter: StreamConverter,
}

/// The channel a stream's frames go through, and the response body that drains it.
pub(super) fn sse_channel() -> (
    mpsc::Sender<Bytes>,
    impl futures_util::Stream<Item = Result<Bytes, std::convert::Infallible>> + 'static,
) {
    let (tx, mut rx) = mpsc::channel::<Bytes>(CHANNEL_DEPTH);
    let body = async_stream::stream! {
        while let Some(chunk) = rx.recv().await {
            yield Ok::<_, std::convert::Infallible>(chunk);
        }
    };
    (tx, body)
}

pub(super) fn sse_response(
    log: &RequestRow,
    remaining: Option<i64>,
    auth: &TokenAuth,
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
    );
    resp
}

#[allow(clippy::too_many_arguments)]
pub fn start(
    state: &web::Data<AppState>,
    p: &Prepared,
    s: Success,
    held: Held,
    log: RequestRow,
    started: Instant,
    auth: Arc<TokenAuth>,
    booking: Option<Booking>,
    admission: Slot,
) -> HttpResponse {
    let (tx, body) = sse_channel();
    let mut resp = sse_response(&log, held.remaining(), &auth);
    tokio::spawn(serve(
        state.clone(),
        p.endpoint.format(),
        p.include_usage,
        p.input_tokens,
        s,
        (held, log, started, auth, booking),
        tx,
        admission,
    ));
    resp.streaming(body)
}

/// Runs the pump for an upstream that answered, holding the in-flight count, the gate slot
/// and the admission slot until the stream ends.
#[allow(clippy::too_many_arguments)]
pub(super) async fn serve(
    state: web::Data<AppState>,
    client: crate::error::WireFormat,
    include_usage: bool,
    input_tokens: i64,
    s: Success,
    (held, log, started, auth, booking): (
        Held,
        RequestRow,
        Instant,
        Arc<TokenAuth>,
        Option<Booking>,
    ),
    tx: mpsc::Sender<Bytes>,
    admission: Slot,
) {
    let upstream_format =
        providers::format_of(state.catalog.deployments[s.route.deployment].provider);
    let pump = Pump {
        state: state.clone(),
        held,
        log,
        started,
        prices: s.model.prices,
        auth,
        booking,
        converter: StreamConverter::new(upstream_format, client, include_usage, input_tokens),
    };
    let _held = (s.in_flight, s.slot, admission);
    if let Some(upstream) = s.response {
        pump.run(upstream, tx).await;
    }
}

impl Pump {
    async fn run(mut self, upstream: reqwest::Response, tx: mpsc::Sender<Bytes>) {
        let idle = Duration::from_millis(self.state.settings.upstream.stream_idle_timeout_ms);
        let mut events = upstream.bytes_stream().eventsource();
        let mut client_gone = false;
        let mut failure: Option<&'static str> = None;
        let mut frames = Vec::with_capacity(4);
        'read: loop {
            let next = tokio::select! {
                biased;
                _ = tx.closed() => { client_gone = true; break; }
                n = tokio::time::timeout(idle, events.next()) => n,
            };
            let event = match next {
                Err(_) => {
                    failure =
                        Some("The upstream stopped sending; the stream was ended by the gateway.");
                    break;
                }
                Ok(None) => {
                    if !self.converter.done() {
                        failure = Some("The upstream ended the stream before it was complete.");
                    }
                    break;
                }
                Ok(Some(Err(_))) => {
                    failure = Some("The upstream stream broke off.");
                    break;
                }
                Ok(Some(Ok(ev))) => ev,
            };
            self.converter.event(&event.event, &event.data, &mut frames);
            for f in frames.drain(..) {
                if tx.send(f).await.is_err() {
                    client_gone = true;
                    break 'read;
                }
            }
        }
        if let (Some(msg), false) = (failure, client_gone) {
            let _ = tx.send(self.converter.error_frame(msg)).await;
        }
        drop(events);
        drop(tx);
        self.settle(failure, client_gone).await;
    }

    async fn settle(mut self, failure: Option<&'static str>, client_gone: bool) {
        let usage = self.converter.usage();
        let cost = pricing::cost(usage, self.prices);
        match self.held.settle(cost).await {
            Ok(s) => {
                self.log.cost_micros = s.charged + s.absorbed;
                self.auth.note_remaining(s.token_remaining);
            }
            Err(e) => {
                tracing::error!(request_id = %self.log.id, error = %e, "stream settlement failed")
            }
        }
        self.state
            .windows
            .settle(self.booking.take(), usage.input + usage.output);
        self.log.input_tokens = usage.input;
        self.log.output_tokens = usage.output;
        self.log.latency_ms = self.started.elapsed().as_millis() as i64;
        self.log.status = 200;
        if failure.is_some() {
            self.log.error_code = Some("upstream_error");
        } else if client_gone {
            self.log.error_code = Some("client_disconnected");
        }
        self.state.request_log.record(self.log).await;
    }
}
