//! CHECKS L5: more concurrent requests than the admission gate lets through, in both wire
//! formats and streamed. The excess waits and completes, or is refused with a 503 in the
//! client's format carrying `Retry-After` — the full queue's refusals at once, before any
//! upstream call could have ended — never a hang or another 5xx; `/healthz` stays 200.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use sluice::mock::{MockState, Script};

use crate::helpers::*;
use crate::rig::*;

const IN_FLIGHT: usize = 4;
const DEPTH: usize = 8;
const CLIENTS: usize = 60;
/// The upstream holds each answer this long: a refusal that waited for a slot to free
/// would come after it.
const UPSTREAM_MS: u64 = 4000;

#[derive(Debug)]
struct Seen {
    kind: &'static str,
    status: u16,
    retry_after: Option<String>,
    body: String,
    /// Upstream calls already finished when the answer's head arrived.
    finished_upstream: u64,
    after: Duration,
}

fn finished(mock: &MockState) -> u64 {
    let s = mock.stats(KEY_A);
    s.count - s.in_flight
}

async fn call(
    http: reqwest::Client,
    base: String,
    token: String,
    kind: &'static str,
    mock: Arc<MockState>,
) -> Result<Seen, String> {
    let t = Instant::now();
    let q = "Why does the engine light blink?";
    let req = match kind {
        "openai" => http
            .post(format!("{base}/v1/chat/completions"))
            .json(&json!({"model": "gpt-4o-mini", "max_tokens": 50, "messages": [{"role": "user", "content": q}]})),
        "anthropic" => http
            .post(format!("{base}/v1/messages"))
            .header("anthropic-version", "2023-06-01")
            .json(&json!({"model": "gpt-4o-mini", "max_tokens": 50, "messages": [{"role": "user", "content": q}]})),
        _ => http.post(format!("{base}/v1/chat/completions")).json(
            &json!({"model": "gpt-4o-mini", "max_tokens": 50, "stream": true, "messages": [{"role": "user", "content": q}]}),
        ),
    };
    let resp = req
        .bearer_auth(token)
        .send()
        .await
        .map_err(|e| format!("{kind}: no answer: {e}"))?;
    let finished_upstream = finished(&mock);
    let status = resp.status().as_u16();
    let retry_after = resp
        .headers()
        .get("retry-after")
        .map(|v| v.to_str().unwrap_or("?").to_string());
    let body = resp
        .text()
        .await
        .map_err(|e| format!("{kind}: body broke: {e}"))?;
    Ok(Seen {
        kind,
        status,
        retry_after,
        body,
        finished_upstream,
        after: t.elapsed(),
    })
}

/// What a refusal must look like: the client's error shape, a queue code, a position and
/// a `Retry-After` that agrees with the body.
fn check_refusal(s: &Seen) -> Result<&'static str, String> {
    let v: Value = serde_json::from_str(&s.body).map_err(|_| format!("not JSON: {s:?}"))?;
    let err = &v["error"];
    let code = err["code"].as_str().unwrap_or("");
    let code = match code {
        "queue_full" => "queue_full",
        "queue_timeout" => "queue_timeout",
        _ => return Err(format!("a 503 that is not the queue's: {s:?}")),
    };
    let shape_ok = match s.kind {
        "anthropic" => v["type"] == "error" && err["type"] == "overloaded_error",
        _ => v.get("type").is_none() && err["type"] == "server_error",
    };
    let after = s.retry_after.as_deref().and_then(|a| a.parse::<u64>().ok());
    if !shape_ok
        || after.is_none()
        || err["retry_after_seconds"].as_u64() != after
        || !err["queue_position"].is_u64()
        || err["message"].as_str().is_none_or(str::is_empty)
    {
        return Err(format!("a malformed refusal: {s:?}"));
    }
    Ok(code)
}

/// A 200 that is a whole answer in its format (a stream ends with `[DONE]`).
fn check_answer(s: &Seen) -> Result<(), String> {
    let ok = match s.kind {
        "stream" => s.body.trim_end().ends_with("data: [DONE]") && !s.body.contains("\"error\""),
        "anthropic" => serde_json::from_str::<Value>(&s.body).is_ok_and(|v| {
            v["content"][0]["text"]
                .as_str()
                .is_some_and(|t| !t.is_empty())
        }),
        _ => serde_json::from_str::<Value>(&s.body).is_ok_and(|v| {
            v["choices"][0]["message"]["content"]
                .as_str()
                .is_some_and(|t| !t.is_empty())
        }),
    };
    ok.then_some(())
        .ok_or_else(|| format!("a broken answer: {s:?}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn l5_excess_requests_queue_and_complete_or_get_a_quick_503_with_retry_after() {
    let _serial = one_at_a_time().await;
    let extra = format!(
        "[queue]\nmax_in_flight = {IN_FLIGHT}\nmax_depth = {DEPTH}\nmax_wait_seconds = 6\n\
         reserved = {{ critical = 0, high = 0, normal = 0, low = 0 }}\n"
    );
    let r = LoadRig::start(&extra, 4, "10").await;
    r.mock.state.sticky(
        "*",
        Some(Script {
            delay_ms: UPSTREAM_MS,
            ..Default::default()
        }),
    );
    let done = Arc::new(AtomicBool::new(false));
    let health = {
        let (url, done) = (format!("{}/healthz", r.gateway.url), done.clone());
        tokio::spawn(async move {
            let http = reqwest::Client::new();
            let mut statuses = Vec::new();
            while !done.load(Ordering::Relaxed) {
                let s = match http.get(&url).timeout(Duration::from_secs(10)).send().await {
                    Ok(r) => r.status().as_u16(),
                    Err(_) => 0,
                };
                statuses.push(s);
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            statuses
        })
    };
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(60))
        .build()
        .unwrap();
    let kinds = ["openai", "anthropic", "stream"];
    let calls: Vec<_> = (0..CLIENTS)
        .map(|i| {
            tokio::spawn(call(
                http.clone(),
                r.gateway.url.clone(),
                r.tokens[i % 4].clone(),
                kinds[i % 3],
                r.mock.state.clone(),
            ))
        })
        .collect();
    let mut seen = Vec::new();
    for c in calls {
        seen.push(c.await.unwrap().unwrap_or_else(|e| panic!("{e}")));
    }
    done.store(true, Ordering::Relaxed);
    let (mut answered, mut full, mut timed_out) = (0, 0, 0);
    let mut problems = Vec::new();
    for s in &seen {
        match s.status {
            200 if s.kind == "stream" && s.body.contains("queue_timeout") => {
                // A queued stream is open at once (`: queued` comments); its refusal is an
                // error event in the stream.
                timed_out += 1;
                if s.body.contains("[DONE]") {
                    problems.push(format!("a refused stream ended with [DONE]: {s:?}"));
                }
            }
            200 => match check_answer(s) {
                Ok(()) => answered += 1,
                Err(e) => problems.push(e),
            },
            503 => match check_refusal(s) {
                Ok("queue_full") => {
                    full += 1;
                    if s.finished_upstream > 0 {
                        problems.push(format!(
                            "a full queue's refusal came only after an upstream call ended ({:?} in): {s:?}",
                            s.after
                        ));
                    }
                }
                Ok(_) => timed_out += 1,
                Err(e) => problems.push(e),
            },
            _ => problems.push(format!("neither an answer nor the queue's 503: {s:?}")),
        }
    }
    let full_after = seen
        .iter()
        .filter(|s| s.status == 503 && s.body.contains("queue_full"))
        .map(|s| s.after)
        .max()
        .unwrap_or_default();
    let stats = r.mock.state.stats(KEY_A);
    eprintln!(
        "L5: {CLIENTS} at once, gate {IN_FLIGHT} + queue {DEPTH}: {answered} answered, {full} queue_full \
         (the last after {:.0} ms), {timed_out} queue_timeout; upstream max concurrency {}",
        ms(full_after),
        stats.max_concurrency
    );
    assert!(problems.is_empty(), "{problems:#?}");
    assert!(
        (IN_FLIGHT..=IN_FLIGHT + DEPTH).contains(&answered),
        "{answered} answered: the gate's slots and at most the queue's depth"
    );
    assert!(
        full >= CLIENTS - IN_FLIGHT - DEPTH,
        "{full} refused as queue_full; at least {} did not fit",
        CLIENTS - IN_FLIGHT - DEPTH
    );
    assert!(
        stats.max_concurrency as usize <= IN_FLIGHT,
        "the upstream saw {} at once through a gate of {IN_FLIGHT}",
        stats.max_concurrency
    );
    let health = health.await.unwrap();
    assert!(
        !health.is_empty() && health.iter().all(|s| *s == 200),
        "/healthz during the load: {health:?}"
    );
    r.settled_and_logged(CLIENTS as i64).await;
}
