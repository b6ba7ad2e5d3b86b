//! Where a provider reads a part as an image or a document: at a content-block position
//! only — a message's `content[]` (chat, Messages, Responses message items), a Responses
//! function or custom tool output's `output[]`, and inside a part: an Anthropic
//! `tool_result`'s `content[]`, a content document's `source.content[]`, the document a
//! `web_fetch_tool_result` echoes back (`nested`). A part-shaped
//! object anywhere else (a `tool_use` input, a tool's schema, `system`, which Anthropic
//! allows text blocks only in) is JSON the provider reads as text, so the estimate counts
//! it as text and neither `images` nor `documents` sizes it: sizing it by its shape would
//! leave its payload out of every count.

use serde_json::{Map, Value};

/// Calls `f` on every part at a content-block position of a request body, nested ones
/// (`nested`) after their holder.
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
    parts
        .iter()
        .filter_map(Value::as_object)
        .for_each(|p| visit(p, f));
}

fn visit<'a>(part: &'a Map<String, Value>, f: &mut impl FnMut(&'a Map<String, Value>)) {
    f(part);
    for inner in nested(part) {
        visit(inner, f);
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

/// Where a part holds parts of its own, as the keys that lead to them: an Anthropic tool
/// result's `content[]`; a content document's `source.content[]` (text and image blocks
/// the provider reads as such); the fetched document a `web_fetch_tool_result` echoes back
/// (`content.content`), which the provider reads again as a document.
fn nest_path(part: &Map<String, Value>) -> Option<&'static [&'static str]> {
    fn kind(o: &Map<String, Value>) -> Option<&str> {
        o.get("type").and_then(Value::as_str)
    }
    match kind(part)? {
        "tool_result" => Some(&["content"]),
        "document"
            if part.get("source").and_then(Value::as_object).and_then(kind) == Some("content") =>
        {
            Some(&["source", "content"])
        }
        "web_fetch_tool_result" => Some(&["content", "content"]),
        _ => None,
    }
}

/// The value at `path` under `o`, through objects.
fn at<'a>(o: &'a Map<String, Value>, path: &[&str]) -> Option<&'a Value> {
    let (last, inner) = path.split_last()?;
    let mut holder = o;
    for key in inner {
        holder = holder.get(*key)?.as_object()?;
    }
    holder.get(*last)
}

/// The parts `part` holds (`nest_path`): the objects of an array there, or the one object.
pub fn nested(part: &Map<String, Value>) -> Vec<&Map<String, Value>> {
    match nest_path(part).and_then(|path| at(part, path)) {
        Some(Value::Array(items)) => items.iter().filter_map(Value::as_object).collect(),
        Some(Value::Object(one)) => vec![one],
        _ => Vec::new(),
    }
}

/// `part` without the parts it holds — what around them is text — or `None` when it holds
/// none (a tool result whose `content` is a string is text whole).
pub fn without_nested(part: &Map<String, Value>) -> Option<Map<String, Value>> {
    let path = nest_path(part)?;
    if !matches!(at(part, path)?, Value::Array(_) | Value::Object(_)) {
        return None;
    }
    fn drop_at(o: &Map<String, Value>, path: &[&str]) -> Map<String, Value> {
        o.iter()
            .filter_map(|(k, v)| match path {
                [last] if k == last => None,
                [first, rest @ ..] if k == first => Some((
                    k.clone(),
                    match v {
                        Value::Object(inner) => Value::Object(drop_at(inner, rest)),
                        other => other.clone(),
                    },
                )),
                _ => Some((k.clone(), v.clone())),
            })
            .collect()
    }
    Some(drop_at(part, path))
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

    /// A content document's blocks (`source.content`) and the document a
    /// `web_fetch_tool_result` echoes back are read by the provider as parts.
    #[test]
    fn a_content_documents_blocks_and_a_fetched_document_are_parts() {
        let body = json!({"messages": [
            {"role": "user", "content": [{"type": "document", "source": {"type": "content", "content": [
                {"type": "text", "text": "t"},
                {"type": "image", "source": {"type": "url", "url": "https://x/y.png"}}]}}]},
            {"role": "assistant", "content": [{"type": "web_fetch_tool_result", "tool_use_id": "s",
                "content": {"type": "web_fetch_result", "url": "https://x/a.pdf", "content": {
                    "type": "document", "source": {"type": "url", "url": "https://x/a.pdf"}}}}]},
            {"role": "user", "content": [{"type": "document",
                "source": {"type": "text", "content": [{"type": "image"}]}}]}]});
        assert_eq!(
            kinds(body),
            [
                "document",
                "text",
                "image",
                "web_fetch_tool_result",
                "document",
                "document"
            ]
        );
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
