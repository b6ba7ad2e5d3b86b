//! Where a provider reads a part as an image or a document: at a content-block position
//! only — a message's `content[]` (chat, Messages, Responses message items), a Responses
//! function or custom tool output's `output[]`, and an Anthropic `tool_result`'s
//! `content[]`. A part-shaped
//! object anywhere else (a `tool_use` input, a tool's schema, `system`, which Anthropic
//! allows text blocks only in) is JSON the provider reads as text, so the estimate counts
//! it as text and neither `images` nor `documents` sizes it: sizing it by its shape would
//! leave its payload out of every count.

use serde_json::{Map, Value};

/// Calls `f` on every part at a content-block position of a request body, nested ones
/// (a tool result's) after their holder.
pub fn each<'a>(body: &'a Map<String, Value>, f: &mut impl FnMut(&'a Map<String, Value>)) {
    for key in ["messages", "input"] {
        if let Some(Value::Array(items)) = body.get(key) {
            for item in items.iter().filter_map(Value::as_object) {
                item.iter()
                    .filter(|(k, _)| holds_parts(item, k))
                    .for_each(|(_, v)| list(v, f));
            }
        }
    }
}

fn list<'a>(v: &'a Value, f: &mut impl FnMut(&'a Map<String, Value>)) {
    let Value::Array(parts) = v else { return };
    for part in parts.iter().filter_map(Value::as_object) {
        f(part);
        part.iter()
            .filter(|(k, _)| nests_parts(part, k))
            .for_each(|(_, v)| list(v, f));
    }
}

/// Whether `key` of a message or Responses input item holds parts: a message's `content`
/// (an item without a type, or of type `message`), and the `output` of a function or
/// custom tool's output. Other items' fields are text to the provider: a reasoning item's
/// `content` goes back as thought text, a shell call's `output` is its stdout and stderr.
pub fn holds_parts(item: &Map<String, Value>, key: &str) -> bool {
    let kind = item.get("type").and_then(Value::as_str);
    match key {
        "content" => matches!(kind, None | Some("message")),
        "output" => matches!(
            kind,
            Some("function_call_output" | "custom_tool_call_output")
        ),
        _ => false,
    }
}

/// Whether `key` of a part holds parts in turn: an Anthropic tool result's `content`.
pub fn nests_parts(part: &Map<String, Value>, key: &str) -> bool {
    key == "content" && part.get("type").and_then(Value::as_str) == Some("tool_result")
}

/// Whether a part at a content-block position is an image: OpenAI `image_url` /
/// `input_image`, Anthropic `image`.
pub fn is_image(part: &Map<String, Value>) -> bool {
    matches!(
        part.get("type").and_then(Value::as_str),
        Some("image_url" | "image" | "input_image")
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn kinds(body: Value) -> Vec<String> {
        let mut out = Vec::new();
        each(body.as_object().unwrap(), &mut |p| {
            out.push(p["type"].as_str().unwrap_or("?").to_string())
        });
        out
    }

    /// Only a message's `content` and a function or custom tool's output hold parts: a
    /// reasoning item's `content` (the model's text, sent back as thought text) and a
    /// shell call's `output` are text, however their elements are shaped.
    #[test]
    fn a_reasoning_items_content_and_a_shell_output_are_text() {
        let image = json!({"type": "input_image", "image_url": "https://x/y.png", "text": "…"});
        let file = json!({"type": "input_file", "file_data": "x"});
        let body = json!({"input": [
            {"type": "reasoning", "summary": [], "content": [image]},
            {"type": "shell_call_output", "call_id": "c", "output": [file]},
            {"type": "local_shell_call_output", "call_id": "c", "output": [file]},
            {"type": "custom_tool_call_output", "call_id": "c", "output": [file]},
            {"type": "message", "role": "user", "content": [image]},
        ]});
        assert_eq!(kinds(body), ["input_file", "input_image"]);
    }

    #[test]
    fn only_content_block_positions_hold_parts() {
        let shaped = json!({"type": "input_file", "file_data": "x"});
        let body = json!({
            "system": [{"type": "image", "source": {}}],
            "tools": [{"input_schema": {"default": shaped}}],
            "metadata": {"x": shaped},
            "messages": [
                {"role": "assistant", "content": [{"type": "tool_use", "input": shaped}]},
                {"role": "user", "extra": [shaped], "content": [
                    {"type": "tool_result", "content": [{"type": "document"}, {"type": "x", "content": [shaped]}]},
                    {"type": "text", "text": "t", "content": [shaped]}]}]});
        assert_eq!(
            kinds(body),
            ["tool_use", "tool_result", "document", "x", "text"]
        );
        let body = json!({"input": [
            {"role": "user", "content": [{"type": "input_image"}]},
            {"type": "function_call", "arguments": "{}", "output": [shaped]},
            {"type": "function_call_output", "output": [{"type": "input_file"}]},
            shaped]});
        assert_eq!(kinds(body), ["input_image", "input_file"]);
    }
}
