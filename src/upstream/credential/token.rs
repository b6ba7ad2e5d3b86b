//! An OAuth bearer token fetched from a token endpoint, cached and refreshed: Azure's Entra
//! ID (client-credentials form) and Vertex AI (a service account's signed JWT) are the same
//! mechanism with a different request, so the request is a strategy (`Exchange`) and
//! everything else — the cache, the refresh, the failure rules — is `TokenSource`, once.
//!
//! Timing. A token announced to live L is used until L less a twentieth (at most 30 s),
//! so none expires in flight, and replaced from L less a fifth (at most five minutes) on:
//! in that window the request that notices starts the exchange in the background and every
//! request goes on with the current token. Only requests with no usable token wait, on
//! the one exchange in flight. That exchange runs in a task of its own, bounded by
//! `EXCHANGE_BOUND` alone: each waiter bounds only its own wait (its first-byte bound, its
//! deadline), so a request that leaves or runs out of time does not cancel the exchange
//! the others wait for, and the next request finds its token. Times are the gateway's
//! `Clock` (a host that was suspended sees its tokens expired, not hours younger).
//!
//! Failure rules, the same for every issuer:
//! - the token endpoint refuses the credentials (400/401/403: a wrong secret, a revoked or
//!   deleted key) or the local credential cannot make a request (an unreadable key file):
//!   a 401 for the deployment — the `AuthFailed` tier: the key is disabled, an alert goes
//!   out, the next key serves;
//! - but an assertion signed with this host's clock (`Exchange::stamped`: Vertex's JWT)
//!   refused for its time (`invalid_grant` naming `iat`/`exp` or the timeframe) is the
//!   host's fault, not the key's: a connection error as below, logged as an error that
//!   the clock may be wrong — a clock that steps must not disable every key until an
//!   admin re-enables them;
//! - the endpoint cannot be reached, times out (`EXCHANGE_BOUND`), fails (429, 5xx) or
//!   answers something unusable (not JSON, no `access_token`, a token that is no header
//!   value, an `expires_in` under a second or not a number, an answer over 64 KiB): a
//!   connection error — the `ServerError` tier: it counts toward the deployment's breaker
//!   and the next deployment or fallback serves; with none left the client gets 502
//!   `upstream_error`. The upstream is unusable, not its key.
//! - every request that waited on an exchange shares its outcome: a failing endpoint is
//!   asked once by all who were waiting, not once each in turn; the next request after
//!   the failure asks again.
//! - a refresh that fails while the current token is usable leaves it in use (logged).
//! - a token the upstream answers 401 to (`refused`) is dropped, so that `client::post`'s
//!   one retry fetches another; a second 401 is the upstream's answer (never a loop).
//!
//! No secret is logged or printed: the exchange's `Debug` shows no key, the token lives in
//! a `HeaderValue` marked sensitive, and the endpoint's own words (which can name the
//! tenant or the account) are reduced to its OAuth error code.

use std::sync::Arc;
use std::time::Duration;

use std::future::Future;
use std::pin::Pin;

use bytes::{Bytes, BytesMut};
use chrono::{DateTime, Utc};
use reqwest::header::{HeaderValue, AUTHORIZATION};
use tokio::sync::watch;

use super::Authorize;
use crate::clock::Clock;
use crate::upstream::UpstreamError;

/// The longest one exchange may take, in the background or not.
pub const EXCHANGE_BOUND: Duration = Duration::from_secs(30);
/// The most of a token endpoint's answer read: a token is a few kilobytes.
const MAX_ANSWER_BYTES: usize = 64 * 1024;
/// The longest lifetime believed: a longer announced one is cut to this.
const MAX_LIFETIME: f64 = 24.0 * 3600.0;
/// The shortest lifetime taken: a token endpoint that announces less (a millisecond) is
/// broken the way one announcing zero is — each request would need a token of its own, an
/// exchange per request. From a second up, the exchanges are bounded by time, not by load.
const MIN_LIFETIME: f64 = 1.0;
/// The lifetime of a token whose answer gives none (OAuth's `expires_in` is optional;
/// Entra and Google issue tokens of an hour).
const DEFAULT_LIFETIME: f64 = 3600.0;

/// How one issuer's token is asked for.
pub trait Exchange: Send + Sync + std::fmt::Debug + 'static {
    /// Who issues the token, for messages: "Entra ID", "Vertex AI".
    fn issuer(&self) -> &'static str;

    /// The token request made at `now` (the caller adds the time bound and sends it), or
    /// why the local credential cannot make one.
    fn request(
        &self,
        http: &reqwest::Client,
        now: DateTime<Utc>,
    ) -> Result<reqwest::RequestBuilder, String>;

    /// Whether the request carries an assertion stamped with this host's clock (`iat`,
    /// `exp`): a refusal that names its time then says the clock is off, not the key.
    fn stamped(&self) -> bool {
        false
    }
}

#[derive(Clone)]
struct Token {
    /// `Bearer …`, marked sensitive.
    header: HeaderValue,
    /// From when it is replaced in the background.
    refresh_at: DateTime<Utc>,
    /// Until when it is sent.
    use_until: DateTime<Utc>,
}

/// What an exchange in flight ends with, told to every request waiting for it: `None` until
/// it ends.
type Outcome = Option<Result<Token, UpstreamError>>;

struct Inner {
    exchange: Box<dyn Exchange>,
    clock: Arc<dyn Clock>,
    current: parking_lot::RwLock<Option<Token>>,
    /// The exchange in flight, if any: where its outcome is told. Set and cleared under
    /// this lock, so that at most one runs.
    flight: parking_lot::Mutex<Option<watch::Receiver<Outcome>>>,
}

/// A cached bearer token from one issuer (see the module doc for the rules).
#[derive(Clone)]
pub struct TokenSource {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for TokenSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenSource")
            .field("exchange", &self.inner.exchange)
            .finish_non_exhaustive()
    }
}

impl TokenSource {
    pub fn new(exchange: Box<dyn Exchange>, clock: Arc<dyn Clock>) -> TokenSource {
        TokenSource {
            inner: Arc::new(Inner {
                exchange,
                clock,
                current: parking_lot::RwLock::new(None),
                flight: parking_lot::Mutex::new(None),
            }),
        }
    }

    /// The `Authorization` value to send now.
    pub async fn bearer(&self, http: &reqwest::Client) -> Result<HeaderValue, UpstreamError> {
        let inner = &self.inner;
        let now = inner.clock.now();
        let current = inner.current.read().clone();
        if let Some(t) = current.filter(|t| now < t.use_until) {
            if now >= t.refresh_at {
                self.refresh_in_background(http);
            }
            return Ok(t.header);
        }
        let mut outcome = {
            let mut flight = inner.flight.lock();
            // An exchange ended since the look above: its token.
            if let Some(h) = inner.usable() {
                return Ok(h);
            }
            match flight.as_ref().filter(|rx| alive(rx)) {
                Some(rx) => rx.clone(),
                None => self.start(http, &mut flight),
            }
        };
        // Only this wait is this request's: the caller bounds it by its first-byte bound and
        // deadline, and a request that leaves leaves the exchange running for the others.
        let told = outcome
            .wait_for(Option::is_some)
            .await
            .ok()
            .and_then(|o| o.clone());
        match told {
            Some(Ok(t)) => Ok(t.header),
            Some(Err(e)) => Err(e),
            // The task ended without telling: its runtime stopped under it.
            None => Err(inner.unavailable("the token exchange was stopped")),
        }
    }

    /// The upstream answered 401 to a request sent with `sent`: if that is the cached
    /// token, it is dropped so that the next `bearer` fetches another.
    pub fn refused(&self, sent: &HeaderValue) {
        let mut current = self.inner.current.write();
        if current.as_ref().is_some_and(|t| t.header == *sent) {
            *current = None;
        }
    }

    /// Starts one exchange unless one is in flight; nobody waits for it.
    fn refresh_in_background(&self, http: &reqwest::Client) {
        let mut flight = self.inner.flight.lock();
        let now = self.inner.clock.now();
        // Replaced meanwhile by an exchange that ended since the caller looked.
        let due = self
            .inner
            .current
            .read()
            .as_ref()
            .is_none_or(|t| now >= t.refresh_at);
        if flight.as_ref().is_none_or(|rx| !alive(rx)) && due {
            self.start(http, &mut flight);
        }
    }

    /// One exchange in a task of its own, `flight` (its lock held) set to it until it ends:
    /// it runs to its end (`EXCHANGE_BOUND`) whoever waits for it, so a request that gives
    /// up does not waste it and the next one does not start over.
    fn start(
        &self,
        http: &reqwest::Client,
        flight: &mut Option<watch::Receiver<Outcome>>,
    ) -> watch::Receiver<Outcome> {
        let (tx, rx) = watch::channel(None);
        *flight = Some(rx.clone());
        let (inner, http) = (self.inner.clone(), http.clone());
        tokio::spawn(async move {
            let result = inner.run(&http).await;
            if let Err(e) = &result {
                if inner.usable().is_some() {
                    tracing::warn!(issuer = inner.exchange.issuer(), error = %e,
                        "token refresh failed; the current token is still used while valid");
                }
            }
            // Cleared before the outcome is told: from here a request that finds no usable
            // token (this exchange failed) asks again, while every waiter gets this outcome.
            *inner.flight.lock() = None;
            tx.send_replace(Some(result));
        });
        rx
    }
}

/// Whether the exchange `rx` tells of may still tell: its task ended without telling when
/// its runtime stopped under it (a worker's, at the shutdown) or it panicked, and a marker
/// left so would have every later request wait on it and fail, the hook kept across
/// rebuilds, until a restart (s30 diff attack F5).
fn alive(rx: &watch::Receiver<Outcome>) -> bool {
    rx.has_changed().is_ok()
}

/// The bearer token added at send time; a refused one dropped for `post`'s one retry.
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

    fn refused(&self, sent: &HeaderValue) {
        TokenSource::refused(self, sent);
    }

    fn cached(&self) -> bool {
        true
    }
}

impl Inner {
    fn usable(&self) -> Option<HeaderValue> {
        let now = self.clock.now();
        self.current
            .read()
            .as_ref()
            .filter(|t| now < t.use_until)
            .map(|t| t.header.clone())
    }

    /// One exchange, bounded: its token, if it made one, is the current one.
    async fn run(&self, http: &reqwest::Client) -> Result<Token, UpstreamError> {
        let result = match tokio::time::timeout(EXCHANGE_BOUND, self.fetch(http)).await {
            Ok(r) => r,
            Err(_) => Err(self.unavailable("the token endpoint did not answer in time")),
        };
        if let Ok(t) = &result {
            *self.current.write() = Some(t.clone());
        }
        result
    }

    async fn fetch(&self, http: &reqwest::Client) -> Result<Token, UpstreamError> {
        let asked = self.clock.now();
        let req = self
            .exchange
            .request(http, asked)
            .map_err(|why| self.refused(&why))?;
        let resp = req
            .timeout(EXCHANGE_BOUND)
            .send()
            .await
            .map_err(|_| self.unavailable("the token endpoint could not be reached"))?;
        let status = resp.status().as_u16();
        let body = read_capped(resp)
            .await
            .ok_or_else(|| self.unavailable("the token endpoint's answer is too large or cut"))?;
        if matches!(status, 400 | 401 | 403) {
            if self.exchange.stamped() && refused_for_its_time(&body) {
                tracing::error!(
                    issuer = self.exchange.issuer(),
                    host_time = %asked,
                    "the token endpoint refused the assertion for its time: this host's clock \
                     may be wrong (check NTP); the key is kept, the deployment counts a failure"
                );
                return Err(self.unavailable(
                    "the token endpoint refused the assertion for its time (this host's clock may be wrong)",
                ));
            }
            let code = oauth_code(&body).unwrap_or_else(|| format!("HTTP {status}"));
            return Err(self.refused(&format!(
                "the token endpoint refused the credentials ({code})"
            )));
        }
        if !(200..300).contains(&status) {
            return Err(self.unavailable(&format!("the token endpoint answered {status}")));
        }
        let (token, lifetime) = read_answer(&body).map_err(|what| self.unavailable(what))?;
        let mut header = HeaderValue::from_str(&format!("Bearer {token}"))
            .map_err(|_| self.unavailable("the access token is not a header value"))?;
        header.set_sensitive(true);
        let life = chrono::Duration::milliseconds((lifetime * 1000.0) as i64);
        let early = (life / 5).min(chrono::Duration::minutes(5));
        let margin = (life / 20).min(chrono::Duration::seconds(30));
        let use_until = asked + life - margin;
        // Counted from the asking: a token whose life ended on the way (a slow endpoint
        // announcing a second) cannot be cached either — an exchange per request.
        if use_until <= self.clock.now() {
            return Err(self.unavailable("the token's lifetime ended before its answer arrived"));
        }
        Ok(Token {
            header,
            refresh_at: asked + life - early,
            use_until,
        })
    }

    /// The credentials refused: a 401 for the deployment.
    fn refused(&self, why: &str) -> UpstreamError {
        let message = format!("{} access token: {why}.", self.exchange.issuer());
        let body = serde_json::json!({"error": {"code": 401, "status": "UNAUTHENTICATED",
            "message": message}});
        UpstreamError::Status {
            status: 401,
            body: Bytes::from(body.to_string()),
            retry_after: None,
        }
    }

    /// The token endpoint unusable: a connection error for the deployment.
    fn unavailable(&self, why: &str) -> UpstreamError {
        UpstreamError::Connect(format!("{} access token: {why}", self.exchange.issuer()))
    }
}

/// The OAuth error code of a refusal (`invalid_client`, `invalid_grant`…), when it is one:
/// the description beside it can name the tenant or the account and is not passed on.
fn oauth_code(body: &[u8]) -> Option<String> {
    let v: serde_json::Value = serde_json::from_slice(body).ok()?;
    let code = v.get("error")?.as_str()?;
    let plain = !code.is_empty()
        && code.len() <= 64
        && code.bytes().all(|b| b.is_ascii_lowercase() || b == b'_');
    plain.then(|| code.to_string())
}

/// Whether a refusal is OAuth's `invalid_grant` for the assertion's time: its description
/// names the JWT's `iat`, `exp` or `nbf`, its timeframe or the clock (Google: "Invalid JWT:
/// Token must be a short-lived token (60 minutes) and in a reasonable timeframe. Check your
/// iat and exp values…"). A wrong or deleted key is refused in other words ("Invalid JWT
/// Signature", "account not found") and stays a refused key. Only the words are read;
/// none is passed on.
fn refused_for_its_time(body: &[u8]) -> bool {
    let Ok(v) = serde_json::from_slice::<serde_json::Value>(body) else {
        return false;
    };
    if v.get("error").and_then(|e| e.as_str()) != Some("invalid_grant") {
        return false;
    }
    let description = v
        .get("error_description")
        .and_then(|d| d.as_str())
        .unwrap_or("")
        .to_ascii_lowercase();
    description
        .split(|c: char| !c.is_ascii_alphanumeric())
        .any(|w| matches!(w, "iat" | "exp" | "nbf" | "timeframe" | "clock"))
}

/// The token and its lifetime in seconds from a 200 answer. `expires_in` is a JSON number
/// (Entra's v2 and Google's), a string (Entra's v1) or absent (an hour); a fraction is
/// a lifetime too. One under a second (`MIN_LIFETIME`: zero or less included), or
/// unreadable, is an unusable answer: a token that cannot be cached would cost an exchange
/// per request.
fn read_answer(body: &[u8]) -> Result<(String, f64), &'static str> {
    #[derive(serde::Deserialize)]
    struct Answer {
        access_token: Option<String>,
        expires_in: Option<serde_json::Value>,
    }
    let v: Answer = serde_json::from_slice(body).map_err(|_| "the answer is not JSON")?;
    let token = v
        .access_token
        .filter(|t| !t.is_empty())
        .ok_or("the answer holds no access token")?;
    let lifetime = match v.expires_in {
        None | Some(serde_json::Value::Null) => DEFAULT_LIFETIME,
        Some(e) => e
            .as_f64()
            .or_else(|| e.as_str()?.trim().parse().ok())
            .filter(|s: &f64| s.is_finite() && *s >= MIN_LIFETIME)
            .ok_or("the answer's expires_in is not a number of seconds of at least one")?,
    };
    Ok((token, lifetime.min(MAX_LIFETIME)))
}

/// The answer's body, at most `MAX_ANSWER_BYTES` of it: `None` when it is longer (the
/// connection is dropped there) or breaks off.
async fn read_capped(mut resp: reqwest::Response) -> Option<Bytes> {
    if resp
        .content_length()
        .is_some_and(|n| n > MAX_ANSWER_BYTES as u64)
    {
        return None;
    }
    let mut body = BytesMut::new();
    while let Some(chunk) = resp.chunk().await.ok()? {
        if body.len() + chunk.len() > MAX_ANSWER_BYTES {
            return None;
        }
        body.extend_from_slice(&chunk);
    }
    Some(body.freeze())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_answer_is_read_or_refused_as_unusable() {
        let read = |s: &str| read_answer(s.as_bytes());
        assert_eq!(
            read(r#"{"access_token":"t","expires_in":3599}"#),
            Ok(("t".into(), 3599.0))
        );
        assert_eq!(
            read(r#"{"access_token":"t","expires_in":"2.5"}"#),
            Ok(("t".into(), 2.5))
        );
        assert_eq!(
            read(r#"{"access_token":"t","expires_in":1}"#),
            Ok(("t".into(), 1.0))
        );
        assert_eq!(read(r#"{"access_token":"t"}"#), Ok(("t".into(), 3600.0)));
        assert_eq!(
            read(r#"{"access_token":"t","expires_in":1e12}"#),
            Ok(("t".into(), MAX_LIFETIME))
        );
        for bad in [
            r#"{"access_token":"t","expires_in":0}"#,
            r#"{"access_token":"t","expires_in":0.001}"#,
            r#"{"access_token":"t","expires_in":"0.5"}"#,
            r#"{"access_token":"t","expires_in":-60}"#,
            r#"{"access_token":"t","expires_in":"soon"}"#,
            r#"{"access_token":"t","expires_in":true}"#,
            r#"{"access_token":""}"#,
            r#"{"token_type":"Bearer"}"#,
            r#"<html>"#,
            r#"[]"#,
        ] {
            assert!(read(bad).is_err(), "{bad}");
        }
    }

    /// Answers its first connection never, then a token to each.
    #[derive(Debug)]
    struct Slow(std::net::SocketAddr);

    impl Exchange for Slow {
        fn issuer(&self) -> &'static str {
            "test"
        }
        fn request(
            &self,
            http: &reqwest::Client,
            _: DateTime<Utc>,
        ) -> Result<reqwest::RequestBuilder, String> {
            Ok(http.post(format!("http://{}/token", self.0)))
        }
    }

    /// An exchange whose task was dropped (its runtime stopped under it) leaves no marker
    /// that every later request waits on and fails by: the next starts another.
    #[test]
    fn an_exchange_whose_task_is_dropped_does_not_wedge_the_source() {
        use std::io::{Read, Write};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        std::thread::spawn(move || {
            let mut held = Vec::new();
            for (i, conn) in listener.incoming().enumerate() {
                let Ok(mut conn) = conn else { return };
                if i == 0 {
                    held.push(conn);
                    continue;
                }
                let mut buf = [0u8; 4096];
                let _ = conn.read(&mut buf);
                let body = r#"{"access_token":"fresh","expires_in":3600}"#;
                let _ = write!(
                    conn,
                    "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                    body.len()
                );
            }
        });
        let source = TokenSource::new(Box::new(Slow(addr)), Arc::new(crate::clock::SystemClock));
        let http = reqwest::Client::new();
        let first = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let waited = first.block_on(async {
            tokio::time::timeout(Duration::from_millis(300), source.bearer(&http)).await
        });
        assert!(waited.is_err(), "the first exchange hangs");
        drop(first);
        let second = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let header = second
            .block_on(async {
                tokio::time::timeout(Duration::from_secs(5), source.bearer(&http)).await
            })
            .expect("answered in time")
            .expect("a token from a new exchange");
        assert_eq!(header.to_str().unwrap(), "Bearer fresh");
    }

    #[test]
    fn a_refusal_naming_the_assertions_time_is_told_apart() {
        assert!(refused_for_its_time(
            br#"{"error":"invalid_grant","error_description":"Invalid JWT: Token must be a short-lived token (60 minutes) and in a reasonable timeframe. Check your iat and exp values in the JWT claim."}"#
        ));
        for refused in [
            &br#"{"error":"invalid_grant","error_description":"Invalid JWT Signature."}"#[..],
            br#"{"error":"invalid_grant","error_description":"Invalid grant: account not found"}"#,
            br#"{"error":"invalid_grant","error_description":"associated key expired"}"#,
            br#"{"error":"invalid_client","error_description":"bad iat"}"#,
            br#"{"error":"invalid_grant"}"#,
            b"timeframe",
        ] {
            assert!(
                !refused_for_its_time(refused),
                "{}",
                String::from_utf8_lossy(refused)
            );
        }
    }

    #[test]
    fn only_a_plain_oauth_code_is_passed_on() {
        assert_eq!(
            oauth_code(br#"{"error":"invalid_grant","error_description":"key 1234"}"#),
            Some("invalid_grant".into())
        );
        assert_eq!(
            oauth_code(br#"{"error":"AADSTS7000215: Invalid client secret"}"#),
            None
        );
        assert_eq!(oauth_code(br#"{"error":{"code":1}}"#), None);
        assert_eq!(oauth_code(b"nope"), None);
    }
}
