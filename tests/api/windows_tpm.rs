//! Every outcome corrects every token window it booked — the token's, the user's and the
//! upstream key's — to what the provider actually used: a success to its usage, a cache
//! hit, an upstream failure, a quota refusal and a queue refusal to 0. Each case runs on
//! the local store and on a real `redis-server`.
//!
//! How a correction is seen: the user's and the key's windows allow 1 token per minute,
//! so only an empty window admits the next request (one request larger than the limit is
//! let into an empty window), and the mock reports a usage of 0 tokens. A booking left at
//! its estimate refuses the next request (429 from the user window, 503 once the key's
//! window rests the only key). The token's own window is large and read exactly from
//! `x-ratelimit-remaining-tokens`.

use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};
use sluice::config::RedisSettings;
use sluice::mock::Script;

use crate::helpers::*;

/// The token's own window: large, read exactly from the headers.
const TOKEN_TPM: i64 = 10_000;

struct Setup {
    app: Arc<TestApp>,
    _redis: Option<RedisServer>,
}

async fn setup(redis: bool, tweak: impl FnOnce(&mut sluice::config::Settings)) -> Setup {
    setup_with(redis, |s, _| tweak(s)).await
}

async fn setup_with(
    redis: bool,
    tweak: impl FnOnce(&mut sluice::config::Settings, &sluice::mock::MockServer),
) -> Setup {
    let server = if redis {
        Some(RedisServer::start().await)
    } else {
        None
    };
    let url = server.as_ref().map(RedisServer::url);
    let app = spawn_app_with(move |s, m| {
        s.ratelimit.window_seconds = 60;
        s.upstreams[0].tpm_limit = 1;
        s.redis = url.map(|u| RedisSettings {
            url: sluice::config::Secret(secrecy::SecretString::from(u)),
            ..Default::default()
        });
        tweak(s, m);
    })
    .await;
    let zero = Script {
        prompt_tokens: Some(0),
        completion_tokens: Some(0),
        ..Default::default()
    };
    app.mock.state.sticky(KEY_A, Some(zero));
    Setup {
        app: Arc::new(app),
        _redis: server,
    }
}

/// A user whose window allows 1 token per minute, and a token of theirs.
async fn limited_token(app: &TestApp, user: &str, budget_usd: Option<&str>) -> String {
    let args = sluice::cli::UserArgs {
        username: user,
        team: None,
        rpm: None,
        tpm: Some(1),
        budget_usd: None,
        reset: None,
    };
    sluice::cli::user_create(app.db(), &args, chrono::Utc::now())
        .await
        .unwrap();
    let (_, token) = app
        .issue(sluice::cli::IssueArgs {
            tpm: Some(TOKEN_TPM),
            budget_usd,
            ..issue_args(user)
        })
        .await;
    token
}

fn remaining_tokens(resp: &reqwest::Response) -> i64 {
    resp.headers()
        .get("x-ratelimit-remaining-tokens")
        .expect("x-ratelimit-remaining-tokens")
        .to_str()
        .unwrap()
        .parse()
        .unwrap()
}

/// Corrections run off the request path: give them a moment.
async fn settled() {
    tokio::time::sleep(Duration::from_millis(300)).await;
}

/// The next request of `token` is admitted by its user's and the key's windows (they were
/// corrected to 0) and its own window holds nothing but this request's estimate.
async fn windows_hold_nothing(app: &TestApp, token: &str, body: &Value, estimate: i64) {
    settled().await;
    let resp = app.chat(token, body).await;
    let remaining = remaining_tokens(&resp);
    let status = resp.status();
    let text = resp.text().await.unwrap();
    assert_eq!(status, 200, "a window kept an old booking: {text}");
    assert_eq!(
        remaining,
        TOKEN_TPM - estimate,
        "the token's window holds only this request"
    );
}

async fn upstream_failure(redis: bool) {
    let s = setup(redis, |_| {}).await;
    let app = &s.app;
    let token = limited_token(app, "ann", None).await;
    app.mock.state.sticky(
        KEY_A,
        Some(Script {
            status: Some(500),
            ..Default::default()
        }),
    );
    let resp = app.chat(&token, &chat_body(100)).await;
    assert_eq!(resp.status(), 502);
    let estimate = TOKEN_TPM - remaining_tokens(&resp);
    assert!(estimate > 100, "input + the output cap: {estimate}");
    setup_zero_usage(app);
    windows_hold_nothing(app, &token, &chat_body(100), estimate).await;
    app.assert_invariant().await;
}

fn setup_zero_usage(app: &TestApp) {
    app.mock.state.sticky(
        KEY_A,
        Some(Script {
            prompt_tokens: Some(0),
            completion_tokens: Some(0),
            ..Default::default()
        }),
    );
}

async fn quota_refusal(redis: bool) {
    let s = setup(redis, |_| {}).await;
    let app = &s.app;
    let poor = limited_token(app, "bea", Some("0.00001")).await;
    let resp = app.chat(&poor, &chat_body(100)).await;
    assert_eq!(resp.status(), 429);
    let estimate = TOKEN_TPM - remaining_tokens(&resp);
    let v: Value = resp.json().await.unwrap();
    assert_eq!(v["error"]["code"], "insufficient_quota");
    settled().await;
    // Admitted by the user's window again (else 429 rate_limit_exceeded), refused by quota.
    let resp = app.chat(&poor, &chat_body(100)).await;
    assert_eq!(remaining_tokens(&resp), TOKEN_TPM - estimate);
    let v: Value = resp.json().await.unwrap();
    assert_eq!(v["error"]["code"], "insufficient_quota", "{v}");
    // Another token of the same user: the user's window is empty again.
    let (_, rich) = app
        .issue(sluice::cli::IssueArgs {
            tpm: Some(TOKEN_TPM),
            ..issue_args("bea")
        })
        .await;
    windows_hold_nothing(app, &rich, &chat_body(100), estimate).await;
}

async fn queue_refusal(redis: bool) {
    let s = setup(redis, |s| {
        s.queue.max_in_flight = 1;
        s.queue.reserved = sluice::config::ReservedSlots::NONE;
        s.queue.max_depth = 0;
    })
    .await;
    let app = &s.app;
    let token = limited_token(app, "cid", None).await;
    // Another user's request holds the only admission slot for a while.
    let (_, other) = app.issue(issue_args("dee")).await;
    app.mock.state.sticky(
        KEY_A,
        Some(Script {
            delay_ms: 800,
            prompt_tokens: Some(0),
            completion_tokens: Some(0),
            ..Default::default()
        }),
    );
    let slow = {
        let (app, other) = (app.clone(), other.clone());
        tokio::spawn(async move { app.chat(&other, &chat_body(100)).await.status() })
    };
    for _ in 0..100 {
        if app.mock.state.stats(KEY_A).in_flight == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(app.mock.state.stats(KEY_A).in_flight, 1, "the slot is held");
    let resp = app.chat(&token, &chat_body(100)).await;
    assert_eq!(resp.status(), 503);
    let estimate = TOKEN_TPM - remaining_tokens(&resp);
    let v: Value = resp.json().await.unwrap();
    assert_eq!(v["error"]["code"], "queue_full", "{v}");
    assert_eq!(slow.await.unwrap(), 200);
    setup_zero_usage(app);
    windows_hold_nothing(app, &token, &chat_body(100), estimate).await;
}

async fn cache_hit(redis: bool) {
    let s = setup(redis, |_| {}).await;
    let app = &s.app;
    let token = limited_token(app, "eli", None).await;
    let question = json!({"model": "gpt-4o-mini", "temperature": 0, "max_tokens": 100,
        "messages": [{"role": "user", "content": "How many wheels has a tricycle?"}]});
    let resp = app.chat(&token, &question).await;
    assert_eq!(resp.status(), 200);
    let estimate = TOKEN_TPM - remaining_tokens(&resp);
    // The answer is stored off the request path.
    let mut hit = false;
    for _ in 0..20 {
        settled().await;
        let resp = app.chat(&token, &question).await;
        assert_eq!(
            resp.status(),
            200,
            "a window kept an old booking: {}",
            resp.text().await.unwrap()
        );
        if resp.headers().get("x-sluice-cache").unwrap() == "hit-exact" {
            hit = true;
            break;
        }
    }
    assert!(hit, "the answer was cached");
    // A hit consumed no provider tokens: every window is back to 0.
    windows_hold_nothing(app, &token, &question, estimate).await;
    assert_eq!(app.mock.state.stats(KEY_A).count, 1, "one upstream call");
}

async fn successes(redis: bool) {
    let s = setup(redis, |_| {}).await;
    let app = &s.app;
    let token = limited_token(app, "fox", None).await;
    let resp = app.chat(&token, &chat_body(100)).await;
    assert_eq!(resp.status(), 200);
    let estimate = TOKEN_TPM - remaining_tokens(&resp);
    // A stream's usage (0) is what it is corrected to, as well.
    settled().await;
    let mut body = chat_body(100);
    body["stream"] = json!(true);
    let resp = app.chat(&token, &body).await;
    assert_eq!(resp.status(), 200);
    let (data, _) = sse_data(resp).await;
    assert_eq!(data.last().map(String::as_str), Some("[DONE]"));
    windows_hold_nothing(app, &token, &chat_body(100), estimate).await;
    windows_hold_nothing(app, &token, &chat_body(100), estimate).await;
    assert_eq!(app.mock.state.stats(KEY_A).count, 4);
}

/// A stream cut by the upstream: every window holds what its settlement counted (the input
/// and the output received), the key's window included.
async fn stream_cut(redis: bool) {
    let s = setup(redis, |s| s.upstreams[0].tpm_limit = TOKEN_TPM as u64).await;
    let app = &s.app;
    let (_, token) = app
        .issue(sluice::cli::IssueArgs {
            tpm: Some(TOKEN_TPM),
            ..issue_args("gil")
        })
        .await;
    app.mock.state.sticky(
        KEY_A,
        Some(Script {
            cut_after: Some(3),
            ..Default::default()
        }),
    );
    let mut body = chat_body(100);
    body["stream"] = json!(true);
    let resp = app.chat(&token, &body).await;
    assert_eq!(resp.status(), 200);
    let estimate = TOKEN_TPM - remaining_tokens(&resp);
    let (data, _) = sse_data(resp).await;
    assert_ne!(data.last().map(String::as_str), Some("[DONE]"), "cut");
    app.wait_for_log_rows(1).await;
    let counted = app
        .scalar("SELECT input_tokens + output_tokens FROM requests")
        .await;
    assert!(counted > 0 && counted < estimate, "{counted} of {estimate}");
    setup_zero_usage(app);
    settled().await;
    if let Some(redis) = &s._redis {
        let keys = sluice::ratelimit::redis_window::RedisWindows::correct_keys(&[
            sluice::ratelimit::WindowSpec::upstream("a", 0, 1),
        ]);
        let sum: i64 = redis
            .cli(&["HVALS", &keys[0]])
            .await
            .unwrap()
            .lines()
            .filter_map(|l| l.trim().parse::<i64>().ok())
            .sum();
        assert_eq!(sum, counted, "the key's window holds what was counted");
    }
    let resp = app.chat(&token, &chat_body(100)).await;
    assert_eq!(resp.status(), 200);
    assert_eq!(remaining_tokens(&resp), TOKEN_TPM - counted - estimate);
}

/// A key's own window refusing an attempt does not rest the key: the refusal is read on the
/// worst-case bookings of requests still running, which are corrected to their usage when
/// they end, and the next request that fits is served. Before, the refusal cooled the key
/// for the window's length (about 61 s, shared through Redis): every request meanwhile was
/// answered 503 though the window was nearly empty (s24 attack, resilience #2).
async fn key_window_refusal(redis: bool) {
    let s = setup_with(redis, |s, m| {
        s.upstreams[0].tpm_limit = 6_000;
        s.alerts.webhooks = vec![sluice::config::WebhookSettings {
            url: sluice::config::Secret(secrecy::SecretString::from(format!(
                "{}/_mock/webhook",
                m.base_url()
            ))),
            format: "generic".into(),
        }];
    })
    .await;
    let app = &s.app;
    app.mock.state.sticky(
        KEY_A,
        Some(Script {
            delay_ms: 600,
            prompt_tokens: Some(10),
            completion_tokens: Some(10),
            ..Default::default()
        }),
    );
    let (_, token) = app.issue(issue_args("kim")).await;
    let first = {
        let (app, token) = (app.clone(), token.clone());
        tokio::spawn(async move { app.chat(&token, &chat_body(4_000)).await.status() })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    let refused = app.chat(&token, &chat_body(4_000)).await;
    assert_eq!(
        refused.status(),
        503,
        "the key's window is full of the first's booking"
    );
    assert_eq!(first.await.unwrap(), 200);
    settled().await;
    let resp = app.chat(&token, &chat_body(10)).await;
    assert_eq!(resp.status(), 200, "{}", resp.text().await.unwrap());
    assert_eq!(app.mock.state.stats(KEY_A).count, 2);
    // A key paced by its own window is no empty pool: no alert to the operators.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let alerts = app.mock.state.stats("webhook").last_bodies;
    assert!(
        alerts.iter().all(|b| b["kind"] != "pool_empty"),
        "{alerts:?}"
    );
}

/// Several requests at once, each asking about a 20-page PDF: the provider reads some
/// 40 000 tokens for each. A token window of 5 000 admits the first into its empty window
/// and refuses the rest for tokens. Before, each was booked at its counted input (a PDF's
/// bytes are left to its pages, counted apart) plus its cap — about 130 tokens — so all five
/// were admitted, and a window let through forty times its limit every minute (s29 limits
/// attack F1).
async fn concurrent_documents(redis: bool) {
    let s = setup(redis, |s| s.upstreams[0].tpm_limit = 0).await;
    let app = &s.app;
    app.mock.state.sticky(
        KEY_A,
        Some(Script {
            delay_ms: 500,
            prompt_tokens: Some(40_000),
            completion_tokens: Some(10),
            ..Default::default()
        }),
    );
    let (_, token) = app
        .issue(sluice::cli::IssueArgs {
            tpm: Some(5_000),
            ..issue_args("pia")
        })
        .await;
    let body = json!({"model": "gpt-4o-mini", "max_tokens": 100,
        "messages": [crate::documents::chat_pdf_message(20)]});
    let sent: Vec<_> = (0..5)
        .map(|_| {
            let (app, token, body) = (app.clone(), token.clone(), body.clone());
            tokio::spawn(async move {
                let resp = app.chat(&token, &body).await;
                let status = resp.status().as_u16();
                (status, resp.json::<Value>().await.unwrap_or_default())
            })
        })
        .collect();
    let mut served = 0;
    for s in sent {
        let (status, v) = s.await.unwrap();
        match status {
            200 => served += 1,
            429 => assert_eq!(v["error"]["type"], "tokens", "{v}"),
            other => panic!("{other}: {v}"),
        }
    }
    assert!(
        served <= 1,
        "{served} of 5 served past a 5 000-token window"
    );
    assert_eq!(app.mock.state.stats(KEY_A).count, served);
}

/// A stream that outlasts the window (2 s here) is corrected up to its usage after its
/// admission second has left the window: the tokens it used are booked in the second the
/// correction lands, so the next request is refused for them. Before, the correction found
/// no bucket and was dropped: a long stream's tokens were never counted (s29 limits attack
/// F1).
async fn long_stream(redis: bool) {
    let s = setup(redis, |s| {
        s.ratelimit.window_seconds = 2;
        s.upstreams[0].tpm_limit = 0;
    })
    .await;
    let app = &s.app;
    app.mock.state.sticky(
        KEY_A,
        Some(Script {
            chunk_delay_ms: 800,
            prompt_tokens: Some(6_000),
            completion_tokens: Some(10),
            ..Default::default()
        }),
    );
    let (_, token) = app
        .issue(sluice::cli::IssueArgs {
            tpm: Some(5_000),
            ..issue_args("lou")
        })
        .await;
    let mut body = chat_body(10);
    body["stream"] = json!(true);
    let started = std::time::Instant::now();
    let resp = app.chat(&token, &body).await;
    assert_eq!(resp.status(), 200);
    let (data, _) = sse_data(resp).await;
    assert_eq!(data.last().map(String::as_str), Some("[DONE]"));
    assert!(
        started.elapsed() > Duration::from_secs(3),
        "the stream outlasted its window and the second after: {:?}",
        started.elapsed()
    );
    settled().await;
    app.mock.state.sticky(KEY_A, None);
    let resp = app.chat(&token, &chat_body(10)).await;
    let status = resp.status();
    let v: Value = resp.json().await.unwrap();
    assert_eq!(
        status, 429,
        "the stream's 6 010 tokens were not counted: {v}"
    );
    assert_eq!(v["error"]["type"], "tokens");
}

macro_rules! on_both_stores {
    ($($name:ident),* $(,)?) => {
        $(
            mod $name {
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn local() {
                    super::$name(false).await;
                }

                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn redis() {
                    super::$name(true).await;
                }
            }
        )*
    };
}

on_both_stores!(
    upstream_failure,
    quota_refusal,
    queue_refusal,
    cache_hit,
    successes,
    stream_cut,
    key_window_refusal,
    concurrent_documents,
    long_stream
);
