//! The dispatch between wire formats: which adapter reads a client's request and which
//! writes it for the upstream, through the internal form (`canonical`). A body whose
//! client and upstream speak the same format never builds the internal form: it passes
//! untouched but for the model and the output cap (the same-format fast path).
//!
//! Adding a format: a variant of `Format`, its adapter module under `formats/`, and one
//! match arm in each function here (and in `translate::stream` for its events).

use serde_json::{Map, Value};

use super::canonical::Request;
use super::formats::{self, UPSTREAM};
use super::translate::TranslateError;
use super::{anthropic, openai};
use crate::config::Provider;
use crate::error::WireFormat;

/// The wire format a client speaks to the gateway, or an upstream speaks to it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Format {
    /// OpenAI chat completions (also `/v1/completions` and `/v1/embeddings` on the same
    /// upstreams, which only ever pass through).
    OpenAiChat,
    /// Anthropic Messages.
    Anthropic,
}

impl Format {
    /// How a refusal names an upstream of this format ("cannot be sent to …").
    pub fn model_noun(self) -> &'static str {
        match self {
            Format::OpenAiChat => "an OpenAI-format model",
            Format::Anthropic => "an Anthropic model",
        }
    }

    /// The error shape a client of this format reads.
    pub fn error_format(self) -> WireFormat {
        match self {
            Format::OpenAiChat => WireFormat::OpenAi,
            Format::Anthropic => WireFormat::Anthropic,
        }
    }
}

impl From<WireFormat> for Format {
    fn from(w: WireFormat) -> Self {
        match w {
            WireFormat::OpenAi => Format::OpenAiChat,
            WireFormat::Anthropic => Format::Anthropic,
        }
    }
}

impl From<Provider> for Format {
    fn from(p: Provider) -> Self {
        format_of(p)
    }
}

/// The wire format a provider kind speaks.
pub fn format_of(p: Provider) -> Format {
    match p {
        Provider::Openai => Format::OpenAiChat,
        Provider::Anthropic => Format::Anthropic,
    }
}

/// A client's request in the internal form; a refusal names the upstream it was read for.
fn read_request(
    client: Format,
    upstream: Format,
    body: &Map<String, Value>,
) -> Result<Request, TranslateError> {
    let read = match client {
        Format::OpenAiChat => formats::openai_chat::read_request(body),
        Format::Anthropic => formats::anthropic::read_request(body),
    };
    read.map_err(|mut e| {
        e.message = e.message.replace(UPSTREAM, upstream.model_noun());
        e
    })
}

fn write_request(
    upstream: Format,
    r: &Request,
    upstream_model: &str,
    cap: Option<(&'static str, i64)>,
    stream: bool,
) -> Result<Map<String, Value>, TranslateError> {
    match upstream {
        Format::OpenAiChat => formats::openai_chat::write_request(r, upstream_model, cap, stream),
        Format::Anthropic => formats::anthropic::write_request(r, upstream_model, cap, stream),
    }
}

/// The body to send to an `upstream` deployment for a request in the `client` format.
/// `cap` is the output cap and the field the upstream model takes it in (see
/// `catalog::Route::cap_field`); it is sent under that name only.
pub fn build_request(
    client: impl Into<Format>,
    upstream: impl Into<Format>,
    body: &Map<String, Value>,
    upstream_model: &str,
    cap: Option<(&'static str, i64)>,
    stream: bool,
) -> Result<Vec<u8>, TranslateError> {
    let (client, upstream) = (client.into(), upstream.into());
    let out = if client == upstream {
        match upstream {
            Format::OpenAiChat => openai::shape_request(body, upstream_model, cap, stream),
            Format::Anthropic => anthropic::shape_request(body, upstream_model, cap),
        }
    } else {
        let r = read_request(client, upstream, body)?;
        write_request(upstream, &r, upstream_model, cap, stream)?
    };
    // A map of JSON values always serializes.
    Ok(serde_json::to_vec(&Value::Object(out)).unwrap_or_default())
}
