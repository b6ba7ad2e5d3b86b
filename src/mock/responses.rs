//! The mock's answers in both wire formats, shaped like the providers' own.

use std::time::Duration;

use actix_web::{HttpRequest, HttpResponse};
use bytes::Bytes;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use super::{InFlightGuard, MockConfig};

/// One scripted answer. Every field is optional; an empty script is the default answer.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Script {
    /// HTTP status (default 200). A non-2xx status answers `body` / `raw_body` or a
    /// provider-shaped error.
    pub status: Option<u16>,
    /// Replaces the whole JSON body.
    pub body: Option<Value>,
    /// Sent verbatim instead of JSON (for garbage: truncated JSON, bad UTF-8 as `\u{fffd}`).
    pub raw_body: Option<String>,
    /// Extra response headers, e.g. `Retry-After`.
    pub headers: Vec<(String, String)>,
    /// Wait before the response headers.
    pub delay_ms: u64,
    /// Wait between stream chunks.
    pub chunk_delay_ms: u64,
    /// Break the connection after this many content chunks (no usage, no `[DONE]`).
    pub cut_after: Option<usize>,
    /// Stop sending (but keep the connection open) after this many content chunks.
    pub stall_after: Option<usize>,
    /// After this many content chunks, send one event whose data is not JSON (a truncated
    /// chunk), then go on as scripted.
    pub corrupt_after: Option<usize>,
    /// Seeded, probabilistic faults drawn per request (`mock/faults.rs`): a soak's 503s,
    /// cuts and malformed events.
    pub faults: Option<super::faults::Faults>,
    /// The answer text (default: the mock's configured text).
    pub text: Option<String>,
    /// Override the reported usage (0 is a valid value).
    pub prompt_tokens: Option<i64>,
    pub completion_tokens: Option<i64>,
    /// Reasoning tokens (OpenAI reasoning models): reported inside `completion_tokens`, as
    /// OpenAI bills them, and under `completion_tokens_details.reasoning_tokens`.
    pub reasoning_tokens: Option<i64>,
    /// Prompt tokens read from the provider's cache, part of the prompt's count, reported
    /// as each format does: OpenAI's `prompt_tokens_details.cached_tokens` (and the
    /// Responses API's `input_tokens_details`), Anthropic's `cache_read_input_tokens` and
    /// Bedrock's `cacheReadInputTokens` (both beside an input figure without them),
    /// Gemini's `cachedContentTokenCount`.
    pub cached_tokens: Option<i64>,
    /// Stream without the usage chunk even when asked for it.
    pub omit_usage: bool,
    /// The JSON arguments of the tool call the mock makes when the request offers tools
    /// (default `TOOL_ARGUMENTS`; Bedrock's default is `{}`): a real agent's tool, such as
    /// Codex's `exec_command` with a `cmd`, run by the client.
    pub tool_arguments: Option<String>,
    /// A streamed answer made of exactly these SSE events, in either wire format, instead
    /// of the built-in one: each is a `data` payload or an `[event, data]` pair; a payload
    /// that is not a string is sent as its JSON text. `cut_after` / `stall_after` count
    /// every event here. For the cases the built-in answers never produce: parallel tool
    /// calls, refusals, stop sequences, mid-stream errors.
    pub events: Option<Vec<SseEvent>>,
    /// Send each event's bytes in pieces of 3 bytes (each its own HTTP chunk), so every
    /// 2-to-4-byte UTF-8 character and every escape is cut somewhere: a reader must join
    /// them before decoding.
    pub split_writes: bool,
    /// A streamed answer sent as exactly these bytes, each piece its own write, for what no
    /// well-formed SSE carries: a line that never ends, an event that never closes, events
    /// without end. The last piece is sent `raw_repeat` more times (as fast as the reader
    /// takes them, or `chunk_delay_ms` apart as every piece is: a body trickled); then the
    /// answer ends, or with `raw_hold` the connection is held open for an hour. Sent for a
    /// non-streamed request too, and with a non-2xx `status` as the error's body.
    pub raw_stream: Option<Vec<String>>,
    /// As `raw_stream`, for bytes that are not UTF-8 (a byte no character starts with, a
    /// sequence cut short): sent after the `raw_stream` pieces, the last of all repeated.
    pub raw_bytes: Option<Vec<Vec<u8>>>,
    pub raw_repeat: u64,
    pub raw_hold: bool,
    /// Azure's content filter: `prompt` answers Azure's 400 (`code: content_filter`);
    /// `completion` answers with `finish_reason: "content_filter"` (streamed or not).
    pub content_filter: Option<String>,
    /// Answer 400 to a body carrying `stream_options`, as old vLLM and llama.cpp servers do.
    pub reject_stream_options: bool,
    /// The shape of an error answer's body (with a non-2xx `status` and no `body`):
    /// `fastapi` (`{"detail": …}`), `ollama` (`{"error": "…"}`), `vllm` (`{"object":
    /// "error", "message": …}`, Mistral's too), `text` (plain text), `azure` (Azure's 429
    /// body); absent, OpenAI's or Anthropic's.
    pub error_style: Option<String>,
    /// Set by the Azure paths: answers carry Azure's filter verdicts.
    #[serde(skip)]
    pub azure: bool,
}

/// One scripted SSE event: `[event, data]` or a bare `data` payload.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(untagged)]
pub enum SseEvent {
    Named(String, Value),
    Data(Value),
}

impl SseEvent {
    pub(super) fn event(&self) -> Event {
        let text = |v: &Value| match v {
            Value::String(s) => s.clone(),
            other => other.to_string(),
        };
        let (name, data) = match self {
            SseEvent::Named(n, d) => (Some(n.clone()), text(d)),
            SseEvent::Data(d) => (None, text(d)),
        };
        Event {
            name,
            data,
            content: true,
        }
    }
}

pub(super) struct Plan {
    /// Call this tool instead of answering: the request offered tools and has no tool
    /// result yet (the first leg of a tool-use round trip).
    pub(super) tool: Option<String>,
    /// The tool call's JSON arguments (`Script::tool_arguments`).
    pub(super) tool_args: String,
    pub(super) text: String,
    pub(super) prompt: i64,
    pub(super) completion: i64,
    /// Of `completion`, the part spent reasoning (never shown as text).
    pub(super) reasoning: i64,
    /// Of `prompt`, the part read from the provider's cache.
    pub(super) cached: i64,
    pub(super) model: String,
    pub(super) id: String,
    /// How a text answer ends: `stop`, or `content_filter` (`Script::content_filter`).
    pub(super) finish: &'static str,
}

fn plan(cfg: &MockConfig, body: &Value, s: &Script) -> Plan {
    let n = body.get("n").and_then(Value::as_i64).unwrap_or(1).max(1);
    Plan {
        tool: tool_to_call(body),
        tool_args: s
            .tool_arguments
            .clone()
            .unwrap_or_else(|| TOOL_ARGUMENTS.to_string()),
        text: s.text.clone().unwrap_or_else(|| cfg.text.clone()),
        prompt: s.prompt_tokens.unwrap_or(cfg.prompt_tokens),
        completion: s.completion_tokens.unwrap_or(cfg.completion_tokens) * n
            + s.reasoning_tokens.unwrap_or(0),
        reasoning: s.reasoning_tokens.unwrap_or(0),
        cached: s.cached_tokens.unwrap_or(0),
        model: body
            .get("model")
            .and_then(Value::as_str)
            .unwrap_or("mock-model")
            .to_string(),
        id: format!("{:016x}", rand::random::<u64>()),
        finish: match s.content_filter.as_deref() {
            Some("completion") => "content_filter",
            _ => "stop",
        },
    }
}

/// Splits text into word-sized pieces that concatenate back to exactly the text.
pub fn pieces(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    for ch in text.chars() {
        cur.push(ch);
        if ch == ' ' {
            out.push(std::mem::take(&mut cur));
        }
    }
    if !cur.is_empty() {
        out.push(cur);
    }
    out
}

pub(crate) async fn answer(
    cfg: &MockConfig,
    path: &str,
    req: &HttpRequest,
    body: &Value,
    s: Script,
    guard: InFlightGuard,
) -> HttpResponse {
    if s.delay_ms > 0 {
        tokio::time::sleep(Duration::from_millis(s.delay_ms)).await;
    }
    let anthropic = path == "/v1/messages";
    let status = s.status.unwrap_or(200);
    let mut resp = HttpResponse::build(
        actix_web::http::StatusCode::from_u16(status).unwrap_or(actix_web::http::StatusCode::OK),
    );
    for (k, v) in &s.headers {
        resp.insert_header((k.as_str(), v.as_str()));
    }
    let raw = s.raw_stream.is_some() || s.raw_bytes.is_some();
    if raw && !(200..300).contains(&status) {
        return raw_sse(resp, s, guard);
    }
    if let Some(raw) = &s.raw_body {
        return resp.content_type("application/json").body(raw.clone());
    }
    if let Some(b) = &s.body {
        return resp.json(b);
    }
    if !(200..300).contains(&status) {
        let message = format!("mock error {status}");
        match s.error_style.as_deref() {
            Some("fastapi") => return resp.json(json!({"detail": message})),
            Some("ollama") => return resp.json(json!({"error": message})),
            Some("vllm") => {
                return resp.json(json!({"object": "error", "message": message,
                    "type": "BadRequestError", "param": null, "code": status}))
            }
            Some("text") => return resp.content_type("text/plain").body(message),
            Some("azure") => return resp.json(super::azure::rate_limit_error()),
            _ => {}
        }
        let err = if anthropic {
            json!({"type": "error", "error": {"type": "api_error", "message": format!("mock error {status}")}})
        } else {
            json!({"error": {"message": format!("mock error {status}"), "type": "server_error", "param": null, "code": null}})
        };
        return resp.json(err);
    }
    if anthropic {
        if req.headers().get("anthropic-version").is_none() {
            return HttpResponse::BadRequest().json(json!({"type": "error", "error": {"type": "invalid_request_error", "message": "anthropic-version header is required"}}));
        }
        if body.get("max_tokens").and_then(Value::as_i64).is_none() {
            return HttpResponse::BadRequest().json(json!({"type": "error", "error": {"type": "invalid_request_error", "message": "max_tokens: Field required"}}));
        }
        if let Err(problem) = check_anthropic(body) {
            return HttpResponse::BadRequest().json(json!({"type": "error", "error": {"type": "invalid_request_error", "message": problem}}));
        }
    }
    if s.reject_stream_options && body.get("stream_options").is_some() {
        return HttpResponse::BadRequest().json(json!({"object": "error",
            "message": "[{'type': 'extra_forbidden', 'loc': ('body', 'stream_options'), 'msg': 'Extra inputs are not permitted'}]",
            "type": "BadRequestError", "param": null, "code": 400}));
    }
    if s.content_filter.as_deref() == Some("prompt") {
        return HttpResponse::BadRequest().json(super::azure::content_filter_error());
    }
    if path == "/v1/chat/completions" && refuses_max_tokens(body) {
        return HttpResponse::BadRequest().json(json!({"error": {"message": "Unsupported parameter: 'max_tokens' is not supported with this model. Use 'max_completion_tokens' instead.",
            "type": "invalid_request_error", "param": "max_tokens", "code": "unsupported_parameter"}}));
    }
    if path == "/v1/responses" {
        if let Some(err) = super::responses_api::unpersisted_reasoning(body) {
            return HttpResponse::NotFound().json(err);
        }
    }
    if raw {
        return raw_sse(resp, s, guard);
    }
    let p = plan(cfg, body, &s);
    let stream = body.get("stream").and_then(Value::as_bool).unwrap_or(false);
    if let (Some(events), true) = (&s.events, stream) {
        let events = events.iter().map(SseEvent::event).collect();
        return sse(resp, events, &s, guard);
    }
    match (path, stream) {
        ("/v1/responses", false) => resp.json(super::responses_api::answer(&p, body)),
        ("/v1/responses", true) => sse(resp, super::responses_api::events(&p, body, &s), &s, guard),
        ("/v1/embeddings", _) => resp.json(embeddings(body, &p)),
        ("/v1/messages", false) => resp.json(anthropic_message(&p)),
        ("/v1/messages", true) => sse(resp, anthropic_events(&p, &s), &s, guard),
        ("/v1/completions", false) => resp.json(without_usage(openai_completion(&p, body), &s)),
        (_, false) => {
            let mut answer = without_usage(openai_chat(&p, body), &s);
            if s.azure {
                answer["prompt_filter_results"] = super::azure::prompt_filter_results();
            }
            resp.json(answer)
        }
        (_, true) => {
            let usage = body
                .pointer("/stream_options/include_usage")
                .and_then(Value::as_bool)
                .unwrap_or(false)
                && !s.omit_usage;
            let mut events = openai_chunks(&p, path == "/v1/completions", usage);
            if s.azure {
                // Azure's first chunk: the prompt's filter verdict, no choices, no id.
                events.insert(0, Event::data(json!({"choices": [], "created": 0, "id": "",
                    "model": "", "object": "", "prompt_filter_results": super::azure::prompt_filter_results()})));
            }
            sse(resp, events, &s, guard)
        }
    }
}

/// An answer without its `usage` (`Script::omit_usage`: a server that reports none).
fn without_usage(mut answer: Value, s: &Script) -> Value {
    if s.omit_usage {
        if let Some(o) = answer.as_object_mut() {
            o.remove("usage");
        }
    }
    answer
}

fn now() -> i64 {
    chrono::Utc::now().timestamp()
}

/// The arguments every mock tool call carries.
pub const TOOL_ARGUMENTS: &str = r#"{"vin":"WVWZZZ1JZXW000001"}"#;

fn tool_to_call(body: &Value) -> Option<String> {
    if body.get("input").is_some() {
        return super::responses_api::tool_to_call(body);
    }
    let tool = body.pointer("/tools/0")?;
    let name = tool
        .pointer("/function/name")
        .or_else(|| tool.get("name"))?
        .as_str()?
        .to_string();
    let last = body.get("messages")?.as_array()?.last()?;
    let answered = last.get("role").and_then(Value::as_str) == Some("tool")
        || last
            .get("content")
            .and_then(Value::as_array)
            .is_some_and(|blocks| {
                blocks
                    .iter()
                    .any(|b| b.get("type").and_then(Value::as_str) == Some("tool_result"))
            });
    (!answered).then_some(name)
}

/// An OpenAI `usage` object; reasoning tokens are part of `completion_tokens`, as OpenAI
/// reports (and bills) them.
fn openai_usage(p: &Plan) -> Value {
    let mut u = json!({"prompt_tokens": p.prompt, "completion_tokens": p.completion, "total_tokens": p.prompt + p.completion});
    if p.reasoning > 0 {
        u["completion_tokens_details"] = json!({"reasoning_tokens": p.reasoning});
    }
    if p.cached > 0 {
        u["prompt_tokens_details"] = json!({"cached_tokens": p.cached});
    }
    u
}

/// An Anthropic `usage` object: `input_tokens` counts what was not read from the cache.
fn anthropic_usage(p: &Plan, output: i64) -> Value {
    let mut u = json!({"input_tokens": p.prompt - p.cached, "output_tokens": output});
    if p.cached > 0 {
        u["cache_read_input_tokens"] = json!(p.cached);
    }
    u
}

/// OpenAI's reasoning models (o-series, gpt-5 family) refuse `max_tokens`; the mock does
/// too, with OpenAI's error, so a gateway that sends the wrong cap field fails as it would
/// upstream.
fn refuses_max_tokens(body: &Value) -> bool {
    let model = body.get("model").and_then(Value::as_str).unwrap_or("");
    let reasoning = model.starts_with("gpt-5")
        || (model.starts_with('o') && model[1..].starts_with(|c: char| c.is_ascii_digit()));
    reasoning && body.get("max_tokens").is_some()
}

fn openai_chat(p: &Plan, body: &Value) -> Value {
    let n = body.get("n").and_then(Value::as_i64).unwrap_or(1).max(1);
    let choices: Vec<Value> = (0..n)
        .map(|i| match &p.tool {
            Some(name) => json!({"index": i, "message": {"role": "assistant", "content": null, "refusal": null,
                "tool_calls": [{"id": format!("call_{}", p.id), "type": "function", "function": {"name": name, "arguments": p.tool_args}}]},
                "logprobs": null, "finish_reason": "tool_calls"}),
            None => json!({"index": i, "message": {"role": "assistant", "content": p.text, "refusal": null}, "logprobs": null, "finish_reason": p.finish}),
        })
        .collect();
    json!({
        "id": format!("chatcmpl-{}", p.id), "object": "chat.completion", "created": now(), "model": p.model,
        "choices": choices,
        "usage": openai_usage(p),
        "system_fingerprint": "fp_mock"
    })
}

fn openai_completion(p: &Plan, body: &Value) -> Value {
    let n = body.get("n").and_then(Value::as_i64).unwrap_or(1).max(1);
    let choices: Vec<Value> = (0..n)
        .map(|i| json!({"index": i, "text": p.text, "logprobs": null, "finish_reason": "stop"}))
        .collect();
    json!({
        "id": format!("cmpl-{}", p.id), "object": "text_completion", "created": now(), "model": p.model, "choices": choices,
        "usage": openai_usage(p)
    })
}

/// Embeddings that mean something: Sluice's own lexical features folded into 256
/// dimensions, so texts that differ only in identifiers embed alike (a stand-in for a real
/// embedding model in tests of the `http` embedder).
fn embeddings(body: &Value, p: &Plan) -> Value {
    let inputs: Vec<String> = match body.get("input") {
        Some(Value::Array(a)) => a
            .iter()
            .map(|x| x.as_str().map_or_else(|| x.to_string(), str::to_string))
            .collect(),
        Some(Value::String(s)) => vec![s.clone()],
        Some(x) => vec![x.to_string()],
        None => vec![],
    };
    let data: Vec<Value> = inputs
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let mut v = vec![0f64; 256];
            for (f, w) in crate::cache::embed::lexical(s) {
                v[(f % 256) as usize] += f64::from(w) * if f & 0x100 == 0 { 1.0 } else { -1.0 };
            }
            json!({"object": "embedding", "index": i, "embedding": v})
        })
        .collect();
    json!({"object": "list", "data": data, "model": p.model, "usage": {"prompt_tokens": p.prompt, "total_tokens": p.prompt}})
}

/// OpenAI stream events (the `data:` payloads) with the index of the last content chunk.
fn openai_chunks(p: &Plan, legacy: bool, usage: bool) -> Vec<Event> {
    let created = now();
    let id = if legacy {
        format!("cmpl-{}", p.id)
    } else {
        format!("chatcmpl-{}", p.id)
    };
    let object = if legacy {
        "text_completion"
    } else {
        "chat.completion.chunk"
    };
    let choice = |content: Option<&str>, finish: Option<&str>| {
        if legacy {
            json!({"index": 0, "text": content.unwrap_or(""), "logprobs": null, "finish_reason": finish})
        } else {
            let delta = match content {
                Some(c) => json!({"content": c}),
                None if finish.is_none() => json!({"role": "assistant", "content": ""}),
                None => json!({}),
            };
            json!({"index": 0, "delta": delta, "logprobs": null, "finish_reason": finish})
        }
    };
    let chunk = |c: Value| {
        Event::data(
            json!({"id": id, "object": object, "created": created, "model": p.model, "choices": [c]}),
        )
    };
    let mut out = Vec::new();
    if !legacy {
        out.push(chunk(choice(None, None)));
    }
    match (&p.tool, legacy) {
        (Some(name), false) => {
            out.push(chunk(json!({"index": 0, "delta": {"tool_calls": [{"index": 0, "id": format!("call_{}", p.id), "type": "function",
                "function": {"name": name, "arguments": ""}}]}, "logprobs": null, "finish_reason": null})));
            let (a, b) = p.tool_args.split_at(p.tool_args.len() / 2);
            for part in [a, b] {
                out.push(chunk(json!({"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": part}}]},
                    "logprobs": null, "finish_reason": null})).content());
            }
            out.push(chunk(choice(None, Some("tool_calls"))));
        }
        _ => {
            for piece in pieces(&p.text) {
                out.push(chunk(choice(Some(&piece), None)).content());
            }
            out.push(chunk(choice(None, Some(p.finish))));
        }
    }
    if usage {
        out.push(Event::data(
            json!({"id": id, "object": object, "created": created, "model": p.model, "choices": [],
            "usage": openai_usage(p)}),
        ));
    }
    out.push(Event {
        name: None,
        data: "[DONE]".into(),
        content: false,
    });
    out
}

fn anthropic_message(p: &Plan) -> Value {
    let (content, stop) = match &p.tool {
        Some(name) => {
            let input: Value = serde_json::from_str(&p.tool_args).unwrap_or_default();
            (
                json!([{"type": "tool_use", "id": format!("toolu_{}", p.id), "name": name, "input": input}]),
                "tool_use",
            )
        }
        None => (json!([{"type": "text", "text": p.text}]), "end_turn"),
    };
    json!({
        "id": format!("msg_{}", p.id), "type": "message", "role": "assistant", "model": p.model,
        "content": content,
        "stop_reason": stop, "stop_sequence": null,
        "usage": anthropic_usage(p, p.completion)
    })
}

fn anthropic_events(p: &Plan, s: &Script) -> Vec<Event> {
    let ev = |name: &str, v: Value| Event {
        name: Some(name.into()),
        data: v.to_string(),
        content: false,
    };
    let mut out = vec![
        ev(
            "message_start",
            json!({"type": "message_start", "message": {"id": format!("msg_{}", p.id), "type": "message", "role": "assistant",
            "model": p.model, "content": [], "stop_reason": null, "stop_sequence": null,
            "usage": anthropic_usage(p, 1)}}),
        ),
        ev("ping", json!({"type": "ping"})),
    ];
    let stop = match &p.tool {
        Some(name) => {
            out.push(ev("content_block_start", json!({"type": "content_block_start", "index": 0,
                "content_block": {"type": "tool_use", "id": format!("toolu_{}", p.id), "name": name, "input": {}}})));
            let (a, b) = p.tool_args.split_at(p.tool_args.len() / 2);
            for part in [a, b] {
                let mut e = ev(
                    "content_block_delta",
                    json!({"type": "content_block_delta", "index": 0,
                    "delta": {"type": "input_json_delta", "partial_json": part}}),
                );
                e.content = true;
                out.push(e);
            }
            "tool_use"
        }
        None => {
            out.push(ev(
                "content_block_start",
                json!({"type": "content_block_start", "index": 0,
                "content_block": {"type": "text", "text": ""}}),
            ));
            for piece in pieces(&p.text) {
                let mut e = ev(
                    "content_block_delta",
                    json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": piece}}),
                );
                e.content = true;
                out.push(e);
            }
            "end_turn"
        }
    };
    out.push(ev(
        "content_block_stop",
        json!({"type": "content_block_stop", "index": 0}),
    ));
    let usage = if s.omit_usage {
        json!({})
    } else {
        json!({"output_tokens": p.completion})
    };
    out.push(ev("message_delta", json!({"type": "message_delta", "delta": {"stop_reason": stop, "stop_sequence": null}, "usage": usage})));
    out.push(ev("message_stop", json!({"type": "message_stop"})));
    out
}

pub(super) struct Event {
    pub(super) name: Option<String>,
    pub(super) data: String,
    /// A content chunk (counted by `cut_after` / `stall_after`).
    pub(super) content: bool,
}

impl Event {
    pub(super) fn data(v: Value) -> Event {
        Event {
            name: None,
            data: v.to_string(),
            content: false,
        }
    }
    pub(super) fn content(mut self) -> Event {
        self.content = true;
        self
    }
    fn bytes(&self) -> Bytes {
        match &self.name {
            Some(n) => Bytes::from(format!("event: {n}\ndata: {}\n\n", self.data)),
            None => Bytes::from(format!("data: {}\n\n", self.data)),
        }
    }
}

pub(super) fn sse(
    mut resp: actix_web::HttpResponseBuilder,
    events: Vec<Event>,
    s: &Script,
    guard: InFlightGuard,
) -> HttpResponse {
    let delay = Duration::from_millis(s.chunk_delay_ms);
    let (cut, stall, split) = (s.cut_after, s.stall_after, s.split_writes);
    let mut corrupt = s.corrupt_after;
    let body = async_stream::stream! {
        let _guard = guard;
        let mut sent_content = 0usize;
        for (i, e) in events.iter().enumerate() {
            if i > 0 && !delay.is_zero() {
                tokio::time::sleep(delay).await;
            }
            if e.content {
                if cut == Some(sent_content) {
                    // Let what was sent reach the wire first, as a real broken connection would.
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    yield Err(std::io::Error::other("mock: stream cut"));
                    return;
                }
                if stall == Some(sent_content) {
                    tokio::time::sleep(Duration::from_secs(3600)).await;
                }
                if corrupt == Some(sent_content) {
                    corrupt = None;
                    yield Ok(Bytes::from_static(b"data: {\"choices\": [{\"delta\": {\"content\": \"tru\n\n"));
                }
                sent_content += 1;
            }
            let mut bytes = e.bytes();
            while split && bytes.len() > 3 {
                yield Ok::<Bytes, std::io::Error>(bytes.split_to(3));
            }
            yield Ok::<Bytes, std::io::Error>(bytes);
        }
    };
    resp.content_type("text/event-stream")
        .insert_header(("cache-control", "no-cache"))
        .streaming(body)
}

/// `Script::raw_stream` and `raw_bytes`: the pieces verbatim, `chunk_delay_ms` apart, the
/// last one `raw_repeat` more times, then the end (or an hour's hold).
fn raw_sse(
    mut resp: actix_web::HttpResponseBuilder,
    s: Script,
    guard: InFlightGuard,
) -> HttpResponse {
    let pieces: Vec<Bytes> = (s.raw_stream.unwrap_or_default().into_iter())
        .map(Bytes::from)
        .chain(s.raw_bytes.unwrap_or_default().into_iter().map(Bytes::from))
        .collect();
    let (repeat, hold) = (s.raw_repeat, s.raw_hold);
    let delay = Duration::from_millis(s.chunk_delay_ms);
    let body = async_stream::stream! {
        let _guard = guard;
        let repeated = pieces.last().into_iter().flat_map(|last| std::iter::repeat_n(last, usize::try_from(repeat).unwrap_or(usize::MAX)));
        for (i, p) in pieces.iter().chain(repeated).enumerate() {
            if i > 0 && !delay.is_zero() {
                tokio::time::sleep(delay).await;
            }
            yield Ok::<Bytes, std::io::Error>(p.clone());
        }
        if hold {
            tokio::time::sleep(Duration::from_secs(3600)).await;
        }
    };
    resp.content_type("text/event-stream")
        .insert_header(("cache-control", "no-cache"))
        .streaming(body)
}

/// What Anthropic's Messages API insists on, so a translation that breaks it fails here as
/// it would against the real API.
fn check_anthropic(body: &Value) -> Result<(), String> {
    let msgs = body
        .get("messages")
        .and_then(Value::as_array)
        .ok_or("messages: Field required")?;
    let mut expect = "user";
    for (i, m) in msgs.iter().enumerate() {
        let role = m.get("role").and_then(Value::as_str).unwrap_or("");
        if role != expect {
            return Err(format!("messages.{i}.role: roles must alternate between user and assistant, starting with user"));
        }
        expect = if role == "user" { "assistant" } else { "user" };
        if let Some(blocks) = m.get("content").and_then(Value::as_array) {
            for b in blocks {
                match b.get("type").and_then(Value::as_str) {
                    Some("text") if b.get("text").is_some_and(Value::is_string) => {}
                    Some("image")
                        if matches!(
                            b.pointer("/source/type").and_then(Value::as_str),
                            Some("base64" | "url" | "file")
                        ) => {}
                    Some("document")
                        if matches!(
                            b.pointer("/source/type").and_then(Value::as_str),
                            Some("base64" | "url" | "text" | "content" | "file")
                        ) => {}
                    Some("thinking") if b.get("signature").is_some_and(Value::is_string) => {}
                    Some("redacted_thinking") if b.get("data").is_some_and(Value::is_string) => {}
                    Some("search_result")
                        if b.get("source").is_some()
                            && b.get("content").is_some_and(Value::is_array) => {}
                    Some("tool_use")
                        if b.get("id").is_some()
                            && b.get("input").is_some_and(Value::is_object) => {}
                    Some("tool_result") if b.get("tool_use_id").is_some() => {}
                    // A server-tool turn sent back in the history, as Anthropic takes it.
                    Some("server_tool_use")
                        if b.get("id").is_some()
                            && b.get("input").is_some_and(Value::is_object) => {}
                    Some("web_search_tool_result" | "web_fetch_tool_result")
                        if b.get("tool_use_id").is_some() => {}
                    other => {
                        return Err(format!(
                            "messages.{i}.content: invalid block type {other:?}"
                        ))
                    }
                }
            }
        } else if !m.get("content").is_some_and(Value::is_string) {
            return Err(format!("messages.{i}.content: Field required"));
        }
    }
    if body
        .get("system")
        .is_some_and(|s| !(s.is_string() || s.is_array()))
    {
        return Err("system: must be a string or a list of text blocks".into());
    }
    for t in body
        .get("tools")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        // A server tool (`web_search_20250305`, …) has a versioned `type` and no schema.
        let server = t
            .get("type")
            .and_then(Value::as_str)
            .is_some_and(|k| k != "custom");
        if !t.get("name").is_some_and(Value::is_string)
            || !(server || t.get("input_schema").is_some_and(Value::is_object))
        {
            return Err("tools: each tool needs a name and an input_schema".into());
        }
    }
    Ok(())
}
