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
        Self::built(timeouts, dns, |b| b)
    }

    /// The client, each of its two builders passed through `tweak` first (the tests speak
    /// HTTP/2 without TLS).
    fn built(
        timeouts: &UpstreamTimeouts,
        dns: Arc<dyn reqwest::dns::Resolve>,
        tweak: impl Fn(reqwest::ClientBuilder) -> reqwest::ClientBuilder,
    ) -> Result<Self, reqwest::Error> {
        let build = |allow_private: bool| {
            tweak(guarded(allow_private, dns.clone()))
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

/// How many times a request the upstream did not process (`unprocessed`, `never_sent`) is
/// sent again within one attempt: reqwest's own retry's figure.
const RESENDS: usize = 2;

/// The pause before the n-th resend is n times this.
const RESEND_PAUSE: Duration = Duration::from_millis(10);

/// How HTTP/2 said the upstream did not process a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Unprocessed {
    /// A graceful GOAWAY (`NO_ERROR`) for a stream past its last.
    GoneAway,
    /// The stream refused (`REFUSED_STREAM`, RFC 9113 §8.7): the server sheds load.
    Refused,
}

/// Whether `err` says, by HTTP/2's word, that the upstream did not process the request —
/// what reqwest's own retry resends, and cannot for a body it is not given whole
/// (`on_wire::watched`).
fn unprocessed(err: &(dyn std::error::Error + 'static)) -> Option<Unprocessed> {
    let mut cause = Some(err);
    while let Some(e) = cause {
        if let Some(h2) = e.downcast_ref::<h2::Error>() {
            let reason = h2.reason();
            return match h2.is_remote() {
                true if h2.is_go_away() && reason == Some(h2::Reason::NO_ERROR) => {
                    Some(Unprocessed::GoneAway)
                }
                true if h2.is_reset() && reason == Some(h2::Reason::REFUSED_STREAM) => {
                    Some(Unprocessed::Refused)
                }
                _ => None,
            };
        }
        cause = e.source();
    }
    None
}

/// Whether a call that failed never sent its request whole, so may be sent again: its body
/// was not read whole, and hyper says it gave the request up before it went — its dispatch
/// gone (a graceful GOAWAY reaching a request it held at the stream cap) or the request
/// canceled (its connection closed before it went). Anything else — a connection not made,
/// a reset, a server pushing back — is the upstream's to answer for, and not resent.
fn never_sent(err: &reqwest::Error, wire: &on_wire::Wire) -> bool {
    wire.unsent() && given_up(err)
}

/// Whether `err` is hyper giving a request up before it went (`never_sent`).
fn given_up(err: &(dyn std::error::Error + 'static)) -> bool {
    let mut cause = Some(err);
    while let Some(e) = cause {
        if let Some(h) = e.downcast_ref::<hyper::Error>() {
            return h.is_user() || h.is_canceled();
        }
        cause = e.source();
    }
    false
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
    use super::super::on_wire::tests::{answer, h2_serving, shut_window_server};
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};

    /// The error an HTTP/2 client gets for a request its server answers with `answer`
    /// (a reset of the stream with that reason, or a GOAWAY before it was accepted).
    async fn h2_error(answer: Option<h2::Reason>) -> h2::Error {
        let (client_io, server_io) = tokio::io::duplex(64 * 1024);
        tokio::spawn(async move {
            let mut conn = h2::server::handshake(server_io).await.expect("handshake");
            match answer {
                Some(reason) => {
                    while let Some(Ok((_, mut respond))) = conn.accept().await {
                        respond.send_reset(reason);
                    }
                }
                None => {
                    conn.graceful_shutdown();
                    while conn.accept().await.is_some() {}
                }
            }
        });
        let (h2c, conn) = h2::client::handshake(client_io).await.expect("handshake");
        tokio::spawn(conn);
        if answer.is_none() {
            // The server's GOAWAY comes before the request.
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let mut h2c = match h2c.ready().await {
            Ok(h2c) => h2c,
            Err(e) => return e,
        };
        let req = http::Request::post("https://upstream/")
            .body(())
            .expect("request");
        match h2c.send_request(req, true) {
            Ok((resp, _)) => resp.await.expect_err("refused"),
            Err(e) => e,
        }
    }

    /// Review finding (s18, 3): a watched body cannot be cloned, so reqwest's own retry of
    /// the requests HTTP/2 says were not processed no longer runs: `post` resends them.
    #[tokio::test]
    async fn only_a_request_http2_says_was_not_processed_is_sent_again() {
        let refused = h2_error(Some(h2::Reason::REFUSED_STREAM)).await;
        let wrapped = Wrap("a request error", Box::new(refused));
        assert_eq!(unprocessed(&wrapped), Some(Unprocessed::Refused));
        let failed = h2_error(Some(h2::Reason::INTERNAL_ERROR)).await;
        assert_eq!(unprocessed(&failed), None);
        let gone = h2_error(None).await;
        assert_eq!(unprocessed(&gone), Some(Unprocessed::GoneAway), "{gone:?}");
        assert_eq!(
            unprocessed(&h2::Error::from(h2::Reason::REFUSED_STREAM)),
            None
        );
    }

    /// An HTTP/2 server (no TLS) that refuses its first `refusals` streams
    /// (`REFUSED_STREAM`) and answers the rest 200; the count of streams it had.
    async fn refusing_server(refusals: usize) -> (reqwest::Url, Arc<AtomicUsize>) {
        let had = Arc::new(AtomicUsize::new(0));
        let count = had.clone();
        let addr = h2_serving(h2::server::Builder::new(), move |_, mut respond| {
            if count.fetch_add(1, SeqCst) < refusals {
                respond.send_reset(h2::Reason::REFUSED_STREAM);
            } else {
                answer(respond, b"{}");
            }
        })
        .await;
        (chat_url(addr), had)
    }

    fn chat_url(addr: std::net::SocketAddr) -> reqwest::Url {
        reqwest::Url::parse(&format!("http://{addr}/v1/chat/completions")).expect("url")
    }

    /// What `post` made of a server that refuses `refusals` streams: its answer, how many
    /// streams the server had, and what `reached` was told.
    async fn post_to_refusing(
        refusals: usize,
    ) -> (Result<reqwest::Response, UpstreamError>, usize, Vec<bool>) {
        let (url, had) = refusing_server(refusals).await;
        let timeouts = UpstreamTimeouts::default();
        let client = UpstreamClient::built(&timeouts, Arc::new(SystemResolver), |b| {
            b.http2_prior_knowledge()
        })
        .expect("client");
        let dep = Deployment::alone(&crate::config::UpstreamSettings {
            id: "h2".into(),
            allow_private_network: true,
            ..Default::default()
        });
        let mut told = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(10);
        let body = Bytes::from_static(b"{}");
        let answer = client
            .post(
                &dep,
                Some(&url),
                body,
                deadline,
                ((None, None), |on| told.push(on)),
            )
            .await;
        (answer, had.load(SeqCst), told)
    }

    /// A request HTTP/2 says was not processed is sent again, up to `RESENDS` times, each
    /// taken back from the wire (the end-to-end resend, not only its classifier). Review
    /// finding (s19a, 4): refused every time, it was a `Broken` call that had reached its
    /// upstream — billable, its departure paying its input — though no upstream had it.
    #[tokio::test]
    async fn a_stream_refused_is_sent_again_and_refused_every_time_bills_nothing() {
        let (answer, had, told) = post_to_refusing(1).await;
        assert_eq!(answer.expect("the resend's answer").status(), 200);
        assert_eq!((had, told), (2, vec![true, false, true]));

        let began = Instant::now();
        let (answer, had, told) = post_to_refusing(usize::MAX).await;
        assert!(matches!(answer, Err(UpstreamError::Refused)), "{answer:?}");
        // Review finding (s19-final, N5): refused each time, it was a `Connect` failure —
        // a breaker count and no rest — its resends back to back. A refusal is how an
        // HTTP/2 server sheds load: resent after a pause, and an overload at the last.
        assert_eq!(
            super::super::retry::classify(&UpstreamError::Refused),
            super::super::retry::Tier::Overloaded
        );
        assert!(began.elapsed() >= RESEND_PAUSE * 3, "{:?}", began.elapsed());
        assert_eq!(had, 1 + RESENDS);
        assert_eq!(told.last(), Some(&false), "not out: {told:?}");
    }

    /// An HTTP/2 server (no TLS) with room for one stream per connection. The first stream
    /// of its first connection is held, unanswered, until `goaway` fires: then that
    /// connection is shut down gracefully (GOAWAY `NO_ERROR`) and the held stream answered.
    /// Every other stream, on any connection, is answered 200 at once: the count of them.
    /// A client sends that first stream (`first`) with no timeout of its own.
    struct Capped {
        url: reqwest::Url,
        answered: Arc<AtomicUsize>,
        first: tokio::task::JoinHandle<reqwest::Result<reqwest::Response>>,
    }

    async fn capped_server(
        client: &UpstreamClient,
        goaway: tokio::sync::oneshot::Receiver<()>,
    ) -> Capped {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let url = format!("http://{addr}/v1/chat/completions");
        let answered = Arc::new(AtomicUsize::new(0));
        let count = answered.clone();
        let (first_in, first_seen) = tokio::sync::oneshot::channel();
        tokio::spawn(async move {
            let mut goaway = Some(goaway);
            let mut first_in = Some(first_in);
            while let Ok((tcp, _)) = listener.accept().await {
                let mut conn = h2::server::Builder::new()
                    .max_concurrent_streams(1)
                    .handshake::<_, Bytes>(tcp)
                    .await
                    .expect("handshake");
                let count = count.clone();
                let mut held = None;
                let mut goaway = goaway.take();
                let mut first_in = first_in.take();
                tokio::spawn(async move {
                    loop {
                        tokio::select! {
                            stream = conn.accept() => match stream {
                                // Its request kept too: dropped, it could free the stream.
                                Some(Ok(stream)) if held.is_none() && goaway.is_some() => {
                                    held = Some(stream);
                                    if let Some(first_in) = first_in.take() {
                                        let _ = first_in.send(());
                                    }
                                }
                                Some(Ok((_, respond))) => {
                                    count.fetch_add(1, SeqCst);
                                    answer(respond, b"{}");
                                }
                                _ => break,
                            },
                            _ = async { goaway.as_mut().expect("checked").await }, if goaway.is_some() => {
                                goaway = None;
                                conn.graceful_shutdown();
                                if let Some((_, respond)) = held.take() {
                                    answer(respond, b"{}");
                                }
                            }
                        }
                    }
                });
            }
        });
        let first = client.private.post(&url).body("{}").send();
        let first = tokio::spawn(first);
        first_seen.await.expect("the first stream is in");
        let url = reqwest::Url::parse(&url).expect("url");
        Capped {
            url,
            answered,
            first,
        }
    }

    /// `client` posting to `url` (as a private upstream, as the test servers are); what
    /// `reached` was told is pushed to `told`.
    async fn post_h2(
        client: &UpstreamClient,
        url: &reqwest::Url,
        told: &mut Vec<bool>,
    ) -> Result<reqwest::Response, UpstreamError> {
        let dep = Deployment::alone(&crate::config::UpstreamSettings {
            id: "h2".into(),
            allow_private_network: true,
            ..Default::default()
        });
        let deadline = Instant::now() + Duration::from_secs(10);
        let body = Bytes::from_static(b"{\"model\":\"m\"}");
        client
            .post(
                &dep,
                Some(url),
                body,
                deadline,
                ((None, None), |on| told.push(on)),
            )
            .await
    }

    fn h2_client(timeouts: &UpstreamTimeouts) -> UpstreamClient {
        UpstreamClient::built(timeouts, Arc::new(SystemResolver), |b| {
            b.http2_prior_knowledge()
        })
        .expect("client")
    }

    /// Review finding (s19-final, N1): a request hyper held at the server's stream cap past
    /// the first-byte timeout never went out, yet was a `Timeout` — a server error, a
    /// breaker failure of a key whose upstream did nothing wrong, and the next key of the
    /// same host (the same full connection) tried. It is `Held` now: no fault of the
    /// upstream's.
    #[tokio::test]
    async fn a_request_held_at_the_stream_cap_past_the_first_byte_timeout_is_held_not_timed_out() {
        let client = h2_client(&UpstreamTimeouts {
            connect_timeout_ms: 100,
            first_byte_timeout_ms: 400,
            ..UpstreamTimeouts::default()
        });
        let (_keep, goaway) = tokio::sync::oneshot::channel();
        let capped = capped_server(&client, goaway).await;
        let mut told = Vec::new();
        let second = post_h2(&client, &capped.url, &mut told).await;
        assert!(matches!(second, Err(UpstreamError::Held)), "{second:?}");
        assert_eq!(told, [] as [bool; 0]);
        assert_eq!(capped.answered.load(SeqCst), 0);
    }

    /// Review finding (s19-final, N4): a graceful GOAWAY reaching the request hyper held at
    /// the stream cap ends it as "dispatch gone", not as an HTTP/2 error: it was not sent
    /// again, and was a `Broken` call — a breaker failure — though it never left. A call
    /// whose body was never read is sent again like one HTTP/2 says it did not process.
    #[tokio::test]
    async fn a_held_request_that_a_graceful_goaway_ends_is_sent_again() {
        let client = h2_client(&UpstreamTimeouts::default());
        let (goaway, go) = tokio::sync::oneshot::channel();
        let capped = capped_server(&client, go).await;
        let mut told = Vec::new();
        let second = post_h2(&client, &capped.url, &mut told);
        let shut = async {
            tokio::time::sleep(Duration::from_millis(200)).await;
            let _ = goaway.send(());
        };
        let (second, ()) = tokio::join!(second, shut);
        assert_eq!(second.expect("sent again").status(), 200);
        assert_eq!(told, [true]);
        assert_eq!(capped.answered.load(SeqCst), 1, "once, on a new connection");
        let first = capped.first.await.expect("task");
        assert_eq!(first.expect("the held one is answered").status(), 200);
    }

    /// Review finding (s20, S7): the error a graceful GOAWAY gives the request hyper held at
    /// the stream cap is hyper giving it up ("dispatch gone"), not an HTTP/2 error: the
    /// resend of `a_held_request_that_a_graceful_goaway_ends_is_sent_again` is
    /// `never_sent`'s, not `unprocessed`'s.
    #[tokio::test]
    async fn a_graceful_goaway_reaching_a_held_request_is_hyper_giving_it_up() {
        let client = h2_client(&UpstreamTimeouts::default());
        let (goaway, go) = tokio::sync::oneshot::channel();
        let capped = capped_server(&client, go).await;
        let wire = Arc::new(on_wire::Wire::default());
        let req = client
            .private
            .post(capped.url.clone())
            .build()
            .expect("request");
        let held = client
            .private
            .execute(on_wire::watched(req, Bytes::from_static(b"{}"), &wire));
        let shut = async {
            tokio::time::sleep(Duration::from_millis(200)).await;
            let _ = goaway.send(());
        };
        let (held, ()) = tokio::join!(held, shut);
        let err = held.expect_err("given up");
        assert_eq!(unprocessed(&err), None, "{err:?}");
        assert!(never_sent(&err, &wire), "{err:?}");
    }

    /// Review finding (s20, S1): a request whose body the upstream does not take (its
    /// HTTP/2 window shut; on HTTP/1 a full socket) is the upstream not reading it — a
    /// timeout, its breaker's to count — not a request hyper held: `Held` was hiding a
    /// wedged upstream fed large prompts from its breaker.
    #[tokio::test]
    async fn a_body_the_upstream_does_not_take_is_a_timeout_not_a_held_request() {
        let url = chat_url(shut_window_server().await);
        let client = h2_client(&UpstreamTimeouts {
            connect_timeout_ms: 50,
            first_byte_timeout_ms: 400,
            ..UpstreamTimeouts::default()
        });
        // The connection is up and the server's settings taken.
        client
            .private
            .get(url.clone())
            .send()
            .await
            .expect("the first answer");
        let mut told = Vec::new();
        let answer = post_h2(&client, &url, &mut told).await;
        assert!(matches!(answer, Err(UpstreamError::Timeout)), "{answer:?}");
        assert_eq!(told, [] as [bool; 0], "not out whole: nothing billed");
    }

    /// `never_sent` leaves a connection not made to the upstream: no resend, `Connect`.
    #[tokio::test]
    async fn a_connection_refused_is_not_sent_again() {
        let port = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
            l.local_addr().expect("addr").port()
        };
        let url = reqwest::Url::parse(&format!("http://127.0.0.1:{port}/")).expect("url");
        let answer = post_h2(
            &h2_client(&UpstreamTimeouts::default()),
            &url,
            &mut Vec::new(),
        )
        .await;
        assert!(
            matches!(&answer, Err(UpstreamError::Connect(what)) if what == "connect"),
            "{answer:?}"
        );
    }

    /// Review finding (s20b, B5): a stream the upstream resets before it took the body
    /// whole (here `INTERNAL_ERROR`, its window shut) is the upstream's answer, not hyper
    /// giving the request up: not sent again (it went three times before, a pushed-back
    /// prompt uploaded thrice), and billing nothing.
    #[tokio::test]
    async fn a_stream_reset_before_its_body_went_whole_is_not_sent_again() {
        let streams = Arc::new(AtomicUsize::new(0));
        let count = streams.clone();
        let mut shut = h2::server::Builder::new();
        shut.initial_window_size(0);
        let addr = h2_serving(shut, move |req, mut respond| {
            if req.method() == http::Method::GET {
                answer(respond, b"{}");
                return;
            }
            count.fetch_add(1, SeqCst);
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(50)).await;
                respond.send_reset(h2::Reason::INTERNAL_ERROR);
                drop(req);
            });
        })
        .await;
        let url = chat_url(addr);
        let client = h2_client(&UpstreamTimeouts::default());
        // The connection is up and the server's settings taken.
        client
            .private
            .get(url.clone())
            .send()
            .await
            .expect("the first answer");
        let mut told = Vec::new();
        let answer = post_h2(&client, &url, &mut told).await;
        assert!(
            matches!(&answer, Err(UpstreamError::Connect(what)) if what == "request not sent"),
            "{answer:?}"
        );
        assert_eq!(streams.load(SeqCst), 1, "sent once");
        assert_eq!(told, [] as [bool; 0]);
    }

    /// A credential made once at once, then never (its endpoint hangs).
    #[derive(Debug, Default)]
    struct SlowSecond(AtomicUsize);

    impl super::super::credential::Authorize for SlowSecond {
        fn authorize<'a>(
            &'a self,
            _: &'a reqwest::Client,
            req: reqwest::Request,
        ) -> std::pin::Pin<
            Box<
                dyn std::future::Future<Output = Result<reqwest::Request, UpstreamError>>
                    + Send
                    + 'a,
            >,
        > {
            let first = self.0.fetch_add(1, SeqCst) == 0;
            let mut req = req;
            req.headers_mut()
                .insert(AUTHORIZATION, HeaderValue::from_static("Bearer cached"));
            Box::pin(async move {
                if !first {
                    std::future::pending::<()>().await;
                }
                Ok(req)
            })
        }

        fn cached(&self) -> bool {
            true
        }
    }

    /// Review finding (s20, S7): a 401 to a cached credential, then a replacement that
    /// never comes (its token endpoint hangs): the first-byte timer that ends it is the
    /// credential's timeout — not `Held`, which would spare the upstream its breaker count.
    #[tokio::test]
    async fn a_replacement_credential_that_hangs_is_a_timeout_not_a_held_request() {
        let refusing = |_, mut respond: h2::server::SendResponse<Bytes>| {
            let refused = http::Response::builder().status(401).body(()).expect("401");
            if let Ok(mut send) = respond.send_response(refused, false) {
                let _ = send.send_data(Bytes::from_static(b"{}"), true);
            }
        };
        let url = chat_url(h2_serving(h2::server::Builder::new(), refusing).await);
        let client = h2_client(&UpstreamTimeouts {
            connect_timeout_ms: 50,
            first_byte_timeout_ms: 400,
            ..UpstreamTimeouts::default()
        });
        let dep = Deployment::alone(&crate::config::UpstreamSettings {
            id: "h2".into(),
            allow_private_network: true,
            ..Default::default()
        })
        .hooked(Arc::new(SlowSecond::default()));
        let mut told = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(10);
        let answer = client
            .post(
                &dep,
                Some(&url),
                Bytes::from_static(b"{}"),
                deadline,
                ((None, None), |on| told.push(on)),
            )
            .await;
        assert!(matches!(answer, Err(UpstreamError::Timeout)), "{answer:?}");
        assert_eq!(told, [true, false], "out, then taken back at the 401");
    }

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
