//! Bad input gets a clear 4xx naming the problem, reaches no upstream, and costs nothing.

use serde_json::{json, Value};

use crate::helpers::*;

#[tokio::test]
async fn each_bad_request_names_its_problem_and_reaches_nothing() {
    let app = spawn_app_with(|s, _| s.server.max_body_bytes = 64 * 1024).await;
    let (id, token) = app.token("alice", Some("1")).await;
    let deep = format!("{}{}", "[".repeat(10_000), "]".repeat(10_000));
    let cases: Vec<(Vec<u8>, u16, &str, Option<&str>)> = vec![
        (b"{not json".to_vec(), 400, "invalid_request_error", None),
        (b"[1,2,3]".to_vec(), 400, "invalid_request_error", None),
        (vec![0xff, 0xfe, 0x7b], 400, "invalid_request_error", None),
        (format!("{{\"model\": \"gpt-4o-mini\", \"messages\": {deep}}}").into_bytes(), 400, "invalid_request_error", None),
        (json!({"messages": []}).to_string().into_bytes(), 400, "invalid_request_error", Some("model")),
        (json!({"model": 5, "messages": []}).to_string().into_bytes(), 400, "invalid_request_error", Some("model")),
        (json!({"model": "gpt-4o-mini"}).to_string().into_bytes(), 400, "invalid_request_error", Some("messages")),
        (json!({"model": "gpt-4o-mini", "messages": "hi"}).to_string().into_bytes(), 400, "invalid_request_error", Some("messages")),
        (json!({"model": "gpt-4o-mini", "messages": [{"content": "x"}]}).to_string().into_bytes(), 400, "invalid_request_error", Some("messages")),
        (json!({"model": "gpt-4o-mini", "max_tokens": "ten", "messages": [{"role": "user", "content": "x"}]}).to_string().into_bytes(), 400, "invalid_request_error", Some("max_tokens")),
        (json!({"model": "gpt-4o-mini", "max_tokens": -1, "messages": [{"role": "user", "content": "x"}]}).to_string().into_bytes(), 400, "invalid_request_error", Some("max_tokens")),
        (json!({"model": "gpt-4o-mini", "max_tokens": 99_999_999_999u64, "messages": [{"role": "user", "content": "x"}]}).to_string().into_bytes(), 400, "invalid_request_error", Some("max_tokens")),
        (json!({"model": "gpt-4o-mini", "n": 100, "messages": [{"role": "user", "content": "x"}]}).to_string().into_bytes(), 400, "invalid_request_error", Some("n")),
        (json!({"model": "gpt-4o-mini", "stream": "yes", "messages": [{"role": "user", "content": "x"}]}).to_string().into_bytes(), 400, "invalid_request_error", Some("stream")),
        (json!({"model": "gpt-4o-mini", "temperature": 9, "messages": [{"role": "user", "content": "x"}]}).to_string().into_bytes(), 400, "invalid_request_error", Some("temperature")),
        (json!({"model": "no-such-model", "messages": [{"role": "user", "content": "x"}]}).to_string().into_bytes(), 404, "model_not_found", None),
        (json!({"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "x".repeat(70_000)}]}).to_string().into_bytes(), 413, "request_too_large", None),
    ];
    for (body, status, code, param) in cases {
        let resp = app
            .http
            .post(format!("{}/v1/chat/completions", app.address))
            .bearer_auth(&token)
            .header("content-type", "application/json")
            .body(body.clone())
            .send()
            .await
            .unwrap();
        let what = String::from_utf8_lossy(&body[..body.len().min(80)]).to_string();
        assert_eq!(resp.status().as_u16(), status, "{what}");
        assert_eq!(resp.headers().get("x-should-retry").unwrap(), "false");
        assert!(resp.headers().get("x-request-id").is_some());
        let v: Value = resp.json().await.unwrap();
        assert_eq!(v["error"]["code"], code, "{what}");
        if let Some(p) = param {
            assert_eq!(v["error"]["param"], p, "{what}");
        }
        assert!(!v["error"]["message"].as_str().unwrap().is_empty());
    }
    assert_eq!(
        app.mock.state.total_count(),
        0,
        "nothing reached the upstream"
    );
    app.assert_invariant().await;
    assert_eq!(
        app.scalar(&format!(
            "SELECT remaining_micros FROM tokens WHERE id = {id}"
        ))
        .await,
        1_000_000
    );
    assert_eq!(app.scalar("SELECT COUNT(*) FROM ledger").await, 0);
}

#[tokio::test]
async fn the_input_cap_is_enforced_before_anything_is_sent() {
    let app = spawn_app_with(|s, _| s.models[0].max_input_tokens = 50).await;
    let (_, token) = app.token("bob", None).await;
    let long = "word ".repeat(200);
    let resp = app
        .chat(
            &token,
            &json!({"model": "gpt-4o-mini", "messages": [{"role": "user", "content": long}]}),
        )
        .await;
    assert_eq!(resp.status(), 400);
    let v: Value = resp.json().await.unwrap();
    assert_eq!(v["error"]["param"], "messages");
    assert_eq!(app.mock.state.total_count(), 0);
}

#[tokio::test]
async fn unknown_routes_are_json_404s() {
    let app = spawn_app().await;
    let resp = app
        .http
        .get(format!("{}/v2/whatever", app.address))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 404);
    assert!(resp.headers().get("x-request-id").is_some());
    let v: Value = resp.json().await.unwrap();
    assert_eq!(v["error"]["type"], "invalid_request_error");
    let resp = app
        .http
        .get(format!("{}/healthz", app.address))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let resp = app
        .http
        .get(format!("{}/readyz", app.address))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
}

#[tokio::test]
async fn upstream_redirects_are_never_followed() {
    let canary =
        sluice::mock::MockServer::start("127.0.0.1:0", sluice::mock::MockConfig::default())
            .unwrap();
    let app = spawn_app().await;
    let (_, token) = app.token("ray", None).await;
    let location = format!("{}/v1/chat/completions", canary.base_url());
    app.mock.state.script(
        KEY_A,
        [sluice::mock::Script {
            status: Some(307),
            headers: vec![("Location".into(), location)],
            ..Default::default()
        }],
    );
    let resp = app.chat(&token, &chat_body(5)).await;
    assert_eq!(resp.status(), 502);
    assert_eq!(
        canary.state.total_count(),
        0,
        "the redirect target saw nothing"
    );
}

#[tokio::test]
async fn a_huge_header_is_refused_quickly() {
    let app = spawn_app().await;
    let (_, token) = app.token("rex", None).await;
    let started = std::time::Instant::now();
    let resp = app
        .http
        .post(format!("{}/v1/chat/completions", app.address))
        .bearer_auth(&token)
        .header("x-padding", "a".repeat(1_000_000))
        .json(&chat_body(5))
        .send()
        .await;
    // The server may also close the connection outright (an `Err`).
    if let Ok(r) = resp {
        assert!(
            matches!(r.status().as_u16(), 400 | 413 | 431),
            "{}",
            r.status()
        );
    }
    assert!(started.elapsed() < std::time::Duration::from_secs(2));
    assert_eq!(app.mock.state.total_count(), 0);
    assert_eq!(
        app.chat(&token, &chat_body(5)).await.status(),
        200,
        "still serving"
    );
}
