//! An OpenAI chat request read into the internal form (the client side). System and
//! developer messages become `system`, tool messages `ToolResult`s (the error mark read
//! back as `is_error`), data URLs base64 sources. A field the internal form has no place
//! for is accepted only at its default, else refused naming it.

use serde_json::{Map, Value};

use super::super::{
    array_field, cache_mark_of, data_url, function_tool, integer, number, opt_string, refuse,
    refuse_field, string, string_array, unset, TOOL_ERROR_MARK, UPSTREAM,
};
use crate::upstream::providers::canonical::{
    CacheMark, Message, Part, Reasoning, Request, ResponseFormat, Role, Source, Tool, ToolChoice,
};
use crate::upstream::providers::translate::TranslateError;

/// Top-level fields accepted only at their default (what every other format does anyway).
const AT_DEFAULT: &[(&str, &str)] = &[
    ("n", "1"),
    ("logprobs", "false"),
    ("top_logprobs", "null"),
    ("logit_bias", "{}"),
    ("store", "false"),
    ("modalities", "[\"text\"]"),
    ("audio", "null"),
    ("verbosity", "null"),
    ("prediction", "null"),
    ("web_search_options", "null"),
    ("functions", "null"),
    ("function_call", "null"),
];

/// Read into the internal form, or a caching hint that changes nothing in the answer
/// (`prompt_cache_key`, `prompt_cache_retention`).
const READ: &[&str] = &[
    "model",
    "messages",
    "max_tokens",
    "max_completion_tokens",
    "stream",
    "stream_options",
    "temperature",
    "top_p",
    "seed",
    "frequency_penalty",
    "presence_penalty",
    "stop",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "user",
    "safety_identifier",
    "service_tier",
    "metadata",
    "reasoning_effort",
    "response_format",
    "prompt_cache_key",
    "prompt_cache_retention",
];

fn check_fields(body: &Map<String, Value>) -> Result<(), TranslateError> {
    for (k, v) in body {
        if READ.contains(&k.as_str()) {
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
        // `include_usage` is the gateway's (the usage chunk is made from the upstream's
        // figures); other formats' streams carry no obfuscation padding to switch off.
        if let Some(k) = o
            .keys()
            .find(|k| !matches!(k.as_str(), "include_usage" | "include_obfuscation"))
        {
            return Err(refuse(
                "stream_options",
                format!("`stream_options.{k}` cannot be sent to {UPSTREAM}."),
            ));
        }
    }
    Ok(())
}

/// A part's `cache_control` (Anthropic's prompt-cache mark, which OpenAI-format clients
/// send to reach Anthropic models, as OpenRouter and LiteLLM take it) as the internal
/// form's cache mark: carried where the upstream has one, never dropped silently.
fn cache_mark(p: &Value) -> Result<Option<CacheMark>, TranslateError> {
    match p.get("cache_control") {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Object(c)) => Ok(Some(cache_mark_of(c))),
        Some(_) => Err(refuse("messages", "`cache_control` must be an object")),
    }
}

/// A part's fields besides `type`, `cache_control` and `allowed` have no place in the
/// internal form: refused, not dropped.
fn check_part(p: &Value, allowed: &[&str]) -> Result<(), TranslateError> {
    for (k, v) in p.as_object().into_iter().flatten() {
        if !(allowed.contains(&k.as_str()) || k == "type" || k == "cache_control" || v.is_null()) {
            let kind = p.get("type").and_then(Value::as_str).unwrap_or("");
            return Err(refuse(
                "messages",
                format!("`{k}` of a `{kind}` part cannot be sent to {UPSTREAM}"),
            ));
        }
    }
    Ok(())
}

/// A text part with its cache mark.
fn marked_text(p: &Value, t: &str) -> Result<Part, TranslateError> {
    check_part(p, &["text"])?;
    Ok(Part::Text {
        text: t.to_string(),
        cache: cache_mark(p)?,
    })
}

/// A text-only content (system, developer, tool) as text parts.
fn text_parts(content: &Value) -> Result<Vec<Part>, TranslateError> {
    match content {
        Value::String(s) => Ok(vec![text(s)]),
        Value::Array(parts) => parts
            .iter()
            .map(
                |p| match (p.get("type").and_then(Value::as_str), p.get("text")) {
                    (Some("text"), Some(Value::String(t))) => marked_text(p, t),
                    _ => Err(refuse(
                        "messages",
                        format!("only text parts can be sent here to {UPSTREAM}"),
                    )),
                },
            )
            .collect(),
        Value::Null => Ok(vec![]),
        _ => Err(refuse(
            "messages",
            "message content must be a string or an array of parts",
        )),
    }
}

fn text(t: &str) -> Part {
    Part::Text {
        text: t.to_string(),
        cache: None,
    }
}

fn part(p: &Value) -> Result<Part, TranslateError> {
    let kind = p.get("type").and_then(Value::as_str).unwrap_or("");
    match kind {
        "text" => match p.get("text") {
            Some(Value::String(t)) => marked_text(p, t),
            _ => Err(refuse("messages", "a text part needs a string `text`")),
        },
        "image_url" => {
            check_part(p, &["image_url"])?;
            let Some(url) = p.pointer("/image_url/url").and_then(Value::as_str) else {
                return Err(refuse(
                    "messages",
                    "an image_url part needs `image_url.url`",
                ));
            };
            let source = if url.starts_with("data:") {
                let (media, data) = data_url(url)
                    .ok_or_else(|| refuse("messages", "image data URLs must be base64"))?;
                Source::Base64 {
                    media_type: media.to_string(),
                    data: data.to_string(),
                }
            } else {
                Source::Url(url.to_string())
            };
            let detail = p
                .pointer("/image_url/detail")
                .and_then(Value::as_str)
                .map(str::to_string);
            Ok(Part::Image {
                source,
                detail,
                cache: cache_mark(p)?,
            })
        }
        "file" => {
            check_part(p, &["file"])?;
            let cache = cache_mark(p)?;
            let file = p.get("file").and_then(Value::as_object);
            let filename = file
                .and_then(|f| f.get("filename"))
                .and_then(Value::as_str)
                .map(str::to_string);
            if let Some(id) = file.and_then(|f| f.get("file_id")).and_then(Value::as_str) {
                return Ok(Part::File {
                    source: Source::FileId(id.to_string()),
                    filename,
                    cache,
                });
            }
            let data = file
                .and_then(|f| f.get("file_data"))
                .and_then(Value::as_str);
            match data.and_then(data_url) {
                Some((media, b64)) => Ok(Part::File {
                    source: Source::Base64 {
                        media_type: media.to_string(),
                        data: b64.to_string(),
                    },
                    filename,
                    cache,
                }),
                None => Err(refuse(
                    "messages",
                    format!("a `file` part must carry a PDF as `file_data` (data:application/pdf;base64,…) to reach {UPSTREAM}"),
                )),
            }
        }
        other => Err(refuse(
            "messages",
            format!("a content part of type `{other}` cannot be sent to {UPSTREAM}"),
        )),
    }
}

fn parts(content: &Value) -> Result<Vec<Part>, TranslateError> {
    match content {
        Value::String(s) if s.is_empty() => Ok(vec![]),
        Value::String(s) => Ok(vec![text(s)]),
        Value::Array(ps) => ps.iter().map(part).collect(),
        Value::Null => Ok(vec![]),
        _ => Err(refuse(
            "messages",
            "message content must be a string or an array of parts",
        )),
    }
}

/// An assistant turn's content, refusal and tool calls.
fn assistant_parts(m: &Value) -> Result<Vec<Part>, TranslateError> {
    let refusal = |r: Option<&Value>| match r {
        Some(Value::String(t)) => Ok(Part::Refusal { text: t.clone() }),
        _ => Err(refuse("messages", "a `refusal` must be a string")),
    };
    let mut out = match m.get("content").unwrap_or(&Value::Null) {
        Value::Array(ps) => ps
            .iter()
            .map(|p| match p.get("type").and_then(Value::as_str) {
                Some("refusal") => refusal(p.get("refusal")),
                _ => part(p),
            })
            .collect::<Result<Vec<_>, _>>()?,
        other => parts(other)?,
    };
    match m.get("refusal") {
        None | Some(Value::Null) => {}
        r => out.push(refusal(r)?),
    }
    for tc in m
        .get("tool_calls")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        if tc.get("type").and_then(Value::as_str).unwrap_or("function") != "function" {
            return Err(refuse(
                "messages",
                format!("only function tool calls can be sent to {UPSTREAM}"),
            ));
        }
        let s = |p: &str| tc.pointer(p).and_then(Value::as_str).unwrap_or("");
        out.push(Part::ToolCall {
            id: s("/id").to_string(),
            name: s("/function/name").to_string(),
            arguments: tc
                .pointer("/function/arguments")
                .and_then(Value::as_str)
                .unwrap_or("{}")
                .to_string(),
        });
    }
    Ok(out)
}

/// A tool message as a `ToolResult`; the error mark becomes `is_error`.
fn tool_result(m: &Value) -> Result<Part, TranslateError> {
    let content = m.get("content").unwrap_or(&Value::Null);
    let mut parts = text_parts(content)?;
    let mut is_error = false;
    if let Some(Part::Text { text, .. }) = parts.first_mut() {
        if let Some(rest) = text.strip_prefix(TOOL_ERROR_MARK) {
            *text = rest.to_string();
            is_error = true;
        }
    }
    Ok(Part::ToolResult {
        call_id: string(m, "tool_call_id"),
        plain: content.is_string(),
        content: parts,
        is_error,
        cache: None,
    })
}

/// Message fields the internal form has no place for, refused when set.
fn check_message(m: &Value, allowed: &[&str]) -> Result<(), TranslateError> {
    for (k, v) in m.as_object().into_iter().flatten() {
        if !allowed.contains(&k.as_str()) && !v.is_null() {
            return Err(refuse(
                "messages",
                format!("a message's `{k}` cannot be sent to {UPSTREAM}"),
            ));
        }
    }
    Ok(())
}

fn messages(body: &Map<String, Value>, r: &mut Request) -> Result<(), TranslateError> {
    for m in body
        .get("messages")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let role = m.get("role").and_then(Value::as_str).unwrap_or("");
        let content = m.get("content").unwrap_or(&Value::Null);
        let name = m.get("name").and_then(Value::as_str).map(str::to_string);
        let (role, content) = match role {
            "system" | "developer" => {
                check_message(m, &["role", "content"])?;
                r.system.extend(text_parts(content)?);
                continue;
            }
            "user" => {
                check_message(m, &["role", "content", "name"])?;
                (Role::User, parts(content)?)
            }
            "assistant" => {
                check_message(m, &["role", "content", "tool_calls", "refusal", "name"])?;
                (Role::Assistant, assistant_parts(m)?)
            }
            "tool" => {
                check_message(m, &["role", "content", "tool_call_id"])?;
                (Role::Tool, vec![tool_result(m)?])
            }
            other => {
                return Err(refuse(
                    "messages",
                    format!("a message with role `{other}` cannot be sent to {UPSTREAM}"),
                ))
            }
        };
        r.messages.push(Message {
            role,
            plain: content.len() == 1 && m.get("content").is_some_and(Value::is_string),
            content,
            name,
        });
    }
    Ok(())
}

fn tools(body: &Map<String, Value>) -> Result<Vec<Tool>, TranslateError> {
    array_field(body, "tools")?
        .iter()
        .map(|t| {
            let f = t
                .get("function")
                .filter(|_| t.get("type").and_then(Value::as_str) == Some("function"));
            let Some(f) = f else {
                return Err(refuse(
                    "tools",
                    format!("only function tools can be sent to {UPSTREAM}"),
                ));
            };
            Ok(function_tool(f))
        })
        .collect()
}

fn tool_choice(body: &Map<String, Value>) -> Result<Option<ToolChoice>, TranslateError> {
    Ok(match body.get("tool_choice") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(match s.as_str() {
            "auto" => ToolChoice::Auto,
            "required" => ToolChoice::Required,
            "none" => ToolChoice::None,
            _ => return Err(refuse("tool_choice", format!("unknown tool_choice `{s}`"))),
        }),
        Some(o) if o.get("type").and_then(Value::as_str) == Some("function") => {
            let name = o.pointer("/function/name").and_then(Value::as_str);
            Some(ToolChoice::Named(name.unwrap_or("").to_string()))
        }
        Some(_) => {
            return Err(refuse(
                "tool_choice",
                format!("this tool_choice cannot be sent to {UPSTREAM}"),
            ))
        }
    })
}

/// `user` and its successor `safety_identifier`: one user id.
fn user_id(body: &Map<String, Value>) -> Result<Option<String>, TranslateError> {
    let get = |k| body.get(k).filter(|v: &&Value| !v.is_null());
    match (get("user"), get("safety_identifier")) {
        (Some(a), Some(b)) if a != b => Err(refuse(
            "safety_identifier",
            format!("`user` and `safety_identifier` differ; {UPSTREAM} takes one user id"),
        )),
        (Some(Value::String(u)), _) | (None, Some(Value::String(u))) => Ok(Some(u.clone())),
        (None, None) => Ok(None),
        _ => Err(refuse("user", "`user` must be a string")),
    }
}

fn response_format(body: &Map<String, Value>) -> Result<Option<ResponseFormat>, TranslateError> {
    let Some(f) = body.get("response_format").filter(|f| !f.is_null()) else {
        return Ok(None);
    };
    let bad = || refuse("response_format", "unknown `response_format`");
    Ok(Some(match f.get("type").and_then(Value::as_str) {
        Some("text") => ResponseFormat::Text,
        Some("json_object") => ResponseFormat::JsonObject,
        Some("json_schema") => {
            let s = f.get("json_schema").ok_or_else(bad)?;
            ResponseFormat::JsonSchema {
                name: string(s, "name"),
                schema: s.get("schema").cloned().unwrap_or(Value::Null),
                strict: s.get("strict").and_then(Value::as_bool),
                description: opt_string(s, "description"),
            }
        }
        _ => return Err(bad()),
    }))
}

fn stop(body: &Map<String, Value>) -> Result<Vec<String>, TranslateError> {
    match body.get("stop") {
        None | Some(Value::Null) => Ok(vec![]),
        Some(Value::String(s)) => Ok(vec![s.clone()]),
        Some(v) => string_array(v)
            .ok_or_else(|| refuse("stop", "`stop` must be a string or an array of strings")),
    }
}

/// An OpenAI chat request in the internal form.
pub fn read_request(body: &Map<String, Value>) -> Result<Request, TranslateError> {
    check_fields(body)?;
    let mut r = Request {
        model: body
            .get("model")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string(),
        ..Request::default()
    };
    messages(body, &mut r)?;
    r.tools = tools(body)?;
    r.tool_choice = tool_choice(body)?;
    r.parallel_tool_calls = match body.get("parallel_tool_calls") {
        None | Some(Value::Null) => None,
        Some(Value::Bool(b)) => Some(*b),
        Some(_) => {
            return Err(refuse(
                "parallel_tool_calls",
                "`parallel_tool_calls` must be a boolean",
            ))
        }
    };
    r.max_output_tokens = match integer(body.get("max_completion_tokens"), "max_completion_tokens")?
    {
        Some(n) => {
            r.names.push(("max_completion_tokens", "max_output_tokens"));
            Some(n)
        }
        None => integer(body.get("max_tokens"), "max_tokens")?,
    };
    r.temperature = number(body.get("temperature"), "temperature")?;
    r.top_p = number(body.get("top_p"), "top_p")?;
    r.seed = integer(body.get("seed"), "seed")?;
    r.frequency_penalty =
        number(body.get("frequency_penalty"), "frequency_penalty")?.filter(|p| *p != 0.0);
    r.presence_penalty =
        number(body.get("presence_penalty"), "presence_penalty")?.filter(|p| *p != 0.0);
    r.stop = stop(body)?;
    r.response_format = response_format(body)?;
    if let Some(e) = body.get("reasoning_effort").filter(|e| !e.is_null()) {
        let e = e
            .as_str()
            .ok_or_else(|| refuse("reasoning_effort", "`reasoning_effort` must be a string"))?;
        r.names.push(("reasoning_effort", "reasoning.effort"));
        r.reasoning = Some(Reasoning {
            effort: Some(e.to_string()),
            budget_tokens: None,
            summary: None,
        });
    }
    r.stream = body.get("stream").and_then(Value::as_bool).unwrap_or(false);
    r.include_usage = body
        .get("stream_options")
        .and_then(|o| o.get("include_usage"))
        .and_then(Value::as_bool)
        .unwrap_or(false);
    r.user = user_id(body)?;
    match body.get("metadata") {
        None | Some(Value::Null) => {}
        Some(Value::Object(m)) => r.metadata = m.clone(),
        Some(_) => return Err(refuse("metadata", "`metadata` must be an object")),
    }
    r.service_tier = match body.get("service_tier") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(s.clone()),
        Some(_) => return Err(refuse("service_tier", "`service_tier` must be a string")),
    };
    Ok(r)
}
