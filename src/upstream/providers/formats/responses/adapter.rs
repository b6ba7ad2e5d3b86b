//! The Responses API as a client format over the internal form (`canonical`): a request
//! (validated, its input expanded with the stored history) read into a `Request`; an
//! `Answer` written as a response object; the internal form's stream events written as the
//! Responses stream events (each with its `sequence_number`); an error written in OpenAI's
//! shape. Used for every upstream that does not speak the Responses API itself.
//!
//! Reasoning items are carried as `Part::Reasoning` (`encrypted_content` as the signature,
//! the reasoning text or else the summary as the text): an upstream whose adapter can send
//! them back does, one that cannot refuses them by name (`check_upstream`), never drops
//! them.

use bytes::Bytes;
use serde_json::{json, Map, Value};

use super::super::{data_url, function_tool, refuse, UPSTREAM};
use super::stream::error_frame;
use super::{echo, Stamp, GATEWAY_FIELDS};
use crate::upstream::providers::canonical::{
    Answer, ErrorInfo, Event, Finish, Message, Part, Reasoning, Request, ResponseFormat, Role,
    Source, ToolChoice, Usage,
};
use crate::upstream::providers::translate::stream::frame;
use crate::upstream::providers::translate::TranslateError;
use crate::upstream::providers::Format;

/// Request fields the internal form has no counterpart for: refused unless at their
/// default, named as the client sent them.
const NOT_TRANSLATED: &[&str] = &[
    "include",
    "top_logprobs",
    "max_tool_calls",
    "safety_identifier",
];

/// Request fields that are the client's own bookkeeping or a caching hint: not sent to a
/// translated upstream, and named in `Request::dropped`. `metadata` belongs to the
/// response object the gateway serves and stores (echoed there), so it is not sent either
/// and loses nothing.
const NOT_SENT: &[&str] = &["client_metadata", "prompt_cache_key"];

/// Fields read into the internal form (or, `truncation`, the gateway's own: it never
/// truncates).
const READ: &[&str] = &[
    "model",
    "input",
    "instructions",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "max_output_tokens",
    "temperature",
    "top_p",
    "metadata",
    "user",
    "stream",
    "reasoning",
    "service_tier",
    "truncation",
    "text",
];

fn served(field: &str) -> TranslateError {
    TranslateError {
        param: None,
        message: format!(
            "`{field}` cannot be served by this model's upstream (it does not speak the Responses API)."
        ),
    }
}

/// A Responses request (already validated, input expanded) in the internal form.
pub fn read_request(body: &Map<String, Value>) -> Result<Request, TranslateError> {
    let mut dropped = Vec::new();
    for (k, v) in body {
        if GATEWAY_FIELDS.contains(&k.as_str()) || READ.contains(&k.as_str()) {
            continue;
        }
        if let Some(name) = NOT_SENT.iter().find(|n| **n == k) {
            if !v.is_null() {
                dropped.push(*name);
            }
            continue;
        }
        if NOT_TRANSLATED.contains(&k.as_str()) {
            let set = match v {
                Value::Null => false,
                Value::Array(a) if k == "include" => {
                    a.iter().any(|v| v != "reasoning.encrypted_content")
                }
                _ => true,
            };
            if set {
                let mut e = served(k);
                e.param = NOT_TRANSLATED.iter().copied().find(|n| n == k);
                return Err(e);
            }
            continue;
        }
        if !v.is_null() {
            return Err(served(k));
        }
    }
    let mut r = Request {
        model: body
            .get("model")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string(),
        stream: body.get("stream").and_then(Value::as_bool).unwrap_or(false),
        include_usage: true,
        dropped,
        // The client's names of the fields an upstream may drop or refuse.
        names: vec![
            ("tools[].strict", "tools.strict"),
            ("input_image.detail", "detail"),
            ("text", "response_format"),
        ],
        ..Request::default()
    };
    if let Some(i) = body.get("instructions").and_then(Value::as_str) {
        r.system.push(text(i));
    }
    match body.get("input") {
        Some(Value::String(s)) => r.messages.push(Message {
            role: Role::User,
            content: vec![text(s)],
            name: None,
            plain: true,
        }),
        Some(Value::Array(items)) => {
            for (i, item) in items.iter().enumerate() {
                read_item(i, item, &mut r)?;
            }
        }
        _ => {
            return Err(refuse(
                "input",
                "`input` must be a string or an array of items",
            ))
        }
    }
    read_tools(body, &mut r)?;
    r.parallel_tool_calls = body.get("parallel_tool_calls").and_then(Value::as_bool);
    r.max_output_tokens = body.get("max_output_tokens").and_then(Value::as_i64);
    r.temperature = body.get("temperature").and_then(Value::as_f64);
    r.top_p = body.get("top_p").and_then(Value::as_f64);
    r.user = body.get("user").and_then(Value::as_str).map(str::to_string);
    r.service_tier = body
        .get("service_tier")
        .and_then(Value::as_str)
        .map(str::to_string);
    if let Some(x) = body.get("reasoning").filter(|x| !x.is_null()) {
        let s = |k: &str| x.get(k).and_then(Value::as_str).map(str::to_string);
        let reasoning = Reasoning {
            effort: s("effort"),
            budget_tokens: None,
            summary: s("summary"),
        };
        if reasoning.effort.is_some() || reasoning.summary.is_some() {
            r.reasoning = Some(reasoning);
            r.names.push(("reasoning", "reasoning"));
        }
    }
    if let Some(t) = body.get("text").filter(|t| !t.is_null()) {
        if t.get("verbosity").is_some_and(|v| !v.is_null()) {
            return Err(refuse(
                "text",
                "`text.verbosity` cannot be served by this model's upstream",
            ));
        }
        r.response_format = match t.pointer("/format/type").and_then(Value::as_str) {
            None | Some("text") => None,
            Some("json_object") => Some(ResponseFormat::JsonObject),
            Some("json_schema") => {
                let f = &t["format"];
                Some(ResponseFormat::JsonSchema {
                    name: f
                        .get("name")
                        .and_then(Value::as_str)
                        .unwrap_or_default()
                        .to_string(),
                    schema: f.get("schema").cloned().unwrap_or(Value::Null),
                    strict: f.get("strict").and_then(Value::as_bool),
                    description: f
                        .get("description")
                        .and_then(Value::as_str)
                        .map(str::to_string),
                })
            }
            Some(other) => {
                return Err(refuse(
                    "text",
                    format!("`text.format` type `{other}` is not supported"),
                ))
            }
        };
    }
    Ok(r)
}

fn text(s: &str) -> Part {
    Part::Text {
        text: s.to_string(),
        cache: None,
    }
}

fn read_tools(body: &Map<String, Value>, r: &mut Request) -> Result<(), TranslateError> {
    if let Some(Value::Array(tools)) = body.get("tools") {
        for t in tools {
            // Codex's optional tool groups (its sub-agent tools, `multi_agent_v1`): a
            // namespaced call has no counterpart in any other format, and refusing the
            // group refuses every Codex request. Left out, and announced.
            if t.get("type").and_then(Value::as_str) == Some("namespace") {
                r.drop_field("tools[].namespace");
                continue;
            }
            if t.get("type").and_then(Value::as_str) != Some("function") {
                let kind = t.get("type").and_then(Value::as_str).unwrap_or("?");
                return Err(refuse("tools", format!("tools of type `{kind}` cannot be served by this model's upstream; only `function` tools can")));
            }
            r.tools.push(function_tool(t));
        }
    }
    r.tool_choice = match body.get("tool_choice") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(match s.as_str() {
            "auto" => ToolChoice::Auto,
            "none" => ToolChoice::None,
            "required" => ToolChoice::Required,
            _ => {
                return Err(refuse(
                    "tool_choice",
                    format!("`tool_choice` `{s}` cannot be served by this model's upstream"),
                ))
            }
        }),
        Some(c) if c.get("type").and_then(Value::as_str) == Some("function") => {
            Some(ToolChoice::Named(
                c.get("name")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .into(),
            ))
        }
        Some(_) => {
            return Err(refuse(
                "tool_choice",
                "this `tool_choice` cannot be served by this model's upstream",
            ))
        }
    };
    Ok(())
}

/// Appends `part` to the last message if it has `role` (consecutive calls are one turn,
/// consecutive outputs one tool message), else a new message.
fn push_to(r: &mut Request, role: Role, part: Part) {
    match r.messages.last_mut() {
        Some(m) if m.role == role && !m.plain => m.content.push(part),
        _ => r.messages.push(Message {
            role,
            content: vec![part],
            name: None,
            plain: false,
        }),
    }
}

/// One input item into the internal form.
fn read_item(i: usize, item: &Value, r: &mut Request) -> Result<(), TranslateError> {
    let kind = item
        .get("type")
        .and_then(Value::as_str)
        .unwrap_or("message");
    match kind {
        "message" => {
            let role = item.get("role").and_then(Value::as_str).unwrap_or("user");
            let (content, plain) = match item.get("content") {
                Some(Value::String(s)) => (vec![text(s)], true),
                Some(Value::Array(parts)) => (
                    parts.iter().map(read_part).collect::<Result<_, _>>()?,
                    false,
                ),
                _ => {
                    return Err(refuse(
                        "input",
                        format!("input[{i}]: a message needs `content`"),
                    ))
                }
            };
            let role = match role {
                "system" | "developer" if r.messages.is_empty() => {
                    r.system.extend(content);
                    return Ok(());
                }
                // Kept at its place: Codex tells the model of changes (approval mode,
                // environment) this way in the middle of a conversation.
                "system" | "developer" => Role::System,
                "assistant" => Role::Assistant,
                _ => Role::User,
            };
            r.messages.push(Message {
                role,
                content,
                name: None,
                plain,
            });
        }
        "function_call" => {
            let s = |k: &str| {
                item.get(k)
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_string()
            };
            let call = Part::ToolCall {
                id: s("call_id"),
                name: s("name"),
                arguments: s("arguments"),
            };
            push_to(r, Role::Assistant, call);
        }
        "function_call_output" => {
            let (content, plain) = match &item["output"] {
                Value::String(s) => (vec![text(s)], true),
                Value::Array(parts) => (
                    parts.iter().map(read_part).collect::<Result<_, _>>()?,
                    false,
                ),
                _ => {
                    return Err(refuse(
                        "input",
                        format!("input[{i}]: `output` must be a string or an array of parts"),
                    ))
                }
            };
            let result = Part::ToolResult {
                call_id: item
                    .get("call_id")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_string(),
                content,
                is_error: false,
                cache: None,
                plain,
            };
            push_to(r, Role::Tool, result);
        }
        "reasoning" => {
            let texts = |k: &str| -> Vec<String> {
                item.get(k)
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                    .filter_map(|p| p.get("text").and_then(Value::as_str))
                    .map(str::to_string)
                    .collect()
            };
            let content = texts("content");
            let text = if content.is_empty() {
                texts("summary").join("\n\n")
            } else {
                content.concat()
            };
            let part = Part::Reasoning {
                text,
                signature: item
                    .get("encrypted_content")
                    .and_then(Value::as_str)
                    .map(str::to_string),
                redacted: None,
            };
            push_to(r, Role::Assistant, part);
        }
        other => {
            return Err(refuse(
                "input",
                format!(
                    "input[{i}]: items of type `{other}` cannot be served by this model's upstream"
                ),
            ))
        }
    }
    Ok(())
}

fn read_part(p: &Value) -> Result<Part, TranslateError> {
    let s = |k: &str| p.get(k).and_then(Value::as_str).map(str::to_string);
    match p.get("type").and_then(Value::as_str) {
        Some("input_text" | "output_text") => Ok(text(&s("text").unwrap_or_default())),
        Some("refusal") => Ok(Part::Refusal {
            text: s("refusal").unwrap_or_default(),
        }),
        Some("input_image") => {
            let source = match (s("image_url"), s("file_id")) {
                (Some(url), _) => url_source(&url),
                (None, Some(id)) => {
                    return Err(refuse(
                        "input",
                        format!("an `input_image` by `file_id` ({id}) cannot be served by this model's upstream"),
                    ))
                }
                (None, None) => {
                    return Err(refuse(
                        "input",
                        "an `input_image` needs `image_url`",
                    ))
                }
            };
            Ok(Part::Image {
                source,
                detail: s("detail"),
                cache: None,
            })
        }
        Some("input_file") => {
            if p.get("file_url").is_some_and(|v| !v.is_null()) {
                return Err(refuse(
                    "input",
                    "an `input_file` by `file_url` cannot be served by this model's upstream",
                ));
            }
            let source = match (s("file_data"), s("file_id")) {
                (Some(data), _) => url_source(&data),
                (None, Some(id)) => Source::FileId(id),
                (None, None) => {
                    return Err(refuse(
                        "input",
                        "an `input_file` needs `file_data` or `file_id`",
                    ))
                }
            };
            Ok(Part::File {
                source,
                filename: s("filename"),
                cache: None,
            })
        }
        other => Err(refuse(
            "input",
            format!("content parts of type {other:?} cannot be served by this model's upstream"),
        )),
    }
}

fn url_source(url: &str) -> Source {
    match data_url(url) {
        Some((media_type, data)) => Source::Base64 {
            media_type: media_type.to_string(),
            data: data.to_string(),
        },
        None => Source::Url(url.to_string()),
    }
}

/// What the upstream's format cannot take of a Responses request, refused naming the item:
/// OpenAI chat completions have no place for reasoning (`formats::openai_chat` would name
/// it as Anthropic's `thinking`; a Responses client sent a `reasoning` item).
pub fn check_upstream(body: &Map<String, Value>, upstream: Format) -> Result<(), TranslateError> {
    if upstream != Format::OpenAiChat {
        return Ok(());
    }
    let items = body
        .get("input")
        .and_then(Value::as_array)
        .into_iter()
        .flatten();
    for (i, item) in items.enumerate() {
        if item.get("type").and_then(Value::as_str) == Some("reasoning") {
            return Err(refuse(
                "input",
                format!("input[{i}]: a `reasoning` item cannot be sent to {UPSTREAM} (chat completions have no place for reasoning), and Sluice does not drop it; send the conversation without it, or continue on a model served by the Responses API"),
            ));
        }
    }
    Ok(())
}

/// A Responses `usage` object in the internal form (`input_tokens` includes the cached
/// ones, `output_tokens` the reasoning ones); `None` when it is not in that shape.
pub fn read_usage(u: &Value) -> Option<Usage> {
    let p = super::usage_of(u)?;
    let n = |k: &str| crate::upstream::providers::tokens(u.pointer(k)).unwrap_or(0);
    Some(Usage {
        input: p.input,
        output: p.output,
        cached_input: p.cached_input,
        reasoning: n("/output_tokens_details/reasoning_tokens"),
        ..Usage::default()
    })
}

/// Responses `usage` from the internal form's figures.
pub fn usage_json(u: &Usage) -> Value {
    json!({
        "input_tokens": u.input,
        "input_tokens_details": {"cached_tokens": u.cached_input},
        "output_tokens": u.output,
        "output_tokens_details": {"reasoning_tokens": u.reasoning},
        "total_tokens": u.input + u.output,
    })
}

/// A response object around `output` (the request's echo fields, the status from the
/// answer's finish).
fn response_object(
    body: &Map<String, Value>,
    model: &str,
    created: i64,
    output: Vec<Value>,
    finish: Option<&Finish>,
    usage: Value,
) -> Value {
    let (status, incomplete) = match finish {
        Some(Finish::Length) => ("incomplete", json!({"reason": "max_output_tokens"})),
        Some(Finish::ContentFilter) => ("incomplete", json!({"reason": "content_filter"})),
        _ => ("completed", Value::Null),
    };
    let mut o = echo(body);
    o.insert("id".into(), json!(""));
    o.insert("object".into(), json!("response"));
    o.insert("created_at".into(), json!(created));
    o.insert("status".into(), json!(status));
    o.insert("error".into(), Value::Null);
    o.insert("incomplete_details".into(), incomplete);
    o.insert("model".into(), json!(model));
    o.insert("output".into(), Value::Array(output));
    o.insert("usage".into(), usage);
    Value::Object(o)
}

fn reasoning_item(id: String, text: &str, signature: Option<&str>) -> Value {
    let mut item = json!({"type": "reasoning", "id": id,
        "summary": [], "content": [{"type": "reasoning_text", "text": text}]});
    if let Some(sig) = signature {
        item["encrypted_content"] = json!(sig);
    }
    item
}

/// An answer as a response object for the request `body` (its echo fields); item ids
/// are made of `item_ids` (the gateway's response id without `resp_`). The caller stamps
/// the gateway's id (`Stamp::apply`).
pub fn write_answer(a: &Answer, body: &Map<String, Value>, item_ids: &str) -> Value {
    let mut output = Vec::new();
    let mut text = String::new();
    let mut refusal = String::new();
    let mut calls = Vec::new();
    for (n, p) in a.content.iter().enumerate() {
        match p {
            Part::Text { text: t, .. } => text.push_str(t),
            Part::Refusal { text: t } => refusal.push_str(t),
            Part::Reasoning {
                text,
                signature,
                redacted,
            } => output.push(reasoning_item(
                format!("rs_{item_ids}_{n}"),
                text,
                signature.as_deref().or(redacted.as_deref()),
            )),
            Part::ToolCall {
                id,
                name,
                arguments,
            } => calls.push((id, name, arguments)),
            _ => {}
        }
    }
    let mut parts = Vec::new();
    if !text.is_empty() {
        parts.push(json!({"type": "output_text", "text": text, "annotations": []}));
    }
    if !refusal.is_empty() {
        parts.push(json!({"type": "refusal", "refusal": refusal}));
    }
    if !parts.is_empty() {
        output.push(
            json!({"type": "message", "id": format!("msg_{item_ids}"), "status": "completed",
            "role": "assistant", "content": parts}),
        );
    }
    for (i, (id, name, arguments)) in calls.into_iter().enumerate() {
        output.push(
            json!({"type": "function_call", "id": format!("fc_{item_ids}_{i}"),
            "call_id": id, "name": name, "arguments": arguments, "status": "completed"}),
        );
    }
    let usage = a.usage.as_ref().map_or(Value::Null, usage_json);
    response_object(
        body,
        &a.model,
        a.created.unwrap_or_else(|| chrono::Utc::now().timestamp()),
        output,
        Some(&a.finish),
        usage,
    )
}

/// An error in OpenAI's shape (what the Responses API answers).
pub fn write_error(e: &ErrorInfo) -> Value {
    super::super::openai_chat::write_error(e)
}

/// An item the stream has opened.
#[derive(Debug)]
enum Open {
    Message {
        index: usize,
        text: String,
    },
    Call {
        index: usize,
        id: String,
        call_id: String,
        name: String,
        args: String,
    },
    Reasoning {
        index: usize,
        id: String,
        text: String,
        signature: Option<String>,
    },
}

/// The internal form's stream events as the Responses stream: `response.created`,
/// `response.in_progress`, per item `response.output_item.added`,
/// (`response.content_part.added`, `response.output_text.delta`…, `…done`) or
/// (`response.function_call_arguments.delta`…, `…done`) or (a reasoning item's
/// `response.reasoning_text.delta`…, `…done`), `response.output_item.done`, and
/// `response.completed` (or `response.incomplete`) with the usage; an upstream's error as
/// the `error` event. Keeps the final response object for the stored copy.
pub struct EventWriter {
    body: Map<String, Value>,
    stamp: Stamp,
    seq: u64,
    started: bool,
    model: String,
    created: i64,
    /// Items complete, in output order.
    done_items: Vec<Value>,
    /// The open message or reasoning item, if any.
    message: Option<Open>,
    /// Open tool calls by the internal form's block index.
    calls: Vec<(usize, Open)>,
    finish: Option<Finish>,
    /// The figures told so far (`null` in the response until the first).
    usage: Option<Usage>,
    item_ids: String,
    pub completed: Option<Value>,
}

impl EventWriter {
    pub fn new(body: Map<String, Value>, stamp: Stamp) -> Self {
        let item_ids = stamp.id.trim_start_matches("resp_").to_string();
        EventWriter {
            body,
            stamp,
            seq: 0,
            started: false,
            model: String::new(),
            created: 0,
            done_items: Vec::new(),
            message: None,
            calls: Vec::new(),
            finish: None,
            usage: None,
            item_ids,
            completed: None,
        }
    }

    pub fn next_seq(&self) -> u64 {
        self.seq
    }

    fn emit(&mut self, kind: &str, mut v: Value, out: &mut Vec<Bytes>) {
        v["type"] = json!(kind);
        v["sequence_number"] = json!(self.seq);
        self.seq += 1;
        out.push(frame(Some(kind), &v.to_string()));
    }

    fn response(&self, status_done: bool) -> Value {
        let mut r = if status_done {
            response_object(
                &self.body,
                &self.model,
                self.created,
                self.done_items.clone(),
                self.finish.as_ref(),
                self.usage.as_ref().map_or(Value::Null, usage_json),
            )
        } else {
            let mut r = response_object(
                &self.body,
                &self.model,
                self.created,
                vec![],
                None,
                Value::Null,
            );
            r["status"] = json!("in_progress");
            r
        };
        self.stamp.apply(&mut r);
        r
    }

    fn next_index(&self) -> usize {
        self.done_items.len() + usize::from(self.message.is_some()) + self.calls.len()
    }

    fn close_message(&mut self, out: &mut Vec<Bytes>) {
        match self.message.take() {
            Some(Open::Message { index, text }) => {
                let id = format!("msg_{}", self.item_ids);
                self.emit("response.output_text.done", json!({"item_id": id, "output_index": index, "content_index": 0, "text": text, "logprobs": []}), out);
                let part = json!({"type": "output_text", "text": text, "annotations": []});
                self.emit(
                    "response.content_part.done",
                    json!({"item_id": id, "output_index": index, "content_index": 0, "part": part}),
                    out,
                );
                let item = json!({"type": "message", "id": id, "status": "completed", "role": "assistant", "content": [part]});
                self.emit(
                    "response.output_item.done",
                    json!({"output_index": index, "item": item}),
                    out,
                );
                self.done_items.push(item);
            }
            Some(Open::Reasoning {
                index,
                id,
                text,
                signature,
            }) => {
                self.emit(
                    "response.reasoning_text.done",
                    json!({"item_id": id, "output_index": index, "content_index": 0, "text": text}),
                    out,
                );
                let item = reasoning_item(id, &text, signature.as_deref());
                self.emit(
                    "response.output_item.done",
                    json!({"output_index": index, "item": item}),
                    out,
                );
                self.done_items.push(item);
            }
            _ => {}
        }
    }

    fn close_calls(&mut self, out: &mut Vec<Bytes>) {
        for (_, open) in std::mem::take(&mut self.calls) {
            let Open::Call {
                index,
                id,
                call_id,
                name,
                args,
            } = open
            else {
                continue;
            };
            self.emit(
                "response.function_call_arguments.done",
                json!({"item_id": id, "output_index": index, "name": name, "arguments": args}),
                out,
            );
            let item = json!({"type": "function_call", "id": id, "call_id": call_id, "name": name, "arguments": args, "status": "completed"});
            self.emit(
                "response.output_item.done",
                json!({"output_index": index, "item": item}),
                out,
            );
            self.done_items.push(item);
        }
    }

    fn start(&mut self, out: &mut Vec<Bytes>) {
        if self.started {
            return;
        }
        self.started = true;
        let r = self.response(false);
        self.emit("response.created", json!({"response": r}), out);
        self.emit("response.in_progress", json!({"response": r}), out);
    }

    /// Opens a message item unless one is open (closing open calls or reasoning first).
    fn open_message(&mut self, out: &mut Vec<Bytes>) -> usize {
        if let Some(Open::Message { index, .. }) = &self.message {
            return *index;
        }
        self.close_message(out);
        self.close_calls(out);
        let index = self.next_index();
        let id = format!("msg_{}", self.item_ids);
        self.emit("response.output_item.added", json!({"output_index": index,
            "item": {"type": "message", "id": id, "status": "in_progress", "role": "assistant", "content": []}}), out);
        self.emit(
            "response.content_part.added",
            json!({"item_id": id, "output_index": index, "content_index": 0,
            "part": {"type": "output_text", "text": "", "annotations": []}}),
            out,
        );
        self.message = Some(Open::Message {
            index,
            text: String::new(),
        });
        index
    }

    /// Opens a reasoning item unless one is open.
    fn open_reasoning(&mut self, out: &mut Vec<Bytes>) {
        if matches!(self.message, Some(Open::Reasoning { .. })) {
            return;
        }
        self.close_message(out);
        self.close_calls(out);
        let index = self.next_index();
        let id = format!("rs_{}_{}", self.item_ids, index);
        self.emit(
            "response.output_item.added",
            json!({"output_index": index,
            "item": {"type": "reasoning", "id": id, "summary": [], "content": []}}),
            out,
        );
        self.message = Some(Open::Reasoning {
            index,
            id,
            text: String::new(),
            signature: None,
        });
    }

    /// Writes the Responses events of one internal-form event.
    pub fn write(&mut self, e: &Event, out: &mut Vec<Bytes>) {
        match e {
            Event::Start { model, created, .. } => {
                if !self.started {
                    self.model = model.clone();
                    // An upstream that gives none (Anthropic): the time the answer began.
                    self.created = created.unwrap_or_else(|| chrono::Utc::now().timestamp());
                }
                self.start(out);
            }
            Event::TextDelta { text, .. } if !text.is_empty() => {
                self.start(out);
                let index = self.open_message(out);
                if let Some(Open::Message { text: t, .. }) = &mut self.message {
                    t.push_str(text);
                }
                let id = format!("msg_{}", self.item_ids);
                self.emit("response.output_text.delta", json!({"item_id": id, "output_index": index, "content_index": 0, "delta": text, "logprobs": []}), out);
            }
            Event::ReasoningStart { .. } => {
                self.start(out);
                self.open_reasoning(out);
            }
            Event::ReasoningDelta { text, .. } if !text.is_empty() => {
                self.start(out);
                self.open_reasoning(out);
                let mut ev = None;
                if let Some(Open::Reasoning {
                    index, id, text: t, ..
                }) = &mut self.message
                {
                    t.push_str(text);
                    ev = Some(
                        json!({"item_id": id, "output_index": index, "content_index": 0, "delta": text}),
                    );
                }
                if let Some(ev) = ev {
                    self.emit("response.reasoning_text.delta", ev, out);
                }
            }
            Event::ReasoningSignature { signature, .. } => {
                self.start(out);
                self.open_reasoning(out);
                if let Some(Open::Reasoning { signature: s, .. }) = &mut self.message {
                    *s = Some(signature.clone());
                }
            }
            Event::ToolCallStart { index: k, id, name } => {
                self.start(out);
                if self.calls.iter().any(|(i, _)| i == k) {
                    return;
                }
                self.close_message(out);
                let index = self.next_index();
                let item_id = format!("fc_{}_{}", self.item_ids, index);
                self.emit("response.output_item.added", json!({"output_index": index,
                    "item": {"type": "function_call", "id": item_id, "call_id": id, "name": name, "arguments": "", "status": "in_progress"}}), out);
                self.calls.push((
                    *k,
                    Open::Call {
                        index,
                        id: item_id,
                        call_id: id.clone(),
                        name: name.clone(),
                        args: String::new(),
                    },
                ));
            }
            Event::ToolArgsDelta { index: k, json } if !json.is_empty() => {
                let mut ev = None;
                if let Some((
                    _,
                    Open::Call {
                        index, id, args, ..
                    },
                )) = self.calls.iter_mut().find(|(i, _)| i == k)
                {
                    args.push_str(json);
                    ev = Some(json!({"item_id": id, "output_index": index, "delta": json}));
                }
                if let Some(ev) = ev {
                    self.emit("response.function_call_arguments.delta", ev, out);
                }
            }
            Event::RefusalDelta { text, .. } if !text.is_empty() => {
                // A refusal streamed as text of the message (no `response.refusal.delta` yet;
                // the non-streamed answer has its `refusal` part).
                self.write(
                    &Event::TextDelta {
                        index: 0,
                        text: text.clone(),
                    },
                    out,
                );
            }
            Event::Usage(r) => r.apply(self.usage.get_or_insert_with(Usage::default)),
            Event::Finish(f) => self.finish = Some(f.clone()),
            Event::Error(e) => {
                let seq = self.seq;
                self.seq += 1;
                let code = e.code.as_deref().unwrap_or("upstream_error");
                out.push(error_frame(seq, &e.message, code));
            }
            Event::Done => {
                self.start(out);
                self.close_message(out);
                self.close_calls(out);
                let r = self.response(true);
                let kind = if r["status"] == "incomplete" {
                    "response.incomplete"
                } else {
                    "response.completed"
                };
                self.emit(kind, json!({"response": r}), out);
                self.completed = Some(r);
            }
            _ => {}
        }
    }
}
