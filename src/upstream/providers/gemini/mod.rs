//! The `gemini` provider's transport: Google's Gemini API (key in `x-goog-api-key`) and
//! Vertex AI (a service account's OAuth token, `token`) and their URLs; their config checks
//! and default base URLs are the config's (`config::check_gemini`, `gemini_base_url`). The
//! body is `formats::gemini`'s.
//!
//! | | base URL (default) | path |
//! | --- | --- | --- |
//! | Gemini API | `https://generativelanguage.googleapis.com` | `/v1beta/models/{model}:generateContent` |
//! | Vertex AI | `https://{location}-aiplatform.googleapis.com` (`global`: `https://aiplatform.googleapis.com`) | `/v1/projects/{project}/locations/{location}/publishers/google/models/{model}:generateContent` |
//!
//! Streams use `:streamGenerateContent?alt=sse`. The model is part of the path, so each
//! route's model has its own URLs (`url`, built once at start by `catalog::Deployment`).
//! The Gemini API's key is a static `x-goog-api-key` header; Vertex AI's token is a
//! credential hook (`credential::token::TokenSource` over `token::Vertex`), fetched and
//! refreshed at send time.

pub mod token;

use std::sync::Arc;

use reqwest::header::HeaderName;

use crate::clock::SystemClock;
use crate::config::{UpstreamSettings, VertexSettings};
use crate::upstream::credential::Credential;

/// The path (and query) of a call to `model`, after the base URL.
pub fn path(vertex: Option<&VertexSettings>, model: &str, stream: bool) -> String {
    let method = if stream {
        "streamGenerateContent?alt=sse"
    } else {
        "generateContent"
    };
    match vertex {
        None => format!("/v1beta/models/{model}:{method}"),
        Some(v) => format!(
            "/v1/projects/{}/locations/{}/publishers/google/models/{model}:{method}",
            v.project, v.location
        ),
    }
}

/// The URL of a call to `model` (streamed or not) at `base`; `None` if it does not parse.
pub fn url(
    vertex: Option<&VertexSettings>,
    base: &str,
    model: &str,
    stream: bool,
) -> Option<reqwest::Url> {
    reqwest::Url::parse(&format!("{base}{}", path(vertex, model, stream))).ok()
}

/// `x-goog-api-key: <key>` on the Gemini API; on Vertex AI the service account's bearer
/// token, fetched at send time. The account file was checked at load; one gone since makes
/// every attempt fail as a 401 naming it.
pub fn credential(u: &UpstreamSettings) -> Credential {
    match &u.vertex {
        Some(v) => Credential::Hook(Arc::new(token::source(
            token::ServiceAccount::load(&v.credentials_file),
            Arc::new(SystemClock),
        ))),
        None => Credential::header(
            HeaderName::from_static("x-goog-api-key"),
            u.api_key.expose(),
        ),
    }
}
