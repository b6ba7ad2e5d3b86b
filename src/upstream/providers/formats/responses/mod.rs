//! The OpenAI Responses API (`POST /v1/responses`) as a client format, served two ways:
//!
//! - **natively** by an `openai` upstream (its `/responses` path): the client's body passes
//!   through with the model, the output cap (`max_output_tokens`), `store: false` and the
//!   expanded input rewritten (`shape_request`); usage is read from the answer's or
//!   `response.completed`'s `usage` (`usage_of`);
//! - **translated** for every other upstream: the request becomes a chat-completions body
//!   (`to_chat`), which the existing chat translation carries to Anthropic; the answer comes
//!   back as a chat completion and becomes a `response` object (`from_chat`), a stream's
//!   chunks become the Responses events (`stream::ChatToResponses`).
//!
//! The gateway keeps stored responses itself, so the id the client sees is the gateway's
//! (`Stamp`), never the upstream's. What a translated upstream cannot express is refused
//! with a 400 naming the field; built-in tools are refused on both paths (their calls are
//! billed apart from tokens, which the reservation cannot cover).

pub mod stream;

use serde_json::{json, Map, Value};

use crate::config::Provider;
use crate::quota::pricing::Usage;
use crate::upstream::providers::translate::TranslateError;

/// What the gateway writes into every response object it hands out.
#[derive(Debug, Clone)]
pub struct Stamp {
    /// The gateway's id (`resp_…`).
    pub id: String,
    pub store: bool,
    pub previous_response_id: Option<String>,
}

impl Stamp {
    /// Writes the gateway's id and its `store` / `previous_response_id` into a response.
    pub fn apply(&self, response: &mut Value) {
        if let Value::Object(o) = response {
            o.insert("id".into(), json!(self.id));
            o.insert("store".into(), json!(self.store));
            o.insert(
                "previous_response_id".into(),
                self.previous_response_id
                    .as_ref()
                    .map_or(Value::Null, |p| json!(p)),
            );
        }
    }
}

/// Whether `p` speaks the Responses API itself (else requests go through chat).
pub fn native(p: Provider) -> bool {
    matches!(p, Provider::Openai)
}

/// Body fields the gateway handles itself: never sent upstream as the client wrote them.
pub const GATEWAY_FIELDS: &[&str] = &["store", "previous_response_id"];

/// The native request: the client's fields with the upstream's model, the reserved cap,
/// `store: false` (the gateway keeps the conversation) and, when the client sends or gets
/// back reasoning, `include: ["reasoning.encrypted_content"]` so a later turn can carry it.
pub fn shape_request(
    body: &Map<String, Value>,
    upstream_model: &str,
    cap: Option<i64>,
) -> Map<String, Value> {
    let mut out = body.clone();
    for f in GATEWAY_FIELDS {
        out.remove(*f);
    }
    out.insert("model".into(), json!(upstream_model));
    if let Some(cap) = cap {
        out.insert("max_output_tokens".into(), json!(cap));
    }
    out.insert("store".into(), json!(false));
    if out.get("reasoning").is_some_and(|r| !r.is_null()) {
        let include = out.entry("include").or_insert_with(|| json!([]));
        if let Value::Array(a) = include {
            if !a.iter().any(|v| v == "reasoning.encrypted_content") {
                a.push(json!("reasoning.encrypted_content"));
            }
        }
    }
    out
}

/// Usage from a Responses `usage` object (`input_tokens` includes the cached ones,
/// `output_tokens` the reasoning ones); `None` when absent or not in that shape.
pub fn usage_of(u: &Value) -> Option<Usage> {
    if !u.is_object()
        || !u.get("input_tokens").is_some_and(Value::is_number)
        || !u.get("output_tokens").is_some_and(Value::is_number)
    {
        return None;
    }
    let n = |p: &str| crate::upstream::providers::tokens(u.pointer(p)).unwrap_or(0);
    Some(Usage {
        input: n("/input_tokens"),
        cached_input: n("/input_tokens_details/cached_tokens"),
        output: n("/output_tokens"),
    })
}

/// The generated text of a response (counted when its usage is missing).
pub fn answer_text(v: &Value) -> String {
    let mut text = String::new();
    for item in v
        .get("output")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        match item.get("type").and_then(Value::as_str) {
            Some("message") => {
                for part in item
                    .get("content")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                {
                    for f in ["text", "refusal"] {
                        if let Some(t) = part.get(f).and_then(Value::as_str) {
                            text.push_str(t);
                        }
                    }
                }
            }
            Some("function_call" | "custom_tool_call") => {
                for f in ["name", "arguments", "input"] {
                    if let Some(t) = item.get(f).and_then(Value::as_str) {
                        text.push_str(t);
                    }
                }
            }
            // Reasoning the upstream shows: its summary and raw text (gpt-oss on vLLM).
            Some("reasoning") => {
                for part in ["summary", "content"]
                    .into_iter()
                    .filter_map(|f| item.get(f).and_then(Value::as_array))
                    .flatten()
                {
                    if let Some(t) = part.get("text").and_then(Value::as_str) {
                        text.push_str(t);
                    }
                }
            }
            // The calls of the other tools the client runs (shell, apply_patch…): what the
            // model wrote is the item's fields.
            Some(_) => text.push_str(&item.to_string()),
            None => {}
        }
    }
    text
}

fn refuse(param: &'static str, message: impl Into<String>) -> TranslateError {
    TranslateError {
        param: Some(param),
        message: message.into(),
    }
}

/// Request fields a chat-completions body has no counterpart for; refused when translated
/// (unless at their default), named as the client sent them.
const NOT_TRANSLATED: &[&str] = &[
    "include",
    "top_logprobs",
    "max_tool_calls",
    "prompt_cache_key",
    "safety_identifier",
    "text",
];

/// Fields read into the chat body by `to_chat`.
const TRANSLATED: &[&str] = &[
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
    "include",
];

/// A Responses request (already validated, input expanded) as a chat-completions body.
pub fn to_chat(body: &Map<String, Value>) -> Result<Map<String, Value>, TranslateError> {
    for (k, v) in body {
        if GATEWAY_FIELDS.contains(&k.as_str()) {
            continue;
        }
        let named = TRANSLATED.contains(&k.as_str()) || NOT_TRANSLATED.contains(&k.as_str());
        if !named && !v.is_null() {
            return Err(TranslateError {
                param: None,
                message: format!("`{k}` cannot be served by this model's upstream (it does not speak the Responses API)."),
            });
        }
    }
    let mut out = Map::new();
    let mut messages = Vec::new();
    if let Some(i) = body.get("instructions").and_then(Value::as_str) {
        messages.push(json!({"role": "system", "content": i}));
    }
    match body.get("input") {
        Some(Value::String(s)) => messages.push(json!({"role": "user", "content": s})),
        Some(Value::Array(items)) => {
            for (i, item) in items.iter().enumerate() {
                item_to_chat(i, item, &mut messages)?;
            }
        }
        _ => {
            return Err(refuse(
                "input",
                "`input` must be a string or an array of items",
            ))
        }
    }
    out.insert("messages".into(), Value::Array(messages));
    if let Some(Value::Array(tools)) = body.get("tools") {
        if let Some(t) = tools
            .iter()
            .find(|t| t.get("type").and_then(Value::as_str) != Some("function"))
        {
            let kind = t.get("type").and_then(Value::as_str).unwrap_or("?");
            return Err(refuse("tools", format!("tools of type `{kind}` cannot be served by this model's upstream; only `function` tools can")));
        }
        let tools: Vec<Value> = tools
            .iter()
            .map(|t| {
                let mut f = Map::new();
                for k in ["name", "description", "parameters", "strict"] {
                    if let Some(v) = t.get(k).filter(|v| !v.is_null()) {
                        f.insert(k.into(), v.clone());
                    }
                }
                json!({"type": "function", "function": f})
            })
            .collect();
        if !tools.is_empty() {
            out.insert("tools".into(), Value::Array(tools));
        }
    }
    match body.get("tool_choice") {
        None | Some(Value::Null) => {}
        Some(Value::String(s)) => {
            out.insert("tool_choice".into(), json!(s));
        }
        Some(c) if c.get("type").and_then(Value::as_str) == Some("function") => {
            let name = c.get("name").cloned().unwrap_or(Value::Null);
            out.insert(
                "tool_choice".into(),
                json!({"type": "function", "function": {"name": name}}),
            );
        }
        Some(_) => {
            return Err(refuse(
                "tool_choice",
                "this `tool_choice` cannot be served by this model's upstream",
            ))
        }
    }
    for k in [
        "parallel_tool_calls",
        "temperature",
        "top_p",
        "user",
        "stream",
        "service_tier",
    ] {
        if let Some(v) = body.get(k).filter(|v| !v.is_null()) {
            out.insert(k.into(), v.clone());
        }
    }
    if let Some(m) = body
        .get("metadata")
        .and_then(Value::as_object)
        .filter(|m| !m.is_empty())
    {
        out.insert("metadata".into(), Value::Object(m.clone()));
    }
    if let Some(r) = body.get("reasoning").filter(|r| !r.is_null()) {
        if let Some(e) = r.get("effort").filter(|e| !e.is_null()) {
            out.insert("reasoning_effort".into(), e.clone());
        }
    }
    if let Some(t) = body.get("text").filter(|t| !t.is_null()) {
        if t.get("verbosity").is_some_and(|v| !v.is_null()) {
            return Err(refuse(
                "text",
                "`text.verbosity` cannot be served by this model's upstream",
            ));
        }
        match t.pointer("/format/type").and_then(Value::as_str) {
            None | Some("text") => {}
            Some("json_object") => {
                out.insert("response_format".into(), json!({"type": "json_object"}));
            }
            Some("json_schema") => {
                let f = &t["format"];
                let mut s = Map::new();
                for k in ["name", "schema", "strict", "description"] {
                    if let Some(v) = f.get(k).filter(|v| !v.is_null()) {
                        s.insert(k.into(), v.clone());
                    }
                }
                out.insert(
                    "response_format".into(),
                    json!({"type": "json_schema", "json_schema": s}),
                );
            }
            Some(other) => {
                return Err(refuse(
                    "text",
                    format!("`text.format` type `{other}` is not supported"),
                ))
            }
        }
    }
    for k in NOT_TRANSLATED {
        let set = match body.get(*k) {
            None | Some(Value::Null) => false,
            Some(Value::Array(a)) if *k == "include" => {
                a.iter().any(|v| v != "reasoning.encrypted_content")
            }
            Some(_) if *k == "text" => false,
            Some(_) => true,
        };
        if set {
            return Err(TranslateError {
                param: Some(k),
                message: format!("`{k}` cannot be served by this model's upstream (it does not speak the Responses API)."),
            });
        }
    }
    Ok(out)
}

/// One input item as chat messages. Reasoning items are the private state of the model
/// that wrote them (OpenAI's encrypted reasoning): no other upstream can read them, and
/// they are left out of a translated request — the only thing translation leaves out.
fn item_to_chat(i: usize, item: &Value, messages: &mut Vec<Value>) -> Result<(), TranslateError> {
    let kind = item
        .get("type")
        .and_then(Value::as_str)
        .unwrap_or("message");
    match kind {
        "message" => {
            let role = item.get("role").and_then(Value::as_str).unwrap_or("user");
            let role = if role == "developer" { "system" } else { role };
            let content = match item.get("content") {
                Some(Value::String(s)) => json!(s),
                Some(Value::Array(parts)) => {
                    let mut out = Vec::with_capacity(parts.len());
                    for p in parts {
                        out.push(part_to_chat(p)?);
                    }
                    if role == "assistant" {
                        // Chat's assistant content is text: join the output text parts.
                        let mut text = String::new();
                        for p in &out {
                            text.push_str(p.get("text").and_then(Value::as_str).unwrap_or(""));
                        }
                        json!(text)
                    } else {
                        Value::Array(out)
                    }
                }
                _ => {
                    return Err(refuse(
                        "input",
                        format!("input[{i}]: a message needs `content`"),
                    ))
                }
            };
            messages.push(json!({"role": role, "content": content}));
        }
        "function_call" => {
            let call = json!({"id": item["call_id"], "type": "function",
                "function": {"name": item["name"], "arguments": item["arguments"]}});
            // Consecutive calls are one assistant turn with several tool calls.
            if let Some(last) = messages
                .last_mut()
                .filter(|m| m["role"] == "assistant" && m.get("tool_calls").is_some())
            {
                if let Some(Value::Array(calls)) = last.get_mut("tool_calls") {
                    calls.push(call);
                }
            } else {
                messages.push(json!({"role": "assistant", "content": null, "tool_calls": [call]}));
            }
        }
        "function_call_output" => {
            let output = match &item["output"] {
                Value::String(s) => json!(s),
                Value::Array(parts) => {
                    let mut out = Vec::with_capacity(parts.len());
                    for p in parts {
                        out.push(part_to_chat(p)?);
                    }
                    Value::Array(out)
                }
                _ => {
                    return Err(refuse(
                        "input",
                        format!("input[{i}]: `output` must be a string or an array of parts"),
                    ))
                }
            };
            messages
                .push(json!({"role": "tool", "tool_call_id": item["call_id"], "content": output}));
        }
        "reasoning" => {}
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

fn part_to_chat(p: &Value) -> Result<Value, TranslateError> {
    match p.get("type").and_then(Value::as_str) {
        Some("input_text" | "output_text") => Ok(json!({"type": "text", "text": p["text"]})),
        Some("refusal") => Ok(json!({"type": "text", "text": p["refusal"]})),
        Some("input_image") => match p.get("image_url").and_then(Value::as_str) {
            Some(url) => {
                let mut img = json!({"url": url});
                if let Some(d) = p.get("detail").filter(|d| !d.is_null()) {
                    img["detail"] = d.clone();
                }
                Ok(json!({"type": "image_url", "image_url": img}))
            }
            None => Err(refuse(
                "input",
                "an `input_image` by `file_id` cannot be served by this model's upstream",
            )),
        },
        Some("input_file") => {
            let mut f = Map::new();
            for k in ["file_data", "file_id", "filename"] {
                if let Some(v) = p.get(k).filter(|v| !v.is_null()) {
                    f.insert(k.into(), v.clone());
                }
            }
            if p.get("file_url").is_some_and(|v| !v.is_null()) {
                return Err(refuse(
                    "input",
                    "an `input_file` by `file_url` cannot be served by this model's upstream",
                ));
            }
            Ok(json!({"type": "file", "file": f}))
        }
        other => Err(refuse(
            "input",
            format!("content parts of type {other:?} cannot be served by this model's upstream"),
        )),
    }
}

/// Responses `usage` from chat-completions figures.
pub fn usage_json(u: &Value) -> Value {
    let n = |p: &str| u.pointer(p).and_then(Value::as_i64).unwrap_or(0);
    let (input, output) = (n("/prompt_tokens"), n("/completion_tokens"));
    json!({
        "input_tokens": input,
        "input_tokens_details": {"cached_tokens": n("/prompt_tokens_details/cached_tokens")},
        "output_tokens": output,
        "output_tokens_details": {"reasoning_tokens": n("/completion_tokens_details/reasoning_tokens")},
        "total_tokens": input + output,
    })
}

/// The fields of a response object that echo the request.
pub fn echo(body: &Map<String, Value>) -> Map<String, Value> {
    let get = |k: &str, d: Value| body.get(k).filter(|v| !v.is_null()).cloned().unwrap_or(d);
    let mut o = Map::new();
    o.insert("instructions".into(), get("instructions", Value::Null));
    o.insert(
        "max_output_tokens".into(),
        get("max_output_tokens", Value::Null),
    );
    o.insert("metadata".into(), get("metadata", json!({})));
    o.insert(
        "parallel_tool_calls".into(),
        get("parallel_tool_calls", json!(true)),
    );
    o.insert(
        "reasoning".into(),
        get("reasoning", json!({"effort": null, "summary": null})),
    );
    o.insert("temperature".into(), get("temperature", json!(1.0)));
    o.insert(
        "text".into(),
        get("text", json!({"format": {"type": "text"}})),
    );
    o.insert("tool_choice".into(), get("tool_choice", json!("auto")));
    o.insert("tools".into(), get("tools", json!([])));
    o.insert("top_p".into(), get("top_p", json!(1.0)));
    o.insert("truncation".into(), json!("disabled"));
    o.insert("user".into(), get("user", Value::Null));
    o
}

/// A response object around `output` (the request's echo fields, the status from the chat
/// `finish_reason`).
pub fn response_object(
    body: &Map<String, Value>,
    model: &Value,
    created: i64,
    output: Vec<Value>,
    finish: Option<&str>,
    usage: Value,
) -> Value {
    let (status, incomplete) = match finish {
        Some("length") => ("incomplete", json!({"reason": "max_output_tokens"})),
        Some("content_filter") => ("incomplete", json!({"reason": "content_filter"})),
        _ => ("completed", Value::Null),
    };
    let mut o = echo(body);
    o.insert("id".into(), json!(""));
    o.insert("object".into(), json!("response"));
    o.insert("created_at".into(), json!(created));
    o.insert("status".into(), json!(status));
    o.insert("error".into(), Value::Null);
    o.insert("incomplete_details".into(), incomplete);
    o.insert("model".into(), model.clone());
    o.insert("output".into(), Value::Array(output));
    o.insert("usage".into(), usage);
    Value::Object(o)
}

/// A chat completion (from a translated upstream) as a response object.
pub fn from_chat(body: &Map<String, Value>, chat: &Value, item_ids: &str) -> Value {
    let choice = &chat["choices"][0];
    let msg = &choice["message"];
    let mut output = Vec::new();
    let mut parts = Vec::new();
    if let Some(t) = crate::upstream::providers::openai::content_text(msg.get("content"))
        .filter(|t| !t.is_empty())
    {
        parts.push(json!({"type": "output_text", "text": t, "annotations": []}));
    }
    if let Some(r) = msg.get("refusal").and_then(Value::as_str) {
        parts.push(json!({"type": "refusal", "refusal": r}));
    }
    if !parts.is_empty() {
        output.push(
            json!({"type": "message", "id": format!("msg_{item_ids}"), "status": "completed",
            "role": "assistant", "content": parts}),
        );
    }
    for (i, tc) in msg
        .get("tool_calls")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .enumerate()
    {
        output.push(
            json!({"type": "function_call", "id": format!("fc_{item_ids}_{i}"),
            "call_id": tc["id"], "name": tc["function"]["name"],
            "arguments": tc["function"]["arguments"], "status": "completed"}),
        );
    }
    let created = chat.get("created").and_then(Value::as_i64).unwrap_or(0);
    let usage = chat
        .get("usage")
        .filter(|u| u.is_object())
        .map_or(Value::Null, usage_json);
    response_object(
        body,
        &chat["model"],
        created,
        output,
        choice.get("finish_reason").and_then(Value::as_str),
        usage,
    )
}

#[cfg(test)]
mod tests;
