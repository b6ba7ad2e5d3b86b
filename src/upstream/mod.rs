//! Everything on the far side of the gateway: the configured deployments and models
//! (`catalog`), the HTTP client (`client`), per-deployment state (`pool`), the retry
//! table (`retry`), and the providers' wire formats (`providers`).

pub mod breaker;
pub mod catalog;
pub mod client;
pub mod credential;
pub mod gate;
pub mod live;
pub mod on_wire;
pub mod pool;
pub mod providers;
pub mod retry;
pub mod url_guard;

use std::time::Duration;

use bytes::Bytes;

/// One failed upstream attempt.
#[derive(Debug, Clone, thiserror::Error)]
pub enum UpstreamError {
    #[error("upstream did not answer within the first-byte timeout")]
    Timeout,
    /// The request's own deadline ran out before the upstream answered.
    #[error("the request's deadline ran out before the upstream answered")]
    Deadline,
    /// The request never reached the upstream: a refused or failed connection (its DNS, TLS
    /// or connect timeout), a credential that could not be made, a request that could not be
    /// built or signed. Such an attempt bills nothing (`pipeline::attempts`).
    #[error("cannot connect to upstream: {0}")]
    Connect(String),
    /// The connection broke after the request may have reached the upstream, before its
    /// answer: it may have worked on it.
    #[error("the connection to the upstream broke before its answer")]
    Broken,
    /// The request waited inside the gateway for room on its upstream's connection — an
    /// HTTP/2 connection at its server's stream cap — past the first-byte timeout or the
    /// deadline, and never went out: no fault of the upstream's.
    #[error(
        "the request waited for room on the upstream's HTTP/2 connection (its stream cap) and \
         never went out; keep the sum of max_concurrent over the upstreams at that host under \
         its stream cap"
    )]
    Held,
    /// The upstream's HTTP/2 server refused the request's stream on every resend
    /// (`REFUSED_STREAM`): it sheds load, and had none of it.
    #[error("the upstream refused the request's stream on every resend (overloaded)")]
    Refused,
    /// The gateway itself ran out of something (open files, socket buffers, memory) before
    /// the request left it: no fault of the upstream's (see `client::local_shortage`).
    #[error("the gateway ran out of {0} before the request reached the upstream")]
    LocalResources(&'static str),
    #[error("upstream answered {status}")]
    Status {
        status: u16,
        body: Bytes,
        retry_after: Option<Duration>,
    },
    #[error("upstream sent an unusable answer: {0}")]
    Garbage(&'static str),
    /// A well-formed answer holding a part the gateway's reader does not model (a Gemini
    /// image): unusable as garbage is — tried elsewhere, charged alike — but the upstream
    /// answered well, and its key gets no verdict (s28 diff attack F1).
    #[error("upstream sent an answer holding a kind of content the gateway cannot read")]
    Unsupported,
}
