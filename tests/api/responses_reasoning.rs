//! Reasoning items on the translated path (issue 18: the never-drop rule). A conversation
//! whose stored history holds a `reasoning` item, continued on another provider: an
//! Anthropic upstream is sent it as a `thinking` block with its `encrypted_content` as the
//! signature (Anthropic judges the signature); a chat-completions upstream has no place for
//! it and the request is refused naming the item, reaching no upstream and charging
//! nothing. The chat-completions bridge before left the item out silently.

use serde_json::{json, Value};
use sluice::config::Provider;
use sluice::mock::Script;

use crate::helpers::*;
use crate::responses::{ask, charged, create, last_sent};

/// The OpenAI-compatible upstream's key.
const KEY_C: &str = "sk-upstream-canary-key-C-9a8b7c";

/// `claude` on an Anthropic upstream (key B) and `local` on an OpenAI-compatible one (key
/// C), beside the native `gpt-4o-mini`, all on the same mock.
async fn app() -> TestApp {
    spawn_app_with(|s, m| {
        for (name, key, provider, model_name, upstream_model) in [
            ("c", KEY_B, Provider::Anthropic, "claude", "claude-upstream"),
            ("o", KEY_C, Provider::OpenaiCompatible, "local", "llama"),
        ] {
            let mut u = upstream(name, key, m);
            u.provider = provider;
            u.base_url = m.base_url();
            s.upstreams.push(u);
            let mut md = model(model_name, &[name]);
            md.routes = vec![route(name, upstream_model)];
            s.models.push(md);
        }
    })
    .await
}

#[tokio::test]
async fn a_reasoning_item_reaches_anthropic_as_thinking_and_is_refused_by_name_by_chat() {
    let app = app().await;
    let (token_id, token) = app.token("ola", Some("10")).await;
    app.mock.state.script(
        KEY_A,
        [Script {
            reasoning_tokens: Some(40),
            ..Script::default()
        }],
    );
    let mut first = ask();
    first["reasoning"] = json!({"effort": "low"});
    let (status, r) = create(&app, &token, &first).await;
    assert_eq!(status, 200, "{r}");
    let reasoning = r["output"][0].clone();
    assert_eq!(reasoning["type"], "reasoning", "{r}");
    let signature = reasoning["encrypted_content"].as_str().unwrap().to_string();

    // Anthropic: the item is carried as a thinking block with its signature.
    let follow =
        json!({"model": "claude", "input": "And if it stays on?", "previous_response_id": r["id"]});
    let (status, answer) = create(&app, &token, &follow).await;
    assert_eq!(status, 200, "{answer}");
    let sent = last_sent(&app, KEY_B);
    let thinking: Vec<&Value> = sent["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|m| m["content"].as_array())
        .flatten()
        .filter(|b| b["type"] == "thinking")
        .collect();
    assert_eq!(thinking.len(), 1, "{sent}");
    assert_eq!(thinking[0]["signature"], signature.as_str());

    // A chat-completions upstream: 400 naming the item, nothing sent, nothing charged.
    let before = charged(&app, token_id).await;
    let follow =
        json!({"model": "local", "input": "And if it stays on?", "previous_response_id": r["id"]});
    let (status, err) = create(&app, &token, &follow).await;
    assert_eq!(status, 400, "{err}");
    assert_eq!(err["error"]["type"], "invalid_request_error");
    assert_eq!(err["error"]["param"], "input");
    let message = err["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("input[1]: a `reasoning` item cannot be sent to an OpenAI-format model"),
        "{message}"
    );
    assert_eq!(app.mock.state.stats(KEY_C).count, 0);
    assert_eq!(charged(&app, token_id).await, before);
    app.assert_invariant().await;
}
