//! AWS Signature Version 4 for Bedrock requests, through the maintained `aws-sigv4` crate
//! (the one the AWS SDK for Rust signs with): the canonical request, the string to sign and
//! the key derivation are AWS's code, not ours. This module only says what is signed: the
//! method, the exact URL, the headers the gateway sends and the exact body bytes.
//!
//! Nothing here logs: the secret key and the session token go into the signer and come out
//! only as the signature (and the token as its own header, which AWS requires).

use std::time::SystemTime;

use aws_credential_types::Credentials;
use aws_sigv4::http_request::{
    sign, PayloadChecksumKind, SignableBody, SignableRequest, SigningSettings,
};
use aws_sigv4::sign::v4;
use aws_smithy_runtime_api::client::identity::Identity;

/// A request that cannot be signed (a URL or header the signer cannot read). Its text
/// names no secret: the signer's errors describe the request, never the credentials.
#[derive(Debug, Clone, thiserror::Error)]
#[error("cannot sign the Bedrock request: {0}")]
pub struct SignError(pub String);

/// Long-term or temporary AWS credentials and the scope they sign for.
#[derive(Clone)]
pub struct Signer {
    identity: Identity,
    region: String,
    service: String,
}

/// Never prints the secret or the token (`Credentials`' own `Debug` redacts them too).
impl std::fmt::Debug for Signer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Signer")
            .field("region", &self.region)
            .field("service", &self.service)
            .finish_non_exhaustive()
    }
}

/// Whether the body's SHA-256 travels in an `x-amz-content-sha256` header too (S3 wants
/// it; Bedrock does not, and the body is signed either way).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyHashHeader {
    Omit,
    Send,
}

impl Signer {
    pub fn new(
        access_key_id: &str,
        secret_access_key: &str,
        session_token: Option<&str>,
        region: &str,
        service: &str,
    ) -> Signer {
        let credentials = Credentials::new(
            access_key_id,
            secret_access_key,
            session_token.map(str::to_string),
            None,
            "sluice-config",
        );
        Signer {
            identity: credentials.into(),
            region: region.to_string(),
            service: service.to_string(),
        }
    }

    /// The headers to add to a request of `method` to `url` carrying `headers` (which are
    /// signed too, `host` from the URL when absent) and exactly `body`, signed at `time`:
    /// `authorization`, `x-amz-date`, and `x-amz-security-token` with a session token.
    pub fn sign(
        &self,
        method: &str,
        url: &str,
        headers: &[(&str, &str)],
        body: &[u8],
        time: SystemTime,
        body_hash: BodyHashHeader,
    ) -> Result<Vec<(&'static str, String)>, SignError> {
        let mut settings = SigningSettings::default();
        if body_hash == BodyHashHeader::Send {
            settings.payload_checksum_kind = PayloadChecksumKind::XAmzSha256;
        }
        let params = v4::SigningParams::builder()
            .identity(&self.identity)
            .region(&self.region)
            .name(&self.service)
            .time(time)
            .settings(settings)
            .build()
            .map_err(|e| SignError(e.to_string()))?
            .into();
        let request = SignableRequest::new(
            method,
            url,
            headers.iter().copied(),
            SignableBody::Bytes(body),
        )
        .map_err(|e| SignError(e.to_string()))?;
        let (instructions, _signature) = sign(request, &params)
            .map_err(|e| SignError(e.to_string()))?
            .into_parts();
        let (added, _params) = instructions.into_parts();
        Ok(added
            .into_iter()
            .map(|h| (h.name(), h.value().to_string()))
            .collect())
    }
}

#[cfg(test)]
mod tests {
    //! AWS's published SigV4 test suite (`aws-signing-test-suite/v4`, as shipped inside the
    //! `aws-sigv4` crate and in AWS's documentation), copied under
    //! `tests/fixtures/bedrock/sigv4/<case>/`: each case's request is signed through
    //! `Signer::sign`, the function the gateway signs Bedrock calls with, and the
    //! `Authorization` header must equal the published one byte for byte.

    use super::*;
    use crate::upstream::providers::formats::fixtures;
    use std::time::Duration;

    struct Case {
        method: String,
        url: String,
        headers: Vec<(String, String)>,
        body: Vec<u8>,
        access_key_id: String,
        secret: String,
        token: Option<String>,
        sign_body: bool,
        authorization: String,
    }

    fn load(case: &str) -> Case {
        let read = |f: &str| fixtures::text("bedrock", &format!("sigv4/{case}/{f}"));
        let context: serde_json::Value = serde_json::from_str(&read("context.json")).unwrap();
        assert_eq!(context["region"], "us-east-1");
        assert_eq!(context["service"], "service");
        assert_eq!(context["timestamp"], "2015-08-30T12:36:00Z");
        let request = read("request.txt").replace("\r\n", "\n");
        let (head, body) = request.split_once("\n\n").unwrap_or((request.as_str(), ""));
        let mut lines = head.lines();
        let start: Vec<&str> = lines.next().unwrap().split(' ').collect();
        let headers: Vec<(String, String)> = lines
            .map(|l| {
                let (n, v) = l.split_once(':').unwrap();
                (n.to_string(), v.to_string())
            })
            .collect();
        let host = &headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case("host"))
            .unwrap()
            .1;
        // The path as the suite writes it: get-utf8's is raw UTF-8, which the signer
        // encodes (twice, as every AWS service but S3 expects).
        let url = format!("https://{host}{}", start[1]);
        let signed = read("header-signed-request.txt");
        let authorization = signed
            .lines()
            .find_map(|l| l.strip_prefix("Authorization:"))
            .unwrap()
            .to_string();
        let creds = &context["credentials"];
        Case {
            method: start[0].to_string(),
            url,
            headers,
            body: body.trim_end_matches('\n').as_bytes().to_vec(),
            access_key_id: creds["access_key_id"].as_str().unwrap().into(),
            secret: creds["secret_access_key"].as_str().unwrap().into(),
            token: creds["token"].as_str().map(str::to_string),
            sign_body: context["sign_body"] == true,
            authorization,
        }
    }

    fn signed_authorization(case: &Case) -> String {
        let signer = Signer::new(
            &case.access_key_id,
            &case.secret,
            case.token.as_deref(),
            "us-east-1",
            "service",
        );
        // 2015-08-30T12:36:00Z
        let time = SystemTime::UNIX_EPOCH + Duration::from_secs(1_440_938_160);
        let headers: Vec<(&str, &str)> = case
            .headers
            .iter()
            .map(|(n, v)| (n.as_str(), v.as_str()))
            .collect();
        let hash = if case.sign_body {
            BodyHashHeader::Send
        } else {
            BodyHashHeader::Omit
        };
        let added = signer
            .sign(&case.method, &case.url, &headers, &case.body, time, hash)
            .unwrap();
        added
            .into_iter()
            .find(|(n, _)| n.eq_ignore_ascii_case("authorization"))
            .unwrap()
            .1
    }

    #[test]
    fn the_published_test_vectors_sign_as_aws_documents() {
        for case in [
            "get-vanilla",
            "get-vanilla-query-order-key-case",
            "get-utf8",
            "post-vanilla",
            "post-header-key-sort",
            "post-x-www-form-urlencoded",
            "get-vanilla-with-session-token",
        ] {
            let c = load(case);
            assert_eq!(signed_authorization(&c), c.authorization, "case {case}");
        }
    }

    #[test]
    fn get_vanilla_is_the_documented_signature() {
        // The value in AWS's documentation, written out so a fixture edit cannot hide it.
        assert!(signed_authorization(&load("get-vanilla")).ends_with(
            "Signature=5fa00fa31553b73ebf1942676e86291e8372ff2a2260956d9b8aae1d763fbf31"
        ));
    }

    #[test]
    fn a_changed_body_byte_changes_the_signature() {
        let mut c = load("post-x-www-form-urlencoded");
        let before = signed_authorization(&c);
        c.body[0] ^= 1;
        assert_ne!(signed_authorization(&c), before);
    }

    #[test]
    fn the_session_token_is_sent_and_the_secret_never_printed() {
        let signer = Signer::new(
            "AKID",
            "very-secret-key-material",
            Some("tok-123"),
            "us-east-1",
            "bedrock",
        );
        let added = signer
            .sign(
                "POST",
                "https://bedrock-runtime.us-east-1.amazonaws.com/model/m/converse",
                &[],
                b"{}",
                SystemTime::now(),
                BodyHashHeader::Omit,
            )
            .unwrap();
        assert!(added
            .iter()
            .any(|(n, v)| *n == "x-amz-security-token" && v == "tok-123"));
        let printed = format!("{signer:?}");
        assert!(
            !printed.contains("very-secret") && !printed.contains("tok-123"),
            "{printed}"
        );
    }
}
