//! A request in the internal form written as an Anthropic Messages request (the upstream
//! side). Tool results go in user turns, turns of one role are merged so roles alternate,
//! PDFs become `document` blocks, cache marks `cache_control`. What Anthropic cannot
//! express is refused naming the client's field.

use serde_json::{json, Map, Value};

use super::super::{cache_control, refuse, refuse_field};
use crate::upstream::providers::canonical::{
    CacheMark, Message, Part, Request, ResponseFormat, Role, Source, ToolChoice,
};
use crate::upstream::providers::translate::TranslateError;

const UPSTREAM: &str = "an Anthropic model";

fn with_cache(mut block: Value, cache: &Option<CacheMark>) -> Value {
    if let Some(c) = cache {
        block["cache_control"] = cache_control(c);
    }
    block
}

fn source(s: &Source) -> Value {
    match s {
        Source::Url(u) => json!({"type": "url", "url": u}),
        Source::Base64 { media_type, data } => {
            json!({"type": "base64", "media_type": media_type, "data": data})
        }
        Source::FileId(id) => json!({"type": "file", "file_id": id}),
    }
}

/// One part as an Anthropic content block.
fn block(p: &Part) -> Result<Value, TranslateError> {
    Ok(match p {
        Part::Text { text, cache } => with_cache(json!({"type": "text", "text": text}), cache),
        // `detail` has no Anthropic counterpart: Anthropic picks the resolution itself.
        Part::Image {
            source: s, cache, ..
        } => with_cache(json!({"type": "image", "source": source(s)}), cache),
        Part::File {
            source: s,
            filename,
            cache,
        } => {
            let doc = match s {
                Source::FileId(_) => {
                    return Err(refuse(
                        "messages",
                        "a `file` part with a `file_id` (an OpenAI upload) cannot be sent to an Anthropic model; send `file_data`",
                    ))
                }
                Source::Base64 { media_type, .. } if media_type != "application/pdf" => {
                    return Err(refuse(
                        "messages",
                        "a `file` part must carry a PDF as `file_data` (data:application/pdf;base64,…) to reach an Anthropic model",
                    ))
                }
                s => {
                    let mut d = json!({"type": "document", "source": source(s)});
                    if let Some(name) = filename {
                        d["title"] = json!(name);
                    }
                    d
                }
            };
            with_cache(doc, cache)
        }
        Part::Reasoning {
            text,
            signature,
            redacted,
        } => match (redacted, signature) {
            (Some(data), _) => json!({"type": "redacted_thinking", "data": data}),
            (None, Some(sig)) => json!({"type": "thinking", "thinking": text, "signature": sig}),
            (None, None) => {
                return Err(refuse(
                    "messages",
                    "reasoning without a signature cannot be sent back to an Anthropic model",
                ))
            }
        },
        Part::ToolCall {
            id,
            name,
            arguments,
        } => {
            let input: Value = serde_json::from_str(if arguments.trim().is_empty() {
                "{}"
            } else {
                arguments
            })
            .ok()
            .filter(Value::is_object)
            .ok_or_else(|| refuse("messages", "tool call arguments must be a JSON object"))?;
            json!({"type": "tool_use", "id": id, "name": name, "input": input})
        }
        Part::ToolResult {
            call_id,
            content,
            is_error,
            cache,
            plain,
        } => {
            let blocks = content.iter().map(block).collect::<Result<Vec<_>, _>>()?;
            let content = match (plain, content.as_slice()) {
                (true, [Part::Text { text, cache: None }]) => json!(text),
                _ => Value::Array(blocks),
            };
            let mut b = json!({"type": "tool_result", "tool_use_id": call_id, "content": content});
            if *is_error {
                b["is_error"] = json!(true);
            }
            with_cache(b, cache)
        }
        // A refusal the model gave is its text to an Anthropic model (as an Anthropic
        // refusal's text is OpenAI's `content`).
        Part::Refusal { text } => json!({"type": "text", "text": text}),
    })
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

fn messages(messages: &[Message]) -> Result<Vec<Value>, TranslateError> {
    let mut out = Vec::new();
    for m in messages {
        if m.name.is_some() {
            return Err(refuse(
                "messages",
                "a message's `name` cannot be sent to an Anthropic model",
            ));
        }
        let role = match m.role {
            Role::Assistant => "assistant",
            // A system turn reaches here marked as a user's (`dispatch::fit`).
            Role::User | Role::Tool | Role::System => "user",
        };
        let blocks = m.content.iter().map(block).collect::<Result<Vec<_>, _>>()?;
        push_turn(&mut out, role, blocks);
    }
    Ok(out)
}

fn tools(r: &Request) -> Result<Vec<Value>, TranslateError> {
    r.tools
        .iter()
        .map(|t| {
            if t.strict == Some(true) {
                return Err(refuse(
                    "tools",
                    "`strict` function schemas cannot be sent to an Anthropic model",
                ));
            }
            let schema = if t.parameters.is_null() {
                json!({"type": "object", "properties": {}})
            } else {
                t.parameters.clone()
            };
            let mut tool = json!({"name": t.name, "input_schema": schema});
            if let Some(d) = &t.description {
                tool["description"] = json!(d);
            }
            Ok(with_cache(tool, &t.cache))
        })
        .collect()
}

/// `tool_choice`, with `parallel_tool_calls: false` as `disable_parallel_tool_use`.
fn tool_choice(r: &Request, has_tools: bool) -> Option<Value> {
    let mut choice = r.tool_choice.as_ref().map(|c| match c {
        ToolChoice::Auto => json!({"type": "auto"}),
        ToolChoice::Required => json!({"type": "any"}),
        ToolChoice::None => json!({"type": "none"}),
        ToolChoice::Named(n) => json!({"type": "tool", "name": n}),
    });
    if r.parallel_tool_calls == Some(false) && has_tools {
        let c = choice.get_or_insert_with(|| json!({"type": "auto"}));
        if c["type"] != "none" {
            c["disable_parallel_tool_use"] = json!(true);
        }
    }
    choice
}

/// Fields of the internal form Anthropic has no counterpart for, refused when set.
fn check_unexpressible(r: &Request) -> Result<(), TranslateError> {
    if r.seed.is_some() {
        return Err(refuse_field(r.client_name("seed", "seed"), UPSTREAM));
    }
    if r.frequency_penalty.is_some() {
        return Err(refuse_field("frequency_penalty", UPSTREAM));
    }
    if r.presence_penalty.is_some() {
        return Err(refuse_field("presence_penalty", UPSTREAM));
    }
    if !r.metadata.is_empty() {
        return Err(refuse_field("metadata", UPSTREAM));
    }
    if !matches!(r.response_format, None | Some(ResponseFormat::Text)) {
        return Err(refuse_field(
            r.client_name("response_format", "response_format"),
            UPSTREAM,
        ));
    }
    if let Some(reasoning) = &r.reasoning {
        if reasoning.effort.is_some() || reasoning.summary.is_some() {
            return Err(refuse_field(
                r.client_name("reasoning.effort", "reasoning"),
                UPSTREAM,
            ));
        }
    }
    Ok(())
}

/// An Anthropic Messages body; `cap` is the output cap (`max_tokens`, required).
pub fn write_request(
    r: &Request,
    upstream_model: &str,
    cap: Option<(&'static str, i64)>,
    stream: bool,
) -> Result<Map<String, Value>, TranslateError> {
    check_unexpressible(r)?;
    let mut out = Map::new();
    out.insert("model".into(), json!(upstream_model));
    let cap = cap.map(|(_, c)| c).or(r.max_output_tokens).unwrap_or(0);
    out.insert("max_tokens".into(), json!(cap));
    out.insert("messages".into(), Value::Array(messages(&r.messages)?));
    let system = r.system.iter().map(block).collect::<Result<Vec<_>, _>>()?;
    match (system.as_slice(), r.system.as_slice()) {
        ([], _) => {}
        ([one], [Part::Text { cache: None, .. }]) => {
            out.insert("system".into(), one["text"].clone());
        }
        _ => {
            out.insert("system".into(), Value::Array(system));
        }
    }
    if let Some(t) = r.temperature {
        if t > 1.0 {
            return Err(refuse(
                "temperature",
                "Anthropic models accept a temperature between 0 and 1",
            ));
        }
        out.insert("temperature".into(), json!(t));
    }
    if let Some(p) = r.top_p {
        out.insert("top_p".into(), json!(p));
    }
    if let Some(k) = r.top_k {
        out.insert("top_k".into(), json!(k));
    }
    if !r.stop.is_empty() {
        out.insert("stop_sequences".into(), json!(r.stop));
    }
    let tools = tools(r)?;
    let has_tools = !tools.is_empty();
    if has_tools {
        out.insert("tools".into(), Value::Array(tools));
    }
    if let Some(c) = tool_choice(r, has_tools) {
        out.insert("tool_choice".into(), c);
    }
    if let Some(budget) = r.reasoning.as_ref().and_then(|x| x.budget_tokens) {
        out.insert(
            "thinking".into(),
            json!({"type": "enabled", "budget_tokens": budget}),
        );
    }
    if let Some(u) = &r.user {
        out.insert("metadata".into(), json!({"user_id": u}));
    }
    match r.service_tier.as_deref() {
        None => {}
        Some("auto") => {
            out.insert("service_tier".into(), json!("auto"));
        }
        Some("default") => {
            out.insert("service_tier".into(), json!("standard_only"));
        }
        Some(_) => return Err(refuse_field("service_tier", UPSTREAM)),
    }
    if stream {
        out.insert("stream".into(), json!(true));
    }
    Ok(out)
}
