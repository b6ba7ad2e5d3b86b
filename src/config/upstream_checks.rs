//! The provider-specific checks of an `[[upstreams]]` entry (Bedrock, Gemini / Vertex AI)
//! and the base URLs such an entry defaults to. They read only the settings, so they live
//! with them: the config sits below the providers (`upstream::providers::bedrock`,
//! `gemini`), which use these settings to send.

use super::{ServiceAccount, UpstreamSettings, VertexSettings};

/// Bedrock's runtime endpoint in `region`.
pub fn bedrock_base_url(region: &str) -> String {
    format!("https://bedrock-runtime.{region}.amazonaws.com")
}

/// Checks a `bedrock` upstream at config load: a region and exactly one kind of
/// credentials (the fields are refused on other kinds by `UpstreamSettings::check_kind`).
pub fn check_bedrock(u: &UpstreamSettings) -> Result<(), String> {
    let region = u.region.as_deref().unwrap_or("");
    if region.is_empty()
        || !region
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
    {
        return Err(
            "provider \"bedrock\" needs `region`, an AWS region name such as \"us-east-1\"".into(),
        );
    }
    let key = u.access_key_id.as_deref().filter(|k| !k.is_empty());
    let secret = u.secret_access_key.as_ref().filter(|s| !s.is_empty());
    match (key, secret, u.api_key.is_empty()) {
        (Some(_), Some(_), true) => Ok(()),
        (None, None, false) if u.session_token.is_none() => Ok(()),
        (None, None, true) => Err("provider \"bedrock\" needs credentials: access_key_id and secret_access_key (SigV4), or api_key (a Bedrock API key)".into()),
        (Some(_), None, _) | (None, Some(_), _) => {
            Err("access_key_id and secret_access_key go together".into())
        }
        _ => Err("give either access_key_id and secret_access_key (SigV4) or api_key (a Bedrock API key), not both; session_token goes with SigV4 only".into()),
    }
}

pub const GEMINI_API: &str = "https://generativelanguage.googleapis.com";

/// Google's base URL for this upstream when the config gives none.
pub fn gemini_base_url(vertex: Option<&VertexSettings>) -> String {
    match vertex {
        None => GEMINI_API.into(),
        Some(v) if v.location == "global" => "https://aiplatform.googleapis.com".into(),
        Some(v) => format!("https://{}-aiplatform.googleapis.com", v.location),
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
pub fn check_gemini(u: &UpstreamSettings, models: &[&str]) -> Result<(), String> {
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
            ServiceAccount::load(&v.credentials_file)
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
