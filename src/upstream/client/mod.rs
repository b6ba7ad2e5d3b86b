//! The upstream HTTP client: pooled keep-alive connections, no redirects, no proxy from the
//! environment, connect and first-byte timeouts, `TCP_NODELAY`. Two clients share the
//! settings and both resolve names through `GuardedResolver`: `public` refuses private and
//! metadata addresses, `private` (upstreams that opted in with `allow_private_network`,
//! local model servers) refuses metadata addresses. `guarded` is the one way to build an
//! outbound client: the cache embedder and the alert webhooks use it too.

mod post;
mod resend;
mod shortage;

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use reqwest::header::HeaderValue;

use super::url_guard::{GuardedResolver, SystemResolver};
use super::UpstreamError;
use crate::config::UpstreamTimeouts;
pub use post::retry_after;
pub use shortage::local_shortage;

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

    /// Reads a whole body as `read_body` does, ending by `until` at the latest: past it, the
    /// read is given up as `late`. The headers' bound ends at the headers; a body trickled
    /// after them (a keep-alive space at a time while a model works, or a hostile server) is
    /// no stall and would hold the request for as long as bytes came (s30 upstream attack F1).
    pub async fn read_body_by(
        &self,
        resp: reqwest::Response,
        limit: usize,
        (until, late): (Instant, UpstreamError),
    ) -> Result<Bytes, UpstreamError> {
        match tokio::time::timeout_at(until.into(), self.read_body(resp, limit)).await {
            Ok(read) => read,
            Err(_) => Err(late),
        }
    }

    /// Reads a whole body, refusing one over `limit` bytes or one that stalls (no chunk for
    /// the stream idle timeout); only within a bound on the whole (`read_body_by`).
    async fn read_body(
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

/// Headers a request adds for its upstream: the client's `anthropic-beta` (Anthropic
/// only) and the attempt span's W3C `traceparent` (`ops::traces`; none when tracing is off).
pub type UpstreamHeaders<'a> = (Option<&'a HeaderValue>, Option<HeaderValue>);

#[cfg(test)]
mod tests;
