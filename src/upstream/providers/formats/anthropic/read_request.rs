//! An Anthropic Messages request read into the internal form (the client side): `system`
//! text blocks, `tool_use` / `tool_result` blocks (ids and `is_error` kept), images,
//! PDF and text documents, thinking blocks with their signatures, `cache_control` as cache
//! marks. Known fields with no counterpart are refused when set; unknown ones as Anthropic
//! refuses them.

use serde_json::{Map, Value};

use super::super::{
    array_field, cache_mark_of, integer, number, opt_string, refuse, refuse_field, string,
    string_array, unset, UPSTREAM,
};
use crate::upstream::providers::canonical::{
    CacheMark, Message, Part, Reasoning, Request, Role, Source, Tool, ToolChoice,
};
use crate::upstream::providers::translate::TranslateError;

const READ: &[&str] = &[
    "model",
    "messages",
    "max_tokens",
    "system",
    "metadata",
    "stop_sequences",
    "stream",
    "temperature",
    "top_p",
    "top_k",
    "tools",
    "tool_choice",
    "service_tier",
    "thinking",
];

/// Known Anthropic fields with no counterpart in the internal form: refused when set.
const REFUSED: &[&str] = &[
    "container",
    "mcp_servers",
    "context_management",
    "output_format",
];

fn check_fields(body: &Map<String, Value>) -> Result<(), TranslateError> {
    for (k, v) in body {
        if READ.contains(&k.as_str()) {
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

/// Fields of a block that may be present besides `allowed`: `type`, `cache_control` (read
/// as the cache mark) and `citations` that ask for nothing.
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
                format!("`{k}` of a `{kind}` block cannot be sent to {UPSTREAM}"),
            ));
        }
    }
    Ok(())
}

fn cache(b: &Value) -> Option<CacheMark> {
    b.get("cache_control")
        .and_then(Value::as_object)
        .map(cache_mark_of)
}

fn text_part(b: &Value) -> Result<Part, TranslateError> {
    check_block(b, &["text"])?;
    match b.get("text") {
        Some(Value::String(t)) => Ok(Part::Text {
            text: t.clone(),
            cache: cache(b),
        }),
        _ => Err(refuse("messages", "a text block needs a string `text`")),
    }
}

fn image_part(b: &Value) -> Result<Part, TranslateError> {
    check_block(b, &["source"])?;
    let src = b.get("source").unwrap_or(&Value::Null);
    let s = |k: &str| src.get(k).and_then(Value::as_str);
    let source = match (s("type"), s("media_type"), s("data"), s("url")) {
        (Some("base64"), Some(media), Some(data), _) => Source::Base64 {
            media_type: media.to_string(),
            data: data.to_string(),
        },
        (Some("url"), _, _, Some(url)) => Source::Url(url.to_string()),
        (Some("file"), ..) => {
            return Err(refuse(
                "messages",
                format!("an image with `source.type: file` (an Anthropic upload) cannot be sent to {UPSTREAM}; send it as base64 or url"),
            ))
        }
        _ => return Err(refuse("messages", "an image block needs a base64 or url source")),
    };
    Ok(Part::Image {
        source,
        detail: None,
        cache: cache(b),
    })
}

/// A `document` block: a base64 PDF is a file (`title` its file name); a plain-text
/// document is text. URLs and Anthropic file ids have no counterpart elsewhere, nor do
/// `context` and enabled citations.
fn document_part(b: &Value) -> Result<Part, TranslateError> {
    let src = b.get("source").unwrap_or(&Value::Null);
    let s = |k: &str| src.get(k).and_then(Value::as_str);
    match (s("type"), s("media_type"), s("data")) {
        (Some("base64"), Some("application/pdf"), Some(data)) => {
            check_block(b, &["source", "title"])?;
            Ok(Part::File {
                source: Source::Base64 {
                    media_type: "application/pdf".into(),
                    data: data.to_string(),
                },
                filename: b.get("title").and_then(Value::as_str).map(str::to_string),
                cache: cache(b),
            })
        }
        (Some("text"), _, Some(data)) => {
            check_block(b, &["source"])?;
            Ok(Part::Text {
                text: data.to_string(),
                cache: cache(b),
            })
        }
        (kind, ..) => Err(refuse(
            "messages",
            format!(
                "a document with source type `{}` cannot be sent to {UPSTREAM}; send a base64 PDF or text",
                kind.unwrap_or("?")
            ),
        )),
    }
}

/// A user block (not a tool result).
fn user_part(b: &Value) -> Result<Part, TranslateError> {
    match b.get("type").and_then(Value::as_str).unwrap_or("") {
        "text" => text_part(b),
        "image" => image_part(b),
        "document" => document_part(b),
        other => Err(refuse(
            "messages",
            format!("a `{other}` block cannot be sent to {UPSTREAM}"),
        )),
    }
}

fn tool_result(b: &Value) -> Result<Part, TranslateError> {
    check_block(b, &["tool_use_id", "content", "is_error"])?;
    let (content, plain) = match b.get("content") {
        None | Some(Value::Null) => (vec![], true),
        Some(Value::String(s)) => (
            vec![Part::Text {
                text: s.clone(),
                cache: None,
            }],
            true,
        ),
        Some(Value::Array(blocks)) => (
            blocks
                .iter()
                .map(|x| match x.get("type").and_then(Value::as_str) {
                    Some("text") => text_part(x),
                    Some("image") => image_part(x),
                    _ => Err(refuse(
                        "messages",
                        format!("a tool_result with documents cannot be sent to {UPSTREAM}"),
                    )),
                })
                .collect::<Result<Vec<_>, _>>()?,
            false,
        ),
        Some(_) => {
            return Err(refuse(
                "messages",
                "tool_result content must be a string or blocks",
            ))
        }
    };
    let is_error = match b.get("is_error") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(e)) => *e,
        Some(_) => return Err(refuse("messages", "`is_error` must be a boolean")),
    };
    Ok(Part::ToolResult {
        call_id: string(b, "tool_use_id"),
        content,
        is_error,
        cache: cache(b),
        plain,
    })
}

fn tool_call(b: &Value) -> Result<Part, TranslateError> {
    check_block(b, &["id", "name", "input"])?;
    Ok(Part::ToolCall {
        id: string(b, "id"),
        name: string(b, "name"),
        arguments: b
            .get("input")
            .map_or_else(|| "{}".to_string(), Value::to_string),
    })
}

fn reasoning(b: &Value, kind: &str) -> Result<Part, TranslateError> {
    let s = |k: &str| b.get(k).and_then(Value::as_str).map(str::to_string);
    Ok(if kind == "thinking" {
        check_block(b, &["thinking", "signature"])?;
        Part::Reasoning {
            text: s("thinking").unwrap_or_default(),
            signature: s("signature"),
            redacted: None,
        }
    } else {
        check_block(b, &["data"])?;
        Part::Reasoning {
            text: String::new(),
            signature: None,
            redacted: Some(s("data").unwrap_or_default()),
        }
    })
}

/// One message; tool results are split out into tool messages of their own, in order.
fn message(m: &Value, out: &mut Vec<Message>) -> Result<(), TranslateError> {
    // A message has a role and content only; anything else Anthropic refuses, and it
    // would be dropped on the way.
    if let Some(k) = m
        .as_object()
        .into_iter()
        .flatten()
        .map(|(k, _)| k)
        .find(|k| !matches!(k.as_str(), "role" | "content"))
    {
        return Err(TranslateError {
            param: Some("messages".into()),
            message: format!("messages.{k}: Extra inputs are not permitted"),
        });
    }
    let role = match m.get("role").and_then(Value::as_str).unwrap_or("user") {
        "assistant" => Role::Assistant,
        "user" => Role::User,
        other => {
            return Err(refuse(
                "messages",
                format!("a message with role `{other}` cannot be sent to {UPSTREAM}"),
            ))
        }
    };
    let blocks = match m.get("content") {
        Some(Value::String(s)) => {
            out.push(Message {
                role,
                content: vec![Part::Text {
                    text: s.clone(),
                    cache: None,
                }],
                name: None,
                plain: true,
            });
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
    for b in blocks {
        let kind = b.get("type").and_then(Value::as_str).unwrap_or("");
        match (role, kind) {
            (Role::Assistant, "text") => parts.push(text_part(b)?),
            (Role::Assistant, "tool_use") => parts.push(tool_call(b)?),
            (Role::Assistant, "thinking" | "redacted_thinking") => parts.push(reasoning(b, kind)?),
            (Role::User, "tool_result") => {
                // Tool results come first, each its own message, the user's own parts
                // after them: a format with tool messages wants the results right after
                // the calls they answer.
                let result = tool_result(b)?;
                out.push(Message {
                    role: Role::Tool,
                    plain: matches!(result, Part::ToolResult { plain: true, .. }),
                    content: vec![result],
                    name: None,
                });
            }
            (Role::User, _) => parts.push(user_part(b)?),
            (_, other) => {
                return Err(refuse(
                    "messages",
                    format!(
                        "a `{other}` block in an assistant message cannot be sent to {UPSTREAM}"
                    ),
                ))
            }
        }
    }
    if role == Role::Assistant {
        out.push(Message {
            role,
            content: parts,
            name: None,
            plain: false,
        });
    } else if !parts.is_empty() {
        out.push(user(parts));
    }
    Ok(())
}

fn user(content: Vec<Part>) -> Message {
    Message {
        role: Role::User,
        content,
        name: None,
        plain: false,
    }
}

fn system(body: &Map<String, Value>) -> Result<Vec<Part>, TranslateError> {
    match body.get("system") {
        None | Some(Value::Null) => Ok(vec![]),
        Some(Value::String(s)) => Ok(vec![Part::Text {
            text: s.clone(),
            cache: None,
        }]),
        Some(Value::Array(blocks)) => blocks
            .iter()
            .map(|b| match b.get("type").and_then(Value::as_str) {
                Some("text") => text_part(b),
                _ => Err(refuse("system", "`system` blocks must be text blocks")),
            })
            .collect(),
        Some(_) => Err(refuse("system", "`system` must be a string or text blocks")),
    }
}

fn tools(body: &Map<String, Value>) -> Result<Vec<Tool>, TranslateError> {
    array_field(body, "tools")?
        .iter()
        .map(|t| {
            if !matches!(t.get("type").and_then(Value::as_str), None | Some("custom")) {
                return Err(refuse(
                    "tools",
                    format!("Anthropic server tools cannot be sent to {UPSTREAM}"),
                ));
            }
            for k in t.as_object().into_iter().flatten().map(|(k, _)| k) {
                if !matches!(
                    k.as_str(),
                    "type" | "name" | "description" | "input_schema" | "cache_control"
                ) {
                    return Err(refuse(
                        "tools",
                        format!("a tool's `{k}` cannot be sent to {UPSTREAM}"),
                    ));
                }
            }
            Ok(Tool {
                name: string(t, "name"),
                description: opt_string(t, "description"),
                parameters: t.get("input_schema").cloned().unwrap_or(Value::Null),
                strict: None,
                cache: cache(t),
            })
        })
        .collect()
}

/// `tool_choice` and its `disable_parallel_tool_use` (`parallel_tool_calls: false`).
fn tool_choice(body: &Map<String, Value>, r: &mut Request) -> Result<(), TranslateError> {
    let Some(tc) = body.get("tool_choice").filter(|t| !t.is_null()) else {
        return Ok(());
    };
    r.tool_choice = Some(match tc.get("type").and_then(Value::as_str) {
        Some("auto") => ToolChoice::Auto,
        Some("any") => ToolChoice::Required,
        Some("none") => ToolChoice::None,
        Some("tool") => ToolChoice::Named(string(tc, "name")),
        _ => return Err(refuse("tool_choice", "unknown tool_choice type")),
    });
    match tc.get("disable_parallel_tool_use") {
        None | Some(Value::Null) | Some(Value::Bool(false)) => {}
        Some(Value::Bool(true)) => r.parallel_tool_calls = Some(false),
        Some(_) => {
            return Err(refuse(
                "tool_choice",
                "`disable_parallel_tool_use` must be a boolean",
            ))
        }
    }
    Ok(())
}

fn thinking(body: &Map<String, Value>, r: &mut Request) -> Result<(), TranslateError> {
    match body.get("thinking") {
        None | Some(Value::Null) => Ok(()),
        Some(t) if t.get("type").and_then(Value::as_str) == Some("disabled") => Ok(()),
        Some(t) => {
            let budget = t
                .get("budget_tokens")
                .and_then(Value::as_i64)
                .filter(|_| t.get("type").and_then(Value::as_str) == Some("enabled"))
                .ok_or_else(|| {
                    refuse(
                        "thinking",
                        "`thinking` must be enabled with a `budget_tokens` or disabled",
                    )
                })?;
            r.names.push(("thinking", "reasoning"));
            r.reasoning = Some(Reasoning {
                effort: None,
                budget_tokens: Some(budget),
                summary: None,
            });
            Ok(())
        }
    }
}

/// An Anthropic Messages request in the internal form.
pub fn read_request(body: &Map<String, Value>) -> Result<Request, TranslateError> {
    check_fields(body)?;
    let mut r = Request {
        model: body
            .get("model")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string(),
        system: system(body)?,
        ..Request::default()
    };
    for m in body
        .get("messages")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        message(m, &mut r.messages)?;
    }
    r.max_output_tokens = integer(body.get("max_tokens"), "max_tokens")?;
    r.temperature = number(body.get("temperature"), "temperature")?;
    r.top_p = number(body.get("top_p"), "top_p")?;
    r.top_k = integer(body.get("top_k"), "top_k")?;
    r.stop = match body.get("stop_sequences") {
        None | Some(Value::Null) => vec![],
        Some(v) => string_array(v).ok_or_else(|| {
            refuse(
                "stop_sequences",
                "`stop_sequences` must be an array of strings",
            )
        })?,
    };
    r.tools = tools(body)?;
    tool_choice(body, &mut r)?;
    thinking(body, &mut r)?;
    match body.get("metadata") {
        None | Some(Value::Null) => {}
        Some(Value::Object(m)) => {
            for (k, v) in m {
                if k == "user_id" {
                    match v {
                        Value::Null => {}
                        Value::String(u) => r.user = Some(u.clone()),
                        _ => return Err(refuse("metadata", "`metadata.user_id` must be a string")),
                    }
                } else {
                    r.metadata.insert(k.clone(), v.clone());
                }
            }
        }
        Some(_) => return Err(refuse("metadata", "`metadata` must be an object")),
    }
    r.service_tier = match body.get("service_tier") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) if s == "standard_only" => Some("default".into()),
        Some(Value::String(s)) if s == "auto" => Some("auto".into()),
        Some(_) => return Err(refuse_field("service_tier", UPSTREAM)),
    };
    r.stream = body.get("stream").and_then(Value::as_bool).unwrap_or(false);
    r.include_usage = true;
    Ok(r)
}
