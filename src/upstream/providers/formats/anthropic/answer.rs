//! Whole answers, usage and error bodies in Anthropic's Messages format, to and from the
//! internal form. Ids, tool call ids and the upstream's `model` value are kept as they
//! came; `stop_reason` ↔ `Finish` as `openai_chat::answer` describes.

use serde_json::{json, Value};

use super::super::{opt_string, string, usage_readable};
use crate::upstream::providers::canonical::{
    Answer, ErrorInfo, Finish, Input, Part, Reported, Usage,
};
use crate::upstream::providers::translate::stream::Corrupt;
use crate::upstream::providers::{anthropic, tokens};

/// The internal form's finish for an Anthropic `stop_reason` and `stop_sequence`.
/// No `stop_reason` (null or absent) is written to a client as `end_turn` and
/// `model_context_window_exceeded` (a cut) as `max_tokens`, but neither is whole
/// (`Finish::Unvouched`; s28 stop attack F1).
pub fn read_finish(reason: Option<&str>, sequence: Option<&str>) -> Finish {
    let Some(reason) = reason else {
        return Finish::unvouched(Finish::Stop);
    };
    match reason {
        "end_turn" => Finish::Stop,
        "max_tokens" => Finish::Length,
        "model_context_window_exceeded" => Finish::unvouched(Finish::Length),
        "tool_use" => Finish::ToolCalls,
        "refusal" => Finish::Refusal,
        "stop_sequence" => Finish::StopSequence(sequence.map(str::to_string)),
        "pause_turn" => Finish::Pause,
        other => Finish::Other(other.to_string()),
    }
}

/// Anthropic's `stop_reason` and `stop_sequence` for a finish.
pub fn write_finish(f: &Finish) -> (&'static str, Value) {
    match f.shown() {
        Finish::Length => ("max_tokens", Value::Null),
        Finish::ToolCalls => ("tool_use", Value::Null),
        Finish::ContentFilter | Finish::Refusal => ("refusal", Value::Null),
        Finish::StopSequence(Some(s)) => ("stop_sequence", json!(s)),
        Finish::StopSequence(None) => ("stop_sequence", Value::Null),
        Finish::Pause => ("pause_turn", Value::Null),
        Finish::Stop | Finish::Other(_) | Finish::Unvouched(_) => ("end_turn", Value::Null),
    }
}

/// Usage from an Anthropic `usage` object. Anthropic counts cache reads and cache writes
/// apart from `input_tokens`; the internal form's input is all three. `None` (the output
/// is then counted) when it is not an object or a figure is there but not a number: no
/// count the gateway can charge, and not to be read as 0.
pub fn read_usage(u: &Value) -> Option<Usage> {
    const FIGURES: [&str; 7] = [
        "/input_tokens",
        "/output_tokens",
        "/cache_read_input_tokens",
        "/cache_creation_input_tokens",
        "/cache_creation/ephemeral_5m_input_tokens",
        "/cache_creation/ephemeral_1h_input_tokens",
        "/server_tool_use/web_search_requests",
    ];
    if !usage_readable(u, &FIGURES) {
        return None;
    }
    let n = |p: &str| tokens(u.pointer(p)).unwrap_or(0);
    Some(
        Usage {
            output: n("/output_tokens"),
            web_search_calls: n("/server_tool_use/web_search_requests"),
            ..Usage::default()
        }
        .with_input(input_of(&n)),
    )
}

/// A whole answer's usage (`read_usage` of its `usage`), each side where it reports it:
/// the input where `input_tokens` is a number, the output where `output_tokens` is (an
/// absent side is no zero). Its web searches, on the output side, are the upstream's count
/// (`server_tool_use.web_search_requests`, what it bills) where it gives one, else the
/// `server_tool_use` blocks it shows less those answered with an error result (a search
/// past `max_uses`, not billed).
pub fn answer_usage(answer: &Value) -> Option<Reported> {
    let u = answer.get("usage")?;
    let has = |k: &str| tokens(u.get(k)).is_some();
    let sides = |usage: Usage| Reported::sides(usage, has("input_tokens"), has("output_tokens"));
    let mut usage = read_usage(u)?;
    // A count only: `null` is no report (the blocks shown are charged).
    if answer
        .pointer("/usage/server_tool_use/web_search_requests")
        .is_some_and(Value::is_number)
    {
        return Some(sides(usage));
    }
    let blocks = answer.get("content").and_then(Value::as_array);
    let count = |is: &dyn Fn(&Value) -> bool| {
        let n = blocks.map_or(0, |b| b.iter().filter(|b| is(b)).count());
        i64::try_from(n).unwrap_or(i64::MAX)
    };
    fn text<'a>(b: &'a Value, k: &str) -> Option<&'a str> {
        b.get(k).and_then(Value::as_str)
    }
    let made = count(&|b| is_web_search_call(text(b, "type").unwrap_or(""), text(b, "name")));
    let failed = count(&|b| {
        let content = b.get("content").and_then(|c| text(c, "type"));
        is_search_error(text(b, "type").unwrap_or(""), content)
    });
    usage.web_search_calls = made.saturating_sub(failed).max(0);
    Some(sides(usage))
}

/// A content block that is a web search the model made (billed per call).
pub fn is_web_search_call(kind: &str, name: Option<&str>) -> bool {
    kind == "server_tool_use" && name == Some("web_search")
}

/// A content block that is a web search's error result (`content` an object of type
/// `web_search_tool_result_error`, e.g. `max_uses_exceeded`): that search is not billed.
pub fn is_search_error(kind: &str, content_type: Option<&str>) -> bool {
    kind == "web_search_tool_result" && content_type == Some("web_search_tool_result_error")
}

/// The input side of an Anthropic usage, each figure read by `n` (0 when absent): input
/// is `input_tokens` plus the cache reads and writes, which Anthropic counts apart. The
/// writes are split by lifetime where `cache_creation` gives it; writes it does not
/// split are five-minute ones (the default lifetime) noted as unsplit — the settlement
/// prices them at the one-hour rate when the request marked a one-hour write
/// (`Usage::at_worst_lifetime` in `quota::pricing`) — and a split that says more than
/// `cache_creation_input_tokens` counts.
pub fn input_of(n: &dyn Fn(&str) -> i64) -> Input {
    let cached = n("/cache_read_input_tokens");
    let hour = n("/cache_creation/ephemeral_1h_input_tokens");
    let five = n("/cache_creation/ephemeral_5m_input_tokens");
    let written = n("/cache_creation_input_tokens").max(five.saturating_add(hour));
    Input {
        input: n("/input_tokens")
            .saturating_add(cached)
            .saturating_add(written),
        cached_input: cached,
        cache_write_5m: written - hour,
        cache_write_1h: hour,
        cache_write_unsplit: written - hour - five,
        ..Input::default()
    }
}

/// Anthropic usage figures: input without the cache reads and writes, which are apart.
pub fn write_usage(u: &Usage) -> Value {
    let written = u.cache_write_5m.saturating_add(u.cache_write_1h);
    json!({"input_tokens": u.input.saturating_sub(u.cached_input).saturating_sub(written).max(0),
        "output_tokens": u.output, "cache_read_input_tokens": u.cached_input,
        "cache_creation_input_tokens": written})
}

/// An Anthropic answer in the internal form.
pub fn read_answer(v: &Value) -> Result<Answer, Corrupt> {
    let mut content = Vec::new();
    for b in v
        .get("content")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let s = |k: &str| string(b, k);
        match b.get("type").and_then(Value::as_str) {
            Some("text") => content.push(Part::Text {
                text: s("text"),
                cache: None,
            }),
            Some("tool_use") => content.push(Part::ToolCall {
                id: s("id"),
                name: s("name"),
                arguments: b
                    .get("input")
                    .map_or_else(|| "{}".to_string(), Value::to_string),
            }),
            Some("thinking") => content.push(Part::Reasoning {
                text: s("thinking"),
                signature: opt_string(b, "signature"),
                redacted: None,
            }),
            Some("redacted_thinking") => content.push(Part::Reasoning {
                text: String::new(),
                signature: None,
                redacted: Some(s("data")),
            }),
            _ => {}
        }
    }
    Ok(Answer {
        id: string(v, "id"),
        model: string(v, "model"),
        content,
        finish: read_finish(
            v.get("stop_reason").and_then(Value::as_str),
            v.get("stop_sequence").and_then(Value::as_str),
        ),
        usage: v.get("usage").and_then(read_usage),
        created: None,
    })
}

/// Tool call arguments as an Anthropic `input` object. Arguments that are not a JSON
/// object are kept as text under `_arguments` rather than lost.
pub fn tool_input(args: &str) -> Value {
    if args.trim().is_empty() {
        return json!({});
    }
    match serde_json::from_str::<Value>(args) {
        Ok(v @ Value::Object(_)) => v,
        _ => json!({"_arguments": args}),
    }
}

/// An answer as an Anthropic `message`. A refusal's text is text.
pub fn write_answer(a: &Answer) -> Value {
    let content: Vec<Value> = a
        .content
        .iter()
        .filter_map(|p| match p {
            Part::Text { text, .. } | Part::Refusal { text } if !text.is_empty() => {
                Some(json!({"type": "text", "text": text}))
            }
            Part::ToolCall {
                id,
                name,
                arguments,
            } => Some(
                json!({"type": "tool_use", "id": id, "name": name, "input": tool_input(arguments)}),
            ),
            Part::Reasoning {
                text,
                signature,
                redacted,
            } => Some(match redacted {
                Some(data) => json!({"type": "redacted_thinking", "data": data}),
                None => json!({"type": "thinking", "thinking": text, "signature": signature}),
            }),
            _ => None,
        })
        .collect();
    let (stop_reason, stop_sequence) = write_finish(&a.finish);
    json!({
        "id": a.id,
        "type": "message",
        "role": "assistant",
        "model": a.model,
        "content": content,
        "stop_reason": stop_reason,
        "stop_sequence": stop_sequence,
        "usage": write_usage(&a.usage.unwrap_or_default()),
    })
}

/// An upstream's error body: whatever its shape, read by `super::super::read_error`.
pub fn read_error(status: u16, body: &Value) -> ErrorInfo {
    super::super::read_error(status, body)
}

/// An error in Anthropic's shape, with the upstream's code in `error.code`.
pub fn write_error(e: &ErrorInfo) -> Value {
    json!({"type": "error", "error": {"type": anthropic::error_type(e.status),
        "message": e.message, "code": e.code.as_deref().unwrap_or("upstream_error")}})
}
