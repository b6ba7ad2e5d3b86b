//! One adapter per wire format, each to and from the internal form (`canonical`). A format
//! module has, as it applies, a client side — `read_request` (its request → `Request`),
//! `write_answer`, `EventWriter`, `write_error` — and an upstream side — `write_request`
//! (`Request` → its request), `read_answer`, `EventReader`, `read_error`, `read_usage`.
//! The dispatch (`providers::dispatch`) joins a client side to an upstream side; a body
//! that crosses no format never comes here.
//!
//! The rule both sides keep: every field and content block is carried faithfully or
//! refused with a 400 naming it (`TranslateError`) — never dropped. A client-side reader
//! refuses what the internal form has no place for; an upstream-side writer refuses what
//! its format cannot express. A reader's refusal names the upstream it was read for: it
//! writes `UPSTREAM` where the message names it, and the dispatch puts the upstream's
//! name there (`Format::model_noun`).

pub mod anthropic;
pub mod bedrock;
pub mod gemini;
pub mod openai_chat;
pub mod responses;

use serde_json::{Map, Value};

use super::canonical::{CacheMark, ErrorInfo, ErrorKind, Source, Tool};
use super::translate::TranslateError;

/// Where a reader's refusal message names the upstream (see the module doc).
pub const UPSTREAM: &str = "{upstream}";

/// The line that marks an OpenAI tool message as a failed tool call: Anthropic's
/// `tool_result.is_error`, which OpenAI's tool messages have no field for. Written by the
/// OpenAI adapter out and read back by the OpenAI adapter in.
pub const TOOL_ERROR_MARK: &str = "[tool_result is_error=true]\n";

pub fn refuse(param: &'static str, message: impl Into<String>) -> TranslateError {
    TranslateError {
        param: Some(param.into()),
        message: message.into(),
    }
}

/// A field that has no counterpart on the other side (`upstream`: "an Anthropic model",
/// or `UPSTREAM` from a reader).
pub fn refuse_field(field: &'static str, upstream: &str) -> TranslateError {
    refuse(
        field,
        format!("`{field}` cannot be sent to {upstream}, and Sluice does not drop it."),
    )
}

/// True when a field is absent or holds its default (which the other side has anyway).
pub fn unset(v: Option<&Value>, default: &Value) -> bool {
    match v {
        None | Some(Value::Null) => true,
        Some(v) => v == default || (v.is_number() && v.as_f64() == default.as_f64()),
    }
}

/// A `data:` URL's media type and base64 payload.
pub fn data_url(url: &str) -> Option<(&str, &str)> {
    url.strip_prefix("data:")?.split_once(";base64,")
}

/// A source as a `data:` URL or the URL itself (`None` for a provider file id).
pub fn source_url(s: &Source) -> Option<String> {
    match s {
        Source::Url(u) => Some(u.clone()),
        Source::Base64 { media_type, data } => Some(format!("data:{media_type};base64,{data}")),
        Source::FileId(_) => None,
    }
}

/// A field that must be a number when set.
pub fn number(v: Option<&Value>, param: &'static str) -> Result<Option<f64>, TranslateError> {
    match v {
        None | Some(Value::Null) => Ok(None),
        Some(n) => n
            .as_f64()
            .map(Some)
            .ok_or_else(|| refuse(param, format!("`{param}` must be a number"))),
    }
}

/// An integer field when set.
pub fn integer(v: Option<&Value>, param: &'static str) -> Result<Option<i64>, TranslateError> {
    match v {
        None | Some(Value::Null) => Ok(None),
        Some(n) => n
            .as_i64()
            .map(Some)
            .ok_or_else(|| refuse(param, format!("`{param}` must be an integer"))),
    }
}

/// A string field, `""` when absent or not a string (an id or name the internal form
/// requires, left for the upstream to judge).
pub fn string(v: &Value, key: &str) -> String {
    v.get(key).and_then(Value::as_str).unwrap_or("").to_string()
}

/// A string field when set.
pub fn opt_string(v: &Value, key: &str) -> Option<String> {
    v.get(key).and_then(Value::as_str).map(str::to_string)
}

/// An array of strings (`stop`, `stop_sequences`); `None` when it is not one.
pub fn string_array(v: &Value) -> Option<Vec<String>> {
    v.as_array()?
        .iter()
        .map(|s| s.as_str().map(str::to_string))
        .collect()
}

/// An array field's items, none when it is absent or null; refused when not an array.
pub fn array_field<'a>(
    body: &'a Map<String, Value>,
    key: &'static str,
) -> Result<&'a [Value], TranslateError> {
    match body.get(key) {
        None | Some(Value::Null) => Ok(&[]),
        Some(Value::Array(a)) => Ok(a),
        Some(_) => Err(refuse(key, format!("`{key}` must be an array"))),
    }
}

/// A function tool's definition (`name`, `description`, `parameters`, `strict`), as OpenAI
/// chat nests it under `function` and the Responses API writes it flat.
pub fn function_tool(def: &Value) -> Tool {
    Tool {
        name: string(def, "name"),
        description: opt_string(def, "description"),
        parameters: def.get("parameters").cloned().unwrap_or(Value::Null),
        strict: def.get("strict").and_then(Value::as_bool),
        cache: None,
    }
}

/// A usage object whose figures (JSON pointers) are numbers where present: a figure that
/// is there but not a number is no count the gateway can charge, and not to be read as 0.
pub fn usage_readable(u: &Value, figures: &[&str]) -> bool {
    u.is_object()
        && !figures
            .iter()
            .any(|p| u.pointer(p).is_some_and(|v| !v.is_null() && !v.is_number()))
}

/// The cache mark of a `cache_control` object (the reverse of `cache_control`).
pub fn cache_mark_of(c: &Map<String, Value>) -> CacheMark {
    CacheMark {
        ttl: c.get("ttl").and_then(Value::as_str).map(str::to_string),
    }
}

/// Anthropic's `cache_control` for a cache mark.
pub fn cache_control(c: &CacheMark) -> Value {
    let mut v = serde_json::json!({"type": "ephemeral"});
    if let Some(ttl) = &c.ttl {
        v["ttl"] = Value::String(ttl.clone());
    }
    v
}

/// The kind of error an HTTP status stands for.
pub fn error_kind(status: u16) -> ErrorKind {
    match status {
        401 => ErrorKind::Authentication,
        403 => ErrorKind::PermissionDenied,
        404 => ErrorKind::NotFound,
        413 => ErrorKind::RequestTooLarge,
        429 => ErrorKind::RateLimited,
        503 | 529 => ErrorKind::Overloaded,
        400..=499 => ErrorKind::InvalidRequest,
        _ => ErrorKind::Server,
    }
}

/// The status an error kind stands for, where no HTTP status came with it (an error
/// event in the middle of a stream).
pub fn status_of(kind: ErrorKind) -> u16 {
    match kind {
        ErrorKind::InvalidRequest | ErrorKind::ContentFilter => 400,
        ErrorKind::Authentication => 401,
        ErrorKind::PermissionDenied => 403,
        ErrorKind::NotFound => 404,
        ErrorKind::RequestTooLarge => 413,
        ErrorKind::RateLimited | ErrorKind::QuotaExhausted => 429,
        ErrorKind::Overloaded => 529,
        ErrorKind::Server => 500,
    }
}

/// An upstream's error body, whatever its shape: its format's `error.message`, else a
/// top-level `message` (vLLM) or `detail` (FastAPI servers); a body that is not JSON (a
/// proxy's HTML page) is not shown to the client. `code` is the upstream's own code, else
/// its error type. Both formats read errors alike: an OpenAI-compatible server or a proxy
/// in front of either may answer in any of these shapes.
pub fn read_error(status: u16, v: &Value) -> ErrorInfo {
    ErrorInfo {
        status,
        kind: error_kind(status),
        message: upstream_message(v),
        code: upstream_code(v),
        param: None,
    }
}

/// The message of an upstream's error body, whatever its shape: OpenAI's and Anthropic's
/// `error.message`, vLLM's and Mistral's `message`, FastAPI's `detail` (a string, or a list
/// of validation errors whose `msg`s are joined), Ollama's `error` string.
fn upstream_message(v: &Value) -> String {
    if let Some(m) = ["/error/message", "/message", "/detail", "/error"]
        .iter()
        .find_map(|p| v.pointer(p).and_then(Value::as_str))
    {
        return m.to_string();
    }
    let msgs: Vec<&str> = v
        .get("detail")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|d| d.get("msg").and_then(Value::as_str))
        .collect();
    if msgs.is_empty() {
        "The upstream rejected the request.".into()
    } else {
        msgs.join("; ")
    }
}

/// The upstream's own `code`, else its `type`.
pub fn upstream_code(v: &Value) -> Option<String> {
    ["/error/code", "/error/type", "/type"]
        .iter()
        .find_map(|p| v.pointer(p).and_then(Value::as_str))
        .map(str::to_string)
}

#[cfg(test)]
pub(crate) mod fixtures;
#[cfg(test)]
mod props;
#[cfg(test)]
mod usage_fixtures;
