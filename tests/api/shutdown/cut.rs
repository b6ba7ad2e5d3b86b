//! Requests the drain ends before their answer is whole — a non-streamed one waiting on
//! its upstream, streams cut after their first chunks — pay what a departure pays: the
//! input reserved for them plus the output they got.

use std::time::{Duration, Instant};

use serde_json::{json, Value};
use sluice::mock::{MockConfig, MockServer, Script};

use super::{
    draining_gateway, exited, held_chat, sigterm, sse_data_counted, until, SHUTDOWN_TIMEOUT_S,
};
use crate::gateway_proc::db_and_token;
use crate::helpers::*;

/// What the two chunks before the stall say.
const BEFORE_THE_STALL: &str = "The engine light blinks ";

/// DESIGN's departure rule at shutdown: a request the upstream had that the drain ends
/// before its answer — non-streamed, the mock holding its headers; streamed, cut after two
/// chunks with no usage yet (the mock stalls), with and without a document — pays exactly
/// the input reserved for it (`Prepared::reserved_input_on`: the counted input without the
/// margin; with a document of unknown size the model's whole input, 128 000) at the
/// route's price, plus the output it got; its one log row says so, the ledger agrees,
/// nothing is absorbed, and the money invariant holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_the_drain_ends_before_their_answer_pay_the_reserved_input() {
    let dir = tempfile::tempdir().unwrap();
    let mock = MockServer::start("127.0.0.1:0", MockConfig::default()).unwrap();
    let mut gateway = draining_gateway(&dir, &mock).await;
    let (db, token) = db_and_token(dir.path(), "drained").await;
    let state = mock.state.clone();
    let seen = |n: u64| {
        let state = state.clone();
        move || state.stats(KEY_A).count == n
    };
    let chunk = |text: &str| {
        sluice::mock::SseEvent::Data(
            json!({"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m",
                "choices": [{"index": 0, "delta": {"content": text}, "finish_reason": null}]}),
        )
    };
    // Each stream: two chunks, then nothing (no usage) — the connection kept.
    let stall = || Script {
        events: Some(vec![
            chunk("The engine "),
            chunk("light blinks "),
            chunk("because"),
            sluice::mock::SseEvent::Data(json!("[DONE]")),
        ]),
        stall_after: Some(2),
        // The second chunk comes later than the fixed 300 ms wait this test once had and the
        // drain's 2 s after it: the signal waits for the clients to have read it.
        chunk_delay_ms: 2_500,
        ..Default::default()
    };
    mock.state.script(KEY_A, [stall()]);
    let http = reqwest::Client::new();
    let mut body = chat_body(100);
    body["stream"] = json!(true);
    let resp = http
        .post(format!("{}/v1/chat/completions", gateway.url))
        .bearer_auth(&token)
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let (streamed, streamed_read) = sse_data_counted(resp);
    until("the stream never started", seen(1)).await;
    // A stream asking about a document by file id: its size unknown, the model's whole
    // input is reserved.
    mock.state.script(KEY_A, [stall()]);
    let document = json!({"model": "gpt-4o-mini", "max_tokens": 100, "stream": true,
        "messages": [{"role": "user", "content": [
            {"type": "file", "file": {"file_id": "file-6F2ksmvXxt4VdoqmHRw6kL"}},
            {"type": "text", "text": "Why does the engine light blink?"}]}]});
    let resp = http
        .post(format!("{}/v1/chat/completions", gateway.url))
        .bearer_auth(&token)
        .json(&document)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let (with_document, document_read) = sse_data_counted(resp);
    until("the document's stream never started", seen(2)).await;
    // The non-streamed request: the mock holds its headers for an hour.
    let waiting = held_chat(&mock, &http, &gateway.url, &token);
    until("the waiting request never reached the upstream", seen(3)).await;
    // The signal comes once both clients have read the streams' two chunks: what they got
    // is what the rows must count (a fixed wait let a loaded machine signal before them).
    until(
        "the streams' two chunks never reached their clients",
        || {
            use std::sync::atomic::Ordering::Acquire;
            streamed_read.load(Acquire) >= 2 && document_read.load(Acquire) >= 2
        },
    )
    .await;

    let sent = Instant::now();
    sigterm(&gateway);
    let bound = Duration::from_secs(SHUTDOWN_TIMEOUT_S + 10);
    let still = format!("still running {bound:?} after SIGTERM");
    let status = exited(&mut gateway, sent + bound, &still).await;
    assert!(status.success(), "{status:?}");
    assert!(
        sent.elapsed() >= Duration::from_secs(SHUTDOWN_TIMEOUT_S),
        "the drain deadline passed first"
    );

    for stream in [streamed, with_document] {
        let (data, _) = tokio::time::timeout(Duration::from_secs(10), stream)
            .await
            .expect("the stream ended")
            .unwrap();
        let last: Value = serde_json::from_str(data.last().unwrap()).unwrap();
        assert_eq!(last["error"]["code"], "shutting_down", "{last}");
        assert_eq!(reassemble(&data[..data.len() - 1]), BEFORE_THE_STALL);
    }
    let (code, body) = tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .expect("the waiting request was answered")
        .unwrap();
    assert_eq!(
        (code, &body["error"]["code"]),
        (503, &json!("shutting_down")),
        "{body}"
    );

    // The input reserved for `chat_body`, without the margin, at the route's prices.
    let reserved =
        sluice::quota::estimate::chat_input(chat_body(100)["messages"].as_array().unwrap(), None);
    let got = sluice::quota::estimate::count_text(BEFORE_THE_STALL);
    let price =
        |input: i64, output: i64| (input * 150_000 + output * 600_000 + 999_999) / 1_000_000;
    let rows: Vec<(String, i64, Option<String>, i64, i64, i64)> = sql_rows(
        &db,
        "SELECT id, status, error_code, input_tokens, output_tokens, cost_micros FROM requests \
         ORDER BY input_tokens, status",
    )
    .await;
    let want = [
        (200, reserved, got, price(reserved, got)),
        (503, reserved, 0, price(reserved, 0)),
        (200, 128_000, got, price(128_000, got)),
    ];
    assert_eq!(rows.len(), 3, "{rows:?}");
    for (row, (status, input, output, cost)) in rows.iter().zip(want) {
        let (id, st, code, i, o, c) = row;
        assert_eq!(
            (*st, code.as_deref(), *i, *o, *c),
            (status, Some("shutting_down"), input, output, cost),
            "{rows:?}"
        );
        // The ledger charged the request exactly that, nothing absorbed.
        let ledger: Vec<(String, i64)> = sql_rows(
            &db,
            &format!(
                "SELECT kind, CAST(SUM(amount_micros) AS BIGINT) FROM ledger \
                 WHERE request_id = '{id}' GROUP BY kind ORDER BY kind"
            ),
        )
        .await;
        let charged: i64 = ledger
            .iter()
            .filter(|(k, _)| k == "reserve" || k == "settle")
            .map(|(_, a)| a)
            .sum();
        assert_eq!(charged, cost, "{id}: {ledger:?}");
        assert!(
            ledger.iter().all(|(k, _)| k == "reserve" || k == "settle"),
            "{id}: nothing absorbed or orphaned: {ledger:?}"
        );
    }
    assert_invariant_on(&db).await;
    assert_eq!(scalar_on(&db, "SELECT COUNT(*) FROM reservations").await, 0);
    assert_eq!(
        scalar_on(&db, "SELECT limit_micros - remaining_micros FROM tokens").await,
        want.iter().map(|w| w.3).sum::<i64>()
    );
}
