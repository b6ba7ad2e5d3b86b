//! Bedrock behind the gateway: OpenAI- and Anthropic-format clients through Sluice to the
//! Bedrock mock (SigV4-signed Converse / ConverseStream), answers and streams translated,
//! tools round trip, usage charged exactly, throttling moved to the other key, a corrupt
//! frame ended with the gateway's error event, a field Converse cannot take refused.

use serde_json::{json, Value};
use sluice::config::{Provider, Secret, UpstreamSettings};
use sluice::mock::Script;

use crate::helpers::{model, spawn_app_with, TestApp};

const MODEL_ID: &str = "anthropic.claude-3-5-sonnet-20240620-v1:0";

fn bedrock(id: &str, key_id: &str, base_url: String) -> UpstreamSettings {
    UpstreamSettings {
        id: id.into(),
        provider: Provider::Bedrock,
        base_url,
        api_key: Secret::default(),
        region: Some("us-east-1".into()),
        access_key_id: Some(key_id.into()),
        secret_access_key: Some(Secret(secrecy::SecretString::from("bedrock-test-secret"))),
        session_token: None,
        allow_private_network: true,
        ..UpstreamSettings::default()
    }
}

async fn app() -> TestApp {
    spawn_app_with(|s, mock| {
        s.upstreams = vec![
            bedrock("br-a", "AKIDA", mock.base_url()),
            bedrock("br-b", "AKIDB", mock.base_url()),
        ];
        let mut m = model("claude-br", &["br-a", "br-b"]);
        for r in &mut m.routes {
            r.model = MODEL_ID.into();
        }
        m.price = sluice::config::PriceKeys::usd(3.0, 15.0);
        s.models = vec![m];
    })
    .await
}

fn chat(extra: Value) -> Value {
    let mut b = json!({"model": "claude-br", "messages": [{"role": "user", "content": "hi"}]});
    for (k, v) in extra.as_object().unwrap() {
        b[k] = v.clone();
    }
    b
}

async fn spent(app: &TestApp, token: i64) -> i64 {
    app.scalar(&format!(
        "SELECT limit_micros - remaining_micros - reserved_micros FROM tokens WHERE id = {token}"
    ))
    .await
}

#[tokio::test]
async fn an_openai_client_gets_a_bedrock_answer_and_is_charged_its_usage() {
    let app = app().await;
    let (id, token) = app.token("u", Some("10")).await;
    let resp = app
        .post("/v1/chat/completions", &token, &chat(json!({})))
        .await;
    assert_eq!(resp.status(), 200);
    let v: Value = resp.json().await.unwrap();
    assert_eq!(
        v["choices"][0]["message"]["content"],
        sluice::mock::MockConfig::default().text
    );
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    assert_eq!(
        (
            v["usage"]["prompt_tokens"].as_i64(),
            v["usage"]["completion_tokens"].as_i64()
        ),
        (Some(12), Some(24))
    );
    let calls = app.mock.state.stats("AKIDA").count + app.mock.state.stats("AKIDB").count;
    assert_eq!(calls, 1);
    app.assert_invariant().await;
    // 12 × 3 USD/Mtok + 24 × 15 USD/Mtok = 396 micro-dollars, exactly.
    assert_eq!(spent(&app, id).await, 396);
}

#[tokio::test]
async fn tools_round_trip_and_an_anthropic_client_streams() {
    let app = app().await;
    let (_, token) = app.token("u", Some("10")).await;
    let tools = json!([{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]);
    let resp = app
        .post(
            "/v1/chat/completions",
            &token,
            &chat(json!({"tools": tools})),
        )
        .await;
    assert_eq!(resp.status(), 200);
    let v: Value = resp.json().await.unwrap();
    assert_eq!(v["choices"][0]["finish_reason"], "tool_calls");
    let call = &v["choices"][0]["message"]["tool_calls"][0];
    assert_eq!(call["function"]["name"], "get_weather");
    // The result goes back; the mock then answers in text.
    let follow = chat(json!({"tools": tools, "messages": [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": null, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": call["id"], "content": "12 C"}
    ]}));
    let resp = app.post("/v1/chat/completions", &token, &follow).await;
    assert_eq!(resp.status(), 200);
    let v: Value = resp.json().await.unwrap();
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    let sent = app
        .mock
        .state
        .stats("AKIDA")
        .last_bodies
        .into_iter()
        .chain(app.mock.state.stats("AKIDB").last_bodies)
        .find(|b| b.to_string().contains("toolResult"))
        .expect("the tool result reached Bedrock");
    assert_eq!(
        sent["messages"][2]["content"][0]["toolResult"]["content"][0]["text"],
        "12 C"
    );

    let resp = app
        .http
        .post(format!("{}/v1/messages", app.address))
        .header("x-api-key", &token)
        .header("anthropic-version", "2023-06-01")
        .json(
            &json!({"model": "claude-br", "max_tokens": 100, "stream": true,
            "messages": [{"role": "user", "content": "hi"}]}),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let text = resp.text().await.unwrap();
    assert!(text.contains("event: message_start"), "{text}");
    assert!(text.contains("\"text_delta\""), "{text}");
    assert!(text.contains("event: message_stop"), "{text}");
    assert!(text.contains("\"output_tokens\":24"), "{text}");
    app.assert_invariant().await;
}

#[tokio::test]
async fn throttling_moves_to_the_other_key_and_a_corrupt_frame_ends_the_stream() {
    let app = app().await;
    let (_, token) = app.token("u", Some("10")).await;
    // Key A is throttled on every call (Bedrock's 429 ThrottlingException): every request
    // is served through key B, and A, cooling down, is tried at most once.
    app.mock.state.sticky(
        "AKIDA",
        Some(Script {
            status: Some(429),
            ..Script::default()
        }),
    );
    for _ in 0..3 {
        let resp = app
            .post("/v1/chat/completions", &token, &chat(json!({})))
            .await;
        assert_eq!(resp.status(), 200);
    }
    assert_eq!(app.mock.state.stats("AKIDB").count, 3);
    assert!(app.mock.state.stats("AKIDA").count <= 1);

    // A frame with a broken CRC after two deltas: the client's stream ends with the
    // gateway's error event, never with a complete answer.
    let corrupt = Script {
        corrupt_after: Some(2),
        ..Script::default()
    };
    app.mock.state.sticky("AKIDA", Some(corrupt.clone()));
    app.mock.state.sticky("AKIDB", Some(corrupt));
    let resp = app
        .post(
            "/v1/chat/completions",
            &token,
            &chat(json!({"stream": true})),
        )
        .await;
    assert_eq!(resp.status(), 200);
    let text = resp.text().await.unwrap();
    assert!(text.contains("\"code\":\"upstream_error\""), "{text}");
    assert!(text.contains("failed its checks"), "{text}");
    assert!(!text.contains("[DONE]"), "{text}");
    app.assert_invariant().await;
}

#[tokio::test]
async fn a_field_converse_cannot_take_is_refused_naming_it() {
    let app = app().await;
    let (_, token) = app.token("u", Some("10")).await;
    for (extra, param) in [
        (
            json!({"messages": [{"role": "user", "content": [
                {"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}}]}]}),
            "image_url",
        ),
        (
            json!({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"}}}}),
            "response_format",
        ),
    ] {
        let resp = app
            .post("/v1/chat/completions", &token, &chat(extra.clone()))
            .await;
        assert_eq!(resp.status(), 400, "{extra}");
        let v: Value = resp.json().await.unwrap();
        assert_eq!(v["error"]["param"], param, "{v}");
        assert!(
            v["error"]["message"].as_str().unwrap().contains("Bedrock"),
            "{v}"
        );
    }
    assert_eq!(
        app.mock.state.stats("AKIDA").count + app.mock.state.stats("AKIDB").count,
        0
    );
    app.assert_invariant().await;
}

/// The Responses API reaches Bedrock through chat (signed, framed, read like any call):
/// streamed and not, the text whole and the usage charged exactly; the call went to the
/// model's own Converse path.
#[tokio::test]
async fn the_responses_api_reaches_bedrock_streamed_or_not() {
    let app = app().await;
    let expected = sluice::mock::MockConfig::default().text;
    for stream in [false, true] {
        let (id, token) = app.token(&format!("r{stream}"), Some("10")).await;
        let body = json!({"model": "claude-br", "input": "hi", "stream": stream});
        let resp = app.post("/v1/responses", &token, &body).await;
        assert_eq!(resp.status(), 200, "stream={stream}");
        let done = if stream {
            let ev = crate::responses_streams::events(resp).await;
            let text: String = ev
                .iter()
                .filter(|(n, _)| n == "response.output_text.delta")
                .filter_map(|(_, d)| d["delta"].as_str())
                .collect();
            assert_eq!(text, expected);
            let (last, done) = ev.last().unwrap();
            assert_eq!(last, "response.completed");
            done["response"].clone()
        } else {
            resp.json::<Value>().await.unwrap()
        };
        assert_eq!(done["status"], "completed", "{done}");
        let text: String = done["output"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|o| o["type"] == "message")
            .flat_map(|o| o["content"].as_array().unwrap().iter())
            .filter_map(|c| c["text"].as_str())
            .collect();
        assert_eq!(text, expected, "stream={stream}: {done}");
        app.wait_settled().await;
        // 12 × 3 USD/Mtok + 24 × 15 USD/Mtok = 396 micro-dollars, exactly.
        assert_eq!(spent(&app, id).await, 396, "stream={stream}");
    }
    let paths: Vec<String> = ["AKIDA", "AKIDB"]
        .iter()
        .flat_map(|k| app.mock.state.stats(k).last_paths)
        .collect();
    assert_eq!(paths.len(), 2, "{paths:?}");
    for p in &paths {
        assert!(p.starts_with("/model/") && p.contains("/converse"), "{p}");
    }
    app.assert_invariant().await;
}
