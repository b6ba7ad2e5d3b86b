//! Vertex AI's access token from a service account: a JWT signed RS256 with the account's
//! private key (`iss` = the account's email, `scope` = cloud-platform, `aud` = its
//! `token_uri`, one hour) is exchanged at the `token_uri` (OAuth 2 JWT-bearer grant) for an
//! access token. This file is the exchange (`Vertex`); caching, refresh and the failure
//! rules are `credential::token::TokenSource`'s, the same as Entra ID's.
//!
//! The private key is never logged: it lives in `EncodingKey` (no `Debug` of its bytes).

use std::sync::Arc;

use chrono::{DateTime, Utc};
use jsonwebtoken::{Algorithm, Header};
use serde::Serialize;

use crate::clock::Clock;
pub use crate::config::ServiceAccount;
use crate::upstream::credential::token::{Exchange, TokenSource};

/// The OAuth scope Vertex AI takes.
pub const SCOPE: &str = "https://www.googleapis.com/auth/cloud-platform";
pub const GRANT_TYPE: &str = "urn:ietf:params:oauth:grant-type:jwt-bearer";

impl ServiceAccount {
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

/// Vertex AI's exchange: a JWT signed with the service account's key, posted to its
/// `token_uri` (the JWT-bearer grant). An account that failed to load refuses every
/// exchange as a 401 naming why.
pub struct Vertex {
    account: Result<ServiceAccount, String>,
}

impl std::fmt::Debug for Vertex {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Vertex")
            .field("account", &self.account.as_ref().map(|a| &a.client_email))
            .finish()
    }
}

impl Exchange for Vertex {
    fn issuer(&self) -> &'static str {
        "Vertex AI"
    }

    /// The assertion's `iat` and `exp` are this host's clock.
    fn stamped(&self) -> bool {
        true
    }

    fn request(
        &self,
        http: &reqwest::Client,
        now: DateTime<Utc>,
    ) -> Result<reqwest::RequestBuilder, String> {
        let account = self.account.as_ref().map_err(String::clone)?;
        let assertion = account
            .assertion(now)
            .map_err(|_| "the service account's key cannot sign".to_string())?;
        Ok(http.post(&account.token_uri).form(&[
            ("grant_type", GRANT_TYPE),
            ("assertion", assertion.as_str()),
        ]))
    }
}

/// The token source of a service account (its load's outcome), on `clock`.
pub fn source(account: Result<ServiceAccount, String>, clock: Arc<dyn Clock>) -> TokenSource {
    TokenSource::new(Box::new(Vertex { account }), clock)
}
