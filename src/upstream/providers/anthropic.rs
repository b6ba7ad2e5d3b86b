//! The Anthropic Messages wire format where no translation is needed: shaping a request
//! that stays in this format (the same-format path), the `anthropic-beta` header, the
//! text of an answer to count, and the error type of a status. Translation is
//! `formats::anthropic`.

use reqwest::header::HeaderValue;
use serde_json::{Map, Value};

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

/// Whether the client's `anthropic-beta` turns Claude's 1M-token window on: a feature
/// named `context-1m-…`, read in any case and spacing and in bytes that are not UTF-8 —
/// the header is forwarded as it came, so a spelling the gateway did not recognise could
/// still turn the window on upstream. Reading too much here only leaves a departure
/// unbounded by the 200 000-token window (`pipeline::long_context::Reader`).
pub fn asks_1m_window(beta: &HeaderValue) -> bool {
    const FEATURE: &[u8] = b"context-1m-";
    beta.as_bytes().split(|&b| b == b',').any(|f| {
        f.trim_ascii()
            .get(..FEATURE.len())
            .is_some_and(|p| p.eq_ignore_ascii_case(FEATURE))
    })
}

/// The generated output of a Messages answer (for counting when usage is missing): its
/// text, tool inputs and thinking — output Anthropic bills, counted as its stream's
/// deltas are.
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
            Some("thinking") => {
                text.push_str(b.get("thinking").and_then(Value::as_str).unwrap_or(""))
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Review finding (s17c, A0c): only `context-1m-` in lower case was read, while the
    /// header is forwarded byte for byte.
    #[test]
    fn the_1m_window_is_read_in_any_spelling_the_header_may_carry() {
        let asks = |b: &[u8]| asks_1m_window(&HeaderValue::from_bytes(b).expect("a header value"));
        for yes in [
            &b"context-1m-2025-08-07"[..],
            b"Context-1M-2025-08-07",
            b"files-api-2025-04-14,  CONTEXT-1M-2025-08-07 ",
            b"\tcontext-1m-x,\xffother",
        ] {
            assert!(asks(yes), "{}", String::from_utf8_lossy(yes));
        }
        for no in [
            &b""[..],
            b"context-1m",
            b"files-api-2025-04-14",
            b"x-context-1m-1",
        ] {
            assert!(!asks(no), "{}", String::from_utf8_lossy(no));
        }
    }
}
