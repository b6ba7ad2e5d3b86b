//! Provider wire formats. Only this folder knows what an OpenAI or Anthropic body looks
//! like; the request path asks it for the body to send, the path to send it to, the usage
//! of an answer, and the answer in the client's format.

pub mod anthropic;
pub mod canonical;
mod dispatch;
pub mod formats;
pub mod gemini;
pub mod openai;
pub mod translate;

pub use dispatch::{answer_usage, build_request, convert_answer, convert_error, format_of, Format};

use serde_json::Value;

use crate::config::Provider;
use crate::pipeline::request::Endpoint;

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

/// Where an endpoint's requests go on a provider; `None` when it has no such endpoint.
pub fn path(endpoint: Endpoint, p: Provider) -> Option<&'static str> {
    match (endpoint, p) {
        (Endpoint::Chat | Endpoint::Messages, Provider::Openai) => Some("/chat/completions"),
        (Endpoint::Completions, Provider::Openai) => Some("/completions"),
        (Endpoint::Embeddings, Provider::Openai) => Some("/embeddings"),
        (Endpoint::Chat | Endpoint::Messages, Provider::Anthropic) => Some("/v1/messages"),
        (Endpoint::Completions | Endpoint::Embeddings, Provider::Anthropic) => None,
        // The model is in a Gemini URL: `call_path` builds it per call.
        (Endpoint::Chat | Endpoint::Messages, Provider::Gemini) => Some(":generateContent"),
        (Endpoint::Completions | Endpoint::Embeddings, Provider::Gemini) => None,
    }
}

/// The path of one call to `dep` for `model`: the provider's fixed path, or for Gemini the
/// model's own (`gemini::path`, streamed or not).
pub fn call_path(
    endpoint: Endpoint,
    dep: &crate::upstream::catalog::Deployment,
    model: &str,
    stream: bool,
) -> std::borrow::Cow<'static, str> {
    match dep.provider {
        Provider::Gemini => gemini::path(dep.vertex.as_ref().map(|(v, _)| v), model, stream).into(),
        p => path(endpoint, p).unwrap_or_default().into(),
    }
}
