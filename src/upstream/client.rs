//! The upstream HTTP client: pooled keep-alive connections, no redirects, no proxy from the
//! environment, connect and first-byte timeouts, `TCP_NODELAY`. Two clients share the
//! settings and both resolve names through `GuardedResolver`: `public` refuses private and
//! metadata addresses, `private` (upstreams that opted in with `allow_private_network`,
//! local model servers) refuses metadata addresses. `guarded` is the one way to build an
//! outbound client: the cache embedder and the alert webhooks use it too.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use reqwest::header::{HeaderValue, AUTHORIZATION, CONTENT_TYPE, RETRY_AFTER};

use super::catalog::Deployment;
use super::credential::Credential;
use super::on_wire;
use super::providers::bedrock;
use super::providers::formats::gemini as gemini_format;
use super::url_guard::{GuardedResolver, SystemResolver};
use super::UpstreamError;
use crate::config::{Provider, UpstreamTimeouts};

/// A client for every outbound call the gateway makes — upstreams, the `http` cache
/// embedder, alert webhooks: names resolved through `GuardedResolver` (metadata refused
/// always, private addresses unless `allow_private`), redirects never followed (one could
/// point anywhere, metadata included), no proxy from the environment (`HTTP(S)_PROXY`
/// would resolve the name itself, past the guard).
pub fn guarded(allow_private: bool, dns: Arc<dyn reqwest::dns::Resolve>) -> reqwest::ClientBuilder {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .no_proxy()
        .user_agent(concat!("sluice/", env!("CARGO_PKG_VERSION")))
        .dns_resolver(Arc::new(GuardedResolver::new(allow_private, dns)))
}

pub struct UpstreamClient {
    public: reqwest::Client,
    private: reqwest::Client,
    pub timeouts: UpstreamTimeouts,
}

/// The Anthropic API version Sluice speaks.
pub const ANTHROPIC_VERSION: &str = "2023-06-01";

impl UpstreamClient {
    pub fn new(timeouts: &UpstreamTimeouts) -> Result<Self, reqwest::Error> {
        Self::with_resolver(timeouts, Arc::new(SystemResolver))
    }

    /// The client over another name resolver (tests answer DNS with fixed addresses); the
    /// guard sits between it and every connection either way.
    pub fn with_resolver(
        timeouts: &UpstreamTimeouts,
        dns: Arc<dyn reqwest::dns::Resolve>,
    ) -> Result<Self, reqwest::Error> {
        let build = |allow_private: bool| {
            guarded(allow_private, dns.clone())
                .connect_timeout(Duration::from_millis(timeouts.connect_timeout_ms))
                .tcp_nodelay(true)
                .pool_idle_timeout(Duration::from_secs(90))
                .pool_max_idle_per_host(256)
                .build()
        };
        Ok(Self {
            public: build(false)?,
            private: build(true)?,
            timeouts: timeouts.clone(),
        })
    }

    /// Sends one attempt to `url` (the route's, `Deployment::url`) and waits for the
    /// response headers: the first-byte timeout, or less when the request's `deadline`
    /// comes first (then `UpstreamError::Deadline`). A credential computed at send time
    /// (`Credential::Hook`: a token fetched, a signature) is made within the same bound.
    /// Only the deployment's own credential is sent: nothing of the client's. The one client
    /// header an upstream may see is `anthropic-beta`, and only an Anthropic one.
    ///
    /// `reached` is called once the request reached the upstream (`on_wire`: its connection
    /// made and its body read), as soon as it has: before, nothing was sent.
    pub async fn post(
        &self,
        dep: &Deployment,
        url: Option<&reqwest::Url>,
        body: Bytes,
        deadline: Instant,
        (headers, reached): (UpstreamHeaders<'_>, impl FnOnce()),
    ) -> Result<reqwest::Response, UpstreamError> {
        let client = if dep.allow_private {
            &self.private
        } else {
            &self.public
        };
        let Some(url) = url else {
            return Err(UpstreamError::Connect("request".into()));
        };
        // A cached credential (a bearer token) may be refused before its time and is then
        // replaced once: only for it is the body kept for a second request.
        let hook = match dep.credential() {
            Credential::Hook(hook) => Some(hook),
            _ => None,
        };
        let again = hook.filter(|h| h.cached()).map(|_| body.clone());
        let req = request(client, dep, url, body.clone(), &headers)?;
        let wire = Arc::new(on_wire::Wire::default());
        let send = async {
            let Some(hook) = hook else {
                let req = on_wire::watched(req, body, &wire);
                return client.execute(req).await.map_err(Ok);
            };
            // Signed or given its token over the bytes it goes out with.
            let req = hook.authorize(client, req).await.map_err(Err)?;
            let req = on_wire::watched(req, body, &wire);
            // The value sent, to tell the hook which token a 401 was for: a shared
            // `HeaderValue` (a reference count), not a copy of the headers.
            let sent = again
                .as_ref()
                .and(req.headers().get(AUTHORIZATION).cloned());
            let resp = client.execute(req).await.map_err(Ok)?;
            match (again, sent) {
                // A cached credential refused: once more with a new one (a token the far
                // side no longer takes is no refused key; a second 401 is).
                (Some(body), Some(sent)) if resp.status() == reqwest::StatusCode::UNAUTHORIZED => {
                    hook.refused(&sent);
                    drop(resp);
                    let again = request(client, dep, url, body, &headers).map_err(Err)?;
                    let again = hook.authorize(client, again).await.map_err(Err)?;
                    client.execute(again).await.map_err(Ok)
                }
                _ => Ok(resp),
            }
        };
        let first_byte = Duration::from_millis(self.timeouts.first_byte_timeout_ms);
        let left = deadline.saturating_duration_since(Instant::now());
        let send = on_wire::watch(send, &wire, reached);
        let resp = match tokio::time::timeout(first_byte.min(left), send).await {
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
        // Error bodies are small; 64 KiB is plenty to classify them.
        let body = self.read_body(resp, 64 * 1024).await.unwrap_or_default();
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

    /// Reads a whole body, refusing one over `limit` bytes or one that stalls.
    pub async fn read_body(
        &self,
        mut resp: reqwest::Response,
        limit: usize,
    ) -> Result<Bytes, UpstreamError> {
        let idle = Duration::from_millis(self.timeouts.stream_idle_timeout_ms);
        let mut buf = BytesMut::with_capacity(
            resp.content_length()
                .map(|l| l as usize)
                .unwrap_or(4096)
                .min(limit),
        );
        loop {
            match tokio::time::timeout(idle, resp.chunk()).await {
                Err(_) => return Err(UpstreamError::Timeout),
                Ok(Err(_)) => return Err(UpstreamError::Garbage("body cut short")),
                Ok(Ok(None)) => return Ok(buf.freeze()),
                Ok(Ok(Some(chunk))) => {
                    if buf.len() + chunk.len() > limit {
                        return Err(UpstreamError::Garbage("body too large"));
                    }
                    buf.extend_from_slice(&chunk);
                }
            }
        }
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

/// Headers a request adds for its upstream: the client's `anthropic-beta` (Anthropic
/// only) and the attempt span's W3C `traceparent` (`ops::traces`; none when tracing is off).
pub type UpstreamHeaders<'a> = (Option<&'a HeaderValue>, Option<HeaderValue>);

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

/// What the gateway itself ran out of, when an outbound call failed for want of a local
/// resource rather than anything the far side did. The cause is an `io::Error` somewhere
/// down the `source()` chain: reqwest wraps hyper-util's `ConnectError` ("tcp open error"
/// from `socket()`, "tcp connect error" from `connect()`), which wraps the `io::Error`; a
/// name lookup that failed the same way (`getaddrinfo`'s `EAI_SYSTEM`) carries the errno
/// likewise. The errors that mean "this process or host is out of something":
/// `EMFILE` (the process's open-file limit), `ENFILE` (the system's file table), `ENOBUFS`
/// (socket buffers) and `ENOMEM` (kernel memory).
pub fn local_shortage(err: &(dyn std::error::Error + 'static)) -> Option<&'static str> {
    let mut cause = Some(err);
    while let Some(e) = cause {
        let io = e.downcast_ref::<std::io::Error>();
        if let Some(what) = io.and_then(std::io::Error::raw_os_error).and_then(shortage) {
            return Some(what);
        }
        // An `io::Error` that wraps another error answers `source()` with the wrapped
        // error's source, skipping the wrapped error itself: step into it instead.
        cause = match io.and_then(std::io::Error::get_ref) {
            Some(inner) => Some(inner as &(dyn std::error::Error + 'static)),
            None => e.source(),
        };
    }
    None
}

/// The local shortage an OS error number names, if it names one.
fn shortage(errno: i32) -> Option<&'static str> {
    #[cfg(unix)]
    {
        match errno {
            libc::EMFILE => Some("open files (EMFILE: the process's open-file limit)"),
            libc::ENFILE => Some("open files (ENFILE: the system's file table is full)"),
            libc::ENOBUFS => Some("socket buffers (ENOBUFS)"),
            libc::ENOMEM => Some("kernel memory (ENOMEM)"),
            _ => None,
        }
    }
    #[cfg(not(unix))]
    {
        let _ = errno;
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An error that wraps another, as reqwest and hyper-util wrap the `io::Error`.
    #[derive(Debug)]
    struct Wrap(&'static str, Box<dyn std::error::Error + Send + Sync>);

    impl std::fmt::Display for Wrap {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str(self.0)
        }
    }

    impl std::error::Error for Wrap {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            Some(&*self.1)
        }
    }

    fn wrapped(errno: i32) -> Wrap {
        Wrap(
            "client error (Connect)",
            Box::new(Wrap(
                "tcp open error",
                Box::new(std::io::Error::from_raw_os_error(errno)),
            )),
        )
    }

    #[test]
    fn retry_after_ms_comes_before_retry_after() {
        let mut h = reqwest::header::HeaderMap::new();
        assert_eq!(retry_after(&h), None);
        h.insert(RETRY_AFTER, HeaderValue::from_static("2"));
        assert_eq!(retry_after(&h), Some(Duration::from_secs(2)));
        h.insert("retry-after-ms", HeaderValue::from_static("1500"));
        assert_eq!(retry_after(&h), Some(Duration::from_millis(1500)));
        h.insert("retry-after-ms", HeaderValue::from_static("soon"));
        assert_eq!(retry_after(&h), Some(Duration::from_secs(2)));
        h.insert(RETRY_AFTER, HeaderValue::from_static("1e300"));
        assert_eq!(retry_after(&h), None, "no panic on an absurd wait");
    }

    #[test]
    fn a_shortage_of_the_gateways_own_resources_is_found_down_the_chain() {
        for (errno, what) in [
            (libc::EMFILE, "EMFILE"),
            (libc::ENFILE, "ENFILE"),
            (libc::ENOBUFS, "ENOBUFS"),
            (libc::ENOMEM, "ENOMEM"),
        ] {
            let found = local_shortage(&wrapped(errno));
            assert!(found.is_some_and(|f| f.contains(what)), "{what}: {found:?}");
        }
        // The far side's faults are not the gateway's.
        for errno in [
            libc::ECONNREFUSED,
            libc::ECONNRESET,
            libc::ETIMEDOUT,
            libc::EHOSTUNREACH,
        ] {
            assert_eq!(local_shortage(&wrapped(errno)), None, "errno {errno}");
        }
        let not_os = Wrap("x", Box::new(std::io::Error::other("too many open files")));
        assert_eq!(
            local_shortage(&not_os),
            None,
            "only the errno decides, not words"
        );
        let io_in_io = std::io::Error::other(std::io::Error::from_raw_os_error(libc::EMFILE));
        assert!(local_shortage(&Wrap("x", Box::new(io_in_io))).is_some());
    }

    /// The walk reaches the `io::Error` inside a real reqwest connect error: a refused
    /// connection's errno is found at the end of the same chain an `EMFILE` travels.
    #[tokio::test]
    async fn the_walk_reaches_the_os_error_inside_a_real_reqwest_error() {
        let port = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().port()
        };
        let err = reqwest::Client::new()
            .get(format!("http://127.0.0.1:{port}/"))
            .send()
            .await
            .unwrap_err();
        let mut errnos = Vec::new();
        let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(&err);
        while let Some(e) = cause {
            errnos.extend(
                e.downcast_ref::<std::io::Error>()
                    .and_then(|io| io.raw_os_error()),
            );
            cause = e.source();
        }
        assert_eq!(errnos, [libc::ECONNREFUSED], "{err:?}");
        assert_eq!(local_shortage(&err), None);
    }
}
