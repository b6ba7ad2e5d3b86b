//! The Bedrock Converse wire format, upstream side: the internal form's request → a
//! Converse / ConverseStream body (`write_request`), a Converse answer → `Answer`
//! (`read_answer`), ConverseStream events → `Event`s (`EventReader`), and Bedrock's errors
//! → `ErrorInfo` (`read_error`). The model id and the stream switch travel in the URL
//! (`providers::bedrock::path`), not in the body.
//!
//! What Converse cannot express is refused naming the field as the client sent it: an image
//! or document by URL or file id (Converse takes bytes only), a JSON-schema or JSON-object
//! `response_format`, `tool_choice: none`, forbidding parallel tool calls, strict tools, a
//! reasoning effort without a token budget, a service tier. Fixtures from the Bedrock API
//! reference under `tests/fixtures/bedrock/` pin each direction.

mod events;
mod read;

pub use events::EventReader;
pub use read::{
    answer_text, error_type, names_a_fault, read_answer, read_error, read_reported, read_usage,
};

use serde_json::{json, Map, Value};

use crate::upstream::providers::canonical::{
    CacheMark, Message, Part, Reasoning, Request, ResponseFormat, Role, Source, Tool, ToolChoice,
};
use crate::upstream::providers::translate::TranslateError;

fn refuse(param: &'static str, message: impl Into<String>) -> TranslateError {
    TranslateError {
        param: Some(param.into()),
        message: message.into(),
    }
}

/// The Converse body for `r`. `cap` is the output cap (sent as `inferenceConfig.maxTokens`;
/// the field name is the OpenAI one and does not apply here); `stream` changes only the
/// URL, so it is not read. `upstream_model` decides whether a thinking budget can be sent
/// (Anthropic Claude models take it in `additionalModelRequestFields.thinking`).
pub fn write_request(
    r: &Request,
    upstream_model: &str,
    cap: Option<(&'static str, i64)>,
    _stream: bool,
) -> Result<Map<String, Value>, TranslateError> {
    let mut out = Map::new();
    refuse_unexpressible(r)?;
    let mut system = Vec::new();
    for p in &r.system {
        match p {
            Part::Text { text, cache } => {
                system.push(json!({ "text": text }));
                push_cache_point(&mut system, cache.as_ref())?;
            }
            _ => {
                return Err(refuse(
                    "system",
                    "only text can be sent as system instructions to a Bedrock model",
                ))
            }
        }
    }
    if !system.is_empty() {
        out.insert("system".into(), Value::Array(system));
    }
    out.insert("messages".into(), Value::Array(messages(r)?));
    let mut inference = Map::new();
    if let Some((_, max)) = cap {
        inference.insert("maxTokens".into(), json!(max));
    }
    if let Some(t) = r.temperature {
        inference.insert("temperature".into(), json!(t));
    }
    if let Some(p) = r.top_p {
        inference.insert("topP".into(), json!(p));
    }
    if !r.stop.is_empty() {
        inference.insert("stopSequences".into(), json!(r.stop));
    }
    if !inference.is_empty() {
        out.insert("inferenceConfig".into(), Value::Object(inference));
    }
    if let Some(tools) = tool_config(r)? {
        out.insert("toolConfig".into(), tools);
    }
    if let Some(reasoning) = &r.reasoning {
        out.insert(
            "additionalModelRequestFields".into(),
            thinking(r, reasoning, upstream_model)?,
        );
    }
    let mut meta = Map::new();
    for (k, v) in &r.metadata {
        let Some(s) = v.as_str() else {
            return Err(refuse(
                "metadata",
                format!("`metadata.{k}` must be a string for a Bedrock model"),
            ));
        };
        meta.insert(k.clone(), json!(s));
    }
    if let Some(user) = &r.user {
        meta.insert("user".into(), json!(user));
    }
    if !meta.is_empty() {
        // Bedrock's invocation-log metadata: the counterpart of an end-user id and of
        // request metadata (kept for the provider's records, never read by the model).
        out.insert("requestMetadata".into(), Value::Object(meta));
    }
    Ok(out)
}

fn refuse_unexpressible(r: &Request) -> Result<(), TranslateError> {
    match &r.response_format {
        None | Some(ResponseFormat::Text) => {}
        Some(_) => {
            let name = r.client_name("response_format", "response_format");
            return Err(refuse(name, format!("`{name}` (JSON output) cannot be sent to a Bedrock model: Converse has no structured-output switch")));
        }
    }
    // Converse's `inferenceConfig` has no top-k, seed or penalties (a model's own fields
    // would go in `additionalModelRequestFields`, differently per model): refused, not
    // dropped.
    for (set, field) in [
        (r.top_k.is_some(), "top_k"),
        (r.seed.is_some(), "seed"),
        (r.frequency_penalty.is_some(), "frequency_penalty"),
        (r.presence_penalty.is_some(), "presence_penalty"),
    ] {
        if set {
            let name = r.client_name(field, field);
            return Err(refuse(
                name,
                format!("`{name}` cannot be sent to a Bedrock model: Converse has no such setting, and Sluice does not drop it"),
            ));
        }
    }
    if r.parallel_tool_calls == Some(false) {
        let name = r.client_name("parallel_tool_calls", "parallel_tool_calls");
        return Err(refuse(name, format!("`{name}: false` cannot be sent to a Bedrock model: Converse cannot forbid parallel tool calls")));
    }
    if let Some(tier) = &r.service_tier {
        if !matches!(tier.as_str(), "auto" | "default") {
            let name = r.client_name("service_tier", "service_tier");
            return Err(refuse(
                name,
                format!("`{name}: {tier}` cannot be sent to a Bedrock model"),
            ));
        }
    }
    Ok(())
}

fn push_cache_point(out: &mut Vec<Value>, cache: Option<&CacheMark>) -> Result<(), TranslateError> {
    match cache {
        None => Ok(()),
        Some(CacheMark { ttl: None }) => {
            out.push(json!({ "cachePoint": { "type": "default" } }));
            Ok(())
        }
        Some(CacheMark { ttl: Some(ttl) }) if ttl == "5m" => {
            out.push(json!({ "cachePoint": { "type": "default" } }));
            Ok(())
        }
        Some(CacheMark { ttl: Some(ttl) }) => Err(refuse(
            "cache_control",
            format!("a cache breakpoint with ttl `{ttl}` cannot be sent to a Bedrock model (its cache points last five minutes)"),
        )),
    }
}

/// Converse alternates user and assistant turns; tool results travel in user turns, so
/// consecutive messages that land on the same role are merged.
fn messages(r: &Request) -> Result<Vec<Value>, TranslateError> {
    let mut out: Vec<(&'static str, Vec<Value>)> = Vec::new();
    for m in &r.messages {
        if m.name.is_some() {
            return Err(refuse(
                "name",
                "a message `name` cannot be sent to a Bedrock model",
            ));
        }
        let role = match m.role {
            Role::Assistant => "assistant",
            // A system turn reaches here marked as a user's (`dispatch::fit`).
            Role::User | Role::Tool | Role::System => "user",
        };
        let blocks = blocks(m)?;
        match out.last_mut() {
            Some((last, content)) if *last == role => content.extend(blocks),
            _ => out.push((role, blocks)),
        }
    }
    Ok(out
        .into_iter()
        .map(|(role, content)| json!({ "role": role, "content": content }))
        .collect())
}

fn blocks(m: &Message) -> Result<Vec<Value>, TranslateError> {
    let mut out = Vec::new();
    for p in &m.content {
        match p {
            Part::Text { text, cache } => {
                out.push(json!({ "text": text }));
                push_cache_point(&mut out, cache.as_ref())?;
            }
            Part::Refusal { text } => out.push(json!({ "text": text })),
            Part::Image {
                source,
                detail,
                cache,
            } => {
                if detail.as_deref().is_some_and(|d| d != "auto") {
                    return Err(refuse(
                        "detail",
                        "an image `detail` cannot be sent to a Bedrock model",
                    ));
                }
                out.push(image(source)?);
                push_cache_point(&mut out, cache.as_ref())?;
            }
            Part::File {
                source,
                filename,
                cache,
            } => {
                out.push(document(source, filename.as_deref())?);
                push_cache_point(&mut out, cache.as_ref())?;
            }
            Part::Reasoning {
                text,
                signature,
                redacted,
            } => out.push(match redacted {
                Some(data) => json!({ "reasoningContent": { "redactedContent": data } }),
                None => {
                    let mut t = json!({ "text": text });
                    if let Some(s) = signature {
                        t["signature"] = json!(s);
                    }
                    json!({ "reasoningContent": { "reasoningText": t } })
                }
            }),
            Part::ToolCall {
                id,
                name,
                arguments,
            } => {
                // Converse takes the input as a JSON document, not as text.
                let input: Value = serde_json::from_str(arguments).map_err(|_| {
                    refuse("tool_calls", format!("the arguments of tool call `{id}` are not JSON, which a Bedrock model cannot take back"))
                })?;
                out.push(json!({ "toolUse": { "toolUseId": id, "name": name, "input": input } }));
            }
            Part::ToolResult {
                call_id,
                content,
                is_error,
                cache,
                ..
            } => {
                let mut parts = Vec::new();
                for c in content {
                    match c {
                        Part::Text { text, .. } => parts.push(json!({ "text": text })),
                        Part::Image { source, .. } => parts.push(image(source)?),
                        Part::File { source, filename, .. } => parts.push(document(source, filename.as_deref())?),
                        _ => return Err(refuse("tool_result", "a tool result can carry only text, images and documents to a Bedrock model")),
                    }
                }
                let status = if *is_error { "error" } else { "success" };
                out.push(json!({ "toolResult": { "toolUseId": call_id, "content": parts, "status": status } }));
                push_cache_point(&mut out, cache.as_ref())?;
            }
        }
    }
    Ok(out)
}

/// Converse takes images as bytes only, in png, jpeg, gif or webp.
fn image(source: &Source) -> Result<Value, TranslateError> {
    let Source::Base64 { media_type, data } = source else {
        return Err(refuse(
            "image_url",
            "an image by URL or file id cannot be sent to a Bedrock model; send it as base64 data",
        ));
    };
    let format = match media_type.as_str() {
        "image/png" => "png",
        "image/jpeg" | "image/jpg" => "jpeg",
        "image/gif" => "gif",
        "image/webp" => "webp",
        other => return Err(refuse("image_url", format!("an image of type `{other}` cannot be sent to a Bedrock model (png, jpeg, gif or webp)"))),
    };
    Ok(json!({ "image": { "format": format, "source": { "bytes": data } } }))
}

/// Converse documents: bytes, a format, and a name of letters, digits, spaces, hyphens,
/// parentheses and brackets.
fn document(source: &Source, filename: Option<&str>) -> Result<Value, TranslateError> {
    let Source::Base64 { media_type, data } = source else {
        return Err(refuse("file", "a document by URL or file id cannot be sent to a Bedrock model; send it as base64 data"));
    };
    let format = match media_type.as_str() {
        "application/pdf" => "pdf",
        "text/csv" => "csv",
        "text/html" => "html",
        "text/plain" => "txt",
        "text/markdown" => "md",
        "application/msword" => "doc",
        "application/vnd.openxmlformats-officedocument.wordprocessingml.document" => "docx",
        "application/vnd.ms-excel" => "xls",
        "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet" => "xlsx",
        other => {
            return Err(refuse(
                "file",
                format!("a document of type `{other}` cannot be sent to a Bedrock model"),
            ))
        }
    };
    let stem = filename
        .map(|f| f.rsplit_once('.').map_or(f, |(s, _)| s))
        .unwrap_or("document");
    let name: String = stem
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || " -()[]".contains(c) {
                c
            } else {
                '-'
            }
        })
        .collect();
    let name = if name.trim().is_empty() {
        "document".to_string()
    } else {
        name
    };
    Ok(json!({ "document": { "format": format, "name": name, "source": { "bytes": data } } }))
}

fn tool_config(r: &Request) -> Result<Option<Value>, TranslateError> {
    let has_history = r
        .messages
        .iter()
        .flat_map(|m| &m.content)
        .any(|p| matches!(p, Part::ToolCall { .. } | Part::ToolResult { .. }));
    if r.tools.is_empty() {
        if r.tool_choice
            .as_ref()
            .is_some_and(|c| *c != ToolChoice::Auto && *c != ToolChoice::None)
        {
            let name = r.client_name("tool_choice", "tool_choice");
            return Err(refuse(
                name,
                format!("`{name}` names a tool but no tools were given"),
            ));
        }
        if has_history {
            return Err(refuse(
                "tools",
                "a conversation with tool calls needs its tools declared for a Bedrock model",
            ));
        }
        return Ok(None);
    }
    let mut tools = Vec::new();
    for t in &r.tools {
        tools.push(tool_spec(t)?);
        push_cache_point(&mut tools, t.cache.as_ref())?;
    }
    let mut config = json!({ "tools": tools });
    match &r.tool_choice {
        None => {}
        Some(ToolChoice::Auto) => config["toolChoice"] = json!({ "auto": {} }),
        Some(ToolChoice::Required) => config["toolChoice"] = json!({ "any": {} }),
        Some(ToolChoice::Named(n)) => config["toolChoice"] = json!({ "tool": { "name": n } }),
        Some(ToolChoice::None) => {
            let name = r.client_name("tool_choice", "tool_choice");
            return Err(refuse(name, format!("`{name}: none` cannot be sent to a Bedrock model: Converse cannot forbid tool calls while tools are declared")));
        }
    }
    Ok(Some(config))
}

fn tool_spec(t: &Tool) -> Result<Value, TranslateError> {
    if t.strict == Some(true) {
        return Err(refuse(
            "strict",
            format!("strict tool `{}` cannot be sent to a Bedrock model", t.name),
        ));
    }
    let mut spec = json!({ "name": t.name, "inputSchema": { "json": t.parameters } });
    if let Some(d) = &t.description {
        spec["description"] = json!(d);
    }
    Ok(json!({ "toolSpec": spec }))
}

/// A thinking budget, for the Anthropic models that take one through Bedrock.
fn thinking(
    r: &Request,
    reasoning: &Reasoning,
    upstream_model: &str,
) -> Result<Value, TranslateError> {
    let name = r.client_name("reasoning", "reasoning");
    let claude = upstream_model.contains("anthropic.claude");
    match reasoning.budget_tokens {
        Some(budget) if claude && reasoning.summary.is_none() => {
            Ok(json!({ "thinking": { "type": "enabled", "budget_tokens": budget } }))
        }
        Some(_) if !claude => Err(refuse(name, format!("`{name}` can be sent only to an Anthropic Claude model on Bedrock"))),
        _ => Err(refuse(name, format!("`{name}` without a token budget cannot be sent to a Bedrock model; give a thinking budget in tokens"))),
    }
}

#[cfg(test)]
mod tests;
