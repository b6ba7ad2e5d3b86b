//! Azure OpenAI's transport: OpenAI's wire format at Azure's URLs, with Azure's
//! credentials. The classic path names the deployment and needs a dated `api-version`
//! (`/openai/deployments/{deployment}/chat/completions?api-version=2024-10-21`); the v1 GA
//! path is OpenAI's own under `/openai/v1` (`api_version = "v1"`, no version parameter, the
//! deployment's name as the body's `model`; `preview` adds `?api-version=preview`). The key
//! goes in the `api-key` header, or an Entra ID token from the client-credentials flow in
//! `Authorization: Bearer` (`EntraToken`).

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use parking_lot::RwLock;
use reqwest::header::{HeaderName, HeaderValue, AUTHORIZATION, CONTENT_TYPE};
use tokio::time::Instant;

use crate::config::{EntraSettings, Secret, UpstreamSettings};
use crate::pipeline::request::Endpoint;
use crate::upstream::credential::{Authorize, Credential};
use crate::upstream::UpstreamError;

/// The URL of an endpoint for one Azure deployment; `None` without an `api_version`
/// (refused at load) or for a base URL that cannot take a path.
pub fn url(
    u: &UpstreamSettings,
    base: &str,
    endpoint: Endpoint,
    deployment: &str,
) -> Option<reqwest::Url> {
    let op: &[&str] = match endpoint {
        Endpoint::Chat | Endpoint::Messages | Endpoint::Responses => &["chat", "completions"],
        Endpoint::Completions => &["completions"],
        Endpoint::Embeddings => &["embeddings"],
    };
    let version = u.api_version.as_deref()?;
    // One path segment: the URL builder drops `.` and `..` (refused at load too).
    if matches!(deployment, "." | "..") {
        return None;
    }
    let mut url = reqwest::Url::parse(base).ok()?;
    {
        let mut path = url.path_segments_mut().ok()?;
        path.pop_if_empty();
        match version {
            "v1" | "preview" => path.extend(["openai", "v1"]),
            _ => path.extend(["openai", "deployments", deployment]),
        };
        path.extend(op);
    }
    if version != "v1" {
        url.query_pairs_mut().append_pair("api-version", version);
    }
    Some(url)
}

/// `api-key: <key>`, or the Entra ID token hook when `entra` is set.
pub fn credential(u: &UpstreamSettings) -> Credential {
    match &u.entra {
        Some(e) => match EntraToken::new(e) {
            Some(t) => Credential::Hook(std::sync::Arc::new(t)),
            None => Credential::Invalid,
        },
        None => Credential::header(HeaderName::from_static("api-key"), u.api_key.expose()),
    }
}

/// The most a token endpoint's answer may be: a token is a few kilobytes.
const TOKEN_BODY_LIMIT: usize = 64 * 1024;

/// How long a refresh made in the background may take before it is given up (and the next
/// request starts another).
const REFRESH_BOUND: Duration = Duration::from_secs(30);

/// An Entra ID access token for one app registration, fetched with the client-credentials
/// flow and cached. It is refreshed early — when less than a fifth of its lifetime or five
/// minutes (whichever is less) is left — in the background, one fetch at a time, while
/// requests go on with the old token, still valid: a token endpoint that fails or hangs
/// then holds no request. Only requests that have no valid token wait, for one fetch
/// between them rather than each asking. A token Azure refuses (`Authorize::refused`) is
/// dropped so that the next request fetches another. Token lifetimes are the far side's
/// wall time, so they are measured on the monotonic clock, not the gateway's `Clock`.
pub struct EntraToken {
    inner: std::sync::Arc<Inner>,
}

struct Inner {
    url: reqwest::Url,
    client_id: String,
    client_secret: Secret,
    scope: String,
    current: RwLock<Option<Token>>,
    refreshing: std::sync::Arc<tokio::sync::Mutex<()>>,
}

#[derive(Clone)]
struct Token {
    header: HeaderValue,
    refresh_at: Instant,
    expires_at: Instant,
}

impl std::fmt::Debug for EntraToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EntraToken")
            .field("url", &self.inner.url.as_str())
            .field("client_id", &self.inner.client_id)
            .finish_non_exhaustive()
    }
}

impl EntraToken {
    /// `None` when the authority and tenant do not make a URL (refused at load).
    pub fn new(e: &EntraSettings) -> Option<EntraToken> {
        let mut url = reqwest::Url::parse(&e.authority).ok()?;
        url.path_segments_mut().ok()?.pop_if_empty().extend([
            e.tenant_id.as_str(),
            "oauth2",
            "v2.0",
            "token",
        ]);
        Some(EntraToken {
            inner: std::sync::Arc::new(Inner {
                url,
                client_id: e.client_id.clone(),
                client_secret: e.client_secret.clone(),
                scope: e.scope.clone(),
                current: RwLock::new(None),
                refreshing: std::sync::Arc::new(tokio::sync::Mutex::new(())),
            }),
        })
    }

    /// The token endpoint's URL (checked against the SSRF guard at load).
    pub fn endpoint(&self) -> &reqwest::Url {
        &self.inner.url
    }

    /// The `Authorization` value to send now.
    pub async fn bearer(&self, http: &reqwest::Client) -> Result<HeaderValue, UpstreamError> {
        let inner = &self.inner;
        let now = Instant::now();
        let current = inner.current.read().clone();
        if let Some(t) = current {
            if now < t.refresh_at {
                return Ok(t.header);
            }
            if now < t.expires_at {
                // Still valid: replaced in the background, this request not held by it.
                if let Ok(one) = inner.refreshing.clone().try_lock_owned() {
                    let (inner, http) = (inner.clone(), http.clone());
                    tokio::spawn(async move {
                        let _one = one;
                        if inner.fresh().is_some() {
                            return;
                        }
                        match tokio::time::timeout(REFRESH_BOUND, inner.fetch(&http)).await {
                            Ok(Ok(t)) => *inner.current.write() = Some(t),
                            Ok(Err(e)) => tracing::warn!(error = %e, "Entra ID token refresh failed; the current token is still valid"),
                            Err(_) => tracing::warn!("Entra ID token refresh got no answer; the current token is still valid"),
                        }
                    });
                }
                return Ok(t.header);
            }
        }
        let _one = inner.refreshing.lock().await;
        // Another request may have fetched one while this one waited.
        if let Some(h) = inner.fresh() {
            return Ok(h);
        }
        match inner.fetch(http).await {
            Ok(t) => {
                let h = t.header.clone();
                *inner.current.write() = Some(t);
                Ok(h)
            }
            Err(e) => {
                let now = Instant::now();
                let old = inner.current.read().clone().filter(|t| now < t.expires_at);
                match old {
                    Some(t) => {
                        tracing::warn!(error = %e, "Entra ID token refresh failed; the current token is still valid");
                        Ok(t.header)
                    }
                    None => Err(e),
                }
            }
        }
    }
}

impl Inner {
    fn fresh(&self) -> Option<HeaderValue> {
        let now = Instant::now();
        self.current
            .read()
            .as_ref()
            .filter(|t| now < t.refresh_at)
            .map(|t| t.header.clone())
    }

    async fn fetch(&self, http: &reqwest::Client) -> Result<Token, UpstreamError> {
        let asked = Instant::now();
        let form = url::form_urlencoded::Serializer::new(String::new())
            .append_pair("grant_type", "client_credentials")
            .append_pair("client_id", &self.client_id)
            .append_pair("client_secret", self.client_secret.expose())
            .append_pair("scope", &self.scope)
            .finish();
        let unreachable = |what: &str| UpstreamError::Connect(format!("Entra ID token: {what}"));
        let resp = http
            .post(self.url.clone())
            .header(CONTENT_TYPE, "application/x-www-form-urlencoded")
            .body(form)
            .send()
            .await
            .map_err(|_| unreachable("no answer"))?;
        let status = resp.status().as_u16();
        // The endpoint's own words can name the tenant or the app: none of it goes on.
        if matches!(status, 400 | 401 | 403) {
            return Err(UpstreamError::Status {
                status: 401,
                body: Bytes::from_static(
                    br#"{"error":{"message":"the Entra ID token endpoint refused the client credentials"}}"#,
                ),
                retry_after: None,
            });
        }
        if !(200..300).contains(&status) {
            return Err(unreachable(&format!("answered {status}")));
        }
        let body = read_capped(resp)
            .await
            .ok_or_else(|| unreachable("unreadable answer"))?;
        let v: serde_json::Value =
            serde_json::from_slice(&body).map_err(|_| unreachable("answer is not JSON"))?;
        let token = v
            .get("access_token")
            .and_then(serde_json::Value::as_str)
            .ok_or_else(|| unreachable("no access_token"))?;
        // Entra's v2 endpoint sends a number; v1 sent a string; other token services a
        // fraction. A negative one is the shortest life; only an absent or unreadable one
        // is taken for Entra's hour (a token Azure refuses earlier is replaced on its 401).
        let lifetime = v
            .get("expires_in")
            .and_then(|e| e.as_f64().or_else(|| e.as_str()?.trim().parse().ok()))
            .filter(|s: &f64| s.is_finite())
            .unwrap_or(3600.0)
            .clamp(1.0, 24.0 * 3600.0);
        let lifetime = Duration::from_secs_f64(lifetime);
        let early = (lifetime / 5).min(Duration::from_secs(300));
        let mut header = HeaderValue::from_str(&format!("Bearer {token}"))
            .map_err(|_| unreachable("access_token is not a header value"))?;
        header.set_sensitive(true);
        Ok(Token {
            header,
            refresh_at: asked + lifetime - early,
            expires_at: asked + lifetime - (lifetime / 20).min(Duration::from_secs(30)),
        })
    }
}

async fn read_capped(mut resp: reqwest::Response) -> Option<Bytes> {
    let mut buf = BytesMut::new();
    while let Some(chunk) = resp.chunk().await.ok()? {
        if buf.len() + chunk.len() > TOKEN_BODY_LIMIT {
            return None;
        }
        buf.extend_from_slice(&chunk);
    }
    Some(buf.freeze())
}

impl Authorize for EntraToken {
    fn authorize<'a>(
        &'a self,
        http: &'a reqwest::Client,
        mut req: reqwest::Request,
    ) -> Pin<Box<dyn Future<Output = Result<reqwest::Request, UpstreamError>> + Send + 'a>> {
        Box::pin(async move {
            let bearer = self.bearer(http).await?;
            req.headers_mut().insert(AUTHORIZATION, bearer);
            Ok(req)
        })
    }

    fn refused(&self, sent: &reqwest::header::HeaderMap) {
        let mut current = self.inner.current.write();
        if current
            .as_ref()
            .is_some_and(|t| sent.get(AUTHORIZATION) == Some(&t.header))
        {
            *current = None;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn azure(version: &str) -> UpstreamSettings {
        UpstreamSettings {
            id: "az".into(),
            provider: crate::config::Provider::AzureOpenai,
            base_url: "https://res.openai.azure.com".into(),
            api_version: Some(version.into()),
            ..Default::default()
        }
    }

    #[test]
    fn the_classic_path_names_the_deployment_and_the_version() {
        let u = azure("2024-10-21");
        let url = |e| url(&u, &u.base_url, e, "my gpt/4o").unwrap().to_string();
        assert_eq!(
            url(Endpoint::Chat),
            "https://res.openai.azure.com/openai/deployments/my%20gpt%2F4o/chat/completions?api-version=2024-10-21"
        );
        assert_eq!(url(Endpoint::Messages), url(Endpoint::Chat));
        assert!(
            url(Endpoint::Embeddings).ends_with("/my%20gpt%2F4o/embeddings?api-version=2024-10-21")
        );
        let v1 = azure("v1");
        assert_eq!(
            super::url(&v1, "https://res.openai.azure.com/", Endpoint::Chat, "d")
                .unwrap()
                .as_str(),
            "https://res.openai.azure.com/openai/v1/chat/completions"
        );
        let preview = azure("preview");
        assert_eq!(
            super::url(&preview, &preview.base_url, Endpoint::Chat, "d")
                .unwrap()
                .as_str(),
            "https://res.openai.azure.com/openai/v1/chat/completions?api-version=preview"
        );
        let mut none = azure("x");
        none.api_version = None;
        assert!(super::url(&none, &none.base_url, Endpoint::Chat, "d").is_none());
    }

    #[test]
    fn the_token_endpoint_is_the_tenants() {
        let t = EntraToken::new(&EntraSettings {
            tenant_id: "tenant-1".into(),
            client_id: "app".into(),
            client_secret: Secret(secrecy::SecretString::from("s3cret-value")),
            authority: "https://login.microsoftonline.com/".into(),
            scope: "https://cognitiveservices.azure.com/.default".into(),
        })
        .unwrap();
        assert_eq!(
            t.endpoint().as_str(),
            "https://login.microsoftonline.com/tenant-1/oauth2/v2.0/token"
        );
        assert!(!format!("{t:?}").contains("s3cret"));
    }
}
