//! A Google service-account key file (Vertex AI), read and checked when the config is:
//! the config refuses an upstream whose file is missing or is not a service account's, and
//! `upstream::providers::gemini::token` signs the token request with it.
//!
//! The private key is never logged: it lives in `EncodingKey` (no `Debug` of its bytes).

use jsonwebtoken::EncodingKey;
use serde::Deserialize;

/// A service-account key file, read and checked once at load.
pub struct ServiceAccount {
    pub client_email: String,
    pub token_uri: String,
    pub(crate) key_id: Option<String>,
    pub(crate) key: EncodingKey,
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
}
