//! The Bedrock transport against the Bedrock mock, directly: SigV4 signed by the
//! deployment's credential hook (`bedrock::SigV4`, as `client::post` runs it), the mock
//! verifying the signature with `aws-sigv4`; the event stream framed and read into
//! events; a corrupt frame refused.

use bytes::Bytes;
use sluice::config::{Provider, Secret, UpstreamSettings};
use sluice::mock::{MockConfig, MockServer, Script};
use sluice::upstream::credential::Authorize;
use sluice::upstream::providers::bedrock;
use sluice::upstream::providers::bedrock::eventstream::Decoder;
use sluice::upstream::providers::canonical::{Event, Finish, Part};
use sluice::upstream::providers::formats::bedrock as converse;

fn settings(secret: &str) -> UpstreamSettings {
    UpstreamSettings {
        id: "br".into(),
        provider: Provider::Bedrock,
        base_url: String::new(),
        api_key: Secret::default(),
        region: Some("us-east-1".into()),
        access_key_id: Some("AKIDMOCK".into()),
        secret_access_key: Some(Secret(secrecy::SecretString::from(secret.to_string()))),
        session_token: None,
        allow_private_network: true,
        ..UpstreamSettings::default()
    }
}

async fn call(
    mock: &MockServer,
    secret: &str,
    stream: bool,
    body: serde_json::Value,
) -> reqwest::Response {
    // The request as `client::post` builds it, signed by the deployment's credential hook.
    let http = reqwest::Client::new();
    let url = bedrock::url(
        &mock.base_url(),
        "anthropic.claude-3-5-sonnet-20240620-v1:0",
        stream,
    )
    .unwrap();
    let req = http
        .post(url)
        .header("content-type", "application/json")
        .body(Bytes::from(body.to_string()))
        .build()
        .unwrap();
    let signer = bedrock::sigv4(&settings(secret)).unwrap();
    let req = signer.authorize(&http, req).await.unwrap();
    http.execute(req).await.unwrap()
}

fn mock() -> MockServer {
    let cfg = MockConfig {
        bedrock_secret: Some("the-right-secret".into()),
        ..MockConfig::default()
    };
    MockServer::start("127.0.0.1:0", cfg).unwrap()
}

fn hello() -> serde_json::Value {
    serde_json::json!({"messages":[{"role":"user","content":[{"text":"hi"}]}],
        "toolConfig":{"tools":[{"toolSpec":{"name":"get_weather","inputSchema":{"json":{"type":"object"}}}}]}})
}

#[tokio::test]
async fn a_signed_converse_call_is_verified_and_read() {
    let mock = mock();
    let resp = call(&mock, "the-right-secret", false, hello()).await;
    assert_eq!(resp.status(), 200);
    let v: serde_json::Value = resp.json().await.unwrap();
    let a = converse::read_answer(&v).unwrap();
    assert_eq!(a.finish, Finish::ToolCalls);
    assert!(matches!(&a.content[1], Part::ToolCall { name, .. } if name == "get_weather"));
    assert_eq!(a.usage.map(|u| (u.input, u.output)), Some((12, 24)));
    assert_eq!(
        mock.state.stats("AKIDMOCK").last_paths[0],
        "/model/anthropic.claude-3-5-sonnet-20240620-v1%3A0/converse"
    );

    // A signature made with another secret is refused as AWS refuses it.
    let resp = call(&mock, "a-wrong-secret", false, hello()).await;
    assert_eq!(resp.status(), 403);
    let ty = resp.headers().get("x-amzn-errortype").cloned();
    let body = bedrock::typed_error_body(ty.as_ref(), resp.bytes().await.unwrap());
    let e = converse::read_error(403, &serde_json::from_slice(&body).unwrap());
    assert_eq!(e.code.as_deref(), Some("InvalidSignatureException"));
}

#[tokio::test]
async fn a_converse_stream_is_framed_and_read_and_a_corrupt_frame_refused() {
    let mock = mock();
    let resp = call(&mock, "the-right-secret", true, hello()).await;
    assert_eq!(resp.status(), 200);
    assert_eq!(
        resp.headers()["content-type"],
        "application/vnd.amazon.eventstream"
    );
    let bytes = resp.bytes().await.unwrap();
    let (mut frames, mut events) = (Vec::new(), Vec::new());
    let mut d = Decoder::new();
    for chunk in bytes.chunks(7) {
        d.push(chunk, &mut frames).unwrap();
    }
    d.finish().unwrap();
    let mut reader = converse::EventReader::new();
    for f in &frames {
        reader.read(&f.name, &f.data, &mut events).unwrap();
    }
    let text: String = events
        .iter()
        .filter_map(|e| match e {
            Event::TextDelta { text, .. } => Some(text.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(text, MockConfig::default().text);
    assert!(events.contains(&Event::Finish(Finish::ToolCalls)));
    assert_eq!(events.last(), Some(&Event::Done));

    mock.state.script(
        "AKIDMOCK",
        [Script {
            corrupt_after: Some(2),
            ..Script::default()
        }],
    );
    let bytes = call(&mock, "the-right-secret", true, hello())
        .await
        .bytes()
        .await
        .unwrap();
    let mut d = Decoder::new();
    let mut frames = Vec::new();
    let err = d.push(&bytes, &mut frames).unwrap_err();
    assert!(
        err.what.contains("checksum") || err.what.contains("crc") || err.what.contains("Checksum"),
        "{err}"
    );
    assert_eq!(
        frames.len(),
        3,
        "messageStart and two deltas before the corrupt frame"
    );
}

/// Through `UpstreamClient::post`, the gateway's one way to an upstream: the Bedrock
/// deployment built from config signs each call (the mock verifies it), and the error type
/// Bedrock puts in `x-amzn-ErrorType` decides the retry tier over the status.
#[tokio::test]
async fn the_gateways_client_signs_and_types_bedrock_errors() {
    use sluice::config::Settings;
    use sluice::upstream::catalog::Catalog;
    use sluice::upstream::client::UpstreamClient;
    use sluice::upstream::retry::{classify, Tier};
    use std::time::{Duration, Instant};

    let mock = mock();
    let mut settings = Settings::default();
    let mut right = settings_with(&mock, "br-right", "the-right-secret");
    right.access_key_id = Some("AKIDRIGHT".into());
    let mut wrong = settings_with(&mock, "br-wrong", "a-wrong-secret");
    wrong.access_key_id = Some("AKIDWRONG".into());
    settings.upstreams = vec![right, wrong];
    settings.validate().unwrap();
    let catalog = Catalog::from_settings(&settings);
    let client = UpstreamClient::new(&settings.upstream).unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    // The URL each deployment builds at start for a route to this model.
    let urls: Vec<_> = catalog
        .deployments
        .iter()
        .map(|d| bedrock::url(&d.base_url, "anthropic.claude-3-haiku-20240307-v1:0", false))
        .collect();
    let post = |i: usize| {
        client.post(
            &catalog.deployments[i],
            urls[i].as_ref(),
            Bytes::from(hello().to_string()),
            deadline,
            ((None, None), |_| ()),
        )
    };

    let resp = post(0).await.unwrap();
    assert_eq!(resp.status(), 200);
    let v: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(converse::read_answer(&v).unwrap().finish, Finish::ToolCalls);
    let seen = mock.state.stats("AKIDRIGHT");
    let authz = seen.last_headers[0]["authorization"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(authz.contains("/us-east-1/bedrock/aws4_request"), "{authz}");

    assert_eq!(classify(&post(1).await.unwrap_err()), Tier::AuthFailed);

    let typed = |status: u16, ty: &str| Script {
        status: Some(status),
        headers: vec![(
            "x-amzn-ErrorType".into(),
            format!("{ty}:http://internal.amazon.com/coral/com.amazon.bedrock/"),
        )],
        ..Script::default()
    };
    for (status, ty, tier) in [
        (400, "ServiceQuotaExceededException", Tier::QuotaExhausted),
        (429, "ThrottlingException", Tier::RateLimited),
        (429, "ModelNotReadyException", Tier::Overloaded),
        (400, "ValidationException", Tier::ClientError),
    ] {
        mock.state.script("AKIDRIGHT", [typed(status, ty)]);
        let err = post(0).await.unwrap_err();
        assert_eq!(classify(&err), tier, "{ty}");
    }
}

fn settings_with(mock: &MockServer, id: &str, secret: &str) -> UpstreamSettings {
    let mut u = settings(secret);
    u.id = id.into();
    u.base_url = mock.base_url();
    u
}
