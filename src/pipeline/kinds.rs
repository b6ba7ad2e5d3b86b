//! What a request may make the upstream bill beyond plain input and output tokens, read
//! from the client's body so the reservation covers it (`pipeline::reservation_amount`):
//! prompt-cache writes (a `cache_control` mark anywhere; one-hour ones with
//! `ttl: "1h"`), audio in or out, and server-side web searches, billed per call. A web
//! search the gateway cannot cap is refused: the reservation must bound every call.

use serde_json::{json, Map, Value};

use super::request::Endpoint;
use crate::error::ApiError;
use crate::quota::pricing::InputKinds;

/// The kinds a request may be billed for, and the most web-search calls it may make.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Kinds {
    pub input: InputKinds,
    /// The request asks for audio out (`modalities` with `audio`, or `audio`).
    pub audio_output: bool,
    /// The most web-search calls the upstream may make and bill.
    pub web_search_calls: i64,
}

/// Anthropic's web-search server tool (`web_search_20250305` and later versions).
fn is_web_search(tool: &Value) -> bool {
    tool.get("type")
        .and_then(Value::as_str)
        .is_some_and(|t| t.starts_with("web_search_"))
}

/// Reads the kinds of `body`; an Anthropic web-search tool without `max_uses` gets
/// `max_calls` (the `[finance] max_server_tool_calls`) as its cap, sent upstream with it.
pub fn read(
    endpoint: Endpoint,
    body: &mut Map<String, Value>,
    max_calls: u32,
) -> Result<Kinds, ApiError> {
    let mut kinds = Kinds::default();
    for v in body.values() {
        marks(v, &mut kinds.input);
    }
    kinds.audio_output = !body.get("audio").is_none_or(Value::is_null)
        || body
            .get("modalities")
            .and_then(Value::as_array)
            .is_some_and(|m| m.iter().any(|x| x.as_str() == Some("audio")));
    kinds.input.audio |= kinds.audio_output;
    if endpoint == Endpoint::Chat && !body.get("web_search_options").is_none_or(Value::is_null) {
        return Err(ApiError::invalid(
            "web_search_options",
            "`web_search_options` is not accepted: the gateway cannot cap the number of \
             searches it makes, and each is billed. Use a model without built-in search.",
        ));
    }
    if endpoint == Endpoint::Messages {
        kinds.web_search_calls = web_search_caps(body, max_calls)?;
    }
    Ok(kinds)
}

/// The sum of the web-search tools' caps, each `max_uses` (a positive integer) or, when
/// absent, `max_calls`, written into the tool.
fn web_search_caps(body: &mut Map<String, Value>, max_calls: u32) -> Result<i64, ApiError> {
    let Some(Value::Array(tools)) = body.get_mut("tools") else {
        return Ok(0);
    };
    let mut calls = 0i64;
    for tool in tools.iter_mut().filter(|t| is_web_search(t)) {
        let Some(t) = tool.as_object_mut() else {
            continue;
        };
        let cap = match t.get("max_uses") {
            None | Some(Value::Null) => {
                t.insert("max_uses".into(), json!(max_calls));
                i64::from(max_calls)
            }
            Some(v) => v.as_i64().filter(|n| *n >= 1).ok_or_else(|| {
                ApiError::invalid(
                    "tools",
                    "a web-search tool's `max_uses` must be a positive integer",
                )
            })?,
        };
        calls = calls.saturating_add(cap);
    }
    Ok(calls)
}

/// Notes the cache marks and audio parts anywhere under `v`.
fn marks(v: &Value, kinds: &mut InputKinds) {
    match v {
        Value::Object(o) => {
            if let Some(Value::Object(c)) = o.get("cache_control") {
                if c.get("ttl").and_then(Value::as_str) == Some("1h") {
                    kinds.cache_write_1h = true;
                } else {
                    kinds.cache_write_5m = true;
                }
            }
            if o.get("type").and_then(Value::as_str) == Some("input_audio") {
                kinds.audio = true;
            }
            o.values().for_each(|x| marks(x, kinds));
        }
        Value::Array(a) => a.iter().for_each(|x| marks(x, kinds)),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read_json(endpoint: Endpoint, body: Value) -> (Result<Kinds, ApiError>, Value) {
        let Value::Object(mut m) = body else {
            panic!("not an object")
        };
        let r = read(endpoint, &mut m, 5);
        (r, Value::Object(m))
    }

    fn param(r: Result<Kinds, ApiError>) -> Option<&'static str> {
        match r {
            Err(ApiError::InvalidRequest { param, .. }) => param,
            other => panic!("not refused: {other:?}"),
        }
    }

    #[test]
    fn cache_marks_and_audio_are_found_wherever_they_are() {
        let (k, _) = read_json(
            Endpoint::Messages,
            json!({"system": [{"type": "text", "text": "s", "cache_control": {"type": "ephemeral"}}],
                "messages": [{"role": "user", "content": [{"type": "text", "text": "x",
                    "cache_control": {"type": "ephemeral", "ttl": "1h"}}]}]}),
        );
        let k = k.unwrap();
        assert!(k.input.cache_write_5m && k.input.cache_write_1h && !k.input.audio);
        let (k, _) = read_json(
            Endpoint::Chat,
            json!({"messages": [{"role": "user", "content": [{"type": "input_audio",
                "input_audio": {"data": "", "format": "wav"}}]}]}),
        );
        let k = k.unwrap();
        assert!(k.input.audio && !k.audio_output && !k.input.cache_write_5m);
        let (k, _) = read_json(
            Endpoint::Chat,
            json!({"messages": [], "modalities": ["text", "audio"]}),
        );
        assert!(k.unwrap().audio_output);
        let (k, _) = read_json(
            Endpoint::Chat,
            json!({"messages": [{"role": "user", "content": "hi"}]}),
        );
        assert_eq!(k.unwrap(), Kinds::default());
    }

    #[test]
    fn web_search_is_capped_or_refused() {
        // No cap of the client's: the gateway's is sent and reserved for.
        let (k, body) = read_json(
            Endpoint::Messages,
            json!({"tools": [{"type": "web_search_20250305", "name": "web_search"}]}),
        );
        assert_eq!(k.unwrap().web_search_calls, 5);
        assert_eq!(body["tools"][0]["max_uses"], 5);
        // The client's own cap is kept and reserved for.
        let (k, body) = read_json(
            Endpoint::Messages,
            json!({"tools": [{"type": "web_search_20250305", "name": "web_search", "max_uses": 2},
                {"name": "f", "input_schema": {}}]}),
        );
        assert_eq!(k.unwrap().web_search_calls, 2);
        assert_eq!(body["tools"][0]["max_uses"], 2);
        let (k, _) = read_json(
            Endpoint::Messages,
            json!({"tools": [{"type": "web_search_20250305", "max_uses": 0}]}),
        );
        assert_eq!(param(k), Some("tools"));
        let (k, _) = read_json(
            Endpoint::Chat,
            json!({"messages": [], "web_search_options": {}}),
        );
        assert_eq!(param(k), Some("web_search_options"));
    }
}
