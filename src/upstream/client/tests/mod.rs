//! Tests of the upstream client, one module per concern, and the helpers they share: an
//! HTTP/2 client without TLS and its `post`, an error that wraps another.

mod causes;
mod held;
mod resend;

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;

use super::UpstreamClient;
use crate::config::UpstreamTimeouts;
use crate::upstream::catalog::Deployment;
use crate::upstream::url_guard::SystemResolver;
use crate::upstream::UpstreamError;

fn chat_url(addr: std::net::SocketAddr) -> reqwest::Url {
    reqwest::Url::parse(&format!("http://{addr}/v1/chat/completions")).expect("url")
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
