//! CHECKS L3: a soak with faults. ~100 requests a second for 40 s, half of them streamed,
//! half in Anthropic's format (translated), over four upstream keys whose mock injects seeded faults (2 % 503s, 1 % stream cuts, 1 %
//! malformed events); 1 % of clients vanish mid-stream, and three slow readers keep taking
//! long streams a little at a time. Token windows live in a real `redis-server`.
//! Afterwards: RSS about where it was after the warm-up, nothing reserved, one log row per
//! request, every Redis key with a TTL, and the gateway's CPU back to ~0 within seconds
//! (a busy loop fails the test).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use sluice::mock::{Faults, Script};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::helpers::*;
use crate::rig::*;

const SECONDS: u64 = 40;
const PER_SECOND: u64 = 100;
/// RSS is sampled at the end of the warm-up.
const WARM_UP: Duration = Duration::from_secs(10);
const SLOW_READERS: usize = 3;
const LONG_KEY: &str = "sk-soak-long-answers";
/// The longest `Retry-After` a 503 carried.
static RETRY_AFTER_MAX: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
/// CPU ticks a second (of 100 per core) under which the gateway counts as idle.
const IDLE_TICKS: u64 = 10;

fn extra(redis: &RedisServer, mock: &sluice::mock::MockServer) -> String {
    let mut s = format!(
        "[queue]\nmax_in_flight = 1000\nmax_depth = 1000\n[redis]\nurl = \"{}\"\n",
        redis.url()
    );
    let keys = [
        ("b", KEY_B),
        ("c", "sk-soak-key-c"),
        ("d", "sk-soak-key-d"),
        ("long", LONG_KEY),
    ];
    for (id, key) in keys {
        s += &format!(
            "[[upstreams]]\nid = \"{id}\"\nprovider = \"openai\"\nbase_url = \"{mock}/v1\"\n\
             api_key = \"{key}\"\nallow_private_network = true\nrpm_limit = 100000\ntpm_limit = 100000000\n",
            mock = mock.base_url()
        );
    }
    s += r#"
[[models]]
name = "soak"
routes = [{ upstream = "a", model = "soak" }, { upstream = "b", model = "soak" }, { upstream = "c", model = "soak" }, { upstream = "d", model = "soak" }]
input_usd_per_mtok = 0.15
output_usd_per_mtok = 0.60
[[models]]
name = "soak-long"
routes = [{ upstream = "long", model = "soak-long" }]
input_usd_per_mtok = 0.15
output_usd_per_mtok = 0.60
"#;
    s
}

#[derive(Debug, Default)]
struct Tally {
    sent: u64,
    answered: u64,
    streams_done: u64,
    streams_error_event: u64,
    vanished: u64,
    slow_reads: u64,
    upstream_errors: u64,
    failures: Vec<String>,
}

enum Kind {
    Plain,
    Stream,
    Vanish,
}

/// One client request, in OpenAI's format or (`anthropic`) Anthropic's, translated by the
/// gateway; `Err` is anything a client must never see.
async fn one(
    http: &reqwest::Client,
    gateway: &str,
    token: &str,
    kind: Kind,
    anthropic: bool,
) -> Result<&'static str, String> {
    let stream = !matches!(kind, Kind::Plain);
    let body = json!({"model": "soak", "max_tokens": 100, "stream": stream,
        "messages": [{"role": "user", "content": "Why does the engine light blink?"}]});
    let req = if anthropic {
        http.post(format!("{gateway}/v1/messages"))
            .header("x-api-key", token)
            .header("anthropic-version", "2023-06-01")
    } else {
        http.post(format!("{gateway}/v1/chat/completions"))
            .bearer_auth(token)
    };
    let mut resp = req
        .json(&body)
        .send()
        .await
        .map_err(|e| format!("no answer: {e}"))?;
    let status = resp.status().as_u16();
    let retry_after = resp
        .headers()
        .get("retry-after")
        .and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    if let Kind::Vanish = kind {
        if status == 200 {
            // One chunk, then the client is gone.
            let _ = resp.chunk().await;
            return Ok("vanished");
        }
    }
    let text = resp
        .text()
        .await
        .map_err(|e| format!("{status}: body broke: {e}"))?;
    let json = || serde_json::from_str::<Value>(&text).unwrap_or(Value::Null);
    match (status, stream) {
        (200, false) => {
            let v = json();
            let answer = if anthropic {
                &v["content"][0]["text"]
            } else {
                &v["choices"][0]["message"]["content"]
            };
            answer
                .is_string()
                .then_some("answered")
                .ok_or_else(|| format!("200 without an answer: {text}"))
        }
        (200, true) => {
            let last = text.trim_end().rsplit("\n\n").next().unwrap_or("");
            let done = if anthropic {
                last.starts_with("event: message_stop")
            } else {
                last == "data: [DONE]"
            };
            let error = if anthropic {
                last.starts_with("event: error") && last.contains("\"type\":\"error\"")
            } else {
                last.contains("\"error\"")
            };
            match (done, error) {
                (true, _) => Ok("stream done"),
                (_, true) => Ok("stream error event"),
                _ => Err(format!(
                    "a stream ended without its end or an error event: …{last}"
                )),
            }
        }
        // Every route failed (502) or was cooling down (503) at once: the gateway's own
        // error, in the client's format; a 503 says when to come back.
        (502 | 503, _) => {
            let v = json();
            let shaped = if anthropic {
                v["type"] == "error" && v["error"]["type"].is_string()
            } else {
                v.get("type").is_none() && v["error"]["type"] == "server_error"
            };
            let code = v["error"]["code"].as_str().unwrap_or("");
            let ok = shaped
                && match status {
                    502 => code == "upstream_error",
                    _ => {
                        code == "service_degraded"
                            && retry_after.is_some()
                            && v["error"]["retry_after_seconds"].as_u64() == retry_after
                    }
                };
            if status == 503 {
                RETRY_AFTER_MAX.fetch_max(retry_after.unwrap_or(0), Ordering::Relaxed);
            }
            ok.then_some("upstream error").ok_or_else(|| {
                format!("a {status} not in the client's format or without a matching Retry-After ({retry_after:?}): {text}")
            })
        }
        _ => Err(format!("{status}: {text}")),
    }
}

/// A client with a small receive buffer that takes a ~250 KB stream a few KB at a time
/// (~20 KB/s) to its end.
async fn slow_reader(gateway: &str, token: &str) -> Result<(), String> {
    let addr: std::net::SocketAddr = gateway.trim_start_matches("http://").parse().unwrap();
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    let mut conn = socket.connect(addr).await.map_err(|e| e.to_string())?;
    let body = json!({"model": "soak-long", "max_tokens": 2000, "stream": true,
        "messages": [{"role": "user", "content": "Tell me everything."}]})
    .to_string();
    let head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: {addr}\r\nauthorization: Bearer {token}\r\n\
         content-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
        body.len()
    );
    conn.write_all(head.as_bytes())
        .await
        .map_err(|e| e.to_string())?;
    conn.write_all(body.as_bytes())
        .await
        .map_err(|e| e.to_string())?;
    let mut got = Vec::new();
    let mut buf = [0u8; 2048];
    loop {
        let n = tokio::time::timeout(Duration::from_secs(30), conn.read(&mut buf))
            .await
            .map_err(|_| "a slow reader waited 30 s for a byte".to_string())?
            .map_err(|e| format!("slow reader: {e}"))?;
        if n == 0 {
            break;
        }
        got.extend_from_slice(&buf[..n]);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let text = String::from_utf8_lossy(&got);
    if text.starts_with("HTTP/1.1 200")
        && text.contains("data: [DONE]")
        && text.ends_with("0\r\n\r\n")
    {
        Ok(())
    } else {
        Err(format!(
            "a slow reader's stream ended badly ({} bytes): …{}",
            got.len(),
            &text[text.len().saturating_sub(200)..]
        ))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn l3_soak_with_faults_leaves_flat_rss_no_reservation_one_row_each_ttls_and_an_idle_cpu() {
    let _serial = one_at_a_time().await;
    let redis = RedisServer::start().await;
    let r = LoadRig::start_with(|m| extra(&redis, m), &[], 20, "20", Some(100_000)).await;
    let pid = r.pid();
    r.mock.state.sticky(
        "*",
        Some(Script {
            delay_ms: 10,
            chunk_delay_ms: 40,
            text: Some(
                "The engine light blinks when the catalytic converter is at risk. ".repeat(2),
            ),
            faults: Some(Faults {
                seed: 16,
                unavailable: 0.02,
                cut: 0.01,
                malformed: 0.01,
            }),
            ..Default::default()
        }),
    );
    r.mock.state.sticky(
        LONG_KEY,
        Some(Script {
            text: Some("word ".repeat(1500)),
            ..Default::default()
        }),
    );
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(120))
        .build()
        .unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let slow: Vec<_> = (0..SLOW_READERS)
        .map(|i| {
            let (gw, token, stop) = (r.gateway.url.clone(), r.tokens[i].clone(), stop.clone());
            tokio::spawn(async move {
                let mut results = Vec::new();
                while !stop.load(Ordering::Relaxed) {
                    results.push(slow_reader(&gw, &token).await);
                }
                results
            })
        })
        .collect();

    let started = Instant::now();
    let total = SECONDS * PER_SECOND;
    let mut tasks = Vec::with_capacity(total as usize);
    let mut warm_rss = None;
    for i in 0..total {
        let at = started + Duration::from_millis(i * 1000 / PER_SECOND);
        tokio::time::sleep_until(at.into()).await;
        if warm_rss.is_none() && started.elapsed() >= WARM_UP {
            warm_rss = Some(rss_mib(pid).0);
        }
        let kind = match i % 100 {
            0 => Kind::Vanish,
            n if n % 2 == 0 => Kind::Stream,
            _ => Kind::Plain,
        };
        // Half of each kind in Anthropic's format, through the translation.
        let anthropic = (i / 2) % 2 == 1;
        let (http, gateway, token) = (
            http.clone(),
            r.gateway.url.clone(),
            r.tokens[(i % 20) as usize].clone(),
        );
        tasks.push(tokio::spawn(async move {
            one(&http, &gateway, &token, kind, anthropic).await
        }));
    }
    stop.store(true, Ordering::Relaxed);
    let mut tally = Tally {
        sent: total,
        ..Default::default()
    };
    for t in tasks {
        match t.await.unwrap() {
            Ok("answered") => tally.answered += 1,
            Ok("stream done") => tally.streams_done += 1,
            Ok("stream error event") => tally.streams_error_event += 1,
            Ok("vanished") => tally.vanished += 1,
            Ok(_) => tally.upstream_errors += 1,
            Err(e) => tally.failures.push(e),
        }
    }
    for s in slow {
        for res in s.await.unwrap() {
            tally.sent += 1;
            match res {
                Ok(()) => tally.slow_reads += 1,
                Err(e) => tally.failures.push(e),
            }
        }
    }
    let load_ended = started.elapsed();
    let idle = until_idle(pid, IDLE_TICKS, 10).await;
    let (rss, peak) = rss_mib(pid);
    let warm_rss = warm_rss.expect("sampled after the warm-up");
    let upstream_calls = r.mock.state.total_count();
    let outcomes: Vec<(i64, Option<String>, i64)> = sqlx::query_as(
        "SELECT status, error_code, COUNT(*) FROM requests GROUP BY status, error_code ORDER BY 3 DESC",
    )
    .fetch_all(&r.db.sqlite().read)
    .await
    .unwrap();
    eprintln!(
        "L3: {} requests in {:.1} s ({} upstream calls): {tally:?}; logged (status, code, count) {outcomes:?}; \
         longest Retry-After on a 503 {} s; \
         RSS after warm-up {warm_rss} MiB, after the load {rss} MiB, peak {peak} MiB; CPU ticks/s after the load {idle:?}",
        tally.sent,
        load_ended.as_secs_f64(),
        upstream_calls,
        RETRY_AFTER_MAX.load(Ordering::Relaxed),
    );
    assert!(
        tally.failures.is_empty(),
        "{} requests failed as a client must never see; first: {:?}",
        tally.failures.len(),
        &tally.failures[..tally.failures.len().min(5)]
    );
    assert!(
        tally.slow_reads >= SLOW_READERS as u64,
        "every slow reader finished a stream"
    );
    let last = *idle.last().unwrap();
    assert!(
        last < IDLE_TICKS,
        "the gateway still uses {last} CPU ticks a second 10 s after the load (samples {idle:?}): a busy loop"
    );
    assert!(
        rss <= warm_rss * 3 / 2 + 16,
        "RSS grew from {warm_rss} MiB after the warm-up to {rss} MiB after the load (peak {peak} MiB)"
    );
    // Every key the windows wrote expires.
    let no_ttl = redis
        .cli(&[
            "EVAL",
            "local r = {} for _, k in ipairs(redis.call('KEYS', '*')) do \
             if redis.call('PTTL', k) < 0 then table.insert(r, k) end end return r",
            "0",
        ])
        .await
        .expect("redis-cli");
    let keys = redis.cli(&["DBSIZE"]).await.unwrap();
    assert!(
        keys.trim().parse::<u64>().unwrap() > 0,
        "the windows used Redis"
    );
    assert!(
        no_ttl.trim().is_empty(),
        "Redis keys without a TTL: {no_ttl}"
    );
    r.settled_and_logged(tally.sent as i64).await;
}
