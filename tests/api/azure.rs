//! Provider kind `azure_openai` behind Sluice, against the mock's Azure (`mock/azure.rs`):
//! OpenAI- and Anthropic-format clients, streamed and not, tools; the classic deployment
//! path and the v1 path; the `api-key` header and Entra ID tokens (fetched, refreshed,
//! refused); Azure's 429 with `retry-after-ms`; its content filter; usage charged exactly.

use std::time::Duration;

use secrecy::SecretString;
use serde_json::{json, Value};
use sluice::config::{EntraSettings, Provider, Secret, Settings, UpstreamSettings};
use sluice::mock::{MockServer, Script};

use crate::helpers::*;

/// The Azure key of these tests: a canary.
pub(crate) const AZURE_KEY: &str = "az-upstream-canary-key-5e6f7a8b9c";
/// The Entra app's client secret: a canary too.
const ENTRA_SECRET: &str = "entra-client-secret-canary-0a1b2c3d";
/// The Azure deployment the test model routes to (the mock echoes it as `model`).
pub(crate) const DEPLOYMENT: &str = "prod-gpt4o-mini";

/// Every wait here is bounded by this, far above what a correct gateway needs.
const BOUND: Duration = Duration::from_secs(30);

pub(crate) fn azure(id: &str, mock: &MockServer, api_version: &str) -> UpstreamSettings {
    let mut u = upstream(id, AZURE_KEY, mock);
    u.provider = Provider::AzureOpenai;
    u.base_url = mock.base_url();
    u.api_version = Some(api_version.into());
    u
}

pub(crate) fn entra(mock: &MockServer, client_id: &str, secret: &str) -> EntraSettings {
    EntraSettings {
        tenant_id: "tenant-0123".into(),
        client_id: client_id.into(),
        client_secret: Secret(SecretString::from(secret.to_string())),
        authority: mock.base_url(),
        scope: "https://cognitiveservices.azure.com/.default".into(),
    }
}

/// `gpt-4o-mini` served by `u` alone, at the deployment `DEPLOYMENT`.
pub(crate) fn only(s: &mut Settings, u: UpstreamSettings) {
    let id = u.id.clone();
    s.upstreams = vec![u];
    let mut m = model("gpt-4o-mini", &[&id]);
    m.routes[0].deployment = Some(DEPLOYMENT.into());
    s.models = vec![m];
}

/// The mock's default answer (12 in, 24 out) at the test model's prices.
pub(crate) fn default_cost() -> i64 {
    sluice::quota::pricing::cost(
        sluice::usage::Usage {
            input: 12,
            output: 24,
            ..Default::default()
        },
        sluice::quota::pricing::Prices::plain(150_000, 600_000),
    )
}

/// What a token has spent (settled), once nothing is reserved; the request log agrees.
pub(crate) async fn spent(app: &TestApp, token_id: i64) -> i64 {
    app.wait_settled().await;
    app.wait_for_log_rows(1).await;
    let spent = app
        .scalar(&format!(
            "SELECT limit_micros - remaining_micros - reserved_micros FROM tokens WHERE id = {token_id}"
        ))
        .await;
    let logged = app
        .scalar(&format!(
            "SELECT COALESCE(SUM(cost_micros), 0) FROM requests WHERE token_id = {token_id}"
        ))
        .await;
    assert_eq!(spent, logged, "the ledger and the request log agree");
    app.assert_invariant().await;
    spent
}

pub(crate) fn anthropic_body(stream: bool) -> Value {
    json!({"model": "gpt-4o-mini", "max_tokens": 64, "stream": stream,
        "messages": [{"role": "user", "content": "Why does the engine light blink?"}]})
}

/// The `event:` names and `data:` payloads of an SSE body.
pub(crate) async fn events(resp: reqwest::Response) -> Vec<(String, Value)> {
    let text = resp.text().await.expect("stream read");
    text.split("\n\n")
        .filter(|e| !e.trim().is_empty())
        .map(|e| {
            let mut name = String::new();
            let mut data = Value::Null;
            for line in e.lines() {
                if let Some(n) = line.strip_prefix("event: ") {
                    name = n.to_string();
                } else if let Some(d) = line.strip_prefix("data: ") {
                    data = serde_json::from_str(d).unwrap_or(Value::String(d.to_string()));
                }
            }
            (name, data)
        })
        .collect()
}

#[tokio::test]
async fn an_openai_client_reaches_an_azure_deployment_with_its_api_key() {
    let app = spawn_app_with(|s, m| only(s, azure("az", m, "2024-10-21"))).await;
    let (id, token) = app.token("dev", Some("1.00")).await;
    let resp = app.chat(&token, &chat_body(64)).await;
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["x-sluice-upstream"], "az");
    let v: Value = resp.json().await.unwrap();
    assert_eq!(
        v["choices"][0]["message"]["content"],
        MockConfigText::text()
    );
    assert_eq!(v["model"], DEPLOYMENT);
    let stats = app.mock.state.stats(AZURE_KEY);
    assert_eq!(stats.count, 1);
    assert_eq!(
        stats.last_paths[0],
        format!("/openai/deployments/{DEPLOYMENT}/chat/completions")
    );
    let headers = &stats.last_headers[0];
    assert_eq!(headers["api-key"], AZURE_KEY);
    assert!(headers.get("authorization").is_none(), "{headers:?}");
    assert_eq!(spent(&app, id).await, default_cost());
}

/// Stand-in for the mock's fixed answer text.
struct MockConfigText;
impl MockConfigText {
    fn text() -> String {
        sluice::mock::MockConfig::default().text
    }
}

#[tokio::test]
async fn an_openai_client_streams_from_azure_past_its_filter_chunk_and_is_charged_its_usage() {
    let app = spawn_app_with(|s, m| only(s, azure("az", m, "2024-10-21"))).await;
    let (id, token) = app.token("dev", Some("1.00")).await;
    let mut body = chat_body(64);
    body["stream"] = json!(true);
    let resp = app.chat(&token, &body).await;
    assert_eq!(resp.status(), 200);
    let (data, whole) = sse_data(resp).await;
    assert!(whole);
    assert_eq!(data.last().map(String::as_str), Some("[DONE]"));
    assert_eq!(reassemble(&data), MockConfigText::text());
    let sent = &app.mock.state.stats(AZURE_KEY).last_bodies[0];
    assert_eq!(sent["stream_options"]["include_usage"], true);
    assert_eq!(spent(&app, id).await, default_cost());
}

#[tokio::test]
async fn an_anthropic_client_reaches_azure_with_tools_streamed_and_not() {
    let app = spawn_app_with(|s, m| only(s, azure("az", m, "2024-10-21"))).await;
    let (id, token) = app.token("dev", Some("1.00")).await;
    let anthropic_tool = json!({"name": "lookup_vin", "description": "Finds a car",
        "input_schema": {"type": "object", "properties": {"vin": {"type": "string"}}}});
    let mut body = anthropic_body(false);
    body["tools"] = json!([anthropic_tool]);
    let resp = app.messages(&token, &body).await;
    assert_eq!(resp.status(), 200);
    let v: Value = resp.json().await.unwrap();
    assert_eq!(v["type"], "message", "{v}");
    assert_eq!(v["stop_reason"], "tool_use", "{v}");
    assert_eq!(v["content"][0]["type"], "tool_use");
    assert_eq!(v["content"][0]["name"], "lookup_vin");
    assert_eq!(v["content"][0]["input"]["vin"], "WVWZZZ1JZXW000001");
    assert_eq!(v["usage"]["input_tokens"], 12);
    assert_eq!(v["usage"]["output_tokens"], 24);

    body["stream"] = json!(true);
    let resp = app.messages(&token, &body).await;
    assert_eq!(resp.status(), 200);
    let evs = events(resp).await;
    let names: Vec<&str> = evs.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names.first(), Some(&"message_start"), "{names:?}");
    assert_eq!(names.last(), Some(&"message_stop"), "{names:?}");
    let start = evs
        .iter()
        .find(|(n, _)| n == "content_block_start")
        .expect("a content block");
    assert_eq!(start.1["content_block"]["type"], "tool_use");
    let args: String = evs
        .iter()
        .filter_map(|(_, d)| d.pointer("/delta/partial_json").and_then(Value::as_str))
        .collect();
    assert_eq!(args, r#"{"vin":"WVWZZZ1JZXW000001"}"#);
    let delta = evs.iter().find(|(n, _)| n == "message_delta").unwrap();
    assert_eq!(delta.1["delta"]["stop_reason"], "tool_use");
    assert_eq!(delta.1["usage"]["output_tokens"], 24);
    assert_eq!(spent(&app, id).await, 2 * default_cost());
}

#[tokio::test]
async fn the_v1_path_takes_no_api_version_and_names_the_deployment_as_the_model() {
    let app = spawn_app_with(|s, m| only(s, azure("az", m, "v1"))).await;
    let (_, token) = app.token("dev", Some("1.00")).await;
    let resp = app.chat(&token, &chat_body(64)).await;
    assert_eq!(resp.status(), 200);
    let stats = app.mock.state.stats(AZURE_KEY);
    assert_eq!(stats.last_paths[0], "/openai/v1/chat/completions");
    assert_eq!(stats.last_bodies[0]["model"], DEPLOYMENT);
}

#[tokio::test]
async fn the_mock_refuses_the_deployment_path_without_an_api_version_as_azure_does() {
    let mock = MockServer::start("127.0.0.1:0", Default::default()).unwrap();
    let resp = reqwest::Client::new()
        .post(format!(
            "{}/openai/deployments/{DEPLOYMENT}/chat/completions",
            mock.base_url()
        ))
        .header("api-key", AZURE_KEY)
        .json(&chat_body(8))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 400);
    let v: Value = resp.json().await.unwrap();
    assert_eq!(v["error"]["code"], "MissingApiVersionParameter");
    let no_key = reqwest::Client::new()
        .post(format!(
            "{}/openai/deployments/{DEPLOYMENT}/chat/completions?api-version=2024-10-21",
            mock.base_url()
        ))
        .json(&chat_body(8))
        .send()
        .await
        .unwrap();
    assert_eq!(no_key.status(), 401);
}

#[tokio::test]
async fn entra_tokens_are_fetched_once_for_concurrent_requests_and_sent_as_bearer() {
    let app = spawn_app_with(|s, m| {
        let mut u = azure("az", m, "2024-10-21");
        u.api_key = Secret::default();
        u.entra = Some(entra(m, "app-1", ENTRA_SECRET));
        only(s, u);
    })
    .await;
    let (_, token) = app.token("dev", Some("5.00")).await;
    // Five requests at once: one token fetch between them.
    let body = chat_body(8);
    let all = futures_util::future::join_all((0..5).map(|_| app.chat(&token, &body))).await;
    for r in all {
        assert_eq!(r.status(), 200);
    }
    assert_eq!(
        app.mock.state.entra.issued(),
        1,
        "one fetch for concurrent requests"
    );
    let stats = app.mock.state.stats("entra:app-1");
    assert_eq!(stats.count, 5);
    let h = &stats.last_headers[0];
    assert!(h["authorization"]
        .as_str()
        .unwrap()
        .starts_with("Bearer mock-entra-token-1-"));
    assert!(h.get("api-key").is_none(), "{h:?}");
    let form = &app.mock.state.stats("entra-token:app-1").last_bodies[0];
    assert_eq!(form["grant_type"], "client_credentials");
    assert_eq!(
        form["scope"],
        "https://cognitiveservices.azure.com/.default"
    );

    assert_eq!(app.mock.state.entra.refused(), 0);
}

#[tokio::test]
async fn an_entra_token_is_replaced_before_it_expires_and_never_sent_stale() {
    let app = spawn_app_with(|s, m| {
        let mut u = azure("az", m, "2024-10-21");
        u.api_key = Secret::default();
        u.entra = Some(entra(m, "app-2", ENTRA_SECRET));
        only(s, u);
    })
    .await;
    // Tokens of 10 s: the gateway replaces one after 8 s (a fifth of its life early).
    app.mock.state.entra.set_expires_in(10);
    let (_, token) = app.token("dev", Some("5.00")).await;
    let deadline = tokio::time::Instant::now() + BOUND;
    let mut sent = 0;
    while app.mock.state.entra.issued() < 2 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "no refresh within {BOUND:?}"
        );
        let r = app.chat(&token, &chat_body(8)).await;
        assert_eq!(r.status(), 200, "{:?}", r.text().await);
        sent += 1;
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    // The refresh is made in the background while the old token, still valid, is sent: the
    // new one is sent once it is in.
    loop {
        let r = app.chat(&token, &chat_body(8)).await;
        assert_eq!(r.status(), 200);
        sent += 1;
        let stats = app.mock.state.stats("entra:app-2");
        let last = stats.last_headers.back().unwrap()["authorization"]
            .as_str()
            .unwrap()
            .to_string();
        if last.starts_with("Bearer mock-entra-token-2-") {
            break;
        }
        assert!(last.starts_with("Bearer mock-entra-token-1-"), "{last}");
        assert!(
            tokio::time::Instant::now() < deadline,
            "the new token never sent within {BOUND:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        app.mock.state.entra.refused(),
        0,
        "no stale token reached Azure"
    );
    assert_eq!(app.mock.state.entra.issued(), 2);
    assert_eq!(app.mock.state.stats("entra:app-2").count, sent);
}

#[tokio::test]
async fn a_refused_entra_secret_disables_the_key_and_tells_the_client_nothing_of_it() {
    let app = spawn_app_with(|s, m| {
        let mut u = azure("az", m, "2024-10-21");
        u.api_key = Secret::default();
        u.entra = Some(entra(m, "app-3", sluice::mock::azure::REFUSED_SECRET));
        only(s, u);
    })
    .await;
    let (id, token) = app.token("dev", Some("1.00")).await;
    let resp = app.chat(&token, &chat_body(8)).await;
    assert_eq!(resp.status(), 502);
    let text = resp.text().await.unwrap();
    assert!(
        !text.contains("AADSTS") && !text.contains("secret"),
        "{text}"
    );
    assert_eq!(
        app.state.pool().disabled(0),
        Some(sluice::upstream::pool::Disabled::Auth)
    );
    assert_eq!(
        app.mock.state.stats("entra:app-3").count,
        0,
        "nothing reached Azure"
    );
    assert_eq!(spent(&app, id).await, 0);
}

/// Azure's 429 carries `retry-after-ms` beside a whole-second `retry-after`: the key rests
/// the milliseconds (not the 10 s the other header says), and not a moment less.
#[tokio::test]
async fn azures_retry_after_ms_is_honoured() {
    let app = spawn_app_with(|s, m| only(s, azure("az", m, "2024-10-21"))).await;
    let (_, token) = app.token("dev", Some("1.00")).await;
    app.mock.state.script(
        AZURE_KEY,
        [Script {
            status: Some(429),
            error_style: Some("azure".into()),
            headers: vec![
                ("retry-after-ms".into(), "1500".into()),
                ("retry-after".into(), "10".into()),
            ],
            ..Default::default()
        }],
    );
    let first = app.chat(&token, &chat_body(8)).await;
    assert_eq!(first.status(), 429);
    assert_eq!(retry_after(first.headers()), 2, "1.5 s, rounded up");
    let v: Value = first.json().await.unwrap();
    assert!(v["error"]["message"].is_string(), "{v}");
    let deadline = tokio::time::Instant::now() + BOUND;
    loop {
        let r = app.chat(&token, &chat_body(8)).await;
        if r.status() == 200 {
            break;
        }
        assert!(matches!(r.status().as_u16(), 429 | 503), "{}", r.status());
        assert!(tokio::time::Instant::now() < deadline);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let arrivals = app.mock.state.stats(AZURE_KEY).last_arrivals_ms;
    assert_eq!(arrivals.len(), 2, "the key was left alone while it rested");
    let gap = arrivals[1] - arrivals[0];
    assert!(gap >= 1500, "the next attempt came {gap} ms after the 429");
    assert!(
        gap < 10_000,
        "retry-after-ms, not retry-after, decided: {gap} ms"
    );
}

#[tokio::test]
async fn a_prompt_azures_content_filter_blocks_is_a_400_naming_the_filter_in_each_format() {
    let app = spawn_app_with(|s, m| only(s, azure("az", m, "2024-10-21"))).await;
    let (id, token) = app.token("dev", Some("1.00")).await;
    let blocked = Script {
        content_filter: Some("prompt".into()),
        ..Default::default()
    };
    app.mock.state.script(AZURE_KEY, [blocked.clone(), blocked]);
    let resp = app.chat(&token, &chat_body(8)).await;
    assert_eq!(resp.status(), 400);
    let v: Value = resp.json().await.unwrap();
    assert_eq!(
        v,
        sluice::mock::azure::content_filter_error(),
        "Azure's body, as it is"
    );
    let resp = app.messages(&token, &anthropic_body(false)).await;
    assert_eq!(resp.status(), 400);
    let v: Value = resp.json().await.unwrap();
    assert_eq!(v["type"], "error");
    assert_eq!(v["error"]["type"], "invalid_request_error");
    assert_eq!(v["error"]["code"], "content_filter");
    assert!(v["error"]["message"]
        .as_str()
        .unwrap()
        .contains("content management policy"));
    assert_eq!(app.mock.state.stats(AZURE_KEY).count, 2, "no retry");
    assert_eq!(app.state.pool().disabled(0), None);
    assert_eq!(spent(&app, id).await, 0);
}

#[tokio::test]
async fn an_answer_azures_filter_cut_ends_as_content_filter_or_refusal() {
    let app = spawn_app_with(|s, m| only(s, azure("az", m, "2024-10-21"))).await;
    let (id, token) = app.token("dev", Some("1.00")).await;
    app.mock.state.sticky(
        AZURE_KEY,
        Some(Script {
            content_filter: Some("completion".into()),
            ..Default::default()
        }),
    );
    let v: Value = app.chat(&token, &chat_body(64)).await.json().await.unwrap();
    assert_eq!(v["choices"][0]["finish_reason"], "content_filter", "{v}");
    let mut stream = chat_body(64);
    stream["stream"] = json!(true);
    let (data, _) = sse_data(app.chat(&token, &stream).await).await;
    assert!(
        data.iter()
            .any(|d| d.contains(r#""finish_reason":"content_filter""#)),
        "{data:?}"
    );
    let v: Value = app
        .messages(&token, &anthropic_body(false))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(v["stop_reason"], "refusal", "{v}");
    let evs = events(app.messages(&token, &anthropic_body(true)).await).await;
    let delta = evs
        .iter()
        .find(|(n, _)| n == "message_delta")
        .expect("message_delta");
    assert_eq!(delta.1["delta"]["stop_reason"], "refusal");
    assert_eq!(spent(&app, id).await, 4 * default_cost());
}

/// The real binary with Azure upstreams from a TOML file (an `api-key` one and an Entra
/// one), at trace level, after answers and failures: no 12-character piece of the key or
/// the client secret is in its log.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn azure_secrets_never_reach_the_log() {
    let dir = tempfile::tempdir().unwrap();
    let mock = MockServer::start("127.0.0.1:0", Default::default()).unwrap();
    let extra = format!(
        r#"
[[upstreams]]
id = "az-key"
provider = "azure_openai"
base_url = "{m}"
api_version = "2024-10-21"
api_key = "{AZURE_KEY}"
allow_private_network = true
[[upstreams]]
id = "az-entra"
provider = "azure_openai"
base_url = "{m}"
api_version = "v1"
allow_private_network = true
entra = {{ tenant_id = "t-1", client_id = "app-log", client_secret = "{ENTRA_SECRET}", authority = "{m}" }}
[[models]]
name = "az-key"
routes = [{{ upstream = "az-key", model = "gpt-4o-mini", deployment = "{DEPLOYMENT}" }}]
[[models]]
name = "az-entra"
routes = [{{ upstream = "az-entra", model = "gpt-4o-mini" }}]
"#,
        m = mock.base_url()
    );
    let g =
        crate::processes::start_gateway_full(dir.path(), &mock, &[("SLUICE_LOG", "trace")], &extra)
            .await;
    let (_db, token) = crate::gateway_proc::db_and_token(dir.path(), "logs").await;
    let http = reqwest::Client::new();
    mock.state.script(
        AZURE_KEY,
        [Script {
            status: Some(401),
            ..Default::default()
        }],
    );
    for model in ["az-key", "az-entra", "az-key", "az-entra"] {
        let mut body = chat_body(8);
        body["model"] = json!(model);
        let r = http
            .post(format!("{}/v1/chat/completions", g.url))
            .bearer_auth(&token)
            .json(&body)
            .send()
            .await
            .unwrap();
        assert!(
            matches!(r.status().as_u16(), 200 | 502 | 503),
            "{model}: {}",
            r.status()
        );
    }
    assert_eq!(mock.state.stats("entra:app-log").count, 2);
    assert_eq!(
        mock.state.stats(AZURE_KEY).count,
        1,
        "the refused key was disabled"
    );
    drop(g);
    let mut log = String::new();
    for entry in std::fs::read_dir(dir.path()).unwrap() {
        let p = entry.unwrap().path();
        if p.extension().is_some_and(|e| e == "log") {
            log.push_str(&std::fs::read_to_string(&p).unwrap());
        }
    }
    assert!(
        log.len() > 5_000,
        "the trace log is not empty ({} bytes)",
        log.len()
    );
    for secret in [AZURE_KEY, ENTRA_SECRET] {
        let chars: Vec<char> = secret.chars().collect();
        for w in chars.windows(12) {
            let piece: String = w.iter().collect();
            assert!(!log.contains(&piece), "the log contains `{piece}`");
        }
    }
}

/// The mock's seeded faults reach its Azure paths as every other path: a share of 1.0 of
/// 503s answers every request 503.
#[tokio::test]
async fn the_mocks_faults_apply_to_its_azure_paths() {
    let mock = MockServer::start("127.0.0.1:0", Default::default()).unwrap();
    mock.state.sticky(
        AZURE_KEY,
        Some(Script {
            faults: Some(sluice::mock::Faults {
                seed: 7,
                unavailable: 1.0,
                ..Default::default()
            }),
            ..Default::default()
        }),
    );
    for path in [
        format!("/openai/deployments/{DEPLOYMENT}/chat/completions?api-version=2024-10-21"),
        "/openai/v1/chat/completions".to_string(),
    ] {
        let resp = reqwest::Client::new()
            .post(format!("{}{path}", mock.base_url()))
            .header("api-key", AZURE_KEY)
            .json(&chat_body(8))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 503, "{path}");
    }
}

/// A token endpoint that fails (503) is the upstream's trouble, not a refused key: the
/// client gets a 502, the key stays enabled, and the next request fetches a token.
#[tokio::test]
async fn a_failing_token_endpoint_is_a_server_error_not_a_refused_key() {
    let app = spawn_app_with(|s, m| {
        let mut u = azure("az", m, "2024-10-21");
        u.api_key = Secret::default();
        u.entra = Some(entra(m, "app-4", ENTRA_SECRET));
        only(s, u);
    })
    .await;
    app.mock.state.script(
        "entra-token:app-4",
        [Script {
            status: Some(503),
            ..Default::default()
        }],
    );
    let (_, token) = app.token("dev", Some("1.00")).await;
    let resp = app.chat(&token, &chat_body(8)).await;
    assert_eq!(resp.status(), 502);
    assert_eq!(app.state.pool().disabled(0), None);
    assert_eq!(app.mock.state.stats("entra:app-4").count, 0);
    let resp = app.chat(&token, &chat_body(8)).await;
    assert_eq!(resp.status(), 200);
    assert_eq!(app.mock.state.entra.issued(), 1);
}
