//! A Responses request read into the internal form: which fields are read, refused or
//! dropped, its tools, and what the upstream's format cannot take (`check_upstream`).

use std::borrow::Cow;

use serde_json::{Map, Value};

use super::items::read_item;
use crate::upstream::providers::canonical::{
    Message, Part, Reasoning, Request, ResponseFormat, Role, ToolChoice,
};
use crate::upstream::providers::formats::responses::GATEWAY_FIELDS;
use crate::upstream::providers::formats::{function_tool, refuse, UPSTREAM};
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

/// Request fields that are the client's own bookkeeping, a caching hint or a stream option
/// of OpenAI's own: not sent to a translated upstream, and named in `Request::dropped`.
/// `metadata` belongs to the response object the gateway serves and stores (echoed
/// there), so it is not sent either and loses nothing. `prompt_cache_retention` is
/// `prompt_cache_key`'s kin; `stream_options` holds only `include_obfuscation`, the
/// padding OpenAI adds to its own stream's deltas, which a translated stream never has
/// whatever it says — neither changes the answer or its price (s29 responses attack F5:
/// both were refused, where the native route takes them).
const NOT_SENT: &[&str] = &[
    "client_metadata",
    "prompt_cache_key",
    "prompt_cache_retention",
    "stream_options",
];

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

/// The refusal of a field the internal form cannot take, naming it as the Responses API
/// names a parameter it refuses (the client's own key: an unknown one too).
fn served(field: &str) -> TranslateError {
    TranslateError {
        param: Some(Cow::Owned(field.to_string())),
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
                return Err(served(k));
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

pub(super) fn text(s: &str) -> Part {
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
pub(super) fn push_to(r: &mut Request, role: Role, part: Part) {
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
