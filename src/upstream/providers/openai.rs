//! The OpenAI wire format (also vLLM, Ollama, llama.cpp): shaping a request that stays in
//! this format, and reading usage from answers and stream chunks.

use serde_json::{Map, Value};

use crate::quota::pricing::Usage;

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

/// Usage from an OpenAI `usage` object; `None` (the output is then counted) when it is not
/// an object or a figure is there but not a number — a `"completion_tokens": "40"` is no
/// count the gateway can charge, and must not be read as 0.
pub fn usage_of(u: &Value) -> Option<Usage> {
    const FIGURES: [&str; 3] = [
        "/prompt_tokens",
        "/completion_tokens",
        "/prompt_tokens_details/cached_tokens",
    ];
    if !u.is_object()
        || FIGURES
            .iter()
            .any(|p| u.pointer(p).is_some_and(|v| !v.is_null() && !v.is_number()))
    {
        return None;
    }
    let n = |p: &str| super::tokens(u.pointer(p)).unwrap_or(0);
    Some(Usage {
        input: n("/prompt_tokens"),
        cached_input: n("/prompt_tokens_details/cached_tokens"),
        output: n("/completion_tokens"),
    })
}

/// The generated text of a chat or completions answer (for counting when usage is missing).
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
        }
        for p in ["/message/tool_calls", "/delta/tool_calls"] {
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
        let u = usage_of(&json!({"prompt_tokens": 3, "completion_tokens": 5, "prompt_tokens_details": {"cached_tokens": 2}})).unwrap();
        assert_eq!((u.input, u.cached_input, u.output), (3, 2, 5));
        assert!(usage_of(&json!({"prompt_tokens": 3, "completion_tokens": "5"})).is_none());
        let t = answer_text(&json!({"choices": [{"delta": {"content": "Hel"}}]}));
        assert_eq!(t, "Hel");
    }
}
