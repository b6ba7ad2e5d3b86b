//! Requests across formats: an OpenAI chat request for an Anthropic upstream, and an
//! Anthropic Messages request for an OpenAI upstream. What the other side cannot express
//! (`n > 1`, `logprobs`, a JSON response format, a temperature above Anthropic's 1.0) is
//! refused rather than dropped.

use serde_json::{json, Map, Value};

use super::TranslateError;

fn refuse(param: &'static str, message: &str) -> TranslateError {
    TranslateError {
        param,
        message: message.to_string(),
    }
}

fn text_of(content: &Value) -> String {
    match content {
        Value::String(s) => s.clone(),
        Value::Array(parts) => parts
            .iter()
            .filter_map(|p| p.get("text").and_then(Value::as_str))
            .collect::<Vec<_>>()
            .join("\n"),
        _ => String::new(),
    }
}

/// An OpenAI content part as an Anthropic content block.
fn oa_part_to_block(part: &Value) -> Result<Value, TranslateError> {
    match part.get("type").and_then(Value::as_str) {
        Some("text") => {
            Ok(json!({"type": "text", "text": part.get("text").cloned().unwrap_or(json!(""))}))
        }
        Some("image_url") => {
            let url = part
                .pointer("/image_url/url")
                .and_then(Value::as_str)
                .unwrap_or("");
            if let Some(rest) = url.strip_prefix("data:") {
                let (media, data) = rest
                    .split_once(";base64,")
                    .ok_or_else(|| refuse("messages", "image data URLs must be base64"))?;
                Ok(
                    json!({"type": "image", "source": {"type": "base64", "media_type": media, "data": data}}),
                )
            } else {
                Ok(json!({"type": "image", "source": {"type": "url", "url": url}}))
            }
        }
        _ => Err(refuse(
            "messages",
            "this content part type cannot be sent to an Anthropic model",
        )),
    }
}

fn oa_content_to_blocks(content: &Value) -> Result<Vec<Value>, TranslateError> {
    match content {
        Value::String(s) if s.is_empty() => Ok(vec![]),
        Value::String(s) => Ok(vec![json!({"type": "text", "text": s})]),
        Value::Array(parts) => parts.iter().map(oa_part_to_block).collect(),
        Value::Null => Ok(vec![]),
        _ => Err(refuse(
            "messages",
            "message content must be a string or an array of parts",
        )),
    }
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

pub fn openai_to_anthropic(
    body: &Map<String, Value>,
    upstream_model: &str,
    cap: i64,
    stream: bool,
) -> Result<Map<String, Value>, TranslateError> {
    if body.get("n").and_then(Value::as_i64).unwrap_or(1) > 1 {
        return Err(refuse("n", "n > 1 cannot be served by an Anthropic model"));
    }
    if body
        .get("logprobs")
        .and_then(Value::as_bool)
        .unwrap_or(false)
        || body.contains_key("top_logprobs")
    {
        return Err(refuse(
            "logprobs",
            "logprobs cannot be served by an Anthropic model",
        ));
    }
    if body
        .get("response_format")
        .and_then(|r| r.get("type"))
        .and_then(Value::as_str)
        .is_some_and(|t| t != "text")
    {
        return Err(refuse(
            "response_format",
            "a JSON response format cannot be served by an Anthropic model",
        ));
    }
    let mut system = Vec::new();
    let mut messages = Vec::new();
    for m in body
        .get("messages")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let role = m.get("role").and_then(Value::as_str).unwrap_or("");
        let content = m.get("content").unwrap_or(&Value::Null);
        match role {
            "system" | "developer" => system.push(text_of(content)),
            "user" => push_turn(&mut messages, "user", oa_content_to_blocks(content)?),
            "assistant" => {
                let mut blocks = oa_content_to_blocks(content)?;
                for tc in m
                    .get("tool_calls")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                {
                    let args = tc
                        .pointer("/function/arguments")
                        .and_then(Value::as_str)
                        .unwrap_or("{}");
                    let input: Value =
                        serde_json::from_str(if args.trim().is_empty() { "{}" } else { args })
                            .map_err(|_| refuse("messages", "tool call arguments must be JSON"))?;
                    blocks.push(json!({"type": "tool_use", "id": tc.get("id").cloned().unwrap_or(json!("")),
                        "name": tc.pointer("/function/name").cloned().unwrap_or(json!("")), "input": input}));
                }
                push_turn(&mut messages, "assistant", blocks);
            }
            "tool" => {
                let block = json!({"type": "tool_result", "tool_use_id": m.get("tool_call_id").cloned().unwrap_or(json!("")),
                    "content": text_of(content)});
                push_turn(&mut messages, "user", vec![block]);
            }
            other => {
                return Err(refuse(
                    "messages",
                    &format!("unknown message role `{other}`"),
                ))
            }
        }
    }
    let mut out = Map::new();
    out.insert("model".into(), json!(upstream_model));
    out.insert("max_tokens".into(), json!(cap));
    out.insert("messages".into(), Value::Array(messages));
    if !system.is_empty() {
        out.insert("system".into(), json!(system.join("\n\n")));
    }
    if let Some(t) = body.get("temperature").and_then(Value::as_f64) {
        if t > 1.0 {
            return Err(refuse(
                "temperature",
                "Anthropic models accept a temperature between 0 and 1",
            ));
        }
        out.insert("temperature".into(), json!(t));
    }
    if let Some(p) = body.get("top_p") {
        out.insert("top_p".into(), p.clone());
    }
    match body.get("stop") {
        Some(Value::String(s)) => {
            out.insert("stop_sequences".into(), json!([s]));
        }
        Some(Value::Array(a)) => {
            out.insert("stop_sequences".into(), Value::Array(a.clone()));
        }
        _ => {}
    }
    if let Some(tools) = body.get("tools").and_then(Value::as_array) {
        let tools: Vec<Value> = tools
            .iter()
            .map(|t| {
                let f = t.get("function").unwrap_or(t);
                json!({"name": f.get("name").cloned().unwrap_or(json!("")),
                       "description": f.get("description").cloned().unwrap_or(json!("")),
                       "input_schema": f.get("parameters").cloned().unwrap_or(json!({"type": "object", "properties": {}}))})
            })
            .collect();
        out.insert("tools".into(), Value::Array(tools));
    }
    match body.get("tool_choice") {
        Some(Value::String(s)) if s == "auto" => {
            out.insert("tool_choice".into(), json!({"type": "auto"}));
        }
        Some(Value::String(s)) if s == "required" => {
            out.insert("tool_choice".into(), json!({"type": "any"}));
        }
        Some(Value::String(s)) if s == "none" => {
            out.insert("tool_choice".into(), json!({"type": "none"}));
        }
        Some(Value::Object(o)) => {
            let name = o
                .get("function")
                .and_then(|f| f.get("name"))
                .cloned()
                .unwrap_or(json!(""));
            out.insert("tool_choice".into(), json!({"type": "tool", "name": name}));
        }
        _ => {}
    }
    if let Some(u) = body.get("user").and_then(Value::as_str) {
        out.insert("metadata".into(), json!({"user_id": u}));
    }
    if stream {
        out.insert("stream".into(), json!(true));
    }
    Ok(out)
}

/// An Anthropic content block as OpenAI content parts (text and images) — tool blocks are
/// handled by the caller.
fn an_block_to_part(b: &Value) -> Option<Value> {
    match b.get("type").and_then(Value::as_str) {
        Some("text") => {
            Some(json!({"type": "text", "text": b.get("text").cloned().unwrap_or(json!(""))}))
        }
        Some("image") => {
            let src = b.get("source")?;
            let url = match src.get("type").and_then(Value::as_str) {
                Some("base64") => format!(
                    "data:{};base64,{}",
                    src.get("media_type")
                        .and_then(Value::as_str)
                        .unwrap_or("image/png"),
                    src.get("data").and_then(Value::as_str).unwrap_or("")
                ),
                _ => src
                    .get("url")
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_string(),
            };
            Some(json!({"type": "image_url", "image_url": {"url": url}}))
        }
        _ => None,
    }
}

/// An Anthropic Messages body for an OpenAI-format upstream; the output cap goes in the
/// field the upstream model takes (`cap.0`: `max_tokens` or `max_completion_tokens`).
pub fn anthropic_to_openai(
    body: &Map<String, Value>,
    upstream_model: &str,
    cap: (&'static str, i64),
    stream: bool,
) -> Result<Map<String, Value>, TranslateError> {
    let mut messages = Vec::new();
    match body.get("system") {
        Some(Value::String(s)) => messages.push(json!({"role": "system", "content": s})),
        Some(v @ Value::Array(_)) => {
            messages.push(json!({"role": "system", "content": text_of(v)}))
        }
        _ => {}
    }
    for m in body
        .get("messages")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let role = m.get("role").and_then(Value::as_str).unwrap_or("user");
        let blocks = match m.get("content") {
            Some(Value::String(s)) => {
                messages.push(json!({"role": role, "content": s}));
                continue;
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
            match b.get("type").and_then(Value::as_str) {
                Some("tool_use") => tool_calls.push(json!({"id": b.get("id").cloned().unwrap_or(json!("")), "type": "function",
                    "function": {"name": b.get("name").cloned().unwrap_or(json!("")),
                                 "arguments": b.get("input").map(Value::to_string).unwrap_or_else(|| "{}".into())}})),
                Some("tool_result") => {
                    let content = match b.get("content") {
                        Some(Value::String(s)) => s.clone(),
                        Some(v) => text_of(v),
                        None => String::new(),
                    };
                    messages.push(json!({"role": "tool", "tool_call_id": b.get("tool_use_id").cloned().unwrap_or(json!("")), "content": content}));
                }
                Some("thinking" | "redacted_thinking") => {}
                _ => parts.extend(an_block_to_part(b)),
            }
        }
        if role == "assistant" {
            let text = text_of(&Value::Array(parts));
            let mut msg = json!({"role": "assistant", "content": if text.is_empty() { Value::Null } else { json!(text) }});
            if !tool_calls.is_empty() {
                msg["tool_calls"] = Value::Array(tool_calls);
            }
            messages.push(msg);
        } else if !parts.is_empty() {
            messages.push(json!({"role": "user", "content": parts}));
        }
    }
    let mut out = Map::new();
    out.insert("model".into(), json!(upstream_model));
    out.insert("messages".into(), Value::Array(messages));
    out.insert(cap.0.into(), json!(cap.1));
    for k in ["temperature", "top_p"] {
        if let Some(v) = body.get(k) {
            out.insert(k.into(), v.clone());
        }
    }
    if body.contains_key("top_k") {
        return Err(refuse(
            "top_k",
            "top_k cannot be served by an OpenAI-format model",
        ));
    }
    if let Some(s) = body.get("stop_sequences") {
        out.insert("stop".into(), s.clone());
    }
    if let Some(tools) = body.get("tools").and_then(Value::as_array) {
        let tools: Vec<Value> = tools
            .iter()
            .map(|t| json!({"type": "function", "function": {"name": t.get("name").cloned().unwrap_or(json!("")),
                "description": t.get("description").cloned().unwrap_or(json!("")),
                "parameters": t.get("input_schema").cloned().unwrap_or(json!({"type": "object"}))}}))
            .collect();
        out.insert("tools".into(), Value::Array(tools));
    }
    if let Some(tc) = body.get("tool_choice") {
        let choice = match tc.get("type").and_then(Value::as_str) {
            Some("any") => json!("required"),
            Some("none") => json!("none"),
            Some("tool") => {
                json!({"type": "function", "function": {"name": tc.get("name").cloned().unwrap_or(json!(""))}})
            }
            _ => json!("auto"),
        };
        out.insert("tool_choice".into(), choice);
    }
    if let Some(u) = body.get("metadata").and_then(|m| m.get("user_id")) {
        out.insert("user".into(), u.clone());
    }
    if stream {
        out.insert("stream".into(), json!(true));
        out.insert("stream_options".into(), json!({"include_usage": true}));
    }
    Ok(out)
}
