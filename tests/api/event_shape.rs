//! An upstream event that is valid JSON but not in the shape its format defines (issue 16,
//! failure 2): a text that is a number, `null` where an object must be, `choices` that is
//! not an array, a usage figure given as a string, an event without its `type`. The
//! gateway cannot read that piece of the answer (or of its usage), so it is as corrupt as
//! an event that is not JSON: the client's stream ends with the gateway's error event in
//! its own format (never `[DONE]` / `message_stop`), the row says `upstream_error`, and the
//! charge is the cut-stream rule's — the counted input and output, never a figure read
//! from the wrong-typed field. The same through translation and on the pass-through.

use serde_json::{json, Value};

use crate::helpers::{assert_cut_by_an_error_event, sql_row, TestApp};
use crate::translate_wire::{app, run_case};

const BEFORE: &str = "Torque the bolts to ";
const AFTER: &str = "twenty-five newton metres.";

fn chunk(choice: Value) -> Value {
    json!({"id": "chatcmpl-s", "object": "chat.completion.chunk", "created": 1, "model": "m", "choices": [choice]})
}

fn text_chunk(text: &str) -> Value {
    chunk(json!({"index": 0, "delta": {"content": text}, "finish_reason": null}))
}

/// An OpenAI stream with `bad` where its middle (or, for a usage lie, its usage chunk)
/// would be.
fn openai_stream(bad: Value, at_usage: bool) -> Value {
    let usage = json!({"id": "chatcmpl-s", "object": "chat.completion.chunk", "created": 1, "model": "m",
        "choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": 4, "total_tokens": 13}});
    if at_usage {
        json!([
            chunk(
                json!({"index": 0, "delta": {"role": "assistant", "content": BEFORE}, "finish_reason": null})
            ),
            chunk(json!({"index": 0, "delta": {}, "finish_reason": "stop"})),
            bad,
            "[DONE]"
        ])
    } else {
        json!([
            chunk(
                json!({"index": 0, "delta": {"role": "assistant", "content": BEFORE}, "finish_reason": null})
            ),
            bad,
            text_chunk(AFTER),
            chunk(json!({"index": 0, "delta": {}, "finish_reason": "stop"})),
            usage,
            "[DONE]"
        ])
    }
}

/// The OpenAI events that are JSON in the wrong shape, each named.
fn openai_lies() -> Vec<(&'static str, Value, bool)> {
    let mut call = chunk(
        json!({"index": 0, "delta": {"tool_calls": [{"index": 0, "id": "call_1", "type": "function",
        "function": {"name": "torque", "arguments": 25}}]}, "finish_reason": null}),
    );
    let usage = |u: Value| json!({"id": "chatcmpl-s", "object": "chat.completion.chunk", "created": 1, "model": "m", "choices": [], "usage": u});
    let mut lies = vec![
        ("content a number", text_chunk(""), false),
        (
            "choices an object",
            json!({"id": "chatcmpl-s", "object": "chat.completion.chunk", "created": 1, "model": "m",
            "choices": {"index": 0, "delta": {"content": "25 N"}}}),
            false,
        ),
        (
            "a choice null",
            json!({"id": "chatcmpl-s", "object": "chat.completion.chunk", "created": 1, "model": "m",
            "choices": [null]}),
            false,
        ),
        (
            "delta a string",
            chunk(json!({"index": 0, "delta": "25 N", "finish_reason": null})),
            false,
        ),
        (
            "content parts with a text that is a number",
            chunk(
                json!({"index": 0, "delta": {"content": [{"type": "text", "text": 25}]}, "finish_reason": null}),
            ),
            false,
        ),
        (
            "finish_reason a number",
            chunk(json!({"index": 0, "delta": {"content": "25 N"}, "finish_reason": 1})),
            false,
        ),
        (
            "usage prompt_tokens a string",
            usage(json!({"prompt_tokens": "9", "completion_tokens": 4, "total_tokens": 13})),
            true,
        ),
        (
            "usage completion_tokens a string",
            usage(json!({"prompt_tokens": 9, "completion_tokens": "4", "total_tokens": 13})),
            true,
        ),
        ("usage an array", usage(json!([9, 4])), true),
    ];
    lies[0].1["choices"][0]["delta"]["content"] = json!(42);
    call["choices"][0]["delta"]["tool_calls"][0]["function"]["arguments"] = json!(25);
    lies.push(("tool call arguments a number", call, false));
    lies.push(("the chunk a number", json!(42), false));
    lies.push(("the chunk null", Value::Null, false));
    lies.push((
        "the chunk an array",
        json!([{"index": 0, "delta": {"content": "25 N"}}]),
        false,
    ));
    lies
}

fn anthropic_stream(bad: Value, instead_of_start: bool) -> Value {
    let start = json!(["message_start", {"type": "message_start", "message": {"id": "msg_s", "type": "message",
        "role": "assistant", "model": "m", "content": [], "stop_reason": null, "stop_sequence": null,
        "usage": {"input_tokens": 5, "output_tokens": 1}}}]);
    let delta = |t: &str| {
        json!(["content_block_delta", {"type": "content_block_delta", "index": 0,
        "delta": {"type": "text_delta", "text": t}}])
    };
    let mut events = vec![
        start,
        json!(["content_block_start", {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}]),
        delta(BEFORE),
        bad.clone(),
        delta(AFTER),
        json!(["content_block_stop", {"type": "content_block_stop", "index": 0}]),
        json!(["message_delta", {"type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence": null}, "usage": {"output_tokens": 9}}]),
        json!(["message_stop", {"type": "message_stop"}]),
    ];
    if instead_of_start {
        events[0] = bad;
        events.remove(3);
    }
    Value::Array(events)
}

/// The Anthropic events that are JSON in the wrong shape, each named; `true` when the lie
/// replaces `message_start`.
fn anthropic_lies() -> Vec<(&'static str, Value, bool)> {
    let ev = |name: &str, data: Value| json!([name, data]);
    vec![
        (
            "delta.text a number",
            ev(
                "content_block_delta",
                json!({"type": "content_block_delta", "index": 0,
            "delta": {"type": "text_delta", "text": 25}}),
            ),
            false,
        ),
        (
            "delta.partial_json an object",
            ev(
                "content_block_delta",
                json!({"type": "content_block_delta", "index": 0,
            "delta": {"type": "input_json_delta", "partial_json": {"nm": 25}}}),
            ),
            false,
        ),
        (
            "a text_delta without its text",
            ev(
                "content_block_delta",
                json!({"type": "content_block_delta", "index": 0,
            "delta": {"type": "text_delta"}}),
            ),
            false,
        ),
        (
            "delta null",
            ev(
                "content_block_delta",
                json!({"type": "content_block_delta", "index": 0, "delta": null}),
            ),
            false,
        ),
        (
            "an event without its type",
            ev(
                "content_block_delta",
                json!({"index": 0,
            "delta": {"type": "text_delta", "text": "25 N"}}),
            ),
            false,
        ),
        (
            "type a number",
            ev(
                "content_block_delta",
                json!({"type": 7, "index": 0,
            "delta": {"type": "text_delta", "text": "25 N"}}),
            ),
            false,
        ),
        (
            "index a string",
            ev(
                "content_block_delta",
                json!({"type": "content_block_delta", "index": "0",
            "delta": {"type": "text_delta", "text": "25 N"}}),
            ),
            false,
        ),
        (
            "message_delta output_tokens a string",
            ev(
                "message_delta",
                json!({"type": "message_delta",
            "delta": {"stop_reason": "end_turn", "stop_sequence": null}, "usage": {"output_tokens": "9"}}),
            ),
            false,
        ),
        (
            "message_delta stop_reason a number",
            ev(
                "message_delta",
                json!({"type": "message_delta",
            "delta": {"stop_reason": 3, "stop_sequence": null}, "usage": {"output_tokens": 9}}),
            ),
            false,
        ),
        (
            "message_start input_tokens a string",
            ev(
                "message_start",
                json!({"type": "message_start", "message": {"id": "msg_s",
            "type": "message", "role": "assistant", "model": "m", "content": [], "stop_reason": null, "stop_sequence": null,
            "usage": {"input_tokens": "5", "output_tokens": 1}}}),
            ),
            true,
        ),
        (
            "the event an array",
            ev(
                "content_block_delta",
                json!(["content_block_delta", 0, {"type": "text_delta", "text": "25 N"}]),
            ),
            false,
        ),
        (
            "the event a JSON string",
            ev("content_block_delta", json!("\"25 N\"")),
            false,
        ),
        (
            "message_start message null",
            ev(
                "message_start",
                json!({"type": "message_start", "message": null}),
            ),
            true,
        ),
    ]
}

/// `events` from `upstream` streamed to a `client` asking "How tight?", answered 200: what
/// `run_case` got, and a description of the case for the assertions.
async fn stream_case(
    app: &TestApp,
    token: &str,
    (upstream, events): (&str, &Value),
    client: &str,
) -> (Value, String) {
    let case = json!({"client": client, "request": {"max_tokens": 50, "stream": true,
        "messages": [{"role": "user", "content": "How tight?"}]}, "upstream": {"events": events}});
    let got = run_case(app, token, upstream, &case).await;
    let what = format!("{upstream} → {client}: {got}");
    assert_eq!(got["status"], 200, "{what}");
    (got, what)
}

/// The last frame of a stream that ended complete in `client`'s format.
fn assert_complete(last: &Value, client: &str, what: &str) {
    if client == "anthropic" {
        assert_eq!(last[0], "message_stop", "{what}");
    } else {
        assert_eq!(last[1], "[DONE]", "{what}");
    }
}

/// The token `id` (a 1 USD budget) was charged what its request rows cost, once every
/// reservation has settled.
async fn assert_charged_what_was_logged(app: &TestApp, id: i64) {
    // A stream's row is recorded before its settlement commits: wait for the settlement.
    app.wait_settled().await;
    let logged = app
        .scalar("SELECT COALESCE(SUM(cost_micros), 0) FROM requests")
        .await;
    let charged = app
        .scalar(&format!(
            "SELECT 1000000 - remaining_micros FROM tokens WHERE id = {id}"
        ))
        .await;
    assert_eq!(charged, logged, "the ledger charged what the rows say");
}

/// Runs every lie of `upstream`'s format to both clients and checks each ending, row and
/// charge.
async fn each_lie_ends_as_corrupt(upstream: &str) {
    let app = app().await;
    let (id, token) = app.token(&format!("shape-{upstream}"), Some("1")).await;
    let cases: Vec<(&str, Value)> = match upstream {
        "openai" => openai_lies()
            .into_iter()
            .map(|(name, bad, at_usage)| (name, openai_stream(bad, at_usage)))
            .collect(),
        _ => anthropic_lies()
            .into_iter()
            .map(|(name, bad, at_start)| (name, anthropic_stream(bad, at_start)))
            .collect(),
    };
    let mut served = 0;
    for (name, events) in &cases {
        for client in ["openai", "anthropic"] {
            let case = json!({"client": client, "request": {"max_tokens": 50, "stream": true,
                "stream_options": if client == "openai" { json!({"include_usage": true}) } else { Value::Null },
                "messages": [{"role": "user", "content": "How tight?"}]}, "upstream": {"events": events}});
            let mut case = case;
            if client == "anthropic" {
                case["request"]
                    .as_object_mut()
                    .unwrap()
                    .remove("stream_options");
            }
            let got = run_case(&app, &token, upstream, &case).await;
            let what = format!("{upstream} → {client}, {name}: {got}");
            assert_eq!(got["status"], 200, "{what}");
            let frames = got["response"].as_array().unwrap();
            let last = assert_cut_by_an_error_event(frames, client, &what);
            if client == "anthropic" {
                assert_eq!(last[1]["type"], "error", "{what}");
            } else {
                assert!(last[0].is_null(), "{what}");
            }
            assert!(
                last[1]["error"]["message"]
                    .as_str()
                    .unwrap_or("")
                    .contains("shape"),
                "{what}"
            );
            assert!(
                !frames.iter().any(|f| f.to_string().contains("newton")),
                "what came after the lie reached the client: {what}"
            );
            served += 1;
            app.wait_for_log_rows(served).await;
            // Request ids are UUIDv7, ordered by time: the greatest is the last request's.
            let (status, code, input, output, cost): (i64, Option<String>, i64, i64, i64) =
                sql_row(
                    app.db(),
                    "SELECT status, error_code, input_tokens, output_tokens, cost_micros FROM requests
                     ORDER BY id DESC LIMIT 1",
                )
                .await;
            assert_eq!(
                (status, code.as_deref()),
                (200, Some("upstream_error")),
                "{what}"
            );
            // The cut rule: the input (the upstream's own figure where it came in a
            // well-formed event, else the count) and the output counted from what came —
            // never a figure read as 0 from a field of the wrong type.
            let output_came = !name.starts_with("message_start");
            assert!(
                input > 0 && cost > 0 && (output > 0 || !output_came),
                "input {input}, output {output}, cost {cost}: {what}"
            );
            if upstream == "anthropic" && !name.starts_with("message_start") {
                assert_eq!(input, 5, "{what}");
            }
            if name.starts_with("message_delta") || name.starts_with("usage") {
                assert_ne!(output, 9, "{what}");
                assert_ne!(output, 4, "{what}");
            }
        }
    }
    assert_charged_what_was_logged(&app, id).await;
    app.assert_invariant().await;
}

#[tokio::test]
async fn an_openai_event_in_the_wrong_shape_ends_the_stream_as_corrupt() {
    each_lie_ends_as_corrupt("openai").await;
}

#[tokio::test]
async fn an_anthropic_event_in_the_wrong_shape_ends_the_stream_as_corrupt() {
    each_lie_ends_as_corrupt("anthropic").await;
}

/// What the shapes do not forbid still passes, whole: `null` for the fields the formats
/// write as null (content, usage, finish_reason, tool_calls), a choice without a delta
/// (Azure's content-filter chunks), fields and event types the gateway does not know.
#[tokio::test]
async fn nulls_and_unknown_fields_and_events_still_pass() {
    let app = app().await;
    let (_, token) = app.token("shape-ok", Some("1")).await;
    let openai = json!([
        {"id": "chatcmpl-s", "object": "chat.completion.chunk", "created": 1, "model": "m", "choices": [],
            "prompt_filter_results": [{"prompt_index": 0, "content_filter_results": {}}], "usage": null},
        chunk(json!({"index": 0, "delta": {"role": "assistant", "content": null, "refusal": null, "tool_calls": null},
            "logprobs": null, "finish_reason": null})),
        chunk(json!({"index": 0, "delta": {"content": BEFORE, "reasoning_content": null, "future": {"x": 1}}, "finish_reason": null})),
        chunk(json!({"index": 0, "finish_reason": null, "content_filter_results": {"hate": {"filtered": false}}})),
        chunk(json!({"index": 0, "delta": {"content": AFTER}, "finish_reason": null, "stop_reason": null})),
        chunk(json!({"index": 0, "delta": {}, "finish_reason": "stop", "stop_reason": 128009})),
        {"id": "chatcmpl-s", "object": "chat.completion.chunk", "created": 1, "model": "m", "choices": [],
            "usage": {"prompt_tokens": 9, "completion_tokens": 4, "total_tokens": 13, "prompt_tokens_details": null,
                "completion_tokens_details": {"reasoning_tokens": 0}}},
        "[DONE]"
    ]);
    let anthropic = json!([
        ["message_start", {"type": "message_start", "message": {"id": "msg_s", "type": "message", "role": "assistant",
            "model": "m", "content": [], "stop_reason": null, "stop_sequence": null,
            "usage": {"input_tokens": 5, "output_tokens": 1, "cache_creation_input_tokens": null, "cache_read_input_tokens": null}}}],
        ["content_block_start", {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}],
        ["content_block_delta", {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": BEFORE}}],
        ["some_future_event", {"type": "some_future_event", "delta": {"text": 42}, "usage": "lots"}],
        ["content_block_delta", {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": AFTER}}],
        ["content_block_stop", {"type": "content_block_stop", "index": 0}],
        ["message_delta", {"type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence": null},
            "usage": {"output_tokens": 9, "input_tokens": null, "server_tool_use": null}}],
        ["message_stop", {"type": "message_stop"}]
    ]);
    let mut served = 0;
    for (upstream, events) in [("openai", &openai), ("anthropic", &anthropic)] {
        for client in ["openai", "anthropic"] {
            let (got, what) = stream_case(&app, &token, (upstream, events), client).await;
            let frames = got["response"].as_array().unwrap();
            let said = said_text(frames);
            assert_eq!(said, format!("{BEFORE}{AFTER}"), "{what}");
            assert_complete(frames.last().unwrap(), client, &what);
            served += 1;
            app.wait_for_log_rows(served).await;
        }
    }
    let failed = app
        .scalar("SELECT COUNT(*) FROM requests WHERE error_code IS NOT NULL")
        .await;
    assert_eq!(failed, 0);
    let output = app.scalar("SELECT SUM(output_tokens) FROM requests").await;
    assert_eq!(output, 2 * 4 + 2 * 9, "the upstreams' own usage charged");
    app.assert_invariant().await;
}

/// A non-streamed answer whose usage figures are of the wrong type: the answer is whole, so
/// it is served, but its usage is not the upstream's count — the output is counted from
/// the answer's text, never read as 0 from a string.
#[tokio::test]
async fn a_usage_of_the_wrong_type_in_an_answer_is_counted_not_read_as_zero() {
    let app = app().await;
    let (id, token) = app.token("shape-answer", Some("1")).await;
    let text = "Torque the cylinder head bolts to twenty-five newton metres, in three passes.";
    let openai = json!({"id": "cmpl-s", "object": "chat.completion", "created": 1, "model": "m",
        "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": text}}],
        "usage": {"prompt_tokens": "9", "completion_tokens": "40", "total_tokens": 49}});
    let anthropic = json!({"id": "msg_s", "type": "message", "role": "assistant", "model": "m",
        "content": [{"type": "text", "text": text}], "stop_reason": "end_turn", "stop_sequence": null,
        "usage": {"input_tokens": 5, "output_tokens": "40"}});
    let mut served = 0;
    for (upstream, answer) in [("openai", &openai), ("anthropic", &anthropic)] {
        for client in ["openai", "anthropic"] {
            let case = json!({"client": client, "request": {"max_tokens": 50,
                "messages": [{"role": "user", "content": "How tight?"}]}, "upstream": {"body": answer}});
            let got = run_case(&app, &token, upstream, &case).await;
            let what = format!("{upstream} → {client}: {got}");
            assert_eq!(got["status"], 200, "{what}");
            served += 1;
            app.wait_for_log_rows(served).await;
            let (input, output): (i64, i64) = sql_row(
                app.db(),
                "SELECT input_tokens, output_tokens FROM requests ORDER BY id DESC LIMIT 1",
            )
            .await;
            assert!(input > 0, "input {input}: {what}");
            assert!(output > 0 && output != 40, "output {output}: {what}");
        }
    }
    assert_charged_what_was_logged(&app, id).await;
    app.assert_invariant().await;
}

/// A usage with a figure missing (or `null`) is not corrupt — some OpenAI-compatible
/// servers send partial usage — but it is not the upstream's count either: the stream is
/// served whole and its tokens are counted, never read as 0 from the missing figure; its
/// row says `usage_estimated`.
#[tokio::test]
async fn a_usage_missing_a_figure_is_counted_not_trusted() {
    let app = app().await;
    let (_, token) = app.token("shape-partial", Some("1")).await;
    let done = chunk(json!({"index": 0, "delta": {}, "finish_reason": "stop"}));
    let openai = json!([
        text_chunk(BEFORE),
        text_chunk(AFTER),
        done,
        {"id": "chatcmpl-s", "object": "chat.completion.chunk", "created": 1, "model": "m", "choices": [],
            "usage": {"prompt_tokens": 9, "completion_tokens": null, "total_tokens": 13}},
        "[DONE]"
    ]);
    let anthropic = json!([
        ["message_start", {"type": "message_start", "message": {"id": "msg_s", "type": "message", "role": "assistant",
            "model": "m", "content": [], "stop_reason": null, "stop_sequence": null, "usage": {"output_tokens": 1}}}],
        ["content_block_start", {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}],
        ["content_block_delta", {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": BEFORE}}],
        ["content_block_delta", {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": AFTER}}],
        ["content_block_stop", {"type": "content_block_stop", "index": 0}],
        ["message_delta", {"type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence": null}, "usage": {}}],
        ["message_stop", {"type": "message_stop"}]
    ]);
    let mut served = 0;
    for (upstream, events) in [("openai", &openai), ("anthropic", &anthropic)] {
        for client in ["openai", "anthropic"] {
            let (got, what) = stream_case(&app, &token, (upstream, events), client).await;
            let last = got["response"].as_array().unwrap().last().unwrap().clone();
            assert_complete(&last, client, &what);
            served += 1;
            app.wait_for_log_rows(served).await;
            let (code, input, output): (Option<String>, i64, i64) = sql_row(
                app.db(),
                "SELECT error_code, input_tokens, output_tokens FROM requests ORDER BY id DESC LIMIT 1",
            )
            .await;
            // No input was reported: the row says it was counted by the gateway.
            assert_eq!(code.as_deref(), Some("usage_estimated"), "{what}");
            assert!(
                input > 0 && output > 1,
                "input {input}, output {output}: counted, {what}"
            );
        }
    }
    app.assert_invariant().await;
}

/// Streams real providers send that the typed reading must not refuse: vLLM's continuous
/// usage (a usage on every chunk), a tool call without its `index` (Gemini's OpenAI
/// endpoint), figures written as floats or with an exponent; Anthropic's extended thinking
/// (`thinking_delta`, `signature_delta`), server tools (`server_tool_use` with its
/// `input_json_delta`, `web_search_tool_result`) and `citations_delta`.
#[tokio::test]
async fn real_provider_streams_still_pass() {
    let app = app().await;
    let (_, token) = app.token("shape-real", Some("1")).await;
    let u = |c: Value| json!({"prompt_tokens": 9, "completion_tokens": c, "total_tokens": 13});
    let openai = json!([
        {"id": "chatcmpl-s", "object": "chat.completion.chunk", "created": 1, "model": "m",
            "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": null, "finish_reason": null}],
            "usage": u(json!(0))},
        {"id": "chatcmpl-s", "object": "chat.completion.chunk", "created": 1, "model": "m",
            "choices": [{"index": 0, "delta": {"content": BEFORE}, "logprobs": {"content": [{"token": "T", "logprob": -0.1, "bytes": [84], "top_logprobs": []}]}, "finish_reason": null}],
            "usage": u(json!(2.0))},
        {"id": "chatcmpl-s", "object": "chat.completion.chunk", "created": 1, "model": "m",
            "choices": [{"index": 0, "delta": {"content": AFTER}, "finish_reason": null}],
            "usage": u(json!(3e0))},
        {"id": "chatcmpl-s", "object": "chat.completion.chunk", "created": 1, "model": "m",
            "choices": [{"index": 0, "delta": {"tool_calls": [{"id": "call_1", "type": "function",
                "function": {"name": "torque", "arguments": "{}"}}]}, "finish_reason": null}],
            "usage": u(json!(4))},
        {"id": "chatcmpl-s", "object": "chat.completion.chunk", "created": 1, "model": "m",
            "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}], "usage": u(json!(4))},
        "[DONE]"
    ]);
    let anthropic = json!([
        ["message_start", {"type": "message_start", "message": {"id": "msg_s", "type": "message", "role": "assistant",
            "model": "m", "content": [], "stop_reason": null, "stop_sequence": null,
            "usage": {"input_tokens": 5, "output_tokens": 1, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0,
                "cache_creation": {"ephemeral_5m_input_tokens": 0, "ephemeral_1h_input_tokens": 0}, "service_tier": "standard"}}}],
        ["content_block_start", {"type": "content_block_start", "index": 0, "content_block": {"type": "thinking", "thinking": "", "signature": ""}}],
        ["content_block_delta", {"type": "content_block_delta", "index": 0, "delta": {"type": "thinking_delta", "thinking": "Bolts."}}],
        ["content_block_delta", {"type": "content_block_delta", "index": 0, "delta": {"type": "signature_delta", "signature": "EqQB"}}],
        ["content_block_stop", {"type": "content_block_stop", "index": 0}],
        ["ping", {"type": "ping"}],
        ["content_block_start", {"type": "content_block_start", "index": 1, "content_block": {"type": "server_tool_use", "id": "srvtoolu_1", "name": "web_search", "input": {}}}],
        ["content_block_delta", {"type": "content_block_delta", "index": 1, "delta": {"type": "input_json_delta", "partial_json": "{\"query\": \"torque\"}"}}],
        ["content_block_stop", {"type": "content_block_stop", "index": 1}],
        ["content_block_start", {"type": "content_block_start", "index": 2, "content_block": {"type": "web_search_tool_result", "tool_use_id": "srvtoolu_1",
            "content": [{"type": "web_search_result", "title": "T", "url": "https://example.com", "encrypted_content": "x", "page_age": null}]}}],
        ["content_block_stop", {"type": "content_block_stop", "index": 2}],
        ["content_block_start", {"type": "content_block_start", "index": 3, "content_block": {"type": "text", "text": ""}}],
        ["content_block_delta", {"type": "content_block_delta", "index": 3, "delta": {"type": "text_delta", "text": BEFORE}}],
        ["content_block_delta", {"type": "content_block_delta", "index": 3, "delta": {"type": "citations_delta", "citation": {"type": "web_search_result_location",
            "cited_text": "25 N m", "url": "https://example.com", "title": "T", "encrypted_index": "y"}}}],
        ["content_block_delta", {"type": "content_block_delta", "index": 3, "delta": {"type": "text_delta", "text": AFTER}}],
        ["content_block_stop", {"type": "content_block_stop", "index": 3}],
        ["message_delta", {"type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence": null},
            "usage": {"input_tokens": 5, "output_tokens": 9.0, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0,
                "server_tool_use": {"web_search_requests": 1}}}],
        ["message_stop", {"type": "message_stop"}]
    ]);
    for (upstream, events) in [("openai", &openai), ("anthropic", &anthropic)] {
        for client in ["openai", "anthropic"] {
            let case = json!({"client": client, "request": {"max_tokens": 50, "stream": true,
                "messages": [{"role": "user", "content": "How tight?"}]}, "upstream": {"events": events}});
            let got = run_case(&app, &token, upstream, &case).await;
            let what = format!("{upstream} → {client}: {got}");
            assert_eq!(got["status"], 200, "{what}");
            let frames = got["response"].as_array().unwrap();
            let said = said_text(frames);
            assert_eq!(said, format!("{BEFORE}{AFTER}"), "{what}");
            let last = frames.last().unwrap();
            if client == "anthropic" {
                assert_eq!(last[0], "message_stop", "{what}");
            } else {
                assert_eq!(last[1], "[DONE]", "{what}");
            }
        }
    }
}

/// `"choices": null` on the usage chunk: what OpenAI-compatible servers written in Go send
/// (go-openai's nil slice, the one-api / new-api relays), and ModelScope's and Workers AI's
/// usage chunks. It is the format's "no choices", as `"usage": null` is "no usage": the
/// stream is whole and its usage is read.
#[tokio::test]
async fn a_usage_chunk_with_null_choices_is_read_not_corrupt() {
    let app = app().await;
    let (_, token) = app.token("shape-null-choices", Some("1")).await;
    let openai = json!([
        chunk(json!({"index": 0, "delta": {"role": "assistant", "content": BEFORE}, "finish_reason": null})),
        text_chunk(AFTER),
        chunk(json!({"index": 0, "delta": {}, "finish_reason": "stop"})),
        {"id": "chatcmpl-s", "object": "chat.completion.chunk", "created": 1, "model": "m", "choices": null,
            "usage": {"prompt_tokens": 9, "completion_tokens": 4, "total_tokens": 13,
                "prompt_tokens_details": null, "completion_tokens_details": null}},
        "[DONE]"
    ]);
    let mut served = 0;
    for client in ["openai", "anthropic"] {
        let mut request = json!({"max_tokens": 50, "stream": true,
            "messages": [{"role": "user", "content": "How tight?"}]});
        if client == "openai" {
            request["stream_options"] = json!({"include_usage": true});
        }
        let case = json!({"client": client, "request": request, "upstream": {"events": openai}});
        let got = run_case(&app, &token, "openai", &case).await;
        let what = format!("openai → {client}: {got}");
        assert_eq!(got["status"], 200, "{what}");
        let frames = got["response"].as_array().unwrap();
        let last = frames.last().unwrap();
        if client == "anthropic" {
            assert_eq!(last[0], "message_stop", "{what}");
        } else {
            assert_eq!(last[1], "[DONE]", "{what}");
        }
        served += 1;
        app.wait_for_log_rows(served).await;
    }
    let failed = app
        .scalar("SELECT COUNT(*) FROM requests WHERE error_code IS NOT NULL")
        .await;
    assert_eq!(failed, 0, "a stream ended as corrupt");
    let output = app.scalar("SELECT SUM(output_tokens) FROM requests").await;
    assert_eq!(output, 2 * 4, "the upstream's own usage charged");
}

/// A last chunk with `"delta": null` beside its `finish_reason` — what GLM's API and some
/// Ollama builds send, and what OpenAI-compatible clients accept. It carries no text, so
/// nothing of the answer is lost: the stream is whole.
#[tokio::test]
async fn a_null_delta_on_the_last_chunk_ends_the_stream_whole() {
    let app = app().await;
    let (_, token) = app.token("shape-null-delta", Some("1")).await;
    let openai = json!([
        chunk(json!({"index": 0, "delta": {"role": "assistant", "content": BEFORE}, "finish_reason": null})),
        text_chunk(AFTER),
        chunk(json!({"index": 0, "delta": null, "finish_reason": "stop"})),
        {"id": "chatcmpl-s", "object": "chat.completion.chunk", "created": 1, "model": "m", "choices": [],
            "usage": {"prompt_tokens": 9, "completion_tokens": 4, "total_tokens": 13}},
        "[DONE]"
    ]);
    for client in ["openai", "anthropic"] {
        let case = json!({"client": client, "request": {"max_tokens": 50, "stream": true,
            "messages": [{"role": "user", "content": "How tight?"}]}, "upstream": {"events": openai}});
        let got = run_case(&app, &token, "openai", &case).await;
        let what = format!("openai → {client}: {got}");
        assert_eq!(got["status"], 200, "{what}");
        let last = got["response"].as_array().unwrap().last().unwrap().clone();
        if client == "anthropic" {
            assert_eq!(last[0], "message_stop", "{what}");
        } else {
            assert_eq!(last[1], "[DONE]", "{what}");
        }
    }
}

/// The text a stream's frames carried, in either client format.
fn said_text(frames: &[Value]) -> String {
    frames
        .iter()
        .map(|f| {
            f[1]["choices"][0]["delta"]["content"]
                .as_str()
                .or(f[1]["delta"]["text"].as_str())
                .unwrap_or("")
        })
        .collect()
}
