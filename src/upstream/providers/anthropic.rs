//! The Anthropic Messages wire format: shaping a request that stays in this format, and
//! reading usage from answers and stream events.

use reqwest::header::HeaderValue;
use serde_json::{Map, Value};

use crate::quota::pricing::Usage;

/// An Anthropic body for an Anthropic upstream: the client's fields, the upstream's model
/// name and the reserved output cap.
pub fn shape_request(
    body: &Map<String, Value>,
    upstream_model: &str,
    cap: Option<(&'static str, i64)>,
) -> Map<String, Value> {
    let mut out = body.clone();
    out.insert("model".into(), Value::String(upstream_model.to_string()));
    if let Some((_, cap)) = cap {
        out.insert("max_tokens".into(), Value::from(cap));
    }
    out
}

/// The client's `anthropic-beta` header, to forward to Anthropic upstreams (whatever format
/// the client speaks: an OpenAI SDK may set it to reach a beta model feature). It only
/// unlocks features; every body field it unlocks is translated or refused on its own, so
/// an OpenAI-format upstream is sent nothing for it.
pub fn beta_header(headers: &actix_web::http::header::HeaderMap) -> Option<HeaderValue> {
    let v = headers.get("anthropic-beta")?;
    HeaderValue::from_bytes(v.as_bytes()).ok()
}

/// Usage from an Anthropic `usage` object. Anthropic counts cache reads and cache writes
/// apart from `input_tokens`; Sluice's input is all three, cache reads priced as cached.
/// `None` (the output is then counted) when it is not an object or a figure is there but
/// not a number: no count the gateway can charge, and not to be read as 0.
pub fn usage_of(u: &Value) -> Option<Usage> {
    const FIGURES: [&str; 4] = [
        "input_tokens",
        "output_tokens",
        "cache_read_input_tokens",
        "cache_creation_input_tokens",
    ];
    if !u.is_object()
        || FIGURES
            .iter()
            .any(|k| u.get(*k).is_some_and(|v| !v.is_null() && !v.is_number()))
    {
        return None;
    }
    let n = |k: &str| super::tokens(u.get(k)).unwrap_or(0);
    let cached = n("cache_read_input_tokens");
    Some(Usage {
        input: n("input_tokens")
            .saturating_add(cached)
            .saturating_add(n("cache_creation_input_tokens")),
        cached_input: cached,
        output: n("output_tokens"),
    })
}

/// The generated text of a Messages answer (for counting when usage is missing).
pub fn answer_text(v: &Value) -> String {
    let mut text = String::new();
    for b in v
        .get("content")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        match b.get("type").and_then(Value::as_str) {
            Some("text") => text.push_str(b.get("text").and_then(Value::as_str).unwrap_or("")),
            Some("tool_use") => {
                text.push_str(&b.get("input").map(Value::to_string).unwrap_or_default())
            }
            _ => {}
        }
    }
    text
}

/// Anthropic's error type for an HTTP status.
pub fn error_type(status: u16) -> &'static str {
    match status {
        400 | 422 => "invalid_request_error",
        401 => "authentication_error",
        403 => "permission_error",
        404 => "not_found_error",
        413 => "request_too_large",
        429 => "rate_limit_error",
        529 | 503 => "overloaded_error",
        _ => "api_error",
    }
}
