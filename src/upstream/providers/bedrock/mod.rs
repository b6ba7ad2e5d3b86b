//! The `bedrock` provider's transport: where a Converse call goes, how it is
//! authenticated (SigV4 or a Bedrock API key), how its errors are typed for the retry tiers,
//! and how its binary event stream is framed (`eventstream`). The wire format itself
//! (bodies, answers, events, errors) is `formats::bedrock`.
//!
//! Config (`[[upstreams]] provider = "bedrock"`): `region` is required; the credentials are
//! either SigV4 (`access_key_id` + `secret_access_key`, optional `session_token`) or a
//! Bedrock API key in `api_key` (sent as `Authorization: Bearer …`), never both; `base_url`
//! defaults to `https://bedrock-runtime.{region}.amazonaws.com`.

pub mod eventstream;
pub mod sigv4;

use std::time::SystemTime;

use bytes::Bytes;
use reqwest::header::{HeaderValue, AUTHORIZATION, CONTENT_TYPE};
use serde_json::Value;

use crate::config::{Provider, UpstreamSettings};
use crate::upstream::retry::Tier;
use sigv4::{BodyHashHeader, Signer};

/// Bedrock's runtime endpoint in `region`.
pub fn default_base_url(region: &str) -> String {
    format!("https://bedrock-runtime.{region}.amazonaws.com")
}

/// Checks an upstream's Bedrock fields at config load: on `bedrock`, a region and exactly
/// one kind of credentials; on any other provider, none of them.
pub fn check(u: &UpstreamSettings) -> Result<(), String> {
    let sigv4_fields =
        u.access_key_id.is_some() || u.secret_access_key.is_some() || u.session_token.is_some();
    if u.provider != Provider::Bedrock {
        if u.region.is_some() || sigv4_fields {
            return Err(
                "region, access_key_id, secret_access_key and session_token are for provider \"bedrock\" only"
                    .into(),
            );
        }
        // Other kinds with a default endpoint decide for themselves.
        if u.base_url.is_empty() && matches!(u.provider, Provider::Openai | Provider::Anthropic) {
            return Err("base_url is required".into());
        }
        return Ok(());
    }
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

/// How a Bedrock deployment authenticates.
#[derive(Debug)]
pub enum Auth {
    /// A Bedrock API key, as `Authorization: Bearer …` (marked sensitive).
    Bearer(HeaderValue),
    SigV4(Signer),
}

impl Auth {
    /// The deployment's credentials; `None` when a Bedrock API key is not a valid header
    /// value (every call then fails as a request error, like the other providers' keys).
    pub fn of(u: &UpstreamSettings) -> Option<Auth> {
        if let (Some(id), Some(secret)) = (&u.access_key_id, &u.secret_access_key) {
            let region = u.region.as_deref().unwrap_or("");
            let token = u.session_token.as_ref().map(|t| t.expose());
            return Some(Auth::SigV4(Signer::new(
                id,
                secret.expose(),
                token,
                region,
                "bedrock",
            )));
        }
        let mut v = HeaderValue::from_str(&format!("Bearer {}", u.api_key.expose())).ok()?;
        v.set_sensitive(true);
        Some(Auth::Bearer(v))
    }

    /// The credential headers for a POST of exactly `body` to `url` with JSON content.
    pub fn headers(
        &self,
        url: &str,
        body: &[u8],
        now: SystemTime,
    ) -> Option<Vec<(reqwest::header::HeaderName, HeaderValue)>> {
        match self {
            Auth::Bearer(v) => Some(vec![(AUTHORIZATION, v.clone())]),
            Auth::SigV4(signer) => {
                let signed = signer
                    .sign(
                        "POST",
                        url,
                        &[("content-type", "application/json")],
                        body,
                        now,
                        BodyHashHeader::Omit,
                    )
                    .ok()?;
                signed
                    .into_iter()
                    .map(|(name, value)| {
                        let mut v = HeaderValue::from_str(&value).ok()?;
                        v.set_sensitive(true);
                        Some((reqwest::header::HeaderName::from_static(name), v))
                    })
                    .collect()
            }
        }
    }
}

/// The path of a Converse (or ConverseStream) call for `model_id`, which may be an
/// inference-profile ARN: the id is one path segment, so everything but unreserved
/// characters is percent-encoded (`:` → `%3A`, `/` → `%2F`), as AWS's SDKs send it.
pub fn path(model_id: &str, stream: bool) -> String {
    let id: String = model_id
        .bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect();
    let op = if stream {
        "converse-stream"
    } else {
        "converse"
    };
    format!("/model/{id}/{op}")
}

/// A POST of `body` to `base_url` + `path`, with the content type and the credentials.
/// `None` when the URL does not parse or the request cannot be signed.
pub fn request(
    client: &reqwest::Client,
    auth: &Auth,
    base_url: &str,
    path: &str,
    body: Bytes,
    now: SystemTime,
) -> Option<reqwest::RequestBuilder> {
    let url = reqwest::Url::parse(&format!("{base_url}{path}")).ok()?;
    let headers = auth.headers(url.as_str(), &body, now)?;
    let mut req = client
        .post(url)
        .header(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    for (name, value) in headers {
        req = req.header(name, value);
    }
    Some(req.body(body))
}

/// A Bedrock error body with its type in it: Bedrock names the error in the
/// `x-amzn-ErrorType` header (`ThrottlingException:http://…`) and sends `{"message": …}`;
/// the type is copied into the body as `__type` (AWS's JSON protocols' own field for it),
/// so the retry tiers and `formats::bedrock::read_error` read one place.
pub fn typed_error_body(error_type: Option<&HeaderValue>, body: Bytes) -> Bytes {
    let Some(ty) = error_type.and_then(|v| v.to_str().ok()) else {
        return body;
    };
    let mut v: Value = serde_json::from_slice(&body).unwrap_or_else(|_| serde_json::json!({}));
    let Some(obj) = v.as_object_mut() else {
        return body;
    };
    if !obj.contains_key("__type") {
        obj.insert("__type".into(), Value::String(ty.to_string()));
    }
    Bytes::from(v.to_string())
}

/// The retry tier of a Bedrock error, by its type, where the status alone would mislead:
/// `ServiceQuotaExceededException` comes as a 400 and means the account's quota;
/// `ModelNotReadyException` comes as a 429 and means the model is loading. `None` for a
/// body that is not a typed Bedrock error.
pub fn tier(body: &[u8]) -> Option<Tier> {
    let v: Value = serde_json::from_slice(body).ok()?;
    // Only the field the gateway's client writes from the header: another provider's
    // `code` (or a client's text quoted in a message) cannot pass for a Bedrock type.
    v.get("__type")?;
    let ty = crate::upstream::providers::formats::bedrock::error_type(&v)?;
    Some(match ty {
        "ThrottlingException" => Tier::RateLimited,
        "ServiceQuotaExceededException" => Tier::QuotaExhausted,
        "ModelNotReadyException" | "ServiceUnavailableException" => Tier::Overloaded,
        "ModelTimeoutException" | "InternalServerException" | "ModelErrorException" => {
            Tier::ServerError
        }
        "AccessDeniedException"
        | "UnrecognizedClientException"
        | "InvalidSignatureException"
        | "ExpiredTokenException" => Tier::AuthFailed,
        "ValidationException" | "ResourceNotFoundException" => Tier::ClientError,
        _ => return None,
    })
}

#[cfg(test)]
mod tests;
