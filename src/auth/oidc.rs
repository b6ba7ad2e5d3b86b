//! OpenID Connect for the admin UI: the authorization code flow with PKCE, on the
//! `openidconnect` crate over the gateway's reqwest.
//!
//! - The provider's metadata and signing keys come from discovery (`/.well-known/openid-
//!   configuration` under the issuer, whose document must name the same issuer). A provider
//!   that cannot be reached at start does not stop the gateway: discovery is retried every
//!   few seconds and at a sign-in (one at a time, at most one started a second), SSO
//!   answers 503 until it succeeds, and it is re-read every 15 minutes afterwards (the
//!   provider's key rotation), keeping the last good copy on failure. An ID
//!   token signed by a key the copy does not hold (a rotation that took effect at once,
//!   as Keycloak's does) makes one re-read at once — at most every `UNKNOWN_KEY_REREAD` —
//!   and the token is checked again against the new keys.
//! - `begin` sends the browser to the provider with a fresh `state`, `nonce` and PKCE
//!   challenge; the three secrets travel in one short-lived (10 min) HttpOnly cookie, MACed
//!   under a key derived from the client secret, so every replica can read it and only the
//!   browser that began the sign-in can finish it.
//! - `finish` checks the `state` against that cookie, trades the code (with the PKCE
//!   verifier and the client secret) for tokens, and accepts the ID token only with a good
//!   signature from the provider's keys, our client id in `aud`, the discovered issuer in
//!   `iss`, the cookie's `nonce`, and `exp` / `iat` within `clock_skew_seconds` of now.

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use hmac::{Hmac, Mac};
use openidconnect::core::{
    CoreAuthenticationFlow, CoreClient, CoreGenderClaim, CoreJweContentEncryptionAlgorithm,
    CoreJwsSigningAlgorithm,
};
use openidconnect::{
    AdditionalClaims, AuthorizationCode, ClaimsVerificationError, ClientId, ClientSecret,
    CsrfToken, IdToken, IssuerUrl, Nonce, PkceCodeChallenge, PkceCodeVerifier,
    ProviderMetadataWithLogout, RedirectUrl, Scope, SignatureVerificationError, TokenResponse,
};
use parking_lot::RwLock;
use serde::{Deserialize, Serialize};
use sha2::Sha256;
use url::Url;

use crate::config::OidcSettings;

/// How long a begun sign-in may take at the provider.
pub const FLOW_LIFETIME: Duration = Duration::from_secs(600);
/// Re-read the discovery document (and the signing keys) this often.
const REDISCOVER: Duration = Duration::from_secs(15 * 60);
/// Retry a failed discovery after this long (the provider may be briefly down).
const RETRY: Duration = Duration::from_secs(3);
/// The least time between two re-reads for a token signed by a key not held: anyone can
/// make such a token, and each re-read is a call to the provider.
const UNKNOWN_KEY_REREAD: Duration = Duration::from_secs(30);
/// The least time between the starts of two discoveries sign-ins ask for while none has
/// succeeded (a provider that came up after the gateway is used at a click, not at the next
/// `RETRY`): anyone can click the button, and each is a call or two to the provider.
const ON_DEMAND: Duration = Duration::from_secs(1);
/// How long a click waits on such a discovery: a provider that takes a connection and never
/// answers would otherwise hold each clicker for the client's 10 s.
const ON_DEMAND_WAIT: Duration = Duration::from_secs(3);

/// Whether `gap` has passed since `last` (and marks now): a call to the provider that anyone
/// can cause is spaced.
fn spaced(last: &parking_lot::Mutex<Option<std::time::Instant>>, gap: Duration) -> bool {
    let mut last = last.lock();
    if last.is_some_and(|t| t.elapsed() < gap) {
        return false;
    }
    *last = Some(std::time::Instant::now());
    true
}

pub fn flow_cookie_name(secure: bool) -> &'static str {
    if secure {
        "__Host-sluice_oidc"
    } else {
        "sluice_oidc"
    }
}

#[derive(Debug, thiserror::Error)]
pub enum SsoError {
    #[error("Single sign-on is not available yet: the identity provider could not be reached. Try again in a moment.")]
    Unavailable,
    #[error("This sign-in was not started in this browser, or it has expired. Start again.")]
    Flow,
    #[error("The identity provider refused the sign-in: {0}")]
    Provider(String),
    #[error("The identity provider's answer was refused: {0}")]
    Token(String),
}

/// Every claim of a verified ID token, for the `[[oidc.roles]]` mapping.
#[derive(Debug, Clone, Deserialize, Serialize)]
pub struct AllClaims {
    #[serde(flatten)]
    pub rest: serde_json::Map<String, serde_json::Value>,
}
impl AdditionalClaims for AllClaims {}

type FullIdToken =
    IdToken<AllClaims, CoreGenderClaim, CoreJweContentEncryptionAlgorithm, CoreJwsSigningAlgorithm>;

/// Who the provider says signed in.
#[derive(Debug, Clone)]
pub struct Identity {
    pub issuer: String,
    pub subject: String,
    /// A name for people to read (`readable`): the verified `email`, else
    /// `preferred_username`, else the subject.
    pub name: String,
    pub claims: serde_json::Map<String, serde_json::Value>,
}

/// The first `len` hex digits of a digest of the identity (issuer and subject): a suffix
/// that tells two logins of one name apart, the same at every sign-in.
pub fn identity_tag(issuer: &str, subject: &str, len: usize) -> String {
    use sha2::Digest;
    let tag = hex::encode(sha2::Sha256::digest(format!("{issuer}\n{subject}")));
    tag[..len.min(tag.len())].to_string()
}

/// A provider's name claim as Sluice shows and stores it: at most 100 characters, without
/// control or bidirectional-override characters (a NUL, a line break or a right-to-left
/// override would garble or forge an audit row), nor the parentheses the audit name puts
/// the subject and issuer in.
fn readable(name: &str) -> String {
    name.chars()
        .take(100)
        .map(|c| match c {
            '(' => '[',
            ')' => ']',
            c if c.is_control()
                || matches!(c, '\u{200E}' | '\u{200F}' | '\u{202A}'..='\u{202E}' | '\u{2066}'..='\u{2069}')
                || invisible(c) =>
            {
                '\u{FFFD}'
            }
            c => c,
        })
        .collect()
}

/// Characters that show nothing (zero-width, soft hyphen, word joiner, byte-order mark,
/// the Arabic letter mark, line and paragraph separators): in a name they make two logins
/// look alike, or a name look empty.
fn invisible(c: char) -> bool {
    matches!(
        c,
        '\u{00AD}'
            | '\u{061C}'
            | '\u{180E}'
            | '\u{200B}'..='\u{200D}'
            | '\u{2028}'
            | '\u{2029}'
            | '\u{2060}'..='\u{2064}'
            | '\u{FEFF}'
    )
}

/// The client for one flow step, from the metadata discovered last.
macro_rules! client {
    ($sso:expr, $meta:expr) => {
        CoreClient::from_provider_metadata(
            $meta,
            ClientId::new($sso.settings.client_id.clone()),
            Some(ClientSecret::new(
                $sso.settings.client_secret.expose().to_string(),
            )),
        )
        .set_redirect_uri($sso.redirect.clone())
    };
}

pub struct Sso {
    pub settings: OidcSettings,
    redirect: RedirectUrl,
    http: reqwest::Client,
    metadata: RwLock<Option<ProviderMetadataWithLogout>>,
    /// When a token signed by an unknown key last made a re-read (`UNKNOWN_KEY_REREAD`).
    reread: parking_lot::Mutex<Option<std::time::Instant>>,
    /// When a sign-in last asked for a discovery (`ON_DEMAND`).
    asked: parking_lot::Mutex<Option<std::time::Instant>>,
    /// Held by the one discovery a sign-in runs: never two at once.
    asking: tokio::sync::Mutex<()>,
    flow_key: [u8; 32],
}

impl Sso {
    pub fn new(settings: OidcSettings) -> Result<Arc<Sso>, String> {
        let redirect = RedirectUrl::new(settings.redirect_url.clone())
            .map_err(|e| format!("[oidc] redirect_url: {e}"))?;
        // No redirects: a provider's endpoint that redirects is refused, not followed
        // (the crate's advice, against SSRF through a metadata document).
        let http = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .timeout(Duration::from_secs(10))
            .build()
            .map_err(|e| format!("[oidc] HTTP client: {e}"))?;
        let flow_key = hkdf_key(settings.client_secret.expose());
        Ok(Arc::new(Sso {
            settings,
            redirect,
            http,
            metadata: RwLock::new(None),
            reread: parking_lot::Mutex::new(None),
            asked: parking_lot::Mutex::new(None),
            asking: tokio::sync::Mutex::new(()),
            flow_key,
        }))
    }

    /// Discovery now, then again until it succeeds, then every `REDISCOVER`.
    pub fn spawn_discovery(self: &Arc<Self>) {
        let sso = Arc::downgrade(self);
        tokio::spawn(async move {
            loop {
                let Some(s) = sso.upgrade() else { return };
                let wait = match s.discover().await {
                    Ok(()) => REDISCOVER,
                    Err(e) => {
                        tracing::error!(issuer = %s.settings.issuer, error = %e, "OIDC discovery failed; single sign-on waits for it");
                        RETRY
                    }
                };
                drop(s);
                tokio::time::sleep(wait).await;
            }
        });
    }

    pub async fn discover(&self) -> Result<(), String> {
        let issuer = IssuerUrl::new(self.settings.issuer.clone()).map_err(|e| e.to_string())?;
        let meta = ProviderMetadataWithLogout::discover_async(issuer, &self.http)
            .await
            .map_err(|e| error_chain(&e))?;
        *self.metadata.write() = Some(meta);
        Ok(())
    }

    /// Discovery now when none has succeeded yet: a sign-in begun before the background
    /// retry found the provider. One at a time, started at most once every `ON_DEMAND`,
    /// waited on for at most `ON_DEMAND_WAIT`; a click meanwhile answers at once.
    pub async fn discover_if_missing(&self) {
        if self.ready() {
            return;
        }
        // Released on drop, so a clicker who leaves mid-way frees it too.
        let Ok(_one) = self.asking.try_lock() else {
            return;
        };
        if !spaced(&self.asked, ON_DEMAND) {
            return;
        }
        let error = match tokio::time::timeout(ON_DEMAND_WAIT, self.discover()).await {
            Ok(Ok(())) => return,
            Ok(Err(e)) => e,
            Err(_) => format!("no answer within {} s", ON_DEMAND_WAIT.as_secs()),
        };
        tracing::warn!(issuer = %self.settings.issuer, error = %error, "OIDC discovery at a sign-in failed");
    }

    pub fn ready(&self) -> bool {
        self.metadata.read().is_some()
    }

    fn metadata(&self) -> Result<ProviderMetadataWithLogout, SsoError> {
        self.metadata.read().clone().ok_or(SsoError::Unavailable)
    }

    /// Where to send the browser, and the flow cookie's value.
    pub fn begin(&self, now: DateTime<Utc>) -> Result<(Url, String), SsoError> {
        let client = client!(self, self.metadata()?);
        let (challenge, verifier) = PkceCodeChallenge::new_random_sha256();
        let mut req = client
            .authorize_url(
                CoreAuthenticationFlow::AuthorizationCode,
                CsrfToken::new_random,
                Nonce::new_random,
            )
            .set_pkce_challenge(challenge);
        for scope in &self.settings.scopes {
            req = req.add_scope(Scope::new(scope.clone()));
        }
        let (url, state, nonce) = req.url();
        let expires = now.timestamp() + FLOW_LIFETIME.as_secs() as i64;
        let body = format!(
            "{expires}.{}.{}.{}",
            state.secret(),
            nonce.secret(),
            verifier.secret()
        );
        let mac = hex::encode(self.mac(&body));
        Ok((url, format!("{body}.{mac}")))
    }

    /// Checks the callback against the flow cookie, trades the code and verifies the ID token.
    pub async fn finish(
        &self,
        cookie: Option<&str>,
        state: &str,
        code: &str,
        now: DateTime<Utc>,
    ) -> Result<Identity, SsoError> {
        let (nonce, verifier) = self.open_flow(cookie, state, now)?;
        let meta = self.metadata()?;
        let issuer = meta.issuer().to_string();
        let client = client!(self, meta);
        let token = client
            .exchange_code(AuthorizationCode::new(code.to_string()))
            .map_err(|e| SsoError::Provider(e.to_string()))?
            .set_pkce_verifier(PkceCodeVerifier::new(verifier))
            .request_async(&self.http)
            .await
            .map_err(|e| SsoError::Provider(error_chain(&e)))?;
        let id_token = token
            .id_token()
            .ok_or_else(|| SsoError::Token("no ID token in the token response".into()))?;
        let full: FullIdToken = id_token
            .to_string()
            .parse()
            .map_err(|e: serde_json::Error| SsoError::Token(e.to_string()))?;
        let skew = chrono::Duration::seconds(self.settings.clock_skew_seconds as i64);
        // The checks, for a client of the metadata in use (a macro: the client's type is
        // the crate's typestate generics).
        macro_rules! check {
            ($client:expr) => {
                $client
                    .id_token_verifier()
                    // RS256 under the discovered keys only, whatever the provider lists: the
                    // crate takes the discovery document's algorithms, and an HMAC one
                    // (Keycloak lists HS256–512) is checked with the client secret, which
                    // would make that secret a key to mint ID tokens with (s30 identity
                    // attack F5).
                    .set_allowed_algs([CoreJwsSigningAlgorithm::RsaSsaPkcs1V15Sha256])
                    // `exp` is compared with this time: a token is taken up to `skew` past
                    // its expiry.
                    .set_time_fn(move || now - skew)
                    .set_issue_time_verifier_fn(move |iat| {
                        if iat > now + skew {
                            Err(format!("issued in the future ({iat})"))
                        } else {
                            Ok(())
                        }
                    })
            };
        }
        let fresh;
        let claims = match full.claims(&check!(client), &Nonce::new(nonce.clone())) {
            Err(ClaimsVerificationError::SignatureVerification(
                SignatureVerificationError::NoMatchingKey,
            )) if spaced(&self.reread, UNKNOWN_KEY_REREAD) => {
                // The provider could not be read: its fault, not the token's (logged, not
                // audited as a token failing its checks).
                self.discover().await.map_err(SsoError::Provider)?;
                fresh = client!(self, self.metadata()?);
                full.claims(&check!(fresh), &Nonce::new(nonce))
            }
            checked => checked,
        }
        .map_err(|e| SsoError::Token(e.to_string()))?;
        let subject = claims.subject().to_string();
        // OpenID Connect: at most 255 ASCII characters. Anything else would reach the
        // store (which refuses a NUL) and the audit rows.
        if subject.is_empty()
            || subject.len() > 255
            || !subject.bytes().all(|b| b.is_ascii_graphic())
        {
            return Err(SsoError::Token(
                "the `sub` claim is not a valid subject".into(),
            ));
        }
        // The name people read (a new login's username, the audit rows): an email only
        // where the provider verified it — else an insider could take a colleague's
        // address as their login's name first.
        let verified_email = claims
            .email()
            .filter(|_| claims.email_verified() == Some(true))
            .map(|e| e.to_string());
        // A username the provider lets its user choose may not pass for an address:
        // one shaped like an email gets the identity's tag (`bob@corp.com~1a2b3c4d`).
        let chosen = |u: &str| {
            let u = readable(u);
            match u.contains('@') {
                true => format!("{u}~{}", identity_tag(&issuer, &subject, 8)),
                false => u,
            }
        };
        let name = verified_email
            .map(|n| readable(&n))
            .or_else(|| claims.preferred_username().map(|u| chosen(u)))
            .filter(|n| !n.trim().is_empty())
            .unwrap_or_else(|| readable(&subject));
        // The crate parses the standard claims out of the rest: put back those a mapping
        // may name — `email` only when the provider says it verified it (else anyone could
        // claim an address of the mapped domain at a provider that lets users set theirs).
        let mut map = claims.additional_claims().rest.clone();
        map.insert("sub".into(), subject.clone().into());
        if let Some(u) = claims.preferred_username() {
            map.insert("preferred_username".into(), u.to_string().into());
        }
        if claims.email_verified() == Some(true) {
            if let Some(e) = claims.email() {
                map.insert("email".into(), e.to_string().into());
            }
        }
        Ok(Identity {
            issuer,
            subject,
            name,
            claims: map,
        })
    }

    /// The provider's `end_session_endpoint` (RP-initiated logout), when it has one.
    pub fn end_session_url(&self) -> Option<Url> {
        let meta = self.metadata.read();
        let end = meta
            .as_ref()?
            .additional_metadata()
            .end_session_endpoint
            .clone()?;
        let mut url = end.url().clone();
        url.query_pairs_mut()
            .append_pair("client_id", &self.settings.client_id);
        Some(url)
    }

    /// The (nonce, PKCE verifier) of the flow cookie, if it is ours, unexpired, and began
    /// the sign-in that `state` names.
    fn open_flow(
        &self,
        cookie: Option<&str>,
        state: &str,
        now: DateTime<Utc>,
    ) -> Result<(String, String), SsoError> {
        let cookie = cookie.ok_or(SsoError::Flow)?;
        let (body, mac) = cookie.rsplit_once('.').ok_or(SsoError::Flow)?;
        let mac = hex::decode(mac).map_err(|_| SsoError::Flow)?;
        let mut m = self.mac_state();
        m.update(body.as_bytes());
        m.verify_slice(&mac).map_err(|_| SsoError::Flow)?;
        let mut parts = body.splitn(4, '.');
        let (Some(expires), Some(s), Some(nonce), Some(verifier)) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(SsoError::Flow);
        };
        let expires: i64 = expires.parse().map_err(|_| SsoError::Flow)?;
        // Compared in constant time: the state is the cookie's binding to the callback.
        let same = s.len() == state.len()
            && s.bytes()
                .zip(state.bytes())
                .fold(0u8, |acc, (a, b)| acc | (a ^ b))
                == 0;
        if !same || now.timestamp() > expires {
            return Err(SsoError::Flow);
        }
        Ok((nonce.to_string(), verifier.to_string()))
    }

    #[allow(clippy::expect_used)]
    fn mac_state(&self) -> Hmac<Sha256> {
        // cannot fail: HMAC takes a key of any length (`new_from_slice` returns a Result
        // only because it shares the `KeyInit` trait with fixed-key MACs).
        Hmac::<Sha256>::new_from_slice(&self.flow_key).expect("HMAC takes a key of any length")
    }

    fn mac(&self, body: &str) -> Vec<u8> {
        let mut m = self.mac_state();
        m.update(body.as_bytes());
        m.finalize().into_bytes().to_vec()
    }
}

/// The flow cookie's MAC key: HKDF of the client secret, which every replica holds.
#[allow(clippy::expect_used)]
fn hkdf_key(secret: &str) -> [u8; 32] {
    let mut out = [0u8; 32];
    // cannot fail: 32 bytes is far below HKDF-SHA256's limit (255 × 32) for `expand`.
    hkdf::Hkdf::<Sha256>::new(Some(b"sluice-oidc-flow"), secret.as_bytes())
        .expand(b"flow cookie", &mut out)
        .expect("32 bytes is a valid HKDF-SHA256 length");
    out
}

/// An error and its sources on one line (the crate's top-level messages are terse).
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}
