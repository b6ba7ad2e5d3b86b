//! The canonical dispatch under attack (issue 18 item 2): streams, bounds and accounting as
//! real OpenAI-compatible servers and a lying upstream send them, end to end through the
//! gateway to the mock.

use std::time::Duration;

use serde_json::{json, Value};
use sluice::mock::{Script, SseEvent};

use crate::helpers::*;
use crate::translate_wire::{app, chunk, of_type, run_case, usage_chunk};

/// Ollama (before 0.1.39), SGLang 0.4.3, LocalAI and several relays send
/// `"finish_reason": ""` on every chunk before the last, which carries the real reason.
/// The Anthropic client must get the real one: a truncated answer is `max_tokens`, a tool
/// call `tool_use` (an agent loop stops on anything else). The pairwise translator read the
/// last reason at `[DONE]`.
#[tokio::test]
async fn an_empty_finish_reason_on_every_chunk_does_not_hide_the_real_one() {
    let app = app().await;
    let (_, token) = app.token("empty-finish", None).await;
    let text = json!([
        chunk(
            json!({"index": 0, "delta": {"role": "assistant", "content": "The light "}, "finish_reason": ""})
        ),
        chunk(json!({"index": 0, "delta": {"content": "blinks"}, "finish_reason": ""})),
        chunk(json!({"index": 0, "delta": {"content": ""}, "finish_reason": "length"})),
        usage_chunk(),
        "[DONE]"
    ]);
    let tool = json!([
        chunk(
            json!({"index": 0, "delta": {"role": "assistant", "content": "Let me look."}, "finish_reason": ""})
        ),
        chunk(
            json!({"index": 0, "delta": {"tool_calls": [{"index": 0, "id": "call_1", "type": "function",
            "function": {"name": "lookup_vin", "arguments": "{\"vin\":\"WVW\"}"}}]}, "finish_reason": ""})
        ),
        chunk(json!({"index": 0, "delta": {}, "finish_reason": "tool_calls"})),
        usage_chunk(),
        "[DONE]"
    ]);
    for (events, want) in [(text, "max_tokens"), (tool, "tool_use")] {
        let case = json!({"client": "anthropic", "request": {"max_tokens": 50, "stream": true,
            "messages": [{"role": "user", "content": "Decode this VIN"}],
            "tools": [{"name": "lookup_vin", "input_schema": {"type": "object"}}]},
            "upstream": {"events": events}});
        let got = run_case(&app, &token, "openai", &case).await;
        assert_eq!(got["status"], 200, "{got}");
        let events = &got["response"];
        let delta = of_type(events, "message_delta");
        assert_eq!(delta.len(), 1, "{events}");
        assert_eq!(delta[0]["delta"]["stop_reason"], want, "{events}");
        if want == "tool_use" {
            let tool_blocks: Vec<_> = of_type(events, "content_block_start")
                .into_iter()
                .filter(|b| b["content_block"]["type"] == "tool_use")
                .collect();
            assert_eq!(tool_blocks.len(), 1, "{events}");
            assert_eq!(tool_blocks[0]["content_block"]["name"], "lookup_vin");
        }
    }
}

/// A lying OpenAI-format upstream opens tool call after tool call (each a new index and
/// id) and never names any: an Anthropic client's stream must be ended once what the
/// gateway keeps for them passes `upstream.max_response_bytes`, as for arguments held
/// back (`lying_upstream::arguments_held_back_for_ever_are_cut_at_the_cap`) — not grow
/// with the stream until the idle timeout.
#[tokio::test]
async fn calls_that_are_never_named_are_cut_at_the_cap() {
    const CAP: usize = 256 * 1024;
    let app = spawn_app_with(|s, _| {
        s.upstream.max_response_bytes = CAP;
        s.upstream.stream_idle_timeout_ms = 300_000;
    })
    .await;
    let (_, token) = app.token("nameless", Some("1")).await;
    let n = 20_000;
    let mut events = vec![SseEvent::Data(chunk(
        json!({"index": 0, "delta": {"role": "assistant", "content": "Partly "}, "finish_reason": null}),
    ))];
    events.extend((0..n).map(|i| {
        SseEvent::Data(chunk(
            json!({"index": 0, "delta": {"tool_calls": [{"index": i, "id": format!("call_{i:08}"), "type": "function"}]},
                "finish_reason": null}),
        ))
    }));
    // Held open after the last call (the event after it never comes).
    events.push(SseEvent::Data(json!("[DONE]")));
    app.mock.state.sticky(
        KEY_A,
        Some(Script {
            events: Some(events),
            stall_after: Some(n + 1),
            ..Default::default()
        }),
    );
    let body = json!({"model": "gpt-4o-mini", "max_tokens": 100, "stream": true,
        "messages": [{"role": "user", "content": "Why does the engine light blink?"}]});
    let resp = app.messages(&token, &body).await;
    assert_eq!(resp.status(), 200);
    let text = tokio::time::timeout(Duration::from_secs(60), resp.text())
        .await
        .expect("the gateway ended the stream at its cap (the idle timeout is 300 s)")
        .unwrap();
    assert_ended_held_back(&text);
}

/// An Anthropic upstream thinks (extended thinking) for a long while and the stream breaks
/// before its `message_delta`: the cut rule charges the input plus the output counted from
/// the deltas received — thinking is output Anthropic bills, so its deltas count. (Before:
/// only `text_delta` and `input_json_delta` were counted, so a stream cut during thinking
/// was charged its input only.)
#[tokio::test]
async fn thinking_received_before_a_cut_is_charged_as_output() {
    let app = app().await;
    let (_, token) = app.token("thinking-cut", Some("10")).await;
    let piece = "The engine light blinks when a cylinder misfires, so check the coils. ";
    let mut events = vec![
        SseEvent::Named(
            "message_start".into(),
            json!({"type": "message_start", "message": {"id": "msg_1", "type": "message", "role": "assistant",
                "model": "claude", "content": [], "stop_reason": null, "stop_sequence": null,
                "usage": {"input_tokens": 20, "output_tokens": 1}}}),
        ),
        SseEvent::Named(
            "content_block_start".into(),
            json!({"type": "content_block_start", "index": 0, "content_block": {"type": "thinking", "thinking": ""}}),
        ),
    ];
    let deltas = 100;
    events.extend((0..deltas).map(|_| {
        SseEvent::Named(
            "content_block_delta".into(),
            json!({"type": "content_block_delta", "index": 0, "delta": {"type": "thinking_delta", "thinking": piece}}),
        )
    }));
    let sent = events.len();
    app.mock.state.script(
        KEY_B,
        [Script {
            events: Some(events),
            cut_after: Some(sent),
            ..Default::default()
        }],
    );
    let body = json!({"model": "claude", "max_tokens": 4000, "stream": true,
        "thinking": {"type": "enabled", "budget_tokens": 2000},
        "messages": [{"role": "user", "content": "Why does the engine light blink?"}]});
    let resp = app.messages(&token, &body).await;
    assert_eq!(resp.status(), 200);
    let text = tokio::time::timeout(Duration::from_secs(60), resp.text())
        .await
        .expect("the stream ended")
        .unwrap();
    assert!(!text.contains("message_stop"), "a cut stream");
    app.wait_for_log_rows(1).await;
    let (input, output): (i64, i64) =
        sql_row(app.db(), "SELECT input_tokens, output_tokens FROM requests").await;
    let thought = sluice::quota::estimate::count_text(&piece.repeat(deltas));
    assert_eq!(input, 20);
    assert!(
        output >= thought / 2,
        "{output} output tokens charged for {thought} tokens of thinking received"
    );
    app.assert_invariant().await;
}

/// An OpenAI SDK pointed at a Claude model marks a long prompt part for Anthropic's prompt
/// cache (`cache_control` on a content part, as OpenRouter and LiteLLM take it). The
/// internal form has a place for it (`Part::Text::cache`): it must reach the Anthropic
/// upstream, or the request be refused naming it — never be dropped (the client would pay
/// the uncached price on every call without a word).
#[tokio::test]
async fn a_cache_mark_on_an_openai_part_reaches_anthropic_or_is_refused() {
    let app = app().await;
    let (_, token) = app.token("part-cache", None).await;
    let body = json!({"model": "claude", "max_tokens": 50,
        "messages": [{"role": "user", "content": [
            {"type": "text", "text": "A long manual of engine faults.", "cache_control": {"type": "ephemeral"}},
            {"type": "text", "text": "Why does the light blink?"}]}]});
    let resp = app.chat(&token, &body).await;
    let status = resp.status().as_u16();
    let answer: Value = resp.json().await.unwrap();
    if status == 400 {
        assert!(
            answer.to_string().contains("cache_control"),
            "a refusal names the field: {answer}"
        );
        return;
    }
    assert_eq!(status, 200, "{answer}");
    let stats = app.mock.state.stats(KEY_B);
    let sent = stats.last_bodies.back().expect("the upstream was called");
    assert_eq!(
        sent["messages"][0]["content"][0]["cache_control"],
        json!({"type": "ephemeral"}),
        "{sent}"
    );
}

/// A message-level field Anthropic does not define (`name`, or any other) is refused as
/// Anthropic refuses it — the top-level fields are — not dropped on the way to an
/// OpenAI-format upstream.
#[tokio::test]
async fn an_unknown_field_of_an_anthropic_message_is_refused_not_dropped() {
    let app = app().await;
    let (_, token) = app.token("msg-field", None).await;
    let body = json!({"model": "gpt-4o-mini", "max_tokens": 50,
        "messages": [{"role": "user", "content": "Why does the light blink?", "name": "mechanic_7"}]});
    let resp = app.messages(&token, &body).await;
    let status = resp.status().as_u16();
    let answer: Value = resp.json().await.unwrap();
    assert_eq!(status, 400, "{answer}");
    assert!(answer.to_string().contains("name"), "{answer}");
    assert_eq!(
        app.mock.state.stats(KEY_A).count,
        0,
        "nothing sent upstream"
    );
}

/// A model's tool arguments hold an integer wider than 64 bits (an order number written as
/// a JSON number). Crossing to an Anthropic client they are parsed into `input`, and the
/// number must stay the number the model wrote.
#[tokio::test]
#[ignore = "finding: serde_json without arbitrary_precision reads an integer beyond 64 bits as an f64: \
            an OpenAI answer's tool arguments {\"order\":123456789012345678901234567890} reach the \
            Anthropic client as input {\"order\":1.2345678901234568e+29} (also in requests, and in \
            every same-format body the gateway re-serializes); a fix is arbitrary_precision \
            project-wide or keeping tool arguments as raw JSON text"]
async fn a_wide_integer_in_tool_arguments_crosses_unaltered() {
    let app = app().await;
    let (_, token) = app.token("wide-int", None).await;
    let args = r#"{"order":123456789012345678901234567890}"#;
    app.mock.state.script(
        KEY_A,
        [Script {
            body: Some(
                json!({"id": "chatcmpl-w", "object": "chat.completion", "created": 1, "model": "m",
                "choices": [{"index": 0, "message": {"role": "assistant", "content": null,
                    "tool_calls": [{"id": "call_1", "type": "function",
                        "function": {"name": "lookup_order", "arguments": args}}]},
                    "finish_reason": "tool_calls"}],
                "usage": {"prompt_tokens": 9, "completion_tokens": 4, "total_tokens": 13}}),
            ),
            ..Default::default()
        }],
    );
    let body = json!({"model": "gpt-4o-mini", "max_tokens": 50,
        "tools": [{"name": "lookup_order", "input_schema": {"type": "object"}}],
        "messages": [{"role": "user", "content": "Where is my order?"}]});
    let resp = app.messages(&token, &body).await;
    assert_eq!(resp.status(), 200);
    let text = resp.text().await.unwrap();
    assert!(
        text.contains("123456789012345678901234567890"),
        "the order number was altered: {text}"
    );
}

/// An OpenAI-compatible reasoning server (DeepSeek, vLLM's reasoning parser) streams its
/// reasoning as `delta.reasoning_content` before the answer; it bills those tokens as
/// output. A stream cut while the model reasons must be charged what was received.
#[tokio::test]
async fn reasoning_content_received_before_a_cut_is_charged_as_output() {
    let app = app().await;
    let (_, token) = app.token("reasoning-cut", Some("10")).await;
    let piece = "The engine light blinks when a cylinder misfires, so check the coils. ";
    let deltas = 100;
    let mut events = vec![SseEvent::Data(chunk(
        json!({"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": null}),
    ))];
    events.extend((0..deltas).map(|_| {
        SseEvent::Data(chunk(
            json!({"index": 0, "delta": {"reasoning_content": piece}, "finish_reason": null}),
        ))
    }));
    let sent = events.len();
    app.mock.state.script(
        KEY_A,
        [Script {
            events: Some(events),
            cut_after: Some(sent),
            ..Default::default()
        }],
    );
    let mut body = chat_body(4000);
    body["stream"] = json!(true);
    let resp = app.chat(&token, &body).await;
    assert_eq!(resp.status(), 200);
    let _ = tokio::time::timeout(Duration::from_secs(60), resp.text())
        .await
        .expect("the stream ended");
    app.wait_for_log_rows(1).await;
    let output: i64 = app.scalar("SELECT output_tokens FROM requests").await;
    let thought = sluice::quota::estimate::count_text(&piece.repeat(deltas));
    assert!(
        output >= thought / 2,
        "{output} output tokens charged for {thought} tokens of reasoning received"
    );
    app.assert_invariant().await;
}

/// An Anthropic upstream streams a block that is not a client tool call (a server tool's
/// `server_tool_use`, which the gateway never asked for) with `input_json_delta`s of its
/// own: they must not be spliced into the OpenAI client's tool call 0, whose arguments
/// would no longer be the JSON the model wrote.
#[tokio::test]
async fn arguments_of_a_block_that_is_no_tool_call_are_not_spliced_into_call_0() {
    let app = app().await;
    let (_, token) = app.token("server-tool", None).await;
    let ev = |name: &str, data: Value| json!([name, data]);
    let events = json!([
        ev(
            "message_start",
            json!({"type": "message_start", "message": {"id": "msg_1", "type": "message",
            "role": "assistant", "model": "claude", "content": [], "stop_reason": null, "stop_sequence": null,
            "usage": {"input_tokens": 20, "output_tokens": 1}}})
        ),
        ev(
            "content_block_start",
            json!({"type": "content_block_start", "index": 0,
            "content_block": {"type": "tool_use", "id": "toolu_1", "name": "lookup_vin", "input": {}}})
        ),
        ev(
            "content_block_delta",
            json!({"type": "content_block_delta", "index": 0,
            "delta": {"type": "input_json_delta", "partial_json": "{\"vin\":\"WVW\"}"}})
        ),
        ev(
            "content_block_stop",
            json!({"type": "content_block_stop", "index": 0})
        ),
        ev(
            "content_block_start",
            json!({"type": "content_block_start", "index": 1,
            "content_block": {"type": "server_tool_use", "id": "srvtoolu_1", "name": "web_search", "input": {}}})
        ),
        ev(
            "content_block_delta",
            json!({"type": "content_block_delta", "index": 1,
            "delta": {"type": "input_json_delta", "partial_json": "{\"query\":\"vin\"}"}})
        ),
        ev(
            "content_block_stop",
            json!({"type": "content_block_stop", "index": 1})
        ),
        ev(
            "message_delta",
            json!({"type": "message_delta", "delta": {"stop_reason": "tool_use", "stop_sequence": null},
            "usage": {"output_tokens": 12}})
        ),
        ev("message_stop", json!({"type": "message_stop"}))
    ]);
    let case = json!({"client": "openai", "request": {"max_tokens": 50, "stream": true,
        "messages": [{"role": "user", "content": "Decode this VIN"}],
        "tools": [{"type": "function", "function": {"name": "lookup_vin", "parameters": {"type": "object"}}}]},
        "upstream": {"events": events}});
    let got = run_case(&app, &token, "claude", &case).await;
    assert_eq!(got["status"], 200, "{got}");
    let mut args: std::collections::BTreeMap<i64, String> = Default::default();
    for e in got["response"].as_array().unwrap() {
        for tc in e[1]["choices"][0]["delta"]["tool_calls"]
            .as_array()
            .into_iter()
            .flatten()
        {
            let i = tc["index"].as_i64().unwrap();
            args.entry(i)
                .or_default()
                .push_str(tc["function"]["arguments"].as_str().unwrap_or(""));
        }
    }
    assert_eq!(
        args.get(&0).map(String::as_str),
        Some("{\"vin\":\"WVW\"}"),
        "{got}"
    );
}

/// vLLM with `continuous_usage_stats` (and relays that copy it) put a running `usage` on
/// every chunk; an early chunk's figure is not the answer's usage. A stream whose first
/// chunk says `completion_tokens: 1`, then sends 100 chunks of text and breaks before its
/// final usage and `[DONE]`, must be charged by the cut rule (input plus the output counted
/// from the deltas received), not the 1 token of the first chunk.
#[tokio::test]
async fn an_early_running_usage_does_not_price_a_cut_openai_stream() {
    let app = app().await;
    let (_, token) = app.token("early-usage", Some("10")).await;
    let piece = "The engine light blinks when a cylinder misfires, so check the coils. ";
    let mut first = chunk(
        json!({"index": 0, "delta": {"role": "assistant", "content": "Hello."}, "finish_reason": null}),
    );
    first["usage"] = json!({"prompt_tokens": 20, "completion_tokens": 1, "total_tokens": 21});
    let deltas = 100;
    let mut events = vec![SseEvent::Data(first)];
    events.extend((0..deltas).map(|_| {
        SseEvent::Data(chunk(
            json!({"index": 0, "delta": {"content": piece}, "finish_reason": null}),
        ))
    }));
    let sent = events.len();
    app.mock.state.script(
        KEY_A,
        [Script {
            events: Some(events),
            cut_after: Some(sent),
            ..Default::default()
        }],
    );
    let body = json!({"model": "gpt-4o-mini", "stream": true,
        "messages": [{"role": "user", "content": "Why does the engine light blink?"}]});
    let resp = app.chat(&token, &body).await;
    assert_eq!(resp.status(), 200);
    let text = tokio::time::timeout(Duration::from_secs(60), resp.text())
        .await
        .expect("the stream ended")
        .unwrap();
    assert!(!text.contains("[DONE]"), "a cut stream");
    app.wait_for_log_rows(1).await;
    let (input, output): (i64, i64) =
        sql_row(app.db(), "SELECT input_tokens, output_tokens FROM requests").await;
    let received = sluice::quota::estimate::count_text(&piece.repeat(deltas));
    assert_eq!(input, 20);
    assert!(
        output >= received / 2,
        "{output} output tokens charged for {received} tokens of text received"
    );
    app.assert_invariant().await;
}
