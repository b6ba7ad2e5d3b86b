//! Non-streamed answers and error bodies across formats. Ids, tool call ids and the
//! upstream's `model` value are kept as they came.
//!
//! Stop reasons: `length` ↔ `max_tokens`, `tool_calls` ↔ `tool_use` (also tool calls that
//! came with `stop`, as some OpenAI-compatible servers send them), `content_filter` ↔
//! `refusal`, and `stop` ↔ `end_turn`, or `stop_sequence` when the upstream names the
//! sequence — OpenAI-compatible servers (vLLM) put it in the choice's `stop_reason`, which
//! is also where an OpenAI client finds Anthropic's `stop_sequence`. `pause_turn` (a long
//! server-tool turn Anthropic paused) is `stop`: OpenAI has no such state.

use serde_json::{json, Map, Value};

use crate::upstream::providers::{anthropic, openai};

/// What decides an Anthropic `stop_reason` from an OpenAI choice.
#[derive(Debug, Default, Clone)]
pub struct Finish {
    pub reason: Option<String>,
    /// The matched stop string, when the upstream reports it (vLLM's `stop_reason`).
    pub sequence: Option<String>,
    pub tool_calls: bool,
    pub refusal: bool,
}

impl Finish {
    pub fn note_choice(&mut self, choice: &Value) {
        if let Some(r) = choice.get("finish_reason").and_then(Value::as_str) {
            self.reason = Some(r.to_string());
        }
        if let Some(s) = choice.get("stop_reason").and_then(Value::as_str) {
            self.sequence = Some(s.to_string());
        }
    }

    /// Anthropic's `stop_reason` and `stop_sequence`.
    pub fn anthropic(&self) -> (&'static str, Value) {
        let reason = match self.reason.as_deref().unwrap_or("stop") {
            "length" => "max_tokens",
            "tool_calls" | "function_call" => "tool_use",
            "content_filter" => "refusal",
            _ if self.tool_calls => "tool_use",
            _ if self.refusal => "refusal",
            _ if self.sequence.is_some() => "stop_sequence",
            _ => "end_turn",
        };
        let seq = match (reason, &self.sequence) {
            ("stop_sequence", Some(s)) => json!(s),
            _ => Value::Null,
        };
        (reason, seq)
    }
}

/// OpenAI's `finish_reason` for an Anthropic `stop_reason`.
pub fn stop_to_finish(reason: &str) -> &'static str {
    match reason {
        "max_tokens" | "model_context_window_exceeded" => "length",
        "tool_use" => "tool_calls",
        "refusal" => "content_filter",
        _ => "stop",
    }
}

/// An OpenAI choice's finish fields for an Anthropic `stop_reason` and `stop_sequence`.
pub fn openai_finish(choice: &mut Map<String, Value>, reason: &str, sequence: &Value) {
    choice.insert("finish_reason".into(), json!(stop_to_finish(reason)));
    if reason == "stop_sequence" && sequence.is_string() {
        choice.insert("stop_reason".into(), sequence.clone());
    }
}

/// OpenAI usage figures from Anthropic's (input includes cache reads and writes).
pub fn openai_usage(u: &Value) -> Value {
    let usage = anthropic::usage_of(u).unwrap_or_default();
    json!({"prompt_tokens": usage.input, "completion_tokens": usage.output, "total_tokens": usage.input.saturating_add(usage.output),
           "prompt_tokens_details": {"cached_tokens": usage.cached_input}})
}

/// Anthropic usage figures from OpenAI's.
pub fn anthropic_usage(u: &Value) -> Value {
    let n = |p: &str| super::super::tokens(u.pointer(p)).unwrap_or(0);
    let cached = n("/prompt_tokens_details/cached_tokens");
    json!({"input_tokens": (n("/prompt_tokens") - cached).max(0), "output_tokens": n("/completion_tokens"),
           "cache_read_input_tokens": cached, "cache_creation_input_tokens": 0})
}

/// Tool call arguments as an Anthropic `input` object. Arguments that are not a JSON
/// object are kept as text under `_arguments` rather than lost.
pub fn tool_input(args: &str) -> Value {
    if args.trim().is_empty() {
        return json!({});
    }
    match serde_json::from_str::<Value>(args) {
        Ok(v @ Value::Object(_)) => v,
        _ => json!({"_arguments": args}),
    }
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
                             "arguments": b.get("input").map_or_else(|| "{}".to_string(), Value::to_string)}})),
            _ => {}
        }
    }
    let stop = v
        .get("stop_reason")
        .and_then(Value::as_str)
        .unwrap_or("end_turn");
    // No text with tool calls or a refusal is `null`, as OpenAI sends it.
    let no_text = text.is_empty() && (!tool_calls.is_empty() || stop == "refusal");
    let mut message =
        json!({"role": "assistant", "content": if no_text { Value::Null } else { json!(text) }});
    if !tool_calls.is_empty() {
        message["tool_calls"] = Value::Array(tool_calls);
    }
    let mut choice = Map::new();
    choice.insert("index".into(), json!(0));
    choice.insert("message".into(), message);
    choice.insert("logprobs".into(), Value::Null);
    openai_finish(
        &mut choice,
        stop,
        v.get("stop_sequence").unwrap_or(&Value::Null),
    );
    json!({
        "id": v.get("id").cloned().unwrap_or(json!("")),
        "object": "chat.completion",
        "created": chrono::Utc::now().timestamp(),
        "model": v.get("model").cloned().unwrap_or(json!("")),
        "choices": [choice],
        "usage": openai_usage(v.get("usage").unwrap_or(&Value::Null)),
    })
}

pub fn openai_answer_to_anthropic(v: &Value) -> Value {
    // The request asked for one choice: the one with index 0 is the answer.
    let choice = v
        .get("choices")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .find(|c| c.get("index").and_then(Value::as_i64).unwrap_or(0) == 0)
        .cloned()
        .unwrap_or(Value::Null);
    let mut finish = Finish::default();
    finish.note_choice(&choice);
    let mut content = Vec::new();
    for p in ["/message/content", "/message/refusal"] {
        if let Some(t) = openai::content_text(choice.pointer(p)).filter(|t| !t.is_empty()) {
            content.push(json!({"type": "text", "text": t}));
            finish.refusal |= p.ends_with("refusal");
        }
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
        content.push(
            json!({"type": "tool_use", "id": tc.get("id").cloned().unwrap_or(json!("")),
            "name": tc.pointer("/function/name").cloned().unwrap_or(json!("")), "input": tool_input(args)}),
        );
        finish.tool_calls = true;
    }
    let (stop_reason, stop_sequence) = finish.anthropic();
    json!({
        "id": v.get("id").cloned().unwrap_or(json!("")),
        "type": "message",
        "role": "assistant",
        "model": v.get("model").cloned().unwrap_or(json!("")),
        "content": content,
        "stop_reason": stop_reason,
        "stop_sequence": stop_sequence,
        "usage": anthropic_usage(v.get("usage").unwrap_or(&Value::Null)),
    })
}

/// The upstream's own words: its format's `error.message`, else a top-level `message`
/// (vLLM) or `detail` (FastAPI servers); a body that is not JSON (a proxy's HTML page) is
/// not shown to the client.
/// The message of an upstream's error body, whatever its shape: OpenAI's and Anthropic's
/// `error.message`, vLLM's and Mistral's `message`, FastAPI's `detail` (a string, or a list
/// of validation errors whose `msg`s are joined), Ollama's `error` string.
fn upstream_message(v: &Value) -> std::borrow::Cow<'_, str> {
    if let Some(m) = ["/error/message", "/message", "/detail", "/error"]
        .iter()
        .find_map(|p| v.pointer(p).and_then(Value::as_str))
    {
        return m.into();
    }
    let msgs: Vec<&str> = v
        .get("detail")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|d| d.get("msg").and_then(Value::as_str))
        .collect();
    if msgs.is_empty() {
        "The upstream rejected the request.".into()
    } else {
        msgs.join("; ").into()
    }
}

/// OpenAI's error `type` for an Anthropic error `type`.
pub fn openai_error_type(anthropic_type: &str) -> &'static str {
    match anthropic_type {
        "rate_limit_error" => "requests",
        "api_error" | "overloaded_error" | "timeout_error" => "server_error",
        _ => "invalid_request_error",
    }
}

/// Anthropic's error `type` for an OpenAI error (`type` and `code`), when the status does
/// not say it (a mid-stream error has none).
pub fn anthropic_error_type(kind: &str, code: &str) -> &'static str {
    match (kind, code) {
        (_, "rate_limit_exceeded") | ("requests" | "tokens", _) => "rate_limit_error",
        (_, "invalid_api_key") | ("authentication_error", _) => "authentication_error",
        ("invalid_request_error", _) => "invalid_request_error",
        ("insufficient_quota", _) | (_, "insufficient_quota") => "rate_limit_error",
        _ => "api_error",
    }
}

/// An upstream's error body in OpenAI's shape: the message kept, the type from the status,
/// `code` the upstream's own code or error type (`upstream_error` when it gave neither).
pub fn error_to_openai(status: u16, v: &Value) -> Value {
    let kind = if status == 429 {
        "requests"
    } else if status >= 500 {
        "server_error"
    } else {
        "invalid_request_error"
    };
    json!({"error": {"message": upstream_message(v), "type": kind, "param": null, "code": openai_code(v)}})
}

/// The upstream's own `code`, else its `type`, else a Sluice code: what `error.code` of an
/// Anthropic-shaped error made from an OpenAI one carries.
pub fn openai_code(v: &Value) -> Value {
    ["/error/code", "/error/type", "/type"]
        .iter()
        .find_map(|p| v.pointer(p).filter(|c| c.is_string()).cloned())
        .unwrap_or(json!("upstream_error"))
}

/// An upstream's error body in Anthropic's shape, with `error.code`.
pub fn error_to_anthropic(status: u16, v: &Value) -> Value {
    json!({"type": "error", "error": {"type": anthropic::error_type(status),
        "message": upstream_message(v), "code": openai_code(v)}})
}
