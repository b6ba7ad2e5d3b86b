//! A client that leaves, in every state a request can be in (issue 16): queued behind a
//! full admission gate, waiting on the upstream's headers, headers in and waiting on the
//! first event, streaming, and a non-streamed request waiting on its answer. A raw TCP
//! client sends the request and then either closes its socket or half-closes it (FIN) and
//! keeps it. Each time the gateway must cancel the upstream call (its connection to the
//! mock closes), settle by DESIGN's disconnect rule (nothing while queued, the counted
//! input once an upstream had the request, plus the counted output once some arrived),
//! write exactly one log row that says the client left, and free the admission slot: the
//! gateway has one slot, so the next request is served only if it came free.
//!
//! No test waits on the gateway noticing: the mock holds its headers or its next event for
//! an hour and the test holds the queue's slot itself, so only a departure noticed ends the
//! request; the bound (`BOUND`) only turns a departure never noticed into a failure.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use sluice::mock::{Script, SseEvent};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::helpers::*;
use crate::responses::cost as price;

const BOUND: Duration = Duration::from_secs(10);
const HOUR_MS: u64 = 3_600_000;

#[derive(Clone, Copy, Debug)]
enum Leave {
    /// The client closes its socket (a FIN, or a reset when data was unread).
    Close,
    /// The client shuts down its sending side and keeps the socket, reading nothing.
    HalfClose,
}

/// One slot in the admission gate; a short queue wait, so a slot left taken turns the
/// follow-up request into a 503 rather than a hang.
async fn app() -> Arc<TestApp> {
    Arc::new(
        spawn_app_with(|s, _| {
            s.queue.max_in_flight = 1;
            s.queue.reserved = sluice::config::ReservedSlots::NONE; // none reserved
            s.queue.max_wait_seconds = 5;
        })
        .await,
    )
}

fn body(stream: bool) -> Value {
    let mut b = chat_body(100);
    b["stream"] = json!(stream);
    b
}

/// Sends a chat request over a raw connection.
async fn send_raw(app: &TestApp, token: &str, body: &Value) -> TcpStream {
    send_raw_chat(&app.address, token, body, None).await
}

/// Reads until `what` has arrived; returns everything read.
async fn read_until(conn: &mut TcpStream, what: &str) -> String {
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    tokio::time::timeout(BOUND, async {
        while !String::from_utf8_lossy(&got).contains(what) {
            let n = conn.read(&mut buf).await.unwrap();
            assert!(
                n > 0,
                "closed before {what:?}: {}",
                String::from_utf8_lossy(&got)
            );
            got.extend_from_slice(&buf[..n]);
        }
    })
    .await
    .unwrap_or_else(|_| panic!("{what:?} never came: {}", String::from_utf8_lossy(&got)));
    String::from_utf8_lossy(&got).into_owned()
}

/// The client leaves; a half-closed socket is kept (returned) so it stays open.
async fn leave(mut conn: TcpStream, how: Leave) -> Option<TcpStream> {
    match how {
        Leave::Close => None,
        Leave::HalfClose => {
            conn.shutdown().await.unwrap();
            Some(conn)
        }
    }
}

async fn until(what: &str, mut done: impl AsyncFnMut() -> bool) {
    let bound = Instant::now() + BOUND;
    while !done().await {
        assert!(Instant::now() < bound, "{what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The mock holds its headers for an hour, on every request.
fn hold_headers(app: &TestApp) {
    app.mock.state.sticky(
        KEY_A,
        Some(Script {
            delay_ms: HOUR_MS,
            ..Default::default()
        }),
    );
}

/// Waits until the upstream has the request: the mock had it and its connection is open.
async fn upstream_has_it(app: &TestApp) {
    until("the upstream never had the request", async || {
        app.mock.state.stats(KEY_A).count == 1 && established_to(app.mock.port) == 1
    })
    .await;
}

/// What the departure must have left: the upstream call closed, one log row with this
/// status and code, the reservation settled at the row's cost — `charged_input`: the
/// counted input was charged (else nothing), `output`: some output was counted too — the
/// invariant, and the slot free for the next request.
async fn assert_departed(
    app: &TestApp,
    (id, token): (i64, &str),
    status: i64,
    charged_input: bool,
    output: bool,
) {
    upstream_closed(app).await;
    until("the departure was never settled and logged", async || {
        app.state.request_log.flush().await;
        app.scalar("SELECT COUNT(*) FROM reservations").await == 0
            && app.scalar("SELECT COUNT(*) FROM requests").await >= 1
    })
    .await;
    let (st, code, input, out, cost, estimated): (i64, Option<String>, i64, i64, i64, i64) =
        sql_row(
            app.db(),
            "SELECT status, error_code, input_tokens, output_tokens, cost_micros,
                CAST(CASE WHEN usage_estimated THEN 1 ELSE 0 END AS BIGINT) FROM requests",
        )
        .await;
    assert_eq!(
        (st, code.as_deref()),
        (status, Some("client_disconnected")),
        "the log row"
    );
    // The input charged is the one reserved for it: the gateway's count (issue 20).
    assert_eq!(estimated == 1, charged_input, "usage_estimated");
    assert_eq!(
        charged_to(app, id).await,
        cost,
        "the ledger and the log row agree"
    );
    if charged_input {
        assert!(input > 0, "the counted input is in the row");
        if output {
            assert!(out > 0, "some output was counted");
        } else {
            assert_eq!(out, 0);
        }
        assert_eq!(cost, price(input, out));
    } else {
        assert_eq!(cost, 0, "nothing charged");
    }
    app.assert_invariant().await;
    // The only admission slot is free: the next request is served, not queued out.
    app.mock.state.sticky(KEY_A, None);
    let resp = app.chat(token, &chat_body(50)).await;
    assert_eq!(resp.status(), 200, "{:?}", resp.text().await);
    app.wait_for_log_rows(2).await;
    assert_eq!(app.scalar("SELECT COUNT(*) FROM requests").await, 2);
}

/// What the token was charged.
async fn charged_to(app: &TestApp, id: i64) -> i64 {
    app.scalar(&format!(
        "SELECT limit_micros - remaining_micros FROM tokens WHERE id = {id}"
    ))
    .await
}

/// (a) Queued behind a full admission gate (the test holds the only slot).
async fn queued(stream: bool, how: Leave) {
    let app = app().await;
    let (id, token) = app.token("queued", Some("1")).await;
    let held = app.state.queue.admit(1, 0).await.expect("the free slot");
    let mut conn = send_raw(&app, &token, &body(stream)).await;
    if stream {
        read_until(&mut conn, ": queued position=1").await;
    }
    until("never queued", async || {
        !app.state.queue.waiting_for(id).is_empty()
    })
    .await;
    let kept = leave(conn, how).await;
    until("still queued after the client left", async || {
        app.state.queue.waiting_for(id).is_empty()
    })
    .await;
    drop(held);
    assert_departed(&app, (id, &token), 499, false, false).await;
    assert_eq!(app.mock.state.stats(KEY_A).count, 1, "only the follow-up");
    drop(kept);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queued_request_whose_client_closes_is_logged_and_pays_nothing() {
    queued(false, Leave::Close).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queued_request_whose_client_half_closes_is_logged_and_pays_nothing() {
    queued(false, Leave::HalfClose).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queued_stream_whose_client_closes_is_logged_and_pays_nothing() {
    queued(true, Leave::Close).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queued_stream_whose_client_half_closes_is_logged_and_pays_nothing() {
    queued(true, Leave::HalfClose).await;
}

/// (b) and (f): an upstream that holds its headers for an hour; the request reached it.
async fn waiting_on_headers(stream: bool, how: Leave) {
    let app = app().await;
    let (id, token) = app.token("headers", Some("1")).await;
    hold_headers(&app);
    let conn = send_raw(&app, &token, &body(stream)).await;
    upstream_has_it(&app).await;
    let kept = leave(conn, how).await;
    assert_departed(&app, (id, &token), 499, true, false).await;
    drop(kept);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_whose_client_closes_while_the_upstream_holds_its_headers_is_cancelled_and_logged()
{
    waiting_on_headers(true, Leave::Close).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_whose_client_half_closes_while_the_upstream_holds_its_headers_is_cancelled_and_logged(
) {
    waiting_on_headers(true, Leave::HalfClose).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_whose_client_closes_while_the_upstream_works_is_cancelled_and_logged() {
    waiting_on_headers(false, Leave::Close).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_whose_client_half_closes_while_the_upstream_works_is_cancelled_and_logged() {
    waiting_on_headers(false, Leave::HalfClose).await;
}

/// (a) then (b): a stream that waited in the queue (its SSE response already open), was
/// admitted, and then waits on an upstream that holds its headers.
async fn queued_then_waiting_on_headers(how: Leave) {
    let app = app().await;
    let (id, token) = app.token("both", Some("1")).await;
    hold_headers(&app);
    let held = app.state.queue.admit(1, 0).await.expect("the free slot");
    let mut conn = send_raw(&app, &token, &body(true)).await;
    read_until(&mut conn, ": queued position=1").await;
    drop(held);
    upstream_has_it(&app).await;
    let kept = leave(conn, how).await;
    assert_departed(&app, (id, &token), 499, true, false).await;
    drop(kept);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_admitted_queued_stream_whose_client_closes_while_the_upstream_holds_its_headers_is_cancelled(
) {
    queued_then_waiting_on_headers(Leave::Close).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_admitted_queued_stream_whose_client_half_closes_while_the_upstream_holds_its_headers_is_cancelled(
) {
    queued_then_waiting_on_headers(Leave::HalfClose).await;
}

/// (c) Headers received, waiting on the first event (the mock stalls before it), and (d)
/// streaming (the mock stalls after two events: the client has read them).
async fn waiting_on_events(sent: usize, how: Leave) {
    let app = app().await;
    let (id, token) = app.token("events", Some("1")).await;
    let chunk = |text: &str| {
        SseEvent::Data(
            json!({"id": "c", "object": "chat.completion.chunk", "created": 1,
            "model": "m", "choices": [{"index": 0, "delta": {"content": text}, "finish_reason": null}]}),
        )
    };
    app.mock.state.sticky(
        KEY_A,
        Some(Script {
            events: Some(vec![
                chunk("The engine "),
                chunk("light blinks "),
                chunk("because"),
                SseEvent::Data(json!("[DONE]")),
            ]),
            stall_after: Some(sent),
            ..Default::default()
        }),
    );
    let mut conn = send_raw(&app, &token, &body(true)).await;
    let got = read_until(
        &mut conn,
        if sent > 0 { "light blinks" } else { "\r\n\r\n" },
    )
    .await;
    assert!(got.starts_with("HTTP/1.1 200"), "{got}");
    until("the upstream never had the request", async || {
        established_to(app.mock.port) == 1
    })
    .await;
    let kept = leave(conn, how).await;
    assert_departed(&app, (id, &token), 200, true, sent > 0).await;
    drop(kept);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_whose_client_closes_before_the_first_event_is_cancelled_and_pays_its_input() {
    waiting_on_events(0, Leave::Close).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_whose_client_half_closes_before_the_first_event_is_cancelled_and_pays_its_input()
{
    waiting_on_events(0, Leave::HalfClose).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_whose_client_closes_mid_stream_pays_input_and_what_it_got() {
    waiting_on_events(2, Leave::Close).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_whose_client_half_closes_mid_stream_pays_input_and_what_it_got() {
    waiting_on_events(2, Leave::HalfClose).await;
}

/// (g) A non-streamed request whose answer is in and being settled when its client leaves
/// (the settlement waits on the database, here held by another writer): the upstream did
/// all the work and the settlement lands at the answer's cost whatever the client does, so
/// the request's one log row must say that cost — the request log and the ledger agree.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_whose_client_leaves_while_its_answer_settles_is_logged_at_what_it_was_charged() {
    let app = app().await;
    let (_id, token) = app.token("settling", Some("1")).await;
    app.mock.state.sticky(
        KEY_A,
        Some(Script {
            delay_ms: 1500,
            ..Default::default()
        }),
    );
    let conn = send_raw(&app, &token, &body(false)).await;
    until("the upstream never had the request", async || {
        app.mock.state.stats(KEY_A).count == 1
    })
    .await;
    // Another writer holds the database while the upstream answers: the settlement waits.
    let other = hold_the_store(&app.settings.database.url).await;
    // Past the upstream's 1.5 s: the answer is in, its settlement blocked.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    drop(conn);
    tokio::time::sleep(Duration::from_millis(1000)).await;
    other.release().await;
    until("the request was never settled and logged", async || {
        app.state.request_log.flush().await;
        app.scalar("SELECT COUNT(*) FROM reservations").await == 0
            && app.scalar("SELECT COUNT(*) FROM requests").await >= 1
    })
    .await;
    // Give a background settlement time to land too.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let rows: Vec<(i64, Option<String>, i64, i64, i64)> = sql_rows(
        app.db(),
        "SELECT status, error_code, input_tokens, output_tokens, cost_micros FROM requests",
    )
    .await;
    eprintln!("rows: {rows:?}");
    assert_eq!(rows.len(), 1, "one row: {rows:?}");
    app.assert_invariant().await;
}

/// (h) Clients that leave while their row waits to be queued (the store stalled and the
/// request log is its whole queue behind): each request still has its one row once the
/// store is back. Invalid keys make the requests cheap: each is answered 401 and logged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_leaves_while_its_row_waits_for_the_log_still_has_its_row() {
    use futures_util::StreamExt;
    let app = spawn_app().await;
    let other = hold_the_store(&app.settings.database.url).await;
    // The log queues 10 000 rows and writes batches of up to 512: past that, rows wait.
    let total = 10_000 + 512 + 300;
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(3))
        .build()
        .unwrap();
    let url = format!("{}/v1/chat/completions", app.address);
    let left = futures_util::stream::iter(0..total)
        .map(|_| {
            let (http, url) = (http.clone(), url.clone());
            async move {
                http.post(url)
                    .bearer_auth("sk-sluice-not-a-key")
                    .json(&chat_body(10))
                    .send()
                    .await
                    .is_err()
            }
        })
        .buffer_unordered(100)
        .filter(|gave_up| std::future::ready(*gave_up))
        .count()
        .await;
    eprintln!("{left} of {total} clients gave up waiting");
    assert!(left > 0, "the log was never behind");
    other.release().await;
    let bound = Instant::now() + Duration::from_secs(60);
    loop {
        app.state.request_log.flush().await;
        let rows = app.scalar("SELECT COUNT(*) FROM requests").await;
        if rows == total as i64 {
            break;
        }
        assert!(
            Instant::now() < bound,
            "{rows} rows for {total} requests ({left} clients left while their row waited)"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// A streamed chat body asking about `document` (a message's content part).
fn document_body(document: Value) -> Value {
    json!({"model": "gpt-4o-mini", "max_tokens": 100, "stream": true,
        "messages": [{"role": "user", "content": [document,
            {"type": "text", "text": "Why does the engine light blink?"}]}]})
}

/// A document of unknown size (by file id) and a readable 3-page PDF: both reserve the
/// model's whole input (128 000 tokens on the test model).
fn documents() -> [Value; 2] {
    use base64::Engine;
    let pdf = base64::engine::general_purpose::STANDARD.encode(crate::documents::pdf(3));
    [
        json!({"type": "file", "file": {"file_id": "file-6F2ksmvXxt4VdoqmHRw6kL"}}),
        json!({"type": "file", "file": {"filename": "manual.pdf",
            "file_data": format!("data:application/pdf;base64,{pdf}")}}),
    ]
}

/// What the two chunks before the stall say.
const BEFORE_THE_STALL: &str = "The engine light blinks ";

/// Every answer of the upstream streams two chunks, reporting no input, then stalls.
fn stall_after_two_chunks(app: &TestApp) {
    app.mock.state.sticky(
        KEY_A,
        Some(Script {
            events: Some(two_chunks()),
            stall_after: Some(2),
            ..Default::default()
        }),
    );
}

/// Two chunks of an OpenAI stream that reports no input before its end.
fn two_chunks() -> Vec<SseEvent> {
    let chunk = |text: &str| {
        SseEvent::Data(
            json!({"id": "c", "object": "chat.completion.chunk", "created": 1,
            "model": "m", "choices": [{"index": 0, "delta": {"content": text}, "finish_reason": null}]}),
        )
    };
    vec![
        chunk("The engine "),
        chunk("light blinks "),
        chunk("because"),
        SseEvent::Data(json!("[DONE]")),
    ]
}

/// Review finding (s15): a stream with a document whose client leaves mid-stream, before
/// the upstream reported its input, was charged the document's estimate as its input. The
/// upstream had the whole request: it pays the input reserved for it (the model's whole
/// input, 128 000) and the output counted so far; its row says both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_with_a_document_whose_client_leaves_mid_stream_pays_the_reserved_input() {
    for document in documents() {
        let app = app().await;
        let (id, token) = app.token("document", Some("1")).await;
        stall_after_two_chunks(&app);
        let mut conn = send_raw(&app, &token, &document_body(document.clone())).await;
        read_until(&mut conn, "light blinks").await;
        let kept = leave(conn, Leave::Close).await;
        assert_departed(&app, (id, &token), 200, true, true).await;
        drop(kept);
        let (input, output, cost): (i64, i64, i64) = sql_row(
            app.db(),
            &format!(
                "SELECT input_tokens, output_tokens, cost_micros FROM requests WHERE token_id = {id} \
                 AND error_code = 'client_disconnected'"
            ),
        )
        .await;
        let counted = sluice::quota::estimate::count_text(BEFORE_THE_STALL);
        assert_eq!((input, output), (128_000, counted), "{document}");
        assert_eq!(cost, price(128_000, counted), "{document}");
    }
}

/// Review finding (s15): a stream with a document whose upstream stalls before reporting
/// its input (a stall: the gateway ends it after the idle timeout) pays the input reserved
/// for it and the output counted, not the document's estimate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_with_a_document_whose_upstream_stalls_pays_the_reserved_input() {
    let app = spawn_app_with(|s, _| s.upstream.stream_idle_timeout_ms = 500).await;
    for (i, document) in documents().into_iter().enumerate() {
        let (id, token) = app.token(&format!("stall-{i}"), Some("1")).await;
        stall_after_two_chunks(&app);
        let resp = app.chat(&token, &document_body(document.clone())).await;
        assert_eq!(resp.status(), 200);
        let (data, _) = tokio::time::timeout(BOUND, sse_data(resp))
            .await
            .expect("the gateway ended the stalled stream");
        assert_eq!(reassemble(&data), BEFORE_THE_STALL);
        app.wait_for_log_rows(i as i64 + 1).await;
        app.wait_settled().await;
        let (code, input, output, cost): (Option<String>, i64, i64, i64) = sql_row(
            app.db(),
            &format!(
                "SELECT error_code, input_tokens, output_tokens, cost_micros FROM requests \
                 WHERE token_id = {id}"
            ),
        )
        .await;
        let counted = sluice::quota::estimate::count_text(BEFORE_THE_STALL);
        let want = price(128_000, counted);
        assert_eq!(
            (code.as_deref(), input, output, cost),
            (Some("upstream_error"), 128_000, counted, want),
            "{document}"
        );
        assert_eq!(charged_to(&app, id).await, want, "{document}");
    }
    app.mock.state.sticky(KEY_A, None);
    app.assert_invariant().await;
}

/// A Bedrock upstream on the mock (scripted by `BEDROCK_KEY`) and `m-bedrock` routed to it.
const BEDROCK_KEY: &str = "AKIDDEPARTURES";

async fn app_with_bedrock() -> TestApp {
    spawn_app_with(|s, mock| {
        s.upstreams.push(bedrock_upstream("br", BEDROCK_KEY, mock));
        s.models.push(model("m-bedrock", &["br"]));
    })
    .await
}

/// An OpenAI stream: "The engine ", its finish, then — each `PAUSE_MS` after the last —
/// the usage chunk when given, and `[DONE]`.
fn finished_then(usage: Option<(i64, i64)>) -> Script {
    let chunk = |choices: Value| {
        json!({"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m",
            "choices": choices})
    };
    let mut events = vec![
        SseEvent::Data(chunk(
            json!([{"index": 0, "delta": {"content": "The engine "}, "finish_reason": null}]),
        )),
        SseEvent::Data(chunk(
            json!([{"index": 0, "delta": {}, "finish_reason": "stop"}]),
        )),
    ];
    if let Some((i, o)) = usage {
        let mut u = chunk(json!([]));
        u["usage"] = json!({"prompt_tokens": i, "completion_tokens": o, "total_tokens": i + o});
        events.push(SseEvent::Data(u));
    }
    events.push(SseEvent::Data(json!("[DONE]")));
    Script {
        events: Some(events),
        chunk_delay_ms: PAUSE_MS,
        ..Default::default()
    }
}

/// A Bedrock stream: a text delta, its finish (`messageStop`), then its usage (`metadata`),
/// each `PAUSE_MS` after the last.
fn bedrock_finished_then_usage((i, o): (i64, i64)) -> Script {
    let named = |n: &str, v: Value| SseEvent::Named(n.into(), v);
    Script {
        events: Some(vec![
            named("messageStart", json!({"role": "assistant"})),
            named(
                "contentBlockDelta",
                json!({"contentBlockIndex": 0, "delta": {"text": "The engine "}}),
            ),
            named("contentBlockStop", json!({"contentBlockIndex": 0})),
            named("messageStop", json!({"stopReason": "end_turn"})),
            named(
                "metadata",
                json!({"usage": {"inputTokens": i, "outputTokens": o, "totalTokens": i + o},
                    "metrics": {"latencyMs": 1}}),
            ),
        ]),
        chunk_delay_ms: PAUSE_MS,
        ..Default::default()
    }
}

/// How long the scripted upstreams wait between events: the client has left (and the
/// gateway seen it) well before the usage after the finish comes.
const PAUSE_MS: u64 = 500;

/// The request log's (error code, input, output, cost) of the token's one request, once it
/// is settled; the ledger charged the token the row's cost.
async fn settled_row(app: &TestApp, id: i64) -> (Option<String>, i64, i64, i64) {
    let rows = format!("SELECT COUNT(*) FROM requests WHERE token_id = {id}");
    until("the request was never settled and logged", async || {
        app.state.request_log.flush().await;
        app.scalar("SELECT COUNT(*) FROM reservations").await == 0 && app.scalar(&rows).await == 1
    })
    .await;
    let row: (Option<String>, i64, i64, i64) = sql_row(
        app.db(),
        &format!(
            "SELECT error_code, input_tokens, output_tokens, cost_micros FROM requests \
             WHERE token_id = {id}"
        ),
    )
    .await;
    assert_eq!(
        charged_to(app, id).await,
        row.3,
        "the ledger and the row agree"
    );
    row
}

/// Review finding (s16c #3): a streamed client that closes right after the chunk carrying
/// `finish_reason` — a common loop, `if chunk.choices[0].finish_reason: break` — while the
/// upstream's usage is still to come (OpenAI's usage chunk; Bedrock's `metadata`, after
/// `messageStop`) was charged as a departure: the input reserved for it, with a document
/// the model's whole input (128 000). Its answer was whole: the gateway reads on for the
/// usage and charges it; an upstream that ends without one is charged the input estimate,
/// as a whole stream without usage is, exactly what a client that stayed pays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_whose_client_leaves_at_its_finish_pays_the_usage_that_follows_not_the_reserved_input(
) {
    let app = app_with_bedrock().await;
    let document = documents()[0].clone();
    let leave_at_the_finish = async |user: &str, key: &str, script: Script, body: &Value| {
        let (id, token) = app.token(user, Some("1")).await;
        app.mock.state.script(key, [script]);
        let mut conn = send_raw(&app, &token, body).await;
        read_until(&mut conn, "\"finish_reason\":\"stop\"").await;
        drop(conn);
        settled_row(&app, id).await
    };

    // OpenAI: the usage chunk comes after the client left.
    let row = leave_at_the_finish(
        "usage",
        KEY_A,
        finished_then(Some((40_000, 3))),
        &document_body(document.clone()),
    )
    .await;
    assert_eq!(
        row,
        (None, 40_000, 3, price(40_000, 3)),
        "OpenAI, usage after the finish"
    );

    // OpenAI: no usage at all, `[DONE]` after the client left: the estimate, as a client
    // that stayed for the end pays.
    let (stayed, token) = app.token("stayed", Some("1")).await;
    app.mock.state.script(KEY_A, [finished_then(None)]);
    let resp = app.chat(&token, &document_body(document.clone())).await;
    assert_eq!(resp.status(), 200);
    let (data, whole) = sse_data(resp).await;
    assert!(
        whole && data.last().is_some_and(|d| d == "[DONE]"),
        "{data:?}"
    );
    let stayed = settled_row(&app, stayed).await;
    assert_eq!(stayed.0.as_deref(), Some("usage_estimated"), "{stayed:?}");
    assert!(
        stayed.1 < 128_000,
        "the document at its estimate: {stayed:?}"
    );
    let row = leave_at_the_finish(
        "estimate",
        KEY_A,
        finished_then(None),
        &document_body(document),
    )
    .await;
    assert_eq!(row, stayed, "OpenAI, no usage: as the client that stayed");

    // Bedrock: its usage is the `metadata` event after `messageStop`.
    let mut body = body(true);
    body["model"] = json!("m-bedrock");
    let row = leave_at_the_finish(
        "bedrock",
        BEDROCK_KEY,
        bedrock_finished_then_usage((7, 2)),
        &body,
    )
    .await;
    assert_eq!(
        row,
        (None, 7, 2, price(7, 2)),
        "Bedrock, usage after the finish"
    );
    app.assert_invariant().await;
}

/// Review finding (s16c #4): a streamed departure booked the input reserved for it (with a
/// document the model's whole input, 128 000) into its token windows, where a non-streamed
/// one books the counted input (DESIGN: "the upstream had the whole request (its windows
/// keep the counted input)"). A token with a 10 000-token window was shut out for the
/// window by one question about a file: the next small requests are admitted now. The
/// money is unchanged: the departure still pays the reserved input.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streamed_departure_with_a_document_books_the_counted_input_in_its_token_window() {
    let app = app().await;
    let (id, token) = app
        .issue(sluice::cli::IssueArgs {
            budget_usd: Some("1"),
            tpm: Some(10_000),
            ..issue_args("tpm")
        })
        .await;
    stall_after_two_chunks(&app);
    let mut conn = send_raw(&app, &token, &document_body(documents()[0].clone())).await;
    read_until(&mut conn, "light blinks").await;
    drop(conn);
    let (code, input, _, _) = settled_row(&app, id).await;
    assert_eq!(
        (code.as_deref(), input),
        (Some("client_disconnected"), 128_000),
        "a departure pays the reserved input"
    );
    app.mock.state.sticky(KEY_A, None);
    // Two in a row: the second comes after the departure's window correction has landed.
    for i in 0..2 {
        let resp = app.chat(&token, &chat_body(50)).await;
        assert_eq!(resp.status(), 200, "request {i}: {:?}", resp.text().await);
    }
    app.assert_invariant().await;
}

/// An `n` = 3 OpenAI stream that reports no usage: choice 0's text and finish, then — each
/// `PAUSE_MS` after the last — choices 1 and 2's text, their finishes and `[DONE]`.
fn three_choices_choice_0_first() -> Script {
    let chunk = chunk_event;
    let text = |i: i64, t: &str| {
        chunk(json!([{"index": i, "delta": {"content": t}, "finish_reason": null}]))
    };
    let finish = |i: i64| chunk(json!([{"index": i, "delta": {}, "finish_reason": "stop"}]));
    Script {
        events: Some(vec![
            text(0, "The engine "),
            finish(0),
            text(1, "A second answer "),
            text(2, "A third answer "),
            finish(1),
            finish(2),
            SseEvent::Data(json!("[DONE]")),
        ]),
        chunk_delay_ms: PAUSE_MS,
        ..Default::default()
    }
}

/// Review finding (s18 A2): an `n` = 3 stream whose client left at the finish of choice 0
/// — the first finish — while choices 1 and 2 were still to come was settled as a whole
/// answer left at its finish: read on 2 s, then charged the input estimate, `usage_estimated`
/// (with a document of unknown size far less than the 128 000 reserved for it). The answer
/// is whole only once every choice asked for has its finish: this is a departure, charged
/// the reserved input and the output counted, `client_disconnected`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_n_stream_whose_client_leaves_at_the_first_choices_finish_is_a_departure() {
    let app = app().await;
    let (id, token) = app.token("three", Some("1")).await;
    app.mock
        .state
        .script(KEY_A, [three_choices_choice_0_first()]);
    let mut body = document_body(documents()[0].clone());
    body["n"] = json!(3);
    let mut conn = send_raw(&app, &token, &body).await;
    read_until(&mut conn, "\"finish_reason\":\"stop\"").await;
    drop(conn);
    let row = settled_row(&app, id).await;
    let counted = sluice::quota::estimate::count_text("The engine ");
    assert_eq!(
        row,
        (
            Some("client_disconnected".to_string()),
            128_000,
            counted,
            price(128_000, counted)
        ),
        "a departure: the answer's choices 1 and 2 had not finished"
    );

    // Left at the last choice's finish (`length`, the only one), the answer was whole: not
    // a departure, the estimate as a whole stream without usage.
    let (id, token) = app.token("three-whole", Some("1")).await;
    let mut script = three_choices_choice_0_first();
    if let Some(events) = script.events.as_mut() {
        events[5] = SseEvent::Data(json!({"id": "c", "object": "chat.completion.chunk",
            "created": 1, "model": "m",
            "choices": [{"index": 2, "delta": {}, "finish_reason": "length"}]}));
    }
    app.mock.state.script(KEY_A, [script]);
    let mut conn = send_raw(&app, &token, &body).await;
    read_until(&mut conn, "\"finish_reason\":\"length\"").await;
    drop(conn);
    let (code, input, _, _) = settled_row(&app, id).await;
    assert_eq!(code.as_deref(), Some("usage_estimated"));
    assert!(input < 128_000, "the document at its estimate: {input}");
    app.assert_invariant().await;
}

/// Choice 1's text in `choices_one_after_the_other`.
const SECOND: &str = "A second answer, told after the first one's usage. ";

/// The output tokens the last usage of `choices_one_after_the_other` reports: both choices'.
const BOTH: i64 = 150;

/// An `n` = 2 OpenAI stream whose upstream sends its choices one after the other, a usage
/// chunk of its own after each (a relay fanning `n` out into n calls): choice 0's text,
/// finish and usage (10 input, 5 output tokens), then choice 1's text (`SECOND` four
/// times), its finish, the usage of both (`BOTH` output tokens) and `[DONE]`. With `stall`
/// the upstream stops after choice 1's text, still generating.
fn choices_one_after_the_other(stall: bool) -> Script {
    let chunk = chunk_event;
    let text = |i: i64, t: &str| {
        chunk(json!([{"index": i, "delta": {"content": t}, "finish_reason": null}]))
    };
    let finish = |i: i64| chunk(json!([{"index": i, "delta": {}, "finish_reason": "stop"}]));
    let usage = |output: i64| {
        SseEvent::Data(
            json!({"id": "c", "object": "chat.completion.chunk", "created": 1,
            "model": "m", "choices": [], "usage": {"prompt_tokens": 10,
            "completion_tokens": output, "total_tokens": 10 + output}}),
        )
    };
    Script {
        events: Some(vec![
            text(0, "The engine "),
            finish(0),
            usage(5),
            text(1, &SECOND.repeat(4)),
            finish(1),
            usage(BOTH),
            SseEvent::Data(json!("[DONE]")),
        ]),
        stall_after: stall.then_some(4),
        ..Default::default()
    }
}

/// Review finding (s18 final #4): an `n` = 2 stream whose upstream sends its choices one
/// after the other, a usage after each, was whole at choice 0's usage. A client that left
/// once choice 1's text had arrived was taken as leaving a whole answer: read on 2 s, then
/// settled whole on choice 0's 5 output tokens, choice 1's text — which the upstream bills
/// — uncounted. A usage after fewer choices started than asked makes the answer whole only
/// at the stream's end: this is a departure, charged the reported input and every choice's
/// text received. Read to its end the stream is charged its last usage, both choices'.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_n_stream_of_choices_one_after_the_other_counts_every_choice() {
    let app = app().await;
    let mut body = body(true);
    body["n"] = json!(2);
    body["stream_options"] = json!({"include_usage": true});
    let counted = sluice::quota::estimate::count_text(&format!("The engine {}", SECOND.repeat(4)));
    assert!(5 < counted && counted < BOTH, "{counted}");

    let (id, token) = app.token("left", Some("1")).await;
    app.mock
        .state
        .script(KEY_A, [choices_one_after_the_other(true)]);
    let mut conn = send_raw(&app, &token, &body).await;
    read_until(&mut conn, "first one's usage").await;
    drop(conn);
    assert_eq!(
        settled_row(&app, id).await,
        (
            Some("client_disconnected".to_string()),
            10,
            counted,
            price(10, counted)
        ),
        "a departure counting both choices' text"
    );

    let (id, token) = app.token("stayed", Some("1")).await;
    app.mock
        .state
        .script(KEY_A, [choices_one_after_the_other(false)]);
    let resp = app.chat(&token, &body).await;
    assert_eq!(resp.status(), 200);
    let (data, whole) = sse_data(resp).await;
    assert!(
        whole && data.last().map(String::as_str) == Some("[DONE]"),
        "{data:?}"
    );
    assert_eq!(
        settled_row(&app, id).await,
        (None, 10, BOTH, price(10, BOTH)),
        "the last usage, both choices'"
    );

    // A server that ignores `n` (Ollama): one choice, its usage, `[DONE]` — whole at its
    // end, charged that usage as reported (the row not marked estimated).
    let (id, token) = app.token("ignored", Some("1")).await;
    let mut script = choices_one_after_the_other(false);
    if let Some(events) = script.events.as_mut() {
        events.drain(3..6);
    }
    app.mock.state.script(KEY_A, [script]);
    let resp = app.chat(&token, &body).await;
    let (data, whole) = sse_data(resp).await;
    assert!(
        whole && data.last().map(String::as_str) == Some("[DONE]"),
        "{data:?}"
    );
    assert_eq!(
        settled_row(&app, id).await,
        (None, 10, 5, price(10, 5)),
        "one choice's usage"
    );
    let estimated =
        format!("SELECT COUNT(*) FROM requests WHERE token_id = {id} AND usage_estimated");
    assert_eq!(app.scalar(&estimated).await, 0);
    app.assert_invariant().await;
}

/// An OpenAI stream: "The engine ", its finish, then — `PAUSE_MS` after it — `fault`, and
/// the body's end: no usage, no `[DONE]`.
fn finished_then_fault(fault: SseEvent) -> Script {
    let chunk = chunk_event;
    let mut events = vec![
        chunk(json!([{"index": 0, "delta": {"content": "The engine "}, "finish_reason": null}])),
        chunk(json!([{"index": 0, "delta": {}, "finish_reason": "stop"}])),
    ];
    events.push(fault);
    Script {
        events: Some(events),
        chunk_delay_ms: PAUSE_MS,
        ..Default::default()
    }
}

/// Review finding (s18 A3): after a client left at the finish, whatever ended the upstream
/// was settled as a whole answer on the estimate (`usage_estimated`, with a document far
/// under the 128 000 reserved), where the same fault with the client still reading is a cut
/// stream (`upstream_error`, the reserved input): the body's end without the usage that was
/// asked for, an unreadable event where the usage belongs, the upstream's error event. Whether
/// the client is still there must not change how an upstream's fault is charged or logged:
/// each row equals its twin's whose client stayed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_fault_after_the_finish_is_charged_alike_whether_the_client_left_or_stayed() {
    let app = app().await;
    let body = document_body(documents()[0].clone());
    let faults = [
        // An empty event (it carries nothing) only puts the end `PAUSE_MS` after the finish:
        // the client's departure is seen first.
        ("the body ends without the usage", SseEvent::Data(json!(""))),
        (
            "an unreadable event where the usage belongs",
            SseEvent::Data(json!("{\"usage\": {\"prompt_tok")),
        ),
        (
            "the upstream's error event",
            SseEvent::Data(
                json!({"error": {"message": "Overloaded", "type": "server_error", "code": null}}),
            ),
        ),
    ];
    let mut differ = Vec::new();
    for (i, (what, fault)) in faults.into_iter().enumerate() {
        // The client reads to the end.
        let (stayed, token) = app.token(&format!("stayed-{i}"), Some("1")).await;
        app.mock
            .state
            .script(KEY_A, [finished_then_fault(fault.clone())]);
        let resp = app.chat(&token, &body).await;
        assert_eq!(resp.status(), 200);
        let (data, _) = sse_data(resp).await;
        assert!(!data.iter().any(|d| d == "[DONE]"), "{what}: {data:?}");
        let stayed = settled_row(&app, stayed).await;
        assert_eq!(
            (stayed.0.as_deref(), stayed.1),
            (Some("upstream_error"), 128_000),
            "{what}: a cut stream, with the client there"
        );
        // The client leaves at the finish, before the fault.
        let (left, token) = app.token(&format!("left-{i}"), Some("1")).await;
        app.mock.state.script(KEY_A, [finished_then_fault(fault)]);
        let mut conn = send_raw(&app, &token, &body).await;
        read_until(&mut conn, "\"finish_reason\":\"stop\"").await;
        drop(conn);
        let left = settled_row(&app, left).await;
        if left != stayed {
            differ.push((what, left, stayed));
        }
    }
    assert!(
        differ.is_empty(),
        "left at the finish, charged otherwise than the client that stayed (what, left, stayed): {differ:#?}"
    );
    app.assert_invariant().await;
}

/// Review finding (s18 B4): on a free model a queued stream whose client left after the
/// upstream had the request gave its token window the input back — the queued path
/// corrected the window to 0 whenever nothing was charged, and a free model charges
/// nothing — while the same stream not queued kept it. Both keep it now: the upstream had
/// the input, whatever it costs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_free_models_departure_keeps_its_input_in_the_token_window_queued_or_not() {
    const TPM: i64 = 1_000;
    for queued in [false, true] {
        let app = spawn_app_with(|s, _| {
            s.queue.max_in_flight = 1;
            s.queue.reserved = sluice::config::ReservedSlots::NONE;
            s.queue.max_wait_seconds = 5;
            s.models[0].price = sluice::config::PriceKeys::default();
            s.models[0].free = true;
        })
        .await;
        let (id, token) = app
            .issue(sluice::cli::IssueArgs {
                budget_usd: Some("1"),
                tpm: Some(TPM),
                ..issue_args("free")
            })
            .await;
        hold_headers(&app);
        let slot = if queued {
            Some(app.state.queue.admit(1, 0).await.expect("the free slot"))
        } else {
            None
        };
        let mut conn = send_raw(&app, &token, &body(true)).await;
        if queued {
            read_until(&mut conn, ": queued position=1").await;
            drop(slot);
        }
        upstream_has_it(&app).await;
        drop(conn);
        let (code, input, _, cost) = settled_row(&app, id).await;
        assert_eq!(
            (code.as_deref(), cost),
            (Some("client_disconnected"), 0),
            "queued: {queued}"
        );
        assert!(input >= 2, "the input the upstream had: {input}");
        // The window's correction is spawned as the departure ends.
        tokio::time::sleep(Duration::from_millis(300)).await;
        // Admitted only if the window had given the departure's input back.
        app.mock.state.sticky(KEY_A, None);
        let resp = app.chat(&token, &chat_body(TPM - input - input / 2)).await;
        assert_eq!(
            resp.status(),
            429,
            "queued: {queued}: {:?}",
            resp.text().await
        );
        app.assert_invariant().await;
    }
}
