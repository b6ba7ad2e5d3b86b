//! Streams: byte-faithful forwarding, the usage chunk, cuts, stalls and disconnects, and
//! how each is charged.

use std::time::Duration;

use futures_util::StreamExt;
use serde_json::{json, Value};
use sluice::mock::Script;
use sluice::quota::{estimate, pricing};
use sluice::usage::Usage;

use crate::helpers::*;

/// How long a stream may take before the test calls it hung: no test here waits on it, it
/// only turns a hang into a failure. Every wait a test must rule out is made far longer.
const BOUND: Duration = Duration::from_secs(10);

fn stream_body(include_usage: bool) -> Value {
    let mut b = json!({"model": "gpt-4o-mini", "stream": true, "max_tokens": 100,
        "messages": [{"role": "user", "content": "Why does the engine light blink?"}]});
    if include_usage {
        b["stream_options"] = json!({"include_usage": true});
    }
    b
}

fn mock_text() -> String {
    sluice::mock::MockConfig::default().text
}

#[tokio::test]
async fn a_stream_arrives_whole_and_usage_only_when_asked() {
    let app = spawn_app().await;
    let (_, token) = app.token("alice", Some("1")).await;
    let resp = app.chat(&token, &stream_body(false)).await;
    assert_eq!(resp.status(), 200);
    assert_eq!(
        resp.headers().get("content-type").unwrap(),
        "text/event-stream"
    );
    assert!(resp
        .headers()
        .get("x-sluice-budget-remaining-usd")
        .is_some());
    let (data, ok) = sse_data(resp).await;
    assert!(ok);
    assert_eq!(reassemble(&data), mock_text());
    assert_eq!(data.last().unwrap(), "[DONE]");
    assert!(
        !data.iter().any(|d| d.contains("\"usage\"")),
        "usage chunk removed when not asked for"
    );
    let sent = &app.mock.state.stats(KEY_A).last_bodies[0];
    assert_eq!(
        sent["stream_options"]["include_usage"], true,
        "usage is always asked of the upstream"
    );

    let (data, _) = sse_data(app.chat(&token, &stream_body(true)).await).await;
    let usage: Value = serde_json::from_str(&data[data.len() - 2]).unwrap();
    assert_eq!(usage["usage"]["prompt_tokens"], 12);
    assert_eq!(usage["usage"]["completion_tokens"], 24);
    app.assert_invariant().await;
}

#[tokio::test]
async fn streamed_non_streamed_and_aliased_cost_the_same() {
    let app = spawn_app().await;
    let (id, token) = app.token("bob", Some("1")).await;
    let mut spent = Vec::new();
    let mut last = 1_000_000;
    for body in [chat_body(100), stream_body(false), {
        let mut b = chat_body(100);
        b["model"] = json!("mini");
        b
    }] {
        let resp = app.chat(&token, &body).await;
        assert_eq!(resp.status(), 200);
        let _ = resp.bytes().await;
        app.wait_settled().await;
        let now = app
            .scalar(&format!(
                "SELECT remaining_micros FROM tokens WHERE id = {id}"
            ))
            .await;
        spent.push(last - now);
        last = now;
    }
    assert!(spent[0] > 0);
    assert!(spent.iter().all(|s| *s == spent[0]), "{spent:?}");
    app.assert_invariant().await;
}

#[tokio::test]
async fn a_cut_stream_ends_in_an_error_and_is_charged_for_what_was_produced() {
    let app = spawn_app().await;
    let (id, token) = app.token("carol", Some("1")).await;
    app.mock.state.script(
        KEY_A,
        [Script {
            cut_after: Some(10),
            ..Default::default()
        }],
    );
    let resp = app.chat(&token, &stream_body(true)).await;
    assert_eq!(resp.status(), 200);
    let (data, _) = sse_data(resp).await;
    assert_ne!(data.last().map(String::as_str), Some("[DONE]"));
    let last: Value = serde_json::from_str(data.last().unwrap()).unwrap();
    assert_eq!(last["error"]["code"], "upstream_error");
    let received = reassemble(&data);
    let pieces: String = mock_text().split_inclusive(' ').take(10).collect();
    assert_eq!(received, pieces);
    app.wait_settled().await;
    let input = estimate::chat_input(
        &[json!({"role": "user", "content": "Why does the engine light blink?"})],
        None,
    );
    let want = pricing::cost(
        Usage {
            input,
            output: estimate::count_text(&received),
            ..Default::default()
        },
        pricing::Prices::plain(150_000, 600_000),
    );
    assert_eq!(
        app.scalar(&format!(
            "SELECT 1000000 - remaining_micros FROM tokens WHERE id = {id}"
        ))
        .await,
        want
    );
    app.assert_invariant().await;

    // A stream whose usage says 0 is charged 0.
    app.mock.state.script(
        KEY_A,
        [Script {
            prompt_tokens: Some(0),
            completion_tokens: Some(0),
            ..Default::default()
        }],
    );
    let before = app
        .scalar(&format!(
            "SELECT remaining_micros FROM tokens WHERE id = {id}"
        ))
        .await;
    let _ = sse_data(app.chat(&token, &stream_body(false)).await).await;
    app.wait_settled().await;
    assert_eq!(
        app.scalar(&format!(
            "SELECT remaining_micros FROM tokens WHERE id = {id}"
        ))
        .await,
        before
    );
}

#[tokio::test]
async fn a_client_that_leaves_mid_stream_is_charged_for_what_it_got_and_the_upstream_is_closed() {
    let app = spawn_app().await;
    let (id, token) = app.token("dave", Some("1")).await;
    app.mock.state.script(
        KEY_A,
        [Script {
            chunk_delay_ms: 100,
            ..Default::default()
        }],
    );
    let resp = app.chat(&token, &stream_body(false)).await;
    let mut body = resp.bytes_stream();
    let mut got = String::new();
    let mut chunks = 0;
    while chunks < 5 {
        let bytes = body.next().await.unwrap().unwrap();
        got.push_str(&String::from_utf8_lossy(&bytes));
        chunks = got.matches("\"content\"").count();
    }
    assert_eq!(
        established_to(app.mock.port),
        1,
        "the upstream connection, seen while it is open"
    );
    drop(body);
    for _ in 0..100 {
        if app.scalar("SELECT COUNT(*) FROM reservations").await == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    app.assert_invariant().await;
    assert_eq!(
        app.scalar("SELECT COUNT(*) FROM ledger WHERE kind = 'settle'")
            .await,
        1
    );
    let charged = app
        .scalar(&format!(
            "SELECT 1000000 - remaining_micros FROM tokens WHERE id = {id}"
        ))
        .await;
    // Exactly DESIGN's rule: the counted input plus the tokenizer's count of the deltas the
    // gateway received — the 4 text pieces the client read (the first of its 5 chunks
    // carries only the role), or the one or two more the pump had taken before it saw the
    // client go; never the whole answer.
    let input = estimate::chat_input(
        &[json!({"role": "user", "content": "Why does the engine light blink?"})],
        None,
    );
    let prices = pricing::Prices::plain(150_000, 600_000);
    let pieces = sluice::mock::pieces(&sluice::mock::MockConfig::default().text);
    let counted = |k: usize| estimate::count_text(&pieces[..k].concat());
    app.wait_for_log_rows(1).await;
    let output = app.scalar("SELECT output_tokens FROM requests").await;
    let received = (4..=7)
        .find(|&k| counted(k) == output)
        .unwrap_or_else(|| panic!("{output} output tokens are not the count of 4..=7 pieces"));
    let expected = pricing::cost(
        Usage {
            input,
            output: counted(received),
            ..Default::default()
        },
        prices,
    );
    assert_eq!(charged, expected, "input + the {received} pieces received");
    // The mock had 45 more chunks to send, 100 ms apart: only the gateway closing the
    // connection ends its answer before that.
    upstream_closed(&app).await;
}

#[tokio::test]
async fn a_stalled_stream_is_ended_by_the_idle_timeout() {
    let app = spawn_app_with(|s, _| s.upstream.stream_idle_timeout_ms = 500).await;
    let (_, token) = app.token("erin", Some("1")).await;
    app.mock.state.script(
        KEY_A,
        [Script {
            stall_after: Some(3),
            ..Default::default()
        }],
    );
    let (data, _) =
        tokio::time::timeout(BOUND, sse_data(app.chat(&token, &stream_body(false)).await))
            .await
            .expect("the stalled stream was ended by the gateway");
    let pieces = sluice::mock::pieces(&mock_text());
    assert_eq!(reassemble(&data), pieces[..3].concat(), "the 3 chunks sent");
    let last: Value = serde_json::from_str(data.last().unwrap()).unwrap();
    assert_eq!(last["error"]["code"], "upstream_error");
    assert_eq!(
        last["error"]["message"],
        "The upstream stopped sending; the stream was ended by the gateway."
    );
    upstream_closed(&app).await;
    app.assert_invariant().await;
}

/// The mock holds its headers for an hour: the 502 can only come from the first-byte
/// timeout, and the mock's answer only ends early because the gateway closed the connection.
#[tokio::test]
async fn headers_held_past_the_first_byte_timeout_cost_nothing() {
    let app = spawn_app_with(|s, _| s.upstream.first_byte_timeout_ms = 300).await;
    let (id, token) = app.token("fay", Some("1")).await;
    app.mock.state.sticky(
        KEY_A,
        Some(Script {
            delay_ms: 3_600_000,
            ..Default::default()
        }),
    );
    let resp = tokio::time::timeout(BOUND, app.chat(&token, &stream_body(false)))
        .await
        .expect("the client got an answer before the upstream's headers");
    assert_eq!(resp.status(), 502);
    let v: Value = resp.json().await.unwrap();
    assert_eq!(v["error"]["code"], "upstream_error");
    assert_eq!(app.mock.state.stats(KEY_A).count, 1, "not retried");
    upstream_closed(&app).await;
    app.assert_invariant().await;
    assert_eq!(
        app.scalar(&format!(
            "SELECT remaining_micros FROM tokens WHERE id = {id}"
        ))
        .await,
        1_000_000
    );
}
