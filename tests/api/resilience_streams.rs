//! A stream's key is judged when the stream ends, not at its 200 (s26 attack, streams F2):
//! its breaker and its rest see a stream that fails after its 200, a half-open probe that
//! is a stream holds its slot until its end, and only the upstream's own faults count.

use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};
use sluice::config::Settings;
use sluice::mock::{MockServer, Script, SseEvent};
use sluice::upstream::breaker::State;

use crate::helpers::*;
use crate::resilience::open_key_a_breaker;

/// How long a request may take before the test calls it hung: it only turns a hang into a
/// failure.
const BOUND: Duration = Duration::from_secs(10);

/// A streamed chat request to gpt-4o-mini.
fn stream_body() -> Value {
    let mut body = chat_body(50);
    body["stream"] = json!(true);
    body
}

/// A streamed Messages request to claude.
pub(crate) fn claude_stream_body() -> Value {
    json!({"model": "claude", "max_tokens": 20, "stream": true,
        "messages": [{"role": "user", "content": "hi"}]})
}

/// An Anthropic stream that starts, then ends on the upstream's error event of `kind`.
pub(crate) fn anthropic_error(kind: &str) -> Script {
    Script {
        events: Some(
            serde_json::from_value(json!([
                ["message_start", {"type": "message_start", "message": {"id": "msg_s",
                    "type": "message", "role": "assistant", "model": "m", "content": [],
                    "stop_reason": null, "stop_sequence": null,
                    "usage": {"input_tokens": 5, "output_tokens": 1}}}],
                ["error", {"type": "error", "error": {"type": kind, "message": "no"}}]
            ]))
            .unwrap(),
        ),
        ..Default::default()
    }
}

/// An OpenAI stream that ends on the upstream's error chunk of `kind`.
fn openai_error(kind: &str) -> Script {
    Script {
        events: Some(vec![SseEvent::Data(
            json!({"error": {"message": "no", "type": kind}}),
        )]),
        ..Default::default()
    }
}

/// The gateway with `tweak` applied, its breakers half-open a second after they open and
/// closed by one success, and a token of its user "fay".
async fn probing_app(tweak: impl FnOnce(&mut Settings, &MockServer)) -> (TestApp, String) {
    let app = spawn_app_with(|s, m| {
        s.breaker.open_seconds = 1;
        s.breaker.close_after_successes = 1;
        tweak(s, m);
    })
    .await;
    let (_, token) = app.token("fay", None).await;
    (app, token)
}

/// Puts breaker `d` half-open: three failures open it, its open time (1 s in these tests'
/// settings) goes by.
async fn half_open(app: &TestApp, d: usize) {
    for _ in 0..3 {
        app.state.pool().breakers[d].failure(false);
    }
    assert_eq!(app.state.pool().breakers[d].state(), State::Open);
    tokio::time::sleep(Duration::from_millis(1100)).await;
}

/// Key A's streams fail after their 200 — its own error event, a stall past the idle
/// timeout, a broken body — in turn; each is read to its end.
async fn fail_three_streams_on_key_a(app: &TestApp, token: &str) {
    let stall = Script {
        stall_after: Some(2),
        ..Default::default()
    };
    let cut = Script {
        cut_after: Some(2),
        ..Default::default()
    };
    for script in [openai_error("server_error"), stall, cut] {
        app.mock.state.sticky(KEY_A, Some(script));
        let resp = tokio::time::timeout(BOUND, app.chat(token, &stream_body()))
            .await
            .expect("answered");
        assert_eq!(resp.status(), 200);
        let (data, _) = sse_data(resp).await;
        assert_ne!(data.last().map(String::as_str), Some("[DONE]"), "{data:?}");
    }
}

/// A stream that fails after its 200 is a failure of its key's breaker, as a 500 before it
/// would be: three open it, and the next request is answered at once without the key.
/// Before, the 200 counted as the key's success and the breaker never saw the failure.
#[tokio::test]
async fn streams_that_fail_after_their_200_open_the_breaker() {
    let app = spawn_app_with(|s, _| {
        s.breaker.open_seconds = 3600;
        s.upstream.stream_idle_timeout_ms = 300;
    })
    .await;
    let (_, token) = app.token("fay", None).await;
    fail_three_streams_on_key_a(&app, &token).await;
    assert_eq!(app.state.pool().breakers[0].state(), State::Open);
    let resp = tokio::time::timeout(BOUND, app.chat(&token, &stream_body()))
        .await
        .expect("answered at once");
    assert_eq!(resp.status(), 503);
    let v: Value = resp.json().await.unwrap();
    assert_eq!(v["error"]["code"], "service_degraded");
    assert_eq!(app.mock.state.stats(KEY_A).count, 3, "no call while open");
}

/// A half-open breaker's probe that is a stream counts once the stream is whole: one that
/// fails after its 200 re-opens the breaker, a whole one closes it. Before, the probe's 200
/// closed the breaker whatever the stream did next.
#[tokio::test]
async fn a_streamed_probe_counts_once_its_stream_is_whole() {
    let (app, token) = probing_app(|s, _| s.upstream.stream_idle_timeout_ms = 300).await;
    open_key_a_breaker(&app, &token).await;
    tokio::time::sleep(Duration::from_millis(1100)).await;
    app.mock.state.sticky(
        KEY_A,
        Some(Script {
            cut_after: Some(2),
            ..Default::default()
        }),
    );
    let (data, _) = sse_data(app.chat(&token, &stream_body()).await).await;
    assert_ne!(data.last().map(String::as_str), Some("[DONE]"));
    assert_eq!(
        app.state.pool().breakers[0].state(),
        State::Open,
        "the probe's stream broke: open again"
    );
    tokio::time::sleep(Duration::from_millis(1100)).await;
    app.mock.state.sticky(KEY_A, None);
    let (data, _) = sse_data(app.chat(&token, &stream_body()).await).await;
    assert_eq!(data.last().map(String::as_str), Some("[DONE]"));
    assert_eq!(app.state.pool().breakers[0].state(), State::Closed);
}

/// A half-open breaker's probe that is a stream holds its slot while it streams, as a
/// probe waiting on its answer does, up to `half_open_max_wait_seconds`: meanwhile the next
/// request is kept off the key (503 at once, no call); past it a healthy stream making
/// progress is no hung probe, but frees its slot for another; whole, it closes the
/// breaker. (s26 stop attack #1: a probe that freed its slot at its 200 let a half-open key
/// admit probe after probe, and the hung-probe rule never saw them.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streamed_probe_holds_its_slot_up_to_the_maximum_wait() {
    let (app, token) = probing_app(|s, _| s.breaker.half_open_max_wait_seconds = 1).await;
    let app = Arc::new(app);
    open_key_a_breaker(&app, &token).await;
    tokio::time::sleep(Duration::from_millis(1100)).await;
    // A healthy stream of about 3 s: twelve words, a chunk every 250 ms.
    app.mock.state.sticky(
        KEY_A,
        Some(Script {
            text: Some("one two three four five six seven eight nine ten eleven twelve".into()),
            chunk_delay_ms: 250,
            ..Default::default()
        }),
    );
    let probe = {
        let (app, token) = (app.clone(), token.clone());
        tokio::spawn(async move {
            let resp = app.chat(&token, &stream_body()).await;
            assert_eq!(resp.status(), 200);
            sse_data(resp).await.0
        })
    };
    let bound = std::time::Instant::now() + BOUND;
    while app.mock.state.stats(KEY_A).in_flight == 0 {
        assert!(
            std::time::Instant::now() < bound,
            "the probe never streamed"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // At once, then later within the probe's maximum wait: it streams on, its slot held.
    for pause in [300, 300] {
        let resp = tokio::time::timeout(BOUND, app.chat(&token, &stream_body()))
            .await
            .expect("answered at once");
        assert_eq!(
            resp.status(),
            503,
            "one probe at a time, also while it streams"
        );
        assert_eq!(app.state.pool().breakers[0].state(), State::HalfOpen);
        tokio::time::sleep(Duration::from_millis(pause)).await;
    }
    assert_eq!(
        app.mock.state.stats(KEY_A).count,
        4,
        "no call beside the probe"
    );
    // Past the maximum wait, streaming on, its slot is freed for another probe: held to its
    // end, a client reading a long answer slowly kept the key half-open — every other
    // request refused — for as long as it read (s27 diff attack F1).
    // The second probe ends at once on the client's own error, no verdict on the key: the
    // breaker stays half-open until the first stream's end, so it is the first that closes it.
    tokio::time::sleep(Duration::from_millis(700)).await;
    app.mock
        .state
        .sticky(KEY_A, Some(openai_error("invalid_request_error")));
    let second = tokio::time::timeout(BOUND, app.chat(&token, &stream_body()))
        .await
        .expect("answered");
    assert_eq!(second.status(), 200, "a second probe past the maximum wait");
    let (second, _) = sse_data(second).await;
    assert_ne!(second.last().map(String::as_str), Some("[DONE]"));
    assert_eq!(
        app.mock.state.stats(KEY_A).count,
        5,
        "the second probe called"
    );
    assert_eq!(
        app.state.pool().breakers[0].state(),
        State::HalfOpen,
        "the first stream still runs"
    );
    let data = tokio::time::timeout(BOUND, probe)
        .await
        .expect("the probe's stream ends")
        .unwrap();
    assert_eq!(
        data.len(),
        15,
        "the role, twelve words, the finish, [DONE]: {data:?}"
    );
    assert_eq!(data.last().map(String::as_str), Some("[DONE]"), "{data:?}");
    assert_eq!(
        app.state.pool().breakers[0].state(),
        State::Closed,
        "the first, whole stream closes it"
    );
}

/// Only the upstream's own faults judge its key: an error event of any other kind — the
/// client's (`invalid_request_error`), its account's (`billing_error`,
/// `insufficient_quota`, `authentication_error`, `permission_error`), one the gateway does
/// not know — gives its key no verdict: a half-open breaker stays half-open, its probe slot
/// freed, the key neither rested nor disabled. (s26 stop attack #2: Anthropic's unknown
/// types read as `invalid_request_error`, which counted as the key's success and closed
/// the breaker; an OpenAI type unknown read as a server error.)
#[tokio::test]
async fn an_error_event_not_the_upstreams_own_fault_gives_no_verdict() {
    let (app, token) = probing_app(add_claude).await;
    let c = app.state.catalog().position("c").unwrap();
    half_open(&app, 0).await;
    half_open(&app, c).await;
    let openai = [
        "invalid_request_error",
        "insufficient_quota",
        "a_kind_not_yet_known",
    ];
    let anthropic = [
        "invalid_request_error",
        "billing_error",
        "authentication_error",
        "permission_error",
        "not_found_error",
        "request_too_large",
        "a_kind_not_yet_known",
    ];
    let cases = openai
        .iter()
        .map(|k| (0, KEY_A, openai_error(k), *k))
        .chain(anthropic.iter().map(|k| (c, KEY_B, anthropic_error(k), *k)));
    for (d, key, script, kind) in cases {
        app.mock.state.sticky(key, Some(script));
        let resp = if d == 0 {
            app.chat(&token, &stream_body()).await
        } else {
            app.messages(&token, &claude_stream_body()).await
        };
        assert_eq!(resp.status(), 200, "{kind}: the probe goes out");
        let text = tokio::time::timeout(BOUND, resp.text())
            .await
            .expect("the stream ends")
            .unwrap();
        assert!(text.contains(kind), "{kind}: {text}");
        let pool = app.state.pool();
        assert_eq!(pool.breakers[d].state(), State::HalfOpen, "{kind}");
        assert!(!pool.is_disabled(d), "{kind}: not disabled");
        let now = app.state.clock.monotonic_ms();
        assert_eq!(pool.cooling_ms(d, now), 0, "{kind}: not rested");
    }
    app.mock.state.sticky(KEY_A, None);
    let (data, _) = sse_data(app.chat(&token, &stream_body()).await).await;
    assert_eq!(data.last().map(String::as_str), Some("[DONE]"));
    assert_eq!(app.state.pool().breakers[0].state(), State::Closed);
}

/// Anthropic's mid-stream `rate_limit_error` rests the key as a 429 would, its
/// `overloaded_error` as a 529 would and counts toward its breaker: the next request
/// finds nothing to serve it and is answered 503 at once, without the upstream; three
/// overloaded streams open the breaker, three rate-limited ones do not. Before, the key
/// stayed in the pool and every stream kept landing on it.
#[tokio::test]
async fn fault_error_events_rest_the_key_as_their_status_would() {
    let app = spawn_app_with(add_claude).await;
    let (_, token) = app.token("fay", None).await;
    let c = app.state.catalog().position("c").unwrap();
    let mut calls = 0;
    for (kind, opens) in [("rate_limit_error", false), ("overloaded_error", true)] {
        app.mock.state.sticky(KEY_B, Some(anthropic_error(kind)));
        for _ in 0..3 {
            app.rest_no_more("c");
            let resp = app.messages(&token, &claude_stream_body()).await;
            assert_eq!(resp.status(), 200);
            let text = resp.text().await.unwrap();
            assert!(text.contains(kind), "{text}");
            calls += 1;
            let now = app.state.clock.monotonic_ms();
            assert!(
                app.state.pool().cooling_ms(c, now) > 0,
                "{kind}: the key rests"
            );
            let resp = tokio::time::timeout(BOUND, app.messages(&token, &claude_stream_body()))
                .await
                .expect("answered at once");
            assert_eq!(resp.status(), 503, "{kind}");
            assert_eq!(
                app.mock.state.stats(KEY_B).count,
                calls,
                "no call while it rests"
            );
        }
        let open = app.state.pool().breakers[c].state() == State::Open;
        assert_eq!(open, opens, "{kind}");
    }
}

/// An OpenAI stream whose answer is whole — its finish came — and whose server then sends
/// neither the usage asked for nor `[DONE]`, its body just ending.
fn finished_then_ended() -> Script {
    let chunk = |delta: Value, finish: Value| {
        SseEvent::Data(
            json!({"id": "c", "object": "chat.completion.chunk", "created": 1,
            "model": "m", "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}),
        )
    };
    Script {
        events: Some(vec![
            chunk(
                json!({"role": "assistant", "content": "Hello"}),
                Value::Null,
            ),
            chunk(json!({}), json!("stop")),
        ]),
        ..Default::default()
    }
}

/// Once the answer is whole (its finish), the stream is its key's success whatever follows:
/// a server that sends no usage or no `[DONE]` after the finish keeps its key — its probe
/// closes a half-open breaker, and stream after stream of it never opens one. (s26 stop
/// attack #5: a fault after the finish counted as a failure, and such a server's key opened
/// every three streams.) The charge is the stream's as before (`upstream_error`).
#[tokio::test]
async fn a_fault_after_the_finish_leaves_the_stream_its_keys_success() {
    let (app, token) = probing_app(|_, _| {}).await;
    app.mock.state.sticky(KEY_A, Some(finished_then_ended()));
    half_open(&app, 0).await;
    for n in 1..=4 {
        let resp = tokio::time::timeout(BOUND, app.chat(&token, &stream_body()))
            .await
            .expect("answered");
        assert_eq!(resp.status(), 200, "stream {n}");
        let (data, _) = sse_data(resp).await;
        assert!(data.iter().any(|d| d.contains("Hello")), "{data:?}");
        assert_eq!(
            app.state.pool().breakers[0].state(),
            State::Closed,
            "stream {n}"
        );
    }
    assert_eq!(app.mock.state.stats(KEY_A).count, 4);
    app.wait_for_log_rows(4).await;
    app.assert_invariant().await;
}

/// The Gemini key of `gemini_app`.
const GEMINI_KEY: &str = "sk-upstream-resilience-gemini";

/// The Bedrock access key of `gemini_app`.
const BEDROCK_KEY: &str = "AKIDRESILIENCESTREAMS";

/// The gateway with a Gemini model `gem` (upstream `g`) and a Bedrock model `bed`
/// (upstream `br`) beside the OpenAI `gpt-4o-mini`, its breakers open an hour, and a token
/// of its user "fay".
async fn gemini_app() -> (TestApp, String) {
    let app = spawn_app_with(|s, m| {
        s.breaker.open_seconds = 3600;
        s.upstreams.extend([
            native_upstream(sluice::config::Provider::Gemini, "g", GEMINI_KEY, m),
            bedrock_upstream("br", BEDROCK_KEY, m),
        ]);
        s.models
            .extend([model("gem", &["g"]), model("bed", &["br"])]);
    })
    .await;
    let (_, token) = app.token("fay", None).await;
    (app, token)
}

/// A streamed chat request to `model`.
fn stream_to(model: &str) -> Value {
    let mut body = stream_body();
    body["model"] = json!(model);
    body
}

/// A Gemini chunk of the answer's text, unfinished.
fn gemini_text(text: &str) -> Value {
    json!({"candidates": [{"content": {"role": "model", "parts": [{"text": text}]},
        "index": 0}], "responseId": "r1", "modelVersion": "gem-upstream"})
}

/// A Gemini stream that sends a piece of text, then `then`.
fn gemini_then(then: Value) -> Script {
    Script {
        events: Some(vec![
            SseEvent::Data(gemini_text("Hello")),
            SseEvent::Data(then),
        ]),
        ..Default::default()
    }
}

/// Streams `model` once, reads it to its end and returns its text: a 200 whose stream
/// ended on an error event, not `[DONE]`.
async fn failed_stream(app: &TestApp, token: &str, model: &str) -> String {
    let resp = tokio::time::timeout(BOUND, app.chat(token, &stream_to(model)))
        .await
        .expect("answered");
    assert_eq!(resp.status(), 200);
    let text = tokio::time::timeout(BOUND, resp.text())
        .await
        .expect("the stream ends")
        .unwrap();
    assert!(text.contains("Hello"), "{text}");
    assert!(!text.contains("[DONE]"), "{text}");
    text
}

/// A Gemini stream that fails mid-way with Google's `UNAVAILABLE` is its key's overload,
/// as a 503 before the 200 would be: the key rests, and three such streams open its
/// breaker — the next request is answered 503 at once, without the key. Before, the
/// Gemini reader's error event named no fault (only the OpenAI, Anthropic and Responses
/// paths did): the stream gave no verdict, and a key failing every stream after its 200
/// was neither rested nor opened (s28 diff attack F2).
#[tokio::test]
async fn a_gemini_stream_failing_mid_way_with_unavailable_opens_its_key() {
    let (app, token) = gemini_app().await;
    let g = app.state.catalog().position("g").unwrap();
    let unavailable = json!({"error": {"code": 503, "status": "UNAVAILABLE",
        "message": "The model is overloaded."}});
    app.mock
        .state
        .sticky(GEMINI_KEY, Some(gemini_then(unavailable)));
    for n in 1..=3 {
        app.rest_no_more("g");
        let text = failed_stream(&app, &token, "gem").await;
        assert!(text.contains("The model is overloaded."), "{text}");
        let now = app.state.clock.monotonic_ms();
        assert!(app.state.pool().cooling_ms(g, now) > 0, "stream {n}: rests");
    }
    assert_eq!(app.state.pool().breakers[g].state(), State::Open);
    app.rest_no_more("g");
    let resp = tokio::time::timeout(BOUND, app.chat(&token, &stream_to("gem")))
        .await
        .expect("answered at once");
    assert_eq!(resp.status(), 503);
    assert_eq!(
        app.mock.state.stats(GEMINI_KEY).count,
        3,
        "no call while open"
    );
}

/// Bedrock's mid-stream `throttlingException` is its key's rate limit, as a 429 before the
/// 200 would be: the key rests after one, and the next request is answered 503 at once,
/// without it (its breaker not counting it). Before, the stream gave no verdict and the
/// next request landed on the throttled key again (s28 diff attack F2).
#[tokio::test]
async fn a_bedrock_throttling_exception_mid_stream_rests_its_key() {
    let (app, token) = gemini_app().await;
    let br = app.state.catalog().position("br").unwrap();
    let events = serde_json::from_value(json!([
        ["messageStart", {"role": "assistant"}],
        ["contentBlockDelta", {"contentBlockIndex": 0, "delta": {"text": "Hello"}}],
        ["throttlingException", {"message": "Too many requests, please wait."}]
    ]))
    .unwrap();
    app.mock.state.sticky(
        BEDROCK_KEY,
        Some(Script {
            events: Some(events),
            ..Default::default()
        }),
    );
    let text = failed_stream(&app, &token, "bed").await;
    assert!(text.contains("Too many requests"), "{text}");
    let now = app.state.clock.monotonic_ms();
    assert!(app.state.pool().cooling_ms(br, now) > 0, "the key rests");
    assert_eq!(app.state.pool().breakers[br].state(), State::Closed);
    let resp = tokio::time::timeout(BOUND, app.chat(&token, &stream_to("bed")))
        .await
        .expect("answered at once");
    assert_eq!(resp.status(), 503);
    assert_eq!(
        app.mock.state.stats(BEDROCK_KEY).count,
        1,
        "no call while it rests"
    );
}

/// A Gemini image part (`inlineData`): a well-formed piece of an answer the gateway's
/// reader does not model.
fn inline_image() -> Value {
    json!({"candidates": [{"content": {"role": "model", "parts": [{"inlineData":
        {"mimeType": "image/png", "data": "iVBORw0KGgo="}}]}, "index": 0}],
        "responseId": "r1", "modelVersion": "gem-upstream"})
}

/// A stream holding a part the gateway does not model (a Gemini image) ends the client's
/// stream with the gateway's error event, as before, but is no failure of its key: the
/// upstream answered well, only the gateway cannot read it. Three such streams leave the
/// breaker closed and the key unrested, and a fourth request is served by the same key;
/// each is charged as a stream the gateway ended. Before, each counted as the key's server
/// failure: three cheap requests by any token opened a shared key's breaker for every
/// model on it (s28 diff attack F1).
#[tokio::test]
async fn a_stream_the_gateway_cannot_read_is_no_failure_of_its_key() {
    let (app, token) = gemini_app().await;
    let g = app.state.catalog().position("g").unwrap();
    app.mock
        .state
        .sticky(GEMINI_KEY, Some(gemini_then(inline_image())));
    for n in 1..=3 {
        let text = failed_stream(&app, &token, "gem").await;
        assert!(text.contains("upstream_error"), "{text}");
        assert_eq!(
            app.state.pool().breakers[g].state(),
            State::Closed,
            "stream {n}"
        );
        let now = app.state.clock.monotonic_ms();
        assert_eq!(app.state.pool().cooling_ms(g, now), 0, "stream {n}");
    }
    app.mock.state.sticky(GEMINI_KEY, None);
    let (data, _) = sse_data(app.chat(&token, &stream_to("gem")).await).await;
    assert_eq!(data.last().map(String::as_str), Some("[DONE]"), "{data:?}");
    assert_eq!(app.mock.state.stats(GEMINI_KEY).count, 4);
    app.wait_for_log_rows(4).await;
    app.assert_invariant().await;
}

/// The non-streamed twin: an answer holding a part the gateway does not model is not
/// relayed (the next route is tried; with none, a 502), but it is no failure of its key:
/// three leave the breaker closed, and the key serves the next request. Before, each was
/// garbage, a server failure: three opened the breaker (s28 diff attack F1).
#[tokio::test]
async fn an_answer_the_gateway_cannot_read_is_no_failure_of_its_key() {
    let (app, token) = gemini_app().await;
    let g = app.state.catalog().position("g").unwrap();
    let mut answer = inline_image();
    answer["candidates"][0]["finishReason"] = json!("STOP");
    answer["usageMetadata"] = json!({"promptTokenCount": 5, "candidatesTokenCount": 3,
        "totalTokenCount": 8});
    app.mock.state.sticky(
        GEMINI_KEY,
        Some(Script {
            body: Some(answer),
            ..Default::default()
        }),
    );
    let mut body = chat_body(50);
    body["model"] = json!("gem");
    for n in 1..=3 {
        let resp = app.chat(&token, &body).await;
        assert_eq!(resp.status(), 502, "answer {n}");
        assert_eq!(
            app.state.pool().breakers[g].state(),
            State::Closed,
            "answer {n}"
        );
    }
    app.mock.state.sticky(GEMINI_KEY, None);
    let resp = app.chat(&token, &body).await;
    assert_eq!(resp.status(), 200);
    assert_eq!(app.mock.state.stats(GEMINI_KEY).count, 4);
}
