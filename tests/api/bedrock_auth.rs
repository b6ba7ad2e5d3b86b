//! Bedrock's authentication end to end: OpenAI- and Anthropic-format clients through the
//! gateway to the Bedrock mock, which verifies every SigV4 signature against the secret
//! registered for the access key id (`mock::bedrock::BedrockKeys`) and answers AWS's 403
//! when it differs. Models named by inference-profile ARN and by cross-region profile id,
//! streamed and not; temporary credentials with a session token; a Bedrock API key; a
//! wrong secret, which the client sees as an error in its own format and the retry tiers
//! as a refused key.

use serde_json::{json, Value};
use sluice::config::{Provider, Secret, Settings, UpstreamSettings};
use sluice::mock::MockServer;
use sluice::upstream::pool::Disabled;

use crate::helpers::{model, spawn_app_with, TestApp};

const ARN: &str =
    "arn:aws:bedrock:us-east-1:123456789012:inference-profile/us.anthropic.claude-3-5-sonnet-20240620-v1:0";
const ARN_PATH: &str = "/model/arn%3Aaws%3Abedrock%3Aus-east-1%3A123456789012%3Ainference-profile%2Fus.anthropic.claude-3-5-sonnet-20240620-v1%3A0";
const PROFILE: &str = "us.anthropic.claude-3-5-sonnet-20240620-v1:0";
const PROFILE_PATH: &str = "/model/us.anthropic.claude-3-5-sonnet-20240620-v1%3A0";
const SECRET: &str = "bedrock-auth-secret-canary-8c7d6e";
const SESSION_TOKEN: &str = "IQoJb3JpZ2luX2VjEsts-session-token-canary-77";
const API_KEY: &str = "bedrock-api-key-canary-3f2e1d";

fn sigv4(id: &str, key_id: &str, secret: &str, mock: &MockServer) -> UpstreamSettings {
    UpstreamSettings {
        id: id.into(),
        provider: Provider::Bedrock,
        base_url: mock.base_url(),
        region: Some("us-east-1".into()),
        access_key_id: Some(key_id.into()),
        secret_access_key: Some(Secret(secrecy::SecretString::from(secret.to_string()))),
        allow_private_network: true,
        ..UpstreamSettings::default()
    }
}

/// `name` served by the upstreams `ids`, each with the Bedrock model `target`.
fn bedrock_model(name: &str, ids: &[&str], target: &str) -> sluice::config::ModelSettings {
    let mut m = model(name, ids);
    for r in &mut m.routes {
        r.model = target.into();
    }
    m
}

async fn app(tweak: impl FnOnce(&mut Settings, &MockServer)) -> TestApp {
    spawn_app_with(|s, m| {
        s.upstreams.clear();
        s.models.clear();
        tweak(s, m);
    })
    .await
}

fn chat(model: &str, stream: bool) -> Value {
    json!({"model": model, "stream": stream, "max_tokens": 64,
        "messages": [{"role": "user", "content": "hi"}]})
}

async fn anthropic(app: &TestApp, token: &str, model: &str, stream: bool) -> reqwest::Response {
    app.http
        .post(format!("{}/v1/messages", app.address))
        .header("x-api-key", token)
        .header("anthropic-version", "2023-06-01")
        .json(&json!({"model": model, "max_tokens": 64, "stream": stream,
            "messages": [{"role": "user", "content": "hi"}]}))
        .send()
        .await
        .unwrap()
}

/// An answer's text, from a chat completion or its stream.
async fn answer_text(resp: reqwest::Response, stream: bool) -> String {
    let text = resp.text().await.unwrap();
    if !stream {
        let v: Value = serde_json::from_str(&text).unwrap();
        return v["choices"][0]["message"]["content"]
            .as_str()
            .unwrap_or_default()
            .to_string();
    }
    assert!(text.trim_end().ends_with("data: [DONE]"), "{text}");
    text.lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter(|d| *d != "[DONE]")
        .filter_map(|d| serde_json::from_str::<Value>(d).ok())
        .filter_map(|v| {
            v["choices"][0]["delta"]["content"]
                .as_str()
                .map(str::to_string)
        })
        .collect()
}

/// A model named by inference-profile ARN or by cross-region profile id reaches Bedrock
/// as one percent-encoded path segment, signed so that the mock's verification (AWS's
/// double-encoded canonical URI) passes — Converse and ConverseStream, OpenAI and
/// Anthropic clients.
#[tokio::test]
async fn profile_arns_and_ids_are_encoded_and_signed_as_aws_verifies_them() {
    let app = app(|s, m| {
        m.state.bedrock.register("AKIDPROFILE", SECRET, None);
        s.upstreams = vec![sigv4("br", "AKIDPROFILE", SECRET, m)];
        s.models = vec![
            bedrock_model("claude-arn", &["br"], ARN),
            bedrock_model("claude-profile", &["br"], PROFILE),
        ];
    })
    .await;
    let (_, token) = app.token("u", Some("10")).await;
    let want = sluice::mock::MockConfig::default().text;
    for (name, path) in [("claude-arn", ARN_PATH), ("claude-profile", PROFILE_PATH)] {
        for stream in [false, true] {
            let resp = app
                .post("/v1/chat/completions", &token, &chat(name, stream))
                .await;
            assert_eq!(resp.status(), 200, "{name} stream={stream}");
            assert_eq!(
                answer_text(resp, stream).await,
                want,
                "{name} stream={stream}"
            );
            let op = if stream {
                "converse-stream"
            } else {
                "converse"
            };
            let seen = app.mock.state.stats("AKIDPROFILE");
            assert_eq!(seen.last_paths.back().unwrap(), &format!("{path}/{op}"));
        }
        let resp = anthropic(&app, &token, name, true).await;
        assert_eq!(resp.status(), 200, "{name}");
        let text = resp.text().await.unwrap();
        assert!(text.contains("event: message_stop"), "{text}");
    }
    assert_eq!(app.mock.state.stats("AKIDPROFILE").count, 6);
    app.assert_invariant().await;
}

/// Temporary (STS) credentials: the session token is sent as `x-amz-security-token` and
/// signed; the same keys without it are refused by AWS as an unrecognized client, which
/// disables that deployment while the one with the token serves.
#[tokio::test]
async fn a_session_token_is_sent_and_signed() {
    let app = app(|s, m| {
        m.state
            .bedrock
            .register("ASIATEMPORARY", SECRET, Some(SESSION_TOKEN));
        let mut without = sigv4("br-no-token", "ASIATEMPORARY", SECRET, m);
        without.session_token = None;
        let mut with = sigv4("br-sts", "ASIATEMPORARY", SECRET, m);
        with.session_token = Some(Secret(secrecy::SecretString::from(SESSION_TOKEN)));
        s.upstreams = vec![without, with];
        s.models = vec![
            bedrock_model("claude", &["br-no-token"], PROFILE),
            bedrock_model("claude-sts", &["br-sts"], PROFILE),
        ];
    })
    .await;
    let (_, token) = app.token("u", Some("10")).await;
    for stream in [false, true] {
        let resp = app
            .post("/v1/chat/completions", &token, &chat("claude-sts", stream))
            .await;
        assert_eq!(resp.status(), 200, "stream={stream}");
    }
    let seen = app.mock.state.stats("ASIATEMPORARY");
    assert_eq!(seen.count, 2);
    let h = seen.last_headers.back().unwrap();
    assert_eq!(h["x-amz-security-token"], SESSION_TOKEN);
    let authz = h["authorization"].as_str().unwrap();
    assert!(
        authz.contains("SignedHeaders=content-type;host;x-amz-date;x-amz-security-token"),
        "{authz}"
    );

    let resp = app
        .post("/v1/chat/completions", &token, &chat("claude", false))
        .await;
    assert_eq!(resp.status(), 502);
    let v: Value = resp.json().await.unwrap();
    assert_eq!(v["error"]["code"], "upstream_error", "{v}");
    assert_eq!(app.state.pool().disabled(0), Some(Disabled::Auth));
    assert_eq!(app.state.pool().disabled(1), None);
    app.assert_invariant().await;
}

/// A Bedrock API key is sent as a bearer token, nothing signed.
#[tokio::test]
async fn a_bedrock_api_key_is_a_bearer_token() {
    let app = app(|s, m| {
        let mut u = sigv4("br-key", "", "", m);
        u.access_key_id = None;
        u.secret_access_key = None;
        u.api_key = Secret(secrecy::SecretString::from(API_KEY));
        s.upstreams = vec![u];
        s.models = vec![bedrock_model("claude", &["br-key"], ARN)];
    })
    .await;
    let (_, token) = app.token("u", Some("10")).await;
    for stream in [false, true] {
        let resp = app
            .post("/v1/chat/completions", &token, &chat("claude", stream))
            .await;
        assert_eq!(resp.status(), 200, "stream={stream}");
    }
    let seen = app.mock.state.stats(API_KEY);
    assert_eq!(seen.count, 2);
    let h = seen.last_headers.back().unwrap();
    assert_eq!(h["authorization"], format!("Bearer {API_KEY}"));
    assert!(h.get("x-amz-date").is_none(), "{h:?}");
    assert_eq!(
        seen.last_paths.back().unwrap(),
        &format!("{ARN_PATH}/converse-stream")
    );
}

/// A wrong secret: AWS's 403 `InvalidSignatureException` is a refused key — disabled, the
/// other key serves; with no other key the client gets the gateway's 502 in its own
/// format (OpenAI's or Anthropic's), never a 500 and never the signature's details.
#[tokio::test]
async fn a_wrong_secret_is_a_refused_key_and_a_clear_error_for_the_client() {
    let app = app(|s, m| {
        m.state.bedrock.register("AKIDWRONG", SECRET, None);
        m.state.bedrock.register("AKIDRIGHT", SECRET, None);
        s.upstreams = vec![
            sigv4("br-wrong", "AKIDWRONG", "not-the-secret", m),
            sigv4("br-right", "AKIDRIGHT", SECRET, m),
            sigv4("br-alone", "AKIDWRONG", "not-the-secret", m),
        ];
        s.models = vec![
            bedrock_model("claude", &["br-wrong", "br-right"], PROFILE),
            bedrock_model("claude-alone", &["br-alone"], PROFILE),
        ];
    })
    .await;
    let (_, token) = app.token("u", Some("10")).await;
    // Until the wrong key has been tried once, the pool may pick either.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while app.state.pool().disabled(0).is_none() {
        assert!(
            std::time::Instant::now() < deadline,
            "the wrong key was never tried"
        );
        let resp = app
            .post("/v1/chat/completions", &token, &chat("claude", false))
            .await;
        assert_eq!(resp.status(), 200);
        assert_eq!(resp.headers()["x-sluice-upstream"], "br-right");
    }
    assert_eq!(app.state.pool().disabled(0), Some(Disabled::Auth));
    assert_eq!(app.state.pool().disabled(1), None);

    let resp = app
        .post("/v1/chat/completions", &token, &chat("claude-alone", false))
        .await;
    assert_eq!(resp.status(), 502);
    let text = resp.text().await.unwrap();
    let v: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["error"]["code"], "upstream_error", "{text}");
    assert!(v["error"]["message"]
        .as_str()
        .is_some_and(|m| !m.is_empty()));
    assert!(
        !text.contains("Signature") && !text.contains(SECRET),
        "{text}"
    );
    assert_eq!(app.state.pool().disabled(2), Some(Disabled::Auth));

    let resp = anthropic(&app, &token, "claude-alone", true).await;
    let status = resp.status().as_u16();
    let v: Value = resp.json().await.unwrap();
    assert!(matches!(status, 502 | 503), "{status}: {v}");
    assert_eq!(v["type"], "error", "{v}");
    assert!(v["error"]["type"].is_string(), "{v}");
    assert!(v["error"]["message"].is_string(), "{v}");
    app.assert_invariant().await;
}

/// A model id with characters beyond `:` and `/` — a space, a `%`, a `+`, non-ASCII — and
/// one that tries to climb out of its segment (`../`) is one percent-encoded segment of
/// `/model/…/converse`, signed so that AWS's verification passes; nothing reaches another
/// path.
#[tokio::test]
async fn odd_model_ids_stay_one_segment_and_verify() {
    let ids = [
        ("spaced", "my model v1:0", "/model/my%20model%20v1%3A0"),
        ("percent", "m%2F..%2Fx+1", "/model/m%252F..%252Fx%2B1"),
        ("unicode", "modèle-é", "/model/mod%C3%A8le-%C3%A9"),
        ("climb", "../../admin", "/model/..%2F..%2Fadmin"),
    ];
    let app = app(|s, m| {
        m.state.bedrock.register("AKIDODD", SECRET, None);
        s.upstreams = vec![sigv4("br", "AKIDODD", SECRET, m)];
        s.models = ids
            .iter()
            .map(|(name, id, _)| bedrock_model(name, &["br"], id))
            .collect();
    })
    .await;
    let (_, token) = app.token("u", Some("10")).await;
    for (name, _, path) in ids {
        for stream in [false, true] {
            let resp = app
                .post("/v1/chat/completions", &token, &chat(name, stream))
                .await;
            assert_eq!(resp.status(), 200, "{name} stream={stream}");
            answer_text(resp, stream).await;
            let op = if stream {
                "converse-stream"
            } else {
                "converse"
            };
            let seen = app.mock.state.stats("AKIDODD");
            assert_eq!(
                seen.last_paths.back().unwrap(),
                &format!("{path}/{op}"),
                "{name}"
            );
        }
    }
    app.assert_invariant().await;
}
