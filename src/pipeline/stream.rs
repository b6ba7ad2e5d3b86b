//! Streams. The upstream's SSE events are read by a pump task and forwarded through a small
//! bounded channel (backpressure: a slow client slows the pump, it does not grow memory).
//! The pump ends when the upstream finishes, stalls past the idle timeout, breaks, or the
//! client goes away (the channel closes) — then it drops the upstream response, which
//! closes that connection and cancels generation, and settles the reservation:
//! the upstream's usage when it arrived, else the counted input plus the output counted
//! with the tokenizer from the deltas received. A stream that breaks ends with an error
//! event and no `[DONE]`, so clients can tell it from a complete answer.

use std::sync::Arc;
use std::time::{Duration, Instant};

use actix_web::{web, HttpResponse};
use bytes::{BufMut, Bytes, BytesMut};
use eventsource_stream::Eventsource;
use futures_util::StreamExt;
use tokio::sync::mpsc;

use super::attempts::Success;
use super::request::Prepared;
use super::respond;
use crate::auth::TokenAuth;
use crate::quota::estimate;
use crate::quota::pricing::{self, Prices, Usage};
use crate::quota::reservation::Held;
use crate::ratelimit::Booking;
use crate::state::AppState;
use crate::store::requests::RequestRow;
use crate::upstream::providers::openai;

/// Chunks buffered between the pump and a slow client.
const CHANNEL_DEPTH: usize = 16;

struct Pump {
    state: web::Data<AppState>,
    held: Held,
    log: RequestRow,
    started: Instant,
    include_usage: bool,
    input_tokens: i64,
    prices: Prices,
    auth: Arc<TokenAuth>,
    booking: Option<Booking>,
}

pub fn start(
    state: &web::Data<AppState>,
    p: &Prepared,
    s: Success,
    held: Held,
    log: RequestRow,
    started: Instant,
    auth: Arc<TokenAuth>,
    booking: Option<Booking>,
) -> HttpResponse {
    let (tx, mut rx) = mpsc::channel::<Bytes>(CHANNEL_DEPTH);
    let mut resp = HttpResponse::Ok();
    resp.content_type("text/event-stream")
        .insert_header(("cache-control", "no-cache"));
    respond::gateway_headers(
        &mut resp,
        &log.id,
        &log.upstream,
        held.remaining(),
        log.cache,
        &auth,
    );
    let pump = Pump {
        state: state.clone(),
        held,
        log,
        started,
        include_usage: p.include_usage,
        input_tokens: p.input_tokens,
        prices: s.model.prices,
        auth,
        booking,
    };
    let Some(upstream) = s.response else {
        return HttpResponse::InternalServerError().finish();
    };
    tokio::spawn(async move {
        let _in_flight = s.in_flight;
        pump.run(upstream, tx).await;
    });
    let body = async_stream::stream! {
        while let Some(chunk) = rx.recv().await {
            yield Ok::<_, std::convert::Infallible>(chunk);
        }
    };
    resp.streaming(body)
}

fn frame(data: &str) -> Bytes {
    let mut b = BytesMut::with_capacity(data.len() + 8);
    b.put_slice(b"data: ");
    b.put_slice(data.as_bytes());
    b.put_slice(b"\n\n");
    b.freeze()
}

fn error_frame(message: &str) -> Bytes {
    let body = serde_json::json!({"error": {"message": message, "type": "server_error", "param": null, "code": "upstream_error"}});
    frame(&body.to_string())
}

impl Pump {
    async fn run(self, upstream: reqwest::Response, tx: mpsc::Sender<Bytes>) {
        let idle = Duration::from_millis(self.state.settings.upstream.stream_idle_timeout_ms);
        let mut events = upstream.bytes_stream().eventsource();
        let mut usage: Option<Usage> = None;
        let mut text = String::new();
        let mut done = false;
        let mut client_gone = false;
        let mut failure: Option<&'static str> = None;
        loop {
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
                    if !done {
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
            if event.data == "[DONE]" {
                done = true;
                if tx.send(frame("[DONE]")).await.is_err() {
                    client_gone = true;
                    break;
                }
                continue;
            }
            let info = openai::inspect_chunk(&event.data, &mut text);
            if let Some(u) = info.as_ref().and_then(|i| i.usage) {
                usage = Some(u);
            }
            if info.as_ref().is_some_and(|i| i.usage_only) && !self.include_usage {
                continue;
            }
            if tx.send(frame(&event.data)).await.is_err() {
                client_gone = true;
                break;
            }
        }
        if let (Some(msg), false) = (failure, client_gone) {
            let _ = tx.send(error_frame(msg)).await;
        }
        drop(events);
        drop(tx);
        self.settle(usage, &text, failure, client_gone).await;
    }

    async fn settle(
        mut self,
        usage: Option<Usage>,
        text: &str,
        failure: Option<&'static str>,
        client_gone: bool,
    ) {
        let usage = usage.unwrap_or_else(|| Usage {
            input: self.input_tokens,
            cached_input: 0,
            output: estimate::count_text(text),
        });
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
