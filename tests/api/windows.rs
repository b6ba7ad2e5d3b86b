//! Rate-limit windows, in-process and in a real `redis-server`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::Value;
use sluice::config::RedisSettings;

use crate::helpers::*;

fn with_redis(
    url: String,
    window_seconds: u64,
) -> impl FnOnce(&mut sluice::config::Settings, &sluice::mock::MockServer) {
    move |s, _| {
        s.redis = Some(RedisSettings {
            url: sluice::config::Secret(secrecy::SecretString::from(url)),
        });
        s.ratelimit.window_seconds = window_seconds;
    }
}

async fn burst(app: &Arc<TestApp>, token: &str, n: usize) -> Vec<reqwest::Response> {
    let tasks: Vec<_> = (0..n)
        .map(|_| {
            let (app, token) = (app.clone(), token.to_string());
            tokio::spawn(async move { app.chat(&token, &chat_body(5)).await })
        })
        .collect();
    let mut out = Vec::new();
    for t in tasks {
        out.push(t.await.unwrap());
    }
    out
}

async fn ten_per_two_seconds(app: Arc<TestApp>) {
    let (_, token) = app
        .issue(sluice::cli::IssueArgs {
            rpm: Some(10),
            ..issue_args("alice")
        })
        .await;
    let started = Instant::now();
    let mut admitted = 0;
    let mut retry_after = 0u64;
    for _ in 0..30 {
        let resp = app.chat(&token, &chat_body(5)).await;
        match resp.status().as_u16() {
            200 => admitted += 1,
            429 => {
                assert_eq!(resp.headers().get("x-should-retry").unwrap(), "true");
                retry_after = resp
                    .headers()
                    .get("retry-after")
                    .unwrap()
                    .to_str()
                    .unwrap()
                    .parse()
                    .unwrap();
                assert!((1..=2).contains(&retry_after), "Retry-After {retry_after}");
                assert_eq!(
                    resp.headers()
                        .get("x-ratelimit-remaining-requests")
                        .unwrap(),
                    "0"
                );
                let v: Value = resp.json().await.unwrap();
                assert_eq!(v["error"]["code"], "rate_limit_exceeded");
                assert_eq!(v["error"]["type"], "requests");
            }
            s => panic!("unexpected {s}"),
        }
    }
    assert!(
        started.elapsed() < Duration::from_millis(1500),
        "the burst must fit in the window"
    );
    assert_eq!(admitted, 10);
    assert_eq!(app.mock.state.stats(KEY_A).count, 10);
    tokio::time::sleep(Duration::from_secs(retry_after)).await;
    let resp = app.chat(&token, &chat_body(5)).await;
    assert_eq!(resp.status(), 200, "admitted again after Retry-After");
    assert_eq!(
        resp.headers().get("x-ratelimit-limit-requests").unwrap(),
        "10"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_window_admits_exactly_the_limit() {
    let app = Arc::new(spawn_app_with(|s, _| s.ratelimit.window_seconds = 2).await);
    ten_per_two_seconds(app).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_window_admits_exactly_the_limit() {
    let redis = RedisServer::start().await;
    let app = Arc::new(spawn_app_with(with_redis(redis.url(), 2)).await);
    ten_per_two_seconds(app).await;
    let keys = redis.cli(&["--scan"]).await.unwrap();
    // Prefix v2: the hash-tagged layout is not v1's (`sl:v1:rq:t:12`), and replicas on two
    // layouts must never count one window twice under one version.
    assert!(
        keys.lines()
            .filter(|k| !k.is_empty())
            .all(|k| k.starts_with("sl:v2:")),
        "{keys}"
    );
    // The token's window keys carry its user's hash tag (one slot on a Redis Cluster).
    assert!(keys.contains("sl:v2:{u:"), "{keys}");
    assert!(keys.contains("}:t:") && keys.contains(":rq"), "{keys}");
    for key in keys.lines().filter(|k| !k.is_empty()) {
        let ttl: i64 = redis
            .cli(&["PTTL", key])
            .await
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        assert!(ttl > 0, "{key} has no TTL");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_at_once_against_twenty_admits_twenty() {
    let redis = RedisServer::start().await;
    let app = Arc::new(spawn_app_with(with_redis(redis.url(), 60)).await);
    let (_, token) = app
        .issue(sluice::cli::IssueArgs {
            rpm: Some(20),
            ..issue_args("bob")
        })
        .await;
    let results = burst(&app, &token, 50).await;
    assert_eq!(results.iter().filter(|r| r.status() == 200).count(), 20);
    assert_eq!(results.iter().filter(|r| r.status() == 429).count(), 30);
}

#[tokio::test]
async fn one_exhausted_token_leaves_the_others_alone() {
    let app = spawn_app_with(|s, _| s.ratelimit.window_seconds = 60).await;
    let (_, a) = app
        .issue(sluice::cli::IssueArgs {
            rpm: Some(3),
            ..issue_args("dan")
        })
        .await;
    let (_, b) = app
        .issue(sluice::cli::IssueArgs {
            rpm: Some(3),
            ..issue_args("dan")
        })
        .await;
    sluice::cli::team_create(app.db(), "other", None, chrono::Utc::now())
        .await
        .unwrap();
    let args = sluice::cli::UserArgs {
        username: "eve",
        team: Some("other"),
        rpm: None,
        tpm: None,
        budget_usd: None,
        reset: None,
    };
    sluice::cli::user_create(app.db(), &args, chrono::Utc::now())
        .await
        .unwrap();
    let (_, c) = app
        .issue(sluice::cli::IssueArgs {
            rpm: Some(3),
            ..issue_args("eve")
        })
        .await;
    for _ in 0..10 {
        app.chat(&a, &chat_body(5)).await;
    }
    assert_eq!(app.chat(&a, &chat_body(5)).await.status(), 429);
    for t in [&b, &c] {
        let resp = app.chat(t, &chat_body(5)).await;
        assert_eq!(resp.status(), 200);
        assert_eq!(
            resp.headers()
                .get("x-ratelimit-remaining-requests")
                .unwrap(),
            "2"
        );
    }
}

#[tokio::test]
async fn hammering_is_admitted_exactly_the_limit_in_every_window() {
    let app = spawn_app_with(|s, _| s.ratelimit.window_seconds = 1).await;
    let (_, token) = app
        .issue(sluice::cli::IssueArgs {
            rpm: Some(5),
            ..issue_args("fay")
        })
        .await;
    let started = Instant::now();
    let mut admitted = Vec::new();
    while started.elapsed() < Duration::from_millis(3500) {
        if app.chat(&token, &chat_body(5)).await.status() == 200 {
            admitted.push(started.elapsed());
        }
    }
    assert!(
        admitted.len() >= 15,
        "not locked out: {} admitted",
        admitted.len()
    );
    for (i, t) in admitted.iter().enumerate() {
        let in_window = admitted[i..]
            .iter()
            .take_while(|u| **u < *t + Duration::from_millis(900))
            .count();
        assert!(in_window <= 5, "{in_window} admitted within one window");
    }
}

#[tokio::test]
async fn tokens_per_window_count_the_estimate_and_the_actual() {
    let app = spawn_app_with(|s, _| s.ratelimit.window_seconds = 60).await;
    let (_, token) = app
        .issue(sluice::cli::IssueArgs {
            tpm: Some(200),
            ..issue_args("gus")
        })
        .await;
    // Each request books its estimate (input + max_tokens = ~20 + 100), corrected to the
    // actual 12 + 24 = 36 after the answer.
    let resp = app.chat(&token, &chat_body(100)).await;
    assert_eq!(resp.status(), 200);
    assert_eq!(
        resp.headers().get("x-ratelimit-limit-tokens").unwrap(),
        "200"
    );
    tokio::time::sleep(Duration::from_millis(100)).await;
    let mut ok = 1;
    loop {
        let resp = app.chat(&token, &chat_body(100)).await;
        if resp.status() == 429 {
            let v: Value = resp.json().await.unwrap();
            assert_eq!(v["error"]["type"], "tokens");
            break;
        }
        ok += 1;
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(ok < 10);
    }
    assert!(ok >= 2, "the correction to actual usage made room: {ok}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_failing_degrades_to_local_windows_and_recovers() {
    let mut redis = RedisServer::start().await;
    let app = Arc::new(spawn_app_with(with_redis(redis.url(), 60)).await);
    let (_, token) = app
        .issue(sluice::cli::IssueArgs {
            rpm: Some(1000),
            ..issue_args("hal")
        })
        .await;
    assert_eq!(app.chat(&token, &chat_body(5)).await.status(), 200);
    assert!(!app.state.windows.degraded());

    // Paused: every call is bounded by the 50 ms timeout, then the local store serves.
    redis
        .cli(&["CLIENT", "PAUSE", "1500", "ALL"])
        .await
        .unwrap();
    for _ in 0..5 {
        let started = Instant::now();
        assert_eq!(app.chat(&token, &chat_body(5)).await.status(), 200);
        assert!(
            started.elapsed() < Duration::from_millis(400),
            "{:?}",
            started.elapsed()
        );
    }
    assert!(app.state.windows.degraded());
    tokio::time::sleep(Duration::from_millis(2000)).await;
    assert!(
        !app.state.windows.degraded(),
        "exact limiting resumed after the pause"
    );

    // Killed: the same, and back within 5 s of a restart.
    redis.kill();
    for _ in 0..5 {
        let started = Instant::now();
        assert_eq!(app.chat(&token, &chat_body(5)).await.status(), 200);
        assert!(started.elapsed() < Duration::from_millis(400));
    }
    assert!(app.state.windows.degraded());
    let resp = app
        .http
        .get(format!("{}/readyz", app.address))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 503);
    redis.restart().await;
    let back = Instant::now();
    while app.state.windows.degraded() {
        assert!(
            back.elapsed() < Duration::from_secs(5),
            "not back within 5 s"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(app.chat(&token, &chat_body(5)).await.status(), 200);
    app.assert_invariant().await;
}
