//! Attacks on Vertex AI's token source (`upstream::providers::gemini::token`) from a
//! token endpoint that does not behave: it answers over raw TCP, so the test controls
//! every byte it sends and sees how many the gateway took.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use sluice::upstream::providers::gemini::token;
use sluice::upstream::UpstreamError;

const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/gemini");

/// A one-connection-at-a-time token endpoint answering 200 with `head` then `pad` bytes
/// of JSON whitespace (a body of `head.len() + pad` bytes, declared in Content-Length);
/// the counter holds how many body bytes were written before the reader went away.
async fn endpoint(head: String, pad: usize) -> (String, Arc<AtomicUsize>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let written = Arc::new(AtomicUsize::new(0));
    let w = written.clone();
    tokio::spawn(async move {
        while let Ok((mut sock, _)) = listener.accept().await {
            let w = w.clone();
            let head = head.clone();
            tokio::spawn(async move {
                // The request: read until the headers and the form body are in (small).
                let mut buf = vec![0u8; 64 * 1024];
                let mut got = Vec::new();
                loop {
                    let Ok(n) = sock.read(&mut buf).await else {
                        return;
                    };
                    if n == 0 {
                        return;
                    }
                    got.extend_from_slice(&buf[..n]);
                    if let Some(end) = got.windows(4).position(|x| x == b"\r\n\r\n") {
                        let text = String::from_utf8_lossy(&got[..end]).to_ascii_lowercase();
                        let len = text
                            .lines()
                            .find_map(|l| l.strip_prefix("content-length:"))
                            .and_then(|v| v.trim().parse::<usize>().ok())
                            .unwrap_or(0);
                        if got.len() >= end + 4 + len {
                            break;
                        }
                    }
                }
                let total = head.len() + pad;
                let start = format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {total}\r\n\r\n{head}"
                );
                if sock.write_all(start.as_bytes()).await.is_err() {
                    return;
                }
                w.fetch_add(head.len(), Ordering::SeqCst);
                let chunk = vec![b' '; 64 * 1024];
                let mut left = pad;
                while left > 0 {
                    let n = left.min(chunk.len());
                    if sock.write_all(&chunk[..n]).await.is_err() {
                        return;
                    }
                    w.fetch_add(n, Ordering::SeqCst);
                    left -= n;
                }
                let _ = sock.flush().await;
            });
        }
    });
    (format!("http://{addr}/token"), written)
}

fn source(
    dir: &std::path::Path,
    token_uri: &str,
) -> sluice::upstream::credential::token::TokenSource {
    let text = std::fs::read_to_string(format!("{FIXTURES}/test-service-account.json")).unwrap();
    let mut sa: Value = serde_json::from_str(&text).unwrap();
    sa["token_uri"] = json!(token_uri);
    let path = dir.join("sa.json");
    std::fs::write(&path, sa.to_string()).unwrap();
    token::source(
        token::ServiceAccount::load(&path),
        Arc::new(sluice::clock::SystemClock),
    )
}

/// The token endpoint's answer is read with a cap: an answer of 64 MiB (a valid token
/// followed by whitespace) is not buffered whole — the gateway stops reading it and the
/// exchange fails as a server error.
#[tokio::test]
async fn a_huge_token_answer_is_not_read_whole() {
    const PAD: usize = 64 * 1024 * 1024;
    let dir = tempfile::tempdir().unwrap();
    let head = json!({"access_token": "ya29.tok", "expires_in": 3600}).to_string();
    let (uri, written) = endpoint(head.clone(), PAD).await;
    let source = source(dir.path(), &uri);
    let http = reqwest::Client::new();
    let got = tokio::time::timeout(Duration::from_secs(60), source.bearer(&http))
        .await
        .expect("the exchange ends");
    // Give the writer time to notice the closed connection.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let mut last = usize::MAX;
    while std::time::Instant::now() < deadline {
        let now = written.load(Ordering::SeqCst);
        if now == last || now >= head.len() + PAD {
            break;
        }
        last = now;
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let took = written.load(Ordering::SeqCst);
    assert!(
        took < 16 * 1024 * 1024,
        "the gateway read {took} bytes of the token endpoint's answer (outcome ok: {})",
        got.is_ok()
    );
    assert!(matches!(got, Err(UpstreamError::Connect(_))), "{got:?}");
}

/// A fractional `expires_in` (a JSON number OAuth does not forbid) is a lifetime, not a
/// reason to refuse a good token: every Vertex request would fail while the endpoint
/// answers so.
#[tokio::test]
async fn a_fractional_expires_in_is_a_lifetime() {
    let dir = tempfile::tempdir().unwrap();
    let head = json!({"access_token": "ya29.tok", "expires_in": 3599.5}).to_string();
    let (uri, _) = endpoint(head, 0).await;
    let source = source(dir.path(), &uri);
    let http = reqwest::Client::new();
    let got = source.bearer(&http).await;
    assert_eq!(got.expect("a token").to_str().unwrap(), "Bearer ya29.tok");
}

/// Two calls of one function in one turn, their results sent back in the other order:
/// Gemini pairs a turn's function responses with its calls by name and position (the
/// ids are the gateway's, not Gemini's), so the responses must go in the calls' order —
/// else the first call gets the second's result, silently.
#[tokio::test]
async fn two_calls_of_one_function_get_their_own_results() {
    use crate::helpers::*;
    use sluice::config::Provider;
    let app = spawn_app_with(|s, mock| {
        let mut u = upstream("g", "gem-key-g-0123456789", mock);
        u.provider = Provider::Gemini;
        u.base_url = mock.base_url();
        s.upstreams.push(u);
        s.models.push(model("gem", &["g"]));
    })
    .await;
    let (_, token) = app.token("tools", None).await;
    let tools = json!([{"type": "function", "function": {"name": "decode_vin",
        "parameters": {"type": "object", "properties": {"vin": {"type": "string"}}}}}]);
    let call = |id: &str, vin: &str| {
        json!({"id": id, "type": "function",
            "function": {"name": "decode_vin", "arguments": json!({"vin": vin}).to_string()}})
    };
    let messages = json!([
        {"role": "user", "content": "Decode both VINs"},
        {"role": "assistant", "content": null,
            "tool_calls": [call("call_a", "AAA"), call("call_b", "BBB")]},
        {"role": "tool", "tool_call_id": "call_b", "content": "result of BBB"},
        {"role": "tool", "tool_call_id": "call_a", "content": "result of AAA"},
    ]);
    let resp = app
        .chat(
            &token,
            &json!({"model": "gem", "messages": messages, "tools": tools}),
        )
        .await;
    assert_eq!(resp.status(), 200);
    let sent = app
        .mock
        .state
        .stats("gem-key-g-0123456789")
        .last_bodies
        .back()
        .unwrap()
        .clone();
    let calls = &sent["contents"][1]["parts"];
    assert_eq!(calls[0]["functionCall"]["args"]["vin"], "AAA", "{sent}");
    let results = &sent["contents"][2]["parts"];
    assert_eq!(
        results[0]["functionResponse"]["response"]["output"], "result of AAA",
        "the first call's result goes first: {sent}"
    );
    assert_eq!(
        results[1]["functionResponse"]["response"]["output"], "result of BBB",
        "{sent}"
    );
    for r in results.as_array().unwrap() {
        assert_eq!(
            r.as_object().unwrap().len(),
            1,
            "only the response is sent: {r}"
        );
    }
}

/// A token that lives less than the five minutes it is refreshed early by (an endpoint
/// answering `expires_in: 120`): the callers that waited while it was fetched use it —
/// it has not expired — rather than each fetching another, one after the other.
#[tokio::test]
async fn callers_waiting_on_a_short_lived_token_share_it() {
    use sluice::mock::{MockConfig, MockServer, Script};
    const EMAIL: &str = "sluice-test@sluice-test.iam.gserviceaccount.com";
    let dir = tempfile::tempdir().unwrap();
    let mock = MockServer::start("127.0.0.1:0", MockConfig::default()).unwrap();
    mock.state
        .register_vertex_account(
            EMAIL,
            &std::fs::read_to_string(format!("{FIXTURES}/test-service-account.pub.pem")).unwrap(),
            Some(Duration::from_secs(120)),
        )
        .unwrap();
    mock.state.sticky(
        "token",
        Some(Script {
            delay_ms: 200,
            ..Script::default()
        }),
    );
    let source = Arc::new(source(dir.path(), &format!("{}/token", mock.base_url())));
    let http = reqwest::Client::new();
    let calls = (0..20).map(|_| {
        let (source, http) = (source.clone(), http.clone());
        tokio::spawn(async move { source.bearer(&http).await })
    });
    for r in futures_util::future::join_all(calls).await {
        assert!(r.unwrap().is_ok());
    }
    assert_eq!(
        mock.state.stats("token").count,
        1,
        "one exchange for the callers that arrived together"
    );
}

/// Sampling fields a client sets — OpenAI's `seed`, `frequency_penalty`,
/// `presence_penalty`, Anthropic's `top_k` — reach a Gemini or Bedrock model or are
/// refused naming them: never dropped silently on the way, which would answer as if
/// unasked (a drop must be announced in `x-sluice-dropped`; none of these is a hint).
#[tokio::test]
async fn sampling_fields_are_sent_or_refused_never_dropped() {
    use crate::helpers::*;
    use sluice::config::{Provider, Secret};
    let app = spawn_app_with(|s, mock| {
        let mut g = upstream("g", "gem-key-g-0123456789", mock);
        g.provider = Provider::Gemini;
        g.base_url = mock.base_url();
        let b = sluice::config::UpstreamSettings {
            id: "br".into(),
            provider: Provider::Bedrock,
            base_url: mock.base_url(),
            api_key: Secret::default(),
            region: Some("us-east-1".into()),
            access_key_id: Some("AKIDA".into()),
            secret_access_key: Some(Secret(secrecy::SecretString::from("bedrock-test-secret"))),
            allow_private_network: true,
            ..sluice::config::UpstreamSettings::default()
        };
        s.upstreams.extend([g, b]);
        s.models.push(model("gem", &["g"]));
        let mut m = model("brm", &["br"]);
        for r in &mut m.routes {
            r.model = "anthropic.claude-3-5-sonnet-20240620-v1:0".into();
        }
        s.models.push(m);
    })
    .await;
    let (_, token) = app.token("u", None).await;
    let mut dropped = Vec::new();
    for (model, key) in [("gem", "gem-key-g-0123456789"), ("brm", "AKIDA")] {
        for (anthropic, field, value) in [
            (false, "seed", json!(4242)),
            (false, "frequency_penalty", json!(1.25)),
            (false, "presence_penalty", json!(1.75)),
            (true, "top_k", json!(7)),
        ] {
            let mut body = json!({"model": model, "max_tokens": 50,
                "messages": [{"role": "user", "content": "hi"}]});
            body[field] = value.clone();
            let before = app.mock.state.stats(key).count;
            let resp = if anthropic {
                app.messages(&token, &body).await
            } else {
                app.chat(&token, &body).await
            };
            let status = resp.status().as_u16();
            let announced: Vec<String> = resp
                .headers()
                .get("x-sluice-dropped")
                .map(|v| {
                    v.to_str()
                        .unwrap()
                        .split(", ")
                        .map(str::to_string)
                        .collect()
                })
                .unwrap_or_default();
            let text = resp.text().await.unwrap();
            if status == 400 {
                assert!(text.contains(field), "{model} {field}: {text}");
                continue;
            }
            assert_eq!(status, 200, "{model} {field}: {text}");
            let stats = app.mock.state.stats(key);
            assert_eq!(stats.count, before + 1);
            let sent = stats.last_bodies.back().unwrap().to_string();
            // Left out is allowed only when announced (`x-sluice-dropped`), and only a
            // field that was left out is announced.
            let left_out = !sent.contains(&value.to_string());
            if left_out != announced.iter().any(|a| a == field) {
                dropped.push(format!(
                    "{model}: {field}={value} announced as dropped {announced:?}, sent {sent}"
                ));
            }
        }
    }
    assert!(
        dropped.is_empty(),
        "dropped silently, or announced and sent:\n{}",
        dropped.join("\n")
    );
}

/// A Gemini stream whose final `usageMetadata` comes in a chunk of its own after the
/// `finishReason` chunk is charged that usage, as when it rides on the finish chunk —
/// not the gateway's estimate, which knows nothing of the thinking tokens.
#[tokio::test]
async fn usage_after_the_finish_chunk_is_charged() {
    use crate::helpers::*;
    use sluice::config::Provider;
    use sluice::mock::{Script, SseEvent};
    const KEY: &str = "gem-key-g-0123456789";
    let app = spawn_app_with(|s, mock| {
        let mut u = upstream("g", KEY, mock);
        u.provider = Provider::Gemini;
        u.base_url = mock.base_url();
        s.upstreams.push(u);
        s.models.push(model("gem", &["g"]));
    })
    .await;
    let usage = json!({"promptTokenCount": 1000, "candidatesTokenCount": 10,
        "thoughtsTokenCount": 4000, "totalTokenCount": 5010});
    let text = |t: &str| {
        json!({"candidates": [{"content": {"role": "model", "parts": [{"text": t}]}, "index": 0}],
        "responseId": "r1", "modelVersion": "gemini-2.5-flash"})
    };
    let mut finish = text(" world");
    finish["candidates"][0]["finishReason"] = json!("STOP");
    let mut together = finish.clone();
    together["usageMetadata"] = usage.clone();
    let scripts = [
        vec![text("Hello"), together],
        vec![
            text("Hello"),
            finish,
            json!({"usageMetadata": usage, "responseId": "r1"}),
        ],
    ];
    let mut spent = Vec::new();
    for (n, events) in scripts.into_iter().enumerate() {
        let (id, token) = app.token(&format!("u{n}"), Some("1")).await;
        app.mock.state.script(
            KEY,
            [Script {
                events: Some(events.into_iter().map(SseEvent::Data).collect()),
                ..Script::default()
            }],
        );
        let resp = app
            .chat(
                &token,
                &json!({"model": "gem", "stream": true,
                    "messages": [{"role": "user", "content": "hi"}]}),
            )
            .await;
        assert_eq!(resp.status(), 200);
        let body = resp.text().await.unwrap();
        assert!(body.contains("[DONE]"), "{body}");
        app.wait_settled().await;
        spent.push(
            app.scalar(&format!(
                "SELECT 1000000 - remaining_micros FROM tokens WHERE id = {id}"
            ))
            .await,
        );
    }
    assert_eq!(
        spent[1], spent[0],
        "usage after the finish chunk charged {} micro-dollars, on it {}",
        spent[1], spent[0]
    );
    app.assert_invariant().await;
}

/// Bedrock's `metadata` (the usage) before `messageStop`: the answer still ends with its
/// stop reason for the client, and the usage is charged.
#[tokio::test]
async fn bedrock_metadata_before_message_stop_keeps_the_finish() {
    use crate::helpers::*;
    use sluice::config::{Provider, Secret};
    use sluice::mock::{Script, SseEvent};
    let app = spawn_app_with(|s, mock| {
        s.upstreams.push(sluice::config::UpstreamSettings {
            id: "br".into(),
            provider: Provider::Bedrock,
            base_url: mock.base_url(),
            api_key: Secret::default(),
            region: Some("us-east-1".into()),
            access_key_id: Some("AKIDA".into()),
            secret_access_key: Some(Secret(secrecy::SecretString::from("bedrock-test-secret"))),
            allow_private_network: true,
            ..sluice::config::UpstreamSettings::default()
        });
        let mut m = model("brm", &["br"]);
        for r in &mut m.routes {
            r.model = "anthropic.claude-3-5-sonnet-20240620-v1:0".into();
        }
        s.models.push(m);
    })
    .await;
    let (_, token) = app.token("u", None).await;
    let ev = |name: &str, v: Value| SseEvent::Named(name.into(), v);
    app.mock.state.script(
        "AKIDA",
        [Script {
            events: Some(vec![
                ev("messageStart", json!({"role": "assistant"})),
                ev(
                    "contentBlockDelta",
                    json!({"contentBlockIndex": 0, "delta": {"text": "Hello"}}),
                ),
                ev("contentBlockStop", json!({"contentBlockIndex": 0})),
                ev(
                    "metadata",
                    json!({"usage": {"inputTokens": 12, "outputTokens": 24, "totalTokens": 36},
                        "metrics": {"latencyMs": 10}}),
                ),
                ev("messageStop", json!({"stopReason": "end_turn"})),
            ]),
            ..Script::default()
        }],
    );
    let resp = app
        .chat(
            &token,
            &json!({"model": "brm", "stream": true,
                "messages": [{"role": "user", "content": "hi"}]}),
        )
        .await;
    assert_eq!(resp.status(), 200);
    let body = resp.text().await.unwrap();
    assert!(body.contains("\"finish_reason\":\"stop\""), "{body}");
}

/// Gemini puts a running `usageMetadata` on every chunk; one early chunk's figure is not the
/// answer's usage. A stream that sends `candidatesTokenCount: 1` on its first chunk, then
/// 100 chunks of text and breaks before any `finishReason` must be charged by the cut rule
/// (input plus the output counted from the deltas received), not the 1 output token the
/// first chunk reported — a hostile (or merely cut) upstream would otherwise stream any
/// amount of text for one token.
#[tokio::test]
async fn an_early_running_usage_does_not_price_a_cut_gemini_stream() {
    use crate::helpers::*;
    use sluice::config::Provider;
    use sluice::mock::{Script, SseEvent};
    const KEY: &str = "gem-key-g-0123456789";
    let app = spawn_app_with(|s, mock| {
        let mut u = upstream("g", KEY, mock);
        u.provider = Provider::Gemini;
        u.base_url = mock.base_url();
        s.upstreams.push(u);
        s.models.push(model("gem", &["g"]));
    })
    .await;
    let (_, token) = app.token("early-usage", Some("10")).await;
    let piece = "The engine light blinks when a cylinder misfires, so check the coils. ";
    let text = |t: &str| {
        json!({"candidates": [{"content": {"role": "model", "parts": [{"text": t}]}, "index": 0}],
        "responseId": "r1", "modelVersion": "gemini-2.5-flash"})
    };
    let mut first = text("Hello.");
    first["usageMetadata"] =
        json!({"promptTokenCount": 20, "candidatesTokenCount": 1, "totalTokenCount": 21});
    let deltas = 100;
    let mut events = vec![SseEvent::Data(first)];
    events.extend((0..deltas).map(|_| SseEvent::Data(text(piece))));
    let sent = events.len();
    app.mock.state.script(
        KEY,
        [Script {
            events: Some(events),
            cut_after: Some(sent),
            ..Script::default()
        }],
    );
    let resp = app
        .chat(
            &token,
            &json!({"model": "gem", "stream": true,
                "messages": [{"role": "user", "content": "Why does the engine light blink?"}]}),
        )
        .await;
    assert_eq!(resp.status(), 200);
    let body = tokio::time::timeout(Duration::from_secs(60), resp.text())
        .await
        .expect("the stream ended")
        .unwrap();
    assert!(!body.contains("[DONE]"), "a cut stream: {body}");
    app.wait_for_log_rows(1).await;
    let (input, output): (i64, i64) =
        sql_row(app.db(), "SELECT input_tokens, output_tokens FROM requests").await;
    let received = sluice::quota::estimate::count_text(&piece.repeat(deltas));
    assert_eq!(input, 20);
    assert!(
        output >= received / 2,
        "{output} output tokens charged for {received} tokens of text received"
    );
    app.assert_invariant().await;
}

/// CHECKS Q5: a stream whose usage says 0 is charged 0. A Gemini stream that ends normally
/// with `usageMetadata` of 0 prompt and 0 candidate tokens is the upstream's word.
#[tokio::test]
async fn a_gemini_stream_whose_usage_says_zero_is_charged_zero() {
    use crate::helpers::*;
    use sluice::config::Provider;
    use sluice::mock::{Script, SseEvent};
    const KEY: &str = "gem-key-g-0123456789";
    let app = spawn_app_with(|s, mock| {
        let mut u = upstream("g", KEY, mock);
        u.provider = Provider::Gemini;
        u.base_url = mock.base_url();
        s.upstreams.push(u);
        s.models.push(model("gem", &["g"]));
    })
    .await;
    let (id, token) = app.token("zero-usage", Some("1")).await;
    let mut finish = json!({"candidates": [{"content": {"role": "model", "parts": [{"text": "Hello world"}]},
        "index": 0, "finishReason": "STOP"}], "responseId": "r1", "modelVersion": "gemini-2.5-flash"});
    finish["usageMetadata"] =
        json!({"promptTokenCount": 0, "candidatesTokenCount": 0, "totalTokenCount": 0});
    app.mock.state.script(
        KEY,
        [Script {
            events: Some(vec![SseEvent::Data(finish)]),
            ..Script::default()
        }],
    );
    let resp = app
        .chat(
            &token,
            &json!({"model": "gem", "stream": true,
                "messages": [{"role": "user", "content": "hi"}]}),
        )
        .await;
    assert_eq!(resp.status(), 200);
    let body = resp.text().await.unwrap();
    assert!(body.contains("[DONE]"), "{body}");
    app.wait_settled().await;
    let spent = app
        .scalar(&format!(
            "SELECT 1000000 - remaining_micros FROM tokens WHERE id = {id}"
        ))
        .await;
    assert_eq!(spent, 0, "a usage of zeros charged {spent} micro-dollars");
    app.assert_invariant().await;
}
