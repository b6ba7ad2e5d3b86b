//! The OpenAI wire format (also vLLM, Ollama, llama.cpp) where no translation is needed:
//! shaping a request that stays in this format (the same-format path), and the text of an
//! answer, to count when it reports no usage. Translation is `formats::openai_chat`.

use serde_json::{Map, Value};

/// Top-level body fields some SDKs and proxies use to pick an upstream or a key. Sluice
/// routes only by its config, so they are dropped rather than forwarded.
pub const ROUTING_FIELDS: &[&str] = &[
    "api_base",
    "base_url",
    "api_key",
    "api_version",
    "extra_headers",
    "user_config",
    "organization",
];

/// An OpenAI body for an OpenAI upstream: the client's fields, the upstream's model name,
/// the reserved output cap, and (for streams) a request for the usage chunk.
pub fn shape_request(
    body: &Map<String, Value>,
    upstream_model: &str,
    cap: Option<(&'static str, i64)>,
    stream: bool,
) -> Map<String, Value> {
    let mut out = body.clone();
    out.insert("model".into(), Value::String(upstream_model.to_string()));
    if let Some((field, cap)) = cap {
        out.remove("max_tokens");
        out.remove("max_completion_tokens");
        out.insert(field.into(), Value::from(cap));
    }
    if stream {
        ask_for_usage(&mut out);
    }
    out
}

/// Streams always ask the upstream for the usage chunk (removed again if the client did
/// not ask for it).
pub fn ask_for_usage(out: &mut Map<String, Value>) {
    let opts = out
        .entry("stream_options")
        .or_insert_with(|| Value::Object(Map::new()));
    if let Value::Object(o) = opts {
        o.insert("include_usage".into(), Value::Bool(true));
    }
}

/// A message's or delta's `content`: a string, or (as Mistral's OpenAI-compatible API
/// sends it) an array of parts whose `text` parts are the answer. Other parts (a
/// model's `thinking`) are reasoning, which an OpenAI client does not see either.
pub fn content_text(content: Option<&Value>) -> Option<String> {
    match content? {
        Value::String(s) => Some(s.clone()),
        Value::Array(parts) => Some(
            parts
                .iter()
                .filter(|p| p.get("type").and_then(Value::as_str) == Some("text"))
                .filter_map(|p| p.get("text").and_then(Value::as_str))
                .collect(),
        ),
        _ => None,
    }
}

/// The text of a `content`'s `thinking` parts (Mistral's): output the upstream bills, as
/// the stream counts it (`shape::Content::thinking`).
fn thinking_text(content: Option<&Value>) -> String {
    content
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter(|p| p.get("type").and_then(Value::as_str) == Some("thinking"))
        .filter_map(|p| p.get("thinking").and_then(Value::as_array))
        .flatten()
        .filter(|p| p.get("type").and_then(Value::as_str) == Some("text"))
        .filter_map(|p| p.get("text").and_then(Value::as_str))
        .collect()
}

/// The generated output of a chat or completions answer (for counting when usage is
/// missing): every piece the stream counts of its deltas.
pub fn answer_text(v: &Value) -> String {
    let mut text = String::new();
    for c in v
        .get("choices")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        for p in ["/message/content", "/text", "/delta/content"] {
            if let Some(t) = content_text(c.pointer(p)) {
                text.push_str(&t);
            }
            text.push_str(&thinking_text(c.pointer(p)));
        }
        // Output outside `content`, billed alike: an audio answer's transcript, a refusal.
        for p in [
            "/message/audio/transcript",
            "/delta/audio/transcript",
            "/message/refusal",
            "/delta/refusal",
        ] {
            if let Some(t) = c.pointer(p).and_then(Value::as_str) {
                text.push_str(t);
            }
        }
        // The reasoning OpenAI-compatible servers show: DeepSeek's and vLLM's
        // `reasoning_content`, OpenRouter's `reasoning` — the longer, once, as some vLLM
        // versions send both with the same text (s27 diff attack F4) and an empty one may
        // stand beside the other (late attack L4).
        for side in ["/message", "/delta"] {
            let reasoning = ["reasoning_content", "reasoning"]
                .iter()
                .filter_map(|k| c.pointer(side)?.get(*k)?.as_str())
                .max_by_key(|t| t.len());
            if let Some(t) = reasoning {
                text.push_str(t);
            }
        }
        // The legacy `functions` API's call, counted as a tool call is.
        for p in [
            "/message/tool_calls",
            "/delta/tool_calls",
            "/message/function_call",
            "/delta/function_call",
        ] {
            if let Some(tc) = c.pointer(p).filter(|t| !t.is_null()) {
                text.push_str(&tc.to_string());
            }
        }
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn shapes_and_reads() {
        let body = json!({"model": "alias", "messages": [], "max_tokens": 10});
        let Value::Object(m) = body else {
            unreachable!()
        };
        let out = shape_request(&m, "gpt-x", Some(("max_tokens", 10)), true);
        assert_eq!(out["model"], "gpt-x");
        assert_eq!(out["stream_options"]["include_usage"], true);
        let t = answer_text(&json!({"choices": [{"delta": {"content": "Hel"}}]}));
        assert_eq!(t, "Hel");
    }

    /// An audio answer's transcript and a legacy `functions` call are output a whole
    /// answer without usage is charged for.
    #[test]
    fn answer_text_reads_transcripts_and_function_calls() {
        let t = answer_text(&json!({"choices": [
            {"message": {"content": null, "audio": {"id": "a", "data": "AAAA", "transcript": "Hello there."}}},
            {"message": {"content": null, "function_call": {"name": "lookup", "arguments": "{\"q\": 1}"}}}]}));
        assert!(
            t.contains("Hello there.") && t.contains("lookup") && t.contains("q"),
            "{t}"
        );
    }
}
