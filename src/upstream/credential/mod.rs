//! How a deployment proves who it is to its upstream. Most send one header built once at
//! start (`Static`: no allocation per request); a local server sends nothing (`None`); some
//! compute it at send time (`Hook`): a bearer token fetched and refreshed (Azure's Entra ID,
//! Vertex AI's service account), a signature over the request (AWS SigV4). A hook gets the
//! request as it will be sent and returns it with its credential added, so a signature can
//! cover the URL, the headers and the body. Bearer tokens from a token endpoint are one
//! type for every issuer, `token::TokenSource`, with one set of failure rules.

pub mod token;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use reqwest::header::{HeaderName, HeaderValue};

use super::UpstreamError;

/// A credential computed when a request is sent.
pub trait Authorize: Send + Sync + std::fmt::Debug {
    /// `req` with its credential added. `http` is the deployment's own guarded client (for a
    /// token endpoint); the caller bounds the whole call by the first-byte timeout and the
    /// request's deadline. A credential the far side refused is a `Status` 401 (the key is
    /// then disabled like any refused key); one that could not be fetched is a `Connect`.
    fn authorize<'a>(
        &'a self,
        http: &'a reqwest::Client,
        req: reqwest::Request,
    ) -> Pin<Box<dyn Future<Output = Result<reqwest::Request, UpstreamError>> + Send + 'a>>;

    /// The far side answered 401 to a request sent with this `Authorization` value: a
    /// cached credential that is this one is dropped, so that the next `authorize` makes a
    /// new one (`post` then sends the request once more). A token can be refused before the
    /// expiry announced with it (revoked early): that is no refused key. Default: nothing
    /// cached, and `post` sends no second request.
    fn refused(&self, _sent: &HeaderValue) {}

    /// Whether a 401 is worth one more try with a new credential (`refused` drops one).
    fn cached(&self) -> bool {
        false
    }
}

#[derive(Debug, Clone)]
pub enum Credential {
    /// One header, built once and marked sensitive so that no debug print shows it.
    Static(HeaderName, HeaderValue),
    /// No credential header at all (a local model server).
    None,
    /// Computed per request (see `Authorize`).
    Hook(Arc<dyn Authorize>),
    /// The configured key is not a valid header value: every call fails as a request error.
    Invalid,
}

impl Credential {
    /// A static header from a key, sensitive; `Invalid` if the key cannot be a header value.
    pub fn header(name: HeaderName, value: &str) -> Credential {
        match HeaderValue::from_str(value) {
            Ok(mut v) => {
                v.set_sensitive(true);
                Credential::Static(name, v)
            }
            Err(_) => Credential::Invalid,
        }
    }
}
