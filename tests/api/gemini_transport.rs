//! The `gemini` provider's transport against the mock over real HTTP: the config checks,
//! the Gemini API key and Vertex AI's service-account token (signed JWT, exchange, cache,
//! one refresh for many, refresh before expiry, failures as clean upstream errors), both
//! URL shapes, streamed and not, read back through the Gemini adapter.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_util::StreamExt;
use secrecy::SecretString;
use serde_json::{json, Value};

use sluice::clock::{Clock, ManualClock};
use sluice::config::{Provider, Secret, Settings, UpstreamTimeouts, VertexSettings};
use sluice::endpoint::Endpoint;
use sluice::mock::{MockConfig, MockServer, Script};
use sluice::upstream::catalog::Catalog;
use sluice::upstream::client::UpstreamClient;
use sluice::upstream::providers::canonical::{self, Event, Message, Part, Role};
use sluice::upstream::providers::formats::gemini as format;
use sluice::upstream::providers::gemini::{self, token};
use sluice::upstream::retry::{classify, Tier};
use sluice::upstream::UpstreamError;

use crate::helpers::{model, upstream};

const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/gemini");
const EMAIL: &str = "sluice-test@sluice-test.iam.gserviceaccount.com";
const API_KEY: &str = "gem-key-0123456789";

fn fixture(name: &str) -> String {
    std::fs::read_to_string(format!("{FIXTURES}/{name}")).unwrap()
}

/// The checked-in test service account with its `token_uri` at the mock's `/token`,
/// written into `dir`; the mock told its public key.
fn service_account(
    dir: &std::path::Path,
    mock: &MockServer,
    ttl: Option<Duration>,
) -> std::path::PathBuf {
    let mut sa: Value = serde_json::from_str(&fixture("test-service-account.json")).unwrap();
    sa["token_uri"] = json!(format!("{}/token", mock.base_url()));
    let path = dir.join("sa.json");
    std::fs::write(&path, sa.to_string()).unwrap();
    mock.state
        .register_vertex_account(EMAIL, &fixture("test-service-account.pub.pem"), ttl)
        .unwrap();
    path
}

fn gemini_upstream(
    mock: &MockServer,
    vertex: Option<VertexSettings>,
) -> sluice::config::UpstreamSettings {
    let mut u = upstream("g", API_KEY, mock);
    u.provider = Provider::Gemini;
    u.base_url = mock.base_url();
    if vertex.is_some() {
        u.api_key = Secret::default();
        u.vertex = vertex;
    }
    u
}

fn settings(u: sluice::config::UpstreamSettings) -> Settings {
    let mut s = Settings::default();
    let id = u.id.clone();
    s.upstreams.push(u);
    s.models.push(model("gem", &[&id]));
    s
}

fn vertex(path: std::path::PathBuf) -> VertexSettings {
    VertexSettings {
        project: "sluice-test".into(),
        location: "us-central1".into(),
        credentials_file: path,
    }
}

fn request() -> canonical::Request {
    canonical::Request {
        model: "gem".into(),
        messages: vec![Message {
            role: Role::User,
            content: vec![Part::Text {
                text: "Hello?".into(),
                cache: None,
            }],
            name: None,
            plain: false,
        }],
        reasoning: Some(canonical::Reasoning {
            effort: None,
            budget_tokens: Some(512),
            summary: None,
        }),
        ..Default::default()
    }
}

fn body() -> Bytes {
    let b = format::write_request(&request(), "gem-upstream", Some(("max_tokens", 100)), false)
        .unwrap();
    Bytes::from(Value::Object(b).to_string())
}

async fn call(s: &Settings, stream: bool) -> Result<reqwest::Response, UpstreamError> {
    s.validate().unwrap();
    let catalog = Catalog::from_settings(s);
    let dep = &catalog.deployments[0];
    let client = UpstreamClient::new(&UpstreamTimeouts::default()).unwrap();
    let url = url_of(&catalog, stream);
    client
        .post(
            dep,
            Some(&url),
            body(),
            Instant::now() + Duration::from_secs(30),
            ((None, None), |_| ()),
        )
        .await
}

/// The URL of the catalog's `gem` route (its model in the path), streamed or not, as the
/// request path takes it (`Deployment::url`).
fn url_of(catalog: &Catalog, stream: bool) -> reqwest::Url {
    let route = &catalog.model("gem").unwrap().routes[0];
    catalog.deployments[route.deployment]
        .url(route, Endpoint::Chat, stream)
        .unwrap()
        .clone()
}

/// Reads an SSE body into the adapter's events.
async fn events(resp: reqwest::Response) -> Vec<Event> {
    let mut text = String::new();
    let mut s = resp.bytes_stream();
    while let Some(chunk) = s.next().await {
        text.push_str(std::str::from_utf8(&chunk.unwrap()).unwrap());
    }
    let mut reader = format::EventReader::new();
    let mut out = Vec::new();
    for block in text.split("\n\n").filter(|b| !b.trim().is_empty()) {
        let data = block.strip_prefix("data: ").unwrap();
        reader.read("", data, &mut out).unwrap();
    }
    out
}

#[tokio::test]
async fn the_gemini_api_gets_the_key_in_its_header_and_the_model_in_the_path() {
    let mock = MockServer::start("127.0.0.1:0", MockConfig::default()).unwrap();
    mock.state.script(
        API_KEY,
        [Script {
            reasoning_tokens: Some(40),
            cached_tokens: Some(8),
            ..Script::default()
        }],
    );
    let s = settings(gemini_upstream(&mock, None));
    let resp = call(&s, false).await.unwrap();
    let answer = format::read_answer(&resp.json::<Value>().await.unwrap()).unwrap();
    assert_eq!(
        answer.content.last(),
        Some(&Part::Text {
            text: MockConfig::default().text,
            cache: None
        })
    );
    assert!(
        matches!(answer.content[0], Part::Reasoning { .. }),
        "{:?}",
        answer.content
    );
    assert_eq!(
        answer.usage,
        Some(canonical::Usage {
            input: 12,
            output: 24 + 40,
            cached_input: 8,
            reasoning: 40,
            ..Default::default()
        })
    );
    let stats = mock.state.stats(API_KEY);
    assert_eq!(
        stats.last_paths[0],
        "/v1beta/models/gem-upstream:generateContent"
    );
    let headers = &stats.last_headers[0];
    assert_eq!(headers["x-goog-api-key"], API_KEY);
    assert!(headers.get("authorization").is_none(), "{headers:?}");
    assert_eq!(
        stats.last_bodies[0]["generationConfig"]["maxOutputTokens"],
        100
    );

    // Streamed: the same answer, usage last.
    let resp = call(&s, true).await.unwrap();
    let ev = events(resp).await;
    let text: String = ev
        .iter()
        .filter_map(|e| match e {
            Event::TextDelta { text, .. } => Some(text.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(text, MockConfig::default().text);
    // Gemini has no end-of-stream event (its body's end is the end): the finish, then the
    // usage.
    assert!(
        ev.contains(&Event::Finish(canonical::Finish::Stop)),
        "{ev:?}"
    );
    assert_eq!(
        ev.last(),
        Some(&Event::Usage(canonical::Reported::whole(
            canonical::Usage {
                input: 12,
                output: 24,
                ..Default::default()
            }
        ))),
        "{ev:?}"
    );
    assert_eq!(
        mock.state.stats(API_KEY).last_paths[1],
        "/v1beta/models/gem-upstream:streamGenerateContent"
    );
}

#[tokio::test]
async fn vertex_signs_in_with_the_service_account_and_calls_the_project_path() {
    let dir = tempfile::tempdir().unwrap();
    let mock = MockServer::start("127.0.0.1:0", MockConfig::default()).unwrap();
    let sa = service_account(dir.path(), &mock, None);
    let s = settings(gemini_upstream(&mock, Some(vertex(sa))));
    s.validate().unwrap();
    let catalog = Catalog::from_settings(&s);
    let dep = &catalog.deployments[0];
    let client = UpstreamClient::new(&UpstreamTimeouts::default()).unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    let resp = client
        .post(
            dep,
            Some(&url_of(&catalog, false)),
            body(),
            deadline,
            ((None, None), |_| ()),
        )
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let stats = mock.state.stats(EMAIL);
    assert_eq!(
        stats.last_paths[0],
        "/v1/projects/sluice-test/locations/us-central1/publishers/google/models/gem-upstream:generateContent"
    );
    let auth = stats.last_headers[0]["authorization"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(auth.starts_with("Bearer ya29.mock-"), "{auth}");
    assert!(stats.last_headers[0].get("x-goog-api-key").is_none());
    assert_eq!(mock.state.stats("token").count, 1);
    // The deployment keeps its token: a second call (streamed) exchanges nothing.
    let resp = client
        .post(
            dep,
            Some(&url_of(&catalog, true)),
            body(),
            deadline,
            ((None, None), |_| ()),
        )
        .await
        .unwrap();
    let ev = events(resp).await;
    assert!(
        ev.contains(&Event::Finish(canonical::Finish::Stop)),
        "{ev:?}"
    );
    assert_eq!(mock.state.stats("token").count, 1);
    assert_eq!(
        mock.state.stats(EMAIL).last_headers[1]["authorization"],
        auth.as_str()
    );
}

#[tokio::test]
async fn fifty_concurrent_requests_share_one_token_exchange() {
    let dir = tempfile::tempdir().unwrap();
    let mock = MockServer::start("127.0.0.1:0", MockConfig::default()).unwrap();
    let sa = service_account(dir.path(), &mock, None);
    // The exchange takes a while, so every caller arrives while it is in flight.
    mock.state.script(
        "token",
        [Script {
            delay_ms: 300,
            ..Script::default()
        }],
    );
    let source = Arc::new(token::source(
        token::ServiceAccount::load(&sa),
        Arc::new(sluice::clock::SystemClock),
    ));
    let http = reqwest::Client::new();
    let calls = (0..50).map(|_| {
        let (source, http) = (source.clone(), http.clone());
        tokio::spawn(async move { source.bearer(&http).await })
    });
    let tokens: Vec<_> = futures_util::future::join_all(calls).await;
    let first = tokens[0].as_ref().unwrap().as_ref().unwrap().clone();
    for t in &tokens {
        assert_eq!(t.as_ref().unwrap().as_ref().unwrap(), &first);
    }
    assert_eq!(mock.state.stats("token").count, 1);
    assert!(
        first.is_sensitive(),
        "the token is marked sensitive: no debug print shows it"
    );
}

/// A token endpoint that fails while many wait: they share the one failure, not queue up
/// one exchange each behind it.
#[tokio::test]
async fn requests_waiting_on_a_failing_exchange_share_its_failure() {
    let dir = tempfile::tempdir().unwrap();
    let mock = MockServer::start("127.0.0.1:0", MockConfig::default()).unwrap();
    let sa = service_account(dir.path(), &mock, None);
    mock.state.sticky(
        "token",
        Some(Script {
            status: Some(500),
            delay_ms: 300,
            ..Script::default()
        }),
    );
    let source = Arc::new(token::source(
        token::ServiceAccount::load(&sa),
        Arc::new(sluice::clock::SystemClock),
    ));
    let http = reqwest::Client::new();
    let calls = (0..20).map(|_| {
        let (source, http) = (source.clone(), http.clone());
        tokio::spawn(async move { source.bearer(&http).await })
    });
    for r in futures_util::future::join_all(calls).await {
        let err = r.unwrap().unwrap_err();
        assert!(matches!(err, UpstreamError::Connect(_)), "{err:?}");
    }
    assert_eq!(mock.state.stats("token").count, 1);
    // A request after the failure tries again.
    mock.state.sticky("token", None);
    assert!(source.bearer(&http).await.is_ok());
    assert_eq!(mock.state.stats("token").count, 2);
}

#[tokio::test]
async fn a_token_is_refreshed_five_minutes_before_it_expires_and_after_it_expired() {
    let dir = tempfile::tempdir().unwrap();
    let mock = MockServer::start("127.0.0.1:0", MockConfig::default()).unwrap();
    let sa = service_account(dir.path(), &mock, None);
    let clock = Arc::new(ManualClock::new(chrono::Utc::now()));
    let source = token::source(
        token::ServiceAccount::load(&sa),
        clock.clone() as Arc<dyn Clock>,
    );
    let http = reqwest::Client::new();
    let first = source.bearer(&http).await.unwrap();
    clock.advance(chrono::Duration::minutes(54));
    assert_eq!(
        source.bearer(&http).await.unwrap(),
        first,
        "still an hour's token"
    );
    assert_eq!(mock.state.stats("token").count, 1);
    clock.advance(chrono::Duration::minutes(2)); // 56 min: within 5 min of the expiry
                                                 // Still valid: sent while its replacement is fetched in the background.
    assert_eq!(source.bearer(&http).await.unwrap(), first);
    let deadline = Instant::now() + Duration::from_secs(30);
    let second = loop {
        let t = source.bearer(&http).await.unwrap();
        if t != first {
            break t;
        }
        assert!(Instant::now() < deadline, "no refresh in the background");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(mock.state.stats("token").count, 2);
    clock.advance(chrono::Duration::hours(3)); // long expired
    let third = source.bearer(&http).await.unwrap();
    assert_ne!(third, second);
    assert_eq!(mock.state.stats("token").count, 3);
}

/// A token the upstream no longer takes (revoked before its time) is replaced: one new
/// exchange, one retry. An upstream that refuses the new one too is a 401 for the key.
#[tokio::test]
async fn a_token_the_upstream_no_longer_takes_is_replaced_once() {
    let dir = tempfile::tempdir().unwrap();
    let mock = MockServer::start("127.0.0.1:0", MockConfig::default()).unwrap();
    let sa = service_account(dir.path(), &mock, None);
    let s = settings(gemini_upstream(&mock, Some(vertex(sa))));
    s.validate().unwrap();
    let catalog = Catalog::from_settings(&s);
    let dep = &catalog.deployments[0];
    let client = UpstreamClient::new(&UpstreamTimeouts::default()).unwrap();
    let url = url_of(&catalog, false);
    let deadline = Instant::now() + Duration::from_secs(30);
    client
        .post(dep, Some(&url), body(), deadline, ((None, None), |_| ()))
        .await
        .unwrap();
    mock.state.expire_vertex_tokens();
    let mut told = Vec::new();
    let ok = client
        .post(
            dep,
            Some(&url),
            body(),
            deadline,
            ((None, None), |on| told.push(on)),
        )
        .await
        .unwrap();
    assert_eq!(ok.status(), 200);
    // Out; taken back at the 401, which billed nothing (review finding, s18: a client
    // leaving while the new token was fetched paid the input); out again.
    assert_eq!(told, [true, false, true]);
    assert_eq!(mock.state.stats("token").count, 2);
    // Calls with a token the mock knows (the revoked one's is counted under no account).
    assert_eq!(mock.state.stats(EMAIL).count, 2);
    mock.state.sticky(
        EMAIL,
        Some(Script {
            status: Some(401),
            ..Script::default()
        }),
    );
    let err = client
        .post(dep, Some(&url), body(), deadline, ((None, None), |_| ()))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, UpstreamError::Status { status: 401, .. }),
        "{err:?}"
    );
    assert_eq!(classify(&err), Tier::AuthFailed);
    assert_eq!(mock.state.stats(EMAIL).count, 4, "one retry, not a loop");
}

#[tokio::test]
async fn a_failed_exchange_fails_the_attempt_cleanly_and_the_next_one_retries_it() {
    let dir = tempfile::tempdir().unwrap();
    let mock = MockServer::start("127.0.0.1:0", MockConfig::default()).unwrap();
    let sa = service_account(dir.path(), &mock, None);
    let s = settings(gemini_upstream(&mock, Some(vertex(sa.clone()))));
    s.validate().unwrap();
    let catalog = Catalog::from_settings(&s);
    let dep = &catalog.deployments[0];
    let client = UpstreamClient::new(&UpstreamTimeouts::default()).unwrap();
    let url = url_of(&catalog, false);
    let deadline = Instant::now() + Duration::from_secs(30);
    let key_text = serde_json::from_str::<Value>(&std::fs::read_to_string(&sa).unwrap()).unwrap()
        ["private_key"]
        .as_str()
        .unwrap()
        .to_string();
    let key_piece = &key_text[40..60];

    // The token endpoint failing: a server error (the breaker counts it, another
    // deployment serves), the key not disabled.
    mock.state.script(
        "token",
        [Script {
            status: Some(500),
            ..Script::default()
        }],
    );
    let err = client
        .post(dep, Some(&url), body(), deadline, ((None, None), |_| ()))
        .await
        .unwrap_err();
    assert!(matches!(&err, UpstreamError::Connect(_)), "{err:?}");
    assert_eq!(classify(&err), Tier::ServerError);
    assert!(!format!("{err:?}").contains(key_piece));

    // The account refused (a revoked key): a 401 for the key (disabled, alerted).
    mock.state.script(
        "token",
        [Script {
            status: Some(400),
            body: Some(
                json!({"error": "invalid_grant", "error_description": "Invalid JWT Signature."}),
            ),
            ..Script::default()
        }],
    );
    let err = client
        .post(dep, Some(&url), body(), deadline, ((None, None), |_| ()))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, UpstreamError::Status { status: 401, .. }),
        "{err:?}"
    );
    assert_eq!(classify(&err), Tier::AuthFailed);
    let UpstreamError::Status { body: b, .. } = &err else {
        unreachable!()
    };
    assert!(String::from_utf8_lossy(b).contains("invalid_grant"));
    assert_eq!(
        mock.state.stats(EMAIL).count,
        0,
        "no call went out without a token"
    );

    // The next attempt exchanges again and goes through.
    let ok = client
        .post(dep, Some(&url), body(), deadline, ((None, None), |_| ()))
        .await
        .unwrap();
    assert_eq!(ok.status(), 200);
    assert_eq!(mock.state.stats("token").count, 3);
}

#[tokio::test]
async fn the_mock_refuses_an_assertion_not_signed_by_the_registered_key() {
    let dir = tempfile::tempdir().unwrap();
    let mock = MockServer::start("127.0.0.1:0", MockConfig::default()).unwrap();
    let sa = service_account(dir.path(), &mock, None);
    // Registered under another name: the signer is unknown.
    mock.state.reset();
    mock.state
        .register_vertex_account(
            "someone-else@x.iam.gserviceaccount.com",
            &fixture("test-service-account.pub.pem"),
            None,
        )
        .unwrap();
    let source = token::source(
        token::ServiceAccount::load(&sa),
        Arc::new(sluice::clock::SystemClock),
    );
    let err = source.bearer(&reqwest::Client::new()).await.unwrap_err();
    assert!(
        matches!(err, UpstreamError::Status { status: 401, .. }),
        "{err:?}"
    );
    // A JWT for another audience is refused as Google would.
    let account = token::ServiceAccount::load(&sa).unwrap();
    mock.state
        .register_vertex_account(EMAIL, &fixture("test-service-account.pub.pem"), None)
        .unwrap();
    let assertion = account.assertion(chrono::Utc::now()).unwrap();
    let other = reqwest::Client::new()
        .post(format!("http://localhost:{}/token", mock.port))
        .form(&[
            ("grant_type", token::GRANT_TYPE),
            ("assertion", assertion.as_str()),
        ])
        .send()
        .await
        .unwrap();
    assert_eq!(other.status(), 400);
    let v: Value = other.json().await.unwrap();
    assert_eq!(v["error"], "invalid_grant", "{v}");
}

#[tokio::test]
async fn a_gemini_rate_limit_cools_the_key_for_the_retry_delay_google_gives_in_the_body() {
    let mock = MockServer::start("127.0.0.1:0", MockConfig::default()).unwrap();
    let body: Value = serde_json::from_str(&fixture("error_rate_limited.json")).unwrap();
    mock.state.script(
        API_KEY,
        [Script {
            status: Some(429),
            body: Some(body),
            ..Script::default()
        }],
    );
    let err = call(&settings(gemini_upstream(&mock, None)), false)
        .await
        .unwrap_err();
    assert!(
        matches!(err, UpstreamError::Status { status: 429, retry_after: Some(d), .. } if d == Duration::from_secs(38)),
        "{err:?}"
    );
    assert_eq!(classify(&err), Tier::RateLimited);
}

#[test]
fn the_config_checks_name_what_is_wrong_and_never_show_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let _enter = rt.enter();
    let mock = MockServer::start("127.0.0.1:0", MockConfig::default()).unwrap();
    let sa = service_account(dir.path(), &mock, None);
    let key_text = serde_json::from_str::<Value>(&std::fs::read_to_string(&sa).unwrap()).unwrap()
        ["private_key"]
        .as_str()
        .unwrap()
        .to_string();
    let fails = |u: sluice::config::UpstreamSettings, needle: &str| {
        let e = settings(u).validate().unwrap_err().to_string();
        assert!(e.contains(needle), "{e} (wanted {needle})");
        assert!(!e.contains(&key_text[40..60]), "{e}");
    };
    let mut none = gemini_upstream(&mock, None);
    none.api_key = Secret::default();
    fails(none, "needs `api_key`");
    let mut both = gemini_upstream(&mock, Some(vertex(sa.clone())));
    both.api_key = Secret(SecretString::from("k".to_string()));
    fails(both, "exclusive");
    fails(
        gemini_upstream(&mock, Some(vertex(dir.path().join("missing.json")))),
        "missing.json",
    );
    let user_cred = dir.path().join("user.json");
    std::fs::write(
        &user_cred,
        r#"{"type":"authorized_user","client_id":"x","refresh_token":"y"}"#,
    )
    .unwrap();
    fails(
        gemini_upstream(&mock, Some(vertex(user_cred))),
        "service_account",
    );
    let bad_key = dir.path().join("bad.json");
    let mut v: Value = serde_json::from_str(&std::fs::read_to_string(&sa).unwrap()).unwrap();
    v["private_key"] = json!(key_text.replace("MII", "XXX"));
    std::fs::write(&bad_key, v.to_string()).unwrap();
    fails(gemini_upstream(&mock, Some(vertex(bad_key))), "private_key");
    let metadata = dir.path().join("meta.json");
    v["private_key"] = json!(key_text);
    v["token_uri"] = json!("http://169.254.169.254/token");
    std::fs::write(&metadata, v.to_string()).unwrap();
    fails(gemini_upstream(&mock, Some(vertex(metadata))), "token_uri");
    let mut bad_location = vertex(sa.clone());
    bad_location.location = "us-central1/../x".into();
    fails(
        gemini_upstream(&mock, Some(bad_location)),
        "vertex.location",
    );
    let mut openai_vertex = gemini_upstream(&mock, Some(vertex(sa.clone())));
    openai_vertex.provider = Provider::Openai;
    fails(openai_vertex, "`vertex` is for");
    // Quirks are OpenAI-format switches; only Gemini goes without a base URL.
    let mut quirky = gemini_upstream(&mock, None);
    quirky.quirks.include_usage = false;
    fails(quirky, "`quirks` are for");
    for p in [
        Provider::Openai,
        Provider::Anthropic,
        Provider::AzureOpenai,
        Provider::OpenaiCompatible,
    ] {
        let mut u = gemini_upstream(&mock, None);
        u.provider = p;
        if p == Provider::AzureOpenai {
            u.api_version = Some("v1".into());
        }
        u.base_url = String::new();
        fails(u, "`base_url` is required");
    }

    // Printed settings (`check-config`, Debug) show the key file's path, not the key.
    let s = settings(gemini_upstream(&mock, Some(vertex(sa.clone()))));
    s.validate().unwrap();
    let shown = format!("{s:?} {}", toml::to_string(&s).unwrap_or_default());
    assert!(shown.contains("sa.json") && !shown.contains(&key_text[40..60]));
    let account = token::ServiceAccount::load(&sa).unwrap();
    assert!(!format!("{account:?}").contains(&key_text[40..60]));
    let catalog = Catalog::from_settings(&s);
    assert!(!format!("{:?}", catalog.deployments[0]).contains(&key_text[40..60]));
}

#[test]
fn googles_default_base_urls() {
    let v = |location: &str| VertexSettings {
        project: "p".into(),
        location: location.into(),
        credentials_file: "x".into(),
    };
    assert_eq!(
        sluice::config::gemini_base_url(None),
        "https://generativelanguage.googleapis.com"
    );
    assert_eq!(
        sluice::config::gemini_base_url(Some(&v("europe-west4"))),
        "https://europe-west4-aiplatform.googleapis.com"
    );
    assert_eq!(
        sluice::config::gemini_base_url(Some(&v("global"))),
        "https://aiplatform.googleapis.com"
    );
    assert_eq!(
        gemini::path(Some(&v("global")), "gemini-2.5-pro", true),
        "/v1/projects/p/locations/global/publishers/google/models/gemini-2.5-pro:streamGenerateContent?alt=sse"
    );
}

/// The mock's scripted faults reach Gemini streams as they reach the other formats: a cut
/// leaves the reader without its end, a malformed event is corrupt, a seeded 503 is
/// Google's UNAVAILABLE.
#[tokio::test]
async fn the_mocks_faults_apply_to_gemini_streams() {
    let mock = MockServer::start("127.0.0.1:0", MockConfig::default()).unwrap();
    let s = settings(gemini_upstream(&mock, None));
    mock.state.script(
        API_KEY,
        [Script {
            cut_after: Some(2),
            ..Script::default()
        }],
    );
    let resp = call(&s, true).await.unwrap();
    let mut got = Vec::new();
    let mut body = resp.bytes_stream();
    while let Some(Ok(chunk)) = body.next().await {
        got.extend_from_slice(&chunk);
    }
    let text = String::from_utf8(got).unwrap();
    assert_eq!(text.matches("data: ").count(), 2, "{text}");
    assert!(!text.contains("finishReason"), "{text}");

    mock.state.script(
        API_KEY,
        [Script {
            corrupt_after: Some(1),
            ..Script::default()
        }],
    );
    let resp = call(&s, true).await.unwrap();
    let text = String::from_utf8(resp.bytes().await.unwrap().to_vec()).unwrap();
    let mut reader = format::EventReader::new();
    let results: Vec<_> = text
        .split("\n\n")
        .filter_map(|b| b.strip_prefix("data: "))
        .map(|d| reader.read("", d, &mut Vec::new()))
        .collect();
    assert!(results.iter().any(Result::is_err), "{text}");

    let faults = sluice::mock::Faults {
        seed: 7,
        unavailable: 1.0,
        ..Default::default()
    };
    mock.state.script(
        API_KEY,
        [Script {
            faults: Some(faults),
            ..Script::default()
        }],
    );
    let err = call(&s, true).await.unwrap_err();
    let UpstreamError::Status { status, body, .. } = &err else {
        panic!("{err:?}")
    };
    assert_eq!(*status, 503);
    assert_eq!(
        format::read_error(503, &serde_json::from_slice(body).unwrap()).kind,
        canonical::ErrorKind::Overloaded
    );
    assert_eq!(classify(&err), Tier::Overloaded);
}
