//! The retry table's harder rows (issue 14): a key out of credit that says so with a 400, a
//! cooling key never retried inside its `Retry-After`, attempts that stop at the request's
//! deadline, 408/409 treated as transient, a breaker probe whose client leaves, and retries
//! after a cooldown that keep their jitter.

use std::time::Duration;

use serde_json::{json, Value};
use sluice::config::{Provider, Settings};
use sluice::mock::{MockServer, Script};
use sluice::upstream::breaker::State;
use sluice::upstream::pool::Disabled;

use crate::helpers::*;
use crate::resilience::{open_key_a_breaker, status};

const KEY_C: &str = "sk-ant-upstream-canary-key-C-9e8d7c";
const KEY_D: &str = "sk-ant-upstream-canary-key-D-4b5a6c";

/// Every wait in these tests is bounded by this, far above what a correct gateway needs.
const BOUND: Duration = Duration::from_secs(30);

fn anthropic(id: &str, key: &str, m: &MockServer) -> sluice::config::UpstreamSettings {
    let mut u = upstream(id, key, m);
    u.provider = Provider::Anthropic;
    u.base_url = m.base_url();
    u
}

/// `claude` on the Anthropic key `c`, falling back to `gpt-4o-mini` (key `a`); `solo` on the
/// Anthropic key `d` alone.
fn claude_with_fallback_and_solo(s: &mut Settings, m: &MockServer) {
    s.upstreams.push(anthropic("c", KEY_C, m));
    s.upstreams.push(anthropic("d", KEY_D, m));
    let mut claude = model("claude", &["c"]);
    claude.fallbacks = vec!["gpt-4o-mini".into()];
    s.models.push(claude);
    s.models.push(model("solo", &["d"]));
}

fn asking(model: &str) -> Value {
    let mut b = chat_body(10);
    b["model"] = json!(model);
    b
}

/// A chat request with `x-sluice-request-deadline-ms`, its answer awaited at most `BOUND`.
async fn with_deadline(app: &TestApp, token: &str, ms: u64) -> reqwest::Response {
    let body = chat_body(10);
    tokio::time::timeout(BOUND, app.chat_with_deadline(token, &body, ms))
        .await
        .expect("answered within the bound")
}

/// Anthropic's answer for an account out of credit (a 400, not a 429).
fn out_of_credit() -> Script {
    Script {
        status: Some(400),
        body: Some(
            json!({"type": "error", "error": {"type": "invalid_request_error",
            "message": "Your credit balance is too low to access the Anthropic API. Please go to Plans & Billing to upgrade or purchase credits."}}),
        ),
        ..Default::default()
    }
}

#[tokio::test]
async fn an_anthropic_key_out_of_credit_is_disabled_and_never_shown_to_the_client() {
    let app = spawn_app_with(claude_with_fallback_and_solo).await;
    let (_, token) = app.token("ivy", None).await;
    for k in [KEY_C, KEY_D] {
        app.mock.state.sticky(k, Some(out_of_credit()));
    }
    for _ in 0..3 {
        let resp = app.chat(&token, &asking("claude")).await;
        assert_eq!(resp.status(), 200, "the fallback serves");
        assert_eq!(resp.headers().get("x-sluice-upstream").unwrap(), "a");
    }
    assert_eq!(
        app.mock.state.stats(KEY_C).count,
        1,
        "a key out of credit is not tried again"
    );
    assert_eq!(app.state.pool().disabled(1), Some(Disabled::Quota));

    // With no other route, the client gets the gateway's own error, not the operator's bill.
    let resp = app.chat(&token, &asking("solo")).await;
    assert_eq!(resp.status(), 502);
    let text = resp.text().await.unwrap().to_ascii_lowercase();
    assert!(
        !text.contains("credit") && !text.contains("billing"),
        "the operator's billing text stays inside: {text}"
    );
    assert_eq!(app.state.pool().disabled(2), Some(Disabled::Quota));
}

#[tokio::test]
async fn a_400_that_merely_mentions_billing_is_still_the_clients_error() {
    let app = spawn_app_with(claude_with_fallback_and_solo).await;
    let (_, token) = app.token("jon", None).await;
    app.mock.state.script(
        KEY_D,
        [Script {
            status: Some(400),
            body: Some(
                json!({"type": "error", "error": {"type": "invalid_request_error",
                "message": "messages.0.content: the text about billing is too long"}}),
            ),
            ..Default::default()
        }],
    );
    let resp = app.chat(&token, &asking("solo")).await;
    assert_eq!(resp.status(), 400, "passed through");
    assert_eq!(app.state.pool().disabled(2), None);
}

#[tokio::test]
async fn a_cooling_key_is_never_retried_inside_its_retry_after() {
    let app = spawn_app().await;
    let (_, token) = app.token("kai", None).await;
    app.mock.state.sticky(
        KEY_A,
        Some(Script {
            status: Some(503),
            headers: vec![("Retry-After".into(), "30".into())],
            ..Default::default()
        }),
    );
    let resp = with_deadline(&app, &token, 5_000).await;
    assert_eq!(resp.status(), 503, "nothing can serve before the deadline");
    let after = retry_after(resp.headers());
    assert!((25..=30).contains(&after), "Retry-After {after}");
    let v: Value = resp.json().await.unwrap();
    assert_eq!(v["error"]["code"], "service_degraded");
    assert_eq!(
        app.mock.state.stats(KEY_A).count,
        1,
        "no backoff round lands inside the key's Retry-After"
    );

    // A short Retry-After: the retry waits it out, then lands.
    let app = spawn_app().await;
    let (_, token) = app.token("kai", None).await;
    app.mock.state.script(
        KEY_A,
        [Script {
            status: Some(503),
            headers: vec![("Retry-After".into(), "1".into())],
            ..Default::default()
        }],
    );
    let resp = tokio::time::timeout(BOUND, app.chat(&token, &chat_body(10)))
        .await
        .expect("answered");
    assert_eq!(resp.status(), 200);
    let arrivals = app.mock.state.stats(KEY_A).last_arrivals_ms;
    assert_eq!(arrivals.len(), 2);
    // Clock readings are whole milliseconds; allow that rounding and nothing more.
    assert!(
        arrivals[1] - arrivals[0] >= 998,
        "the retry landed {} ms after a Retry-After of 1 s",
        arrivals[1] - arrivals[0]
    );
}

/// Retries after a cooldown keep their jitter (F3): requests whose only key answered 529
/// must not all come back the instant its cooldown ends. The backoff's base (1.5 s) is
/// large enough that 20 uniform draws all landing within 200 ms of each other cannot
/// happen by chance (about 20 × (0.2 / 1.5)^19).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retries_after_a_cooldown_are_spread_by_their_jitter() {
    let app = std::sync::Arc::new(
        spawn_app_with(|s, _| {
            s.retry.base_delay_ms = 1_500;
            s.retry.budget_ratio = 1.0;
            s.breaker.failure_threshold = 1_000;
            s.breaker.min_calls = 1_000;
        })
        .await,
    );
    let (_, token) = app.token("ora", None).await;
    // Held for a second, so that every request's first attempt is out before the first
    // answer puts the key to rest.
    let overloaded = Script {
        status: Some(529),
        headers: vec![("Retry-After".into(), "2".into())],
        delay_ms: 1_000,
        ..Default::default()
    };
    app.mock
        .state
        .script(KEY_A, (0..20).map(|_| overloaded.clone()));
    let requests: Vec<_> = (0..20)
        .map(|_| {
            let (app, token) = (app.clone(), token.clone());
            tokio::spawn(async move {
                let resp = tokio::time::timeout(BOUND, app.chat(&token, &chat_body(10)))
                    .await
                    .expect("answered");
                (resp.status(), resp.text().await.unwrap_or_default())
            })
        })
        .collect();
    for r in requests {
        let (status, body) = r.await.unwrap();
        assert_eq!(status, 200, "served by the retry: {body}");
    }
    let mut arrivals: Vec<u64> = app.mock.state.stats(KEY_A).last_arrivals_ms.into();
    assert_eq!(arrivals.len(), 40, "one first attempt and one retry each");
    arrivals.sort_unstable();
    let retries = &arrivals[20..];
    let spread = retries[19] - retries[0];
    assert!(
        spread > 200,
        "the 20 retries arrived within {spread} ms of each other: no jitter after the rest"
    );
}

#[tokio::test]
async fn attempts_stop_at_the_request_deadline() {
    let app = spawn_app_with(|s, _| s.breaker.failure_threshold = 2).await;
    let (_, token) = app.token("lea", None).await;
    app.mock.state.sticky(
        KEY_A,
        Some(Script {
            delay_ms: 5_000,
            ..Default::default()
        }),
    );
    for n in 1..=2u64 {
        let resp = with_deadline(&app, &token, 500).await;
        assert_eq!(
            resp.status(),
            502,
            "the deadline ends the attempt, not the upstream"
        );
        let v: Value = resp.json().await.unwrap();
        assert_eq!(v["error"]["code"], "upstream_error");
        assert_eq!(app.mock.state.stats(KEY_A).count, n, "one attempt each");
    }
    assert_eq!(
        app.state.pool().breakers[0].state(),
        State::Closed,
        "the client's short deadline is not the upstream's failure"
    );
}

#[tokio::test]
async fn a_408_or_409_moves_on_to_the_next_key_like_the_sdks_retry_it() {
    let app = spawn_app_with(|s, m| {
        s.upstreams.push(upstream("b", KEY_B, m));
        s.models[0].routes.push(sluice::config::RouteSettings {
            upstream: "b".into(),
            model: "gpt-4o-mini-upstream".into(),
            output_cap_param: None,
            deployment: None,
            tier_model: None,
        });
    })
    .await;
    let (_, token) = app.token("max", None).await;
    for code in [409, 408] {
        app.mock.state.sticky(KEY_A, Some(status(code)));
        for _ in 0..6 {
            let resp = app.chat(&token, &chat_body(10)).await;
            assert_eq!(resp.status(), 200, "{code} is transient, not the client's");
            assert_eq!(resp.headers().get("x-sluice-upstream").unwrap(), "b");
        }
        assert!(app.mock.state.stats(KEY_A).count >= 3, "a was tried");
        if code == 409 {
            assert_eq!(
                app.state.pool().breakers[0].state(),
                State::Closed,
                "a conflict is no breaker failure"
            );
        }
        app.mock.state.reset();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_probe_whose_client_leaves_frees_the_half_open_slot_at_once() {
    let app = spawn_app_with(|s, _| {
        s.breaker.open_seconds = 1;
        s.breaker.half_open_max_wait_seconds = 30;
    })
    .await;
    let (_, token) = app.token("ned", None).await;
    open_key_a_breaker(&app, &token).await;
    tokio::time::sleep(Duration::from_millis(1100)).await;
    app.mock.state.sticky(
        KEY_A,
        Some(Script {
            delay_ms: 10_000,
            ..Default::default()
        }),
    );
    // The probe's client gives up while the upstream still holds its headers.
    let gone = app
        .http
        .post(format!("{}/v1/chat/completions", app.address))
        .bearer_auth(&token)
        .timeout(Duration::from_millis(300))
        .json(&chat_body(10))
        .send()
        .await;
    assert!(gone.is_err(), "the client left");
    assert_eq!(app.mock.state.stats(KEY_A).count, 4, "the probe went out");
    app.mock.state.sticky(KEY_A, None);
    // The next request probes as soon as the gateway has seen the client leave (well within
    // the bound, far below the 30 s half-open maximum wait).
    let mut served = false;
    for _ in 0..20 {
        if app.chat(&token, &chat_body(10)).await.status() == 200 {
            served = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(served, "the abandoned probe's slot was freed");
}

/// Raises the breaker's thresholds out of reach: these tests watch the key's rest alone.
fn no_breaker(s: &mut Settings) {
    s.breaker.failure_threshold = 1_000;
    s.breaker.min_calls = 1_000;
}

/// Eight 529s without `Retry-After`, answered to eight requests a burst had out at once,
/// rest the one key as one rate limit: a second (2^0 s), not 2^7 s capped at 120 s (s30
/// upstream attack F2: the streak counted every answer of the burst). The burst's requests
/// have deadlines too short to wait out even that second; a request 2.5 s later is served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn simultaneous_overloads_without_retry_after_rest_the_key_as_one() {
    let app = std::sync::Arc::new(spawn_app_with(|s, _| no_breaker(s)).await);
    let (_, token) = app.token("pia", None).await;
    // Held half a second, so that every request's attempt is out before the first answer.
    let overloaded = Script {
        status: Some(529),
        delay_ms: 500,
        ..Default::default()
    };
    app.mock
        .state
        .script(KEY_A, (0..8).map(|_| overloaded.clone()));
    let burst: Vec<_> = (0..8)
        .map(|_| {
            let (app, token) = (app.clone(), token.clone());
            tokio::spawn(async move { with_deadline(&app, &token, 1_200).await.status() })
        })
        .collect();
    for r in burst {
        assert_ne!(r.await.unwrap(), 200, "the burst is not served");
    }
    assert_eq!(app.mock.state.stats(KEY_A).count, 8, "one attempt each");
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    let resp = app.chat(&token, &chat_body(10)).await;
    let after = resp
        .headers()
        .get("retry-after")
        .map(|v| v.to_str().unwrap_or_default().to_string());
    assert_eq!(
        resp.status(),
        200,
        "the key rested for one overload, not eight (Retry-After {after:?})"
    );
}

/// The streamed twin: eight streams on one Anthropic key, each ended by an
/// `overloaded_error` event, spread over two seconds (longer than one rest), rest the key as
/// one overload: each stream was sent before the first rest began. A request 1.5 s after
/// the last is served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn simultaneous_overloaded_streams_rest_the_key_as_one() {
    use crate::resilience_streams::{anthropic_error, claude_stream_body};
    let app = std::sync::Arc::new(
        spawn_app_with(|s, m| {
            add_claude(s, m);
            no_breaker(s);
        })
        .await,
    );
    let (_, token) = app.token("quin", None).await;
    // Each stream's headers are held, so all eight are out before the first error event;
    // the events then come 300 ms apart.
    app.mock.state.script(
        KEY_B,
        (0..8u64).map(|i| Script {
            delay_ms: 400,
            chunk_delay_ms: 300 * i,
            ..anthropic_error("overloaded_error")
        }),
    );
    let burst: Vec<_> = (0..8)
        .map(|_| {
            let (app, token) = (app.clone(), token.clone());
            tokio::spawn(async move {
                let resp = tokio::time::timeout(BOUND, app.messages(&token, &claude_stream_body()))
                    .await
                    .expect("answered");
                assert_eq!(resp.status(), 200, "every stream went out");
                resp.text().await.unwrap_or_default()
            })
        })
        .collect();
    for r in burst {
        let text = r.await.unwrap();
        assert!(text.contains("overloaded_error"), "{text}");
    }
    assert_eq!(app.mock.state.stats(KEY_B).count, 8);
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let resp = app.messages(&token, &claude_stream_body()).await;
    let after = resp
        .headers()
        .get("retry-after")
        .map(|v| v.to_str().unwrap_or_default().to_string());
    assert_eq!(
        resp.status(),
        200,
        "the key rested for one overload, not eight (Retry-After {after:?})"
    );
}

/// A wall clock the test steps back.
struct SteppedBack(std::sync::atomic::AtomicI64);

impl sluice::clock::Clock for SteppedBack {
    fn now(&self) -> chrono::DateTime<chrono::Utc> {
        let back = self.0.load(std::sync::atomic::Ordering::SeqCst);
        chrono::Utc::now() - chrono::Duration::milliseconds(back)
    }
}

/// A key's rest is this process's own wait, on a clock that never steps: the host's clock
/// stepped back an hour while the key rests its `Retry-After: 1` rests it that second, and
/// tells clients so. On the wall clock it rested an hour more and answered
/// `Retry-After: 3601` (s30 upstream attack, lesser finding).
#[tokio::test]
async fn a_clock_step_back_does_not_lengthen_a_rest() {
    let clock = std::sync::Arc::new(SteppedBack(std::sync::atomic::AtomicI64::new(0)));
    let app = spawn_app_full(|_, _| {}, Some(clock.clone())).await;
    let (_, token) = app.token("rio", None).await;
    app.mock.state.script(
        KEY_A,
        [Script {
            status: Some(429),
            headers: vec![("Retry-After".into(), "1".into())],
            ..Default::default()
        }],
    );
    let resp = app.chat(&token, &chat_body(10)).await;
    assert_eq!(resp.status(), 429, "the only key is rate limited");
    clock
        .0
        .store(3_600_000, std::sync::atomic::Ordering::SeqCst);
    let resp = app.chat(&token, &chat_body(10)).await;
    assert_ne!(resp.status(), 200, "the key still rests");
    assert_eq!(retry_after(resp.headers()), 1, "the rest's time left");
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    let resp = app.chat(&token, &chat_body(10)).await;
    assert_eq!(resp.status(), 200, "the rest ended on time");
    assert_eq!(app.mock.state.stats(KEY_A).count, 2);
}
