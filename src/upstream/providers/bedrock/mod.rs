//! The `bedrock` provider's transport: where a Converse call goes (`url`: the model in the
//! path, built once at start through `providers::url`), how it is authenticated (a Bedrock
//! API key as a static header, or SigV4 as a credential hook: `credential`), how its errors are typed for the retry tiers,
//! and how its binary event stream is framed (`eventstream`). The wire format itself
//! (bodies, answers, events, errors) is `formats::bedrock`.
//!
//! Config (`[[upstreams]] provider = "bedrock"`): `region` is required; the credentials are
//! either SigV4 (`access_key_id` + `secret_access_key`, optional `session_token`) or a
//! Bedrock API key in `api_key` (sent as `Authorization: Bearer …`), never both; `base_url`
//! defaults to `https://bedrock-runtime.{region}.amazonaws.com` (the checks and the default
//! are the config's: `config::check_bedrock`, `bedrock_base_url`).

pub mod eventstream;
pub mod sigv4;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::SystemTime;

use bytes::Bytes;
use reqwest::header::{HeaderName, HeaderValue, AUTHORIZATION};
use serde_json::Value;

use crate::config::UpstreamSettings;
use crate::upstream::credential::{Authorize, Credential};
use crate::upstream::retry::Tier;
use crate::upstream::UpstreamError;
use sigv4::{BodyHashHeader, Signer};

/// `Authorization: Bearer <Bedrock API key>`, a header built once; or SigV4, a credential
/// hook that signs each request's exact bytes at send time (`SigV4`).
pub fn credential(u: &UpstreamSettings) -> Credential {
    match sigv4(u) {
        Some(signer) => Credential::Hook(Arc::new(signer)),
        None => Credential::header(AUTHORIZATION, &format!("Bearer {}", u.api_key.expose())),
    }
}

/// The upstream's SigV4 signer, when it is configured with AWS credentials.
pub fn sigv4(u: &UpstreamSettings) -> Option<SigV4> {
    let (id, secret) = (u.access_key_id.as_ref()?, u.secret_access_key.as_ref()?);
    let region = u.region.as_deref().unwrap_or("");
    let token = u.session_token.as_ref().map(|t| t.expose());
    Some(SigV4(Signer::new(
        id,
        secret.expose(),
        token,
        region,
        "bedrock",
    )))
}

/// SigV4 for service `bedrock` in the upstream's region (the secret stays in `Signer`,
/// whose `Debug` shows none of it).
#[derive(Debug)]
pub struct SigV4(Signer);

impl SigV4 {
    /// The signature headers for a POST of exactly `body` to `url` with JSON content,
    /// marked sensitive; `None` when the request cannot be signed.
    pub fn headers(
        &self,
        url: &str,
        body: &[u8],
        now: SystemTime,
    ) -> Option<Vec<(HeaderName, HeaderValue)>> {
        let signed = self
            .0
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
                Some((HeaderName::from_static(name), v))
            })
            .collect()
    }
}

/// Signs the request as `UpstreamClient::post` built it: its URL, its content type and its
/// body's exact bytes (a body that is not in memory cannot be signed: a request error).
impl Authorize for SigV4 {
    fn authorize<'a>(
        &'a self,
        _http: &'a reqwest::Client,
        mut req: reqwest::Request,
    ) -> Pin<Box<dyn Future<Output = Result<reqwest::Request, UpstreamError>> + Send + 'a>> {
        Box::pin(async move {
            let unsigned = || UpstreamError::Connect("request".into());
            let body = match req.body() {
                Some(b) => b.as_bytes().ok_or_else(unsigned)?,
                None => &[],
            };
            let headers = self
                .headers(req.url().as_str(), body, SystemTime::now())
                .ok_or_else(unsigned)?;
            for (name, value) in headers {
                req.headers_mut().insert(name, value);
            }
            Ok(req)
        })
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

/// The URL of a Converse call to `model_id` (streamed or not) at `base`.
/// None for an id that is no path segment of its own: empty, or a dot-segment (`.`,
/// `..`), which a URL parser resolves, encoded or not, to another path.
pub fn url(base: &str, model_id: &str, stream: bool) -> Option<reqwest::Url> {
    if matches!(model_id, "" | "." | "..") {
        return None;
    }
    reqwest::Url::parse(&format!("{base}{}", path(model_id, stream))).ok()
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
