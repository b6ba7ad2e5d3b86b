//! CHECKS L1: 200 concurrent clients over 20 tokens, the mock answering after 20 ms. Each
//! client alternates a direct call to the mock and the same call through the gateway, so
//! both see the same machine at the same moments; the gateway's added p99 is the
//! difference of the two p99s.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::Value;
use sluice::mock::Script;

use crate::helpers::*;
use crate::rig::*;

const CLIENTS: usize = 200;
const TOKENS: usize = 20;
/// Gateway calls per client (and as many direct ones): 200 × 50 = CHECKS' 10 000 through
/// the gateway, 20 000 requests in all.
const ROUNDS: usize = 50;
/// The bound on the added p99: `ADDED_P99_MS` plus `LOAD_FACTOR` × the direct p99, so the
/// allowance grows with how loaded the machine is, as the direct calls of the same run
/// measure it. Measured on the 2-core dev machine (debug build, other builds running):
/// quiet-ish, direct p99 90–180 ms and added 70–230 ms; at its busiest, direct 355 ms and
/// added 387 ms — the gateway's path is two hops and more CPU, so its p99 stays ~2 × the
/// direct one. A gateway serving one request at a time adds ~200 × 20 ms = 4 s; a worker
/// stuck in a busy loop leaves its connections unanswered (the 60 s client timeout, a
/// failure). The bound keeps 2.5–4 × the added p99 seen and stays far below 4 s.
const ADDED_P99_MS: f64 = 250.0;
const LOAD_FACTOR: f64 = 2.0;
/// The gateway's peak RSS bound: measured ~40–60 MiB (the debug build, 200 connections
/// each way, the tokenizer's tables); a per-request leak of a few KiB over 5 000 requests
/// or an unbounded buffer crosses it.
const PEAK_RSS_MIB: u64 = 200;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn l1_200_clients_20_tokens_no_error_small_added_p99_bounded_rss_exact_money() {
    let _serial = one_at_a_time().await;
    let r = LoadRig::start(
        // Admission wide enough for every client: this measures the gateway, not the queue.
        "[queue]\nmax_in_flight = 400\nmax_depth = 400\n",
        TOKENS,
        "10",
    )
    .await;
    r.mock.state.sticky(
        "*",
        Some(Script {
            delay_ms: 20,
            ..Default::default()
        }),
    );
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(CLIENTS * 2)
        .timeout(Duration::from_secs(60))
        .build()
        .unwrap();
    let gateway_url = format!("{}/v1/chat/completions", r.gateway.url);
    let direct_url = format!("{}/v1/chat/completions", r.mock.base_url());
    let tokens = Arc::new(r.tokens.clone());
    let started = Instant::now();
    let clients: Vec<_> = (0..CLIENTS)
        .map(|c| {
            let (http, gateway_url, direct_url, tokens) = (
                http.clone(),
                gateway_url.clone(),
                direct_url.clone(),
                tokens.clone(),
            );
            tokio::spawn(async move {
                let token = &tokens[c % TOKENS];
                let body = chat_body(50);
                let (mut direct, mut via, mut failures) = (Vec::new(), Vec::new(), Vec::new());
                for round in 0..ROUNDS {
                    // Alternate which goes first, so neither side always meets the other's wake.
                    for leg in [round % 2, 1 - round % 2] {
                        let (url, key) = if leg == 0 {
                            (&direct_url, KEY_A)
                        } else {
                            (&gateway_url, token.as_str())
                        };
                        let t = Instant::now();
                        let resp = http.post(url).bearer_auth(key).json(&body).send().await;
                        let outcome = match resp {
                            Ok(resp) => {
                                let status = resp.status().as_u16();
                                let text = resp.text().await.unwrap_or_default();
                                let content =
                                    serde_json::from_str::<Value>(&text).ok().and_then(|v| {
                                        v.pointer("/choices/0/message/content")?
                                            .as_str()
                                            .map(str::to_string)
                                    });
                                match (status, content) {
                                    (200, Some(c)) if !c.is_empty() => Ok(()),
                                    _ => Err(format!("{status} {}", &text[..text.len().min(300)])),
                                }
                            }
                            Err(e) => Err(format!("no answer: {e}")),
                        };
                        let took = t.elapsed();
                        match (outcome, leg) {
                            (Ok(()), 0) => direct.push(took),
                            (Ok(()), _) => via.push(took),
                            (Err(e), 0) => failures.push(format!("direct: {e}")),
                            (Err(e), _) => failures.push(format!("gateway: {e}")),
                        }
                    }
                }
                (direct, via, failures)
            })
        })
        .collect();
    let (mut direct, mut via, mut failures) = (Vec::new(), Vec::new(), Vec::new());
    for c in clients {
        let (d, v, f) = c.await.unwrap();
        direct.extend(d);
        via.extend(v);
        failures.extend(f);
    }
    let elapsed = started.elapsed();
    assert!(
        failures.is_empty(),
        "{} of {} requests failed; first: {:?}",
        failures.len(),
        CLIENTS * ROUNDS * 2,
        &failures[..failures.len().min(5)]
    );
    let (d50, d99) = (percentile(&mut direct, 50), percentile(&mut direct, 99));
    let (g50, g99) = (percentile(&mut via, 50), percentile(&mut via, 99));
    let (rss, peak) = rss_mib(r.pid());
    let added = ms(g99) - ms(d99);
    eprintln!(
        "L1: {} requests in {:.1} s; direct p50 {:.1} ms p99 {:.1} ms; gateway p50 {:.1} ms p99 {:.1} ms; \
         added p99 {added:.1} ms; gateway RSS {rss} MiB, peak {peak} MiB",
        CLIENTS * ROUNDS * 2,
        elapsed.as_secs_f64(),
        ms(d50),
        ms(d99),
        ms(g50),
        ms(g99)
    );
    let bound = ADDED_P99_MS + LOAD_FACTOR * ms(d99);
    assert!(
        added <= bound,
        "the gateway added {added:.1} ms at p99 (gateway p99 {:.1} ms, direct p99 {:.1} ms; \
         p50 {:.1} vs {:.1} ms), over the bound of {bound:.1} ms ({ADDED_P99_MS} + {LOAD_FACTOR} × direct p99)",
        ms(g99),
        ms(d99),
        ms(g50),
        ms(d50)
    );
    assert!(
        peak <= PEAK_RSS_MIB,
        "the gateway's peak RSS was {peak} MiB (now {rss} MiB), over {PEAK_RSS_MIB} MiB"
    );
    // Each gateway call reached the mock exactly once (no retry), besides the direct ones.
    assert_eq!(
        r.mock.state.total_count() as usize,
        CLIENTS * ROUNDS * 2,
        "upstream calls: direct + through the gateway"
    );
    r.settled_and_logged((CLIENTS * ROUNDS) as i64).await;
    let status_200 = r
        .scalar("SELECT COUNT(*) FROM requests WHERE status = 200")
        .await;
    assert_eq!(status_200, (CLIENTS * ROUNDS) as i64, "every row is a 200");
}
