//! Provider wire formats. Only this folder knows what an OpenAI or Anthropic body looks
//! like; the request path asks it for the body to send, the path to send it to, the usage
//! of an answer, and the answer in the client's format.

pub mod anthropic;
pub mod azure;
pub mod bedrock;
pub mod canonical;
mod dispatch;
pub mod formats;
pub mod gemini;
pub mod openai;
pub mod tier;
pub mod translate;

pub use dispatch::{
    answer_text, answer_usage, build_request, build_request_with, convert_answer, convert_error,
    format_of, read_answer, relayable, Built, Destination, Format,
};

use serde_json::{Map, Value};

use crate::config::{AuthMode, Provider, UpstreamSettings};
use crate::endpoint::Endpoint;
use crate::upstream::credential::Credential;
use translate::TranslateError;

/// The most tokens one reported figure may hold. An upstream's usage is read through
/// `tokens`: a figure past this (a lying or broken upstream's `i64::MAX`) is clamped, so no
/// sum of figures can overflow downstream.
pub const MAX_REPORTED_TOKENS: i64 = u32::MAX as i64;

/// A token figure of an upstream's usage, clamped to `MAX_REPORTED_TOKENS`; `None` when
/// absent, not a number, or negative: a negative figure is no count, so the side it
/// stands for is not reported (estimated, the row marked), never a reported 0.
pub fn tokens(v: Option<&Value>) -> Option<i64> {
    let v = v?;
    let n = v
        .as_i64()
        .or_else(|| v.as_u64().map(|_| i64::MAX))
        // The sign before the cast: `-0.9` is no count either, not a 0.
        .or_else(|| v.as_f64().map(|f| if f < 0.0 { -1 } else { f as i64 }))?;
    (n >= 0).then(|| n.min(MAX_REPORTED_TOKENS))
}

/// Where an endpoint's requests go on a provider, after its base URL; `None` when it has no
/// such endpoint. Providers whose URL names the deployment or model (`url`) answer the
/// path's last part only: what tells that the endpoint exists.
pub fn path(endpoint: Endpoint, p: Provider) -> Option<&'static str> {
    use Provider::{Anthropic, AzureOpenai, Bedrock, Gemini, Openai, OpenaiCompatible};
    match (endpoint, p) {
        (Endpoint::Chat | Endpoint::Messages, Openai | AzureOpenai | OpenaiCompatible) => {
            Some("/chat/completions")
        }
        (Endpoint::Completions, Openai | AzureOpenai | OpenaiCompatible) => Some("/completions"),
        (Endpoint::Embeddings, Openai | AzureOpenai | OpenaiCompatible) => Some("/embeddings"),
        (Endpoint::Chat | Endpoint::Messages, Anthropic) => Some("/v1/messages"),
        (Endpoint::Completions | Endpoint::Embeddings, Anthropic) => None,
        // Native on OpenAI; translated (through chat) everywhere else.
        (Endpoint::Responses, Openai) => Some("/responses"),
        (Endpoint::Responses, Anthropic) => Some("/v1/messages"),
        (Endpoint::Responses, AzureOpenai | OpenaiCompatible) => Some("/chat/completions"),
        // The model is in a Gemini or Bedrock URL (`gemini::url`, `bedrock::url`); the
        // Responses API goes through chat.
        (Endpoint::Chat | Endpoint::Messages | Endpoint::Responses, Gemini) => {
            Some(":generateContent")
        }
        (Endpoint::Chat | Endpoint::Messages | Endpoint::Responses, Bedrock) => Some("/converse"),
        (Endpoint::Completions | Endpoint::Embeddings, Gemini | Bedrock) => None,
    }
}

/// Whether a provider's URL names the route's deployment or model: then each route target
/// has its own URLs (`catalog::Deployment::target`).
pub fn target_in_url(p: Provider) -> bool {
    matches!(
        p,
        Provider::AzureOpenai | Provider::Gemini | Provider::Bedrock
    )
}

/// The URL an endpoint's request (streamed or not) goes to on an upstream, for a route whose
/// target (Azure's deployment, the model in Gemini's and Bedrock's paths) is `target`.
/// Built once at start.
pub fn url(
    u: &UpstreamSettings,
    base: &str,
    endpoint: Endpoint,
    target: &str,
    stream: bool,
) -> Option<reqwest::Url> {
    let path = path(endpoint, u.provider)?;
    match u.provider {
        Provider::AzureOpenai => azure::url(u, base, endpoint, target),
        Provider::Gemini => gemini::url(u.vertex.as_ref(), base, target, stream),
        Provider::Bedrock => bedrock::url(base, target, stream),
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
        Provider::Gemini => gemini::credential(u),
        Provider::Bedrock => bedrock::credential(u),
    }
}

/// The format a Responses API client's upstream speaks: the Responses API itself for a
/// provider that speaks it (`formats::responses::native`), else the provider's own.
pub fn responses_format(upstream: Provider) -> Format {
    if formats::responses::native(upstream) {
        Format::Responses
    } else {
        format_of(upstream)
    }
}

/// The body to send for a Responses API request: the native body to a provider that
/// speaks the Responses API (`formats::responses::native`), else the request through the
/// internal form in the upstream's format — without `stream_options` for a server that
/// refuses them (`include_usage`, as `build_request_with`).
pub fn build_responses_request(
    upstream: Provider,
    body: &Map<String, Value>,
    upstream_model: &str,
    cap: Option<(&'static str, i64)>,
    (stream, include_usage): (bool, bool),
) -> Result<Built, TranslateError> {
    build_request_with(
        Format::Responses,
        Destination {
            format: responses_format(upstream),
            standard_tier: tier::pinned(upstream),
        },
        body,
        upstream_model,
        cap,
        (stream, include_usage),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::WireFormat;
    use bytes::Bytes;
    use serde_json::json;

    #[test]
    fn a_negative_figure_is_no_count_whole_or_fractional() {
        for (v, want) in [
            (json!(12), Some(12)),
            (json!(1.9), Some(1)),
            (json!(-0.0), Some(0)),
            (json!(-5), None),
            // Cast before its sign was read, -0.9 was a reported 0 (review finding, s17b).
            (json!(-0.9), None),
            (json!("7"), None),
            (json!(u64::MAX), Some(MAX_REPORTED_TOKENS)),
        ] {
            assert_eq!(tokens(Some(&v)), want, "{v}");
        }
    }

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
