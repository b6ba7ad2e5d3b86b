//! Provider wire formats. Only this folder knows what an OpenAI or Anthropic body looks
//! like; the request path asks it for the body to send, the path to send it to, the usage
//! of an answer, and the answer in the client's format.

pub mod anthropic;
pub mod bedrock;
pub mod canonical;
mod dispatch;
pub mod formats;
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
        // The prefix of Bedrock's paths: the whole path names the model and the stream
        // switch (`bedrock::path`, which the request path sends to).
        (Endpoint::Chat | Endpoint::Messages, Provider::Bedrock) => Some("/model"),
        (Endpoint::Completions | Endpoint::Embeddings, Provider::Bedrock) => None,
    }
}
