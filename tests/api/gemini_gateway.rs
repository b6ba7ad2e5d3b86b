//! Clients of both formats through the gateway to the Gemini mock — the Gemini API (key)
//! and Vertex AI (service account) — streamed and not, a tool round trip, usage charged
//! exactly (cached and thinking tokens included), a rate limit served by another key, and
//! a field Gemini cannot express refused naming it.

use serde_json::{json, Value};
use sluice::config::{Provider, Secret, VertexSettings};
use sluice::mock::{MockServer, Script};

use crate::helpers::*;
use crate::on_both_engines;
use crate::pg_gateway_app::{spawn_app_on, Engine};

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

/// An image model's answer: a line of text and an `inlineData` image, a part the internal
/// form lacks, with the `usageMetadata` Gemini billed it at (none when `None`).
fn drawn(usage: Option<Value>, text: bool) -> Script {
    let mut parts = vec![json!({"inlineData": {"mimeType": "image/png", "data": "iVBORw0KGgo="}})];
    if text {
        parts.insert(0, json!({"text": "Here is your lighthouse."}));
    }
    let mut answer = json!({"candidates": [{"content": {"role": "model", "parts": parts},
        "finishReason": "STOP", "index": 0}], "responseId": "r1", "modelVersion": "gem-upstream"});
    if let Some(u) = usage {
        answer["usageMetadata"] = u;
    }
    Script {
        body: Some(answer),
        ..Script::default()
    }
}

/// What token `id` ($1) has spent so far.
async fn spent(app: &TestApp, id: i64) -> i64 {
    let sql = format!("SELECT remaining_micros FROM tokens WHERE id = {id}");
    1_000_000 - app.scalar(&sql).await
}

/// A request's `absorbed` ledger rows (how many, their sum) and its log row's cost, by the
/// `x-request-id` it was answered with.
async fn absorbed_of(app: &TestApp, resp: &reqwest::Response) -> (i64, i64, i64) {
    let rid = resp.headers()["x-request-id"].to_str().unwrap().to_string();
    let rows =
        format!("SELECT COUNT(*) FROM ledger WHERE kind = 'absorbed' AND request_id = '{rid}'");
    let sum = format!(
        "SELECT COALESCE(SUM(amount_micros), 0) FROM ledger WHERE kind = 'absorbed' AND request_id = '{rid}'"
    );
    let logged = format!("SELECT COUNT(*) FROM requests WHERE id = '{rid}'");
    for _ in 0..250 {
        app.state.request_log.flush().await;
        if app.scalar(&logged).await > 0 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let cost = format!("SELECT cost_micros FROM requests WHERE id = '{rid}'");
    (
        app.scalar(&rows).await,
        app.scalar(&sum).await,
        app.scalar(&cost).await,
    )
}

/// A Gemini answer the gateway cannot pass on (an `inlineData` image) is a failed attempt,
/// whatever usage it reports: the next route or the fallback is tried, and all failing is
/// the 502 `upstream_error` that charges the token nothing (DESIGN's retry table; CHECKS
/// Q6: remaining unchanged). But Gemini billed it: what its reported usage costs at the
/// route that answered (a side not reported counted as settlement counts it) is an
/// `absorbed` ledger row per attempt, outside the token's sum, and in the request's logged
/// cost, so finance sees every cent (s27 translated money #6: the provider's bill had no
/// trace in the gateway). A later attempt that serves is charged as usual, the refused ones
/// still absorbed; an answer without a readable usage has nothing to absorb. Alike for an
/// OpenAI-compatible fallback's shapeless answer with a usage and an Anthropic answer that
/// is no message.
async fn an_answer_refused_for_its_parts_is_tried_elsewhere_and_its_billed_usage_absorbed(
    engine: Engine,
) {
    let app = spawn_app_on(engine, |s, mock| {
        s.breaker.failure_threshold = 1_000;
        s.upstreams
            .extend([gemini("g", KEY_G, mock), gemini("h", KEY_H, mock)]);
        s.models.push(model("pool", &["g", "h"]));
        let mut m = model("gem_or_mini", &["g"]);
        m.fallbacks = vec!["gpt-4o-mini".into()];
        s.models.push(m);
        add_claude(s, mock);
    })
    .await;
    let (id, token) = app.token("drawer", Some("1")).await;
    let ask = |model: &str| {
        json!({"model": model, "max_tokens": 2000,
            "messages": [{"role": "user", "content": "Draw a lighthouse at dusk."}]})
    };
    // An image is 1290 output tokens on Gemini's image models.
    let billed = json!({"promptTokenCount": 20, "candidatesTokenCount": 1290,
        "totalTokenCount": 1310});
    // 20 × 0.15 + 1290 × 0.60 micro-dollars.
    const DRAWN: i64 = 777;

    // Two routes of the model, both drawing: both tried, a 502 that charges nothing, each
    // attempt absorbed at what Gemini billed.
    for key in [KEY_G, KEY_H] {
        app.mock
            .state
            .sticky(key, Some(drawn(Some(billed.clone()), true)));
    }
    let resp = app.chat(&token, &ask("pool")).await;
    assert_eq!(resp.status(), 502);
    let calls =
        |app: &TestApp| app.mock.state.stats(KEY_G).count + app.mock.state.stats(KEY_H).count;
    assert_eq!(calls(&app), 2, "a refused answer is tried elsewhere");
    assert_eq!(absorbed_of(&app, &resp).await, (2, 2 * DRAWN, 2 * DRAWN));
    let v: Value = resp.json().await.unwrap();
    assert_eq!(v["error"]["code"], "upstream_error", "{v}");
    assert_eq!(spent(&app, id).await, 0, "remaining unchanged");
    for key in [KEY_G, KEY_H] {
        app.mock.state.sticky(key, None);
    }

    // Through a model with a fallback, for an Anthropic client: the fallback serves,
    // charged as usual; the refused attempt is absorbed.
    let mini = app.mock.state.stats(KEY_A).count;
    app.mock
        .state
        .script(KEY_G, [drawn(Some(billed.clone()), true)]);
    let resp = app.messages(&token, &ask("gem_or_mini")).await;
    assert_eq!(resp.status(), 200);
    assert_eq!(app.mock.state.stats(KEY_A).count, mini + 1, "the fallback");
    let (rows, absorbed, cost) = absorbed_of(&app, &resp).await;
    assert_eq!((rows, absorbed), (1, DRAWN));
    let served = spent(&app, id).await;
    assert!(served > 0);
    assert_eq!(
        cost,
        served + DRAWN,
        "the row's cost: the charge and the absorbed"
    );

    // The input side alone: the image-only answer's output is the gateway's count of its
    // text, none; 1000 × 0.15.
    let before = spent(&app, id).await;
    app.mock.state.script(
        KEY_G,
        [drawn(Some(json!({"promptTokenCount": 1000})), false)],
    );
    let resp = app.chat(&token, &ask("gem_or_mini")).await;
    assert_eq!(resp.status(), 200);
    assert_eq!(app.mock.state.stats(KEY_A).count, mini + 2);
    let (rows, absorbed, cost) = absorbed_of(&app, &resp).await;
    assert_eq!((rows, absorbed), (1, 150));
    assert_eq!(cost - 150, spent(&app, id).await - before);

    // A lying usage: absorbed as far as it is believed — each side held to the bound on a
    // reported count (`providers::MAX_REPORTED_TOKENS`, 2³² − 1), × 0.75 rounded up —
    // never the token's.
    let before = spent(&app, id).await;
    let huge = json!({"promptTokenCount": 1_000_000_000_000i64,
        "candidatesTokenCount": 1_000_000_000_000i64});
    app.mock.state.script(KEY_G, [drawn(Some(huge), true)]);
    let resp = app.chat(&token, &ask("gem_or_mini")).await;
    assert_eq!(resp.status(), 200);
    let (rows, absorbed, cost) = absorbed_of(&app, &resp).await;
    assert_eq!((rows, absorbed), (1, 3_221_225_472));
    assert_eq!(cost - absorbed, spent(&app, id).await - before);

    // No usage to read: nothing absorbed, and the fallback serves.
    let before = spent(&app, id).await;
    app.mock.state.script(KEY_G, [drawn(None, true)]);
    let resp = app.chat(&token, &ask("gem_or_mini")).await;
    assert_eq!(resp.status(), 200);
    assert_eq!(app.mock.state.stats(KEY_A).count, mini + 4);
    let (rows, _, cost) = absorbed_of(&app, &resp).await;
    assert_eq!(rows, 0);
    assert_eq!(cost, spent(&app, id).await - before);

    // The first route's 500 bills nothing; the OpenAI-compatible fallback's answer with no
    // `choices` but a usage is refused: every route failed, a 502 charging nothing, the
    // fallback's attempt absorbed at 12 × 0.15 + 24 × 0.60 → 17.
    let before = spent(&app, id).await;
    app.mock.state.script(
        KEY_G,
        [Script {
            status: Some(500),
            ..Script::default()
        }],
    );
    app.mock.state.script(
        KEY_A,
        [Script {
            raw_body: Some(
                r#"{"object": "chat.completion", "usage": {"prompt_tokens": 12, "completion_tokens": 24}}"#
                    .into(),
            ),
            ..Script::default()
        }],
    );
    let resp = app.chat(&token, &ask("gem_or_mini")).await;
    assert_eq!(resp.status(), 502);
    assert_eq!(app.mock.state.stats(KEY_A).count, mini + 5);
    assert_eq!(absorbed_of(&app, &resp).await, (1, 17, 17));
    assert_eq!(spent(&app, id).await, before, "remaining unchanged");

    // Anthropic's reader, translating for an OpenAI client: a `message` whose content is
    // no list, with its usage: a 502 charging nothing, 17 absorbed.
    let before = spent(&app, id).await;
    app.mock.state.script(
        KEY_B,
        [Script {
            raw_body: Some(
                r#"{"type": "message", "content": 5, "usage": {"input_tokens": 12, "output_tokens": 24}}"#
                    .into(),
            ),
            ..Script::default()
        }],
    );
    let resp = app.chat(&token, &ask("claude")).await;
    assert_eq!(resp.status(), 502);
    assert_eq!(absorbed_of(&app, &resp).await, (1, 17, 17));
    assert_eq!(spent(&app, id).await, before, "remaining unchanged");
    // The row names the upstream that billed it, for reconciliation with its bill.
    let rid = resp.headers()["x-request-id"].to_str().unwrap();
    let named = format!(
        "SELECT COUNT(*) FROM requests WHERE id = '{rid}' AND upstream = 'c' AND upstream_model = 'claude-upstream'"
    );
    assert_eq!(app.scalar(&named).await, 1);

    app.assert_invariant().await;
}
on_both_engines!(an_answer_refused_for_its_parts_is_tried_elsewhere_and_its_billed_usage_absorbed);
