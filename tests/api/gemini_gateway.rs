//! Clients of both formats through the gateway to the Gemini mock — the Gemini API (key)
//! and Vertex AI (service account) — streamed and not, a tool round trip, usage charged
//! exactly (cached and thinking tokens included), a rate limit served by another key, and
//! a field Gemini cannot express refused naming it.

use serde_json::{json, Value};
use sluice::config::{Provider, Secret, VertexSettings};
use sluice::mock::{MockServer, Script};

use crate::helpers::*;

const KEY_G: &str = "gem-key-g-0123456789";
const KEY_H: &str = "gem-key-h-0123456789";
const EMAIL: &str = "sluice-test@sluice-test.iam.gserviceaccount.com";
const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/gemini");

fn gemini(id: &str, key: &str, mock: &MockServer) -> sluice::config::UpstreamSettings {
    let mut u = upstream(id, key, mock);
    u.provider = Provider::Gemini;
    u.base_url = mock.base_url();
    u
}

/// `gem` on the Gemini API key `g`, `pool` on `g` and `h`; `vgem` on Vertex AI (`v`). Prices: 0.15 in,
/// 0.075 cached in, 0.60 out per million.
async fn app() -> TestApp {
    spawn_app_with(|s, mock| {
        // The app's own temp dir (the backup folder's parent), removed with the app.
        let sa_dir = std::path::Path::new(&s.backup.dir)
            .parent()
            .unwrap()
            .to_path_buf();
        let mut sa: Value = serde_json::from_str(
            &std::fs::read_to_string(format!("{FIXTURES}/test-service-account.json")).unwrap(),
        )
        .unwrap();
        sa["token_uri"] = json!(format!("{}/token", mock.base_url()));
        let path = sa_dir.join("sa.json");
        std::fs::write(&path, sa.to_string()).unwrap();
        mock.state
            .register_vertex_account(
                EMAIL,
                &std::fs::read_to_string(format!("{FIXTURES}/test-service-account.pub.pem"))
                    .unwrap(),
                None,
            )
            .unwrap();
        let mut v = gemini("v", "", mock);
        v.api_key = Secret::default();
        v.vertex = Some(VertexSettings {
            project: "sluice-test".into(),
            location: "us-central1".into(),
            credentials_file: path,
        });
        s.upstreams
            .extend([gemini("g", KEY_G, mock), gemini("h", KEY_H, mock), v]);
        for (name, routes) in [
            ("gem", &["g"][..]),
            ("pool", &["g", "h"][..]),
            ("vgem", &["v"][..]),
        ] {
            let mut m = model(name, routes);
            m.price.cached_input_usd_per_mtok = Some(0.075.into());
            s.models.push(m);
        }
    })
    .await
}

/// 1000 prompt tokens of which 600 cached, 24 visible output and 100 thinking:
/// 400 × 0.15 + 600 × 0.075 + 124 × 0.60 = 179.4 → 180 micro-dollars.
fn usage_script() -> Script {
    Script {
        prompt_tokens: Some(1000),
        cached_tokens: Some(600),
        completion_tokens: Some(24),
        reasoning_tokens: Some(100),
        ..Script::default()
    }
}
const CHARGE: i64 = 180;

async fn send(app: &TestApp, token: &str, anthropic: bool, model: &str, stream: bool) -> String {
    let resp = if anthropic {
        app.http
            .post(format!("{}/v1/messages", app.address))
            .header("x-api-key", token)
            .header("anthropic-version", "2023-06-01")
            .json(&json!({"model": model, "max_tokens": 500, "stream": stream,
                "messages": [{"role": "user", "content": "Why does the engine light blink?"}]}))
            .send()
            .await
            .unwrap()
    } else {
        app.chat(
            token,
            &json!({"model": model, "max_tokens": 500, "stream": stream,
            "messages": [{"role": "user", "content": "Why does the engine light blink?"}]}),
        )
        .await
    };
    assert_eq!(
        resp.status(),
        200,
        "{model} anthropic={anthropic} stream={stream}"
    );
    if !stream {
        let v: Value = resp.json().await.unwrap();
        return if anthropic {
            v["content"]
                .as_array()
                .unwrap()
                .iter()
                .filter_map(|b| b["text"].as_str())
                .collect()
        } else {
            v["choices"][0]["message"]["content"]
                .as_str()
                .unwrap()
                .to_string()
        };
    }
    let body = resp.text().await.unwrap();
    let data: Vec<&str> = body
        .split("\n\n")
        .filter_map(|e| e.lines().find_map(|l| l.strip_prefix("data: ")))
        .collect();
    let mut text = String::new();
    for d in &data {
        let Ok(v) = serde_json::from_str::<Value>(d) else {
            continue;
        };
        if let Some(t) = v
            .pointer("/choices/0/delta/content")
            .and_then(Value::as_str)
        {
            text.push_str(t);
        }
        if v["type"] == "content_block_delta" {
            if let Some(t) = v.pointer("/delta/text").and_then(Value::as_str) {
                text.push_str(t);
            }
        }
    }
    text
}

#[tokio::test]
async fn both_client_formats_reach_gemini_and_vertex_streamed_or_not_and_pay_exactly() {
    let app = app().await;
    let expected = sluice::mock::MockConfig::default().text;
    let mut n = 0;
    for (model, key) in [("gem", KEY_G), ("vgem", EMAIL)] {
        for anthropic in [false, true] {
            for stream in [false, true] {
                n += 1;
                let (id, token) = app.token(&format!("u{n}"), Some("1")).await;
                app.mock.state.script(key, [usage_script()]);
                let text = send(&app, &token, anthropic, model, stream).await;
                assert_eq!(
                    text, expected,
                    "{model} anthropic={anthropic} stream={stream}"
                );
                app.wait_settled().await;
                let spent = app
                    .scalar(&format!(
                        "SELECT 1000000 - remaining_micros FROM tokens WHERE id = {id}"
                    ))
                    .await;
                assert_eq!(
                    spent, CHARGE,
                    "{model} anthropic={anthropic} stream={stream}"
                );
                let stats = app.mock.state.stats(key);
                let path = stats.last_paths.back().unwrap();
                assert!(
                    path.ends_with(if stream {
                        ":streamGenerateContent"
                    } else {
                        ":generateContent"
                    }),
                    "{path}"
                );
                assert_eq!(
                    stats.last_bodies.back().unwrap()["generationConfig"]["maxOutputTokens"],
                    500
                );
            }
        }
    }
    assert_eq!(
        app.mock.state.stats("token").count,
        1,
        "one Vertex token for every call"
    );
    app.assert_invariant().await;
}

#[tokio::test]
async fn a_tool_round_trip_through_gemini_keeps_the_call_id_and_the_name() {
    let app = app().await;
    let (_, token) = app.token("tools", None).await;
    let tools = json!([{"type": "function", "function": {"name": "decode_vin", "description": "Decode a VIN",
        "parameters": {"type": "object", "properties": {"vin": {"type": "string"}}, "required": ["vin"]}}}]);
    let mut messages = vec![json!({"role": "user", "content": "Decode my VIN"})];
    let resp = app
        .chat(
            &token,
            &json!({"model": "gem", "messages": messages, "tools": tools}),
        )
        .await;
    assert_eq!(resp.status(), 200);
    let v: Value = resp.json().await.unwrap();
    let msg = v["choices"][0]["message"].clone();
    assert_eq!(v["choices"][0]["finish_reason"], "tool_calls", "{v}");
    let call = &msg["tool_calls"][0];
    assert_eq!(call["function"]["name"], "decode_vin");
    let id = call["id"].as_str().unwrap().to_string();
    messages.push(msg.clone());
    messages.push(json!({"role": "tool", "tool_call_id": id, "content": "Golf, 1999"}));
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
        .stats(KEY_G)
        .last_bodies
        .back()
        .unwrap()
        .clone();
    let contents = sent["contents"].as_array().unwrap();
    assert_eq!(
        contents[1]["parts"][0]["functionCall"]["name"], "decode_vin",
        "{sent}"
    );
    assert_eq!(
        contents[2]["parts"][0]["functionResponse"]["name"], "decode_vin",
        "{sent}"
    );
    assert_eq!(
        contents[2]["parts"][0]["functionResponse"]["response"]["output"],
        "Golf, 1999"
    );

    // A result for a call that never was: 400 naming the id.
    let bad = vec![
        json!({"role": "user", "content": "hi"}),
        json!({"role": "tool", "tool_call_id": "call_nowhere", "content": "x"}),
    ];
    let resp = app
        .chat(&token, &json!({"model": "gem", "messages": bad}))
        .await;
    assert_eq!(resp.status(), 400);
    let v: Value = resp.json().await.unwrap();
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("call_nowhere"),
        "{v}"
    );
}

#[tokio::test]
async fn a_resource_exhausted_key_cools_down_and_another_serves() {
    let app = app().await;
    let (_, token) = app.token("limits", None).await;
    let body: Value = serde_json::from_str(
        &std::fs::read_to_string(format!("{FIXTURES}/error_rate_limited.json")).unwrap(),
    )
    .unwrap();
    app.mock.state.sticky(
        KEY_G,
        Some(Script {
            status: Some(429),
            body: Some(body),
            ..Script::default()
        }),
    );
    for _ in 0..3 {
        let text = send(&app, &token, false, "pool", false).await;
        assert_eq!(text, sluice::mock::MockConfig::default().text);
    }
    assert_eq!(
        app.mock.state.stats(KEY_G).count,
        1,
        "g cools down for Google's 38 s retry delay"
    );
    assert_eq!(app.mock.state.stats(KEY_H).count, 3);
    app.assert_invariant().await;
}

#[tokio::test]
async fn a_field_gemini_cannot_express_is_refused_naming_it_and_costs_nothing() {
    let app = app().await;
    let (id, token) = app.token("refused", Some("1")).await;
    let resp = app.chat(&token, &json!({"model": "gem", "parallel_tool_calls": false,
        "messages": [{"role": "user", "content": "hi"}],
        "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]})).await;
    assert_eq!(resp.status(), 400);
    let v: Value = resp.json().await.unwrap();
    assert_eq!(v["error"]["param"], "parallel_tool_calls", "{v}");
    assert_eq!(
        app.mock.state.stats(KEY_G).count + app.mock.state.stats(KEY_H).count,
        0
    );
    app.wait_settled().await;
    assert_eq!(
        app.scalar(&format!(
            "SELECT 1000000 - remaining_micros FROM tokens WHERE id = {id}"
        ))
        .await,
        0
    );
}

/// The Responses API reaches Gemini through chat, as it reaches Anthropic: the Gemini API
/// and Vertex AI, streamed and not, the text whole and the usage charged exactly.
#[tokio::test]
async fn the_responses_api_reaches_gemini_and_vertex_streamed_or_not() {
    let app = app().await;
    let expected = sluice::mock::MockConfig::default().text;
    let mut n = 0;
    for (model, key) in [("gem", KEY_G), ("vgem", EMAIL)] {
        for stream in [false, true] {
            n += 1;
            let (id, token) = app.token(&format!("r{n}"), Some("1")).await;
            app.mock.state.script(key, [usage_script()]);
            let body = json!({"model": model, "input": "Why does the engine light blink?",
                "max_output_tokens": 500, "stream": stream});
            let resp = app.post("/v1/responses", &token, &body).await;
            assert_eq!(resp.status(), 200, "{model} stream={stream}");
            let done = if stream {
                let ev = crate::responses_streams::events(resp).await;
                let text: String = ev
                    .iter()
                    .filter(|(n, _)| n == "response.output_text.delta")
                    .filter_map(|(_, d)| d["delta"].as_str())
                    .collect();
                assert_eq!(text, expected, "{model} streamed");
                let (last, done) = ev.last().unwrap();
                assert_eq!(last, "response.completed", "{model}");
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
            assert_eq!(text, expected, "{model} stream={stream}: {done}");
            app.wait_settled().await;
            let spent = app
                .scalar(&format!(
                    "SELECT 1000000 - remaining_micros FROM tokens WHERE id = {id}"
                ))
                .await;
            assert_eq!(spent, CHARGE, "{model} stream={stream}");
            let path = app.mock.state.stats(key).last_paths.back().unwrap().clone();
            assert!(path.contains("/models/"), "{path}");
        }
    }
    app.assert_invariant().await;
}

/// A 2xx answer Gemini's reader cannot read is garbage, as a body that is not JSON is
/// (attack cache #3): a 502 `upstream_error` that costs nothing — before, a 200 carrying
/// an error object, the input charged — and never stored, so the next request reaches
/// Gemini again.
#[tokio::test]
async fn an_answer_gemini_cannot_read_is_a_502_that_costs_nothing_and_is_not_cached() {
    let app = app().await;
    let (id, token) = app.token("unreadable", Some("1")).await;
    let body = json!({"model": "gem", "max_tokens": 500, "temperature": 0,
        "messages": [{"role": "user", "content": "Why does the engine light blink?"}]});
    for _ in 0..2 {
        app.mock.state.script(
            KEY_G,
            [Script {
                raw_body: Some("{\"candidates\": 5}".into()),
                ..Script::default()
            }],
        );
        let resp = app.chat(&token, &body).await;
        assert_eq!(resp.status(), 502);
        let v: Value = resp.json().await.unwrap();
        assert_eq!(v["error"]["code"], "upstream_error", "{v}");
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        app.state.cache.flush().await;
    }
    assert_eq!(
        app.mock.state.stats(KEY_G).count,
        2,
        "never answered from the cache"
    );
    assert_eq!(
        app.scalar(&format!(
            "SELECT remaining_micros FROM tokens WHERE id = {id}"
        ))
        .await,
        1_000_000
    );
    assert_eq!(app.scalar("SELECT COUNT(*) FROM cache_entries").await, 0);
    app.assert_invariant().await;
}
