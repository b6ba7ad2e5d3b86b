//! Azure OpenAI's transport: OpenAI's wire format at Azure's URLs, with Azure's
//! credentials. The classic path names the deployment and needs a dated `api-version`
//! (`/openai/deployments/{deployment}/chat/completions?api-version=2024-10-21`); the v1 GA
//! path is OpenAI's own under `/openai/v1` (`api_version = "v1"`, no version parameter, the
//! deployment's name as the body's `model`; `preview` adds `?api-version=preview`). The key
//! goes in the `api-key` header, or an Entra ID token from the client-credentials flow in
//! `Authorization: Bearer` (`EntraExchange`, cached by `credential::token::TokenSource`).

use std::sync::Arc;

use chrono::{DateTime, Utc};
use reqwest::header::HeaderName;

use crate::clock::SystemClock;
use crate::config::{EntraSettings, Secret, UpstreamSettings};
use crate::endpoint::Endpoint;
use crate::upstream::credential::token::{Exchange, TokenSource};
use crate::upstream::credential::Credential;

/// The URL of an endpoint for one Azure deployment; `None` without an `api_version`
/// (refused at load) or for a base URL that cannot take a path.
pub fn url(
    u: &UpstreamSettings,
    base: &str,
    endpoint: Endpoint,
    deployment: &str,
) -> Option<reqwest::Url> {
    let op: &[&str] = match endpoint {
        Endpoint::Chat | Endpoint::Messages | Endpoint::Responses => &["chat", "completions"],
        Endpoint::Completions => &["completions"],
        Endpoint::Embeddings => &["embeddings"],
    };
    let version = u.api_version.as_deref()?;
    // One path segment: the URL builder drops `.` and `..` (refused at load too).
    if matches!(deployment, "." | "..") {
        return None;
    }
    let mut url = reqwest::Url::parse(base).ok()?;
    {
        let mut path = url.path_segments_mut().ok()?;
        path.pop_if_empty();
        match version {
            "v1" | "preview" => path.extend(["openai", "v1"]),
            _ => path.extend(["openai", "deployments", deployment]),
        };
        path.extend(op);
    }
    if version != "v1" {
        url.query_pairs_mut().append_pair("api-version", version);
    }
    Some(url)
}

/// `api-key: <key>`, or an Entra ID token (`credential::token::TokenSource`) when `entra`
/// is set.
pub fn credential(u: &UpstreamSettings) -> Credential {
    match &u.entra {
        Some(e) => match EntraExchange::new(e) {
            Some(x) => Credential::Hook(Arc::new(TokenSource::new(
                Box::new(x),
                Arc::new(SystemClock),
            ))),
            None => Credential::Invalid,
        },
        None => Credential::header(HeaderName::from_static("api-key"), u.api_key.expose()),
    }
}

/// Entra ID's client-credentials flow for one app registration: a form POST of the app's
/// id and secret to the tenant's v2.0 token endpoint. Caching, refresh and failures are
/// `TokenSource`'s.
pub struct EntraExchange {
    url: reqwest::Url,
    client_id: String,
    client_secret: Secret,
    scope: String,
}

impl std::fmt::Debug for EntraExchange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EntraExchange")
            .field("url", &self.url.as_str())
            .field("client_id", &self.client_id)
            .finish_non_exhaustive()
    }
}

impl EntraExchange {
    /// `None` when the authority and tenant do not make a URL (refused at load).
    pub fn new(e: &EntraSettings) -> Option<EntraExchange> {
        let mut url = reqwest::Url::parse(&e.authority).ok()?;
        url.path_segments_mut().ok()?.pop_if_empty().extend([
            e.tenant_id.as_str(),
            "oauth2",
            "v2.0",
            "token",
        ]);
        Some(EntraExchange {
            url,
            client_id: e.client_id.clone(),
            client_secret: e.client_secret.clone(),
            scope: e.scope.clone(),
        })
    }

    /// The token endpoint's URL.
    pub fn endpoint(&self) -> &reqwest::Url {
        &self.url
    }
}

impl Exchange for EntraExchange {
    fn issuer(&self) -> &'static str {
        "Entra ID"
    }

    fn request(
        &self,
        http: &reqwest::Client,
        _now: DateTime<Utc>,
    ) -> Result<reqwest::RequestBuilder, String> {
        Ok(http.post(self.url.clone()).form(&[
            ("grant_type", "client_credentials"),
            ("client_id", &self.client_id),
            ("client_secret", self.client_secret.expose()),
            ("scope", &self.scope),
        ]))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn azure(version: &str) -> UpstreamSettings {
        UpstreamSettings {
            id: "az".into(),
            provider: crate::config::Provider::AzureOpenai,
            base_url: "https://res.openai.azure.com".into(),
            api_version: Some(version.into()),
            ..Default::default()
        }
    }

    #[test]
    fn the_classic_path_names_the_deployment_and_the_version() {
        let u = azure("2024-10-21");
        let url = |e| url(&u, &u.base_url, e, "my gpt/4o").unwrap().to_string();
        assert_eq!(
            url(Endpoint::Chat),
            "https://res.openai.azure.com/openai/deployments/my%20gpt%2F4o/chat/completions?api-version=2024-10-21"
        );
        assert_eq!(url(Endpoint::Messages), url(Endpoint::Chat));
        assert!(
            url(Endpoint::Embeddings).ends_with("/my%20gpt%2F4o/embeddings?api-version=2024-10-21")
        );
        let v1 = azure("v1");
        assert_eq!(
            super::url(&v1, "https://res.openai.azure.com/", Endpoint::Chat, "d")
                .unwrap()
                .as_str(),
            "https://res.openai.azure.com/openai/v1/chat/completions"
        );
        let preview = azure("preview");
        assert_eq!(
            super::url(&preview, &preview.base_url, Endpoint::Chat, "d")
                .unwrap()
                .as_str(),
            "https://res.openai.azure.com/openai/v1/chat/completions?api-version=preview"
        );
        let mut none = azure("x");
        none.api_version = None;
        assert!(super::url(&none, &none.base_url, Endpoint::Chat, "d").is_none());
    }

    #[test]
    fn the_token_endpoint_is_the_tenants() {
        let e = EntraSettings {
            tenant_id: "tenant-1".into(),
            client_id: "app".into(),
            client_secret: Secret(secrecy::SecretString::from("s3cret-value")),
            authority: "https://login.microsoftonline.com/".into(),
            scope: "https://cognitiveservices.azure.com/.default".into(),
        };
        let t = EntraExchange::new(&e).unwrap();
        assert_eq!(
            t.endpoint().as_str(),
            "https://login.microsoftonline.com/tenant-1/oauth2/v2.0/token"
        );
        assert!(!format!("{t:?}").contains("s3cret"));
        // The deployment's credential: the token source over it, redacted as well.
        let mut u = azure("2024-10-21");
        u.entra = Some(e);
        let printed = format!("{:?}", credential(&u));
        assert!(
            printed.contains("TokenSource") && !printed.contains("s3cret"),
            "{printed}"
        );
    }
}
