//! The priority admission queue (layer 2).

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use sluice::config::ReservedSlots;
use sluice::mock::Script;

use crate::helpers::*;

fn tagged(tag: &str) -> Value {
    json!({"model": "gpt-4o-mini", "max_tokens": 100, "messages": [{"role": "user", "content": tag}]})
}

async fn send(
    app: &Arc<TestApp>,
    token: &str,
    priority: u8,
    tag: String,
) -> (u16, Value, reqwest::header::HeaderMap) {
    let resp = app
        .http
        .post(format!("{}/v1/chat/completions", app.address))
        .bearer_auth(token)
        .header("x-sluice-priority", priority.to_string())
        .json(&tagged(&tag))
        .send()
        .await
        .unwrap();
    let status = resp.status().as_u16();
    let headers = resp.headers().clone();
    (status, resp.json().await.unwrap_or(Value::Null), headers)
}

fn spawn_send(
    app: &Arc<TestApp>,
    token: &str,
    priority: u8,
    tag: String,
) -> tokio::task::JoinHandle<(u16, Value, reqwest::header::HeaderMap)> {
    let (app, token) = (app.clone(), token.to_string());
    tokio::spawn(async move { send(&app, &token, priority, tag).await })
}

fn queue_of(
    max: u32,
    reserved: [u32; 4],
    depth: u32,
    wait: u64,
) -> impl FnOnce(&mut sluice::config::Settings, &sluice::mock::MockServer) {
    move |s, _| {
        s.queue.max_in_flight = max;
        s.queue.reserved = ReservedSlots::of(reserved);
        s.queue.max_depth = depth;
        s.queue.max_wait_seconds = wait;
    }
}

/// A gate smaller than the default reserves' 16 slots, with the reserves left at their
/// defaults: a request without a priority (NORMAL) is served, and the urgent ones never
/// take more than `max_in_flight`. Before, the reserves stayed 8 + 8 and took the gate
/// whole: NORMAL had no slot and waited until refused (503 `queue_timeout`).
#[tokio::test]
async fn a_small_gate_with_the_default_reserves_serves_requests_without_a_priority() {
    let app = spawn_app_with(|s, _| {
        s.queue.max_in_flight = 4;
        s.queue.max_wait_seconds = 2;
    })
    .await;
    let (_, token) = app.issue(issue_args("alice")).await;
    let resp = app.chat(&token, &tagged("plain")).await;
    assert_eq!(resp.status(), 200, "{}", resp.text().await.unwrap());
}

// One slot, so grants are strictly one after another and the mock sees them in grant
// order. (With several slots, requests that finish together release their slots together
// — their settlements share one group commit — and the granted requests then race each
// other to the upstream, so arrival order there would not be grant order.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiting_requests_are_served_by_priority_then_arrival() {
    let app = Arc::new(spawn_app_with(queue_of(1, [0, 0, 0, 0], 100, 60)).await);
    let (_, token) = app
        .issue(sluice::cli::IssueArgs {
            max_priority: 1,
            ..issue_args("alice")
        })
        .await;
    // The test holds the only slot while the 26 queue, one at a time: arrival order is the
    // order the test saw them join (no race between spawned tasks, no sleep).
    let held = app.state.queue.admit(1, 0).await.expect("the free slot");
    let mut tasks = Vec::new();
    for i in 0..26u8 {
        let p = [3, 1, 4, 2][i as usize % 4];
        tasks.push(spawn_send(&app, &token, p, format!("p{p} #{i}")));
        queue_holds(&app, usize::from(i) + 1).await;
    }
    drop(held);
    let results: Vec<_> = futures_util::future::join_all(tasks)
        .await
        .into_iter()
        .map(|r| r.unwrap())
        .collect();
    assert!(results.iter().all(|(s, _, _)| *s == 200));
    assert!(results
        .iter()
        .all(|(_, _, h)| h.get("x-sluice-queue-wait-ms").is_some()));
    let arrivals: Vec<String> = app
        .mock
        .state
        .stats(KEY_A)
        .last_bodies
        .iter()
        .map(|b| b["messages"][0]["content"].as_str().unwrap().to_string())
        .collect();
    let queued: Vec<(u8, u32)> = arrivals
        .iter()
        .map(|t| {
            let (p, n) = t[1..].split_once(" #").unwrap();
            (p.parse().unwrap(), n.parse().unwrap())
        })
        .collect();
    assert_eq!(queued.len(), 26);
    let mut sorted = queued.clone();
    sorted.sort();
    assert_eq!(
        queued, sorted,
        "served by priority, then arrival: {arrivals:?}"
    );
}

/// Waits until `n` requests wait in the queue (the bound only turns a hang into a failure).
async fn queue_holds(app: &TestApp, n: usize) {
    let bound = Instant::now() + Duration::from_secs(10);
    while app.state.queue.depth().iter().sum::<usize>() < n {
        assert!(Instant::now() < bound, "{n} never queued");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn low_never_uses_the_critical_reserve() {
    let app = Arc::new(spawn_app_with(queue_of(4, [2, 0, 0, 0], 100, 60)).await);
    let (_, token) = app
        .issue(sluice::cli::IssueArgs {
            max_priority: 1,
            ..issue_args("bob")
        })
        .await;
    app.mock.state.sticky(
        KEY_A,
        Some(Script {
            delay_ms: 200,
            ..Default::default()
        }),
    );
    let low: Vec<_> = (0..8)
        .map(|i| spawn_send(&app, &token, 4, format!("low {i}")))
        .collect();
    // Wait (no fixed sleep) until LOW holds what it can and the rest queue behind it.
    let mut waited = 0;
    while app.mock.state.stats(KEY_A).in_flight < 2
        || app.state.queue.depth().iter().sum::<usize>() < 6
    {
        waited += 1;
        assert!(waited < 1000, "the LOW requests never queued");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(
        app.mock.state.stats(KEY_A).max_concurrency,
        2,
        "LOW holds only the two unreserved slots"
    );
    let (status, _, _) = send(&app, &token, 1, "critical".into()).await;
    assert_eq!(status, 200);
    // Had CRITICAL waited for a LOW slot, never more than two calls would have run at once:
    // a third one at a time shows it went straight to its reserve.
    assert_eq!(
        app.mock.state.stats(KEY_A).max_concurrency,
        3,
        "CRITICAL went straight to its reserve"
    );
    for t in low {
        assert_eq!(t.await.unwrap().0, 200);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_queue_answers_503_with_a_position_and_releases_the_reservation() {
    let app = Arc::new(spawn_app_with(queue_of(1, [0, 0, 0, 0], 2, 60)).await);
    let (id, token) = app.token("carol", Some("1")).await;
    app.mock.state.sticky(
        KEY_A,
        Some(Script {
            delay_ms: 300,
            ..Default::default()
        }),
    );
    let tasks: Vec<_> = (0..5)
        .map(|i| spawn_send(&app, &token, 3, format!("r{i}")))
        .collect();
    let results: Vec<_> = futures_util::future::join_all(tasks)
        .await
        .into_iter()
        .map(|r| r.unwrap())
        .collect();
    assert_eq!(results.iter().filter(|(s, _, _)| *s == 200).count(), 3);
    let full: Vec<_> = results.iter().filter(|(s, _, _)| *s == 503).collect();
    assert_eq!(full.len(), 2);
    for (_, v, h) in full {
        assert_eq!(v["error"]["code"], "queue_full");
        assert_eq!(v["error"]["queue_position"], 3);
        assert!(v["error"]["estimated_wait_seconds"].as_u64().is_some());
        assert!(h.get("retry-after").is_some());
        assert_eq!(h.get("x-should-retry").unwrap(), "true");
    }
    app.assert_invariant().await;
    assert_eq!(
        app.scalar(&format!(
            "SELECT 1000000 - remaining_micros FROM tokens WHERE id = {id}"
        ))
        .await,
        3 * 17
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiting_too_long_is_a_queue_timeout() {
    let app = Arc::new(spawn_app_with(queue_of(1, [0, 0, 0, 0], 10, 1)).await);
    let (_, token) = app.token("dan", Some("1")).await;
    app.mock.state.sticky(
        KEY_A,
        Some(Script {
            delay_ms: 2500,
            ..Default::default()
        }),
    );
    let slow = spawn_send(&app, &token, 3, "slow".into());
    while app.mock.state.stats(KEY_A).in_flight == 0 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let (status, v, _) = send(&app, &token, 3, "waits".into()).await;
    assert_eq!(status, 503);
    assert_eq!(v["error"]["code"], "queue_timeout");
    assert!(
        !slow.is_finished(),
        "refused at its limit, not when the slot came free"
    );
    assert_eq!(slow.await.unwrap().0, 200);
    app.assert_invariant().await;
}

/// The request's own deadline (`x-sluice-request-deadline-ms`) bounds its wait in the queue
/// too: past it the request is refused as a queue timeout at once. Before, it waited for a
/// slot, then reached the upstream stage with no time left and was answered 503
/// `service_degraded` with a `pool_empty` alert to the operators — an alert any client
/// could raise with a short deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_request_deadline_bounds_the_queue_wait() {
    let app = Arc::new(spawn_app_with(queue_of(1, [0, 0, 0, 0], 10, 60)).await);
    let (_, token) = app.token("dan", Some("1")).await;
    app.mock.state.sticky(
        KEY_A,
        Some(Script {
            delay_ms: 2500,
            ..Default::default()
        }),
    );
    let slow = spawn_send(&app, &token, 3, "slow".into());
    while app.mock.state.stats(KEY_A).in_flight == 0 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    for stream in [false, true] {
        let mut body = tagged("short deadline");
        body["stream"] = json!(stream);
        let resp = app.chat_with_deadline(&token, &body, 300).await;
        let text = resp.text().await.unwrap();
        assert!(
            text.contains("queue_timeout"),
            "stream {stream}: a queue timeout, named: {text}"
        );
        assert!(
            !slow.is_finished(),
            "stream {stream}: refused at its deadline, not when the slot came free"
        );
    }
    assert_eq!(
        app.mock.state.stats(KEY_A).count,
        1,
        "only `slow` reached the upstream"
    );
    assert_eq!(slow.await.unwrap().0, 200);
    app.assert_invariant().await;
}

/// An app whose only slot the test holds for as long as it likes, and a stream of `eve`'s
/// (a $1 token) waiting behind it, answered at once: the stream can leave the queue only
/// because its client left, never because the slot came free. The token's id and text, the
/// held slot, the stream's body and its first chunk.
async fn a_stream_behind_the_held_slot() -> (
    Arc<TestApp>,
    (i64, String),
    sluice::queue::Slot,
    impl futures_util::Stream<Item = reqwest::Result<bytes::Bytes>>,
    bytes::Bytes,
) {
    let app = Arc::new(spawn_app_with(queue_of(1, [0, 0, 0, 0], 10, 60)).await);
    let (id, token) = app.token("eve", Some("1")).await;
    let held = app.state.queue.admit(1, 0).await.expect("the free slot");
    let mut body = tagged("impatient");
    body["stream"] = json!(true);
    let resp = app.chat(&token, &body).await;
    assert_eq!(resp.status(), 200, "a waiting stream is answered at once");
    let mut chunks = Box::pin(resp.bytes_stream());
    let first = futures_util::StreamExt::next(&mut chunks)
        .await
        .unwrap()
        .unwrap();
    (app, (id, token), held, chunks, first)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queued_stream_hears_its_position_and_leaves_at_once_when_the_client_does() {
    let (app, (id, token), held, chunks, first) = a_stream_behind_the_held_slot().await;
    assert!(String::from_utf8_lossy(&first).starts_with(": queued position=1 eta="));
    let v: Value = app
        .http
        .get(format!("{}/v1/queue", app.address))
        .bearer_auth(&token)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(v["waiting"][0]["queue_position"], 1);
    assert_eq!(
        app.scalar("SELECT COUNT(*) FROM reservations").await,
        1,
        "the waiting stream holds its reservation"
    );
    drop(chunks);
    left_the_queue(&app, id).await;
    app.assert_invariant().await;
    assert_eq!(
        app.scalar(&format!(
            "SELECT remaining_micros FROM tokens WHERE id = {id}"
        ))
        .await,
        1_000_000,
        "the one that left paid nothing"
    );
    assert_eq!(app.mock.state.stats(KEY_A).count, 0);
    drop(held);
    assert_eq!(app.chat(&token, &tagged("next")).await.status(), 200);
}

/// A queued stream whose client leaves gives its place up before its settlement and log
/// row are written: it kept the place (and any slot granted meanwhile) while a slow store
/// took them, so departed clients filled the queue (s29 limits attack F4).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queued_stream_whose_client_left_gives_its_place_up_before_it_settles() {
    let (app, (id, _), held, chunks, _) = a_stream_behind_the_held_slot().await;
    assert_eq!(app.state.queue.waiting_for(id).len(), 1);
    // The store is held: the departure's settlement waits on it.
    let store = crate::helpers::hold_the_store(&app.settings.database.url).await;
    drop(chunks);
    let bound = Instant::now() + Duration::from_secs(2);
    while !app.state.queue.waiting_for(id).is_empty() {
        assert!(
            Instant::now() < bound,
            "still queued while its settlement waits on the store"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    store.release().await;
    app.wait_for_log_rows(1).await;
    app.assert_invariant().await;
    drop(held);
}

/// Waits until the token has nothing in the queue. The bound only turns a waiter that never
/// leaves into a failure: the caller holds the slot, so it cannot have been served.
async fn left_the_queue(app: &TestApp, token_id: i64) {
    let bound = Instant::now() + Duration::from_secs(10);
    while !app.state.queue.waiting_for(token_id).is_empty() {
        assert!(Instant::now() < bound, "still queued after the client left");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queued_stream_is_served_after_its_wait() {
    let app = Arc::new(spawn_app_with(queue_of(1, [0, 0, 0, 0], 10, 60)).await);
    let (_, token) = app.token("fred", Some("1")).await;
    let held = app.state.queue.admit(1, 0).await.expect("the free slot");
    let mut body = tagged("patient");
    body["stream"] = json!(true);
    let mut chunks = app.chat(&token, &body).await.bytes_stream();
    let mut text = String::new();
    while !text.contains("\n\n") {
        let chunk = futures_util::StreamExt::next(&mut chunks).await.unwrap();
        text.push_str(&String::from_utf8_lossy(&chunk.unwrap()));
    }
    assert!(text.starts_with(": queued position=1"), "{text}");
    assert_eq!(app.mock.state.stats(KEY_A).count, 0, "still waiting");
    drop(held);
    while let Some(chunk) = futures_util::StreamExt::next(&mut chunks).await {
        text.push_str(&String::from_utf8_lossy(&chunk.unwrap()));
    }
    let data: Vec<String> = text
        .split("\n\n")
        .filter_map(|e| e.strip_prefix("data: "))
        .map(str::to_string)
        .collect();
    assert_eq!(reassemble(&data), sluice::mock::MockConfig::default().text);
    assert_eq!(data.last().unwrap(), "[DONE]");
    app.assert_invariant().await;
}

#[tokio::test]
async fn priority_is_capped_by_the_token_and_checked() {
    let app = spawn_app().await;
    let (_, token) = app.token("fay", None).await;
    let resp = app
        .http
        .post(format!("{}/v1/chat/completions", app.address))
        .bearer_auth(&token)
        .header("x-sluice-priority", "urgent")
        .json(&chat_body(5))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 400);
    let v: Value = resp.json().await.unwrap();
    assert_eq!(v["error"]["param"], "x-sluice-priority");
}

/// As above, for a request that is not a stream: the test holds the only slot.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queued_request_whose_client_leaves_is_gone_at_once_and_pays_nothing() {
    let app = Arc::new(spawn_app_with(queue_of(1, [0, 0, 0, 0], 10, 60)).await);
    let (id, token) = app.token("gil", Some("1")).await;
    let held = app.state.queue.admit(1, 0).await.expect("the free slot");
    let impatient = spawn_send(&app, &token, 3, "impatient".into());
    let bound = Instant::now() + Duration::from_secs(10);
    while app.state.queue.waiting_for(id).is_empty() {
        assert!(Instant::now() < bound, "never queued");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(
        app.scalar("SELECT COUNT(*) FROM reservations").await,
        1,
        "the waiting request holds its reservation"
    );
    // The client leaves: its connection closes.
    impatient.abort();
    assert!(impatient.await.unwrap_err().is_cancelled());
    left_the_queue(&app, id).await;
    app.assert_invariant().await;
    assert_eq!(
        app.scalar(&format!(
            "SELECT remaining_micros FROM tokens WHERE id = {id}"
        ))
        .await,
        1_000_000,
        "the one that left paid nothing"
    );
    assert_eq!(app.mock.state.stats(KEY_A).count, 0);
    drop(held);
    assert_eq!(app.chat(&token, &tagged("next")).await.status(), 200);
}

/// A request that waited in the queue is checked again when its slot comes: one whose
/// token was revoked while it waited is refused (401; an error event on a stream), its
/// reservation released, and the upstream never sees it. Before, every request parked
/// before a revocation was sent upstream and charged as slots came free, up to the
/// request deadline later (s25 attack, identity #4).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_queued_before_its_token_was_revoked_is_refused_when_its_slot_comes() {
    let app = Arc::new(spawn_app_with(queue_of(1, [0, 0, 0, 0], 10, 60)).await);
    let (id, token) = app.token("gil", Some("1")).await;
    let held = app.state.queue.admit(1, 0).await.expect("the free slot");
    let plain = spawn_send(&app, &token, 3, "parked".into());
    let mut body = tagged("parked stream");
    body["stream"] = json!(true);
    let stream = {
        let (app, token) = (app.clone(), token.clone());
        tokio::spawn(async move { app.chat(&token, &body).await.text().await.unwrap() })
    };
    let anthropic = {
        let (app, token) = (app.clone(), token.clone());
        let body = json!({"model": "gpt-4o-mini", "max_tokens": 100, "stream": true,
                          "messages": [{"role": "user", "content": "parked, Anthropic's way"}]});
        tokio::spawn(async move { app.messages(&token, &body).await.text().await.unwrap() })
    };
    let bound = Instant::now() + Duration::from_secs(10);
    while app.state.queue.waiting_for(id).len() < 3 {
        assert!(Instant::now() < bound, "both requests queued");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    revoke_elsewhere(&app, id).await;
    drop(held);
    let (status, v, _) = plain.await.unwrap();
    assert_eq!(status, 401, "{v}");
    assert_eq!(v["error"]["code"], "invalid_api_key");
    // The error event carries the refusal's own type in each format, not a server error
    // (s25 attack on the day's diff, #2).
    let last_event = |text: &str| -> Value {
        let data = text
            .split("\n\n")
            .filter_map(|e| e.lines().find_map(|l| l.strip_prefix("data: ")))
            .last()
            .unwrap_or_default()
            .to_string();
        serde_json::from_str(&data).unwrap_or_else(|_| panic!("{text}"))
    };
    let text = stream.await.unwrap();
    let event = last_event(&text);
    assert_eq!(event["error"]["code"], "invalid_api_key", "{text}");
    assert_eq!(event["error"]["type"], "invalid_request_error", "{text}");
    let text = anthropic.await.unwrap();
    let event = last_event(&text);
    assert_eq!(event["type"], "error", "{text}");
    assert_eq!(event["error"]["type"], "authentication_error", "{text}");
    assert_eq!(app.mock.state.stats(KEY_A).count, 0, "never sent upstream");
    assert_nothing_charged_nor_held(&app, id).await;
}

/// A request waiting between retry rounds (its only key rests for a 503's `Retry-After`) is
/// checked again before its next attempt: its token revoked meanwhile, it goes no further —
/// 401, nothing charged, the upstream not asked again (s25 attack on the day's diff, #1:
/// the wait may last up to the deadline, and it was sent and charged after it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_waiting_out_a_cooldown_is_refused_if_its_token_was_revoked_meanwhile() {
    let app = Arc::new(spawn_app().await);
    let (id, token) = app.token("hal", Some("1")).await;
    app.mock.state.script(
        KEY_A,
        [Script {
            status: Some(503),
            headers: vec![("retry-after".into(), "2".into())],
            ..Default::default()
        }],
    );
    let waiting = spawn_send(&app, &token, 3, "patient".into());
    let bound = Instant::now() + Duration::from_secs(10);
    while app.mock.state.stats(KEY_A).count < 1 {
        assert!(Instant::now() < bound, "the first attempt was made");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    revoke_elsewhere(&app, id).await;
    let (status, v, _) = waiting.await.unwrap();
    assert_eq!(status, 401, "{v}");
    assert_eq!(v["error"]["code"], "invalid_api_key");
    assert_eq!(app.mock.state.stats(KEY_A).count, 1, "not asked again");
    assert_nothing_charged_nor_held(&app, id).await;
}

/// A queued stream refused by the queue ends with an error event that carries what a
/// refused request's 503 body carries inside `error` — `retry_after_seconds`,
/// `queue_position`, `estimated_wait_seconds` — in both formats: the stream is already a
/// 200 with no `Retry-After` header to read (s25 final attack F2).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queued_streams_timeout_event_says_when_to_retry() {
    let app = Arc::new(spawn_app_with(queue_of(1, [0, 0, 0, 0], 10, 1)).await);
    let (_, token) = app.token("kit", Some("1")).await;
    let held = app.state.queue.admit(1, 0).await.expect("the free slot");
    let openai = json!({"model": "gpt-4o-mini", "max_tokens": 100, "stream": true,
                        "messages": [{"role": "user", "content": "waits too long"}]});
    for anthropic in [false, true] {
        let resp = if anthropic {
            app.messages(&token, &openai).await
        } else {
            app.chat(&token, &openai).await
        };
        let text = resp.text().await.unwrap();
        let data = text
            .split("\n\n")
            .filter_map(|e| e.lines().find_map(|l| l.strip_prefix("data: ")))
            .last()
            .unwrap_or_default();
        let event: Value = serde_json::from_str(data).unwrap_or_else(|_| panic!("{text}"));
        let error = &event["error"];
        assert_eq!(error["code"], "queue_timeout", "{text}");
        let kind = if anthropic {
            "overloaded_error"
        } else {
            "server_error"
        };
        assert_eq!(error["type"], kind, "{text}");
        assert!(error["retry_after_seconds"].as_u64().is_some(), "{text}");
        assert!(error["queue_position"].as_u64().is_some(), "{text}");
        assert!(error["estimated_wait_seconds"].as_u64().is_some(), "{text}");
    }
    drop(held);
}
