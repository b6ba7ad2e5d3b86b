//! Provider wire formats. Only this folder knows what an OpenAI or Anthropic body looks
//! like; the request path asks it for the body to send, the path to send it to, the usage
//! of an answer, and the answer in the client's format.

pub mod anthropic;
pub mod azure;
pub mod canonical;
pub mod openai;
pub mod translate;

use bytes::Bytes;
use serde_json::{Map, Value};

use crate::config::{AuthMode, Provider, UpstreamSettings};
use crate::error::WireFormat;
use crate::pipeline::request::Endpoint;
use crate::quota::pricing::Usage;
use crate::upstream::credential::Credential;
use translate::{request, response, TranslateError};

/// The most tokens one reported figure may hold. An upstream's usage is read through
/// `tokens`: a figure that is not a count in 0..=this (a lying or broken upstream's
/// `i64::MAX`, a negative one) is clamped, so no sum of figures can overflow downstream.
pub const MAX_REPORTED_TOKENS: i64 = u32::MAX as i64;

/// A token figure of an upstream's usage, clamped to 0..=`MAX_REPORTED_TOKENS`; `None` when
/// absent or not a number.
pub fn tokens(v: Option<&Value>) -> Option<i64> {
    let v = v?;
    let n = v
        .as_i64()
        .or_else(|| v.as_u64().map(|_| i64::MAX))
        .or_else(|| v.as_f64().map(|f| f as i64))?;
    Some(n.clamp(0, MAX_REPORTED_TOKENS))
}

pub fn format_of(p: Provider) -> WireFormat {
    match p {
        Provider::Openai | Provider::AzureOpenai | Provider::OpenaiCompatible => WireFormat::OpenAi,
        Provider::Anthropic => WireFormat::Anthropic,
    }
}

/// Where an endpoint's requests go on a provider, after its base URL; `None` when it has no
/// such endpoint. Providers whose URL names the deployment or model (`url`) answer the
/// path's last part only: what tells that the endpoint exists.
pub fn path(endpoint: Endpoint, p: Provider) -> Option<&'static str> {
    use Provider::{Anthropic, AzureOpenai, Openai, OpenaiCompatible};
    match (endpoint, p) {
        (Endpoint::Chat | Endpoint::Messages, Openai | AzureOpenai | OpenaiCompatible) => {
            Some("/chat/completions")
        }
        (Endpoint::Completions, Openai | AzureOpenai | OpenaiCompatible) => Some("/completions"),
        (Endpoint::Embeddings, Openai | AzureOpenai | OpenaiCompatible) => Some("/embeddings"),
        (Endpoint::Chat | Endpoint::Messages, Anthropic) => Some("/v1/messages"),
        (Endpoint::Completions | Endpoint::Embeddings, Anthropic) => None,
    }
}

/// Whether a provider's URL names the route's deployment or model: then each route target
/// has its own URLs (`catalog::Deployment::target`).
pub fn target_in_url(p: Provider) -> bool {
    matches!(p, Provider::AzureOpenai)
}

/// The URL an endpoint's request (streamed or not) goes to on an upstream, for a route whose
/// target (Azure's deployment, a model in the path) is `target`. Built once at start.
pub fn url(
    u: &UpstreamSettings,
    base: &str,
    endpoint: Endpoint,
    target: &str,
    _stream: bool,
) -> Option<reqwest::Url> {
    let path = path(endpoint, u.provider)?;
    match u.provider {
        Provider::AzureOpenai => azure::url(u, base, endpoint, target),
        Provider::Openai | Provider::Anthropic | Provider::OpenaiCompatible => {
            reqwest::Url::parse(&format!("{base}{path}")).ok()
        }
    }
}

/// How a deployment authenticates: a header built once, none, or a hook run at send time.
pub fn credential(u: &UpstreamSettings) -> Credential {
    use reqwest::header::{HeaderName, AUTHORIZATION};
    let key = u.api_key.expose();
    match u.provider {
        _ if u.quirks.auth == AuthMode::None => Credential::None,
        Provider::Openai | Provider::OpenaiCompatible => {
            Credential::header(AUTHORIZATION, &format!("Bearer {key}"))
        }
        Provider::Anthropic => Credential::header(HeaderName::from_static("x-api-key"), key),
        Provider::AzureOpenai => azure::credential(u),
    }
}

/// The body to send to a `upstream` deployment for a request in the `client` format.
/// `cap` is the output cap and the field the upstream model takes it in (see
/// `catalog::Route::cap_field`); it is sent under that name only.
pub fn build_request(
    client: WireFormat,
    upstream: Provider,
    body: &Map<String, Value>,
    upstream_model: &str,
    cap: Option<(&'static str, i64)>,
    stream: bool,
) -> Result<Vec<u8>, TranslateError> {
    build_request_with(client, upstream, body, upstream_model, cap, (stream, true))
}

/// `build_request` for an upstream that may not take `stream_options`: with
/// `include_usage` false (its `quirks.include_usage`), a stream's body carries none at all.
pub fn build_request_with(
    client: WireFormat,
    upstream: Provider,
    body: &Map<String, Value>,
    upstream_model: &str,
    cap: Option<(&'static str, i64)>,
    (stream, include_usage): (bool, bool),
) -> Result<Vec<u8>, TranslateError> {
    let cap_value = cap.map_or(0, |(_, c)| c);
    let mut out = match (client, format_of(upstream)) {
        (WireFormat::OpenAi, WireFormat::OpenAi) => {
            openai::shape_request(body, upstream_model, cap, stream)
        }
        (WireFormat::Anthropic, WireFormat::Anthropic) => {
            anthropic::shape_request(body, upstream_model, cap)
        }
        (WireFormat::OpenAi, WireFormat::Anthropic) => {
            request::openai_to_anthropic(body, upstream_model, cap_value, stream)?
        }
        (WireFormat::Anthropic, WireFormat::OpenAi) => {
            let cap = cap.unwrap_or(("max_tokens", cap_value));
            request::anthropic_to_openai(body, upstream_model, cap, stream)?
        }
    };
    if !include_usage && format_of(upstream) == WireFormat::OpenAi {
        out.remove("stream_options");
    }
    Ok(serde_json::to_vec(&Value::Object(out)).unwrap_or_default())
}

/// The usage an answer reports, else the generated text to count.
pub fn answer_usage(upstream: WireFormat, v: &Value) -> Result<Usage, String> {
    let usage = v.get("usage").and_then(|u| match upstream {
        WireFormat::OpenAi => openai::usage_of(u),
        WireFormat::Anthropic => anthropic::usage_of(u),
    });
    usage.ok_or_else(|| match upstream {
        WireFormat::OpenAi => openai::answer_text(v),
        WireFormat::Anthropic => anthropic::answer_text(v),
    })
}

/// A non-streamed answer in the client's format: the upstream's bytes untouched when the
/// formats match, translated otherwise.
pub fn convert_answer(upstream: WireFormat, client: WireFormat, raw: Bytes, v: &Value) -> Bytes {
    let converted = match (upstream, client) {
        (WireFormat::Anthropic, WireFormat::OpenAi) => response::anthropic_answer_to_openai(v),
        (WireFormat::OpenAi, WireFormat::Anthropic) => response::openai_answer_to_anthropic(v),
        _ => return raw,
    };
    Bytes::from(converted.to_string())
}

/// An upstream's client-error body in the client's format: untouched when it is already
/// the client's format's error, rebuilt otherwise (the other format, an OpenAI-compatible
/// server's own shape, a proxy's HTML page).
pub fn convert_error(upstream: WireFormat, client: WireFormat, status: u16, raw: Bytes) -> Bytes {
    let v: Value = serde_json::from_slice(&raw)
        .ok()
        .or_else(|| plain_text_error(&raw))
        .unwrap_or(Value::Null);
    if upstream == client && is_error_of(client, &v) {
        return raw;
    }
    let converted = match client {
        WireFormat::OpenAi => response::error_to_openai(status, &v),
        WireFormat::Anthropic => response::error_to_anthropic(status, &v),
    };
    Bytes::from(converted.to_string())
}

/// A short plain-text error body (a server's "model not found") as `{"message": …}`; not
/// an HTML page (a proxy's), which says nothing a client can use.
fn plain_text_error(raw: &[u8]) -> Option<Value> {
    let text = std::str::from_utf8(raw).ok()?.trim();
    let plain = !text.is_empty()
        && text.len() <= 1000
        && !text.starts_with('<')
        && !text.chars().any(char::is_control);
    plain.then(|| serde_json::json!({ "message": text }))
}

/// True when `v` is an error body of `format`'s own shape, which its SDKs parse.
fn is_error_of(format: WireFormat, v: &Value) -> bool {
    let text = |p: &str| v.pointer(p).is_some_and(Value::is_string);
    match format {
        WireFormat::OpenAi => text("/error/message"),
        WireFormat::Anthropic => {
            v["type"] == "error" && text("/error/type") && text("/error/message")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// OpenAI-compatible servers' own error bodies, rebuilt in each client's format with the
    /// server's message (the status is the caller's to keep).
    #[test]
    fn compatible_servers_error_bodies_reach_the_client_in_its_format() {
        let shapes: [(&str, &[u8]); 5] = [
            ("fastapi", br#"{"detail":"mock error 400"}"#),
            ("ollama", br#"{"error":"mock error 400"}"#),
            (
                "vllm",
                br#"{"object":"error","message":"mock error 400","type":"BadRequestError","param":null,"code":400}"#,
            ),
            ("text", b"mock error 400"),
            (
                "fastapi list",
                br#"{"detail":[{"type":"missing","loc":["body","messages"],"msg":"mock error 400"}]}"#,
            ),
        ];
        for (name, raw) in shapes {
            let openai = convert_error(
                WireFormat::OpenAi,
                WireFormat::OpenAi,
                400,
                Bytes::from_static(raw),
            );
            let v: Value = serde_json::from_slice(&openai).unwrap();
            assert_eq!(v["error"]["type"], "invalid_request_error", "{name}: {v}");
            assert!(
                v["error"]["message"]
                    .as_str()
                    .is_some_and(|m| m.contains("mock error 400")),
                "{name}: {v}"
            );
            let anthropic = convert_error(
                WireFormat::OpenAi,
                WireFormat::Anthropic,
                400,
                Bytes::from_static(raw),
            );
            let v: Value = serde_json::from_slice(&anthropic).unwrap();
            assert_eq!(v["type"], "error", "{name}: {v}");
            assert_eq!(v["error"]["type"], "invalid_request_error", "{name}: {v}");
            assert!(
                v["error"]["message"]
                    .as_str()
                    .is_some_and(|m| m.contains("mock error 400")),
                "{name}: {v}"
            );
        }
        // A proxy's HTML page is no message for a client.
        let html = convert_error(
            WireFormat::OpenAi,
            WireFormat::OpenAi,
            404,
            Bytes::from_static(b"<html><body>404 Not Found</body></html>"),
        );
        let v: Value = serde_json::from_slice(&html).unwrap();
        assert!(
            !v["error"]["message"].as_str().unwrap().contains('<'),
            "{v}"
        );
    }

    /// Azure's content-filter 400: an OpenAI client gets Azure's body as it is (with
    /// `innererror.content_filter_result`); an Anthropic client an `invalid_request_error`
    /// that says the content filter refused it.
    #[test]
    fn azure_content_filter_errors_name_the_filter() {
        let raw = serde_json::to_vec(&crate::mock::azure::content_filter_error()).unwrap();
        let openai = convert_error(
            WireFormat::OpenAi,
            WireFormat::OpenAi,
            400,
            Bytes::from(raw.clone()),
        );
        assert_eq!(openai, raw, "passed through untouched");
        let anthropic = convert_error(
            WireFormat::OpenAi,
            WireFormat::Anthropic,
            400,
            Bytes::from(raw),
        );
        let v: Value = serde_json::from_slice(&anthropic).unwrap();
        assert_eq!(v["error"]["type"], "invalid_request_error", "{v}");
        assert_eq!(v["error"]["code"], "content_filter", "{v}");
        assert!(
            v["error"]["message"]
                .as_str()
                .unwrap()
                .contains("content management policy"),
            "{v}"
        );
    }
}
