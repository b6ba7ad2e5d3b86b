//! 429 storms and outages stay away from users: key pool, retry tiers, fallbacks across
//! providers, circuit breakers, concurrency gates, the retry budget.

use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use sluice::clock::ManualClock;
use sluice::config::{Provider, RouteSettings, Settings};
use sluice::mock::{MockServer, Script};
use sluice::upstream::breaker::State;

use crate::helpers::*;

const KEY_C: &str = "sk-ant-upstream-canary-key-C-9e8d7c";

/// How long a request may take before the test calls it hung: no test here waits on it,
/// it only turns a hang into a failure. Every wait a test must rule out is made far longer.
const BOUND: Duration = Duration::from_secs(10);

/// Two OpenAI keys (`a`, `b`) for gpt-4o-mini, and `claude` (an Anthropic key) as its fallback.
fn pool_of_two_and_a_fallback(s: &mut Settings, m: &MockServer) {
    s.upstreams.push(upstream("b", KEY_B, m));
    let mut c = upstream("c", KEY_C, m);
    c.provider = Provider::Anthropic;
    c.base_url = m.base_url();
    s.upstreams.push(c);
    s.models[0].routes.push(RouteSettings {
        upstream: "b".into(),
        model: "gpt-4o-mini-upstream".into(),
        output_cap_param: None,
        deployment: None,
        tier_model: None,
    });
    s.models.push(model("claude", &["c"]));
    s.models[0].fallbacks = vec!["claude".into()];
}

/// Polls `cond` every 10 ms; the bound only turns a condition that never comes into a failure.
async fn poll_until(what: &str, cond: impl Fn() -> bool) {
    let bound = std::time::Instant::now() + BOUND;
    while !cond() {
        assert!(std::time::Instant::now() < bound, "never: {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The mock answers with this status.
pub(crate) fn status(code: u16) -> Script {
    Script {
        status: Some(code),
        ..Default::default()
    }
}

/// Key A answers 500 from now on; three requests open its breaker (the test settings'
/// threshold). The three answers' statuses.
pub(crate) async fn open_key_a_breaker(app: &TestApp, token: &str) -> Vec<u16> {
    app.mock.state.sticky(KEY_A, Some(status(500)));
    let mut answers = Vec::new();
    for _ in 0..3 {
        answers.push(app.chat(token, &chat_body(10)).await.status().as_u16());
    }
    assert_eq!(app.state.pool().breakers[0].state(), State::Open);
    answers
}

/// Key A's rest is measured on a manual clock, so the test steps through it instead of
/// sleeping, and it can be long: a gateway that waited any of A's 60 s out before trying B
/// would not answer within the bound at all.
#[tokio::test]
async fn a_429_key_rests_for_its_retry_after_while_another_serves_at_once() {
    let clock = Arc::new(ManualClock::new(chrono::Utc::now()));
    let app = spawn_app_full(pool_of_two_and_a_fallback, Some(clock.clone())).await;
    let (_, token) = app.token("alice", None).await;
    app.mock.state.script(
        KEY_A,
        [Script {
            status: Some(429),
            headers: vec![("Retry-After".into(), "60".into())],
            ..Default::default()
        }],
    );
    let resp = tokio::time::timeout(BOUND, app.chat(&token, &chat_body(10)))
        .await
        .expect("B served without waiting for A's Retry-After");
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers().get("x-sluice-upstream").unwrap(), "b");
    app.wait_for_log_rows(1).await;
    assert_eq!(
        app.scalar("SELECT attempts FROM requests").await,
        2,
        "A, then B in the same request"
    );
    clock.advance(chrono::Duration::milliseconds(59_900));
    for _ in 0..5 {
        let resp = app.chat(&token, &chat_body(10)).await;
        assert_eq!(resp.status(), 200);
        assert_eq!(resp.headers().get("x-sluice-upstream").unwrap(), "b");
    }
    assert_eq!(
        app.mock.state.stats(KEY_A).count,
        1,
        "A got nothing while cooling"
    );
    clock.advance(chrono::Duration::milliseconds(100));
    let mut served_by = Vec::new();
    for _ in 0..2 {
        let resp = app.chat(&token, &chat_body(10)).await;
        assert_eq!(resp.status(), 200);
        served_by.push(
            resp.headers()["x-sluice-upstream"]
                .to_str()
                .unwrap()
                .to_string(),
        );
    }
    assert!(
        served_by.iter().any(|u| u == "a"),
        "A is used again once its Retry-After is over: {served_by:?}"
    );
}

/// An upstream answering every 429 with a zero `retry-after-ms` (a relay's default, or a
/// hostile one) left the key never rested: every request spent an attempt on it first. A
/// rest is at least a second (s29 limits attack F3).
#[tokio::test]
async fn a_key_that_429s_with_a_zero_retry_after_is_rested_all_the_same() {
    let clock = Arc::new(ManualClock::new(chrono::Utc::now()));
    let app = spawn_app_full(pool_of_two_and_a_fallback, Some(clock.clone())).await;
    let (_, token) = app.token("alice", None).await;
    app.mock.state.sticky(
        KEY_A,
        Some(Script {
            status: Some(429),
            headers: vec![
                ("retry-after-ms".into(), "0".into()),
                ("Retry-After".into(), "0".into()),
            ],
            ..Default::default()
        }),
    );
    for _ in 0..10 {
        let resp = app.chat(&token, &chat_body(10)).await;
        assert_eq!(resp.status(), 200);
        assert_eq!(resp.headers()["x-sluice-upstream"], "b");
    }
    assert_eq!(
        app.mock.state.stats(KEY_A).count,
        1,
        "rested a second, on a clock that stands still"
    );
    clock.advance(chrono::Duration::milliseconds(1_000));
    for _ in 0..3 {
        app.chat(&token, &chat_body(10)).await;
    }
    assert_eq!(
        app.mock.state.stats(KEY_A).count,
        2,
        "tried again after its rest, and rested again"
    );
}

#[tokio::test]
async fn every_key_429_gives_the_client_a_429_without_a_retry_storm() {
    let app = spawn_app_with(|s, m| {
        s.upstreams.push(upstream("b", KEY_B, m));
        s.models[0].routes.push(RouteSettings {
            upstream: "b".into(),
            model: "x".into(),
            output_cap_param: None,
            deployment: None,
            tier_model: None,
        });
    })
    .await;
    let (_, token) = app.token("bob", None).await;
    for k in [KEY_A, KEY_B] {
        app.mock.state.sticky(
            k,
            Some(Script {
                status: Some(429),
                headers: vec![("Retry-After".into(), "3".into())],
                ..Default::default()
            }),
        );
    }
    let resp = app.chat(&token, &chat_body(10)).await;
    assert_eq!(resp.status(), 429);
    let after = retry_after(resp.headers());
    assert!((1..=3).contains(&after));
    assert_eq!(app.mock.state.total_count(), 2, "attempts ≤ pool size");
    let resp = app.chat(&token, &chat_body(10)).await;
    assert_eq!(
        resp.status(),
        503,
        "all keys resting: answered without an upstream call"
    );
    let v: Value = resp.json().await.unwrap();
    assert_eq!(v["error"]["code"], "service_degraded");
    assert!(v["error"]["retry_after_seconds"].as_u64().unwrap() >= 1);
    assert_eq!(app.mock.state.total_count(), 2);
}

#[tokio::test]
async fn a_500_moves_on_to_the_fallback_on_the_other_provider() {
    let app = spawn_app_with(|s, m| {
        let mut c = upstream("c", KEY_C, m);
        c.provider = Provider::Anthropic;
        c.base_url = m.base_url();
        s.upstreams.push(c);
        let mut claude = model("claude", &["c"]);
        claude.price = sluice::config::PriceKeys::usd(3.0, 15.0);
        s.models.push(claude);
        s.models[0].fallbacks = vec!["claude".into()];
    })
    .await;
    let (id, token) = app.token("carol", Some("1")).await;
    app.mock.state.script(KEY_A, [status(500)]);
    let resp = app.chat(&token, &chat_body(100)).await;
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers().get("x-sluice-upstream").unwrap(), "c");
    let v: Value = resp.json().await.unwrap();
    assert_eq!(
        v["object"], "chat.completion",
        "translated back to the client's format"
    );
    assert_eq!(
        v["model"], "claude-upstream",
        "the model the upstream returned"
    );
    assert_eq!(
        app.mock.state.stats(KEY_A).count,
        1,
        "exactly one request reached A"
    );
    assert_eq!(app.mock.state.stats(KEY_C).last_paths[0], "/v1/messages");
    // Priced by the model that served: 12 × 3 + 24 × 15 = 396 micro-dollars.
    app.assert_invariant().await;
    assert_eq!(
        app.scalar(&format!(
            "SELECT 1000000 - remaining_micros FROM tokens WHERE id = {id}"
        ))
        .await,
        396
    );
}

#[tokio::test]
async fn a_key_out_of_quota_is_never_tried_again_until_re_enabled() {
    let app = spawn_app_with(pool_of_two_and_a_fallback).await;
    let (_, token) = app.token("dan", None).await;
    let quota = serde_json::json!({"error": {"message": "You exceeded your current quota", "type": "insufficient_quota", "code": "insufficient_quota"}});
    app.mock.state.script(
        KEY_A,
        [Script {
            status: Some(429),
            body: Some(quota),
            ..Default::default()
        }],
    );
    for _ in 0..5 {
        assert_eq!(app.chat(&token, &chat_body(10)).await.status(), 200);
    }
    assert_eq!(app.mock.state.stats(KEY_A).count, 1);
    app.state.pool().enable(0);
    let mut served_by_a = false;
    for _ in 0..4 {
        let resp = app.chat(&token, &chat_body(10)).await;
        served_by_a |= resp.headers().get("x-sluice-upstream").unwrap() == "a";
    }
    assert!(served_by_a, "a re-enabled key serves again");
}

#[tokio::test]
async fn a_key_refused_by_the_upstream_is_quarantined_with_an_audit_row() {
    let app = spawn_app_with(pool_of_two_and_a_fallback).await;
    let (_, token) = app.token("eve", None).await;
    app.mock.state.sticky(KEY_A, Some(status(401)));
    for _ in 0..3 {
        let resp = app.chat(&token, &chat_body(10)).await;
        assert_eq!(resp.status(), 200);
        assert_eq!(resp.headers().get("x-sluice-upstream").unwrap(), "b");
    }
    assert_eq!(app.mock.state.stats(KEY_A).count, 1);
    // The audit row is written off the request path.
    let bound = std::time::Instant::now() + BOUND;
    while app
        .scalar("SELECT COUNT(*) FROM audit_log WHERE action = 'upstream.disable'")
        .await
        == 0
    {
        assert!(std::time::Instant::now() < bound, "no audit row");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let rows: Vec<(String, String, Option<String>)> = sql_rows(
        app.db(),
        "SELECT action, target, after FROM audit_log WHERE action = 'upstream.disable'",
    )
    .await;
    assert_eq!(
        rows,
        vec![(
            "upstream.disable".into(),
            "upstream:a".into(),
            Some("authentication refused".into())
        )]
    );
    let chain = sluice::store::audit::verify(app.db(), &app.db().audit)
        .await
        .unwrap();
    assert!(chain.broken.is_none(), "the chain stays intact");
}

/// Open for an hour: a gateway that waited for the breaker to half-open before answering
/// would not answer within the bound at all, and one that called the upstream would show
/// it in the mock's count and the request log.
#[tokio::test]
async fn an_open_breaker_fails_fast_without_an_upstream_call() {
    let app = spawn_app_with(|s, _| s.breaker.open_seconds = 3600).await;
    let (_, token) = app.token("fay", None).await;
    assert_eq!(open_key_a_breaker(&app, &token).await, [502; 3]);
    crate::admin_helpers::make_login(&app, "root", "admin", None).await;
    let (_, view) = crate::admin_helpers::login(&app, "root")
        .await
        .get_json("/admin/api/v1/upstreams")
        .await;
    assert_eq!(
        view["upstreams"][0]["breaker"], "open",
        "the admin Upstreams view shows the breaker: {view}"
    );
    for _ in 0..5 {
        let resp = tokio::time::timeout(BOUND, app.chat(&token, &chat_body(10)))
            .await
            .expect("answered while the breaker is open, without waiting for it");
        assert_eq!(resp.status(), 503);
        let v: Value = resp.json().await.unwrap();
        assert_eq!(v["error"]["code"], "service_degraded");
        let after = v["error"]["retry_after_seconds"].as_u64().unwrap();
        assert!(
            after > 3000,
            "come back when the breaker half-opens, in about an hour: {after} s"
        );
    }
    assert_eq!(
        app.mock.state.stats(KEY_A).count,
        3,
        "no upstream call while open"
    );
    app.wait_for_log_rows(8).await;
    assert_eq!(
        app.scalar("SELECT COUNT(*) FROM requests WHERE status = 503 AND attempts = 0")
            .await,
        5,
        "each fast failure logged with no attempt"
    );
    assert_eq!(app.state.pool().breakers[0].state(), State::Open);
}

#[tokio::test]
async fn the_breaker_probes_after_its_open_time_closes_and_reopens() {
    let app = spawn_app_with(|s, _| {
        s.breaker.open_seconds = 1;
        s.breaker.close_after_successes = 2;
    })
    .await;
    let (_, token) = app.token("fay", None).await;
    assert_eq!(open_key_a_breaker(&app, &token).await, [502; 3]);
    tokio::time::sleep(Duration::from_millis(1100)).await;
    // The probe fails: open again.
    assert_eq!(app.chat(&token, &chat_body(10)).await.status(), 502);
    assert_eq!(app.mock.state.stats(KEY_A).count, 4);
    assert_eq!(app.state.pool().breakers[0].state(), State::Open);
    tokio::time::sleep(Duration::from_millis(1100)).await;
    app.mock.state.sticky(KEY_A, None);
    assert_eq!(app.chat(&token, &chat_body(10)).await.status(), 200);
    assert_eq!(app.state.pool().breakers[0].state(), State::HalfOpen);
    assert_eq!(app.chat(&token, &chat_body(10)).await.status(), 200);
    assert_eq!(app.state.pool().breakers[0].state(), State::Closed);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_probe_cannot_wedge_the_breaker() {
    let app = Arc::new(
        spawn_app_with(|s, _| {
            s.breaker.open_seconds = 1;
            s.breaker.half_open_max_wait_seconds = 1;
            s.upstream.first_byte_timeout_ms = 20_000;
        })
        .await,
    );
    let (_, token) = app.token("gus", None).await;
    app.mock.state.sticky(KEY_A, Some(status(500)));
    for _ in 0..3 {
        app.chat(&token, &chat_body(10)).await;
    }
    tokio::time::sleep(Duration::from_millis(1100)).await;
    app.mock.state.sticky(
        KEY_A,
        Some(Script {
            delay_ms: 15_000,
            ..Default::default()
        }),
    );
    let hung = {
        let (app, token) = (app.clone(), token.clone());
        tokio::spawn(async move { app.chat(&token, &chat_body(10)).await.status() })
    };
    poll_until("the probe reaches the upstream", || {
        app.mock.state.stats(KEY_A).in_flight == 1
    })
    .await;
    assert_eq!(
        app.chat(&token, &chat_body(10)).await.status(),
        503,
        "one probe at a time"
    );
    // Past the probe's maximum wait plus the open time, a fresh probe goes out.
    tokio::time::sleep(Duration::from_millis(2200)).await;
    app.mock.state.sticky(KEY_A, None);
    assert_eq!(app.chat(&token, &chat_body(10)).await.status(), 200);
    hung.abort();
}

/// s30 upstream attack F3: a half-open probe waiting at its key's full concurrency gate has
/// not gone out, so it cannot be hung: past the maximum wait the breaker stays half-open —
/// it re-opened, with no call sent and no verdict, and a busy local server was kept out of
/// service open period after open period — and once the slot frees, the probe goes out and
/// its success closes the breaker (before, its opening was stale and it closed nothing).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_probe_waiting_at_a_full_gate_is_not_a_hung_probe() {
    let app = Arc::new(
        spawn_app_with(|s, _| {
            s.upstreams[0].max_concurrent = 1;
            s.upstreams[0].max_queue = 4;
            s.breaker.open_seconds = 1;
            s.breaker.half_open_max_wait_seconds = 1;
            s.breaker.close_after_successes = 1;
        })
        .await,
    );
    let (_, token) = app.token("hal", None).await;
    let chat = |app: &Arc<TestApp>| {
        let (app, token) = (app.clone(), token.clone());
        tokio::spawn(async move { app.chat(&token, &chat_body(10)).await.status() })
    };
    // A call admitted while the breaker was closed holds the gate's one slot for 5 s.
    app.mock.state.script(
        KEY_A,
        [Script {
            delay_ms: 5_000,
            ..Default::default()
        }],
    );
    let holder = chat(&app);
    poll_until("the holder reaches the upstream", || {
        app.mock.state.stats(KEY_A).in_flight == 1
    })
    .await;
    let breaker = app.state.pool().breakers[0].clone();
    for _ in 0..3 {
        breaker.failure(false);
    }
    tokio::time::sleep(Duration::from_millis(1100)).await;
    // The next request is the probe; it waits at the full gate.
    let probe = chat(&app);
    poll_until("the probe is admitted", || {
        breaker.state() == State::HalfOpen
    })
    .await;
    tokio::time::sleep(Duration::from_millis(1300)).await;
    assert_eq!(
        app.chat(&token, &chat_body(10)).await.status(),
        503,
        "one probe at a time"
    );
    assert_eq!(
        breaker.state(),
        State::HalfOpen,
        "a probe that was never sent is not hung"
    );
    assert_eq!(
        app.mock.state.stats(KEY_A).count,
        1,
        "only the holder went out"
    );
    assert_eq!(holder.await.unwrap(), 200);
    assert_eq!(probe.await.unwrap(), 200);
    assert_eq!(
        breaker.state(),
        State::Closed,
        "the probe's success closed it"
    );
}

/// The other side of the test below: a client that sends a tiny deadline (or leaves at
/// once) again and again while a breaker is half-open must not keep a healthy key shut for
/// everyone. Its probes end unanswered before a healthy answer could come, which says
/// nothing of the key: they free the probe slot and count for nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn short_deadlines_cannot_keep_a_healthy_key_shut() {
    let app = spawn_app_with(|s, _| {
        s.breaker.open_seconds = 1;
        s.breaker.half_open_max_wait_seconds = 30;
    })
    .await;
    let (_, token) = app.token("ida", None).await;
    open_key_a_breaker(&app, &token).await;
    // The key is healthy again, answering in 300 ms.
    app.mock.state.sticky(
        KEY_A,
        Some(Script {
            delay_ms: 300,
            ..Default::default()
        }),
    );
    while app.state.pool().breakers[0].state() == State::Open {
        tokio::time::sleep(Duration::from_millis(50)).await;
        app.state.pool().breakers[0]
            .permit()
            .map(|p| p.abandon())
            .ok();
    }
    for _ in 0..10 {
        let resp = app
            .http
            .post(format!("{}/v1/chat/completions", app.address))
            .bearer_auth(&token)
            .header("x-sluice-request-deadline-ms", "20")
            .json(&chat_body(10))
            .send()
            .await
            .unwrap();
        assert_ne!(resp.status(), 200);
        assert_ne!(
            app.state.pool().breakers[0].state(),
            State::Open,
            "a client's short deadline re-opened a healthy key"
        );
    }
    assert_eq!(app.chat(&token, &chat_body(10)).await.status(), 200);
}

/// A hung key behind a half-open breaker, probed by clients that never wait long enough for
/// it: half of them send a 1 s request deadline, the other half give up after 1 s themselves
/// (their future is dropped, as an SDK timeout does). Each probe ends without a verdict; a
/// few in a row must re-open the breaker, so the rest get a fast 503 and the key no traffic.
/// (A probe counts once it waited a third of the maximum wait: 2 s here, so ~0.67 s.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn probes_that_never_get_an_answer_reopen_the_breaker() {
    let app = spawn_app_with(|s, _| {
        s.breaker.open_seconds = 2;
        s.breaker.half_open_max_wait_seconds = 2;
    })
    .await;
    let (_, token) = app.token("ida", None).await;
    open_key_a_breaker(&app, &token).await;
    tokio::time::sleep(Duration::from_millis(2100)).await;
    app.mock.state.sticky(
        KEY_A,
        Some(Script {
            delay_ms: 10_000,
            ..Default::default()
        }),
    );
    let mut last = None;
    for i in 0..20 {
        let send = app
            .http
            .post(format!("{}/v1/chat/completions", app.address))
            .bearer_auth(&token)
            .json(&chat_body(10));
        let send = if i % 2 == 0 {
            send.header("x-sluice-request-deadline-ms", "1000")
        } else {
            send.timeout(Duration::from_millis(1000))
        };
        let resp = tokio::time::timeout(Duration::from_secs(30), send.send())
            .await
            .expect("answered or given up within the bound");
        if let Ok(resp) = resp {
            let status = resp.status().as_u16();
            let v: Value = resp.json().await.unwrap_or_default();
            last = Some((status, v["error"]["code"].as_str().map(str::to_string)));
        }
    }
    let probes = app.mock.state.stats(KEY_A).count - 3;
    assert!(
        probes <= 6,
        "the hung key stops getting traffic: {probes} probes for 20 requests"
    );
    assert_eq!(
        last,
        Some((503, Some("service_degraded".into()))),
        "answered at once without an upstream call"
    );
    assert_eq!(app.state.pool().breakers[0].state(), State::Open);
}

#[tokio::test]
async fn rate_limits_never_open_the_breaker() {
    let app = spawn_app_with(|s, _| s.retry.max_cooldown_seconds = 0).await;
    let (_, token) = app.token("hal", None).await;
    app.mock.state.sticky(KEY_A, Some(status(429)));
    for _ in 0..10 {
        assert_eq!(app.chat(&token, &chat_body(10)).await.status(), 429);
    }
    assert_eq!(app.state.pool().breakers[0].state(), State::Closed);
    assert_eq!(app.mock.state.stats(KEY_A).count, 10);
}

/// A chat (`chat_body(10)`) sent in the background: its status and JSON body.
fn spawn_chat(app: &Arc<TestApp>, token: &str) -> tokio::task::JoinHandle<(u16, Value)> {
    let (app, token) = (app.clone(), token.to_string());
    tokio::spawn(async move {
        let r = app.chat(&token, &chat_body(10)).await;
        let status = r.status().as_u16();
        (status, r.json::<Value>().await.unwrap_or(Value::Null))
    })
}

/// An app whose key `a` has a concurrency gate of `max_concurrent` + `max_queue` and an RPM
/// window of `rpm_limit` (0: none), answering after `delay_ms`; and a token.
async fn gated(
    (max_concurrent, max_queue, rpm_limit): (u32, u32, u64),
    delay_ms: u64,
) -> (Arc<TestApp>, String) {
    let app = Arc::new(
        spawn_app_with(|s, _| {
            s.upstreams[0].max_concurrent = max_concurrent;
            s.upstreams[0].max_queue = max_queue;
            s.upstreams[0].rpm_limit = rpm_limit;
        })
        .await,
    );
    let (_, token) = app.token("ian", None).await;
    app.mock.state.sticky(
        KEY_A,
        Some(Script {
            delay_ms,
            ..Default::default()
        }),
    );
    (app, token)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gate_of_two_plus_four_holds_under_twenty_concurrent_requests() {
    let (app, token) = gated((2, 4, 0), 300).await;
    let tasks: Vec<_> = (0..20).map(|_| spawn_chat(&app, &token)).collect();
    let mut results = Vec::new();
    for t in tasks {
        results.push(t.await.unwrap());
    }
    assert_eq!(app.mock.state.stats(KEY_A).max_concurrency, 2);
    assert_eq!(
        results.iter().filter(|(s, _)| *s == 200).count(),
        6,
        "two in flight and four waiting are served"
    );
    let busy: Vec<_> = results.iter().filter(|(s, _)| *s == 503).collect();
    assert_eq!(busy.len(), 14);
    assert!(busy
        .iter()
        .all(|(_, v)| v["error"]["code"] == "upstream_busy"));
    assert!(results.iter().all(|(s, _)| *s != 500));
}

/// Attempts the key's concurrency gate turns away never reached the key: they leave nothing
/// in its RPM window. Before, the window was booked before the gate, and nothing removes a
/// request from it: a burst the gate refused used the key's `rpm_limit` up, and the key
/// answered nothing more for the window's minute (s24 attack, resilience #2).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attempts_the_gate_turns_away_use_nothing_of_the_keys_rpm_window() {
    let (app, token) = gated((1, 0, 2), 800).await;
    let first = {
        let (app, token) = (app.clone(), token.clone());
        tokio::spawn(async move { app.chat(&token, &chat_body(10)).await.status().as_u16() })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    for _ in 0..3 {
        let resp = app.chat(&token, &chat_body(10)).await;
        assert_eq!(resp.status(), 503);
        let v: Value = resp.json().await.unwrap();
        assert_eq!(v["error"]["code"], "upstream_busy", "{v}");
    }
    assert_eq!(first.await.unwrap(), 200);
    let resp = app.chat(&token, &chat_body(10)).await;
    assert_eq!(resp.status(), 200, "{}", resp.text().await.unwrap());
    assert_eq!(app.mock.state.stats(KEY_A).count, 2);
}

/// A request that waited at a key's concurrency gate is checked again before it goes out:
/// its token revoked during the wait, it is refused (401), charged nothing, and the
/// upstream never sees it (s25 final attack F1: the gate's wait may last up to the
/// deadline, and the request was sent and charged after the revocation).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_waiting_at_a_keys_gate_is_refused_if_its_token_was_revoked_meanwhile() {
    let (app, holder) = gated((1, 4, 0), 1_500).await;
    let (id, token) = app.token("jun", Some("1")).await;
    let first = {
        let (app, holder) = (app.clone(), holder.clone());
        tokio::spawn(async move { app.chat(&holder, &chat_body(10)).await.status().as_u16() })
    };
    let bound = std::time::Instant::now() + Duration::from_secs(10);
    while app.mock.state.stats(KEY_A).in_flight == 0 {
        assert!(
            std::time::Instant::now() < bound,
            "the first request holds the gate"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let waiting = spawn_chat(&app, &token);
    tokio::time::sleep(Duration::from_millis(400)).await;
    revoke_elsewhere(&app, id).await;
    assert_eq!(first.await.unwrap(), 200);
    let (status, v) = waiting.await.unwrap();
    assert_eq!(status, 401, "{v}");
    assert_eq!(v["error"]["code"], "invalid_api_key");
    assert_eq!(app.mock.state.stats(KEY_A).count, 1, "never sent upstream");
    assert_nothing_charged_nor_held(&app, id).await;
}

/// A request whose attempt failed slowly is checked again before its next attempt in the
/// same round: its token revoked during the slow attempt, it is refused (401) and no other
/// key or fallback is asked (s25 stop attack F1: the next key, ready at once, was called
/// and the revoked token served and charged).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_whose_attempt_failed_slowly_is_checked_again_before_the_next() {
    let app = Arc::new(spawn_app_with(pool_of_two_and_a_fallback).await);
    let (id, token) = app.token("lev", Some("1")).await;
    let slow_500 = || Script {
        status: Some(500),
        delay_ms: 1_000,
        ..Default::default()
    };
    app.mock.state.script(KEY_A, [slow_500()]);
    app.mock.state.script(KEY_B, [slow_500()]);
    let waiting = spawn_chat(&app, &token);
    tokio::time::sleep(Duration::from_millis(300)).await;
    revoke_elsewhere(&app, id).await;
    let (status, v) = waiting.await.unwrap();
    assert_eq!(status, 401, "{v}");
    let asked = |k| app.mock.state.stats(k).count;
    assert_eq!(
        asked(KEY_A) + asked(KEY_B),
        1,
        "one key asked, not the other"
    );
    assert_eq!(asked(KEY_C), 0, "nor the fallback");
    assert_nothing_charged_nor_held(&app, id).await;
}

#[tokio::test]
async fn a_stream_is_retried_before_its_first_byte_and_never_after() {
    let app = spawn_app_with(pool_of_two_and_a_fallback).await;
    let (_, token) = app.token("jay", Some("1")).await;
    let mut body = chat_body(50);
    body["stream"] = serde_json::json!(true);
    app.mock.state.script(KEY_A, [status(502)]);
    let resp = app.chat(&token, &body).await;
    assert_eq!(resp.headers().get("x-sluice-upstream").unwrap(), "b");
    let (data, _) = sse_data(resp).await;
    assert_eq!(data.last().unwrap(), "[DONE]");

    // Whichever key serves, it breaks off after 5 chunks.
    for k in [KEY_A, KEY_B] {
        app.mock.state.script(
            k,
            [Script {
                cut_after: Some(5),
                ..Default::default()
            }],
        );
    }
    let before = app.mock.state.total_count();
    let (data, _) = sse_data(app.chat(&token, &body).await).await;
    assert_ne!(data.last().unwrap(), "[DONE]");
    assert_eq!(
        app.mock.state.total_count(),
        before + 1,
        "a stream cut after 5 chunks is not retried"
    );
    let text = reassemble(&data);
    assert_eq!(
        text,
        sluice::mock::MockConfig::default()
            .text
            .split_inclusive(' ')
            .take(5)
            .collect::<String>(),
        "no duplicated chunks"
    );
    app.assert_invariant().await;
}

#[tokio::test]
async fn retries_stay_within_the_budget_during_an_outage() {
    let app = spawn_app_with(|s, m| {
        s.upstreams.push(upstream("b", KEY_B, m));
        s.models[0].routes.push(RouteSettings {
            upstream: "b".into(),
            model: "x".into(),
            output_cap_param: None,
            deployment: None,
            tier_model: None,
        });
        s.breaker.failure_threshold = 100_000;
        s.breaker.min_calls = 100_000;
    })
    .await;
    let (_, token) = app.token("kim", None).await;
    for k in [KEY_A, KEY_B] {
        app.mock.state.sticky(k, Some(status(500)));
    }
    let n = 300;
    for _ in 0..n {
        assert_eq!(app.chat(&token, &chat_body(10)).await.status(), 502);
    }
    let attempts = app.mock.state.total_count();
    // Each request's first attempt, plus retries capped at 10 % of first attempts and a
    // floor of 10 per key per window.
    assert!(
        attempts <= (n as f64 * 1.1) as u64 + 20,
        "{attempts} attempts for {n} requests"
    );
}

#[tokio::test]
async fn garbage_from_the_upstream_is_a_502_and_the_process_lives() {
    let app = spawn_app_with(|s, _| {
        s.upstream.max_response_bytes = 1_000_000;
        s.breaker.failure_threshold = 100;
    })
    .await;
    let (_, token) = app.token("lee", Some("1")).await;
    let huge = format!("{{\"x\": \"{}\"}}", "a".repeat(2_000_000));
    for bad in [
        Script {
            raw_body: Some("{\"choices\": [".into()),
            ..Default::default()
        },
        Script {
            raw_body: Some("\u{fffd}\u{fffd} not json".into()),
            ..Default::default()
        },
        Script {
            raw_body: Some(huge),
            ..Default::default()
        },
    ] {
        app.mock.state.script(KEY_A, [bad]);
        let resp = app.chat(&token, &chat_body(10)).await;
        assert_eq!(resp.status(), 502);
        let v: Value = resp.json().await.unwrap();
        assert_eq!(v["error"]["code"], "upstream_error");
        assert!(
            v.to_string().len() < 400,
            "the upstream's body is never relayed"
        );
    }
    let mut stream = chat_body(10);
    stream["stream"] = serde_json::json!(true);
    app.mock.state.script(
        KEY_A,
        [Script {
            raw_body: Some("data: {not json\n\ndata: [DO".into()),
            ..Default::default()
        }],
    );
    let resp = app.chat(&token, &stream).await;
    let _ = resp.text().await;
    assert_eq!(
        app.chat(&token, &chat_body(10)).await.status(),
        200,
        "still alive"
    );
    app.assert_invariant().await;
}

#[tokio::test]
async fn a_key_that_reports_nothing_left_is_rested_before_it_429s() {
    let app = spawn_app_with(pool_of_two_and_a_fallback).await;
    let (_, token) = app.token("max", None).await;
    app.mock.state.script(
        KEY_A,
        [Script {
            headers: vec![
                ("x-ratelimit-remaining-requests".into(), "0".into()),
                ("x-ratelimit-reset-requests".into(), "5s".into()),
            ],
            ..Default::default()
        }],
    );
    assert_eq!(
        app.chat(&token, &chat_body(10))
            .await
            .headers()
            .get("x-sluice-upstream")
            .unwrap(),
        "a"
    );
    assert_eq!(
        app.chat(&token, &chat_body(10))
            .await
            .headers()
            .get("x-sluice-upstream")
            .unwrap(),
        "b"
    );
    assert_eq!(app.mock.state.stats(KEY_A).count, 1);
}

/// Two replicas on one Redis with `pool_of_two_and_a_fallback`: A (a test app) and B (built
/// on `b_clock`, serving at the returned URL), with B's state.
async fn two_replicas(
    b_clock: Arc<dyn sluice::clock::Clock>,
) -> (RedisServer, TestApp, String, Arc<sluice::state::AppState>) {
    let redis = RedisServer::start().await;
    let url = redis.url();
    let a = spawn_app_with(move |s, m| {
        pool_of_two_and_a_fallback(s, m);
        s.redis = Some(sluice::config::RedisSettings {
            url: sluice::config::Secret(secrecy::SecretString::from(url)),
            ..Default::default()
        });
    })
    .await;
    let b = sluice::startup::Application::build_with_clock(a.settings.clone(), b_clock)
        .await
        .unwrap();
    let b_url = format!("http://127.0.0.1:{}/v1/chat/completions", b.port());
    let b_state = b.state();
    tokio::spawn(b.run_until_stopped());
    (redis, a, b_url, b_state)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cooldowns_are_shared_between_replicas_through_redis() {
    let (_redis, a, b_url, b_state) = two_replicas(Arc::new(sluice::clock::SystemClock)).await;
    let (_, token) = a.token("ned", None).await;
    a.mock.state.script(
        KEY_A,
        [Script {
            status: Some(429),
            headers: vec![("Retry-After".into(), "10".into())],
            ..Default::default()
        }],
    );
    assert_eq!(a.chat(&token, &chat_body(10)).await.status(), 200);
    // Replicas exchange cooldowns every 250 ms: wait until B has heard of A's.
    poll_until("the other replica rests key a", || {
        b_state.pool().cooling_ms(0, b_state.clock.monotonic_ms()) > 0
    })
    .await;
    let resp = a
        .http
        .post(&b_url)
        .bearer_auth(&token)
        .json(&chat_body(10))
        .send()
        .await
        .unwrap();
    assert_eq!(
        resp.headers().get("x-sluice-upstream").unwrap(),
        "b",
        "the other replica rests key a too"
    );
    assert_eq!(a.mock.state.stats(KEY_A).count, 1);
}

/// A clock a fixed offset from the system's: a host whose clock is wrong.
struct Offset(chrono::Duration);

impl sluice::clock::Clock for Offset {
    fn now(&self) -> chrono::DateTime<chrono::Utc> {
        chrono::Utc::now() + self.0
    }
}

/// Shared cooldowns are read as the time left (Redis's own `PTTL`), not as an instant on
/// the publisher's clock: a replica whose clock runs 45 s ahead that rests a key for its
/// `Retry-After: 2` rests it 2 s on the others too, and a cooldown published by a replica
/// whose clock is behind still rests the key there. Before, the instant was compared with
/// each reader's clock: the others rested the key 47 s (past `max_cooldown_seconds` with a
/// larger skew), and the replica ahead took the others' cooldowns for over and ignored them
/// (s24 attack, resilience #4).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shared_cooldown_lasts_its_retry_after_whatever_the_replicas_clocks() {
    let (_redis, a, b_url, b_state) =
        two_replicas(Arc::new(Offset(chrono::Duration::seconds(45)))).await;
    let (_, token) = a.token("uma", None).await;
    let rate_limited = |after: &str| Script {
        status: Some(429),
        headers: vec![("Retry-After".into(), after.into())],
        ..Default::default()
    };
    // B, ahead, sees the 429 and rests key a 2 s; A hears of it and rests it 2 s, not 47.
    a.mock.state.script(KEY_A, [rate_limited("2")]);
    let resp = a
        .http
        .post(&b_url)
        .bearer_auth(&token)
        .json(&chat_body(10))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    // Rests are on the monotonic clock, one for both replicas of this process: the wall
    // clocks' offset does not reach them.
    let real_now = || a.state.clock.monotonic_ms();
    poll_until("A rests key a", || {
        a.state.pool().cooling_ms(0, real_now()) > 0
    })
    .await;
    let resting = a.state.pool().cooling_ms(0, real_now());
    assert!(
        resting <= 2_000,
        "A rests key a {resting} ms for a Retry-After of 2 s"
    );
    // A sees the next 429 (10 s); B, ahead, rests key a too.
    tokio::time::sleep(Duration::from_millis(2_100)).await;
    a.mock.state.script(KEY_A, [rate_limited("10")]);
    assert_eq!(a.chat(&token, &chat_body(10)).await.status(), 200);
    poll_until("B rests key a", || {
        let b_now = b_state.clock.monotonic_ms();
        (5_000..=10_000).contains(&b_state.pool().cooling_ms(0, b_now))
    })
    .await;
    // An admin enabling the key on A ends its shared cooldown too: left in Redis, A's next
    // exchange put it back within 250 ms.
    crate::admin_helpers::make_login(&a, "root", "admin", None).await;
    let admin = crate::admin_helpers::login(&a, "root").await;
    let (s, v) = admin
        .post("/admin/api/v1/upstreams/a/enable", &serde_json::json!({}))
        .await;
    assert_eq!(s, 200, "{v}");
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(
        a.state.pool().cooling_ms(0, real_now()),
        0,
        "enabled on A stays so"
    );
}

/// A request the fallback cannot take (`seed` has no place on an Anthropic model) while
/// the keys that could take it rest is answered as the outage it is — 503
/// `service_degraded` with their `Retry-After`, which the SDKs retry — not a 400 the client
/// would take for its own fault and never retry: the 400 is only for a request no
/// candidate can take (s24 attack, translation #1).
#[tokio::test]
async fn a_request_only_the_resting_keys_can_take_is_an_outage_not_a_client_error() {
    let app = spawn_app_with(pool_of_two_and_a_fallback).await;
    let (_, token) = app.token("vic", None).await;
    for k in [KEY_A, KEY_B] {
        app.mock.state.script(
            k,
            [Script {
                status: Some(429),
                headers: vec![("Retry-After".into(), "30".into())],
                ..Default::default()
            }],
        );
    }
    let resp = app.chat(&token, &chat_body(10)).await;
    assert_eq!(resp.headers().get("x-sluice-upstream").unwrap(), "c");
    let mut body = chat_body(10);
    body["seed"] = serde_json::json!(7);
    let resp = app.chat(&token, &body).await;
    assert_eq!(resp.status(), 503);
    assert!(retry_after(resp.headers()) >= 20);
    let v: Value = resp.json().await.unwrap();
    assert_eq!(v["error"]["code"], "service_degraded", "{v}");
    // With the keys rested, the same request is served.
    app.state.pool().enable(0);
    let resp = app.chat(&token, &body).await;
    assert_eq!(resp.status(), 200);
    // No candidate can take it at all: the client's error, naming the field — also while
    // the one that cannot rests (it was answered 503 and alerted as an empty pool).
    body["model"] = serde_json::json!("claude");
    let resp = app.chat(&token, &body).await;
    assert_eq!(resp.status(), 400);
    assert!(resp.text().await.unwrap().contains("seed"));
    app.mock.state.script(
        KEY_C,
        [Script {
            status: Some(429),
            headers: vec![("Retry-After".into(), "30".into())],
            ..Default::default()
        }],
    );
    let mut plain = chat_body(10);
    plain["model"] = serde_json::json!("claude");
    assert_eq!(app.chat(&token, &plain).await.status(), 429);
    let resp = app.chat(&token, &body).await;
    assert_eq!(resp.status(), 400);
    assert!(resp.text().await.unwrap().contains("seed"));
}

/// A fallback model is sent no more output than its own cap: the cap asked of the first
/// model (within its larger cap) went to the fallback's upstream as it was, which refused
/// it — a 400 passed on as the client's fault (s24 attack, translation #4).
#[tokio::test]
async fn a_fallback_is_sent_no_more_than_its_own_output_cap() {
    let app = spawn_app_with(|s, m| {
        pool_of_two_and_a_fallback(s, m);
        let claude = s.models.iter_mut().find(|m| m.name == "claude").unwrap();
        claude.max_output_tokens = 1_000;
    })
    .await;
    let (_, token) = app.token("wes", None).await;
    for k in [KEY_A, KEY_B] {
        app.mock.state.script(k, [status(500)]);
    }
    let resp = app.chat(&token, &chat_body(3_000)).await;
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers().get("x-sluice-upstream").unwrap(), "c");
    let sent = app.mock.state.stats(KEY_C).last_bodies;
    assert_eq!(sent.back().unwrap()["max_tokens"], 1_000, "{sent:?}");
}

/// A shared cooldown longer than `max_cooldown_seconds` (an older version published reset
/// headers uncapped) rests the key once at the cap and is published back at it: read again
/// at the cap every 250 ms, it rested the key until its own expiry, years away.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shared_cooldown_past_the_cap_rests_the_key_once_at_the_cap() {
    let redis = RedisServer::start().await;
    let url = redis.url();
    let app = spawn_app_with(move |s, _| {
        s.retry.max_cooldown_seconds = 1;
        s.redis = Some(sluice::config::RedisSettings {
            url: sluice::config::Secret(secrecy::SecretString::from(url)),
            ..Default::default()
        });
    })
    .await;
    let name = app.state.catalog().deployments[0].shared_name();
    let key = sluice::ratelimit::redis_window::RedisWindows::cool_key(&name);
    let far = (chrono::Utc::now().timestamp_millis() + 3_600_000).to_string();
    redis
        .cli(&["SET", &key, &far, "PX", "3600000"])
        .await
        .unwrap();
    let now = || app.state.clock.monotonic_ms();
    poll_until("the key rests", || {
        app.state.pool().cooling_ms(0, now()) > 0
    })
    .await;
    assert!(app.state.pool().cooling_ms(0, now()) <= 1_000);
    tokio::time::sleep(Duration::from_millis(1_600)).await;
    assert_eq!(
        app.state.pool().cooling_ms(0, now()),
        0,
        "rested once, at the cap"
    );
    let (_, token) = app.token("xan", None).await;
    assert_eq!(app.chat(&token, &chat_body(10)).await.status(), 200);
}

#[tokio::test]
async fn equally_idle_keys_share_the_load() {
    let app = spawn_app_with(pool_of_two_and_a_fallback).await;
    let (_, token) = app.token("ola", None).await;
    for _ in 0..10 {
        assert_eq!(app.chat(&token, &chat_body(10)).await.status(), 200);
    }
    assert_eq!(app.mock.state.stats(KEY_A).count, 5);
    assert_eq!(app.mock.state.stats(KEY_B).count, 5);
    assert_eq!(
        app.mock.state.stats(KEY_C).count,
        0,
        "the fallback only when the pool cannot serve"
    );
}

/// A client's own deadline that runs out before any upstream was tried (here 1 ms: the
/// reservation alone usually takes longer) is a timeout of that request — 502 `upstream_error`, as
/// a timeout is — never a `pool_empty` alert, which tells the operators that no key of the
/// model can serve. Before, any client could page the operators with a short deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deadline_gone_before_any_attempt_raises_no_alert() {
    let dir = tempfile::tempdir().unwrap();
    let mock = sluice::mock::MockServer::start("127.0.0.1:0", Default::default()).unwrap();
    let gateway = crate::processes::start_gateway_full(dir.path(), &mock, &[], "").await;
    let db = crate::gateway_proc::open_dir_db(dir.path()).await;
    let token = sluice::cli::token_issue(&db, &issue_args("ida"), chrono::Utc::now())
        .await
        .unwrap()
        .text;
    let http = reqwest::Client::new();
    for _ in 0..5 {
        let resp = http
            .post(format!("{}/v1/chat/completions", gateway.url))
            .bearer_auth(&token)
            .header("x-sluice-request-deadline-ms", "1")
            .json(&chat_body(10))
            .send()
            .await
            .unwrap();
        // Served when the mock was quicker than 1 ms, else timed out: never "degraded".
        let status = resp.status().as_u16();
        let v: Value = resp.json().await.unwrap();
        assert!(
            status == 200 || (status == 502 && v["error"]["code"] == "upstream_error"),
            "{status} {v}"
        );
    }
    let metrics = get_text(&http, format!("{}/metrics", gateway.url)).await;
    assert!(
        !metrics.contains("kind=\"pool_empty\""),
        "a client's deadline raised pool_empty"
    );
}
