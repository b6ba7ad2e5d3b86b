//! Non-streamed answers and error bodies across formats. Ids, tool call ids and the
//! upstream's `model` value are kept as they came.

use serde_json::{json, Value};

use crate::upstream::providers::anthropic;

pub fn finish_to_stop(reason: &str) -> &'static str {
    match reason {
        "length" => "max_tokens",
        "tool_calls" | "function_call" => "tool_use",
        _ => "end_turn",
    }
}

pub fn stop_to_finish(reason: &str) -> &'static str {
    match reason {
        "max_tokens" => "length",
        "tool_use" => "tool_calls",
        _ => "stop",
    }
}

/// OpenAI usage figures from Anthropic's (input includes cache reads and writes).
pub fn openai_usage(u: &Value) -> Value {
    let usage = anthropic::usage_of(u).unwrap_or_default();
    json!({"prompt_tokens": usage.input, "completion_tokens": usage.output, "total_tokens": usage.input + usage.output,
           "prompt_tokens_details": {"cached_tokens": usage.cached_input}})
}

/// Anthropic usage figures from OpenAI's.
pub fn anthropic_usage(u: &Value) -> Value {
    let n = |p: &str| u.pointer(p).and_then(Value::as_i64).unwrap_or(0);
    let cached = n("/prompt_tokens_details/cached_tokens");
    json!({"input_tokens": n("/prompt_tokens") - cached, "output_tokens": n("/completion_tokens"),
           "cache_read_input_tokens": cached, "cache_creation_input_tokens": 0})
}

pub fn anthropic_answer_to_openai(v: &Value) -> Value {
    let mut text = String::new();
    let mut tool_calls = Vec::new();
    for b in v
        .get("content")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        match b.get("type").and_then(Value::as_str) {
            Some("text") => text.push_str(b.get("text").and_then(Value::as_str).unwrap_or("")),
            Some("tool_use") => tool_calls.push(json!({"id": b.get("id").cloned().unwrap_or(json!("")), "type": "function",
                "function": {"name": b.get("name").cloned().unwrap_or(json!("")),
                             "arguments": b.get("input").map(Value::to_string).unwrap_or_else(|| "{}".into())}})),
            _ => {}
        }
    }
    let mut message = json!({"role": "assistant", "content": if text.is_empty() && !tool_calls.is_empty() { Value::Null } else { json!(text) }});
    if !tool_calls.is_empty() {
        message["tool_calls"] = Value::Array(tool_calls);
    }
    let stop = v
        .get("stop_reason")
        .and_then(Value::as_str)
        .unwrap_or("end_turn");
    json!({
        "id": v.get("id").cloned().unwrap_or(json!("")),
        "object": "chat.completion",
        "created": chrono::Utc::now().timestamp(),
        "model": v.get("model").cloned().unwrap_or(json!("")),
        "choices": [{"index": 0, "message": message, "logprobs": null, "finish_reason": stop_to_finish(stop)}],
        "usage": openai_usage(v.get("usage").unwrap_or(&Value::Null)),
    })
}

pub fn openai_answer_to_anthropic(v: &Value) -> Value {
    let choice = v.pointer("/choices/0").cloned().unwrap_or(Value::Null);
    let mut content = Vec::new();
    if let Some(t) = choice
        .pointer("/message/content")
        .and_then(Value::as_str)
        .filter(|t| !t.is_empty())
    {
        content.push(json!({"type": "text", "text": t}));
    }
    for tc in choice
        .pointer("/message/tool_calls")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let args = tc
            .pointer("/function/arguments")
            .and_then(Value::as_str)
            .unwrap_or("{}");
        let input: Value = serde_json::from_str(args).unwrap_or_else(|_| json!({}));
        content.push(
            json!({"type": "tool_use", "id": tc.get("id").cloned().unwrap_or(json!("")),
            "name": tc.pointer("/function/name").cloned().unwrap_or(json!("")), "input": input}),
        );
    }
    let finish = choice
        .get("finish_reason")
        .and_then(Value::as_str)
        .unwrap_or("stop");
    json!({
        "id": v.get("id").cloned().unwrap_or(json!("")),
        "type": "message",
        "role": "assistant",
        "model": v.get("model").cloned().unwrap_or(json!("")),
        "content": content,
        "stop_reason": finish_to_stop(finish),
        "stop_sequence": null,
        "usage": anthropic_usage(v.get("usage").unwrap_or(&Value::Null)),
    })
}

/// An upstream's error body in the other format (message kept, type mapped from status).
pub fn error_to_openai(status: u16, v: &Value) -> Value {
    let message = v
        .pointer("/error/message")
        .and_then(Value::as_str)
        .unwrap_or("The upstream rejected the request.");
    let kind = if status == 429 {
        "requests"
    } else if status >= 500 {
        "server_error"
    } else {
        "invalid_request_error"
    };
    json!({"error": {"message": message, "type": kind, "param": null, "code": null}})
}

pub fn error_to_anthropic(status: u16, v: &Value) -> Value {
    let message = v
        .pointer("/error/message")
        .and_then(Value::as_str)
        .unwrap_or("The upstream rejected the request.");
    json!({"type": "error", "error": {"type": anthropic::error_type(status), "message": message}})
}
