//! Provider wire formats. Only this folder knows what an OpenAI or Anthropic body looks
//! like; the request path asks it for the body to send, the path to send it to, the usage
//! of an answer, and the answer in the client's format.

pub mod anthropic;
pub mod bedrock;
pub mod canonical;
pub mod formats;
pub mod openai;
pub mod translate;

use bytes::Bytes;
use serde_json::{Map, Value};

use crate::config::Provider;
use crate::error::WireFormat;
use crate::pipeline::request::Endpoint;
use crate::quota::pricing::Usage;
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
        Provider::Openai => WireFormat::OpenAi,
        Provider::Anthropic => WireFormat::Anthropic,
        // Not reached: `path` gives Bedrock no endpoint until the canonical dispatch serves
        // it, so `attempts::candidates` skips its routes. Converse is closest to Anthropic.
        Provider::Bedrock => WireFormat::Anthropic,
    }
}

/// Where an endpoint's requests go on a provider; `None` when it has no such endpoint.
pub fn path(endpoint: Endpoint, p: Provider) -> Option<&'static str> {
    match (endpoint, p) {
        (Endpoint::Chat | Endpoint::Messages, Provider::Openai) => Some("/chat/completions"),
        (Endpoint::Completions, Provider::Openai) => Some("/completions"),
        (Endpoint::Embeddings, Provider::Openai) => Some("/embeddings"),
        (Endpoint::Chat | Endpoint::Messages, Provider::Anthropic) => Some("/v1/messages"),
        (Endpoint::Completions | Endpoint::Embeddings, Provider::Anthropic) => None,
        // Bedrock's path names the model (`bedrock::path`); served once the canonical
        // dispatch routes requests through `formats::bedrock`.
        (_, Provider::Bedrock) => None,
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
    let cap_value = cap.map_or(0, |(_, c)| c);
    let out = match (client, upstream) {
        (WireFormat::OpenAi, Provider::Openai) => {
            openai::shape_request(body, upstream_model, cap, stream)
        }
        (WireFormat::Anthropic, Provider::Anthropic) => {
            anthropic::shape_request(body, upstream_model, cap)
        }
        (WireFormat::OpenAi, Provider::Anthropic) => {
            request::openai_to_anthropic(body, upstream_model, cap_value, stream)?
        }
        (WireFormat::Anthropic, Provider::Openai) => {
            let cap = cap.unwrap_or(("max_tokens", cap_value));
            request::anthropic_to_openai(body, upstream_model, cap, stream)?
        }
        (_, Provider::Bedrock) => {
            return Err(TranslateError {
                param: None,
                message: "Bedrock upstreams are served through the canonical dispatch".into(),
            })
        }
    };
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
    let v: Value = serde_json::from_slice(&raw).unwrap_or(Value::Null);
    if upstream == client && is_error_of(client, &v) {
        return raw;
    }
    let converted = match client {
        WireFormat::OpenAi => response::error_to_openai(status, &v),
        WireFormat::Anthropic => response::error_to_anthropic(status, &v),
    };
    Bytes::from(converted.to_string())
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
