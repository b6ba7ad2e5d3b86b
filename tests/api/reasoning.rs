//! OpenAI's reasoning models (o-series, gpt-5 family): the output cap goes upstream as
//! `max_completion_tokens` (they refuse `max_tokens`), never both, and the reasoning tokens
//! they report inside `completion_tokens` are charged.

use serde_json::{json, Value};
use sluice::config::{OutputCapParam, RouteSettings};
use sluice::mock::Script;

use crate::helpers::*;

/// `o3-mini` (upstream `o3-mini-upstream`) and `legacy`, an upstream model the operator
/// marks as taking `max_completion_tokens` by hand, both on key `a`.
async fn app() -> TestApp {
    spawn_app_with(|s, _| {
        s.models.push(model("o3-mini", &["a"]));
        let mut legacy = model("legacy", &["a"]);
        legacy.routes = vec![RouteSettings {
            upstream: "a".into(),
            model: "my-deployment".into(),
            output_cap_param: Some(OutputCapParam::MaxCompletionTokens),
            deployment: None,
            tier_model: None,
        }];
        s.models.push(legacy);
    })
    .await
}

fn ask(model: &str, cap: Option<(&str, i64)>) -> Value {
    let mut b = json!({"model": model, "messages": [{"role": "user", "content": "Why does the engine light blink?"}]});
    if let Some((field, v)) = cap {
        b[field] = json!(v);
    }
    b
}

/// The cap fields of the last body the upstream received.
fn last_caps(app: &TestApp) -> (Value, Value) {
    let stats = app.mock.state.stats(KEY_A);
    let body = stats.last_bodies.back().unwrap();
    (
        body["max_tokens"].clone(),
        body["max_completion_tokens"].clone(),
    )
}

#[tokio::test]
async fn a_reasoning_model_gets_its_cap_as_max_completion_tokens_only() {
    let app = app().await;
    let (_, token) = app.token("ola", None).await;
    for (model, cap, sent) in [
        ("o3-mini", None, 4096),
        ("o3-mini", Some(("max_tokens", 50)), 50),
        ("o3-mini", Some(("max_completion_tokens", 60)), 60),
        ("legacy", Some(("max_tokens", 70)), 70),
    ] {
        let resp = app.chat(&token, &ask(model, cap)).await;
        assert_eq!(resp.status(), 200, "{model} {cap:?}");
        assert_eq!(
            last_caps(&app),
            (Value::Null, json!(sent)),
            "{model} {cap:?}: the cap under max_completion_tokens only"
        );
    }
    // Other models keep `max_tokens` (what every OpenAI-compatible server understands).
    let resp = app
        .chat(
            &token,
            &ask("gpt-4o-mini", Some(("max_completion_tokens", 80))),
        )
        .await;
    assert_eq!(resp.status(), 200);
    assert_eq!(last_caps(&app), (json!(80), Value::Null));

    // An Anthropic client's `max_tokens` reaches a reasoning model under its own name.
    let resp = app
        .http
        .post(format!("{}/v1/messages", app.address))
        .header("x-api-key", &token)
        .header("anthropic-version", "2023-06-01")
        .json(&json!({"model": "o3-mini", "max_tokens": 90,
            "messages": [{"role": "user", "content": "Why does the engine light blink?"}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(last_caps(&app), (Value::Null, json!(90)));
}

#[tokio::test]
async fn reasoning_tokens_are_charged_as_output() {
    let app = app().await;
    let reasoning = Script {
        reasoning_tokens: Some(100),
        ..Default::default()
    };
    // 12 input × 0.15 + (24 visible + 100 reasoning) × 0.60 = 76.2 → 77 micro-dollars;
    // without the reasoning it would be 17.
    for stream in [false, true] {
        let (id, token) = app.token(&format!("pia-{stream}"), Some("1")).await;
        app.mock.state.script(KEY_A, [reasoning.clone()]);
        let mut body = ask("o3-mini", Some(("max_completion_tokens", 500)));
        body["stream"] = json!(stream);
        let resp = app.chat(&token, &body).await;
        assert_eq!(resp.status(), 200);
        resp.bytes().await.unwrap();
        app.wait_settled().await;
        assert_eq!(
            app.scalar(&format!(
                "SELECT 1000000 - remaining_micros FROM tokens WHERE id = {id}"
            ))
            .await,
            77,
            "stream: {stream}"
        );
    }
    app.assert_invariant().await;
}
