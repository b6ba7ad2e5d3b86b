//! CHECKS L2: 1 000 concurrent streams, one event every 100 ms for ~20 s. Every stream
//! reaches its client byte for byte as the mock sent it (the same script streamed directly
//! from the mock, at the same time, is the reference); `/healthz` answers throughout; the
//! gateway's file descriptors go back to their baseline afterwards.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;
use sluice::mock::{Script, SseEvent};

use crate::helpers::*;
use crate::rig::*;

const STREAMS: usize = 1000;
/// Content events per stream; with the 100 ms pace, ~20 s a stream.
const EVENTS: usize = 200;
const PACE_MS: u64 = 100;
/// `/healthz`'s bound while the gateway carries every stream. Measured: worst 100–370 ms on
/// the loaded 2-core dev machine, 595 ms at its busiest; a worker blocked or spinning for
/// two seconds fails it.
const HEALTHZ_MS: f64 = 2000.0;

/// Fixed ids and times, so the bytes of every answer are the same.
fn script() -> Script {
    let chunk = |delta: serde_json::Value, finish: serde_json::Value| {
        SseEvent::Data(
            json!({"id": "chatcmpl-load", "object": "chat.completion.chunk", "created": 1_700_000_000,
            "model": "gpt-4o-mini", "choices": [{"index": 0, "delta": delta, "logprobs": null, "finish_reason": finish}]}),
        )
    };
    let mut events = vec![chunk(
        json!({"role": "assistant", "content": ""}),
        json!(null),
    )];
    for i in 0..EVENTS {
        events.push(chunk(json!({"content": format!("w{i} ")}), json!(null)));
    }
    events.push(chunk(json!({}), json!("stop")));
    events.push(SseEvent::Data(json!({"id": "chatcmpl-load", "object": "chat.completion.chunk", "created": 1_700_000_000,
        "model": "gpt-4o-mini", "choices": [], "usage": {"prompt_tokens": 12, "completion_tokens": EVENTS, "total_tokens": 12 + EVENTS}})));
    events.push(SseEvent::Data(json!("[DONE]")));
    Script {
        events: Some(events),
        chunk_delay_ms: PACE_MS,
        ..Default::default()
    }
}

async fn stream(http: &reqwest::Client, url: &str, key: &str) -> Result<Vec<u8>, String> {
    let body = json!({"model": "gpt-4o-mini", "max_tokens": 300, "stream": true,
        "stream_options": {"include_usage": true},
        "messages": [{"role": "user", "content": "Why does the engine light blink?"}]});
    post_for_200(http, url, key, &body).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn l2_1000_streams_arrive_byte_identical_healthz_answers_fds_return() {
    let _serial = one_at_a_time().await;
    // Each stream is two sockets here (client, in-process mock) and two in the gateway.
    assert!(
        open_file_limit() >= 3 * STREAMS as u64,
        "the open-file limit ({}) is too low for {STREAMS} streams: raise the hard limit \
         (ulimit -Hn) to at least {}",
        open_file_limit(),
        3 * STREAMS
    );
    let r = LoadRig::start(
        "[queue]\nmax_in_flight = 2000\nmax_depth = 2000\n",
        20,
        "10",
    )
    .await;
    let pid = r.pid();
    // A warm-up request opens what the gateway keeps open (database pool, log file).
    r.mock.state.sticky("*", None);
    let warm = r.gateway.url.clone();
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .timeout(Duration::from_secs(120))
        .build()
        .unwrap();
    let resp = http
        .post(format!("{warm}/v1/chat/completions"))
        .bearer_auth(&r.tokens[0])
        .json(&chat_body(10))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    drop(resp);
    let baseline = fds(pid);
    r.mock.state.sticky("*", Some(script()));

    let done = Arc::new(AtomicBool::new(false));
    let health = {
        let (url, done) = (format!("{}/healthz", r.gateway.url), done.clone());
        tokio::spawn(async move {
            let http = reqwest::Client::new();
            let mut samples = Vec::new();
            while !done.load(Ordering::Relaxed) {
                let t = Instant::now();
                let status = match http.get(&url).timeout(Duration::from_secs(30)).send().await {
                    Ok(r) => r.status().as_u16(),
                    Err(_) => 0,
                };
                samples.push((status, t.elapsed()));
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
            samples
        })
    };

    let started = Instant::now();
    let gateway_url = format!("{}/v1/chat/completions", r.gateway.url);
    let direct = {
        let (http, url) = (
            http.clone(),
            format!("{}/v1/chat/completions", r.mock.base_url()),
        );
        tokio::spawn(async move { stream(&http, &url, KEY_A).await })
    };
    let streams: Vec<_> = (0..STREAMS)
        .map(|i| {
            let (http, url, token) = (http.clone(), gateway_url.clone(), r.tokens[i % 20].clone());
            tokio::spawn(async move { stream(&http, &url, &token).await })
        })
        .collect();
    // While they run: every stream holds a connection each way.
    let mut peak_fds = 0;
    while !streams.iter().all(|s| s.is_finished()) && started.elapsed() < Duration::from_secs(180) {
        peak_fds = peak_fds.max(fds(pid));
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let reference = direct.await.unwrap().expect("the direct stream");
    assert!(reference.ends_with(b"data: [DONE]\n\n"));
    let mut failures = Vec::new();
    for (i, s) in streams.into_iter().enumerate() {
        match s.await.unwrap() {
            Ok(bytes) if bytes == reference => {}
            Ok(bytes) => failures.push(format!(
                "stream {i}: {} bytes differ from the mock's {} (first difference at byte {:?})",
                bytes.len(),
                reference.len(),
                bytes.iter().zip(&reference).position(|(a, b)| a != b)
            )),
            Err(e) => failures.push(format!("stream {i}: {e}")),
        }
    }
    let elapsed = started.elapsed();
    done.store(true, Ordering::Relaxed);
    let health = health.await.unwrap();
    let (rss, peak_rss) = rss_mib(pid);
    let worst = health.iter().map(|(_, d)| *d).max().unwrap_or_default();
    eprintln!(
        "L2: {STREAMS} streams of {} bytes in {:.1} s; /healthz {} polls, worst {:.1} ms; \
         fds baseline {baseline}, peak {peak_fds}; RSS {rss} MiB, peak {peak_rss} MiB; open-file limit {}",
        reference.len(),
        elapsed.as_secs_f64(),
        health.len(),
        ms(worst),
        open_file_limit()
    );
    assert!(
        failures.is_empty(),
        "{} of {STREAMS} streams were not what the mock sent; first: {:?}",
        failures.len(),
        &failures[..failures.len().min(5)]
    );
    let bad: Vec<_> = health.iter().filter(|(s, _)| *s != 200).collect();
    assert!(bad.is_empty(), "/healthz failed during the load: {bad:?}");
    assert!(
        ms(worst) <= HEALTHZ_MS,
        "/healthz took {:.1} ms at worst during the load (bound {HEALTHZ_MS} ms)",
        ms(worst)
    );
    assert!(
        peak_fds >= STREAMS,
        "the streams were concurrent: the gateway held {peak_fds} descriptors at peak"
    );
    // Idle connections close (the mock's and the gateway's keep-alive, 5 s): back to the
    // baseline, bounded.
    drop(http);
    let mut now = fds(pid);
    for _ in 0..300 {
        if now <= baseline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        now = fds(pid);
    }
    assert!(
        now <= baseline,
        "30 s after the streams: {now} descriptors open, baseline {baseline} (peak {peak_fds})"
    );
    r.settled_and_logged(STREAMS as i64 + 1).await;
    let clean = r
        .scalar("SELECT COUNT(*) FROM requests WHERE status = 200 AND error_code IS NULL")
        .await;
    assert_eq!(
        clean,
        STREAMS as i64 + 1,
        "every stream logged as a clean 200"
    );
}
