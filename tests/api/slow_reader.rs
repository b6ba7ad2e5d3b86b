//! Slow readers (issue 16, failure 1), against the real binary: a raw TCP client with a
//! small receive buffer asks for a long, fast stream and reads a little of it slowly, so
//! the gateway's socket buffer fills and the stream blocks on it. Then it leaves — by
//! closing its socket, by half-closing and never reading again, or by just never reading
//! again (a peer that vanished without a reset looks the same). Each time the gateway must
//! give the stream up: close the upstream call, settle by the disconnect rule, write the
//! log row, and go back to idle (no busy loop, new requests answered).

use std::time::Duration;

use sluice::mock::{MockConfig, MockServer, Script};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::gateway_proc::{db_and_token, start_gateway_full, ticks_in_a_second, Gateway};
use crate::helpers::*;

/// The stall limit of the gateways that test it: a stream whose next frame cannot be
/// handed on for this long is given up.
const STALL_MS: u64 = 1000;

/// Whether the gateway's end of the connection from local port `client` still exists (in
/// any state but TIME_WAIT, which holds no socket of the process).
fn gateway_side_open(r: &Rig, client: u16) -> bool {
    let port = r.gateway.url.rsplit(':').next().unwrap();
    let local = format!(":{:04X}", port.parse::<u16>().unwrap());
    let remote = format!(":{client:04X}");
    let table = std::fs::read_to_string("/proc/net/tcp").unwrap();
    table.lines().skip(1).any(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        f[1].ends_with(&local) && f[2].ends_with(&remote) && f[3] != "06"
    })
}

async fn scalar(db: &sluice::store::Db, sql: &str) -> i64 {
    scalar_on(db, sql).await
}

struct Rig {
    _dir: tempfile::TempDir,
    mock: MockServer,
    gateway: Gateway,
    db: sluice::store::Db,
    token: String,
}

/// A gateway process (two workers, this stall limit) whose mock answers every request with
/// a long answer sent as fast as the gateway takes it: 100,000 events, ~15 MB.
async fn rig(stall_ms: u64) -> Rig {
    let dir = tempfile::tempdir().unwrap();
    let mock = MockServer::start("127.0.0.1:0", MockConfig::default()).unwrap();
    mock.state.sticky(
        KEY_A,
        Some(Script {
            text: Some("word ".repeat(100_000)),
            ..Default::default()
        }),
    );
    // `config_text` has its own `[upstream]` table: the timeout comes as an override.
    let stall = stall_ms.to_string();
    let env = [
        ("SLUICE_SERVER_WORKERS", "2"),
        ("SLUICE_UPSTREAM_STREAM_IDLE_TIMEOUT_MS", stall.as_str()),
    ];
    let gateway = start_gateway_full(dir.path(), &mock, &env, "").await;
    let (db, token) = db_and_token(dir.path(), "slow").await;
    Rig {
        _dir: dir,
        mock,
        gateway,
        db,
        token,
    }
}

/// Opens a connection (with this receive buffer, else the default), sends a streaming chat
/// request, checks the 200 head, then reads `reads` single bytes half a second apart: by
/// then the gateway's buffers are full and the stream is blocked on them.
async fn slow_read(r: &Rig, rcvbuf: Option<u32>, reads: usize) -> tokio::net::TcpStream {
    let mut conn = open_raw_stream(&r.gateway.url, &r.token, rcvbuf).await;
    let mut buf = [0u8; 1];
    for _ in 0..reads {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let n = conn.read(&mut buf).await.unwrap();
        assert!(n > 0, "the stream ended early");
    }
    assert!(
        scalar(&r.db, "SELECT reserved_micros FROM tokens").await > 0,
        "the stream holds its reservation while it is read"
    );
    conn
}

/// After the client left: the stream is settled as a departure, logged once, its upstream
/// call closed, the gateway idle, and new requests answered.
async fn assert_given_up(r: &Rig) {
    let mut settled = false;
    for _ in 0..300 {
        if scalar(&r.db, "SELECT reserved_micros FROM tokens").await == 0
            && scalar(&r.db, "SELECT COUNT(*) FROM requests").await == 1
        {
            settled = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let pid = r.gateway.child.id();
    assert!(
        settled,
        "30 s after the client left: reserved_micros = {}, request-log rows = {}, CPU ticks in 1 s = {}",
        scalar(&r.db, "SELECT reserved_micros FROM tokens").await,
        scalar(&r.db, "SELECT COUNT(*) FROM requests").await,
        ticks_in_a_second(pid).await,
    );
    let (status, code): (i64, Option<String>) =
        sql_row(&r.db, "SELECT status, error_code FROM requests").await;
    assert_eq!(
        (status, code.as_deref()),
        (200, Some("client_disconnected"))
    );
    assert_eq!(
        scalar(&r.db, "SELECT COUNT(*) FROM ledger WHERE kind = 'settle'").await,
        1
    );
    assert_invariant_on(&r.db).await;
    for _ in 0..100 {
        if r.mock.state.stats(KEY_A).in_flight == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        r.mock.state.stats(KEY_A).in_flight,
        0,
        "the upstream call is closed"
    );

    // No traffic now: the gateway goes idle (a busy loop burns ~100 ticks a second). A
    // connection actix-http spins on is dropped only when the kernel gives it up
    // (TCP_USER_TIMEOUT, counted from its zero-window probes), a little after the stall
    // limit: so idle within a bound, not at once. The old code spun for good.
    let mut ticks = ticks_in_a_second(pid).await;
    for _ in 0..15 {
        if ticks < 20 {
            break;
        }
        ticks = ticks_in_a_second(pid).await;
    }
    assert!(
        ticks < 20,
        "the idle gateway used {ticks} CPU ticks in 1 s, 15 s on"
    );

    // New requests on new connections (so on both workers) are answered.
    r.mock.state.sticky(KEY_A, None);
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .build()
        .unwrap();
    for _ in 0..4 {
        let resp = http
            .post(format!("{}/v1/chat/completions", r.gateway.url))
            .bearer_auth(&r.token)
            .json(&chat_body(100))
            .timeout(Duration::from_secs(30))
            .send()
            .await
            .expect("a new request is answered");
        assert_eq!(resp.status(), 200);
        let v: serde_json::Value = resp.json().await.unwrap();
        assert!(v["choices"][0]["message"]["content"].is_string(), "{v}");
    }
}

/// Passed on the old code too: a close with unread bytes makes the kernel send a reset,
/// which actix-http's read sees at once (the default stall limit, 60 s, is never reached).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_reader_that_closes_its_socket_is_settled_and_the_gateway_goes_idle() {
    let r = rig(60_000).await;
    let conn = slow_read(&r, Some(4096), 6).await;
    drop(conn);
    assert_given_up(&r).await;
}

/// Passed on the old code too: as above with the default receive buffer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_reader_with_a_default_buffer_that_closes_is_settled() {
    let r = rig(60_000).await;
    let conn = slow_read(&r, None, 6).await;
    drop(conn);
    assert_given_up(&r).await;
}

/// A client that stops reading and never closes (or whose machine vanished without a
/// reset): the stream is blocked on a full socket buffer for good. Before, the pump waited
/// on it forever, holding the reservation, the upstream call and the slots.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_that_stops_reading_for_good_is_given_up_after_the_stall_limit() {
    let r = rig(STALL_MS).await;
    let mut conn = slow_read(&r, Some(4096), 0).await;
    assert_given_up(&r).await;
    // If it reads again, what was buffered arrives and then the connection is cut: the
    // body never ends as if the stream were complete.
    let mut rest = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(30), conn.read_to_end(&mut rest))
        .await
        .expect("the connection ends");
    assert!(!rest.is_empty());
    assert!(!rest.windows(6).any(|w| w == b"[DONE]"), "no [DONE]");
    assert!(
        !rest.ends_with(b"\r\n0\r\n\r\n"),
        "the chunked body is cut, not terminated"
    );
}

/// A client that half-closes (FIN) and never reads again: actix-http stops polling the
/// body once the read side closes and only tries to flush, which never ends. Before, the
/// stream was never settled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_reader_that_half_closes_and_stops_reading_is_given_up() {
    let r = rig(STALL_MS).await;
    let mut conn = slow_read(&r, Some(4096), 0).await;
    conn.shutdown().await.unwrap();
    assert_given_up(&r).await;
    // actix-http only flushes a half-closed connection and never polls its body again, so
    // the gateway lets go of the connection only through the kernel's timeout on
    // unacknowledged data: its side of the connection is gone, with nothing read.
    let ours = conn.local_addr().unwrap().port();
    let mut held = true;
    for _ in 0..300 {
        held = gateway_side_open(&r, ours);
        if !held {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        !held,
        "the gateway still holds the connection 30 s after giving it up"
    );
    drop(conn);
}

/// A stream blocked on a full socket buffer while the same connection pipelines more
/// requests than actix-http queues (16) and more bytes than it reads ahead (128 KiB), and
/// then never reads: actix-http 3.20's dispatcher stops reading and wakes itself at once,
/// forever — a worker at 100 % for as long as the client holds the connection (92 ticks a
/// second here on the old code, the stream never settled). Now the pump gives the stream
/// up after the stall limit and the body, polled by that spinning dispatcher, ends with an
/// error, which closes the connection; the kernel's timeout on unacknowledged data is the
/// backstop when the dispatcher no longer polls the body.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blocked_stream_with_pipelined_requests_stops_spinning_after_the_stall_limit() {
    let r = rig(STALL_MS).await;
    let mut conn = slow_read(&r, Some(4096), 0).await;
    let pad = "x".repeat(8000);
    let more: String = (0..40)
        .map(|_| format!("GET /healthz HTTP/1.1\r\nhost: a\r\nx-pad: {pad}\r\n\r\n"))
        .collect();
    conn.write_all(more.as_bytes()).await.unwrap();
    assert_given_up(&r).await;
    drop(conn);
}

/// Waiting on the upstream (the body pending, nothing to write): a client that half-closes
/// and keeps its socket ends the stream at once, long before the stall limit. Passed on the
/// old code too (`h1_allow_half_closed(false)`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_half_closes_while_the_upstream_is_slow_ends_the_stream_at_once() {
    let r = rig(60_000).await;
    r.mock.state.sticky(
        KEY_A,
        Some(Script {
            text: Some("word ".repeat(50)),
            chunk_delay_ms: 2000,
            ..Default::default()
        }),
    );
    let mut conn = slow_read(&r, None, 0).await;
    conn.shutdown().await.unwrap();
    assert_given_up(&r).await;
    drop(conn);
}

/// Review finding (s16c #3), the gone client's side: a client that leaves at the finish
/// (`finish_reason`) of a stream whose upstream then sends nothing — no usage, no end — left
/// a whole answer. The gateway reads on for the usage at most `stream::AFTER_THE_FINISH`
/// (2 s; the idle timeout here is a minute) without spinning on the closed client, then
/// settles it on the estimate, `usage_estimated`, not as a departure, and closes the
/// upstream call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_leaves_at_the_finish_of_a_stalled_stream_is_settled_without_spinning() {
    let r = rig(60_000).await;
    let chunk = |choices: serde_json::Value| {
        sluice::mock::SseEvent::Data(serde_json::json!({"id": "c",
            "object": "chat.completion.chunk", "created": 1, "model": "m", "choices": choices}))
    };
    r.mock.state.sticky(
        KEY_A,
        Some(Script {
            events: Some(vec![
                chunk(
                    serde_json::json!([{"index": 0, "delta": {"content": "The engine "},
                    "finish_reason": null}]),
                ),
                chunk(serde_json::json!([{"index": 0, "delta": {}, "finish_reason": "stop"}])),
                sluice::mock::SseEvent::Data(serde_json::json!("[DONE]")),
            ]),
            // Nothing after the finish, the connection kept.
            stall_after: Some(2),
            ..Default::default()
        }),
    );
    let mut body = chat_body(100);
    body["stream"] = true.into();
    let mut conn = send_raw_chat(&r.gateway.url, &r.token, &body, None).await;
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    tokio::time::timeout(Duration::from_secs(10), async {
        while !String::from_utf8_lossy(&got).contains("\"finish_reason\":\"stop\"") {
            let n = conn.read(&mut buf).await.unwrap();
            assert!(n > 0, "closed before the finish");
            got.extend_from_slice(&buf[..n]);
        }
    })
    .await
    .expect("the finish never came");
    drop(conn);
    let left = std::time::Instant::now();
    // Within the 2 s the pump reads on: the gateway waits, it does not spin.
    let pid = r.gateway.child.id();
    let ticks = ticks_in_a_second(pid).await;
    assert!(ticks < 20, "{ticks} CPU ticks in 1 s after the client left");
    let mut settled = false;
    for _ in 0..100 {
        if scalar(&r.db, "SELECT reserved_micros FROM tokens").await == 0
            && scalar(&r.db, "SELECT COUNT(*) FROM requests").await == 1
        {
            settled = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        settled,
        "not settled {:?} after the client left",
        left.elapsed()
    );
    let (code, input, output): (Option<String>, i64, i64) = sql_row(
        &r.db,
        "SELECT error_code, input_tokens, output_tokens FROM requests",
    )
    .await;
    let counted =
        sluice::quota::estimate::chat_input(chat_body(100)["messages"].as_array().unwrap(), None);
    assert_eq!(
        (code.as_deref(), input, output),
        (
            Some("usage_estimated"),
            counted,
            sluice::quota::estimate::count_text("The engine ")
        )
    );
    assert_invariant_on(&r.db).await;
    // The gateway's connection to the upstream is closed (the mock, sleeping in its stall,
    // notices no earlier than its next write).
    for _ in 0..100 {
        if established_to(r.mock.port) == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        established_to(r.mock.port),
        0,
        "the upstream call is closed"
    );
}
