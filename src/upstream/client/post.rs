//! Sending one attempt (`UpstreamClient::post`): the request it builds, its credential, the
//! resends of a request the upstream never had, and what a failed call or a refusing answer
//! says (the wait it asked for, `retry_after`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use reqwest::header::{HeaderValue, AUTHORIZATION, CONTENT_TYPE, RETRY_AFTER};

use super::resend::{never_sent, unprocessed, Unprocessed, RESENDS, RESEND_PAUSE};
use super::{local_shortage, UpstreamClient, UpstreamHeaders, ANTHROPIC_VERSION};
use crate::config::Provider;
use crate::upstream::catalog::Deployment;
use crate::upstream::credential::Credential;
use crate::upstream::on_wire;
use crate::upstream::providers::bedrock;
use crate::upstream::providers::formats::gemini as gemini_format;
use crate::upstream::UpstreamError;

/// How long an error answer's body is read for at most (`post`): a whole one comes in
/// milliseconds.
const ERROR_BODY_BOUND: Duration = Duration::from_secs(2);

impl UpstreamClient {
    /// Sends one attempt to `url` (the route's, `Deployment::url`) and waits for the
    /// response headers: the first-byte timeout, or less when the request's `deadline`
    /// comes first (then `UpstreamError::Deadline`). A credential computed at send time
    /// (`Credential::Hook`: a token fetched, a signature) is made within the same bound.
    /// Only the deployment's own credential is sent: nothing of the client's. The one client
    /// header an upstream may see is `anthropic-beta`, and only an Anthropic one.
    ///
    /// `reached` is told, as soon as it is so, whether the request reached the upstream
    /// (`on_wire`: a connection made or pooled, its body read) — true at the read; false
    /// again when an answer says the request billed nothing and another is being made (a
    /// cached credential refused); never told if nothing was sent.
    pub async fn post(
        &self,
        dep: &Deployment,
        url: Option<&reqwest::Url>,
        body: Bytes,
        deadline: Instant,
        (headers, reached): (UpstreamHeaders<'_>, impl FnMut(bool)),
    ) -> Result<reqwest::Response, UpstreamError> {
        let client = if dep.allow_private {
            &self.private
        } else {
            &self.public
        };
        let Some(url) = url else {
            return Err(UpstreamError::Connect("request".into()));
        };
        let hook = match dep.credential() {
            Credential::Hook(hook) => Some(hook),
            _ => None,
        };
        let wire = Arc::new(on_wire::Wire::default());
        // When the request last went to the connection pool (past its credential).
        let mut handed = None;
        let send = async {
            // A cached credential (a bearer token) may be refused before its time and is
            // then replaced once (a token the far side no longer takes is no refused key; a
            // second 401 is).
            let mut may_refuse = hook.is_some_and(|h| h.cached());
            let mut resends = 0;
            loop {
                // Not handed while a credential is made: a slow one is no held request.
                handed = None;
                let req = request(client, dep, url, body.clone(), &headers).map_err(Err)?;
                // Signed or given its token over the bytes it goes out with.
                let req = match hook {
                    Some(hook) => hook.authorize(client, req).await.map_err(Err)?,
                    None => req,
                };
                // The value sent, to tell the hook which token a 401 was for: a shared
                // `HeaderValue` (a reference count), not a copy of the headers.
                let token = may_refuse
                    .then(|| req.headers().get(AUTHORIZATION).cloned())
                    .flatten();
                handed = Some(Instant::now());
                let resp = match client
                    .execute(on_wire::watched(req, body.clone(), &wire))
                    .await
                {
                    // Not processed, by the protocol's word, or never sent — its body unread
                    // (hyper ends a request it held at a stream cap as "dispatch gone" when a
                    // graceful GOAWAY comes): sent again on another stream, as reqwest's own
                    // retry would (it cannot resend a watched body).
                    Err(e) if unprocessed(&e).is_some() || never_sent(&e, &wire) => {
                        wire.unread();
                        let refused = unprocessed(&e) == Some(Unprocessed::Refused);
                        if resends == RESENDS {
                            // No upstream has it, and it bills nothing; refused each time, the
                            // server sheds load (`Refused`: an overload).
                            return Err(Err(match refused {
                                true => UpstreamError::Refused,
                                false => UpstreamError::Connect("request not sent".into()),
                            }));
                        }
                        resends += 1;
                        // Not back at once: a refusal is the server shedding load, and a
                        // request hyper gave up may be one a connection error dropped. No
                        // request is with the pool meanwhile.
                        handed = None;
                        tokio::time::sleep(RESEND_PAUSE * resends as u32).await;
                        continue;
                    }
                    r => r.map_err(Ok)?,
                };
                match (hook, token) {
                    (Some(hook), Some(token))
                        if resp.status() == reqwest::StatusCode::UNAUTHORIZED =>
                    {
                        hook.refused(&token);
                        may_refuse = false;
                        // A 401 billed nothing: the request is not out until the next one is.
                        wire.unread();
                    }
                    _ => return Ok(resp),
                }
            }
        };
        let first_byte = Duration::from_millis(self.timeouts.first_byte_timeout_ms);
        let left = deadline.saturating_duration_since(Instant::now());
        let send = on_wire::watch(send, &wire, reached);
        let timed_out = tokio::time::timeout(first_byte.min(left), send).await;
        // Not a piece of its body read, though its connection was made (no connect takes
        // longer than its timeout): hyper held it — an HTTP/2 connection at its server's
        // stream cap — and the upstream never saw it. (A body begun and not taken whole is
        // the upstream not reading it: a timeout.)
        let held = || {
            wire.untouched()
                && handed.is_some_and(|t: Instant| {
                    t.elapsed() >= Duration::from_millis(self.timeouts.connect_timeout_ms)
                })
        };
        let resp = match timed_out {
            Err(_) if held() => return Err(UpstreamError::Held),
            Err(_) if left < first_byte => return Err(UpstreamError::Deadline),
            Err(_) => return Err(UpstreamError::Timeout),
            // The credential could not be made (a token endpoint refused or unreachable).
            Ok(Err(Err(e))) => return Err(e),
            // The gateway's own descriptors or memory ran out: nothing reached the upstream,
            // and it says nothing of the upstream's health. A connection never made (a
            // connect timeout too) sent nothing; one broken later may have. The error's text
            // can carry the URL; the caller logs only the deployment id.
            Ok(Err(Ok(e))) => {
                return Err(match local_shortage(&e) {
                    Some(what) => UpstreamError::LocalResources(what),
                    None if e.is_connect() => UpstreamError::Connect("connect".into()),
                    None if e.is_timeout() => UpstreamError::Timeout,
                    None if wire.unsent() => UpstreamError::Connect("request not sent".into()),
                    None => UpstreamError::Broken,
                })
            }
            Ok(Ok(r)) => r,
        };
        let status = resp.status().as_u16();
        if (200..300).contains(&status) {
            return Ok(resp);
        }
        let retry_after = retry_after(resp.headers());
        let error_type = resp.headers().get("x-amzn-errortype").cloned();
        // Error bodies are small; 64 KiB is plenty to classify them. Read for a short while
        // at most, and never past the deadline: it only refines what the status says, so one
        // trickled is classified by its status alone — a 429 moves to the next key at once
        // (s30 upstream attack F1: a trickled body held the run for as long as it came).
        let until = deadline.min(Instant::now() + ERROR_BODY_BOUND);
        let body = self
            .read_body_by(resp, 64 * 1024, (until, UpstreamError::Timeout))
            .await
            .unwrap_or_default();
        let (body, retry_after) = match dep.provider {
            // Google sends the wait in the body (`RetryInfo.retryDelay`), not in a header.
            Provider::Gemini => {
                let in_body = || {
                    serde_json::from_slice(&body)
                        .ok()
                        .and_then(|v| gemini_format::retry_delay(&v))
                };
                let wait = retry_after.or_else(in_body);
                (body, wait)
            }
            // Bedrock names the error in `x-amzn-ErrorType`: copied into the body as
            // `__type`, so the retry tiers and the adapter read one place.
            Provider::Bedrock => (
                bedrock::typed_error_body(error_type.as_ref(), body),
                retry_after,
            ),
            _ => (body, retry_after),
        };
        Err(UpstreamError::Status {
            status,
            body,
            retry_after,
        })
    }
}

/// The request `post` sends: JSON `body` to `url` with the deployment's static credential
/// (a computed one is added by its hook) and its provider's headers.
fn request(
    client: &reqwest::Client,
    dep: &Deployment,
    url: &reqwest::Url,
    body: Bytes,
    (anthropic_beta, traceparent): &UpstreamHeaders<'_>,
) -> Result<reqwest::Request, UpstreamError> {
    let req = client
        .post(url.clone())
        .header(CONTENT_TYPE, HeaderValue::from_static("application/json"))
        .body(body);
    // Before the credential: a signing hook (SigV4) covers it like any header.
    let req = match traceparent {
        Some(tp) => req.header("traceparent", tp.clone()),
        None => req,
    };
    let req = match dep.credential() {
        Credential::Static(name, value) => req.header(name, value.clone()),
        Credential::None | Credential::Hook(_) => req,
        Credential::Invalid => return Err(UpstreamError::Connect("request".into())),
    };
    let req = match dep.provider {
        Provider::Anthropic => {
            let req = req.header("anthropic-version", ANTHROPIC_VERSION);
            match anthropic_beta {
                Some(beta) => req.header("anthropic-beta", HeaderValue::clone(beta)),
                None => req,
            }
        }
        Provider::Openai
        | Provider::AzureOpenai
        | Provider::OpenaiCompatible
        | Provider::Gemini
        | Provider::Bedrock => req,
    };
    req.build()
        .map_err(|_| UpstreamError::Connect("request".into()))
}

/// How long an upstream asked to be left alone: `retry-after-ms` (Azure's, and what the
/// OpenAI SDKs read first) when present, else `Retry-After` in seconds.
pub fn retry_after(h: &reqwest::header::HeaderMap) -> Option<Duration> {
    let number = |name| {
        h.get(name)
            .and_then(|v: &HeaderValue| v.to_str().ok())
            .and_then(|v| v.trim().parse::<f64>().ok())
            .filter(|s| s.is_finite() && *s >= 0.0 && *s < 1e12)
    };
    number("retry-after-ms")
        .map(|ms| Duration::from_secs_f64(ms / 1000.0))
        .or_else(|| number(RETRY_AFTER.as_str()).map(Duration::from_secs_f64))
}
