//! A request in the internal form written as an OpenAI chat request (the upstream side):
//! system parts as a system message, tool calls with their ids, each tool result as a tool
//! message (`is_error` as a marked first line, `TOOL_ERROR_MARK`), PDFs as `file` parts.
//! Cache marks are caching hints, not content: OpenAI caches prompt prefixes by itself, so
//! they are not sent. What OpenAI cannot express is refused naming the client's field.

use serde_json::{json, Map, Value};

use super::super::{refuse, refuse_field, source_url, TOOL_ERROR_MARK};
use crate::upstream::providers::canonical::{
    Message, Part, Request, ResponseFormat, Role, Source, ToolChoice,
};
use crate::upstream::providers::translate::TranslateError;

const UPSTREAM: &str = "an OpenAI-format model";

fn text_part(t: &str) -> Value {
    json!({"type": "text", "text": t})
}

/// A user (or system) part as an OpenAI content part.
fn part(p: &Part) -> Result<Value, TranslateError> {
    match p {
        Part::Text { text, .. } => Ok(text_part(text)),
        Part::Image { source, detail, .. } => {
            let Some(url) = source_url(source) else {
                return Err(refuse(
                    "messages",
                    "an image with `source.type: file` (an Anthropic upload) cannot be sent to an OpenAI-format model; send it as base64 or url",
                ));
            };
            let mut image = json!({"url": url});
            if let Some(d) = detail {
                image["detail"] = json!(d);
            }
            Ok(json!({"type": "image_url", "image_url": image}))
        }
        Part::File {
            source, filename, ..
        } => match source {
            Source::FileId(id) => Ok(json!({"type": "file", "file": {"file_id": id}})),
            Source::Base64 { media_type, data } if media_type == "application/pdf" => {
                let name = filename.as_deref().unwrap_or("document.pdf");
                Ok(json!({"type": "file", "file": {"filename": name,
                    "file_data": format!("data:application/pdf;base64,{data}")}}))
            }
            _ => Err(refuse(
                "messages",
                "a document other than a base64 PDF cannot be sent to an OpenAI-format model; send a base64 PDF or text",
            )),
        },
        Part::Reasoning { redacted, .. } => {
            let kind = if redacted.is_some() {
                "redacted_thinking"
            } else {
                "thinking"
            };
            Err(refuse(
                "messages",
                format!("`{kind}` blocks cannot be sent to an OpenAI-format model (it has no place for them)"),
            ))
        }
        Part::ToolCall { .. } | Part::ToolResult { .. } | Part::Refusal { .. } => Err(refuse(
            "messages",
            "a tool call, tool result or refusal cannot stand in a user message to an OpenAI-format model",
        )),
    }
}

/// One text part is sent as a string, several as parts (no text joined or altered).
fn text_content(parts: Vec<Value>) -> Value {
    match parts.as_slice() {
        [] => Value::Null,
        [one] => one["text"].clone(),
        _ => Value::Array(parts),
    }
}

fn tool_message(p: &Part) -> Result<Value, TranslateError> {
    let Part::ToolResult {
        call_id,
        content,
        is_error,
        plain,
        ..
    } = p
    else {
        return Err(refuse(
            "messages",
            "a tool message carries tool results only",
        ));
    };
    let mut texts = Vec::new();
    for c in content {
        match c {
            Part::Text { text, .. } => texts.push(text.as_str()),
            _ => {
                return Err(refuse(
                    "messages",
                    "a tool_result with images or documents cannot be sent to an OpenAI-format model (tool messages carry text only)",
                ))
            }
        }
    }
    let mark = if *is_error { TOOL_ERROR_MARK } else { "" };
    let content = match (plain, texts.as_slice()) {
        (true, []) => json!(mark),
        (true, [one]) => json!(format!("{mark}{one}")),
        _ => {
            let mut parts: Vec<Value> = texts.iter().map(|t| text_part(t)).collect();
            if *is_error {
                match parts.first_mut() {
                    Some(first) => first["text"] = json!(format!("{mark}{}", texts[0])),
                    None => parts.push(text_part(mark)),
                }
            }
            Value::Array(parts)
        }
    };
    Ok(json!({"role": "tool", "tool_call_id": call_id, "content": content}))
}

fn message(m: &Message, out: &mut Vec<Value>) -> Result<(), TranslateError> {
    let mut msg = match m.role {
        Role::Tool => {
            for p in &m.content {
                out.push(tool_message(p)?);
            }
            return Ok(());
        }
        // In place: chat completions take system messages anywhere in the conversation.
        Role::System => {
            let parts = m.content.iter().map(part).collect::<Result<Vec<_>, _>>()?;
            json!({"role": "system", "content": text_content(parts)})
        }
        Role::User => {
            if m.content.is_empty() {
                return Ok(());
            }
            let content = match (m.plain, m.content.as_slice()) {
                (true, [Part::Text { text, .. }]) => json!(text),
                _ => Value::Array(m.content.iter().map(part).collect::<Result<_, _>>()?),
            };
            json!({"role": "user", "content": content})
        }
        Role::Assistant => {
            let mut texts = Vec::new();
            let mut refusals = Vec::new();
            let mut calls = Vec::new();
            for p in &m.content {
                match p {
                    Part::Text { text, .. } => texts.push(text_part(text)),
                    Part::Refusal { text } => refusals.push(text.as_str()),
                    Part::ToolCall {
                        id,
                        name,
                        arguments,
                    } => calls.push(json!({"id": id, "type": "function",
                        "function": {"name": name, "arguments": arguments}})),
                    other => return Err(part(other).err().unwrap_or_else(|| refuse(
                        "messages",
                        "an image or document in an assistant message cannot be sent to an OpenAI-format model",
                    ))),
                }
            }
            let content = match (m.plain, texts.as_slice()) {
                (true, [one]) => one["text"].clone(),
                _ => text_content(texts),
            };
            let mut msg = json!({"role": "assistant", "content": content});
            if !refusals.is_empty() {
                msg["refusal"] = json!(refusals.concat());
            }
            if !calls.is_empty() {
                msg["tool_calls"] = Value::Array(calls);
            }
            msg
        }
    };
    if let Some(n) = &m.name {
        msg["name"] = json!(n);
    }
    out.push(msg);
    Ok(())
}

/// Fields of the internal form OpenAI chat has no counterpart for, refused when set.
fn check_unexpressible(r: &Request) -> Result<(), TranslateError> {
    if let Some(reasoning) = &r.reasoning {
        if reasoning.budget_tokens.is_some() {
            return Err(refuse(
                r.client_name("reasoning", "reasoning"),
                "extended thinking cannot be sent to an OpenAI-format model (its answer has no thinking blocks)",
            ));
        }
    }
    if let Some(k) = r.metadata.keys().next() {
        return Err(refuse(
            "metadata",
            format!("`metadata.{k}` cannot be sent to an OpenAI-format model"),
        ));
    }
    if r.top_k.is_some() {
        return Err(refuse_field(r.client_name("top_k", "top_k"), UPSTREAM));
    }
    Ok(())
}

/// An OpenAI chat body; the output cap goes in the field the upstream model takes
/// (`cap.0`: `max_tokens` or `max_completion_tokens`).
pub fn write_request(
    r: &Request,
    upstream_model: &str,
    cap: Option<(&'static str, i64)>,
    stream: bool,
) -> Result<Map<String, Value>, TranslateError> {
    check_unexpressible(r)?;
    let mut messages = Vec::new();
    if !r.system.is_empty() {
        let parts = r.system.iter().map(part).collect::<Result<Vec<_>, _>>()?;
        messages.push(json!({"role": "system", "content": text_content(parts)}));
    }
    for m in &r.messages {
        message(m, &mut messages)?;
    }
    let mut out = Map::new();
    out.insert("model".into(), json!(upstream_model));
    out.insert("messages".into(), Value::Array(messages));
    if let Some((field, cap)) = cap.or(r.max_output_tokens.map(|c| ("max_tokens", c))) {
        out.insert(field.into(), json!(cap));
    }
    let mut put = |k: &str, v: Option<Value>| {
        if let Some(v) = v {
            out.insert(k.into(), v);
        }
    };
    put("temperature", r.temperature.map(Value::from));
    put("top_p", r.top_p.map(Value::from));
    put("seed", r.seed.map(Value::from));
    put("frequency_penalty", r.frequency_penalty.map(Value::from));
    put("presence_penalty", r.presence_penalty.map(Value::from));
    put("stop", (!r.stop.is_empty()).then(|| json!(r.stop)));
    let has_tools = !r.tools.is_empty();
    put(
        "tools",
        has_tools.then(|| {
            r.tools
                .iter()
                .map(|t| {
                    let params = if t.parameters.is_null() {
                        json!({"type": "object"})
                    } else {
                        t.parameters.clone()
                    };
                    let mut f = json!({"name": t.name, "parameters": params});
                    if let Some(d) = &t.description {
                        f["description"] = json!(d);
                    }
                    if let Some(s) = t.strict {
                        f["strict"] = json!(s);
                    }
                    json!({"type": "function", "function": f})
                })
                .collect()
        }),
    );
    put(
        "tool_choice",
        r.tool_choice.as_ref().map(|c| match c {
            ToolChoice::Auto => json!("auto"),
            ToolChoice::Required => json!("required"),
            ToolChoice::None => json!("none"),
            ToolChoice::Named(n) => json!({"type": "function", "function": {"name": n}}),
        }),
    );
    put(
        "parallel_tool_calls",
        r.parallel_tool_calls.filter(|_| has_tools).map(Value::from),
    );
    put("user", r.user.as_ref().map(|u| json!(u)));
    put(
        "reasoning_effort",
        r.reasoning
            .as_ref()
            .and_then(|x| x.effort.as_ref())
            .map(|e| json!(e)),
    );
    put(
        "response_format",
        r.response_format.as_ref().and_then(|f| match f {
            ResponseFormat::Text => None,
            ResponseFormat::JsonObject => Some(json!({"type": "json_object"})),
            ResponseFormat::JsonSchema {
                name,
                schema,
                strict,
                description,
            } => {
                let mut s = json!({"name": name, "schema": schema});
                if let Some(x) = strict {
                    s["strict"] = json!(x);
                }
                if let Some(d) = description {
                    s["description"] = json!(d);
                }
                Some(json!({"type": "json_schema", "json_schema": s}))
            }
        }),
    );
    put("service_tier", r.service_tier.as_ref().map(|t| json!(t)));
    if stream {
        out.insert("stream".into(), json!(true));
        out.insert("stream_options".into(), json!({"include_usage": true}));
    }
    Ok(out)
}
