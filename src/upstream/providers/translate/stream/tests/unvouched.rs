//! s28 stop attack F1: a finish the upstream did not give — no reason (null, absent, a
//! stream's `[DONE]` before one), a reason not known beside tool calls, or Anthropic's
//! `model_context_window_exceeded` — is not whole, whole or streamed, though the client
//! is told a reason as before. The readers took it for `Stop`, `ToolCalls` or `Length`,
//! and a translated answer so cut was cached, where within one format `cache::shape`
//! refuses it.

use bytes::Bytes;
use serde_json::{json, Value};

use crate::error::WireFormat;
use crate::upstream::providers::translate::stream::StreamConverter;
use crate::upstream::providers::{convert_answer, read_answer, Format};

fn anthropic(reason: Value, content: Value) -> Value {
    json!({"id": "msg_1", "type": "message", "role": "assistant", "model": "m",
        "content": content, "stop_reason": reason, "stop_sequence": null,
        "usage": {"input_tokens": 3, "output_tokens": 2}})
}

fn openai(reason: Value, message: Value) -> Value {
    json!({"id": "c", "object": "chat.completion", "created": 1, "model": "m",
        "choices": [{"index": 0, "message": message, "finish_reason": reason}],
        "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}})
}

fn gemini(reason: Option<&str>, parts: Value) -> Value {
    let mut c = json!({"content": {"role": "model", "parts": parts}, "index": 0});
    if let Some(r) = reason {
        c["finishReason"] = json!(r);
    }
    json!({"candidates": [c], "responseId": "r1", "modelVersion": "gemini-2.5-flash",
        "usageMetadata": {"promptTokenCount": 3, "candidatesTokenCount": 2, "totalTokenCount": 5}})
}

fn bedrock(reason: &str) -> Value {
    json!({"output": {"message": {"role": "assistant", "content": [{"text": "Hi."}]}},
        "stopReason": reason, "usage": {"inputTokens": 3, "outputTokens": 2, "totalTokens": 5}})
}

/// The reason a client of `client`'s format is told for `v` from `upstream`.
fn told(upstream: Format, client: WireFormat, v: &Value) -> Value {
    let out = convert_answer(upstream, client, Bytes::from(v.to_string()), (v, None));
    let out: Value = serde_json::from_slice(&out).unwrap();
    match client {
        WireFormat::OpenAi => out["choices"][0]["finish_reason"].clone(),
        WireFormat::Anthropic => out["stop_reason"].clone(),
    }
}

#[test]
fn an_answer_its_upstream_gave_no_whole_reason_for_is_not_whole_but_told_one() {
    let text = json!([{"type": "text", "text": "Hi."}]);
    let call = json!([{"type": "tool_use", "id": "toolu_1", "name": "f", "input": {}}]);
    let said = json!({"role": "assistant", "content": "Hi."});
    let called = json!({"role": "assistant", "content": null, "tool_calls": [{"id": "call_1",
        "type": "function", "function": {"name": "f", "arguments": "{}"}}]});
    let mut absent = anthropic(Value::Null, text.clone());
    absent.as_object_mut().unwrap().remove("stop_reason");
    let mut no_reason = openai(Value::Null, said.clone());
    no_reason["choices"][0]
        .as_object_mut()
        .unwrap()
        .remove("finish_reason");
    let gemini_call = json!([{"functionCall": {"name": "f", "args": {}}}]);
    let gemini_text = json!([{"text": "Hi."}]);
    // (upstream, its answer, what the other format's client is told)
    let cut = [
        (
            Format::Anthropic,
            anthropic(Value::Null, text.clone()),
            "stop",
        ),
        (Format::Anthropic, absent, "stop"),
        // As before: no reason is `end_turn`'s `stop`, with calls or without.
        (
            Format::Anthropic,
            anthropic(Value::Null, call.clone()),
            "stop",
        ),
        (
            Format::Anthropic,
            anthropic(json!("model_context_window_exceeded"), text.clone()),
            "length",
        ),
        (
            Format::OpenAiChat,
            openai(Value::Null, said.clone()),
            "end_turn",
        ),
        (Format::OpenAiChat, no_reason, "end_turn"),
        (
            Format::OpenAiChat,
            openai(Value::Null, called.clone()),
            "tool_use",
        ),
        (
            Format::OpenAiChat,
            openai(json!("abort"), called.clone()),
            "tool_use",
        ),
        (
            Format::OpenAiChat,
            openai(json!("abort"), said.clone()),
            "end_turn",
        ),
        (Format::Gemini, gemini(None, gemini_text.clone()), "stop"),
        (
            Format::Gemini,
            gemini(Some("FINISH_REASON_UNSPECIFIED"), gemini_text.clone()),
            "stop",
        ),
        (
            Format::Gemini,
            gemini(None, gemini_call.clone()),
            "tool_calls",
        ),
        (
            Format::Gemini,
            json!({"candidates": [], "usageMetadata": {"promptTokenCount": 3, "totalTokenCount": 3}}),
            "stop",
        ),
        (
            Format::Bedrock,
            bedrock("model_context_window_exceeded"),
            "stop",
        ),
    ];
    for (upstream, v, reason) in cut {
        let a = read_answer(upstream, &v).unwrap();
        assert!(!a.ended_whole(), "{upstream:?} {v}: {:?}", a.finish);
        let client = match upstream {
            Format::OpenAiChat => WireFormat::Anthropic,
            _ => WireFormat::OpenAi,
        };
        assert_eq!(
            told(upstream, client, &v),
            json!(reason),
            "{upstream:?} {v}"
        );
    }
    // What each format says of a whole answer still is.
    let whole = [
        (
            Format::Anthropic,
            anthropic(json!("end_turn"), text.clone()),
        ),
        (Format::Anthropic, anthropic(json!("tool_use"), call)),
        (Format::Anthropic, anthropic(json!("max_tokens"), text)),
        (Format::OpenAiChat, openai(json!("stop"), said.clone())),
        (Format::OpenAiChat, openai(json!("eos_token"), said.clone())),
        (Format::OpenAiChat, openai(json!("stop"), called.clone())),
        (Format::OpenAiChat, openai(json!("tool_calls"), called)),
        (Format::OpenAiChat, openai(json!("length"), said)),
        (Format::Gemini, gemini(Some("STOP"), gemini_text)),
        (Format::Gemini, gemini(Some("STOP"), gemini_call)),
        (Format::Bedrock, bedrock("end_turn")),
    ];
    for (upstream, v) in whole {
        let a = read_answer(upstream, &v).unwrap();
        assert!(a.ended_whole(), "{upstream:?} {v}: {:?}", a.finish);
    }
}

fn through(
    upstream: Format,
    client: WireFormat,
    events: &[(&str, String)],
) -> (StreamConverter, String) {
    let mut c = StreamConverter::new(upstream, client, true, 10);
    let mut out = Vec::new();
    for (name, data) in events {
        c.event(name, data, &mut out);
    }
    assert!(c.end(&mut out), "{upstream:?} → {client:?}: complete");
    (c, String::from_utf8_lossy(&out.concat()).into_owned())
}

fn openai_stream(finish: Value) -> Vec<(&'static str, String)> {
    let c = |delta: Value, reason: Value| {
        json!({"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m",
            "choices": [{"index": 0, "delta": delta, "finish_reason": reason}], "usage": null})
        .to_string()
    };
    let mut s = vec![("", c(json!({"content": "Hi."}), Value::Null))];
    if !finish.is_null() {
        s.push(("", c(json!({}), finish)));
    }
    s.push((
        "",
        json!({"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m",
            "choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}})
        .to_string(),
    ));
    s.push(("", "[DONE]".into()));
    s
}

fn anthropic_stream(deltas: &[Value]) -> Vec<(&'static str, String)> {
    let e = |name: &'static str, v: Value| (name, v.to_string());
    let mut s = vec![
        e(
            "message_start",
            json!({"type": "message_start", "message": {"id": "msg_1", "type": "message",
                "role": "assistant", "model": "claude", "content": [],
                "usage": {"input_tokens": 3, "output_tokens": 1}}}),
        ),
        e(
            "content_block_start",
            json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
        ),
        e(
            "content_block_delta",
            json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Hi."}}),
        ),
        e(
            "content_block_stop",
            json!({"type": "content_block_stop", "index": 0}),
        ),
    ];
    for reason in deltas {
        s.push(e(
            "message_delta",
            json!({"type": "message_delta", "delta": {"stop_reason": reason, "stop_sequence": null},
                "usage": {"output_tokens": 2}}),
        ));
    }
    s.push(e("message_stop", json!({"type": "message_stop"})));
    s
}

/// Streamed: an OpenAI `[DONE]` with no finish before it, an Anthropic `message_delta`
/// with no `stop_reason` or `model_context_window_exceeded`, are cuts the client is told as
/// `end_turn`, `stop` or `length`; a later whole finish does not mend an earlier cut (the
/// converter keeps a stream's first finish, `after_finish`, and its cut is sticky besides).
#[test]
fn a_stream_its_upstream_gave_no_whole_reason_for_is_cut_but_told_one() {
    let (c, told) = through(
        Format::OpenAiChat,
        WireFormat::Anthropic,
        &openai_stream(Value::Null),
    );
    assert!(!c.ended_whole(), "[DONE] without a finish");
    assert!(told.contains(r#""stop_reason":"end_turn""#), "{told}");
    let (c, told) = through(
        Format::OpenAiChat,
        WireFormat::Anthropic,
        &openai_stream(json!("abort")),
    );
    assert!(!c.ended_whole(), "abort");
    assert!(told.contains(r#""stop_reason":"end_turn""#), "{told}");
    let (c, _) = through(
        Format::OpenAiChat,
        WireFormat::Anthropic,
        &openai_stream(json!("stop")),
    );
    assert!(c.ended_whole(), "stop");

    for (deltas, reason) in [
        (vec![Value::Null], "stop"),
        (vec![json!("model_context_window_exceeded")], "length"),
        (vec![json!("pause_turn"), json!("end_turn")], "stop"),
        (vec![Value::Null, json!("end_turn")], "stop"),
    ] {
        let (c, told) = through(
            Format::Anthropic,
            WireFormat::OpenAi,
            &anthropic_stream(&deltas),
        );
        assert!(!c.ended_whole(), "{deltas:?}");
        assert!(
            told.contains(&format!(r#""finish_reason":"{reason}""#)),
            "{deltas:?}: {told}"
        );
    }
    let (c, _) = through(
        Format::Anthropic,
        WireFormat::OpenAi,
        &anthropic_stream(&[json!("end_turn")]),
    );
    assert!(c.ended_whole(), "end_turn");
}
