//! Graceful shutdown with stuck and slow clients connected (issue 16), against the real
//! binary: SIGTERM while a slow reader holds a stream blocked on its socket buffer, a
//! client sits half-closed, a normal client reads a long stream, and a non-streamed
//! request waits on an upstream that holds its headers for an hour. The process must exit
//! within `server.shutdown_timeout_seconds` plus a margin, and leave everything settled:
//! nothing reserved, one log row for each request, each charged by its rule — the stream
//! still running at the timeout is cut with an error event (`shutting_down`) and charged
//! the input plus the output it received, the waiting request gets a 503 and pays its
//! input (the upstream had it), the half-closed client is settled as a departure.

use std::process::ExitStatus;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use sluice::mock::{MockConfig, MockServer, Script};
use tokio::io::AsyncWriteExt;

use crate::gateway_proc::{db_and_token, dir_database_url, Gateway};
use crate::helpers::*;
use crate::processes::start_gateway_full;

mod answered;
mod cut;
mod whole;

pub(super) const SHUTDOWN_TIMEOUT_S: u64 = 2;

/// A streamed chat request (`max_tokens`) through reqwest, its 200 checked, read to its end
/// in a task: (the `data:` payloads, whether the body ended cleanly).
async fn read_stream(
    http: &reqwest::Client,
    url: &str,
    token: &str,
    max_tokens: i64,
) -> tokio::task::JoinHandle<(Vec<String>, bool)> {
    let mut body = chat_body(max_tokens);
    body["stream"] = json!(true);
    let resp = http
        .post(format!("{url}/v1/chat/completions"))
        .bearer_auth(token)
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    tokio::spawn(sse_data(resp))
}

/// Reads an SSE body into its `data:` payloads, as `sse_data`, publishing how many have
/// arrived as they do: a test waits for the client to have read them, not a fixed time.
pub(super) fn sse_data_counted(
    mut resp: reqwest::Response,
) -> (
    tokio::task::JoinHandle<(Vec<String>, bool)>,
    std::sync::Arc<std::sync::atomic::AtomicUsize>,
) {
    use std::sync::atomic::Ordering;
    let read = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counter = read.clone();
    let task = tokio::spawn(async move {
        let mut text = String::new();
        let whole = loop {
            match resp.chunk().await {
                Ok(Some(bytes)) => {
                    text.push_str(&String::from_utf8_lossy(&bytes));
                    let events = text.split("\n\n").collect::<Vec<_>>();
                    // The last piece is an event not yet ended.
                    let done = events[..events.len() - 1]
                        .iter()
                        .filter(|e| e.starts_with("data: "))
                        .count();
                    counter.store(done, Ordering::Release);
                }
                Ok(None) => break true,
                Err(_) => break false,
            }
        };
        let data = text
            .split("\n\n")
            .filter_map(|e| e.strip_prefix("data: "))
            .map(str::to_string)
            .collect();
        (data, whole)
    });
    (task, read)
}

/// SIGTERM to the gateway process, by `kill` as an operator would send it.
pub(super) fn sigterm(gateway: &Gateway) {
    signal(gateway, "-TERM");
}

fn signal(gateway: &Gateway, which: &str) {
    let killed = std::process::Command::new("kill")
        .args([which, &gateway.child.id().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
}

/// The gateway process's exit status (polled); still running at `deadline`, it is killed
/// and the test fails with `what`.
pub(super) async fn exited(gateway: &mut Gateway, deadline: Instant, what: &str) -> ExitStatus {
    loop {
        if let Some(status) = gateway.child.try_wait().unwrap() {
            return status;
        }
        if Instant::now() > deadline {
            let _ = gateway.child.kill();
            panic!("{what}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// SIGTERM with another writer holding the store (`hold_the_store`) from just before it
/// until 6 s after — past the drain and the workers' stop — then the exit status, the
/// process given 30 s once the store came back.
pub(super) async fn stopped_with_the_store_held(
    gateway: &mut Gateway,
    dir: &std::path::Path,
) -> ExitStatus {
    let other = hold_the_store(&dir_database_url(dir)).await;
    sigterm(gateway);
    tokio::time::sleep(Duration::from_secs(6)).await;
    other.release().await;
    exited(
        gateway,
        Instant::now() + Duration::from_secs(30),
        "still running 30 s after the store came back",
    )
    .await
}

/// After the gateway on `db` stopped: the money invariant holds, nothing is reserved, and
/// nothing was settled as an orphan — every request by its own rule.
pub(super) async fn settled_by_their_rules(db: &sluice::store::Db, what: &str) {
    assert_invariant_on(db).await;
    assert_eq!(
        scalar_on(db, "SELECT COUNT(*) FROM reservations").await,
        0,
        "{what}"
    );
    assert_eq!(
        scalar_on(db, "SELECT COUNT(*) FROM ledger WHERE kind = 'orphan'").await,
        0,
        "{what}: settled by its own rule, not as an orphan"
    );
}

pub(super) async fn until(what: &str, mut done: impl FnMut() -> bool) {
    let bound = Instant::now() + Duration::from_secs(10);
    while !done() {
        assert!(Instant::now() < bound, "{what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Waits (bounded) until the mock has had the test's one request: its stream has started.
async fn started(mock: &MockServer) {
    let state = mock.state.clone();
    until("the stream never started", move || {
        state.stats(KEY_A).count == 1
    })
    .await;
}

/// The mock's next answer on `KEY_A`: `text` streamed one chunk every 100 ms.
fn script_slow_stream(mock: &MockServer, text: String) {
    mock.state.script(
        KEY_A,
        [Script {
            text: Some(text),
            chunk_delay_ms: 100,
            ..Default::default()
        }],
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_with_stuck_and_slow_clients_exits_in_time_and_settles_everything() {
    let dir = tempfile::tempdir().unwrap();
    let mock = MockServer::start("127.0.0.1:0", MockConfig::default()).unwrap();
    let gateway = draining_gateway(&dir, &mock).await;
    let (db, token) = db_and_token(dir.path(), "shut").await;
    let state = mock.state.clone();
    let seen = |n: u64| {
        let state = state.clone();
        move || state.stats(KEY_A).count == n
    };

    // 1. A slow reader: a long, fast stream into a 4 KiB receive buffer, read no more.
    mock.state.script(
        KEY_A,
        [Script {
            text: Some("word ".repeat(100_000)),
            ..Default::default()
        }],
    );
    let slow = open_raw_stream(&gateway.url, &token, Some(4096)).await;
    until("the slow reader's stream never started", seen(1)).await;

    // 2. A client that half-closes and keeps its socket.
    mock.state.script(
        KEY_A,
        [Script {
            chunk_delay_ms: 2000,
            ..Default::default()
        }],
    );
    let mut half = open_raw_stream(&gateway.url, &token, None).await;
    half.shutdown().await.unwrap();
    until("the half-closed client's stream never started", seen(2)).await;

    // 3. A normal client reading a stream that would take 30 s.
    script_slow_stream(&mock, "word ".repeat(300));
    let http = reqwest::Client::new();
    let normal = read_stream(&http, &gateway.url, &token, 400).await;
    until("the normal stream never started", seen(3)).await;

    // 4. A non-streamed request whose upstream holds its headers for an hour.
    let waiting = held_chat(&mock, &http, &gateway.url, &token);
    until("the waiting request never reached the upstream", seen(4)).await;

    // SIGTERM; the process must be gone within the shutdown timeout plus a margin.
    let mut gateway = gateway;
    let sent = Instant::now();
    sigterm(&gateway);
    let bound = Duration::from_secs(SHUTDOWN_TIMEOUT_S + 10);
    let still = format!("still running {bound:?} after SIGTERM");
    let status = exited(&mut gateway, sent + bound, &still).await;
    let took = sent.elapsed();
    assert!(status.success(), "{status:?}");
    assert!(
        took >= Duration::from_secs(SHUTDOWN_TIMEOUT_S),
        "the streams had their {SHUTDOWN_TIMEOUT_S} s ({took:?})"
    );
    eprintln!("exited {took:?} after SIGTERM");

    // The normal client: what it got, then the gateway's error event, never [DONE].
    let (data, _) = tokio::time::timeout(Duration::from_secs(10), normal)
        .await
        .expect("the normal stream ended")
        .unwrap();
    assert!(!data.is_empty());
    assert!(!data.iter().any(|d| d == "[DONE]"), "never [DONE]");
    let last: Value = serde_json::from_str(data.last().unwrap()).unwrap();
    assert_eq!(last["error"]["code"], "shutting_down", "{last}");
    let received = reassemble(&data[..data.len() - 1]);
    assert!(!received.is_empty(), "some of the answer arrived first");

    // The waiting request: a 503 that says so.
    let (status, body) = tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .expect("the waiting request was answered")
        .unwrap();
    assert_eq!(
        (status, &body["error"]["code"]),
        (503, &json!("shutting_down")),
        "{body}"
    );

    // Everything settled, one row per request, no orphan.
    assert_invariant_on(&db).await;
    let scalar = |sql| scalar_on(&db, sql);
    assert_eq!(scalar("SELECT COUNT(*) FROM reservations").await, 0);
    assert_eq!(scalar("SELECT reserved_micros FROM tokens").await, 0);
    assert_eq!(
        scalar("SELECT COUNT(*) FROM ledger WHERE kind = 'orphan'").await,
        0,
        "nothing left to be settled as an orphan"
    );
    let rows: Vec<(i64, Option<String>, i64, i64, i64)> = sql_rows(
        &db,
        "SELECT status, error_code, input_tokens, output_tokens, cost_micros FROM requests ORDER BY id",
    )
    .await;
    let codes: Vec<(i64, Option<&str>)> = rows.iter().map(|r| (r.0, r.1.as_deref())).collect();
    assert_eq!(
        codes,
        [
            (200, Some("shutting_down")),
            (200, Some("client_disconnected")),
            (200, Some("shutting_down")),
            (503, Some("shutting_down")),
        ],
        "{rows:?}"
    );
    // The cut stream paid its input and the output it got; the waiting request its input.
    let (_, _, input, output, cost) = rows[2];
    assert!(input > 0 && output > 0, "{rows:?}");
    assert_eq!(
        cost,
        (input * 150_000 + output * 600_000 + 999_999) / 1_000_000
    );
    let (_, _, input, output, cost) = rows[3];
    assert!(input > 0 && output == 0, "{rows:?}");
    assert_eq!(cost, (input * 150_000 + 999_999) / 1_000_000);
    drop((slow, half));
}

/// A stream that ends within the grace is not cut: SIGTERM while a 2 s stream runs, with a
/// 20 s grace — the client gets the whole answer and `[DONE]`, it is charged in full, and
/// the process exits once it ended, long before the grace is over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_that_ends_within_the_grace_finishes_whole() {
    let dir = tempfile::tempdir().unwrap();
    let mock = MockServer::start("127.0.0.1:0", MockConfig::default()).unwrap();
    let mut gateway = with_grace(dir.path(), &mock, 20).await;
    let (db, token) = db_and_token(dir.path(), "grace").await;
    let text = "word ".repeat(20);
    script_slow_stream(&mock, text.clone());
    let reading = read_stream(&reqwest::Client::new(), &gateway.url, &token, 100).await;
    started(&mock).await;
    sigterm(&gateway);
    let (data, whole) = tokio::time::timeout(Duration::from_secs(10), reading)
        .await
        .expect("the stream ended")
        .unwrap();
    assert!(whole);
    assert_eq!(data.last().unwrap(), "[DONE]");
    assert_eq!(reassemble(&data), text);
    let status = exited(
        &mut gateway,
        Instant::now() + Duration::from_secs(15),
        "still running 15 s after its only stream ended (grace 20 s)",
    )
    .await;
    assert!(status.success(), "{status:?}");
    assert_invariant_on(&db).await;
    let (code, cost): (Option<String>, i64) =
        sql_row(&db, "SELECT error_code, cost_micros FROM requests").await;
    assert_eq!(code, None, "a complete stream");
    assert!(cost > 0);
}

/// SIGINT after SIGTERM ends the grace at once: an operator who sent SIGTERM and then
/// presses Ctrl-C (or a supervisor escalating) does not wait out a 60 s grace for a stream
/// that would run for minutes. The stream is still ended by the drain — error event
/// `shutting_down`, one row, charged by the cut rule — and the process exits cleanly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigint_after_sigterm_ends_the_grace_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let mock = MockServer::start("127.0.0.1:0", MockConfig::default()).unwrap();
    let mut gateway = with_grace(dir.path(), &mock, 60).await;
    let (db, token) = db_and_token(dir.path(), "twice").await;
    // A stream that would run for five minutes.
    script_slow_stream(&mock, "word ".repeat(3000));
    let reading = read_stream(&reqwest::Client::new(), &gateway.url, &token, 4000).await;
    started(&mock).await;
    sigterm(&gateway);
    // The graceful stop has begun (no new connections); then Ctrl-C.
    tokio::time::sleep(Duration::from_millis(1000)).await;
    assert!(
        gateway.child.try_wait().unwrap().is_none(),
        "still in its grace"
    );
    signal(&gateway, "-INT");
    let status = exited(
        &mut gateway,
        Instant::now() + Duration::from_secs(20),
        "still running 20 s after SIGTERM then SIGINT (grace 60 s)",
    )
    .await;
    assert!(status.success(), "{status:?}");
    let (data, _) = tokio::time::timeout(Duration::from_secs(10), reading)
        .await
        .expect("the stream ended")
        .unwrap();
    assert!(!data.iter().any(|d| d == "[DONE]"), "never [DONE]");
    assert_invariant_on(&db).await;
    let rows: Vec<(i64, Option<String>)> =
        sql_rows(&db, "SELECT status, error_code FROM requests").await;
    assert_eq!(rows, [(200, Some("shutting_down".to_string()))]);
    assert_eq!(scalar_on(&db, "SELECT COUNT(*) FROM reservations").await, 0);
}

/// The store is slow when the grace ends (another writer holds the database for a few
/// seconds — a long checkpoint, a backup's copy, a busy disk): the streams the drain ended
/// still settle at what they cost and write their one row once the store answers, rather
/// than dying with the workers' runtimes after `SETTLE_MARGIN` (3 s) and being settled as
/// orphans at their whole reservation with no row.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_ended_by_the_drain_settles_and_logs_even_when_the_store_is_slow() {
    let dir = tempfile::tempdir().unwrap();
    let mock = MockServer::start("127.0.0.1:0", MockConfig::default()).unwrap();
    let mut gateway = with_grace(dir.path(), &mock, 1).await;
    let (db, token) = db_and_token(dir.path(), "slowstore").await;
    script_slow_stream(&mock, "word ".repeat(3000));
    let reading = read_stream(&reqwest::Client::new(), &gateway.url, &token, 4000).await;
    started(&mock).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    // Another writer holds the database from before the grace ends until 5 s after it.
    let status = stopped_with_the_store_held(&mut gateway, dir.path()).await;
    assert!(status.success(), "{status:?}");
    let _ = tokio::time::timeout(Duration::from_secs(10), reading).await;
    let rows: Vec<(i64, Option<String>, i64)> =
        sql_rows(&db, "SELECT status, error_code, cost_micros FROM requests").await;
    let orphans: Vec<(String, i64)> = sql_rows(
        &db,
        "SELECT kind, amount_micros FROM ledger WHERE kind = 'orphan'",
    )
    .await;
    let ledger: Vec<(String, i64)> = sql_rows(&db, "SELECT kind, amount_micros FROM ledger").await;
    eprintln!("rows {rows:?} orphans {orphans:?} ledger {ledger:?}");
    assert_eq!(rows.len(), 1, "one row for the stream: {rows:?}");
    assert_eq!(rows[0].1.as_deref(), Some("shutting_down"), "{rows:?}");
    assert!(
        orphans.is_empty(),
        "settled by its rule, not as an orphan: {orphans:?}"
    );
    assert_invariant_on(&db).await;
}

/// SIGHUP — what `systemctl reload` and many supervisors send — must not kill the gateway:
/// its default action ends the process at once, nothing settled, streams cut. Until the
/// configuration reload exists, the gateway says so and keeps serving, a stream in flight
/// included.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_does_not_stop_the_gateway() {
    let dir = tempfile::tempdir().unwrap();
    let mock = MockServer::start("127.0.0.1:0", MockConfig::default()).unwrap();
    let mut gateway = start_gateway_full(dir.path(), &mock, &[], "").await;
    let (db, token) = db_and_token(dir.path(), "hup").await;
    let text = "word ".repeat(10);
    script_slow_stream(&mock, text.clone());
    let reading = read_stream(&reqwest::Client::new(), &gateway.url, &token, 100).await;
    started(&mock).await;
    signal(&gateway, "-HUP");
    let (data, whole) = tokio::time::timeout(Duration::from_secs(10), reading)
        .await
        .expect("the stream ended")
        .unwrap();
    assert!(whole, "the stream in flight was cut by SIGHUP");
    assert_eq!(reassemble(&data), text);
    assert!(
        gateway.child.try_wait().unwrap().is_none(),
        "SIGHUP ended the gateway"
    );
    let health = reqwest::get(format!("{}/healthz", gateway.url))
        .await
        .unwrap();
    assert_eq!(health.status(), 200);
    // The stream settles just after its last frame.
    let bound = Instant::now() + Duration::from_secs(10);
    while scalar_on(&db, "SELECT COUNT(*) FROM reservations").await > 0 {
        assert!(Instant::now() < bound, "the stream was never settled");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_invariant_on(&db).await;
}

/// Another process holding the backup folder's `backup.lock` (an operator's `flock` in a
/// cron script, a replica hung on a slow disk) while the scheduled backup waits for it: the
/// wait must not keep the gateway from stopping on SIGTERM.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_backup_lock_does_not_keep_the_gateway_from_stopping() {
    let dir = tempfile::tempdir().unwrap();
    let backup = dir.path().join("backup");
    std::fs::create_dir_all(&backup).unwrap();
    let held = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(backup.join("backup.lock"))
        .unwrap();
    held.lock().unwrap();
    let mock = MockServer::start("127.0.0.1:0", MockConfig::default()).unwrap();
    let timeout = SHUTDOWN_TIMEOUT_S.to_string();
    let mut gateway = start_gateway_full(
        dir.path(),
        &mock,
        &[("SLUICE_SERVER_SHUTDOWN_TIMEOUT_SECONDS", &timeout)],
        "interval_hours = 24",
    )
    .await;
    // The scheduled backup checks at start: give it time to reach the lock.
    tokio::time::sleep(Duration::from_secs(2)).await;
    sigterm(&gateway);
    let status = exited(
        &mut gateway,
        Instant::now() + Duration::from_secs(SHUTDOWN_TIMEOUT_S + 30),
        "the gateway did not exit while another process held backup.lock",
    )
    .await;
    assert!(status.success(), "{status:?}");
    drop(held);
}

/// A non-streamed chat request whose upstream holds its headers for an hour, sent in the
/// background: its status and JSON body once the gateway answers it.
pub(super) fn held_chat(
    mock: &MockServer,
    http: &reqwest::Client,
    url: &str,
    token: &str,
) -> tokio::task::JoinHandle<(u16, Value)> {
    mock.state.script(
        KEY_A,
        [Script {
            delay_ms: 3_600_000,
            ..Default::default()
        }],
    );
    let (http, url, token) = (http.clone(), url.to_string(), token.to_string());
    tokio::spawn(async move {
        let resp = http
            .post(format!("{url}/v1/chat/completions"))
            .bearer_auth(&token)
            .json(&chat_body(100))
            .send()
            .await
            .unwrap();
        let status = resp.status().as_u16();
        (status, resp.json::<Value>().await.unwrap_or(Value::Null))
    })
}

/// The real binary on `dir` over `mock`, with a `grace_s` drain.
pub(super) async fn with_grace(dir: &std::path::Path, mock: &MockServer, grace_s: u64) -> Gateway {
    let grace = grace_s.to_string();
    start_gateway_full(
        dir,
        mock,
        &[("SLUICE_SERVER_SHUTDOWN_TIMEOUT_SECONDS", &grace)],
        "",
    )
    .await
}

/// The real binary on `dir` with two workers and a `SHUTDOWN_TIMEOUT_S` drain, over `mock`.
pub(super) async fn draining_gateway(dir: &tempfile::TempDir, mock: &MockServer) -> Gateway {
    let timeout = SHUTDOWN_TIMEOUT_S.to_string();
    start_gateway_full(
        dir.path(),
        mock,
        &[
            ("SLUICE_SERVER_WORKERS", "2"),
            ("SLUICE_SERVER_SHUTDOWN_TIMEOUT_SECONDS", &timeout),
        ],
        "",
    )
    .await
}
