//! Vertex AI's access token from a service account: a JWT signed RS256 with the account's
//! private key (`iss` = the account's email, `scope` = cloud-platform, `aud` = its
//! `token_uri`, one hour) is exchanged at the `token_uri` (OAuth 2 JWT-bearer grant) for an
//! access token, which is cached and refreshed five minutes before it expires.
//!
//! One refresh at a time: a request that finds the token stale takes the refresh lock; the
//! others that arrive meanwhile wait on the lock and then find the fresh token, so fifty
//! concurrent requests cost one exchange, not fifty — and when it failed, they share the
//! failure rather than each trying again in turn. A failed exchange fails the attempt
//! as the upstream's: the token endpoint refusing the account (4xx: a revoked or deleted
//! key) as a 401 (the key is disabled, an alert goes out), the endpoint unreachable or
//! failing (5xx, 429, timeout) as a 503 (the key cools down, another serves).
//!
//! Neither the private key nor a token is ever logged: the key lives in `EncodingKey`
//! (no `Debug` of its bytes), the token in a `HeaderValue` marked sensitive.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use chrono::{DateTime, Utc};
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use reqwest::header::{HeaderValue, AUTHORIZATION};
use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::clock::Clock;
use crate::upstream::credential::Authorize;
use crate::upstream::UpstreamError;

/// The OAuth scope Vertex AI takes.
pub const SCOPE: &str = "https://www.googleapis.com/auth/cloud-platform";
pub const GRANT_TYPE: &str = "urn:ietf:params:oauth:grant-type:jwt-bearer";
/// A token is refreshed this long before it expires, so no request carries one that
/// expires in flight.
pub const REFRESH_EARLY: chrono::Duration = chrono::Duration::minutes(5);
/// The longest the token endpoint may take.
const EXCHANGE_TIMEOUT: Duration = Duration::from_secs(30);
/// The most of the token endpoint's answer read: Google's is well under 4 KiB; a longer
/// one is not buffered whole (the exchange fails as the endpoint's 503).
const MAX_ANSWER_BYTES: usize = 64 * 1024;

/// A service-account key file, read and checked once at load.
pub struct ServiceAccount {
    pub client_email: String,
    pub token_uri: String,
    key_id: Option<String>,
    key: EncodingKey,
}

impl std::fmt::Debug for ServiceAccount {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServiceAccount")
            .field("client_email", &self.client_email)
            .field("token_uri", &self.token_uri)
            .field("private_key", &"****")
            .finish()
    }
}

#[derive(Deserialize)]
struct KeyFile {
    #[serde(rename = "type")]
    kind: Option<String>,
    client_email: Option<String>,
    private_key: Option<String>,
    private_key_id: Option<String>,
    token_uri: Option<String>,
}

impl ServiceAccount {
    /// Reads a service-account JSON key file. The messages name the file and the field,
    /// never the key.
    pub fn load(path: &std::path::Path) -> Result<ServiceAccount, String> {
        let shown = path.display();
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read the service-account file {shown}: {e}"))?;
        Self::parse(&text).map_err(|e| format!("service-account file {shown}: {e}"))
    }

    pub fn parse(text: &str) -> Result<ServiceAccount, String> {
        let f: KeyFile = serde_json::from_str(text)
            .map_err(|_| "not a JSON service-account key file".to_string())?;
        if f.kind.as_deref() != Some("service_account") {
            return Err("`type` must be \"service_account\" (a user or external-account credential cannot sign for Vertex AI here)".into());
        }
        let need = |v: Option<String>, name: &str| {
            v.filter(|s| !s.trim().is_empty())
                .ok_or_else(|| format!("`{name}` is missing"))
        };
        let client_email = need(f.client_email, "client_email")?;
        let pem = need(f.private_key, "private_key")?;
        let token_uri = need(f.token_uri, "token_uri")?;
        let key = EncodingKey::from_rsa_pem(pem.as_bytes())
            .map_err(|_| "`private_key` is not an RSA private key in PEM".to_string())?;
        Ok(ServiceAccount {
            client_email,
            token_uri,
            key_id: f.private_key_id,
            key,
        })
    }

    /// The signed assertion for the token endpoint, issued at `now`, valid one hour.
    pub fn assertion(&self, now: DateTime<Utc>) -> Result<String, jsonwebtoken::errors::Error> {
        #[derive(Serialize)]
        struct Claims<'a> {
            iss: &'a str,
            scope: &'a str,
            aud: &'a str,
            iat: i64,
            exp: i64,
        }
        let mut header = Header::new(Algorithm::RS256);
        header.kid = self.key_id.clone();
        let iat = now.timestamp();
        let claims = Claims {
            iss: &self.client_email,
            scope: SCOPE,
            aud: &self.token_uri,
            iat,
            exp: iat + 3600,
        };
        jsonwebtoken::encode(&header, &claims, &self.key)
    }
}

#[derive(Clone)]
struct Token {
    /// `Bearer …`, marked sensitive.
    header: HeaderValue,
    /// When to stop using it (its expiry less `REFRESH_EARLY`).
    refresh_at: DateTime<Utc>,
    /// When it expires: a caller that waited on the exchange that fetched it uses it
    /// until then, even when it lives less than `REFRESH_EARLY`.
    expires_at: DateTime<Utc>,
}

/// Vertex AI's bearer tokens for one service account.
pub struct TokenSource {
    account: Result<ServiceAccount, String>,
    clock: Arc<dyn Clock>,
    current: parking_lot::RwLock<Option<Token>>,
    /// Held by the one refresh in flight; holds the last exchange's failure.
    refresh: tokio::sync::Mutex<LastExchange>,
    /// How many exchanges have finished (`LastExchange::seq`, readable without the lock).
    exchanges: std::sync::atomic::AtomicU64,
}

/// The last exchange: its number, and its failure if it failed. A caller that waited for
/// the lock while an exchange ran shares its outcome: a failing token endpoint is asked
/// once by all who were waiting, not once each, one after another.
#[derive(Default)]
struct LastExchange {
    seq: u64,
    failure: Option<(u16, Bytes)>,
}

impl std::fmt::Debug for TokenSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenSource")
            .field("account", &self.account.as_ref().map(|a| &a.client_email))
            .finish_non_exhaustive()
    }
}

#[derive(Deserialize)]
struct TokenAnswer {
    access_token: String,
    /// Seconds; a JSON number, which OAuth does not require to be whole.
    expires_in: Option<f64>,
}

impl TokenSource {
    /// A source for `account`; an account that failed to load makes every attempt fail as
    /// a 401 naming why.
    pub fn new(account: Result<ServiceAccount, String>, clock: Arc<dyn Clock>) -> TokenSource {
        TokenSource {
            account,
            clock,
            current: parking_lot::RwLock::new(None),
            refresh: tokio::sync::Mutex::new(LastExchange::default()),
            exchanges: std::sync::atomic::AtomicU64::new(0),
        }
    }

    /// The `Authorization` value for the next attempt: the cached token while fresh, else
    /// one refresh (shared by every caller waiting meanwhile).
    pub async fn bearer(&self, http: &reqwest::Client) -> Result<HeaderValue, UpstreamError> {
        if let Some(h) = self.fresh() {
            return Ok(h);
        }
        let seen = self.exchanges.load(Ordering::Acquire);
        let mut last = self.refresh.lock().await;
        if let Some(h) = self.fresh() {
            return Ok(h);
        }
        if last.seq != seen {
            if let Some((status, body)) = &last.failure {
                return Err(UpstreamError::Status {
                    status: *status,
                    body: body.clone(),
                    retry_after: None,
                });
            }
            // The exchange waited on succeeded with a token that lives less than
            // `REFRESH_EARLY`: it is shared while it is valid, not fetched again by each.
            let now = self.clock.now();
            if let Some(t) = self.current.read().as_ref().filter(|t| now < t.expires_at) {
                return Ok(t.header.clone());
            }
        }
        let result = self.exchange(http).await;
        last.seq += 1;
        self.exchanges.store(last.seq, Ordering::Release);
        last.failure = match &result {
            Err(UpstreamError::Status { status, body, .. }) => Some((*status, body.clone())),
            _ => None,
        };
        let token = result?;
        let header = token.header.clone();
        *self.current.write() = Some(token);
        Ok(header)
    }

    fn fresh(&self) -> Option<HeaderValue> {
        let now = self.clock.now();
        self.current
            .read()
            .as_ref()
            .filter(|t| now < t.refresh_at)
            .map(|t| t.header.clone())
    }

    async fn exchange(&self, http: &reqwest::Client) -> Result<Token, UpstreamError> {
        let account = self.account.as_ref().map_err(|e| failed(401, e))?;
        let now = self.clock.now();
        let assertion = account
            .assertion(now)
            .map_err(|_| failed(401, "the service account's key cannot sign"))?;
        let sent = http
            .post(&account.token_uri)
            .form(&[
                ("grant_type", GRANT_TYPE),
                ("assertion", assertion.as_str()),
            ])
            .timeout(EXCHANGE_TIMEOUT)
            .send()
            .await;
        let resp = match sent {
            Ok(r) => r,
            Err(_) => return Err(failed(503, "the token endpoint could not be reached")),
        };
        let status = resp.status().as_u16();
        let body = match read_capped(resp).await {
            Some(body) => body,
            None => return Err(failed(503, "the token endpoint's answer is too large")),
        };
        if !(200..300).contains(&status) {
            // The OAuth error code (`invalid_grant`…) says why; its description can quote
            // the account, never the key, but is not passed on: the code is enough.
            let code = serde_json::from_slice::<serde_json::Value>(&body)
                .ok()
                .and_then(|v| v.get("error")?.as_str().map(str::to_string))
                .unwrap_or_else(|| format!("HTTP {status}"));
            let why = format!("the token endpoint refused the service account ({code})");
            return Err(match status {
                429 | 500.. => failed(503, &format!("the token endpoint failed ({code})")),
                _ => failed(401, &why),
            });
        }
        let answer: TokenAnswer = serde_json::from_slice(&body)
            .map_err(|_| failed(503, "the token endpoint's answer holds no access token"))?;
        let mut header = HeaderValue::from_str(&format!("Bearer {}", answer.access_token))
            .map_err(|_| {
                failed(
                    503,
                    "the token endpoint's access token is not a header value",
                )
            })?;
        header.set_sensitive(true);
        let seconds = answer.expires_in.unwrap_or(3600.0);
        let seconds = if seconds.is_finite() {
            seconds.clamp(0.0, 86_400.0) as i64
        } else {
            0
        };
        let lifetime = chrono::Duration::seconds(seconds);
        Ok(Token {
            header,
            refresh_at: now + lifetime - REFRESH_EARLY,
            expires_at: now + lifetime,
        })
    }
}

/// The answer's body, at most `MAX_ANSWER_BYTES` of it: `None` when it is longer (the
/// connection is dropped there). A body that breaks off reads as what arrived.
async fn read_capped(mut resp: reqwest::Response) -> Option<Bytes> {
    if resp
        .content_length()
        .is_some_and(|n| n > MAX_ANSWER_BYTES as u64)
    {
        return None;
    }
    let mut body = bytes::BytesMut::new();
    while let Ok(Some(chunk)) = resp.chunk().await {
        if body.len() + chunk.len() > MAX_ANSWER_BYTES {
            return None;
        }
        body.extend_from_slice(&chunk);
    }
    Some(body.freeze())
}

/// Vertex AI's credential hook (`Credential::Hook`): the bearer token added at send time.
impl Authorize for TokenSource {
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
}

/// A failed exchange as an upstream answer with that status, in Google's error shape, so
/// the retry tiers and the client's error see what they would of the upstream itself.
fn failed(status: u16, why: &str) -> UpstreamError {
    let google = if status == 401 {
        "UNAUTHENTICATED"
    } else {
        "UNAVAILABLE"
    };
    let body = json!({"error": {"code": status, "status": google,
        "message": format!("Vertex AI access token: {why}.")}});
    UpstreamError::Status {
        status,
        body: Bytes::from(body.to_string()),
        retry_after: None,
    }
}
