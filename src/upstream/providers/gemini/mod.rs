//! The `gemini` provider's transport: Google's Gemini API (key in `x-goog-api-key`) and
//! Vertex AI (a service account's OAuth token, `token`), their URLs and their config
//! checks. The body is `formats::gemini`'s.
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

pub const GEMINI_API: &str = "https://generativelanguage.googleapis.com";

/// Google's base URL for this upstream when the config gives none.
pub fn default_base_url(vertex: Option<&VertexSettings>) -> String {
    match vertex {
        None => GEMINI_API.into(),
        Some(v) if v.location == "global" => "https://aiplatform.googleapis.com".into(),
        Some(v) => format!("https://{}-aiplatform.googleapis.com", v.location),
    }
}

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

/// A name that can stand in a URL path as it is (a project, a location, a model).
fn path_safe(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 128
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'@'))
}

/// The config checks of a `gemini` upstream, and of the model names its routes send.
/// Messages name the upstream's field; none shows a key.
pub fn check(u: &UpstreamSettings, models: &[&str]) -> Result<(), String> {
    match &u.vertex {
        None if u.api_key.is_empty() => {
            return Err("a `gemini` upstream needs `api_key` (Gemini API) or `vertex = { project, location, credentials_file }` (Vertex AI)".into())
        }
        None => {}
        Some(_) if !u.api_key.is_empty() => {
            return Err("`api_key` and `vertex` are exclusive: Vertex AI signs in with the service account".into())
        }
        Some(v) => {
            if !path_safe(&v.project) {
                return Err(format!("vertex.project `{}` is not a project id", v.project));
            }
            if !path_safe(&v.location) {
                return Err(format!("vertex.location `{}` is not a region or `global`", v.location));
            }
            token::ServiceAccount::load(&v.credentials_file)
                .map_err(|e| format!("vertex.credentials_file: {e}"))?;
        }
    }
    if let Some(bad) = models.iter().find(|m| !path_safe(m)) {
        return Err(format!(
            "model `{bad}` cannot stand in a Gemini URL (letters, digits, `-`, `_`, `.`, `@`)"
        ));
    }
    Ok(())
}
