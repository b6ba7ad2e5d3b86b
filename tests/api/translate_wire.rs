//! Golden wire tests of the translation, end to end: a client request goes through the real
//! gateway to `sluice mock`, scripted to answer as the upstream would, and what the client
//! receives (and what the upstream was sent) is compared with a reviewed golden file.
//!
//! `tests/fixtures/<upstream format>/wire/<case>.json` holds `client` (its format),
//! `request` (the client's body; `model` is filled in), `upstream` (the mock's script: a
//! `body`, or the stream's `events`) and optionally `headers` (sent by the client).
//! `<case>.expected.json` holds `status`, `upstream_request` (the body the upstream
//! received, `null` when nothing was sent), `upstream_headers` (the forwarded client
//! headers it saw) and `response` (a JSON body, or a stream as `[event, data]` pairs).
//! Regenerate with SLUICE_BLESS=1, then review the diff.

use serde_json::{json, Value};
use sluice::config::Provider;
use sluice::mock::Script;

use crate::helpers::*;
use crate::translate::{cases, normalise};

/// Client headers an upstream may see (everything else of the client's stays behind).
const FORWARDED: &[&str] = &["anthropic-beta"];

/// An OpenAI stream chunk with one choice.
pub(crate) fn chunk(choice: Value) -> Value {
    json!({"id": "chatcmpl-a", "object": "chat.completion.chunk", "created": 1, "model": "m", "choices": [choice]})
}

/// The usage chunk that ends an OpenAI stream asked for usage.
pub(crate) fn usage_chunk() -> Value {
    json!({"id": "chatcmpl-a", "object": "chat.completion.chunk", "created": 1, "model": "m", "choices": [],
        "usage": {"prompt_tokens": 9, "completion_tokens": 4, "total_tokens": 13}})
}

/// The data of the `[event, data]` pairs (as `run_case` records a stream) of one event type.
pub(crate) fn of_type<'v>(events: &'v Value, kind: &str) -> Vec<&'v Value> {
    events
        .as_array()
        .expect("a stream")
        .iter()
        .filter(|e| e[0] == kind)
        .map(|e| &e[1])
        .collect()
}

fn sse_events(text: &str) -> Value {
    let mut out = Vec::new();
    for block in text.split("\n\n").filter(|b| !b.trim().is_empty()) {
        let mut event = Value::Null;
        let mut data = Value::Null;
        for line in block.lines() {
            if let Some(e) = line.strip_prefix("event: ") {
                event = json!(e);
            } else if let Some(d) = line.strip_prefix("data: ") {
                data = serde_json::from_str(d).unwrap_or_else(|_| json!(d));
            }
        }
        out.push(json!([event, data]));
    }
    Value::Array(out)
}

/// Two upstreams on one mock: `a` (OpenAI format, model `gpt-4o-mini`) and `claude`
/// (Anthropic format, model `claude`). Their breakers never open: each case is its own, and
/// many fail a stream on the same key (`run_case` clears its rest).
pub(crate) async fn app() -> TestApp {
    spawn_app_with(|s, mock| {
        let mut claude = upstream("claude", KEY_B, mock);
        claude.provider = Provider::Anthropic;
        claude.base_url = mock.base_url();
        s.upstreams.push(claude);
        s.models.push(model("claude", &["claude"]));
        s.breaker.failure_threshold = u32::MAX;
        s.breaker.min_calls = u32::MAX;
    })
    .await
}

pub(crate) async fn run_case(app: &TestApp, token: &str, upstream: &str, v: &Value) -> Value {
    let (model, key, id) = match upstream {
        "openai" => ("gpt-4o-mini", KEY_A, "a"),
        _ => ("claude", KEY_B, "claude"),
    };
    let script: Script = serde_json::from_value(v["upstream"].clone()).expect("a mock script");
    app.mock.state.reset();
    app.rest_no_more(id);
    app.mock.state.script(key, [script]);
    let mut body = v["request"].clone();
    body["model"] = json!(model);
    let path = if v["client"] == "openai" {
        "/v1/chat/completions"
    } else {
        "/v1/messages"
    };
    let mut req = app
        .http
        .post(format!("{}{path}", app.address))
        .bearer_auth(token)
        .header("anthropic-version", "2023-06-01")
        .json(&body);
    for (k, val) in v["headers"].as_object().into_iter().flatten() {
        req = req.header(k.as_str(), val.as_str().unwrap());
    }
    let resp = req.send().await.expect("request sent");
    let status = resp.status().as_u16();
    let streamed = resp
        .headers()
        .get("content-type")
        .is_some_and(|c| c.to_str().unwrap_or("").starts_with("text/event-stream"));
    let text = resp.text().await.expect("a whole body");
    let response = if streamed {
        sse_events(&text)
    } else {
        serde_json::from_str(&text).unwrap_or_else(|_| json!(text))
    };
    let stats = app.mock.state.stats(key);
    let headers = stats.last_headers.back().map(|h| {
        FORWARDED
            .iter()
            .filter_map(|k| h.get(*k).map(|v| (k.to_string(), v.clone())))
            .collect::<serde_json::Map<_, _>>()
    });
    let mut got = json!({
        "status": status,
        "upstream_request": stats.last_bodies.back().cloned().unwrap_or(Value::Null),
        "upstream_headers": headers,
        "response": response,
    });
    normalise(&mut got);
    got
}

#[tokio::test]
async fn translated_requests_answers_and_streams_match_their_golden_files() {
    let app = app().await;
    let (_, token) = app.token("gold", None).await;
    let mut failed = Vec::new();
    for upstream in ["openai", "anthropic"] {
        for (case, v) in cases(&format!("{upstream}/wire")) {
            let got = run_case(&app, &token, upstream, &v).await;
            let golden = case.with_extension("expected.json");
            if std::env::var("SLUICE_BLESS").is_ok() {
                std::fs::write(&golden, serde_json::to_string_pretty(&got).unwrap() + "\n")
                    .unwrap();
            }
            let want: Value = serde_json::from_str(
                &std::fs::read_to_string(&golden)
                    .unwrap_or_else(|_| panic!("{} missing", golden.display())),
            )
            .unwrap();
            if got != want {
                failed.push(format!(
                    "{}\n got: {}\nwant: {}",
                    case.display(),
                    serde_json::to_string(&got).unwrap(),
                    serde_json::to_string(&want).unwrap()
                ));
            }
        }
    }
    assert!(failed.is_empty(), "{}", failed.join("\n\n"));
}

/// A hostile upstream reporting absurd usage (i64::MAX tokens, negative figures) in either
/// format, streamed or not, translated or not: the client still gets its answer, the
/// books are settled, and the figures recorded are within what any answer can hold.
#[tokio::test]
async fn absurd_usage_figures_from_an_upstream_are_answered_and_settled() {
    let app = app().await;
    let (_, token) = app.token("absurd", Some("100")).await;
    let huge = json!({"prompt_tokens": i64::MAX, "completion_tokens": i64::MAX, "total_tokens": -1,
        "prompt_tokens_details": {"cached_tokens": i64::MIN}});
    let openai_answer = json!({"id": "chatcmpl-x", "object": "chat.completion", "created": 1, "model": "m",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}], "usage": huge});
    let openai_events = vec![
        json!({"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m",
            "choices": [{"index": 0, "delta": {"content": "hi"}, "finish_reason": "stop"}]}),
        json!({"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m", "choices": [], "usage": huge}),
        json!("[DONE]"),
    ];
    let big = json!({"input_tokens": i64::MAX, "output_tokens": i64::MAX,
        "cache_read_input_tokens": i64::MAX, "cache_creation_input_tokens": i64::MAX});
    let anthropic_answer = json!({"id": "msg_x", "type": "message", "role": "assistant", "model": "m",
        "content": [{"type": "text", "text": "hi"}], "stop_reason": "end_turn", "stop_sequence": null, "usage": big});
    let anthropic_events = vec![
        json!(["message_start", {"type": "message_start", "message": {"id": "msg_x", "type": "message", "role": "assistant",
            "model": "m", "content": [], "stop_reason": null, "stop_sequence": null, "usage": big}}]),
        json!(["content_block_start", {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}]),
        json!(["content_block_delta", {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "hi"}}]),
        json!(["content_block_stop", {"type": "content_block_stop", "index": 0}]),
        json!(["message_delta", {"type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence": null}, "usage": big}]),
        json!(["message_stop", {"type": "message_stop"}]),
    ];
    let mut served = 0;
    for (upstream, answer, events) in [
        ("openai", openai_answer, openai_events),
        ("anthropic", anthropic_answer, anthropic_events),
    ] {
        for client in ["openai", "anthropic"] {
            for stream in [false, true] {
                let upstream_side = if stream {
                    json!({"events": events})
                } else {
                    json!({"body": answer})
                };
                let case = json!({"client": client, "request": {"max_tokens": 20, "stream": stream,
                    "messages": [{"role": "user", "content": "hi"}]}, "upstream": upstream_side});
                let got = run_case(&app, &token, upstream, &case).await;
                assert_eq!(
                    got["status"], 200,
                    "{upstream} → {client}, stream {stream}: {got}"
                );
                served += 1;
                app.wait_for_log_rows(served).await;
            }
        }
    }
    app.assert_invariant().await;
    let most: i64 = app
        .scalar(
            "SELECT MAX(CASE WHEN input_tokens > output_tokens THEN input_tokens ELSE output_tokens END)
             FROM requests",
        )
        .await;
    // Anthropic's input is three figures (fresh, cache reads, cache writes), each clamped.
    let ceiling = 3 * sluice::upstream::providers::MAX_REPORTED_TOKENS;
    assert!(
        (0..=ceiling).contains(&most),
        "usage recorded as reported: {most}"
    );
}

/// A translated stream stored in the cache keeps the actual usage: the hit that answers the
/// same question later reports the upstream's input figure, not the estimate that
/// `message_start` carried.
///
/// Ignored: the cache's `replay::Assembler` (src/cache/replay.rs, the cache helper's file)
/// takes only `output_tokens` from `message_delta.usage`, so the stored answer keeps the
/// estimate. The translation now sends the actual figures there; the assembler has to
/// read `input_tokens` and the cache figures too.
#[tokio::test]
async fn a_cached_translated_stream_keeps_the_actual_input_tokens() {
    let app = app().await;
    let (_, token) = app.token("cached", None).await;
    let ask = |stream: bool| {
        json!({"model": "gpt-4o-mini", "max_tokens": 50, "temperature": 0, "stream": stream,
            "messages": [{"role": "user", "content": "Why does the engine warning light blink after a cold night?"}]})
    };
    let send = |body: Value| {
        app.http
            .post(format!("{}/v1/messages", app.address))
            .bearer_auth(&token)
            .header("anthropic-version", "2023-06-01")
            .json(&body)
            .send()
    };
    let first = send(ask(true)).await.unwrap();
    assert_eq!(first.status(), 200);
    assert!(first.text().await.unwrap().contains("message_stop"));
    app.wait_for_log_rows(1).await;
    // The cache is written off the request path: ask until it answers.
    for _ in 0..100 {
        let hit = send(ask(false)).await.unwrap();
        let from_cache = hit.headers()["x-sluice-cache"] != "miss";
        let v: Value = hit.json().await.unwrap();
        if from_cache {
            assert_eq!(v["usage"]["input_tokens"], 12, "{v}");
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    panic!("the streamed answer never reached the cache");
}

/// An upstream that sends a mid-stream error event and then keeps its connection open:
/// the client's stream ends with the error (in its format) at once, not at the idle
/// timeout (an hour here), and the request is logged as an upstream error.
#[tokio::test]
async fn a_mid_stream_error_ends_the_stream_even_if_the_upstream_stays_open() {
    let app = spawn_app_with(|s, mock| {
        let mut claude = upstream("claude", KEY_B, mock);
        claude.provider = Provider::Anthropic;
        claude.base_url = mock.base_url();
        s.upstreams.push(claude);
        s.models.push(model("claude", &["claude"]));
        // Far beyond the test's own bound: only the error event can end the stream.
        s.upstream.stream_idle_timeout_ms = 3_600_000;
    })
    .await;
    let (_, token) = app.token("stays-open", None).await;
    let cases = [
        (
            "openai",
            "anthropic",
            json!([
            {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m",
             "choices": [{"index": 0, "delta": {"content": "The EGR "}, "finish_reason": null}]},
            {"error": {"message": "boom", "type": "server_error", "param": null, "code": "internal_error"}},
            "[DONE]"]),
        ),
        (
            "anthropic",
            "openai",
            json!([
            ["message_start", {"type": "message_start", "message": {"id": "msg_s", "type": "message", "role": "assistant",
                "model": "m", "content": [], "stop_reason": null, "stop_sequence": null, "usage": {"input_tokens": 5, "output_tokens": 1}}}],
            ["error", {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}],
            ["message_stop", {"type": "message_stop"}]]),
        ),
    ];
    for (i, (upstream, client, events)) in cases.into_iter().enumerate() {
        let case = json!({"client": client, "request": {"max_tokens": 20, "stream": true,
            "messages": [{"role": "user", "content": "hi"}]}, "upstream": {"events": events, "stall_after": 2}});
        let got = tokio::time::timeout(
            std::time::Duration::from_secs(60),
            run_case(&app, &token, upstream, &case),
        )
        .await
        .expect("the stream ended after the upstream's error event");
        let last = got["response"].as_array().unwrap().last().cloned().unwrap();
        match client {
            "anthropic" => assert_eq!(last[0], "error", "{got}"),
            _ => assert!(last[1]["error"].is_object(), "{got}"),
        }
        app.wait_for_log_rows(i as i64 + 1).await;
    }
    let errors = app
        .scalar("SELECT COUNT(*) FROM requests WHERE error_code = 'upstream_error'")
        .await;
    assert_eq!(errors, 2);
    app.assert_invariant().await;
}
