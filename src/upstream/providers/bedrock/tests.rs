//! The transport's pieces: config checks, paths, credentials, typed errors.

use super::*;
use crate::config::{check_bedrock, Provider, Secret};
use secrecy::SecretString;

fn bedrock() -> UpstreamSettings {
    UpstreamSettings {
        id: "br".into(),
        provider: Provider::Bedrock,
        base_url: String::new(),
        api_key: Secret::default(),
        region: Some("us-east-1".into()),
        access_key_id: Some("AKIDEXAMPLE".into()),
        secret_access_key: Some(Secret(SecretString::from(
            "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY",
        ))),
        session_token: None,
        ..UpstreamSettings::default()
    }
}

#[test]
fn config_needs_a_region_and_exactly_one_kind_of_credentials() {
    assert_eq!(check_bedrock(&bedrock()), Ok(()));
    assert_eq!(
        bedrock().effective_base_url(),
        "https://bedrock-runtime.us-east-1.amazonaws.com"
    );

    let mut bearer = bedrock();
    bearer.access_key_id = None;
    bearer.secret_access_key = None;
    bearer.api_key = Secret(SecretString::from("bedrock-api-key-abc"));
    assert_eq!(check_bedrock(&bearer), Ok(()));

    type Edit = Box<dyn Fn(&mut UpstreamSettings)>;
    let cases: Vec<(Edit, &str)> = vec![
        (Box::new(|u| u.region = None), "needs `region`"),
        (
            Box::new(|u| u.region = Some("us east 1".into())),
            "needs `region`",
        ),
        (Box::new(|u| u.secret_access_key = None), "go together"),
        (
            Box::new(|u| u.api_key = Secret(SecretString::from("k"))),
            "not both",
        ),
        (
            Box::new(|u| {
                u.access_key_id = None;
                u.secret_access_key = None;
            }),
            "needs credentials",
        ),
    ];
    for (edit, want) in cases {
        let mut u = bedrock();
        edit(&mut u);
        let err = check_bedrock(&u).unwrap_err();
        assert!(err.contains(want), "{err}");
    }
    let mut token_with_key = bearer.clone();
    token_with_key.session_token = Some(Secret(SecretString::from("t")));
    assert!(check_bedrock(&token_with_key)
        .unwrap_err()
        .contains("SigV4 only"));

    // On other kinds the AWS fields are refused, and a base URL is required (at load:
    // `UpstreamSettings::check_kind`).
    let validate = |u: &UpstreamSettings| {
        let mut s = crate::config::Settings::default();
        s.upstreams.push(u.clone());
        s.validate().map_err(|e| e.to_string())
    };
    assert_eq!(validate(&bedrock()), Ok(()));
    let mut openai = bedrock();
    openai.provider = Provider::Openai;
    openai.base_url = "https://api.openai.com/v1".into();
    openai.api_key = Secret(SecretString::from("sk-test"));
    assert!(validate(&openai).unwrap_err().contains("bedrock\" only"));
    openai.region = None;
    openai.access_key_id = None;
    openai.secret_access_key = None;
    assert_eq!(validate(&openai), Ok(()));
    openai.base_url = String::new();
    assert!(validate(&openai)
        .unwrap_err()
        .contains("`base_url` is required"));
}

#[test]
fn the_config_printout_masks_the_secret_and_the_token() {
    let mut u = bedrock();
    u.session_token = Some(Secret(SecretString::from("FwoGZXIvYXdzEXAMPLETOKEN")));
    let printed = format!("{u:?} {}", toml::to_string(&u).unwrap());
    assert!(!printed.contains("wJalrXUtnFEMI"), "{printed}");
    assert!(!printed.contains("FwoGZXIvYXdz"), "{printed}");
}

#[test]
fn the_model_id_is_one_encoded_path_segment() {
    assert_eq!(
        path("anthropic.claude-3-5-sonnet-20240620-v1:0", false),
        "/model/anthropic.claude-3-5-sonnet-20240620-v1%3A0/converse"
    );
    assert_eq!(
        path("arn:aws:bedrock:us-east-1:123456789012:inference-profile/us.anthropic.claude-3-haiku-20240307-v1:0", true),
        "/model/arn%3Aaws%3Abedrock%3Aus-east-1%3A123456789012%3Ainference-profile%2Fus.anthropic.claude-3-haiku-20240307-v1%3A0/converse-stream"
    );
    assert_eq!(
        path("../../admin", false),
        "/model/..%2F..%2Fadmin/converse"
    );
}

#[test]
fn sigv4_credentials_sign_with_service_bedrock_and_the_region() {
    let signer = sigv4(&bedrock()).unwrap();
    let h = signer
        .headers(
            "https://bedrock-runtime.us-east-1.amazonaws.com/model/m/converse",
            b"{}",
            SystemTime::now(),
        )
        .unwrap();
    let authz = h
        .iter()
        .find(|(n, _)| n == AUTHORIZATION)
        .unwrap()
        .1
        .to_str()
        .unwrap()
        .to_string();
    assert!(
        authz.starts_with("AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/"),
        "{authz}"
    );
    assert!(authz.contains("/us-east-1/bedrock/aws4_request"), "{authz}");
    assert!(
        authz.contains("SignedHeaders=content-type;host;x-amz-date"),
        "{authz}"
    );
    assert!(h.iter().all(|(_, v)| v.is_sensitive()));
    assert!(!format!("{signer:?}").contains("wJalr"));
    assert!(matches!(credential(&bedrock()), Credential::Hook(_)));
    assert!(!format!("{:?}", credential(&bedrock())).contains("wJalr"));

    // A Bedrock API key: one static bearer header, sensitive.
    let mut bearer = bedrock();
    bearer.access_key_id = None;
    bearer.secret_access_key = None;
    bearer.api_key = Secret(SecretString::from("bedrock-api-key-abc"));
    assert!(sigv4(&bearer).is_none());
    let Credential::Static(name, value) = credential(&bearer) else {
        panic!("a Bedrock API key is a static header");
    };
    assert_eq!(name, AUTHORIZATION);
    assert_eq!(value.to_str().unwrap(), "Bearer bedrock-api-key-abc");
    assert!(value.is_sensitive());
}

#[test]
fn the_error_type_header_types_the_body_for_the_retry_tiers() {
    let ty = HeaderValue::from_static(
        "ServiceQuotaExceededException:http://internal.amazon.com/coral/com.amazon.bedrock/",
    );
    let body = typed_error_body(Some(&ty), Bytes::from_static(br#"{"message":"quota"}"#));
    assert_eq!(tier(&body), Some(Tier::QuotaExhausted));
    assert_eq!(tier(br#"{"code":"ThrottlingException"}"#), None);
    assert_eq!(
        typed_error_body(None, Bytes::from_static(b"x")),
        Bytes::from_static(b"x")
    );
    // A non-JSON body still gets its type.
    let body = typed_error_body(
        Some(&HeaderValue::from_static("ThrottlingException")),
        Bytes::from_static(b"<html>"),
    );
    assert_eq!(tier(&body), Some(Tier::RateLimited));
}

#[test]
fn both_config_blocks_load_validate_and_print_masked() {
    let text = r#"
[[upstreams]]
id = "bedrock-sigv4"
provider = "bedrock"
region = "eu-central-1"
access_key_id = "AKIAIOSFODNN7EXAMPLE"
secret_access_key = "${AWS_SECRET}"
session_token = "${AWS_TOKEN}"

[[upstreams]]
id = "bedrock-key"
provider = "bedrock"
region = "us-west-2"
api_key = "${BEDROCK_KEY}"

[[models]]
name = "claude-sonnet"
routes = [{ upstream = "bedrock-sigv4", model = "anthropic.claude-3-5-sonnet-20240620-v1:0" },
          { upstream = "bedrock-key", model = "us.anthropic.claude-3-5-sonnet-20240620-v1:0" }]
"#;
    let env: std::collections::BTreeMap<String, String> = [
        ("AWS_SECRET", "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY"),
        ("AWS_TOKEN", "FwoGZXIvYXdzEXAMPLETOKENVALUE"),
        ("BEDROCK_KEY", "ABSKQmVkcm9ja0FQSUtleS1example"),
    ]
    .iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    let s = crate::config::load_from(Some(text), &env).unwrap();
    s.validate().unwrap();
    assert_eq!(
        s.upstreams[0].effective_base_url(),
        "https://bedrock-runtime.eu-central-1.amazonaws.com"
    );
    let printed = s.to_masked_toml();
    for secret in ["wJalrXUtnFEMI", "FwoGZXIvYXdz", "ABSKQmVkcm9ja"] {
        assert!(!printed.contains(secret), "{printed}");
    }
    let bad = text.replace("region = \"us-west-2\"\n", "");
    let err = crate::config::load_from(Some(&bad), &env)
        .and_then(|s| s.validate())
        .unwrap_err();
    assert!(
        err.to_string()
            .contains("upstream `bedrock-key`: provider \"bedrock\" needs `region`"),
        "{err}"
    );
}

/// SigV4 for an inference-profile ARN, computed here step by step as AWS documents it
/// ("Create a canonical request": for every service but S3 the canonical URI is the path
/// as sent, each segment URI-encoded once more, so `%3A` becomes `%253A` and `%2F`
/// `%252F`), independently of `aws-sigv4`: the signer's output must be this signature.
/// A path signed as decoded, or encoded once only, gives another and AWS answers 403.
#[test]
fn an_inference_profile_arn_is_signed_over_the_double_encoded_path() {
    use hmac::{Hmac, Mac};
    use sha2::{Digest, Sha256};
    const ARN: &str = "arn:aws:bedrock:us-east-1:123456789012:inference-profile/us.anthropic.claude-3-5-sonnet-20240620-v1:0";
    const HOST: &str = "bedrock-runtime.us-east-1.amazonaws.com";
    let secret = "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY";
    let body = br#"{"messages":[]}"#;
    // 2024-06-20T12:00:00Z
    let time = SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1_718_884_800);
    let url = format!("https://{HOST}{}", path(ARN, true));

    let hmac = |key: &[u8], data: &str| {
        let mut m = Hmac::<Sha256>::new_from_slice(key).unwrap();
        m.update(data.as_bytes());
        m.finalize().into_bytes().to_vec()
    };
    let canonical = [
        "POST",
        "/model/arn%253Aaws%253Abedrock%253Aus-east-1%253A123456789012%253Ainference-profile%252Fus.anthropic.claude-3-5-sonnet-20240620-v1%253A0/converse-stream",
        "",
        "content-type:application/json",
        &format!("host:{HOST}"),
        "x-amz-date:20240620T120000Z",
        "",
        "content-type;host;x-amz-date",
        &hex::encode(Sha256::digest(body)),
    ]
    .join("\n");
    let to_sign = [
        "AWS4-HMAC-SHA256",
        "20240620T120000Z",
        "20240620/us-east-1/bedrock/aws4_request",
        &hex::encode(Sha256::digest(canonical.as_bytes())),
    ]
    .join("\n");
    let key = ["20240620", "us-east-1", "bedrock", "aws4_request"]
        .iter()
        .fold(format!("AWS4{secret}").into_bytes(), |k, part| {
            hmac(&k, part)
        });
    let expected = format!(
        "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20240620/us-east-1/bedrock/aws4_request, \
         SignedHeaders=content-type;host;x-amz-date, Signature={}",
        hex::encode(hmac(&key, &to_sign))
    );

    let signed = sigv4(&bedrock())
        .unwrap()
        .headers(&url, body, time)
        .unwrap();
    let authz = signed.iter().find(|(n, _)| n == AUTHORIZATION).unwrap();
    assert_eq!(authz.1.to_str().unwrap(), expected);
}

/// A model id of dots only (`.`, `..`) is a dot-segment, which a URL parser resolves
/// (encoded or not): the call would leave `/model/` for `/converse` or `/model/converse`.
/// No such URL is made.
#[test]
fn a_dot_segment_model_id_makes_no_url() {
    for id in [".", ".."] {
        for stream in [false, true] {
            if let Some(u) = url(
                "https://bedrock-runtime.us-east-1.amazonaws.com",
                id,
                stream,
            ) {
                assert!(
                    u.path().starts_with("/model/") && u.path().matches('/').count() == 3,
                    "{id:?} reaches {}",
                    u.path()
                );
            }
        }
    }
}
