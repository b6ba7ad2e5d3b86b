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

use crate::gateway_proc::{db_and_token, dir_database_url, ticks_in_a_second, Gateway};
use crate::helpers::*;
use crate::processes::start_gateway_full;

const SHUTDOWN_TIMEOUT_S: u64 = 2;

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
fn sse_data_counted(
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
fn sigterm(gateway: &Gateway) {
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
async fn exited(gateway: &mut Gateway, deadline: Instant, what: &str) -> ExitStatus {
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

async fn until(what: &str, mut done: impl FnMut() -> bool) {
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
    let other = hold_the_store(&dir_database_url(dir.path())).await;
    sigterm(&gateway);
    tokio::time::sleep(Duration::from_secs(6)).await;
    other.release().await;
    let status = exited(
        &mut gateway,
        Instant::now() + Duration::from_secs(30),
        "still running 30 s after the store came back",
    )
    .await;
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

/// What the two chunks before the stall say.
const BEFORE_THE_STALL: &str = "The engine light blinks ";

/// DESIGN's departure rule at shutdown: a request the upstream had that the drain ends
/// before its answer — non-streamed, the mock holding its headers; streamed, cut after two
/// chunks with no usage yet (the mock stalls), with and without a document — pays exactly
/// the input reserved for it (`Prepared::reserved_input_on`: the counted input without the
/// margin; with a document of unknown size the model's whole input, 128 000) at the
/// route's price, plus the output it got; its one log row says so, the ledger agrees,
/// nothing is absorbed, and the money invariant holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_the_drain_ends_before_their_answer_pay_the_reserved_input() {
    let dir = tempfile::tempdir().unwrap();
    let mock = MockServer::start("127.0.0.1:0", MockConfig::default()).unwrap();
    let mut gateway = draining_gateway(&dir, &mock).await;
    let (db, token) = db_and_token(dir.path(), "drained").await;
    let state = mock.state.clone();
    let seen = |n: u64| {
        let state = state.clone();
        move || state.stats(KEY_A).count == n
    };
    let chunk = |text: &str| {
        sluice::mock::SseEvent::Data(
            json!({"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m",
                "choices": [{"index": 0, "delta": {"content": text}, "finish_reason": null}]}),
        )
    };
    // Each stream: two chunks, then nothing (no usage) — the connection kept.
    let stall = || Script {
        events: Some(vec![
            chunk("The engine "),
            chunk("light blinks "),
            chunk("because"),
            sluice::mock::SseEvent::Data(json!("[DONE]")),
        ]),
        stall_after: Some(2),
        // The second chunk comes later than the fixed 300 ms wait this test once had and the
        // drain's 2 s after it: the signal waits for the clients to have read it.
        chunk_delay_ms: 2_500,
        ..Default::default()
    };
    mock.state.script(KEY_A, [stall()]);
    let http = reqwest::Client::new();
    let mut body = chat_body(100);
    body["stream"] = json!(true);
    let resp = http
        .post(format!("{}/v1/chat/completions", gateway.url))
        .bearer_auth(&token)
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let (streamed, streamed_read) = sse_data_counted(resp);
    until("the stream never started", seen(1)).await;
    // A stream asking about a document by file id: its size unknown, the model's whole
    // input is reserved.
    mock.state.script(KEY_A, [stall()]);
    let document = json!({"model": "gpt-4o-mini", "max_tokens": 100, "stream": true,
        "messages": [{"role": "user", "content": [
            {"type": "file", "file": {"file_id": "file-6F2ksmvXxt4VdoqmHRw6kL"}},
            {"type": "text", "text": "Why does the engine light blink?"}]}]});
    let resp = http
        .post(format!("{}/v1/chat/completions", gateway.url))
        .bearer_auth(&token)
        .json(&document)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let (with_document, document_read) = sse_data_counted(resp);
    until("the document's stream never started", seen(2)).await;
    // The non-streamed request: the mock holds its headers for an hour.
    let waiting = held_chat(&mock, &http, &gateway.url, &token);
    until("the waiting request never reached the upstream", seen(3)).await;
    // The signal comes once both clients have read the streams' two chunks: what they got
    // is what the rows must count (a fixed wait let a loaded machine signal before them).
    until(
        "the streams' two chunks never reached their clients",
        || {
            use std::sync::atomic::Ordering::Acquire;
            streamed_read.load(Acquire) >= 2 && document_read.load(Acquire) >= 2
        },
    )
    .await;

    let sent = Instant::now();
    sigterm(&gateway);
    let bound = Duration::from_secs(SHUTDOWN_TIMEOUT_S + 10);
    let still = format!("still running {bound:?} after SIGTERM");
    let status = exited(&mut gateway, sent + bound, &still).await;
    assert!(status.success(), "{status:?}");
    assert!(
        sent.elapsed() >= Duration::from_secs(SHUTDOWN_TIMEOUT_S),
        "the drain deadline passed first"
    );

    for stream in [streamed, with_document] {
        let (data, _) = tokio::time::timeout(Duration::from_secs(10), stream)
            .await
            .expect("the stream ended")
            .unwrap();
        let last: Value = serde_json::from_str(data.last().unwrap()).unwrap();
        assert_eq!(last["error"]["code"], "shutting_down", "{last}");
        assert_eq!(reassemble(&data[..data.len() - 1]), BEFORE_THE_STALL);
    }
    let (code, body) = tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .expect("the waiting request was answered")
        .unwrap();
    assert_eq!(
        (code, &body["error"]["code"]),
        (503, &json!("shutting_down")),
        "{body}"
    );

    // The input reserved for `chat_body`, without the margin, at the route's prices.
    let reserved =
        sluice::quota::estimate::chat_input(chat_body(100)["messages"].as_array().unwrap(), None);
    let got = sluice::quota::estimate::count_text(BEFORE_THE_STALL);
    let price =
        |input: i64, output: i64| (input * 150_000 + output * 600_000 + 999_999) / 1_000_000;
    let rows: Vec<(String, i64, Option<String>, i64, i64, i64)> = sql_rows(
        &db,
        "SELECT id, status, error_code, input_tokens, output_tokens, cost_micros FROM requests \
         ORDER BY input_tokens, status",
    )
    .await;
    let want = [
        (200, reserved, got, price(reserved, got)),
        (503, reserved, 0, price(reserved, 0)),
        (200, 128_000, got, price(128_000, got)),
    ];
    assert_eq!(rows.len(), 3, "{rows:?}");
    for (row, (status, input, output, cost)) in rows.iter().zip(want) {
        let (id, st, code, i, o, c) = row;
        assert_eq!(
            (*st, code.as_deref(), *i, *o, *c),
            (status, Some("shutting_down"), input, output, cost),
            "{rows:?}"
        );
        // The ledger charged the request exactly that, nothing absorbed.
        let ledger: Vec<(String, i64)> = sql_rows(
            &db,
            &format!(
                "SELECT kind, CAST(SUM(amount_micros) AS BIGINT) FROM ledger \
                 WHERE request_id = '{id}' GROUP BY kind ORDER BY kind"
            ),
        )
        .await;
        let charged: i64 = ledger
            .iter()
            .filter(|(k, _)| k == "reserve" || k == "settle")
            .map(|(_, a)| a)
            .sum();
        assert_eq!(charged, cost, "{id}: {ledger:?}");
        assert!(
            ledger.iter().all(|(k, _)| k == "reserve" || k == "settle"),
            "{id}: nothing absorbed or orphaned: {ledger:?}"
        );
    }
    assert_invariant_on(&db).await;
    assert_eq!(scalar_on(&db, "SELECT COUNT(*) FROM reservations").await, 0);
    assert_eq!(
        scalar_on(&db, "SELECT limit_micros - remaining_micros FROM tokens").await,
        want.iter().map(|w| w.3).sum::<i64>()
    );
}

/// A non-streamed chat request whose upstream holds its headers for an hour, sent in the
/// background: its status and JSON body once the gateway answers it.
fn held_chat(
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
async fn with_grace(dir: &std::path::Path, mock: &MockServer, grace_s: u64) -> Gateway {
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
async fn draining_gateway(dir: &tempfile::TempDir, mock: &MockServer) -> Gateway {
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

/// Review finding (s18 #3): the shutdown that reached a stream already whole — its finish
/// sent, its usage still to come — charged it as a cut stream (`shutting_down`, the input
/// reserved for it: with a document, the model's whole input, 128 000). Its answer was
/// whole, as for a client that leaves at the finish: the gateway reads on for the usage
/// (at most `AFTER_THE_FINISH`, within the workers' `SETTLE_MARGIN`) and charges it, or the
/// estimate when none comes; the client, still reading, gets a correct end — `[DONE]`, not
/// the `shutting_down` error — and the stream is logged as a whole one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_whole_at_the_shutdown_is_charged_its_usage_or_estimate_not_the_reserved_input() {
    let dir = tempfile::tempdir().unwrap();
    let mock = MockServer::start("127.0.0.1:0", MockConfig::default()).unwrap();
    // A one-second grace: the drain comes a second after the signal.
    let mut gateway = with_grace(dir.path(), &mock, 1).await;
    let (db, token) = db_and_token(dir.path(), "whole").await;
    let chunk = chunk_event;
    let mut usage = json!({"id": "c", "object": "chat.completion.chunk", "created": 1,
        "model": "m", "choices": []});
    usage["usage"] = json!({"prompt_tokens": 40_000, "completion_tokens": 3,
        "total_tokens": 40_003});
    // "The engine ", its finish 2 s later, and 2 s after that its usage (then `[DONE]`, 2 s
    // on): the signal comes as the client reads the finish, so the drain (1 s on) reaches
    // the stream whole with its usage a second away. Without usage, the stream stalls
    // after its finish.
    let script = |with_usage: bool| Script {
        events: Some(vec![
            chunk(
                json!([{"index": 0, "delta": {"content": "The engine "}, "finish_reason": null}]),
            ),
            chunk(json!([{"index": 0, "delta": {}, "finish_reason": "stop"}])),
            sluice::mock::SseEvent::Data(usage.clone()),
            sluice::mock::SseEvent::Data(json!("[DONE]")),
        ]),
        chunk_delay_ms: 2_000,
        stall_after: (!with_usage).then_some(2),
        ..Default::default()
    };
    mock.state.script(KEY_A, [script(true), script(false)]);
    let body = json!({"model": "gpt-4o-mini", "max_tokens": 100, "stream": true,
        "messages": [{"role": "user", "content": [
            {"type": "file", "file": {"file_id": "file-6F2ksmvXxt4VdoqmHRw6kL"}},
            {"type": "text", "text": "Why does the engine light blink?"}]}]});
    let http = reqwest::Client::new();
    let mut reading = Vec::new();
    for _ in 0..2 {
        let resp = http
            .post(format!("{}/v1/chat/completions", gateway.url))
            .bearer_auth(&token)
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200);
        reading.push(sse_data_counted(resp));
    }
    // Both clients have the finish: the text chunk and the finish chunk.
    until("the finishes never reached the clients", || {
        use std::sync::atomic::Ordering::Acquire;
        reading.iter().all(|(_, read)| read.load(Acquire) >= 2)
    })
    .await;
    let sent = Instant::now();
    sigterm(&gateway);
    let status = exited(
        &mut gateway,
        sent + Duration::from_secs(15),
        "still running 15 s after SIGTERM",
    )
    .await;
    assert!(status.success(), "{status:?}");
    let mut got = Vec::new();
    for (task, _) in reading {
        got.push(
            tokio::time::timeout(Duration::from_secs(10), task)
                .await
                .expect("the stream ended")
                .unwrap(),
        );
    }
    assert_invariant_on(&db).await;
    assert_eq!(scalar_on(&db, "SELECT COUNT(*) FROM reservations").await, 0);
    let rows: Vec<(i64, Option<String>, i64, i64, i64)> = sql_rows(
        &db,
        "SELECT status, error_code, input_tokens, output_tokens, cost_micros FROM requests \
         ORDER BY input_tokens DESC",
    )
    .await;
    let price =
        |input: i64, output: i64| (input * 150_000 + output * 600_000 + 999_999) / 1_000_000;
    let counted = sluice::quota::estimate::count_text("The engine ");
    assert_eq!(rows.len(), 2, "{rows:?}");
    assert_eq!(
        rows[0],
        (200, None, 40_000, 3, price(40_000, 3)),
        "the usage that came after the drain: {rows:?}"
    );
    let (status, code, input, output, cost) = rows[1].clone();
    assert_eq!(
        (status, code.as_deref(), output),
        (200, Some("usage_estimated"), counted),
        "no usage: the estimate, {rows:?}"
    );
    assert!(input < 128_000, "the document at its estimate: {rows:?}");
    assert_eq!(cost, price(input, output));
    assert_eq!(
        scalar_on(&db, "SELECT limit_micros - remaining_micros FROM tokens").await,
        price(40_000, 3) + cost
    );
    // Each client, still there, got a whole stream's end.
    for (data, whole) in got {
        assert!(whole, "{data:?}");
        assert_eq!(data.last().map(String::as_str), Some("[DONE]"), "{data:?}");
        assert!(!data.iter().any(|d| d.contains("\"error\"")), "{data:?}");
    }
}

/// Review finding (s18 final #4), at the shutdown: an `n` = 2 stream whose upstream sends
/// its choices one after the other, a usage after each, was whole at choice 0's usage, so
/// the drain that reached it with choice 1 streaming read on 2 s and ended it as a whole
/// answer — the client got `[DONE]` with one choice, the row choice 0's 5 output tokens,
/// choice 1's text (which the upstream bills) uncounted. Whole only at its end, it is cut
/// by the shutdown: `shutting_down`, the reported input and every choice's text counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_of_choices_one_after_the_other_is_cut_by_the_shutdown_every_choice_counted() {
    let dir = tempfile::tempdir().unwrap();
    let mock = MockServer::start("127.0.0.1:0", MockConfig::default()).unwrap();
    let mut gateway = with_grace(dir.path(), &mock, 1).await;
    let (db, token) = db_and_token(dir.path(), "sequential").await;
    let chunk = chunk_event;
    let second = "A second answer, told after the first one's usage. ".repeat(4);
    // Choice 0's text, finish and usage, choice 1's text; then the upstream, still
    // generating choice 1, sends nothing more.
    mock.state.script(
        KEY_A,
        [Script {
            events: Some(vec![
                chunk(json!([{"index": 0, "delta": {"content": "The engine "},
                    "finish_reason": null}])),
                chunk(json!([{"index": 0, "delta": {}, "finish_reason": "stop"}])),
                sluice::mock::SseEvent::Data(json!({"id": "c",
                    "object": "chat.completion.chunk", "created": 1, "model": "m",
                    "choices": [], "usage": {"prompt_tokens": 10, "completion_tokens": 5,
                    "total_tokens": 15}})),
                chunk(json!([{"index": 1, "delta": {"content": second},
                    "finish_reason": null}])),
                chunk(json!([{"index": 1, "delta": {}, "finish_reason": "stop"}])),
            ]),
            stall_after: Some(4),
            ..Default::default()
        }],
    );
    let body = json!({"model": "gpt-4o-mini", "max_tokens": 100, "stream": true, "n": 2,
        "stream_options": {"include_usage": true},
        "messages": [{"role": "user", "content": "Why does the engine light blink?"}]});
    let resp = reqwest::Client::new()
        .post(format!("{}/v1/chat/completions", gateway.url))
        .bearer_auth(&token)
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let (task, read) = sse_data_counted(resp);
    // The client has choice 1's text: four events.
    until("choice 1's text never reached the client", || {
        read.load(std::sync::atomic::Ordering::Acquire) >= 4
    })
    .await;
    let sent = Instant::now();
    sigterm(&gateway);
    let status = exited(
        &mut gateway,
        sent + Duration::from_secs(15),
        "still running 15 s after SIGTERM",
    )
    .await;
    assert!(status.success(), "{status:?}");
    let (data, _) = tokio::time::timeout(Duration::from_secs(10), task)
        .await
        .expect("the stream ended")
        .unwrap();
    assert!(
        data.last().is_some_and(|d| d.contains("shutting_down")),
        "{data:?}"
    );
    assert_invariant_on(&db).await;
    let counted = sluice::quota::estimate::count_text(&format!("The engine {second}"));
    let rows: Vec<(i64, Option<String>, i64, i64, i64)> = sql_rows(
        &db,
        "SELECT status, error_code, input_tokens, output_tokens, cost_micros FROM requests",
    )
    .await;
    let price =
        |input: i64, output: i64| (input * 150_000 + output * 600_000 + 999_999) / 1_000_000;
    assert_eq!(
        rows,
        [(
            200,
            Some("shutting_down".to_string()),
            10,
            counted,
            price(10, counted)
        )]
    );
}

/// Review finding (s18 attack #4): a client merely behind at the drain — its answer whole
/// (the finish came), the frames after it waiting on a full channel — had its connection cut:
/// the first of those frames the pump handed on after the drain met the full channel and
/// gave up at once, so the chunked body ended with an error, no terminator, no `[DONE]`,
/// though the row said a whole answer. Its SDK sees a broken stream and retries, paying
/// twice. A frame of an answer already whole now waits for room until `AFTER_THE_FINISH`
/// after the drain's start: a client that reads again within it gets the whole stream's end.
///
/// Each client falls behind on 5 MB of text in eight chunks (more than the loopback
/// socket's buffers hold) into a 4 KiB receive buffer, read no more; the finish and 24
/// chunks without choices (passed on after the finish, as a client's stream carries them)
/// follow: the pump is blocked on a frame after the finish when the drain comes, 1 s after
/// the signal. Then:
/// 1. the usage and `[DONE]`; the client reads again half a second after the drain: it gets
///    them and the body's end, and the stream is charged its usage;
/// 2. the same, but the client never reads again: it is cut 2 s after the drain (a client
///    not reading cannot hold the shutdown) and its whole answer settled on the estimate
///    (its usage waited behind it), before the workers' stop 3 s after the drain;
/// 3. the upstream stalls after the chunks (no usage); the client reads again 1.5 s after
///    the drain: the read-on for the usage runs from the drain's start, not from when the
///    pump, blocked on its client until then, saw the drain — it ends 2 s after the drain
///    with the gateway's closing events, within the workers' 3 s, not 3.5 s after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_behind_at_the_drain_on_a_whole_answer_gets_the_streams_end_not_a_cut() {
    use tokio::io::AsyncReadExt;
    let dir = tempfile::tempdir().unwrap();
    let mock = MockServer::start("127.0.0.1:0", MockConfig::default()).unwrap();
    // A one-second grace: the drain comes a second after the signal.
    let mut gateway = with_grace(dir.path(), &mock, 1).await;
    let (db, token) = db_and_token(dir.path(), "behind").await;
    let chunk = chunk_event;
    // Eight events of 640 KB, not one of 5 MB: parsing and counting one 5 MB event takes a
    // debug build over a second, and the gateway must be idle before the signal.
    let mut events: Vec<_> = (0..8)
        .map(|_| {
            chunk(
                json!([{"index": 0, "delta": {"content": "word ".repeat(128_000)},
                "finish_reason": null}]),
            )
        })
        .collect();
    events.push(chunk(
        json!([{"index": 0, "delta": {}, "finish_reason": "stop"}]),
    ));
    events.extend((0..24).map(|_| chunk(json!([]))));
    // Every one of these events sent, then nothing more (`stall_after` holds the next one).
    let mut held = events.clone();
    held.push(chunk(json!([])));
    let stalls = Script {
        stall_after: Some(events.len()),
        events: Some(held),
        ..Default::default()
    };
    events.push(sluice::mock::SseEvent::Data(json!({"id": "c",
        "object": "chat.completion.chunk", "created": 1, "model": "m", "choices": [],
        "usage": {"prompt_tokens": 20, "completion_tokens": 7, "total_tokens": 27}})));
    events.push(sluice::mock::SseEvent::Data(json!("[DONE]")));
    let ends = Script {
        events: Some(events),
        ..Default::default()
    };
    mock.state.script(KEY_A, [ends.clone(), ends, stalls]);
    let mut body = chat_body(100);
    body["stream"] = json!(true);
    body["stream_options"] = json!({"include_usage": true});
    let mut conns = Vec::new();
    for n in 1..=3 {
        conns.push(send_raw_chat(&gateway.url, &token, &body, Some(4096)).await);
        let state = mock.state.clone();
        until("the stream never started", move || {
            state.stats(KEY_A).count == n
        })
        .await;
    }
    // The mock sent the answers (the third stalls, its connection open): the gateway has
    // them, blocked on their clients.
    let state = mock.state.clone();
    until("the mock never sent its answers", move || {
        state.stats(KEY_A).in_flight == 1
    })
    .await;
    // The gateway has read them all (a 640 KB event takes it a while in a debug build): its
    // process is idle, each stream blocked on its client.
    let bound = Instant::now() + Duration::from_secs(20);
    while ticks_in_a_second(gateway.child.id()).await > 10 {
        assert!(Instant::now() < bound, "the gateway never went idle");
    }
    let (sent, signalled) = (Instant::now(), chrono::Utc::now());
    sigterm(&gateway);
    // Each client reads again this long after the signal (the drain is at 1 s), to the
    // chunked body's terminator, the connection's end, or its cut.
    let read_from = |mut conn: tokio::net::TcpStream, after_ms: u64| {
        tokio::spawn(async move {
            tokio::time::sleep_until((sent + Duration::from_millis(after_ms)).into()).await;
            let mut got = Vec::new();
            let mut buf = vec![0u8; 64 * 1024];
            loop {
                match conn.read(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => got.extend_from_slice(&buf[..n]),
                }
                if got.ends_with(b"\r\n0\r\n\r\n") {
                    break;
                }
            }
            (String::from_utf8_lossy(&got).into_owned(), sent.elapsed())
        })
    };
    let mut conns = conns.into_iter();
    let (first, never, stalled) = (
        conns.next().unwrap(),
        conns.next().unwrap(),
        conns.next().unwrap(),
    );
    let reading = [read_from(first, 1_500), read_from(stalled, 2_500)];
    let status = exited(
        &mut gateway,
        sent + Duration::from_secs(15),
        "still running 15 s after SIGTERM",
    )
    .await;
    assert!(status.success(), "{status:?}");
    eprintln!("the process exited {:?} after SIGTERM", sent.elapsed());
    // The client that never read again held its connection until the workers' stop (its
    // body is not polled while nothing can be written): its body is cut.
    let never = read_from(never, 0).await.unwrap().0;
    assert!(!never.ends_with("\r\n0\r\n\r\n"), "the chunked body is cut");
    for (n, task) in reading.into_iter().enumerate() {
        let (text, read_for) = tokio::time::timeout(Duration::from_secs(15), task)
            .await
            .expect("the client's read ended")
            .unwrap();
        eprintln!("client {n}'s read ended {read_for:?} after SIGTERM");
        let tail = &text[text.len().saturating_sub(600)..];
        assert!(text.len() > 5_000_000, "client {n} read the answer");
        assert!(
            text.ends_with("\r\n0\r\n\r\n"),
            "client {n}'s chunked body ends, not cut: {tail}"
        );
        assert!(text.contains("data: [DONE]"), "{tail}");
        assert!(!text.contains("\"error\""), "{tail}");
        assert!(!text.contains("shutting_down"), "{tail}");
    }
    assert_invariant_on(&db).await;
    assert_eq!(scalar_on(&db, "SELECT COUNT(*) FROM reservations").await, 0);
    // The rows, in the order the requests came, and when each settled: its start
    // (`created_at`) and its latency, in wall-clock time, after the signal.
    let rows: Vec<(i64, Option<String>, i64, i64, i64)> = sql_rows(
        &db,
        "SELECT status, error_code, input_tokens, output_tokens, cost_micros FROM requests \
         ORDER BY created_at",
    )
    .await;
    let times: Vec<(String, i64)> = sql_rows(
        &db,
        "SELECT created_at, latency_ms FROM requests ORDER BY created_at",
    )
    .await;
    let settled: Vec<i64> = times
        .iter()
        .map(|(created, latency)| {
            let at = chrono::DateTime::parse_from_rfc3339(created).unwrap()
                + chrono::Duration::milliseconds(*latency);
            (at.with_timezone(&chrono::Utc) - signalled).num_milliseconds()
        })
        .collect();
    eprintln!("settled {settled:?} ms after the signal");
    let price =
        |input: i64, output: i64| (input * 150_000 + output * 600_000 + 999_999) / 1_000_000;
    assert_eq!(rows.len(), 3, "every stream settled: {rows:?}");
    assert_eq!(rows[0], (200, None, 20, 7, price(20, 7)), "a whole stream");
    for (status, code, input, output, cost) in &rows[1..] {
        assert_eq!(
            (*status, code.as_deref()),
            (200, Some("usage_estimated")),
            "{rows:?}"
        );
        assert_eq!(*cost, price(*input, *output), "{rows:?}");
    }
    // The client that never read again, and the stalled stream, 2 s after the drain.
    for after in &settled[1..] {
        assert!((2_500..3_600).contains(after), "{settled:?}");
    }
}

/// Review finding (s20c, F2): a client that leaves after the drain reached its whole answer
/// set it reading on for the usage without its connection — and so without its worker,
/// which stops once it holds no connection: the pump was dropped with the worker, its row
/// lost and its reservation left to be settled as an orphan. At the shutdown a client gone
/// is settled at once, on the usage if it came, else the estimate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_leaves_during_the_drains_read_on_is_settled_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let mock = MockServer::start("127.0.0.1:0", MockConfig::default()).unwrap();
    let mut gateway = with_grace(dir.path(), &mock, 1).await;
    let (db, token) = db_and_token(dir.path(), "leaves").await;
    // "The engine ", its finish 2 s later, then nothing: the usage never comes.
    mock.state.script(
        KEY_A,
        [Script {
            events: Some(vec![
                chunk_event(
                    json!([{"index": 0, "delta": {"content": "The engine "}, "finish_reason": null}]),
                ),
                chunk_event(json!([{"index": 0, "delta": {}, "finish_reason": "stop"}])),
                sluice::mock::SseEvent::Data(json!("[DONE]")),
            ]),
            chunk_delay_ms: 2_000,
            stall_after: Some(2),
            ..Default::default()
        }],
    );
    let mut body = chat_body(100);
    body["stream"] = true.into();
    let resp = reqwest::Client::new()
        .post(format!("{}/v1/chat/completions", gateway.url))
        .bearer_auth(&token)
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let (reading, read) = sse_data_counted(resp);
    until("the finish never reached the client", || {
        read.load(std::sync::atomic::Ordering::Acquire) >= 2
    })
    .await;
    let sent = Instant::now();
    sigterm(&gateway);
    // The drain comes a second on; the client leaves half a second into its read-on.
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    reading.abort();
    let status = exited(
        &mut gateway,
        sent + Duration::from_secs(15),
        "still running 15 s after SIGTERM",
    )
    .await;
    assert!(status.success(), "{status:?}");
    assert_invariant_on(&db).await;
    assert_eq!(scalar_on(&db, "SELECT COUNT(*) FROM reservations").await, 0);
    assert_eq!(
        scalar_on(&db, "SELECT COUNT(*) FROM ledger WHERE kind = 'orphan'").await,
        0,
        "settled by its own rule, not as an orphan"
    );
    let rows: Vec<(i64, Option<String>)> =
        sql_rows(&db, "SELECT status, error_code FROM requests").await;
    assert_eq!(
        rows,
        [(200, Some("usage_estimated".to_string()))],
        "{rows:?}"
    );
}
