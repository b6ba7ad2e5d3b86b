//! The drain reaching streams whose answer is already whole — the finish sent, the usage
//! or the stream's end still to come: read on for at most `AFTER_THE_FINISH`, charged the
//! usage or the estimate, the client still there given the stream's end, never a cut.

use std::time::{Duration, Instant};

use serde_json::json;
use sluice::mock::{MockConfig, MockServer, Script};

use super::{
    exited, settled_by_their_rules, sigterm, sse_data_counted, stopped_with_the_store_held, until,
    with_grace,
};
use crate::gateway_proc::{db_and_token, ticks_in_a_second, Gateway};
use crate::helpers::*;
use crate::processes::start_gateway_full;

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
    let reading = read_to_a_finish_without_usage(&mock, &gateway, &token, 2_000).await;
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
    settled_by_their_rules(&db, "the client gone in the read-on").await;
    let rows: Vec<(i64, Option<String>)> =
        sql_rows(&db, "SELECT status, error_code FROM requests").await;
    assert_eq!(
        rows,
        [(200, Some("usage_estimated".to_string()))],
        "{rows:?}"
    );
}

/// Review finding (s20c, F3): a Responses stream translated from Anthropic is completed —
/// its `response.completed` built, the response stored — only at `message_stop`, after
/// the finish and usage of `message_delta`. Reached there by the drain, it is read on as a
/// whole answer; but storing the response awaited the store with no deadline, so a store
/// held past the workers' `SETTLE_MARGIN` stopped the pump before it settled: no row, and
/// the reservation released uncharged — the answer the upstream billed given away. The
/// store is given until `STORED_BY` after the drain; the stream then settles on its usage,
/// its row written once the store answers. With the store free the response is kept as
/// ever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_translated_responses_stream_completed_in_the_drain_settles_though_the_store_is_held() {
    for held in [true, false] {
        let dir = tempfile::tempdir().unwrap();
        let (db, stored) = responses_stream_completed_in_the_drain(dir.path(), held).await;
        settled_by_their_rules(&db, &format!("held {held}")).await;
        let rows: Vec<(i64, Option<String>, i64, i64, i64)> = sql_rows(
            &db,
            "SELECT status, error_code, input_tokens, output_tokens, cost_micros FROM requests",
        )
        .await;
        // 100 × 3 + 5 × 15 µ$: the usage the upstream reported.
        assert_eq!(rows, [(200, None, 100, 5, 375)], "held {held}: {rows:?}");
        // Held, the gateway stops waiting on the response's write, not the write itself: it
        // lands if the store frees before the process ends, as here, or not at all.
        if !held {
            let kept = scalar_on(&db, "SELECT COUNT(*) FROM stored_responses").await;
            assert_eq!(kept, 1, "the response kept");
        }
        let completed = stored.expect("the client got the stream's end");
        assert!(
            completed.contains("response.completed"),
            "held {held}: {completed}"
        );
    }
}

/// The real binary on `dir` with a Claude upstream, a translated Responses stream on it
/// reached by the drain between its finish (`message_delta`) and its `message_stop`, the
/// store held by another writer across the workers' stop if `held`: the database once the
/// gateway exited, and what the client read after the text.
async fn responses_stream_completed_in_the_drain(
    dir: &std::path::Path,
    held: bool,
) -> (sluice::store::Db, Option<String>) {
    use sluice::mock::SseEvent::Named;
    let mock = MockServer::start("127.0.0.1:0", MockConfig::default()).unwrap();
    let claude = format!(
        "[[upstreams]]\nid = \"cl\"\nprovider = \"anthropic\"\nbase_url = \"{}\"\n\
         api_key = \"{KEY_B}\"\nallow_private_network = true\n\
         [[models]]\nname = \"claude\"\nroutes = [{{ upstream = \"cl\", model = \"claude-upstream\" }}]\n\
         input_usd_per_mtok = 3\noutput_usd_per_mtok = 15\n",
        mock.base_url()
    );
    let mut gateway = start_gateway_full(
        dir,
        &mock,
        &[("SLUICE_SERVER_SHUTDOWN_TIMEOUT_SECONDS", "1")],
        &claude,
    )
    .await;
    let (db, token) = db_and_token(dir, "translated").await;
    // An event every 250 ms: the text block, then the finish and usage (`message_delta`),
    // then ten pings and `message_stop` 2.75 s after the finish.
    let mut events = vec![
        Named(
            "message_start".into(),
            json!({"type": "message_start", "message": {"id": "msg_1", "type": "message",
                "role": "assistant", "model": "claude-upstream", "content": [],
                "stop_reason": null, "stop_sequence": null,
                "usage": {"input_tokens": 100, "output_tokens": 1}}}),
        ),
        Named(
            "content_block_start".into(),
            json!({"type": "content_block_start", "index": 0,
                "content_block": {"type": "text", "text": ""}}),
        ),
        Named(
            "content_block_delta".into(),
            json!({"type": "content_block_delta", "index": 0,
                "delta": {"type": "text_delta", "text": "The engine "}}),
        ),
        Named(
            "content_block_stop".into(),
            json!({"type": "content_block_stop", "index": 0}),
        ),
        Named(
            "message_delta".into(),
            json!({"type": "message_delta", "delta": {"stop_reason": "end_turn",
                "stop_sequence": null}, "usage": {"output_tokens": 5}}),
        ),
    ];
    events.extend((0..10).map(|_| Named("ping".into(), json!({"type": "ping"}))));
    events.push(Named(
        "message_stop".into(),
        json!({"type": "message_stop"}),
    ));
    mock.state.script(
        KEY_B,
        [Script {
            events: Some(events),
            chunk_delay_ms: 250,
            ..Default::default()
        }],
    );
    let mut resp = reqwest::Client::new()
        .post(format!("{}/v1/responses", gateway.url))
        .bearer_auth(&token)
        .json(
            &json!({"model": "claude", "input": "Why does the engine light blink?",
            "stream": true, "max_output_tokens": 100}),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    // Read until the text: the finish comes 500 ms on, `message_stop` 3.25 s on (the
    // Responses stream tells nothing between them).
    let mut seen = String::new();
    while !seen.contains("response.output_text.delta") {
        let chunk = tokio::time::timeout(Duration::from_secs(10), resp.chunk())
            .await
            .expect("the text")
            .unwrap()
            .expect("the stream still open");
        seen.push_str(&String::from_utf8_lossy(&chunk));
    }
    let reading = tokio::spawn(async move {
        let mut rest = String::new();
        while let Ok(Some(chunk)) = resp.chunk().await {
            rest.push_str(&String::from_utf8_lossy(&chunk));
        }
        rest
    });
    // The signal comes 1.25 s on, with the finish in; the drain a second after it, and
    // `message_stop` a second into the drain's read-on; the store is held from the signal
    // until well past the workers' stop (3 s after the drain).
    tokio::time::sleep(Duration::from_millis(1_250)).await;
    let status = if held {
        stopped_with_the_store_held(&mut gateway, dir).await
    } else {
        sigterm(&gateway);
        let stop = Instant::now() + Duration::from_secs(15);
        exited(&mut gateway, stop, "still running 15 s after SIGTERM").await
    };
    assert!(status.success(), "{status:?}");
    let rest = tokio::time::timeout(Duration::from_secs(10), reading)
        .await
        .ok()
        .and_then(Result::ok);
    (db, rest)
}

/// Review finding (s21a, 1): a client that left at the finish before the signal has its
/// pump read on for the usage, at most `AFTER_THE_FINISH` — on the runtime of a worker that
/// holds no connection any more. actix stops such a worker at the signal, before the drain:
/// the pump was dropped with it, its row lost and its reservation released uncharged (seen:
/// ledger reserve 66 / settle −66) — the answer given away. A pump dropped unsettled now
/// settles by its rule on the gateway's own runtime: the estimate here, the usage never
/// coming.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_left_at_the_finish_before_the_signal_is_settled_by_its_rule() {
    let dir = tempfile::tempdir().unwrap();
    let mock = MockServer::start("127.0.0.1:0", MockConfig::default()).unwrap();
    let mut gateway = with_grace(dir.path(), &mock, 1).await;
    let (db, token) = db_and_token(dir.path(), "left").await;
    // "The engine ", its finish 500 ms later, then nothing: the usage never comes.
    let reading = read_to_a_finish_without_usage(&mock, &gateway, &token, 500).await;
    // The client leaves at the finish; the signal comes 200 ms into the pump's read-on.
    reading.abort();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let sent = Instant::now();
    sigterm(&gateway);
    let status = exited(
        &mut gateway,
        sent + Duration::from_secs(15),
        "still running 15 s after SIGTERM",
    )
    .await;
    assert!(status.success(), "{status:?}");
    settled_by_their_rules(&db, "the client gone before the signal").await;
    let rows: Vec<(i64, Option<String>)> =
        sql_rows(&db, "SELECT status, error_code FROM requests").await;
    assert_eq!(
        rows,
        [(200, Some("usage_estimated".to_string()))],
        "{rows:?}"
    );
}

/// A chat stream on `gateway` whose upstream sends "The engine ", its finish `delay_ms`
/// later, then nothing (the usage never comes), read by a client until it has the finish:
/// the client's reading task, to be ended as the test's client leaves.
async fn read_to_a_finish_without_usage(
    mock: &MockServer,
    gateway: &Gateway,
    token: &str,
    delay_ms: u64,
) -> tokio::task::JoinHandle<(Vec<String>, bool)> {
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
            chunk_delay_ms: delay_ms,
            stall_after: Some(2),
            ..Default::default()
        }],
    );
    let mut body = chat_body(100);
    body["stream"] = true.into();
    let resp = reqwest::Client::new()
        .post(format!("{}/v1/chat/completions", gateway.url))
        .bearer_auth(token)
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
    reading
}
