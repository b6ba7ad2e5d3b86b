//! Service tiers: a request that names no tier (or `auto`) runs at the project's default
//! tier, which may be a dearer one; OpenAI and Anthropic upstreams are sent the standard
//! tier explicitly — on the same-format paths and translated — and an answer that reports
//! another tier is counted (`gateway_upstream_service_tier_total`).

use serde_json::{json, Value};
use sluice::config::Provider;
use sluice::mock::{Script, SseEvent};

use crate::helpers::*;

const AN: &str = "sk-tiers-anthropic-0123456789";

/// `gpt-4o-mini` on the default OpenAI upstream (`a`) and `sonnet` on an Anthropic one.
async fn app() -> TestApp {
    spawn_app_with(|s, mock| {
        s.upstreams
            .push(native_upstream(Provider::Anthropic, "an", AN, mock));
        s.models.push(model("sonnet", &["an"]));
    })
    .await
}

fn ask(model: &str, tier: Option<&str>) -> Value {
    let mut body = json!({"model": model, "max_tokens": 10,
        "messages": [{"role": "user", "content": "hi"}]});
    if let Some(t) = tier {
        body["service_tier"] = json!(t);
    }
    body
}

/// The tier the upstream behind `key` was last sent.
fn sent_tier(app: &TestApp, key: &str) -> Value {
    let stats = app.mock.state.stats(key);
    stats.last_bodies.back().expect("a request")["service_tier"].clone()
}

#[tokio::test]
async fn the_standard_tier_is_sent_where_the_client_named_none_or_auto() {
    let app = app().await;
    let (_, token) = app.token("tiers", Some("1")).await;
    // Same format, OpenAI: absent and auto become `default`; `default` is kept.
    for tier in [None, Some("auto"), Some("default")] {
        let r = app.chat(&token, &ask("gpt-4o-mini", tier)).await;
        assert_eq!(r.status(), 200, "{tier:?}");
        assert_eq!(sent_tier(&app, KEY_A), "default", "chat {tier:?}");
    }
    // Same format, Anthropic: absent and auto become `standard_only`, which is kept.
    for tier in [None, Some("auto"), Some("standard_only")] {
        let r = app.messages(&token, &ask("sonnet", tier)).await;
        assert_eq!(r.status(), 200, "{tier:?}");
        assert_eq!(sent_tier(&app, AN), "standard_only", "messages {tier:?}");
    }
    // Translated: an OpenAI client to Anthropic, an Anthropic client to OpenAI.
    for tier in [None, Some("auto"), Some("default")] {
        let r = app.chat(&token, &ask("sonnet", tier)).await;
        assert_eq!(r.status(), 200, "{tier:?}");
        assert_eq!(sent_tier(&app, AN), "standard_only", "chat→an {tier:?}");
    }
    for tier in [None, Some("auto"), Some("standard_only")] {
        let r = app.messages(&token, &ask("gpt-4o-mini", tier)).await;
        assert_eq!(r.status(), 200, "{tier:?}");
        assert_eq!(sent_tier(&app, KEY_A), "default", "messages→a {tier:?}");
    }
    // The Responses API, served natively by OpenAI, and translated to Anthropic.
    for (model, key, want) in [
        ("gpt-4o-mini", KEY_A, "default"),
        ("sonnet", AN, "standard_only"),
    ] {
        for tier in [None, Some("auto")] {
            let mut body = json!({"model": model, "input": "hi", "max_output_tokens": 16});
            if let Some(t) = tier {
                body["service_tier"] = json!(t);
            }
            let r = app.post("/v1/responses", &token, &body).await;
            assert_eq!(r.status(), 200, "{model} {tier:?}");
            assert_eq!(sent_tier(&app, key), want, "responses→{model} {tier:?}");
        }
    }
    app.assert_invariant().await;
}

/// The value of the served-tier counter for this upstream and tier in `/metrics`.
async fn tier_count(app: &TestApp, upstream: &str, tier: &str) -> u64 {
    let text = app.metrics().await;
    let labels = [
        format!("tier=\"{tier}\""),
        format!("upstream=\"{upstream}\""),
    ];
    text.lines()
        .filter(|l| l.starts_with("gateway_upstream_service_tier_total{"))
        .filter(|l| labels.iter().all(|x| l.contains(x.as_str())))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum()
}

#[tokio::test]
async fn an_answer_served_at_a_dearer_tier_is_counted() {
    let app = app().await;
    let (_, token) = app.token("tiers", Some("1")).await;
    let before = (
        tier_count(&app, "a", "priority").await,
        tier_count(&app, "an", "priority").await,
    );
    // OpenAI, whole: the answer's top-level `service_tier`.
    let mut whole = json!({"id": "c1", "object": "chat.completion", "created": 1,
        "model": "gpt-4o-mini", "service_tier": "priority",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"},
            "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6}});
    app.mock.state.script(
        KEY_A,
        [Script {
            body: Some(whole.clone()),
            ..Script::default()
        }],
    );
    assert_eq!(
        app.chat(&token, &ask("gpt-4o-mini", None)).await.status(),
        200
    );
    // A standard answer counts nothing.
    whole["service_tier"] = json!("default");
    app.mock.state.script(
        KEY_A,
        [Script {
            body: Some(whole),
            ..Script::default()
        }],
    );
    assert_eq!(
        app.chat(&token, &ask("gpt-4o-mini", None)).await.status(),
        200
    );
    // Anthropic, streamed: `message_start`'s usage says `priority`.
    let e = |name: &str, data: Value| SseEvent::Named(name.into(), data);
    let events = vec![
        e(
            "message_start",
            json!({"type": "message_start", "message": {"id": "msg_1", "type": "message",
                "role": "assistant", "model": "sonnet", "content": [],
                "usage": {"input_tokens": 5, "output_tokens": 1, "service_tier": "priority"}}}),
        ),
        e(
            "content_block_start",
            json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
        ),
        e(
            "content_block_delta",
            json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "hi"}}),
        ),
        e(
            "content_block_stop",
            json!({"type": "content_block_stop", "index": 0}),
        ),
        e(
            "message_delta",
            json!({"type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence": null},
                "usage": {"output_tokens": 1}}),
        ),
        e("message_stop", json!({"type": "message_stop"})),
    ];
    app.mock.state.script(
        AN,
        [Script {
            events: Some(events),
            ..Script::default()
        }],
    );
    let mut body = ask("sonnet", None);
    body["stream"] = json!(true);
    let r = app.messages(&token, &body).await;
    assert_eq!(r.status(), 200);
    let _ = r.text().await.unwrap();
    app.wait_for_log_rows(3).await;
    let after = (
        tier_count(&app, "a", "priority").await,
        tier_count(&app, "an", "priority").await,
    );
    assert_eq!((after.0 - before.0, after.1 - before.1), (1, 1));
    app.assert_invariant().await;
}

/// The message of a 400 in either client format: OpenAI's names the field in `param`,
/// Anthropic's (no `param`) starts its message with it in backticks.
async fn refused_naming(resp: reqwest::Response, field: &str, what: &str) {
    assert_eq!(resp.status(), 400, "{what}");
    let err: Value = resp.json().await.unwrap();
    assert_eq!(
        err["error"]["type"], "invalid_request_error",
        "{what}: {err}"
    );
    let named = err["error"]["param"] == field
        || err["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains(&format!("`{field}`")));
    assert!(named, "{what}: {err}");
}

/// Anthropic's fast mode (`speed: "fast"`, a multiple of the standard rates) and US-only
/// inference (`inference_geo: "us"`, 1.1× on recent models) are billed apart from the
/// rates the gateway charges: refused naming the field, in either client format and to
/// either upstream, nothing sent; the standard values (`standard`, `global`) pass.
#[tokio::test]
async fn fast_mode_and_us_only_inference_are_refused_naming_the_field() {
    let app = app().await;
    let (_, token) = app.token("speed", Some("1")).await;
    for (field, value) in [("speed", "fast"), ("inference_geo", "us")] {
        for model in ["sonnet", "gpt-4o-mini"] {
            let mut body = ask(model, None);
            body[field] = json!(value);
            let what = format!("{field}={value} {model}");
            refused_naming(app.messages(&token, &body).await, field, &what).await;
            refused_naming(app.chat(&token, &body).await, field, &what).await;
        }
    }
    assert_eq!(app.mock.state.stats(AN).count, 0, "nothing sent upstream");
    assert_eq!(
        app.mock.state.stats(KEY_A).count,
        0,
        "nothing sent upstream"
    );
    let mut body = ask("sonnet", None);
    body["speed"] = json!("standard");
    body["inference_geo"] = json!("global");
    assert_eq!(app.messages(&token, &body).await.status(), 200);
    app.assert_invariant().await;
}
