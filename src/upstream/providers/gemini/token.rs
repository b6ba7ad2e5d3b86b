//! Vertex AI's access token from a service account: a JWT signed RS256 with the account's
//! private key (`iss` = the account's email, `scope` = cloud-platform, `aud` = its
//! `token_uri`, one hour) is exchanged at the `token_uri` (OAuth 2 JWT-bearer grant) for an
//! access token. This file is the exchange (`Vertex`); caching, refresh and the failure
//! rules are `credential::token::TokenSource`'s, the same as Entra ID's.
//!
//! The private key is never logged: it lives in `EncodingKey` (no `Debug` of its bytes).

use std::sync::Arc;

use chrono::{DateTime, Utc};
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use serde::{Deserialize, Serialize};

use crate::clock::Clock;
use crate::upstream::credential::token::{Exchange, TokenSource};

/// The OAuth scope Vertex AI takes.
pub const SCOPE: &str = "https://www.googleapis.com/auth/cloud-platform";
pub const GRANT_TYPE: &str = "urn:ietf:params:oauth:grant-type:jwt-bearer";

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
