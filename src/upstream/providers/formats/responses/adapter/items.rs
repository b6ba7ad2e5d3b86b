//! A Responses request's input items and their content parts in the internal form.

use serde_json::Value;

use super::read::{push_to, text};
use crate::upstream::providers::canonical::{Message, Part, Request, Role, Source};
use crate::upstream::providers::formats::{data_url, refuse};
use crate::upstream::providers::translate::TranslateError;

/// One input item into the internal form.
pub(super) fn read_item(i: usize, item: &Value, r: &mut Request) -> Result<(), TranslateError> {
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
