//! An Anthropic Messages request for an OpenAI-format upstream. `system` becomes a system
//! message, `tool_use` blocks tool calls (ids kept), `tool_result` blocks tool messages
//! (`is_error` kept as a marked content), PDF `document` blocks `file` parts. What OpenAI
//! cannot express is refused naming the field. `cache_control` is a caching hint, not
//! content: OpenAI caches prompt prefixes by itself, so it is not sent.

use serde_json::{json, Map, Value};

use super::{refuse, refuse_field, unset, TranslateError, TOOL_ERROR_MARK};

const UPSTREAM: &str = "OpenAI-format";

const TRANSLATED: &[&str] = &[
    "model",
    "messages",
    "max_tokens",
    "system",
    "metadata",
    "stop_sequences",
    "stream",
    "temperature",
    "top_p",
    "tools",
    "tool_choice",
    "service_tier",
    "thinking",
];

/// Known Anthropic fields with no OpenAI counterpart: refused when set.
const REFUSED: &[&str] = &[
    "top_k",
    "container",
    "mcp_servers",
    "context_management",
    "output_format",
];

fn check_fields(body: &Map<String, Value>) -> Result<(), TranslateError> {
    for (k, v) in body {
        if TRANSLATED.contains(&k.as_str()) {
            continue;
        }
        if let Some(name) = REFUSED.iter().find(|n| *n == k) {
            if !unset(Some(v), &Value::Null) {
                return Err(refuse_field(name, UPSTREAM));
            }
            continue;
        }
        return Err(TranslateError {
            param: None,
            message: format!("{k}: Extra inputs are not permitted"),
        });
    }
    match body.get("thinking") {
        None | Some(Value::Null) => {}
        Some(t) if t.get("type").and_then(Value::as_str) == Some("disabled") => {}
        Some(_) => {
            return Err(refuse(
                "thinking",
                "extended thinking cannot be sent to an OpenAI-format model (its answer has no thinking blocks)",
            ))
        }
    }
    if let Some(m) = body.get("metadata").and_then(Value::as_object) {
        if let Some(k) = m.keys().find(|k| *k != "user_id") {
            return Err(refuse(
                "metadata",
                format!("`metadata.{k}` cannot be sent to an OpenAI-format model"),
            ));
        }
    }
    Ok(())
}

/// `citations` that ask for nothing: null or none (a text block), or switched off (a
/// document's `{"enabled": false}`, Anthropic's default written out).
fn no_citations(v: &Value) -> bool {
    v.is_null()
        || v.as_array().is_some_and(Vec::is_empty)
        || v.as_object()
            .is_some_and(|o| o.len() == 1 && o.get("enabled") == Some(&Value::Bool(false)))
}

/// Fields of a block that may be present without being sent: `cache_control` (a caching
/// hint) and `citations` that ask for nothing.
fn check_block(b: &Value, allowed: &[&str]) -> Result<(), TranslateError> {
    for (k, v) in b.as_object().into_iter().flatten() {
        let ok = allowed.contains(&k.as_str())
            || k == "type"
            || k == "cache_control"
            || (k == "citations" && no_citations(v));
        if !ok {
            let kind = b.get("type").and_then(Value::as_str).unwrap_or("");
            return Err(refuse(
                "messages",
                format!("`{k}` of a `{kind}` block cannot be sent to an OpenAI-format model"),
            ));
        }
    }
    Ok(())
}

fn text_part(b: &Value) -> Result<Value, TranslateError> {
    check_block(b, &["text"])?;
    match b.get("text") {
        Some(Value::String(t)) => Ok(json!({"type": "text", "text": t})),
        _ => Err(refuse("messages", "a text block needs a string `text`")),
    }
}

fn image_part(b: &Value) -> Result<Value, TranslateError> {
    check_block(b, &["source"])?;
    let src = b.get("source").unwrap_or(&Value::Null);
    let s = |k: &str| src.get(k).and_then(Value::as_str);
    let url = match (s("type"), s("media_type"), s("data"), s("url")) {
        (Some("base64"), Some(media), Some(data), _) => format!("data:{media};base64,{data}"),
        (Some("url"), _, _, Some(url)) => url.to_string(),
        (Some("file"), ..) => {
            return Err(refuse(
                "messages",
                "an image with `source.type: file` (an Anthropic upload) cannot be sent to an OpenAI-format model; send it as base64 or url",
            ))
        }
        _ => return Err(refuse("messages", "an image block needs a base64 or url source")),
    };
    Ok(json!({"type": "image_url", "image_url": {"url": url}}))
}

/// A `document` block: a base64 PDF becomes a `file` part (`title` its file name); a
/// plain-text document becomes a text part. URLs and Anthropic file ids have no OpenAI
/// counterpart, nor do `context` and enabled citations.
fn document_part(b: &Value) -> Result<Value, TranslateError> {
    let src = b.get("source").unwrap_or(&Value::Null);
    let s = |k: &str| src.get(k).and_then(Value::as_str);
    match (s("type"), s("media_type"), s("data")) {
        (Some("base64"), Some("application/pdf"), Some(data)) => {
            check_block(b, &["source", "title"])?;
            let name = b.get("title").and_then(Value::as_str).unwrap_or("document.pdf");
            Ok(json!({"type": "file", "file": {"filename": name,
                "file_data": format!("data:application/pdf;base64,{data}")}}))
        }
        (Some("text"), _, Some(data)) => {
            check_block(b, &["source"])?;
            Ok(json!({"type": "text", "text": data}))
        }
        (kind, ..) => Err(refuse(
            "messages",
            format!(
                "a document with source type `{}` cannot be sent to an OpenAI-format model; send a base64 PDF or text",
                kind.unwrap_or("?")
            ),
        )),
    }
}

/// A user block as an OpenAI content part.
fn user_part(b: &Value) -> Result<Value, TranslateError> {
    match b.get("type").and_then(Value::as_str).unwrap_or("") {
        "text" => text_part(b),
        "image" => image_part(b),
        "document" => document_part(b),
        other => Err(refuse(
            "messages",
            format!("a `{other}` block cannot be sent to an OpenAI-format model"),
        )),
    }
}

/// A `tool_result` block as a tool message: text content only; `is_error` as a marked
/// first line.
fn tool_message(b: &Value) -> Result<Value, TranslateError> {
    check_block(b, &["tool_use_id", "content", "is_error"])?;
    let mut content = match b.get("content") {
        None | Some(Value::Null) => json!(""),
        Some(Value::String(s)) => json!(s),
        Some(Value::Array(blocks)) => {
            let parts = blocks
                .iter()
                .map(|x| match x.get("type").and_then(Value::as_str) {
                    Some("text") => text_part(x),
                    _ => Err(refuse(
                        "messages",
                        "a tool_result with images or documents cannot be sent to an OpenAI-format model (tool messages carry text only)",
                    )),
                })
                .collect::<Result<Vec<_>, _>>()?;
            Value::Array(parts)
        }
        Some(_) => {
            return Err(refuse(
                "messages",
                "tool_result content must be a string or blocks",
            ))
        }
    };
    match b.get("is_error") {
        None | Some(Value::Null) | Some(Value::Bool(false)) => {}
        Some(Value::Bool(true)) => match &mut content {
            Value::String(s) => *s = format!("{TOOL_ERROR_MARK}{s}"),
            Value::Array(parts) => {
                if let Some(t) = parts.first_mut().and_then(|p| p.get_mut("text")) {
                    *t = json!(format!("{TOOL_ERROR_MARK}{}", t.as_str().unwrap_or("")));
                } else {
                    parts.push(json!({"type": "text", "text": TOOL_ERROR_MARK}));
                }
            }
            _ => {}
        },
        Some(_) => return Err(refuse("messages", "`is_error` must be a boolean")),
    }
    Ok(
        json!({"role": "tool", "tool_call_id": b.get("tool_use_id").cloned().unwrap_or(json!("")), "content": content}),
    )
}

fn tool_call(b: &Value) -> Result<Value, TranslateError> {
    check_block(b, &["id", "name", "input"])?;
    Ok(
        json!({"id": b.get("id").cloned().unwrap_or(json!("")), "type": "function",
        "function": {"name": b.get("name").cloned().unwrap_or(json!("")),
                     "arguments": b.get("input").map_or_else(|| "{}".to_string(), Value::to_string)}}),
    )
}

/// One text part is sent as a string, several as parts (no text joined or altered).
fn text_content(parts: Vec<Value>) -> Value {
    match parts.as_slice() {
        [] => Value::Null,
        [one] => one["text"].clone(),
        _ => Value::Array(parts),
    }
}

fn message(m: &Value, out: &mut Vec<Value>) -> Result<(), TranslateError> {
    let role = m.get("role").and_then(Value::as_str).unwrap_or("user");
    let blocks = match m.get("content") {
        Some(Value::String(s)) => {
            out.push(json!({"role": role, "content": s}));
            return Ok(());
        }
        Some(Value::Array(b)) => b,
        _ => {
            return Err(refuse(
                "messages",
                "message content must be a string or an array of blocks",
            ))
        }
    };
    let mut parts = Vec::new();
    let mut tool_calls = Vec::new();
    for b in blocks {
        match (role, b.get("type").and_then(Value::as_str).unwrap_or("")) {
            ("assistant", "text") => parts.push(text_part(b)?),
            ("assistant", "tool_use") => tool_calls.push(tool_call(b)?),
            ("user", "tool_result") => out.push(tool_message(b)?),
            ("user", _) => parts.push(user_part(b)?),
            (_, kind @ ("thinking" | "redacted_thinking")) => {
                return Err(refuse(
                    "messages",
                    format!("`{kind}` blocks cannot be sent to an OpenAI-format model (it has no place for them)"),
                ))
            }
            (_, other) => {
                return Err(refuse(
                    "messages",
                    format!("a `{other}` block in a {role} message cannot be sent to an OpenAI-format model"),
                ))
            }
        }
    }
    if role == "assistant" {
        let mut msg = json!({"role": "assistant", "content": text_content(parts)});
        if !tool_calls.is_empty() {
            msg["tool_calls"] = Value::Array(tool_calls);
        }
        out.push(msg);
    } else if !parts.is_empty() {
        out.push(json!({"role": "user", "content": parts}));
    }
    Ok(())
}

fn system(body: &Map<String, Value>) -> Result<Option<Value>, TranslateError> {
    match body.get("system") {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(json!({"role": "system", "content": s}))),
        Some(Value::Array(blocks)) => {
            let parts = blocks
                .iter()
                .map(|b| match b.get("type").and_then(Value::as_str) {
                    Some("text") => text_part(b),
                    _ => Err(refuse("system", "`system` blocks must be text blocks")),
                })
                .collect::<Result<Vec<_>, _>>()?;
            Ok(Some(
                json!({"role": "system", "content": text_content(parts)}),
            ))
        }
        Some(_) => Err(refuse("system", "`system` must be a string or text blocks")),
    }
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
        if !matches!(t.get("type").and_then(Value::as_str), None | Some("custom")) {
            return Err(refuse(
                "tools",
                "Anthropic server tools cannot be sent to an OpenAI-format model",
            ));
        }
        for k in t.as_object().into_iter().flatten().map(|(k, _)| k) {
            if !matches!(
                k.as_str(),
                "type" | "name" | "description" | "input_schema" | "cache_control"
            ) {
                return Err(refuse(
                    "tools",
                    format!("a tool's `{k}` cannot be sent to an OpenAI-format model"),
                ));
            }
        }
        let mut f = json!({"name": t.get("name").cloned().unwrap_or(json!("")),
            "parameters": t.get("input_schema").cloned().unwrap_or(json!({"type": "object"}))});
        if let Some(d) = t.get("description").filter(|d| !d.is_null()) {
            f["description"] = d.clone();
        }
        out.push(json!({"type": "function", "function": f}));
    }
    Ok(Some(Value::Array(out)))
}

/// `tool_choice`, with `disable_parallel_tool_use` as `parallel_tool_calls: false`.
fn tool_choice(
    body: &Map<String, Value>,
    out: &mut Map<String, Value>,
    has_tools: bool,
) -> Result<(), TranslateError> {
    let Some(tc) = body.get("tool_choice").filter(|t| !t.is_null()) else {
        return Ok(());
    };
    let choice = match tc.get("type").and_then(Value::as_str) {
        Some("auto") => json!("auto"),
        Some("any") => json!("required"),
        Some("none") => json!("none"),
        Some("tool") => {
            json!({"type": "function", "function": {"name": tc.get("name").cloned().unwrap_or(json!(""))}})
        }
        _ => return Err(refuse("tool_choice", "unknown tool_choice type")),
    };
    out.insert("tool_choice".into(), choice);
    match tc.get("disable_parallel_tool_use") {
        None | Some(Value::Null) | Some(Value::Bool(false)) => {}
        Some(Value::Bool(true)) if has_tools => {
            out.insert("parallel_tool_calls".into(), json!(false));
        }
        Some(Value::Bool(true)) => {}
        Some(_) => {
            return Err(refuse(
                "tool_choice",
                "`disable_parallel_tool_use` must be a boolean",
            ))
        }
    }
    Ok(())
}

/// An Anthropic Messages body for an OpenAI-format upstream; the output cap goes in the
/// field the upstream model takes (`cap.0`: `max_tokens` or `max_completion_tokens`).
pub fn anthropic_to_openai(
    body: &Map<String, Value>,
    upstream_model: &str,
    cap: (&'static str, i64),
    stream: bool,
) -> Result<Map<String, Value>, TranslateError> {
    check_fields(body)?;
    let mut messages = Vec::new();
    messages.extend(system(body)?);
    for m in body
        .get("messages")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        message(m, &mut messages)?;
    }
    let mut out = Map::new();
    out.insert("model".into(), json!(upstream_model));
    out.insert("messages".into(), Value::Array(messages));
    out.insert(cap.0.into(), json!(cap.1));
    for k in ["temperature", "top_p"] {
        if let Some(v) = body.get(k).filter(|v| !v.is_null()) {
            out.insert(k.into(), v.clone());
        }
    }
    match body.get("stop_sequences") {
        None | Some(Value::Null) => {}
        Some(Value::Array(a)) if a.iter().all(Value::is_string) => {
            out.insert("stop".into(), Value::Array(a.clone()));
        }
        Some(_) => {
            return Err(refuse(
                "stop_sequences",
                "`stop_sequences` must be an array of strings",
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
    tool_choice(body, &mut out, has_tools)?;
    if let Some(u) = body
        .get("metadata")
        .and_then(|m| m.get("user_id"))
        .filter(|u| !u.is_null())
    {
        out.insert("user".into(), u.clone());
    }
    match body
        .get("service_tier")
        .and_then(|v| if v.is_null() { None } else { Some(v.as_str()) })
    {
        None => {}
        Some(Some("auto")) => {
            out.insert("service_tier".into(), json!("auto"));
        }
        Some(Some("standard_only")) => {
            out.insert("service_tier".into(), json!("default"));
        }
        Some(_) => return Err(refuse_field("service_tier", UPSTREAM)),
    }
    if stream {
        out.insert("stream".into(), json!(true));
        out.insert("stream_options".into(), json!({"include_usage": true}));
    }
    Ok(out)
}
