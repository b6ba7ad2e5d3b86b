//! A streaming request that must wait for admission is answered at once: the SSE stream
//! opens, carries comment lines (`: queued position=3 eta=45s`, which SDKs ignore) while
//! the request waits, then the upstream's stream. Because the response is already open,
//! a client that closes its connection leaves the queue at once (the body is dropped), and
//! one that stops reading leaves when a comment has waited for the stall limit; a request
//! refused by the queue or by every upstream ends with an error event.

use std::time::{Duration, Instant};

use actix_web::http::header::HeaderMap;
use actix_web::{web, HttpResponse};
use bytes::Bytes;

use super::attempts::{self, Candidate, Outcome};
use super::drain::Drain;
use super::recheck;
use super::request::Prepared;
use super::stream::{self, sse_channel, sse_response, stall_limit, Books, ClientSink};
use crate::error::ApiError;
use crate::ops::traces::Stage;
use crate::queue::Ticket;
use crate::state::AppState;
use crate::upstream::providers::translate::stream::typed_error_event;

/// How often a waiting stream hears where it stands.
const COMMENT_EVERY: Duration = Duration::from_millis(500);

pub struct Waiting {
    pub prepared: Prepared,
    pub ticket: Ticket,
    /// The request's credential (`credential`), checked again when the slot comes.
    pub credential: HeaderMap,
    pub books: Books,
    pub candidates: Vec<Candidate>,
    pub deadline: Instant,
    /// The queue stage's span (`ops::traces`), ended when the wait is over.
    pub queue_span: Stage,
}

pub fn start(state: &web::Data<AppState>, w: Waiting, drain: Drain) -> HttpResponse {
    let (sink, body) = sse_channel(stall_limit(state), drain);
    let dropped = super::attempts::dropped_by_any(state, &w.prepared, &w.candidates);
    let mut resp = sse_response(
        &w.books.log,
        w.books.held.remaining(),
        &w.books.auth,
        &dropped,
    );
    tokio::spawn(wait_then_serve(state.clone(), w, sink));
    resp.streaming(body)
}

fn comment(position: usize, eta: Duration) -> Bytes {
    Bytes::from(format!(
        ": queued position={position} eta={}s\n\n",
        eta.as_secs()
    ))
}

/// How a queued stream's wait ended.
enum Waited<T> {
    /// The client left.
    Left,
    /// The gateway is shutting down.
    Draining,
    /// The queue's answer: a slot, or a refusal.
    Came(T),
}

async fn wait_then_serve(state: web::Data<AppState>, w: Waiting, sink: ClientSink) {
    let Waiting {
        prepared,
        ticket,
        credential,
        mut books,
        candidates,
        deadline,
        queue_span,
    } = w;
    let probe = ticket.probe();
    // Boxed, so the ticket can go before the departure's writes (below).
    let mut granted = Box::pin(ticket.granted(deadline));
    let mut tick = tokio::time::interval(COMMENT_EVERY);
    let waited = loop {
        tokio::select! {
            biased;
            _ = sink.closed() => break Waited::Left,
            _ = sink.drain.started() => break Waited::Draining,
            r = &mut granted => break Waited::Came(r),
            _ = tick.tick() => {
                let (position, eta) = probe.position();
                if !sink.send(comment(position, eta)).await {
                    break Waited::Left;
                }
            }
        }
    };
    // A waiter that left gives its place up at once — and a slot granted meanwhile goes to
    // the next — not once its settlement and log row are written: with a slow store,
    // departed clients filled the queue (s29 limits attack F4).
    drop(granted);
    drop(queue_span);
    // Boxed: what follows the wait (the re-check, the attempts, the stream's pump) would
    // otherwise sit in every queued request's task for its whole wait.
    Box::pin(async move {
        let slot = match waited {
            Waited::Left => return end(&state, books, ApiError::ClientGone, NOTHING).await,
            Waited::Draining => return shut_down(&state, &prepared, books, &sink, NOTHING).await,
            Waited::Came(slot) => slot,
        };
        let slot = match slot {
            Ok(s) => recheck::still_admitted(&state, &credential, deadline)
                .await
                .map(|()| s),
            Err(refused) => Err(ApiError::from(refused)),
        };
        let slot = match slot {
            Ok(s) => s,
            Err(e) => {
                sink.send(refusal_event(&prepared, &e)).await;
                return end(&state, books, e, NOTHING).await;
            }
        };
        let checked = Instant::now();
        // An upstream's own error answer cannot be relayed into an open stream (and is not
        // `Send`): only its gist goes on, in the error event.
        let mut departure = attempts::Departure::default();
        let result = {
            // The response is open: a client that leaves now is seen only by the body being
            // dropped, so the wait on the upstream races it (dropping the call closes the
            // upstream connection). From each attempt on, a departure pays the input reserved
            // on the dearest candidate sent the request (`attempts::departure_on`).
            let (id, trace) = (books.log.id.clone(), books.log.trace.clone());
            let (held, booking) = (&mut books.held, &mut books.booking);
            let call = attempts::call(
                &state,
                &prepared,
                &candidates,
                deadline,
                (&id, &trace),
                (&credential, checked),
                |sent| {
                    held.set_cost_if_dropped(sent.cost);
                    departure = sent;
                    // Its windows, as a request not queued books them: the input once a call
                    // reached an upstream that may bill it, until the answer says what was used.
                    if let Some(b) = booking.as_mut() {
                        b.used(if sent.input > 0 {
                            prepared.input_tokens
                        } else {
                            0
                        });
                    }
                },
            );
            let outcome = tokio::select! {
                biased;
                _ = sink.closed() => None,
                _ = sink.drain.started() => None,
                outcome = call => Some(outcome),
            };
            outcome.map(|outcome| {
                books.log.attempts = outcome.attempts;
                match outcome.result {
                    Outcome::Served(s) => Ok(s),
                    Outcome::Failed(f) => Err((f.error, outcome.cut_by_deadline)),
                }
            })
        };
        let input = (departure.input, departure.cost);
        let Some(result) = result else {
            if sink.drain.is_draining() {
                return shut_down(&state, &prepared, books, &sink, input).await;
            }
            return end(&state, books, ApiError::ClientGone, input).await;
        };
        match result {
            Ok(s) => {
                books.log.upstream = s.dep.id.clone();
                books.log.served_model = s.model.name.clone();
                books.log.upstream_model = s.route.upstream_model.clone();
                stream::serve(state, &prepared, s, books, sink, slot).await;
            }
            Err((error, cut_by_deadline)) => {
                // Cut off by its own deadline after an upstream had it: the input is charged.
                let cost = if cut_by_deadline { input } else { NOTHING };
                sink.send(refusal_event(&prepared, &error)).await;
                end(&state, books, error, cost).await;
            }
        }
    })
    .await;
}

/// The shutdown ended a stream still waiting (queued, or on an upstream's headers): its
/// error event if the client has room for it at once, charged as a departure would be.
async fn shut_down(
    state: &AppState,
    prepared: &Prepared,
    books: Books,
    sink: &ClientSink,
    input: (i64, i64),
) {
    let e = ApiError::ShuttingDown;
    sink.send_now(refusal_event(prepared, &e));
    end(state, books, e, input).await;
}

/// The error event of a gateway refusal on the open stream, with the error's own type in the
/// client's format (an `authentication_error`, an `overloaded_error`…): the generic event
/// is a server error, which clients read as retryable.
fn refusal_event(prepared: &Prepared, e: &ApiError) -> Bytes {
    typed_error_event(
        prepared.endpoint.format(),
        (&e.to_string(), e.code()),
        e.wire_types(),
        e.wait_fields(),
    )
}

/// Nothing charged: (input tokens, cost) of a stream that never reached an upstream.
const NOTHING: (i64, i64) = (0, 0);

/// A stream that ended before any upstream answered: nothing is charged and its windows
/// are corrected to 0 — unless an upstream had the request when its deadline cut the
/// attempt off or its client left (`input`: the input tokens charged and their cost,
/// an `attempts::Departure`, as `departure_on` prices it).
async fn end(state: &AppState, books: Books, e: ApiError, input: (i64, i64)) {
    let (input_tokens, cost) = input;
    let Books {
        held,
        mut log,
        started,
        mut booking,
        ..
    } = books;
    // The input an upstream had stays in the windows even when it costs nothing (a free
    // model).
    if let Some(b) = booking.as_mut().filter(|_| input_tokens == 0) {
        b.used(0);
    }
    // The row before the wait on the store (see `stream::Pump::settle`): its cost is
    // decided here, and the settlement lands once handed to the writer.
    log.cost_micros = held.cost_of(cost);
    log.input_tokens = input_tokens;
    // An input charged here is the one reserved for it: the gateway's count.
    log.usage_estimated = input_tokens > 0;
    log.status = e.status().as_u16();
    log.error_code = Some(e.code());
    log.latency_ms = started.elapsed().as_millis() as i64;
    state.request_log.record(log).await;
    held.settle(cost).await;
}
