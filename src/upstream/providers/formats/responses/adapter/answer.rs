//! An answer written as a Responses object, the usage both ways, and an error in OpenAI's
//! shape.

use serde_json::{json, Map, Value};

use crate::upstream::providers::canonical::{Answer, ErrorInfo, Finish, Part, Usage};
use crate::upstream::providers::formats::responses::{echo, usage_of};

/// A Responses `usage` object in the internal form (`input_tokens` includes the cached
/// ones, `output_tokens` the reasoning ones); `None` when it is not in that shape.
pub fn read_usage(u: &Value) -> Option<Usage> {
    let p = usage_of(u)?;
    let n = |k: &str| crate::upstream::providers::tokens(u.pointer(k)).unwrap_or(0);
    Some(Usage {
        input: p.input,
        output: p.output,
        cached_input: p.cached_input,
        reasoning: n("/output_tokens_details/reasoning_tokens"),
        ..Usage::default()
    })
}

/// Responses `usage` from the internal form's figures.
pub fn usage_json(u: &Usage) -> Value {
    json!({
        "input_tokens": u.input,
        "input_tokens_details": {"cached_tokens": u.cached_input},
        "output_tokens": u.output,
        "output_tokens_details": {"reasoning_tokens": u.reasoning},
        "total_tokens": u.input + u.output,
    })
}

/// A response object around `output` (the request's echo fields, the status from the
/// answer's finish).
pub(super) fn response_object(
    body: &Map<String, Value>,
    model: &str,
    created: i64,
    output: Vec<Value>,
    finish: Option<&Finish>,
    usage: Value,
) -> Value {
    let (status, incomplete) = match finish.map(Finish::shown) {
        Some(Finish::Length) => ("incomplete", json!({"reason": "max_output_tokens"})),
        Some(Finish::ContentFilter) => ("incomplete", json!({"reason": "content_filter"})),
        _ => ("completed", Value::Null),
    };
    let mut o = echo(body);
    o.insert("id".into(), json!(""));
    o.insert("object".into(), json!("response"));
    o.insert("created_at".into(), json!(created));
    o.insert("status".into(), json!(status));
    o.insert("error".into(), Value::Null);
    o.insert("incomplete_details".into(), incomplete);
    o.insert("model".into(), json!(model));
    o.insert("output".into(), Value::Array(output));
    o.insert("usage".into(), usage);
    Value::Object(o)
}

pub(super) fn reasoning_item(id: String, text: &str, signature: Option<&str>) -> Value {
    let mut item = json!({"type": "reasoning", "id": id,
        "summary": [], "content": [{"type": "reasoning_text", "text": text}]});
    if let Some(sig) = signature {
        item["encrypted_content"] = json!(sig);
    }
    item
}

/// An answer as a response object for the request `body` (its echo fields); item ids
/// are made of `item_ids` (the gateway's response id without `resp_`) and the item's
/// output index, as the stream's are. The caller stamps the gateway's id (`Stamp::apply`).
///
/// The items keep the parts' order, as the stream does: a reasoning part or a call closes
/// the message, and text after it is a message of its own (s29 responses attack F3: all
/// reasoning came first and all text as one message, so a Gemini call's signature went
/// back before the text, not on the call).
pub fn write_answer(a: &Answer, body: &Map<String, Value>, item_ids: &str) -> Value {
    let mut output = Vec::new();
    let mut message = Message::default();
    for p in &a.content {
        match p {
            Part::Text { text: t, .. } => message.text.push_str(t),
            Part::Refusal { text: t } => message.refusal.push_str(t),
            Part::Reasoning {
                text,
                signature,
                redacted,
            } => {
                message.close(&mut output, item_ids);
                let id = format!("rs_{item_ids}_{}", output.len());
                output.push(reasoning_item(
                    id,
                    text,
                    signature.as_deref().or(redacted.as_deref()),
                ));
            }
            Part::ToolCall {
                id,
                name,
                arguments,
            } => {
                message.close(&mut output, item_ids);
                output.push(
                    json!({"type": "function_call", "id": format!("fc_{item_ids}_{}", output.len()),
                    "call_id": id, "name": name, "arguments": arguments, "status": "completed"}),
                );
            }
            _ => {}
        }
    }
    message.close(&mut output, item_ids);
    let usage = a.usage.as_ref().map_or(Value::Null, usage_json);
    response_object(
        body,
        &a.model,
        a.created.unwrap_or_else(|| chrono::Utc::now().timestamp()),
        output,
        Some(&a.finish),
        usage,
    )
}

/// The text and refusal of the message item being gathered.
#[derive(Default)]
struct Message {
    text: String,
    refusal: String,
}

impl Message {
    /// Appends the message item, if it has anything, and starts the next one empty.
    fn close(&mut self, output: &mut Vec<Value>, item_ids: &str) {
        let Message { text, refusal } = std::mem::take(self);
        let mut parts = Vec::new();
        if !text.is_empty() {
            parts.push(json!({"type": "output_text", "text": text, "annotations": []}));
        }
        if !refusal.is_empty() {
            parts.push(json!({"type": "refusal", "refusal": refusal}));
        }
        if !parts.is_empty() {
            output.push(
                json!({"type": "message", "id": format!("msg_{item_ids}_{}", output.len()),
                "status": "completed", "role": "assistant", "content": parts}),
            );
        }
    }
}

/// An error in OpenAI's shape (what the Responses API answers).
pub fn write_error(e: &ErrorInfo) -> Value {
    crate::upstream::providers::formats::openai_chat::write_error(e)
}
