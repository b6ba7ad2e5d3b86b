//! A token's `models` list bounds the fallbacks too (s30 upstream attack F6): a fallback the
//! token may not use is never sent its request, and never priced into its reservation.

use std::time::Duration;

use serde_json::Value;
use sluice::cli::IssueArgs;
use sluice::config::{Provider, Settings};
use sluice::mock::{MockServer, Script};

use crate::helpers::*;
use crate::on_both_engines;
use crate::pg_gateway_app::{spawn_app_on, Engine};

const KEY_C: &str = "sk-ant-upstream-canary-key-C-9e8d7c";

/// Turns a hang into a failure; no wait here comes near it.
const BOUND: Duration = Duration::from_secs(30);

/// `gpt-4o-mini` (key `a`) falls back to `claude` (Anthropic key `c`), priced a thousand
/// times dearer: its worst case for `chat_body(100)` (100 output tokens at $1 500 per
/// million, $0.15) is far above a budget that covers gpt-4o-mini's.
fn dear_fallback(s: &mut Settings, m: &MockServer) {
    let mut c = upstream("c", KEY_C, m);
    c.provider = Provider::Anthropic;
    c.base_url = m.base_url();
    s.upstreams.push(c);
    let mut claude = model("claude", &["c"]);
    claude.price = sluice::config::PriceKeys::usd(300.0, 1_500.0);
    s.models.push(claude);
    s.models[0].fallbacks = vec!["claude".into()];
}

async fn chat(app: &TestApp, token: &str) -> reqwest::Response {
    tokio::time::timeout(BOUND, app.chat(token, &chat_body(100)))
        .await
        .expect("answered within the bound")
}

async fn a_fallback_the_token_may_not_use_is_not_tried(engine: Engine) {
    let app = spawn_app_on(engine, dear_fallback).await;
    let restricted = |user, budget_usd| IssueArgs {
        budget_usd,
        models: Some("gpt-4o-mini"),
        ..issue_args(user)
    };

    // Priced on gpt-4o-mini alone: a cent covers it, the fallback it may not use would not.
    let (_, cheap) = app.issue(restricted("rue", Some("0.01"))).await;
    let resp = chat(&app, &cheap).await;
    assert_eq!(
        resp.status(),
        200,
        "reserved at a fallback the token may not use: {}",
        resp.text().await.unwrap_or_default()
    );

    // gpt-4o-mini's only key is down: the token gets the degraded error, and the fallback's
    // provider never sees its request.
    app.mock.state.sticky(
        KEY_A,
        Some(Script {
            status: Some(503),
            ..Default::default()
        }),
    );
    let (_, bound) = app.issue(restricted("sol", None)).await;
    let resp = chat(&app, &bound).await;
    let status = resp.status();
    let v: Value = resp.json().await.unwrap_or_default();
    assert_eq!(status, 503, "{v}");
    assert_eq!(v["error"]["code"], "service_degraded", "{v}");
    assert_eq!(
        app.mock.state.stats(KEY_C).count,
        0,
        "the fallback's provider saw the restricted token's request"
    );

    // A token allowed both models still falls back.
    let (_, both) = app
        .issue(IssueArgs {
            models: Some("gpt-4o-mini,claude"),
            ..issue_args("tam")
        })
        .await;
    let resp = chat(&app, &both).await;
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers().get("x-sluice-upstream").unwrap(), "c");
    assert_eq!(app.mock.state.stats(KEY_C).count, 1);
    app.assert_invariant().await;
}
on_both_engines!(a_fallback_the_token_may_not_use_is_not_tried);
