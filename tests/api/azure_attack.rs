//! Attacks on the provider kinds `azure_openai` and `openai_compatible` and the
//! per-provider transport: the Entra ID token source under a token Azure refuses early and
//! a token endpoint that hangs while the current token is still good, the Responses route
//! to a server that refuses `stream_options`, deployment names that are path segments the
//! URL builder drops, the usage an OpenAI client asked for from a server that sends none,
//! long answers without usage, odd error bodies, and a first token fetch that hangs.

use std::time::Duration;

use serde_json::{json, Value};
use sluice::config::{Provider, Secret, Settings, UpstreamSettings};
use sluice::mock::{MockServer, Script};

use crate::azure::{azure, entra, only};
use crate::compatible::{self, refuses_stream_options, KEY_C};
use crate::helpers::*;

const ENTRA_SECRET: &str = "entra-attack-secret-canary-9f8e7d";

fn entra_upstream(mock: &MockServer, client_id: &str) -> UpstreamSettings {
    let mut u = azure("az", mock, "2024-10-21");
    u.api_key = Secret::default();
    u.entra = Some(entra(mock, client_id, ENTRA_SECRET));
    u
}

/// Azure refuses a token before the expiry its endpoint announced — revoked, or cached by
/// a host whose monotonic clock (which `tokio::time::Instant` reads: it stands still while
/// the host is suspended) says it has hours left when it has none. The token is the
/// gateway's cache, not the app's secret: one 401 must not disable the deployment until an
/// operator re-enables it when a fresh token works.
#[tokio::test]
async fn a_token_azure_refuses_early_is_replaced_not_the_deployment_disabled() {
    let app = spawn_app_with(|s, m| only(s, entra_upstream(m, "app-revoke"))).await;
    let (_, token) = app.token("dev", Some("5.00")).await;
    let first = app.chat(&token, &chat_body(8)).await;
    assert_eq!(first.status(), 200);
    assert_eq!(app.mock.state.entra.issued(), 1);

    app.mock.state.entra.revoke_all();
    let second = app.chat(&token, &chat_body(8)).await;
    let status = second.status();
    let text = second.text().await.unwrap();
    assert_eq!(
        app.state.pool().disabled(0),
        None,
        "the deployment was disabled for a stale cached token (client got {status}: {text})"
    );
    assert_eq!(status, 200, "{text}");
    assert_eq!(
        app.mock.state.entra.issued(),
        2,
        "a fresh token was fetched"
    );
    // And it keeps serving.
    assert_eq!(app.chat(&token, &chat_body(8)).await.status(), 200);
}

/// A fresh token Azure refuses as well is a refused credential after all: the deployment
/// is disabled as before (no endless refetching).
#[tokio::test]
async fn a_fresh_token_azure_refuses_still_disables_the_deployment() {
    let app = spawn_app_with(|s, m| only(s, entra_upstream(m, "app-never"))).await;
    let (_, token) = app.token("dev", Some("5.00")).await;
    // Every token is refused: the key behind them is wrong for this resource.
    app.mock.state.sticky(
        "entra:app-never",
        Some(Script {
            status: Some(401),
            ..Default::default()
        }),
    );
    let resp = app.chat(&token, &chat_body(8)).await;
    assert_eq!(resp.status(), 502);
    assert_eq!(
        app.state.pool().disabled(0),
        Some(sluice::upstream::pool::Disabled::Auth)
    );
    assert!(
        app.mock.state.entra.issued() <= 2,
        "{} tokens fetched",
        app.mock.state.entra.issued()
    );
}

/// The design: "the old token used while still valid if a refresh fails". A token endpoint
/// that does not answer at all during the refresh window is the same failure, slower: the
/// request that refreshes, and every request queued behind its fetch, must still be sent
/// with the current token — not held until the first-byte timeout and failed.
#[tokio::test]
async fn a_hanging_token_refresh_does_not_hold_requests_while_the_token_is_valid() {
    let app = spawn_app_with(|s, m| {
        only(s, entra_upstream(m, "app-hang"));
        s.upstream.first_byte_timeout_ms = 8_000;
    })
    .await;
    // 30 s tokens: refreshed from 24 s on, still sent until 28.5 s.
    app.mock.state.entra.set_expires_in(30);
    let (_, token) = app.token("dev", Some("5.00")).await;
    let first = app.chat(&token, &chat_body(8)).await;
    assert_eq!(first.status(), 200);
    let fetched_by = tokio::time::Instant::now();
    assert_eq!(app.mock.state.entra.issued(), 1);
    // From now on the token endpoint answers nothing for a minute.
    app.mock.state.sticky(
        "entra-token:app-hang",
        Some(Script {
            delay_ms: 60_000,
            ..Default::default()
        }),
    );
    tokio::time::sleep_until(fetched_by + Duration::from_millis(24_300)).await;
    let sent = tokio::time::Instant::now();
    let body = chat_body(8);
    let all = futures_util::future::join_all((0..3).map(|_| app.chat(&token, &body))).await;
    let took = sent.elapsed();
    let statuses: Vec<u16> = all.iter().map(|r| r.status().as_u16()).collect();
    assert_eq!(
        statuses,
        vec![200, 200, 200],
        "requests in the refresh window with a valid token failed after {took:?}"
    );
    assert_eq!(
        app.mock.state.entra.refused(),
        0,
        "no expired token was sent"
    );
    assert_eq!(app.state.pool().disabled(0), None);
}

/// `quirks.include_usage = false`: the server refuses `stream_options`. The Responses route
/// reaches such a server through chat; it must not send `stream_options` either.
#[tokio::test]
async fn the_responses_route_sends_no_stream_options_to_a_server_that_refuses_them() {
    let app = spawn_app_with(quiet_compatible).await;
    refuses_stream_options(&app);
    let (id, token) = app.token("dev", Some("1.00")).await;
    let resp = app
        .post(
            "/v1/responses",
            &token,
            &json!({"model": "gpt-4o-mini", "input": "Why does the engine light blink?",
                "stream": true}),
        )
        .await;
    let status = resp.status();
    let text = resp.text().await.unwrap();
    let sent = app.mock.state.stats(KEY_C).last_bodies.back().cloned();
    assert_eq!(
        status,
        200,
        "{text}\nsent upstream: {}",
        sent.unwrap_or(Value::Null)
    );
    assert!(text.contains("response.completed"), "{text}");
    app.wait_settled().await;
    app.wait_for_log_rows(1).await;
    let output = app
        .scalar(&format!(
            "SELECT output_tokens FROM requests WHERE token_id = {id}"
        ))
        .await;
    assert!(output > 0, "the counted output is charged: {output}");
}

/// A deployment name is one path segment. `.` and `..` are dropped by the URL builder
/// (`PathSegmentsMut::extend` skips them), so a route to deployment `..` went to
/// `/openai/deployments/chat/completions` — deployment `chat`, operation `completions` — a
/// different deployment and the legacy completions operation. Azure names have neither;
/// the config check refuses them.
#[tokio::test]
async fn a_deployment_named_dot_dot_is_refused_not_sent_elsewhere() {
    const KEY: &str = "az-key-dots-0123456789";
    let azure = |m: &MockServer, s: &mut Settings, deployment: Option<&str>, model_name: &str| {
        let mut u = upstream("az", KEY, m);
        u.provider = Provider::AzureOpenai;
        u.base_url = m.base_url();
        u.api_version = Some("2024-10-21".into());
        s.upstreams = vec![u];
        let mut mdl = model("gpt-4o-mini", &["az"]);
        mdl.routes[0].deployment = deployment.map(str::to_string);
        mdl.routes[0].model = model_name.into();
        s.models = vec![mdl];
    };
    for name in ["..", "."] {
        for (deployment, model_name) in [(Some(name), "gpt-4o-mini"), (None, name)] {
            let mock = MockServer::start("127.0.0.1:0", Default::default()).unwrap();
            let mut s = Settings::default();
            azure(&mock, &mut s, deployment, model_name);
            if let Err(e) = s.validate() {
                assert!(e.to_string().contains("deployment"), "{name}: {e}");
                continue;
            }
            // Accepted: show where its requests go.
            let app = spawn_app_with(|s, m| azure(m, s, deployment, model_name)).await;
            let (_, token) = app.token("dev", Some("1.00")).await;
            let r = app.chat(&token, &chat_body(8)).await;
            let status = r.status();
            let body = r.text().await.unwrap();
            let paths = app.mock.state.stats(KEY).last_paths;
            panic!(
                "deployment {name:?} (deployment = {deployment:?}, model = {model_name:?}) was \
                 accepted: {status}, the upstream saw {paths:?}; answer {body}"
            );
        }
    }
}

/// `gpt-4o-mini` served by an OpenAI-compatible server that sends no usage.
fn quiet_compatible(s: &mut Settings, m: &MockServer) {
    let mut u = compatible::compatible("quiet", m);
    u.quirks.include_usage = false;
    compatible::only(s, u, "llama-3.1-8b");
}

/// An OpenAI client that asks for the usage chunk (`stream_options.include_usage`) of a
/// server that refuses `stream_options`: the gateway strips the option and counts the
/// output; the client is told what it was charged, as an Anthropic client is.
#[tokio::test]
async fn an_openai_client_asking_for_usage_from_a_server_without_it_gets_the_count() {
    let app = spawn_app_with(quiet_compatible).await;
    refuses_stream_options(&app);
    let (id, token) = app.token("dev", Some("1.00")).await;
    let mut body = chat_body(64);
    body["stream"] = json!(true);
    body["stream_options"] = json!({"include_usage": true});
    let resp = app.chat(&token, &body).await;
    assert_eq!(resp.status(), 200);
    let (data, _) = sse_data(resp).await;
    assert_eq!(data.last().map(String::as_str), Some("[DONE]"));
    app.wait_settled().await;
    app.wait_for_log_rows(1).await;
    let q = |c: &str| format!("SELECT {c} FROM requests WHERE token_id = {id}");
    let (input, output) = (
        app.scalar(&q("input_tokens")).await,
        app.scalar(&q("output_tokens")).await,
    );
    let usage: Vec<Value> = data
        .iter()
        .filter_map(|d| serde_json::from_str::<Value>(d).ok())
        .filter(|v| v["usage"].is_object())
        .collect();
    assert_eq!(
        usage.len(),
        1,
        "one usage chunk (charged {input} in, {output} out); chunks: {data:?}"
    );
    assert_eq!(usage[0]["usage"]["completion_tokens"], output);
    assert_eq!(usage[0]["usage"]["prompt_tokens"], input);
}

/// A long answer from a server that never reports usage, streamed and not: the charge is
/// the counted output, never zero.
#[tokio::test]
async fn a_long_answer_without_usage_is_charged_its_counted_output() {
    let app = spawn_app_with(quiet_compatible).await;
    let long = "The engine light blinks when a cylinder misfires. ".repeat(200);
    app.mock.state.sticky(
        KEY_C,
        Some(Script {
            reject_stream_options: true,
            omit_usage: true,
            text: Some(long.clone()),
            ..Default::default()
        }),
    );
    for stream in [false, true] {
        let (id, token) = app.token(&format!("dev-{stream}"), Some("1.00")).await;
        let mut body = chat_body(4000);
        body["stream"] = json!(stream);
        let resp = app.chat(&token, &body).await;
        assert_eq!(resp.status(), 200);
        let _ = resp.bytes().await.unwrap();
        app.wait_settled().await;
        let n = if stream { 2 } else { 1 };
        app.wait_for_log_rows(n).await;
        let output = app
            .scalar(&format!(
                "SELECT output_tokens FROM requests WHERE token_id = {id}"
            ))
            .await;
        // 200 sentences of ~10 tokens.
        assert!(
            output >= 1000,
            "stream {stream}: charged {output} output tokens"
        );
    }
}

/// A compatible server's error body that is huge, HTML, or JSON of no known shape: the
/// client gets its status and an error in its format.
#[tokio::test]
async fn odd_error_bodies_keep_the_status_and_the_clients_format() {
    let app = spawn_app_with(quiet_compatible).await;
    let (_, token) = app.token("dev", Some("1.00")).await;
    let bodies = [
        format!("{{\"detail\": \"{}\"}}", "x".repeat(200_000)),
        format!("<html><body>{}</body></html>", "<p>bad</p>".repeat(20_000)),
        "[1, 2, 3]".to_string(),
        "{\"error\": {\"message\": 42}}".to_string(),
        "line one\nline two".to_string(),
    ];
    for raw in bodies {
        for status in [400u16, 404, 422] {
            let s = Script {
                status: Some(status),
                raw_body: Some(raw.clone()),
                ..Default::default()
            };
            app.mock.state.script(KEY_C, [s.clone(), s]);
            let resp = app.chat(&token, &chat_body(8)).await;
            assert_eq!(resp.status(), status, "{}", &raw[..20.min(raw.len())]);
            let v: Value = resp.json().await.expect("JSON");
            assert!(v["error"]["message"].is_string(), "{v}");
            assert!(v.to_string().len() < 10_000, "a bounded message");
            let resp = app
                .messages(&token, &crate::azure::anthropic_body(false))
                .await;
            assert_eq!(resp.status(), status);
            let v: Value = resp.json().await.expect("JSON");
            assert_eq!(v["type"], "error", "{v}");
            assert!(v["error"]["message"].is_string(), "{v}");
        }
    }
    assert_eq!(app.state.pool().disabled(0), None);
}

/// A token endpoint that never answers the first fetch (no token to fall back on): the
/// request ends at its first-byte bound as a server error — not held past it, the key not
/// disabled — and once that exchange has ended at its own bound (30 s: it outlives the
/// requests that wait on it) a request exchanges anew and is served.
#[tokio::test]
async fn a_hanging_first_token_fetch_ends_at_the_first_byte_bound() {
    let app = spawn_app_with(|s, m| {
        only(s, entra_upstream(m, "app-first"));
        s.upstream.first_byte_timeout_ms = 2_000;
        // The requests that wait out the hung exchange each count a failure; the breaker's
        // own rest (60 s) is not what this test is about.
        s.breaker.failure_threshold = 100;
    })
    .await;
    app.mock.state.script(
        "entra-token:app-first",
        [Script {
            delay_ms: 120_000,
            ..Default::default()
        }],
    );
    let (_, token) = app.token("dev", Some("1.00")).await;
    let resp = tokio::time::timeout(Duration::from_secs(60), app.chat(&token, &chat_body(8)))
        .await
        .expect("the request was held past its first-byte bound by a minute");
    assert!(
        matches!(resp.status().as_u16(), 502 | 504),
        "{}",
        resp.status()
    );
    assert_eq!(app.state.pool().disabled(0), None);
    assert_eq!(app.mock.state.stats("entra:app-first").count, 0);
    // The breaker may rest the key a moment: poll.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let r = app.chat(&token, &chat_body(8)).await;
        if r.status() == 200 {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "{}", r.status());
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// A token service that writes `expires_in` as a fraction (`2.5`) or a fractional string:
/// the token lives that long, not the hour the gateway assumed when it could not read a
/// whole number — no expired token reaches Azure.
#[tokio::test]
async fn a_fractional_expires_in_is_read_not_taken_for_an_hour() {
    let app = spawn_app_with(|s, m| only(s, entra_upstream(m, "app-frac"))).await;
    app.mock.state.entra.set_expires_in(3);
    *app.mock.state.entra.expires_in_written.lock() = Some(json!(3.0));
    let (_, token) = app.token("dev", Some("5.00")).await;
    assert_eq!(app.chat(&token, &chat_body(8)).await.status(), 200);
    // Past the token's life (3 s), with room for a loaded machine.
    tokio::time::sleep(Duration::from_millis(4_500)).await;
    assert_eq!(app.chat(&token, &chat_body(8)).await.status(), 200);
    assert_eq!(
        app.mock.state.entra.refused(),
        0,
        "an expired token was sent ({} tokens fetched)",
        app.mock.state.entra.issued()
    );
}
