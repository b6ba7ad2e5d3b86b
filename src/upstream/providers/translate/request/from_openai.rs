//! An OpenAI chat request for an Anthropic upstream. System and developer messages become
//! `system` blocks, tool calls `tool_use` blocks (ids kept), tool messages `tool_result`
//! blocks, PDF `file` parts `document` blocks; turns of one role are merged so roles
//! alternate. What Anthropic cannot express is refused naming the field.

use serde_json::{json, Map, Value};

use super::{data_url, refuse, refuse_field, unset, TranslateError, TOOL_ERROR_MARK};

const UPSTREAM: &str = "Anthropic";

/// Top-level fields: translated below, or accepted only at their default (Anthropic has
/// the same behaviour), or refused. Anything else is refused as unknown.
const AT_DEFAULT: &[(&str, &str)] = &[
    ("n", "1"),
    ("logprobs", "false"),
    ("top_logprobs", "null"),
    ("seed", "null"),
    ("frequency_penalty", "0"),
    ("presence_penalty", "0"),
    ("logit_bias", "{}"),
    ("store", "false"),
    ("metadata", "{}"),
    ("modalities", "[\"text\"]"),
    ("audio", "null"),
    ("reasoning_effort", "null"),
    ("verbosity", "null"),
    ("prediction", "null"),
    ("web_search_options", "null"),
    ("functions", "null"),
    ("function_call", "null"),
    ("response_format", "{\"type\":\"text\"}"),
];

/// Translated, or a caching hint that changes nothing in the answer (`prompt_cache_key`,
/// `prompt_cache_retention`).
const TRANSLATED: &[&str] = &[
    "model",
    "messages",
    "max_tokens",
    "max_completion_tokens",
    "stream",
    "stream_options",
    "temperature",
    "top_p",
    "stop",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "user",
    "safety_identifier",
    "service_tier",
    "prompt_cache_key",
    "prompt_cache_retention",
];

fn check_fields(body: &Map<String, Value>) -> Result<(), TranslateError> {
    for (k, v) in body {
        if TRANSLATED.contains(&k.as_str()) {
            continue;
        }
        let Some((name, default)) = AT_DEFAULT.iter().find(|(n, _)| n == k) else {
            return Err(TranslateError {
                param: None,
                message: format!("Unrecognized request argument supplied: {k}"),
            });
        };
        let default: Value = serde_json::from_str(default).unwrap_or(Value::Null);
        if !unset(Some(v), &default) {
            return Err(refuse_field(name, UPSTREAM));
        }
    }
    if let Some(o) = body.get("stream_options").and_then(Value::as_object) {
        // `include_usage` is the gateway's (the usage chunk is made from Anthropic's
        // figures); Anthropic streams carry no obfuscation padding to switch off.
        if let Some(k) = o
            .keys()
            .find(|k| !matches!(k.as_str(), "include_usage" | "include_obfuscation"))
        {
            return Err(refuse(
                "stream_options",
                format!("`stream_options.{k}` cannot be sent to an {UPSTREAM} model."),
            ));
        }
    }
    Ok(())
}

/// A text-only content (system, developer, tool) as Anthropic text blocks.
fn text_blocks(content: &Value, param: &'static str) -> Result<Vec<Value>, TranslateError> {
    match content {
        Value::String(s) => Ok(vec![json!({"type": "text", "text": s})]),
        Value::Array(parts) => parts
            .iter()
            .map(
                |p| match (p.get("type").and_then(Value::as_str), p.get("text")) {
                    (Some("text"), Some(Value::String(t)))
                        if p.as_object().is_some_and(|o| o.len() == 2) =>
                    {
                        Ok(json!({"type": "text", "text": t}))
                    }
                    _ => Err(refuse(
                        param,
                        "only text parts can be sent here to an Anthropic model",
                    )),
                },
            )
            .collect(),
        Value::Null => Ok(vec![]),
        _ => Err(refuse(
            param,
            "message content must be a string or an array of parts",
        )),
    }
}

/// An OpenAI content part as an Anthropic content block.
fn part_to_block(part: &Value) -> Result<Value, TranslateError> {
    let kind = part.get("type").and_then(Value::as_str).unwrap_or("");
    match kind {
        "text" => match part.get("text") {
            Some(Value::String(t)) => Ok(json!({"type": "text", "text": t})),
            _ => Err(refuse("messages", "a text part needs a string `text`")),
        },
        // `detail` has no Anthropic counterpart: Anthropic picks the resolution itself.
        "image_url" => {
            let Some(url) = part.pointer("/image_url/url").and_then(Value::as_str) else {
                return Err(refuse(
                    "messages",
                    "an image_url part needs `image_url.url`",
                ));
            };
            if url.starts_with("data:") {
                let (media, data) = data_url(url)
                    .ok_or_else(|| refuse("messages", "image data URLs must be base64"))?;
                Ok(
                    json!({"type": "image", "source": {"type": "base64", "media_type": media, "data": data}}),
                )
            } else {
                Ok(json!({"type": "image", "source": {"type": "url", "url": url}}))
            }
        }
        "file" => {
            let file = part.get("file").and_then(Value::as_object);
            if file.is_some_and(|f| f.contains_key("file_id")) {
                return Err(refuse(
                    "messages",
                    "a `file` part with a `file_id` (an OpenAI upload) cannot be sent to an Anthropic model; send `file_data`",
                ));
            }
            let data = file
                .and_then(|f| f.get("file_data"))
                .and_then(Value::as_str);
            match data.and_then(data_url) {
                Some(("application/pdf", b64)) => {
                    let mut doc = json!({"type": "document", "source": {"type": "base64", "media_type": "application/pdf", "data": b64}});
                    if let Some(name) = file.and_then(|f| f.get("filename")).filter(|n| !n.is_null()) {
                        doc["title"] = name.clone();
                    }
                    Ok(doc)
                }
                _ => Err(refuse(
                    "messages",
                    "a `file` part must carry a PDF as `file_data` (data:application/pdf;base64,…) to reach an Anthropic model",
                )),
            }
        }
        other => Err(refuse(
            "messages",
            format!("a content part of type `{other}` cannot be sent to an Anthropic model"),
        )),
    }
}

fn content_blocks(content: &Value) -> Result<Vec<Value>, TranslateError> {
    match content {
        Value::String(s) if s.is_empty() => Ok(vec![]),
        Value::String(s) => Ok(vec![json!({"type": "text", "text": s})]),
        Value::Array(parts) => parts.iter().map(part_to_block).collect(),
        Value::Null => Ok(vec![]),
        _ => Err(refuse(
            "messages",
            "message content must be a string or an array of parts",
        )),
    }
}

/// An assistant turn's content and `refusal` as text blocks: a refusal the model gave is
/// its text to an Anthropic model (as an Anthropic refusal's text is OpenAI's `content`).
fn assistant_blocks(m: &Value) -> Result<Vec<Value>, TranslateError> {
    let refusal_text = |r: Option<&Value>| match r {
        Some(Value::String(t)) => Ok(json!({"type": "text", "text": t})),
        _ => Err(refuse("messages", "a `refusal` must be a string")),
    };
    let mut blocks = match m.get("content").unwrap_or(&Value::Null) {
        Value::Array(parts) => parts
            .iter()
            .map(|p| match p.get("type").and_then(Value::as_str) {
                Some("refusal") => refusal_text(p.get("refusal")),
                _ => part_to_block(p),
            })
            .collect::<Result<Vec<_>, _>>()?,
        other => content_blocks(other)?,
    };
    match m.get("refusal") {
        None | Some(Value::Null) => {}
        r => blocks.push(refusal_text(r)?),
    }
    Ok(blocks)
}

/// Appends blocks to the last message if it has the same role (Anthropic wants turns to
/// alternate), else starts a new message.
fn push_turn(out: &mut Vec<Value>, role: &str, blocks: Vec<Value>) {
    if blocks.is_empty() {
        return;
    }
    if let Some(last) = out.last_mut().filter(|m| m["role"] == role) {
        if let Some(arr) = last["content"].as_array_mut() {
            arr.extend(blocks);
            return;
        }
    }
    out.push(json!({"role": role, "content": blocks}));
}

/// Message fields Anthropic has no place for, refused when set.
fn check_message(m: &Value, allowed: &[&str]) -> Result<(), TranslateError> {
    for (k, v) in m.as_object().into_iter().flatten() {
        if !allowed.contains(&k.as_str()) && !v.is_null() {
            return Err(refuse(
                "messages",
                format!("a message's `{k}` cannot be sent to an Anthropic model"),
            ));
        }
    }
    Ok(())
}

fn tool_use(tc: &Value) -> Result<Value, TranslateError> {
    if tc.get("type").and_then(Value::as_str).unwrap_or("function") != "function" {
        return Err(refuse(
            "messages",
            "only function tool calls can be sent to an Anthropic model",
        ));
    }
    let args = tc
        .pointer("/function/arguments")
        .and_then(Value::as_str)
        .unwrap_or("{}");
    let input: Value = serde_json::from_str(if args.trim().is_empty() { "{}" } else { args })
        .ok()
        .filter(Value::is_object)
        .ok_or_else(|| refuse("messages", "tool call arguments must be a JSON object"))?;
    Ok(
        json!({"type": "tool_use", "id": tc.get("id").cloned().unwrap_or(json!("")),
        "name": tc.pointer("/function/name").cloned().unwrap_or(json!("")), "input": input}),
    )
}

/// A tool message as a `tool_result` block; the error mark becomes `is_error`.
fn tool_result(m: &Value) -> Result<Value, TranslateError> {
    let mut blocks = text_blocks(m.get("content").unwrap_or(&Value::Null), "messages")?;
    let mut is_error = false;
    if let Some(t) = blocks
        .first_mut()
        .and_then(|b| b.get_mut("text"))
        .filter(|t| t.as_str().is_some_and(|s| s.starts_with(TOOL_ERROR_MARK)))
    {
        let rest = t.as_str().unwrap_or("")[TOOL_ERROR_MARK.len()..].to_string();
        *t = json!(rest);
        is_error = true;
    }
    let content = match (m.get("content"), blocks.len()) {
        (Some(Value::String(_)), 1) => blocks[0]["text"].clone(),
        _ => Value::Array(blocks),
    };
    let mut block = json!({"type": "tool_result", "tool_use_id": m.get("tool_call_id").cloned().unwrap_or(json!("")),
        "content": content});
    if is_error {
        block["is_error"] = json!(true);
    }
    Ok(block)
}

fn messages(body: &Map<String, Value>) -> Result<(Vec<Value>, Vec<Value>), TranslateError> {
    let mut system = Vec::new();
    let mut out = Vec::new();
    for m in body
        .get("messages")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let role = m.get("role").and_then(Value::as_str).unwrap_or("");
        let content = m.get("content").unwrap_or(&Value::Null);
        match role {
            "system" | "developer" => {
                check_message(m, &["role", "content"])?;
                system.extend(text_blocks(content, "messages")?);
            }
            "user" => {
                check_message(m, &["role", "content"])?;
                push_turn(&mut out, "user", content_blocks(content)?);
            }
            "assistant" => {
                check_message(m, &["role", "content", "tool_calls", "refusal"])?;
                let mut blocks = assistant_blocks(m)?;
                for tc in m
                    .get("tool_calls")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                {
                    blocks.push(tool_use(tc)?);
                }
                push_turn(&mut out, "assistant", blocks);
            }
            "tool" => {
                check_message(m, &["role", "content", "tool_call_id"])?;
                push_turn(&mut out, "user", vec![tool_result(m)?]);
            }
            other => {
                return Err(refuse(
                    "messages",
                    format!("a message with role `{other}` cannot be sent to an Anthropic model"),
                ))
            }
        }
    }
    Ok((system, out))
}

fn tools(body: &Map<String, Value>) -> Result<Option<Value>, TranslateError> {
    let Some(tools) = body.get("tools").filter(|t| !t.is_null()) else {
        return Ok(None);
    };
    let tools = tools
        .as_array()
        .ok_or_else(|| refuse("tools", "`tools` must be an array"))?;
    let mut out = Vec::new();
    for t in tools {
        let f = t
            .get("function")
            .filter(|_| t.get("type").and_then(Value::as_str) == Some("function"));
        let Some(f) = f else {
            return Err(refuse(
                "tools",
                "only function tools can be sent to an Anthropic model",
            ));
        };
        if f.get("strict").and_then(Value::as_bool) == Some(true) {
            return Err(refuse(
                "tools",
                "`strict` function schemas cannot be sent to an Anthropic model",
            ));
        }
        let mut tool = json!({"name": f.get("name").cloned().unwrap_or(json!("")),
            "input_schema": f.get("parameters").cloned().unwrap_or(json!({"type": "object", "properties": {}}))});
        if let Some(d) = f.get("description").filter(|d| !d.is_null()) {
            tool["description"] = d.clone();
        }
        out.push(tool);
    }
    Ok(Some(Value::Array(out)))
}

/// `tool_choice` and `parallel_tool_calls: false` (Anthropic's
/// `tool_choice.disable_parallel_tool_use`).
fn tool_choice(
    body: &Map<String, Value>,
    has_tools: bool,
) -> Result<Option<Value>, TranslateError> {
    let mut choice = match body.get("tool_choice") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(match s.as_str() {
            "auto" => json!({"type": "auto"}),
            "required" => json!({"type": "any"}),
            "none" => json!({"type": "none"}),
            _ => return Err(refuse("tool_choice", format!("unknown tool_choice `{s}`"))),
        }),
        Some(o) if o.get("type").and_then(Value::as_str) == Some("function") => {
            let name = o.pointer("/function/name").cloned().unwrap_or(json!(""));
            Some(json!({"type": "tool", "name": name}))
        }
        Some(_) => {
            return Err(refuse(
                "tool_choice",
                "this tool_choice cannot be sent to an Anthropic model",
            ))
        }
    };
    match body.get("parallel_tool_calls") {
        None | Some(Value::Null) | Some(Value::Bool(true)) => {}
        Some(Value::Bool(false)) if has_tools => {
            let c = choice.get_or_insert_with(|| json!({"type": "auto"}));
            if c["type"] != "none" {
                c["disable_parallel_tool_use"] = json!(true);
            }
        }
        Some(Value::Bool(false)) => {}
        Some(_) => {
            return Err(refuse(
                "parallel_tool_calls",
                "`parallel_tool_calls` must be a boolean",
            ))
        }
    }
    Ok(choice)
}

/// `user` and its successor `safety_identifier`: Anthropic's `metadata.user_id`.
fn user_id(body: &Map<String, Value>) -> Result<Option<Value>, TranslateError> {
    let get = |k| body.get(k).filter(|v: &&Value| !v.is_null());
    match (get("user"), get("safety_identifier")) {
        (Some(a), Some(b)) if a != b => Err(refuse(
            "safety_identifier",
            "`user` and `safety_identifier` differ; an Anthropic model takes one user id",
        )),
        (Some(u), _) | (None, Some(u)) if u.is_string() => Ok(Some(u.clone())),
        (None, None) => Ok(None),
        _ => Err(refuse("user", "`user` must be a string")),
    }
}

pub fn openai_to_anthropic(
    body: &Map<String, Value>,
    upstream_model: &str,
    cap: i64,
    stream: bool,
) -> Result<Map<String, Value>, TranslateError> {
    check_fields(body)?;
    let (system, messages) = messages(body)?;
    let mut out = Map::new();
    out.insert("model".into(), json!(upstream_model));
    out.insert("max_tokens".into(), json!(cap));
    out.insert("messages".into(), Value::Array(messages));
    match system.as_slice() {
        [] => {}
        [one] => {
            out.insert("system".into(), one["text"].clone());
        }
        _ => {
            out.insert("system".into(), Value::Array(system));
        }
    }
    if let Some(t) = body.get("temperature").filter(|t| !t.is_null()) {
        if t.as_f64().is_some_and(|t| t > 1.0) {
            return Err(refuse(
                "temperature",
                "Anthropic models accept a temperature between 0 and 1",
            ));
        }
        out.insert("temperature".into(), t.clone());
    }
    if let Some(p) = body.get("top_p").filter(|p| !p.is_null()) {
        out.insert("top_p".into(), p.clone());
    }
    match body.get("stop") {
        None | Some(Value::Null) => {}
        Some(Value::String(s)) => {
            out.insert("stop_sequences".into(), json!([s]));
        }
        Some(Value::Array(a)) if a.iter().all(Value::is_string) => {
            out.insert("stop_sequences".into(), Value::Array(a.clone()));
        }
        Some(_) => {
            return Err(refuse(
                "stop",
                "`stop` must be a string or an array of strings",
            ))
        }
    }
    let tools = tools(body)?;
    let has_tools = tools
        .as_ref()
        .is_some_and(|t| t.as_array().is_some_and(|a| !a.is_empty()));
    if let Some(t) = tools {
        out.insert("tools".into(), t);
    }
    if let Some(c) = tool_choice(body, has_tools)? {
        out.insert("tool_choice".into(), c);
    }
    if let Some(u) = user_id(body)? {
        out.insert("metadata".into(), json!({"user_id": u}));
    }
    match body
        .get("service_tier")
        .and_then(|v| if v.is_null() { None } else { Some(v.as_str()) })
    {
        None => {}
        Some(Some("auto")) => {
            out.insert("service_tier".into(), json!("auto"));
        }
        Some(Some("default")) => {
            out.insert("service_tier".into(), json!("standard_only"));
        }
        Some(_) => return Err(refuse_field("service_tier", UPSTREAM)),
    }
    if stream {
        out.insert("stream".into(), json!(true));
    }
    Ok(out)
}
