//! The OpenAI-compatible data plane: forwarding, headers, what the upstream sees, the log.

use serde_json::{json, Value};

use crate::helpers::*;
use sluice::cli::IssueArgs;

#[tokio::test]
async fn chat_is_forwarded_with_the_pool_key_and_logged() {
    let app = spawn_app().await;
    let (id, token) = app.token("alice", Some("5")).await;
    let body = json!({
        "model": "mini",
        "messages": [{"role": "user", "content": "hello"}],
        "api_base": "http://169.254.169.254/",
        "base_url": "http://127.0.0.1:1/",
        "api_key": "sk-client-supplied",
        "extra_headers": {"Host": "evil.example"},
        "user_config": {"api_base": "http://10.0.0.1"}
    });
    let resp = app
        .http
        .post(format!("{}/v1/chat/completions", app.address))
        .bearer_auth(&token)
        .header("cookie", "session=secret-cookie")
        .header("x-api-key", "sk-another-client-key")
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let h = resp.headers().clone();
    assert!(h
        .get("x-request-id")
        .unwrap()
        .to_str()
        .unwrap()
        .starts_with("req_"));
    assert_eq!(h.get("x-sluice-upstream").unwrap(), "a");
    assert_eq!(h.get("x-sluice-cache").unwrap(), "off");
    let remaining = h
        .get("x-sluice-budget-remaining-usd")
        .unwrap()
        .to_str()
        .unwrap()
        .to_string();
    assert!(
        remaining.starts_with("4.99") && remaining.split('.').nth(1).unwrap().len() == 6,
        "{remaining}"
    );
    let answer: Value = resp.json().await.unwrap();
    assert_eq!(
        answer["choices"][0]["message"]["content"],
        MockConfigText::get()
    );
    assert_eq!(
        answer["model"], "gpt-4o-mini-upstream",
        "the model field stays what the upstream returned"
    );

    let seen = app.mock.state.stats(KEY_A);
    assert_eq!(seen.count, 1);
    let headers = &seen.last_headers[0];
    assert_eq!(headers["authorization"], format!("Bearer {KEY_A}"));
    assert!(headers.get("cookie").is_none());
    assert!(headers.get("x-api-key").is_none());
    let sent = &seen.last_bodies[0];
    assert_eq!(sent["model"], "gpt-4o-mini-upstream");
    assert_eq!(
        sent["max_tokens"], 4096,
        "the reserved cap is sent upstream"
    );
    for f in [
        "api_base",
        "base_url",
        "api_key",
        "extra_headers",
        "user_config",
    ] {
        assert!(sent.get(f).is_none(), "{f} must not be forwarded");
    }
    assert_eq!(
        app.mock.state.total_count(),
        1,
        "no other upstream was contacted"
    );

    app.wait_for_log_rows(1).await;
    let (token_id, status, model, upstream, input, output, cost): (i64, i64, String, String, i64, i64, i64) =
        sql_row(app.db(), "SELECT token_id, status, model, upstream, input_tokens, output_tokens, cost_micros FROM requests")
            .await;
    assert_eq!(
        (token_id, status, model.as_str(), upstream.as_str()),
        (id, 200, "mini", "a")
    );
    assert_eq!((input, output), (12, 24));
    // 12 × 0.15 + 24 × 0.60 = 16.2 micro-dollars → rounded up once.
    assert_eq!(cost, 17);
    app.assert_invariant().await;
}

/// The mock's fixed answer text.
pub struct MockConfigText;
impl MockConfigText {
    pub fn get() -> String {
        sluice::mock::MockConfig::default().text
    }
}

#[tokio::test]
async fn completions_and_embeddings_and_models() {
    let app = spawn_app_with(|s, _| {
        s.models.push(model("secret-model", &["a"]));
    })
    .await;
    let (_, token) = app
        .issue(IssueArgs {
            models: Some("gpt-4o-mini,text-embedding-3-small"),
            ..issue_args("bob")
        })
        .await;

    let resp = app
        .post(
            "/v1/completions",
            &token,
            &json!({"model": "gpt-4o-mini", "prompt": "Say hi", "max_tokens": 5}),
        )
        .await;
    assert_eq!(resp.status(), 200);
    let v: Value = resp.json().await.unwrap();
    assert_eq!(v["object"], "text_completion");

    let resp = app
        .post(
            "/v1/embeddings",
            &token,
            &json!({"model": "text-embedding-3-small", "input": ["a", "b"]}),
        )
        .await;
    assert_eq!(resp.status(), 200);
    let v: Value = resp.json().await.unwrap();
    assert_eq!(v["data"].as_array().unwrap().len(), 2);
    assert!(app
        .mock
        .state
        .stats(KEY_A)
        .last_paths
        .iter()
        .any(|p| p == "/v1/embeddings"));

    let v: Value = app
        .http
        .get(format!("{}/v1/models", app.address))
        .bearer_auth(&token)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let ids: Vec<&str> = v["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap())
        .collect();
    assert_eq!(
        ids,
        vec!["gpt-4o-mini", "text-embedding-3-small"],
        "only the token's models are listed"
    );

    let v: Value = app
        .http
        .get(format!("{}/v1/models", app.address))
        .header("x-api-key", &token)
        .header("anthropic-version", "2023-06-01")
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(v["data"][0]["type"], "model");
    assert_eq!(v["has_more"], false);

    let resp = app
        .chat(
            &token,
            &json!({"model": "secret-model", "messages": [{"role": "user", "content": "x"}]}),
        )
        .await;
    assert_eq!(resp.status(), 403);
    let v: Value = resp.json().await.unwrap();
    assert_eq!(v["error"]["code"], "model_not_allowed");
}

#[tokio::test]
async fn upstream_client_errors_pass_through_uncharged() {
    let app = spawn_app().await;
    let (id, token) = app.token("carol", Some("1")).await;
    let err = json!({"error": {"message": "bad tool schema", "type": "invalid_request_error", "param": "tools", "code": null}});
    app.mock.state.script(
        KEY_A,
        [sluice::mock::Script {
            status: Some(422),
            body: Some(err.clone()),
            ..Default::default()
        }],
    );
    let resp = app.chat(&token, &chat_body(10)).await;
    assert_eq!(resp.status(), 422);
    assert_eq!(resp.headers().get("x-should-retry").unwrap(), "false");
    assert_eq!(resp.json::<Value>().await.unwrap(), err);
    assert_eq!(
        app.mock.state.stats(KEY_A).count,
        1,
        "one attempt, no retry"
    );
    app.assert_invariant().await;
    assert_eq!(
        app.scalar(&format!(
            "SELECT remaining_micros FROM tokens WHERE id = {id}"
        ))
        .await,
        1_000_000
    );
}

#[tokio::test]
async fn retries_are_charged_once_and_logged_with_their_attempts() {
    let app = spawn_app().await;
    let (id, token) = app.token("dave", Some("1")).await;
    let unavailable = || sluice::mock::Script {
        status: Some(503),
        ..Default::default()
    };
    app.mock.state.script(KEY_A, [unavailable(), unavailable()]);
    let resp = app.chat(&token, &chat_body(50)).await;
    assert_eq!(resp.status(), 200);
    assert_eq!(app.mock.state.stats(KEY_A).count, 3);
    app.wait_for_log_rows(1).await;
    assert_eq!(app.scalar("SELECT attempts FROM requests").await, 3);
    assert_eq!(
        app.scalar("SELECT COUNT(*) FROM ledger WHERE kind = 'settle'")
            .await,
        1
    );
    assert_eq!(
        app.scalar(&format!(
            "SELECT 1000000 - remaining_micros FROM tokens WHERE id = {id}"
        ))
        .await,
        17
    );
    app.assert_invariant().await;
}

#[tokio::test]
async fn every_route_failing_is_a_502_and_costs_nothing() {
    let app = spawn_app_with(|s, m| {
        s.upstreams.push(upstream("b", KEY_B, m));
        s.models[0].routes.push(sluice::config::RouteSettings {
            upstream: "b".into(),
            model: "gpt-4o-mini-upstream".into(),
            output_cap_param: None,
            deployment: None,
            tier_model: None,
        });
    })
    .await;
    let (id, token) = app.token("erin", Some("1")).await;
    app.mock.state.sticky(
        KEY_A,
        Some(sluice::mock::Script {
            status: Some(500),
            ..Default::default()
        }),
    );
    app.mock.state.sticky(
        KEY_B,
        Some(sluice::mock::Script {
            raw_body: Some("{\"choices\": [".into()),
            ..Default::default()
        }),
    );
    let resp = app.chat(&token, &chat_body(10)).await;
    assert_eq!(resp.status(), 502);
    assert_eq!(resp.headers().get("x-should-retry").unwrap(), "false");
    let v: Value = resp.json().await.unwrap();
    assert_eq!(v["error"]["code"], "upstream_error");
    assert!(
        !v.to_string().contains("choices"),
        "the upstream's garbage is never shown"
    );
    assert_eq!(
        app.mock.state.stats(KEY_A).count,
        1,
        "a 500 is not retried on the same key"
    );
    assert_eq!(app.mock.state.stats(KEY_B).count, 1);
    app.assert_invariant().await;
    assert_eq!(
        app.scalar(&format!(
            "SELECT remaining_micros FROM tokens WHERE id = {id}"
        ))
        .await,
        1_000_000
    );
}

#[tokio::test]
async fn a_rate_limited_key_hands_over_to_the_next_one() {
    let app = spawn_app_with(|s, m| {
        s.upstreams.push(upstream("b", KEY_B, m));
        s.models[0].routes.push(sluice::config::RouteSettings {
            upstream: "b".into(),
            model: "gpt-4o-mini-upstream".into(),
            output_cap_param: None,
            deployment: None,
            tier_model: None,
        });
    })
    .await;
    let (_, token) = app.token("frank", None).await;
    app.mock.state.sticky(
        KEY_A,
        Some(sluice::mock::Script {
            status: Some(429),
            headers: vec![("Retry-After".into(), "2".into())],
            ..Default::default()
        }),
    );
    let resp = app.chat(&token, &chat_body(10)).await;
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers().get("x-sluice-upstream").unwrap(), "b");
    for _ in 0..3 {
        assert_eq!(app.chat(&token, &chat_body(10)).await.status(), 200);
    }
    assert_eq!(
        app.mock.state.stats(KEY_A).count,
        1,
        "a cooling key gets nothing"
    );
    app.mock.state.sticky(
        KEY_B,
        Some(sluice::mock::Script {
            status: Some(429),
            ..Default::default()
        }),
    );
    let resp = app.chat(&token, &chat_body(10)).await;
    assert_eq!(resp.status(), 429);
    assert!(resp.headers().get("retry-after").is_some());
    let v: Value = resp.json().await.unwrap();
    assert_eq!(v["error"]["code"], "rate_limit_exceeded");
}

#[tokio::test]
async fn one_model_by_id_and_the_tighter_of_two_output_caps() {
    let app = spawn_app().await;
    let (_, token) = app
        .issue(IssueArgs {
            models: Some("gpt-4o-mini"),
            ..issue_args("gil")
        })
        .await;
    let ok = app
        .http
        .get(format!("{}/v1/models/gpt-4o-mini", app.address))
        .bearer_auth(&token)
        .send()
        .await
        .unwrap();
    assert_eq!(ok.status(), 200);
    assert_eq!(ok.json::<Value>().await.unwrap()["id"], "gpt-4o-mini");
    let hidden = app
        .http
        .get(format!("{}/v1/models/text-embedding-3-small", app.address))
        .bearer_auth(&token)
        .send()
        .await
        .unwrap();
    assert_eq!(
        hidden.status(),
        404,
        "a model the token may not use does not exist for it"
    );

    let body = json!({"model": "gpt-4o-mini", "max_tokens": 10, "max_completion_tokens": 4000, "messages": [{"role": "user", "content": "x"}]});
    assert_eq!(app.chat(&token, &body).await.status(), 200);
    let sent = &app.mock.state.stats(KEY_A).last_bodies[0];
    assert_eq!(sent["max_tokens"], 10);
    assert!(sent.get("max_completion_tokens").is_none());
}

/// `serve --ladder` (benchmark only) turns the later stages off; the default runs them all.
#[tokio::test]
async fn the_benchmark_ladder_skips_later_stages_and_the_default_runs_every_one() {
    use sluice::config::Ladder;
    let body = json!({"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 16});

    // `plain`: no token needed, nothing reserved, nothing logged.
    let plain = spawn_app_with(|s, _| s.ladder = Ladder::Plain).await;
    let resp = plain.chat("not-a-token", &body).await;
    assert_eq!(resp.status(), 200);
    plain.state.request_log.flush().await;
    assert_eq!(plain.scalar("SELECT COUNT(*) FROM requests").await, 0);
    assert_eq!(plain.scalar("SELECT COUNT(*) FROM ledger").await, 0);

    // `auth`: the token is checked again, and the quota stage is still off.
    let auth = spawn_app_with(|s, _| s.ladder = Ladder::Auth).await;
    assert_eq!(auth.chat("not-a-token", &body).await.status(), 401);
    let (_, token) = auth.token("bench", None).await;
    assert_eq!(auth.chat(&token, &body).await.status(), 200);
    assert_eq!(auth.scalar("SELECT COUNT(*) FROM ledger").await, 0);

    // The default is every stage: reserve and settle rows, one log row.
    let all = spawn_app().await;
    assert_eq!(sluice::config::Settings::default().ladder, Ladder::All);
    assert_eq!(all.chat("not-a-token", &body).await.status(), 401);
    let (_, token) = all.token("dev", None).await;
    assert_eq!(all.chat(&token, &body).await.status(), 200);
    all.wait_for_log_rows(2).await;
    assert_eq!(
        all.scalar("SELECT COUNT(*) FROM ledger WHERE kind IN ('reserve', 'settle')")
            .await,
        2
    );
}
