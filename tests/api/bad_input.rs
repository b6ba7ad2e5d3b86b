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

/// A compressed request body is refused naming its coding: inflated, 2 KB of gzip became
/// 2 MB of JSON parsed and counted before any window saw the request (s33 late attack F2);
/// ignored, as before, a gzip body was "not valid JSON", the client's compression blamed on
/// its JSON (s33 diff attack F3). Two lines are named as two codings.
#[tokio::test]
async fn a_compressed_body_is_refused_naming_its_coding() {
    use std::io::Write;
    let app = spawn_app().await;
    let (_, token) = app.token("gzip", None).await;
    let chat = chat_body(5).to_string();
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    gz.write_all(chat.as_bytes()).unwrap();
    let gzipped = gz.finish().unwrap();
    for (codings, body, named) in [
        (vec!["gzip"], gzipped.clone(), "gzip"),
        (vec!["deflate"], gzipped.clone(), "deflate"),
        (vec!["br"], chat.clone().into_bytes(), "br"),
        (vec!["gzip", "gzip"], gzipped.clone(), "gzip, gzip"),
    ] {
        let mut req = app
            .http
            .post(format!("{}/v1/chat/completions", app.address))
            .bearer_auth(&token)
            .header("content-type", "application/json")
            .body(body);
        for c in codings {
            req = req.header("content-encoding", c);
        }
        let resp = req.send().await.unwrap();
        assert_eq!(resp.status(), 400, "{named}");
        let v: Value = resp.json().await.unwrap();
        let message = v["error"]["message"].as_str().unwrap();
        assert!(
            message.contains(&format!("content-encoding `{named}`")),
            "{message}"
        );
    }
    let resp = app
        .http
        .post(format!("{}/v1/chat/completions", app.address))
        .bearer_auth(&token)
        .header("content-type", "application/json")
        .header("content-encoding", "identity")
        .body(chat)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(
        app.mock.state.total_count(),
        1,
        "the uncompressed body only"
    );
    app.assert_invariant().await;
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

/// Sends `head` (and nothing else) on a raw connection while reading the answer, and
/// returns every byte read until the server closed the connection.
async fn raw_exchange(address: &str, head: Vec<u8>) -> Vec<u8> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let stream = tokio::net::TcpStream::connect(address.trim_start_matches("http://"))
        .await
        .unwrap();
    let (mut rd, mut wr) = stream.into_split();
    // The server stops reading once the head is over its limit: the writer may then fail
    // (reset), which is expected; the answer is read concurrently so it is not lost.
    let writer = tokio::spawn(async move {
        let _ = wr.write_all(&head).await;
        wr
    });
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match rd.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => got.extend_from_slice(&buf[..n]),
        }
    }
    drop(writer.await);
    got
}

/// The raw answer to `head`, lower-cased, once it is checked to be a bodiless 431.
async fn answer_431(address: &str, head: String) -> String {
    let answer = raw_exchange(address, head.into_bytes()).await;
    let text = String::from_utf8_lossy(&answer).to_ascii_lowercase();
    assert!(
        text.starts_with("http/1.1 431 request header fields too large\r\n"),
        "{text}"
    );
    assert!(text.contains("\r\ncontent-length: 0\r\n"), "{text}");
    text
}

/// A 1 MB header never reaches a handler: actix-http stops reading the head at 128 KiB
/// (`MAX_BUFFER_SIZE`) and answers 431 itself, with an empty body, then closes the
/// connection — it offers no hook to give that answer a JSON body, so this is the answer
/// (DESIGN.md, "Hostile input"). Read over a raw socket, so a reset after the answer
/// cannot hide it, and a closed connection without the 431 fails the test.
#[tokio::test]
async fn a_huge_header_gets_431_and_nothing_else() {
    let app = spawn_app().await;
    let (_, token) = app.token("rex", None).await;
    let body = chat_body(5).to_string();
    let head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: gw\r\nauthorization: Bearer {token}\r\n\
         content-type: application/json\r\ncontent-length: {}\r\nx-padding: {}\r\n\r\n{body}",
        body.len(),
        "a".repeat(1_000_000)
    );
    let text = answer_431(&app.address, head).await;
    assert!(
        text.ends_with("\r\n\r\n"),
        "one answer, no body, then closed: {text}"
    );
    // More headers than actix-http parses (96) is the same answer.
    let many: String = (0..120).map(|i| format!("x-h{i}: v\r\n")).collect();
    let head = format!("GET /v1/models HTTP/1.1\r\nhost: gw\r\n{many}\r\n");
    answer_431(&app.address, head).await;
    assert_eq!(app.mock.state.total_count(), 0);
    assert_eq!(app.scalar("SELECT COUNT(*) FROM requests").await, 0);
    assert_eq!(
        app.chat(&token, &chat_body(5)).await.status(),
        200,
        "still serving"
    );
}

/// Every numeric `x-sluice-*` header out of range: 400 naming it in the route's format,
/// before anything is reserved (no ledger row) or sent (the mock sees nothing).
#[tokio::test]
async fn numeric_headers_out_of_range_are_named_before_anything_is_reserved() {
    let app = spawn_app().await;
    let (_, token) = app.token("hedy", Some("1")).await;
    let cases: &[(&str, &[u8])] = &[
        ("x-sluice-priority", b"0"),
        ("x-sluice-priority", b"5"),
        ("x-sluice-priority", b"-1"),
        ("x-sluice-priority", b"99999999999999999999"),
        ("x-sluice-priority", b"\xff"),
        ("x-sluice-request-deadline-ms", b"0"),
        ("x-sluice-request-deadline-ms", b"-1"),
        ("x-sluice-request-deadline-ms", b"1.5"),
        ("x-sluice-request-deadline-ms", b"soon"),
        ("x-sluice-request-deadline-ms", b"18446744073709551616"),
        ("x-sluice-request-deadline-ms", b"\xe2\x88\x9e"),
    ];
    let messages = json!({"model": "gpt-4o-mini", "max_tokens": 5,
                          "messages": [{"role": "user", "content": "hi"}]});
    for (name, value) in cases {
        let value = reqwest::header::HeaderValue::from_bytes(value).unwrap();
        for (path, body) in [
            ("/v1/chat/completions", chat_body(5)),
            ("/v1/messages", messages.clone()),
        ] {
            let resp = app
                .http
                .post(format!("{}{path}", app.address))
                .bearer_auth(&token)
                .header(*name, value.clone())
                .json(&body)
                .send()
                .await
                .unwrap();
            assert_eq!(resp.status(), 400, "{path} {name}: {value:?}");
            let v: Value = resp.json().await.unwrap();
            let message = if path == "/v1/messages" {
                assert_eq!(v["type"], "error");
                assert_eq!(v["error"]["type"], "invalid_request_error");
                v["error"]["message"].as_str().unwrap().to_string()
            } else {
                assert_eq!(v["error"]["param"], *name, "{value:?}");
                v["error"]["message"].as_str().unwrap().to_string()
            };
            assert!(message.contains(name), "{path}: {message}");
        }
    }
    assert_eq!(
        app.mock.state.total_count(),
        0,
        "nothing reached the upstream"
    );
    assert_eq!(
        app.scalar("SELECT COUNT(*) FROM ledger").await,
        0,
        "nothing reserved"
    );
    // In range, and a deadline past the configured one (capped): served.
    let resp = app
        .http
        .post(format!("{}/v1/chat/completions", app.address))
        .bearer_auth(&token)
        .header("x-sluice-priority", "4")
        .header("x-sluice-request-deadline-ms", "18446744073709551615")
        .json(&chat_body(5))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    app.assert_invariant().await;
}

/// Body numbers Sluice passes on (penalties, seeds, log probabilities, dimensions,
/// thinking budgets) out of range: 400 naming the field, nothing reserved or sent.
#[tokio::test]
async fn body_numbers_out_of_range_are_named() {
    let app = spawn_app().await;
    let (_, token) = app.token("ida", Some("1")).await;
    let chat = |extra: Value| {
        let mut b = chat_body(5);
        b.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        b
    };
    let cases = [
        (
            "/v1/chat/completions",
            chat(json!({"presence_penalty": 1e300})),
            "presence_penalty",
        ),
        (
            "/v1/chat/completions",
            chat(json!({"frequency_penalty": -3})),
            "frequency_penalty",
        ),
        ("/v1/chat/completions", chat(json!({"seed": "42"})), "seed"),
        (
            "/v1/chat/completions",
            chat(json!({"top_logprobs": -1})),
            "top_logprobs",
        ),
        (
            "/v1/chat/completions",
            chat(json!({"logit_bias": {"1": 1e9}})),
            "logit_bias",
        ),
        (
            "/v1/chat/completions",
            chat(json!({"max_completion_tokens": 9223372036854775807i64})),
            "max_completion_tokens",
        ),
        (
            "/v1/chat/completions",
            chat(json!({"n": 18446744073709551615u64})),
            "n",
        ),
        (
            "/v1/chat/completions",
            chat(json!({"top_p": -0.0001})),
            "top_p",
        ),
        (
            "/v1/completions",
            json!({"model": "gpt-4o-mini", "prompt": "x", "logprobs": 100}),
            "logprobs",
        ),
        (
            "/v1/completions",
            json!({"model": "gpt-4o-mini", "prompt": "x", "best_of": -9223372036854775808i64}),
            "best_of",
        ),
        (
            "/v1/embeddings",
            json!({"model": "text-embedding-3-small", "input": "x", "dimensions": -1}),
            "dimensions",
        ),
        (
            "/v1/embeddings",
            json!({"model": "text-embedding-3-small", "input": "x", "n": 5252150412692178459i64}),
            "n",
        ),
    ];
    for (path, body, field) in &cases {
        let resp = app.post(path, &token, body).await;
        assert_eq!(resp.status(), 400, "{path} {field}");
        let v: Value = resp.json().await.unwrap();
        assert_eq!(v["error"]["param"], *field, "{path}: {v}");
    }
    let messages = [
        (
            json!({"model": "gpt-4o-mini", "max_tokens": 5, "top_k": -1,
                "messages": [{"role": "user", "content": "hi"}]}),
            "top_k",
        ),
        (
            json!({"model": "gpt-4o-mini", "max_tokens": 5, "temperature": 1.5,
                "messages": [{"role": "user", "content": "hi"}]}),
            "temperature",
        ),
        (
            json!({"model": "gpt-4o-mini", "max_tokens": 2000,
                "thinking": {"type": "enabled", "budget_tokens": 4000},
                "messages": [{"role": "user", "content": "hi"}]}),
            "thinking",
        ),
    ];
    for (body, field) in &messages {
        let resp = app.post("/v1/messages", &token, body).await;
        assert_eq!(resp.status(), 400, "{field}");
        let v: Value = resp.json().await.unwrap();
        assert_eq!(v["type"], "error");
        assert!(
            v["error"]["message"].as_str().unwrap().contains(field),
            "{v}"
        );
    }
    assert_eq!(app.mock.state.total_count(), 0);
    assert_eq!(app.scalar("SELECT COUNT(*) FROM ledger").await, 0);
}

/// A body that stops short, or trickles, is refused once the body's time is up: before,
/// the read had no bound, ahead of every window and queue, so any token holder could hold
/// a connection and its declared body's buffer for ever (s30 streams attack F2). Both on
/// the chat route and on Anthropic's `count_tokens`, each in its own format.
#[tokio::test]
async fn a_body_that_stops_short_or_trickles_is_refused_within_the_body_timeout() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let app = spawn_app_with(|s, _| s.server.body_timeout_seconds = 1).await;
    let (_, token) = app.token("trickle", None).await;
    for (path, says) in [
        ("/v1/chat/completions", "\"invalid_request_error\""),
        ("/v1/messages/count_tokens", "\"type\":\"error\""),
    ] {
        for trickle in [false, true] {
            let stream = tokio::net::TcpStream::connect(app.address.trim_start_matches("http://"))
                .await
                .unwrap();
            let (mut rd, mut wr) = stream.into_split();
            let head = format!(
                "POST {path} HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {token}\r\nx-api-key: {token}\r\ncontent-type: application/json\r\ncontent-length: 1000000\r\n\r\n{{\"model\": "
            );
            wr.write_all(head.as_bytes()).await.unwrap();
            let started = std::time::Instant::now();
            let writer = tokio::spawn(async move {
                if trickle {
                    loop {
                        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                        if wr.write_all(b" ").await.is_err() {
                            break;
                        }
                    }
                }
                // Held open (not closed): a client that stopped sending.
                tokio::time::sleep(std::time::Duration::from_secs(30)).await;
                drop(wr);
            });
            let mut got = Vec::new();
            let mut buf = [0u8; 4096];
            let read = tokio::time::timeout(std::time::Duration::from_secs(5), async {
                loop {
                    match rd.read(&mut buf).await {
                        Ok(0) | Err(_) => break,
                        Ok(n) => {
                            got.extend_from_slice(&buf[..n]);
                            if got.windows(4).any(|w| w == b"\r\n\r\n")
                                && String::from_utf8_lossy(&got).contains("}")
                            {
                                break;
                            }
                        }
                    }
                }
            })
            .await;
            writer.abort();
            assert!(
                read.is_ok(),
                "{path} (trickle {trickle}): no answer within 5 s"
            );
            let text = String::from_utf8_lossy(&got);
            assert!(text.starts_with("HTTP/1.1 400"), "{path}: {text}");
            assert!(
                text.contains(says) && text.contains("in time"),
                "{path}: {text}"
            );
            let took = started.elapsed();
            assert!(
                took >= std::time::Duration::from_millis(900)
                    && took < std::time::Duration::from_secs(3),
                "{path} (trickle {trickle}): {took:?}"
            );
        }
    }
}
