//! A small OpenID provider the test controls: discovery, the JWKS of
//! `tests/fixtures/oidc/jwks.json`, and a token endpoint that answers every code with the
//! ID token the test chose next (signed RS256 with the fixture's private key, or not at all).
//! It records each token request so a test can check what the gateway sent.

use std::sync::{Arc, Mutex};

use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

pub struct Issuer {
    pub url: String,
    /// The `issuer` the discovery document names (by default `url`).
    pub issuer: String,
    next: Arc<Mutex<Option<String>>>,
    pub token_requests: Arc<Mutex<Vec<String>>>,
    jwks: Arc<Mutex<Value>>,
}

pub fn private_key_pem() -> String {
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/gemini/test-service-account.json"
    ))
    .unwrap();
    let v: Value = serde_json::from_str(&text).unwrap();
    v["private_key"].as_str().unwrap().to_string()
}

impl Issuer {
    pub async fn start() -> Issuer {
        Issuer::start_claiming(None).await
    }

    /// `claimed`: the issuer the discovery document states, when not its own URL.
    pub async fn start_claiming(claimed: Option<&str>) -> Issuer {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        Issuer::start_on(listener, claimed)
    }

    /// On a listener the test made (a provider that comes up after the gateway).
    pub fn start_on(listener: TcpListener, claimed: Option<&str>) -> Issuer {
        let url = format!("http://127.0.0.1:{}", listener.local_addr().unwrap().port());
        let issuer = claimed.map(str::to_string).unwrap_or_else(|| url.clone());
        let next = Arc::new(Mutex::new(None::<String>));
        let token_requests = Arc::new(Mutex::new(Vec::new()));
        let jwks: Value = serde_json::from_str(include_str!("../fixtures/oidc/jwks.json")).unwrap();
        let jwks = Arc::new(Mutex::new(jwks));
        let served = jwks.clone();
        let discovery = json!({
            "issuer": issuer,
            "authorization_endpoint": format!("{url}/auth"),
            "token_endpoint": format!("{url}/token"),
            "jwks_uri": format!("{url}/jwks"),
            "end_session_endpoint": format!("{url}/logout"),
            "response_types_supported": ["code"],
            "subject_types_supported": ["public"],
            // HMAC listed too, as Keycloak lists it by default.
            "id_token_signing_alg_values_supported": ["RS256", "HS256"],
        });
        let (n2, t2) = (next.clone(), token_requests.clone());
        tokio::spawn(async move {
            loop {
                let Ok((mut sock, _)) = listener.accept().await else {
                    return;
                };
                let (next, tokens, jwks, discovery) =
                    (n2.clone(), t2.clone(), served.clone(), discovery.clone());
                tokio::spawn(async move {
                    let Some((path, body)) = read_request(&mut sock).await else {
                        return;
                    };
                    let (status, out) = match path.split('?').next().unwrap_or("") {
                        "/.well-known/openid-configuration" => (200, discovery),
                        "/jwks" => (200, jwks.lock().unwrap().clone()),
                        "/token" => {
                            tokens.lock().unwrap().push(body);
                            match next.lock().unwrap().take() {
                                Some(id_token) => (
                                    200,
                                    json!({"access_token": "at-1", "token_type": "Bearer",
                                           "expires_in": 300, "id_token": id_token}),
                                ),
                                None => (400, json!({"error": "invalid_grant"})),
                            }
                        }
                        _ => (404, json!({"error": "not_found"})),
                    };
                    let text = out.to_string();
                    let resp = format!(
                        "HTTP/1.1 {status} X\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{text}",
                        text.len()
                    );
                    let _ = sock.write_all(resp.as_bytes()).await;
                });
            }
        });
        Issuer {
            url,
            issuer,
            next,
            token_requests,
            jwks,
        }
    }

    /// Publishes the signing key under `kid` from now on (a provider's key rotation; the
    /// key itself stays, so `sign_as` signs for it).
    pub fn rotate_to(&self, kid: &str) {
        self.jwks.lock().unwrap()["keys"][0]["kid"] = json!(kid);
    }

    /// Every code refused (`invalid_grant`), as for a code the provider never issued.
    pub fn answer_nothing(&self) {
        *self.next.lock().unwrap() = None;
    }

    /// The ID token the next code is traded for.
    pub fn answer_with(&self, id_token: String) {
        *self.next.lock().unwrap() = Some(id_token);
    }

    /// Standard claims for `sub` with `nonce`, from this issuer, for `aud`, valid 5 minutes,
    /// with a verified email.
    pub fn claims(&self, aud: &str, sub: &str, nonce: &str) -> Value {
        let now = chrono::Utc::now().timestamp();
        json!({"iss": self.issuer, "aud": aud, "sub": sub, "nonce": nonce,
               "iat": now, "exp": now + 300, "email": format!("{sub}@example.com"),
               "email_verified": true})
    }
}

pub fn sign(claims: &Value) -> String {
    sign_as(claims, "test-1")
}

/// Signed with the fixture's key, named `kid` in the header.
pub fn sign_as(claims: &Value, kid: &str) -> String {
    let key = jsonwebtoken::EncodingKey::from_rsa_pem(private_key_pem().as_bytes()).unwrap();
    let mut header = jsonwebtoken::Header::new(jsonwebtoken::Algorithm::RS256);
    header.kid = Some(kid.into());
    jsonwebtoken::encode(&header, claims, &key).unwrap()
}

/// Signed HS256 with `secret` (a client secret, as a provider offering HMAC ID tokens keys
/// them).
pub fn sign_hs256(claims: &Value, secret: &str) -> String {
    let key = jsonwebtoken::EncodingKey::from_secret(secret.as_bytes());
    jsonwebtoken::encode(
        &jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256),
        claims,
        &key,
    )
    .unwrap()
}

async fn read_request(sock: &mut tokio::net::TcpStream) -> Option<(String, String)> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        let n = sock.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
        let text = String::from_utf8_lossy(&buf).to_string();
        if let Some(end) = text.find("\r\n\r\n") {
            let head = &text[..end];
            let len: usize = head
                .lines()
                .find_map(|l| {
                    let (k, v) = l.split_once(':')?;
                    k.eq_ignore_ascii_case("content-length")
                        .then(|| v.trim().parse().ok())?
                })
                .unwrap_or(0);
            if buf.len() >= end + 4 + len {
                let path = head.split_whitespace().nth(1)?.to_string();
                let body = String::from_utf8_lossy(&buf[end + 4..end + 4 + len]).to_string();
                return Some((path, body));
            }
        }
    }
}
