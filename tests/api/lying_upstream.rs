//! An upstream that lies about the size of what it sends (issue 16): a line that never
//! ends, an event that never closes, arguments held back behind a live tool call for ever,
//! a stream longer than the cache keeps. Every buffer on a stream's path is bounded by
//! `upstream.max_response_bytes` (no event, held-back block or cached answer larger than a
//! whole non-streamed answer may be; the non-streamed body itself is pinned in
//! `resilience::garbage_from_the_upstream_is_a_502_and_the_process_lives`). Past it the
//! stream ends by the cut-stream rule: an error event in the client's format, no `[DONE]`,
//! a log row with `upstream_error`, charged the input and the output counted so far.
//!
//! The mock holds its connection open for an hour after the lie: only the cap, not the
//! upstream's end or the idle timeout (60 s), can end the stream inside the bound.

use std::time::Duration;

use serde_json::{json, Value};
use sluice::mock::{Script, SseEvent};

use crate::helpers::*;

const BOUND: Duration = Duration::from_secs(10);
const CAP: usize = 256 * 1024;

async fn capped_app() -> TestApp {
    spawn_app_with(|s, _| s.upstream.max_response_bytes = CAP).await
}

fn stream_body() -> Value {
    let mut b = chat_body(100);
    b["stream"] = json!(true);
    b
}

fn role_chunk() -> String {
    format!(
        "data: {}\n\n",
        json!({"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m",
            "choices": [{"index": 0, "delta": {"role": "assistant", "content": "Partly "}, "finish_reason": null}]})
    )
}

/// Waits (10 s at most) until the mock has no call in flight: the gateway closed it.
async fn upstream_call_closed(app: &TestApp) {
    key_call_closed(app, KEY_A).await;
}

/// As `upstream_call_closed`, for the upstream scripted by `key`.
async fn key_call_closed(app: &TestApp, key: &str) {
    for _ in 0..500 {
        if app.mock.state.stats(key).in_flight == 0 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("the upstream call was never closed");
}

/// A tiny chunk of content: one word.
fn word_chunk() -> String {
    format!(
        "data: {}\n\n",
        json!({"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m",
            "choices": [{"index": 0, "delta": {"content": "word "}, "finish_reason": null}]})
    )
}

/// A streamed request's `data:` payloads, read within 45 s — well inside the idle timeout
/// (60 s), which would end it as a stall instead — and how long they took.
async fn streamed_within_45_s(app: &TestApp, token: &str, late: &str) -> (Vec<String>, Duration) {
    let started = std::time::Instant::now();
    let resp = app.chat(token, &stream_body()).await;
    assert_eq!(resp.status(), 200);
    let (data, _) = tokio::time::timeout(Duration::from_secs(45), sse_data(resp))
        .await
        .expect(late);
    (data, started.elapsed())
}

/// The stream the client got (within the bound), ended by the gateway's error event.
async fn cut_by_the_gateway(app: &TestApp, token: &str, message: &str) -> Vec<String> {
    let resp = app.chat(token, &stream_body()).await;
    assert_eq!(resp.status(), 200);
    let (data, whole) = tokio::time::timeout(BOUND, sse_data(resp))
        .await
        .expect("the gateway ended the stream");
    assert!(whole, "the body ends cleanly after the error event");
    let last: Value = serde_json::from_str(data.last().unwrap()).unwrap();
    assert_eq!(last["error"]["code"], "upstream_error", "{last}");
    assert!(
        last["error"]["message"].as_str().unwrap().contains(message),
        "{last}"
    );
    assert!(!data.iter().any(|d| d == "[DONE]"), "never [DONE]");
    data
}

/// Logged as an upstream error, charged the input plus the counted output, the upstream
/// connection closed.
async fn settled_as_cut(app: &TestApp, id: i64) {
    app.wait_for_log_rows(1).await;
    let (status, code, input, cost): (i64, Option<String>, i64, i64) = sql_row(
        app.db(),
        "SELECT status, error_code, input_tokens, cost_micros FROM requests",
    )
    .await;
    assert_eq!((status, code.as_deref()), (200, Some("upstream_error")));
    assert!(input > 0 && cost > 0, "input {input}, cost {cost}");
    app.assert_invariant().await;
    // Charged the row's cost, or the reservation when the upstream's counted output
    // passed it (the excess is `absorbed`; the invariant above checked the ledger).
    let charged = app
        .scalar(&format!(
            "SELECT 1000000 - remaining_micros FROM tokens WHERE id = {id}"
        ))
        .await;
    assert!(
        charged > 0 && charged <= cost,
        "charged {charged}, cost {cost}"
    );
    upstream_call_closed(app).await;
}

#[tokio::test]
async fn a_line_that_never_ends_is_cut_at_the_cap() {
    let app = capped_app().await;
    let (id, token) = app.token("line", Some("1")).await;
    // 8 MiB of one line, then an hour's silence.
    app.mock.state.sticky(
        KEY_A,
        Some(Script {
            raw_stream: Some(vec![role_chunk(), "data: ".into(), "x".repeat(64 * 1024)]),
            raw_repeat: 128,
            raw_hold: true,
            ..Default::default()
        }),
    );
    let data = cut_by_the_gateway(&app, &token, "larger than the gateway accepts").await;
    assert_eq!(reassemble(&data), "Partly ", "what came before the lie");
    settled_as_cut(&app, id).await;
}

#[tokio::test]
async fn an_event_that_never_closes_is_cut_at_the_cap() {
    let app = capped_app().await;
    let (id, token) = app.token("event", Some("1")).await;
    // Short data lines, never the empty line that ends the event: 4 MiB, then silence.
    app.mock.state.sticky(
        KEY_A,
        Some(Script {
            raw_stream: Some(vec![role_chunk(), "data: {\"x\": 1}\n".into()]),
            raw_repeat: 300_000,
            raw_hold: true,
            ..Default::default()
        }),
    );
    cut_by_the_gateway(&app, &token, "larger than the gateway accepts").await;
    settled_as_cut(&app, id).await;
}

/// An Anthropic client, an OpenAI-format upstream: a second tool call waits behind the
/// live one until the first ends, and its arguments keep coming.
#[tokio::test]
async fn arguments_held_back_for_ever_are_cut_at_the_cap() {
    let app = capped_app().await;
    let (id, token) = app.token("held", Some("1")).await;
    let call = |index: i64, id: Option<&str>, name: Option<&str>, args: &str| {
        SseEvent::Data(
            json!({"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m",
            "choices": [{"index": 0, "delta": {"tool_calls": [{"index": index, "id": id, "type": "function",
                "function": {"name": name, "arguments": args}}]}, "finish_reason": null}]}),
        )
    };
    let mut events = vec![
        call(0, Some("call_1"), Some("live"), "{"),
        call(1, Some("call_2"), Some("held"), "{"),
    ];
    events.extend((0..40_000).map(|_| call(1, None, None, "\"xxxxxxxxxx\",")));
    app.mock.state.sticky(
        KEY_A,
        Some(Script {
            events: Some(events),
            stall_after: Some(40_002),
            ..Default::default()
        }),
    );
    let body = json!({"model": "gpt-4o-mini", "max_tokens": 100, "stream": true,
        "messages": [{"role": "user", "content": "Why does the engine light blink?"}]});
    let resp = app.messages(&token, &body).await;
    assert_eq!(resp.status(), 200);
    let text = tokio::time::timeout(BOUND, resp.text())
        .await
        .expect("the gateway ended the stream")
        .unwrap();
    assert_ended_held_back(&text);
    assert!(!text.contains("message_stop"));
    settled_as_cut(&app, id).await;
}

/// A cacheable stream (temperature 0) longer than the cache's largest entry is served
/// whole and not cached: asked again, it goes to the upstream again. A short one is cached.
#[tokio::test]
async fn a_stream_longer_than_the_cache_keeps_is_served_whole_and_not_cached() {
    let app = capped_app().await;
    let (_, token) = app.token("cache", Some("10")).await;
    let ask = |text: &str| {
        let mut body = stream_body();
        body["temperature"] = json!(0);
        body["messages"][0]["content"] = json!(format!("Say {} words", text.len()));
        body
    };
    let short = "A short answer.".to_string();
    let long = "word ".repeat(100_000);
    for (i, text) in [&short, &long, &long].into_iter().enumerate() {
        app.mock.state.sticky(
            KEY_A,
            Some(Script {
                text: Some(text.clone()),
                ..Default::default()
            }),
        );
        let resp = app.chat(&token, &ask(text)).await;
        assert_eq!(resp.status(), 200);
        assert_eq!(resp.headers()["x-sluice-cache"], "miss", "request {i}");
        // 100 000 one-word chunks: a converter that did work per chunk in proportion to
        // the text so far took minutes here (a hang, not a failure, before the bound).
        let (data, whole) = tokio::time::timeout(Duration::from_secs(60), sse_data(resp))
            .await
            .expect("a long stream is served in linear time");
        assert!(whole);
        assert_eq!(data.last().unwrap(), "[DONE]");
        assert_eq!(reassemble(&data), *text);
        app.wait_settled().await;
        if i == 0 {
            app.wait_for_cache_entries(1).await;
        }
    }
    assert_eq!(app.mock.state.stats(KEY_A).count, 3, "the long one twice");
    app.state.cache.flush().await;
    assert_eq!(app.scalar("SELECT COUNT(*) FROM cache_entries").await, 1);
    app.assert_invariant().await;
}

/// The kernel's peak resident set of a process (`VmHWM`), in KiB.
fn peak_rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

/// The real binary at the default cap (16 MiB): a 96 MiB line raises its peak memory by
/// well under the line's size (the old code buffered all of it, and more while growing
/// its buffer).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_96_mib_line_leaves_the_gateway_process_memory_bounded() {
    let dir = tempfile::tempdir().unwrap();
    let mock = sluice::mock::MockServer::start("127.0.0.1:0", sluice::mock::MockConfig::default())
        .unwrap();
    let gateway = crate::processes::start_gateway_full(dir.path(), &mock, &[], "").await;
    let (_db, token) = crate::gateway_proc::db_and_token(dir.path(), "rss").await;
    let http = reqwest::Client::new();
    let ask = async || {
        http.post(format!("{}/v1/chat/completions", gateway.url))
            .bearer_auth(&token)
            .json(&stream_body())
            .send()
            .await
            .unwrap()
    };
    // Warm up: one ordinary stream, so the baseline holds what any stream allocates.
    let (data, _) = sse_data(ask().await).await;
    assert_eq!(data.last().unwrap(), "[DONE]");
    let pid = gateway.child.id();
    // The peak so far is the start's (the tokenizer's tables): reset it to now.
    std::fs::write(format!("/proc/{pid}/clear_refs"), "5").unwrap();
    let before = peak_rss_kib(pid);
    mock.state.sticky(
        KEY_A,
        Some(Script {
            raw_stream: Some(vec![role_chunk(), "data: ".into(), "x".repeat(1 << 20)]),
            raw_repeat: 96,
            raw_hold: true,
            ..Default::default()
        }),
    );
    let resp = ask().await;
    assert_eq!(resp.status(), 200);
    let (data, _) = tokio::time::timeout(Duration::from_secs(30), sse_data(resp))
        .await
        .expect("the gateway ended the stream");
    let last: Value = serde_json::from_str(data.last().unwrap()).unwrap();
    assert_eq!(last["error"]["code"], "upstream_error", "{last}");
    let grown = peak_rss_kib(pid).saturating_sub(before) / 1024;
    eprintln!("peak RSS grew {grown} MiB for a 96 MiB line");
    assert!(grown < 64, "peak RSS grew {grown} MiB for a 96 MiB line");
}

/// Tiny events without end (10 million, ~1.3 GB): the stream is served as long as the
/// upstream sends and its client reads, and the gateway keeps none of it — the text is
/// counted and let go of (`stream::tests::limits::a_long_stream_keeps_little_of_its_text_…`),
/// the uncacheable answer is not assembled. Here the client leaves after 20 000 events:
/// the stream is settled as a departure, the upstream call closed.
#[tokio::test]
async fn tiny_events_without_end_are_streamed_until_the_client_leaves() {
    let app = spawn_app().await;
    let (_, token) = app.token("endless", Some("1")).await;
    let tiny = word_chunk();
    app.mock.state.sticky(
        KEY_A,
        Some(Script {
            raw_stream: Some(vec![role_chunk(), tiny]),
            raw_repeat: 10_000_000,
            ..Default::default()
        }),
    );
    let resp = app.chat(&token, &stream_body()).await;
    assert_eq!(resp.status(), 200);
    let mut body = resp.bytes_stream();
    let mut events = 0;
    while events < 20_000 {
        let chunk = tokio::time::timeout(BOUND, futures_util::StreamExt::next(&mut body))
            .await
            .expect("events keep coming")
            .unwrap()
            .unwrap();
        events += chunk.windows(2).filter(|w| w == b"\n\n").count();
    }
    drop(body);
    app.wait_for_log_rows(1).await;
    let (status, code, output): (i64, Option<String>, i64) = sql_row(
        app.db(),
        "SELECT status, error_code, output_tokens FROM requests",
    )
    .await;
    assert_eq!(
        (status, code.as_deref()),
        (200, Some("client_disconnected"))
    );
    assert!(output >= 20_000, "{output} output tokens counted");
    app.assert_invariant().await;
    upstream_call_closed(&app).await;
}

/// A byte that is not UTF-8 in the middle of a stream, then valid events without end: the
/// event holding it is corrupt — the stream ends with the gateway's error event, charged by
/// the cut rule, the upstream closed — at once. (eventsource-stream's UTF-8 decoder keeps
/// an invalid byte, and everything after it, in its buffer for ever, decoding nothing: the
/// gateway read the upstream on, growing that buffer and re-validating all of it at every
/// chunk, until the idle timeout ended the "stalled" stream.)
#[tokio::test]
async fn a_byte_that_is_not_utf8_ends_the_stream_as_corrupt_at_once() {
    let app = spawn_app().await;
    let (id, token) = app.token("notutf8", Some("1")).await;
    let tiny = word_chunk();
    app.mock.state.sticky(
        KEY_A,
        Some(Script {
            raw_stream: Some(vec![role_chunk()]),
            raw_bytes: Some(vec![
                b"data: {\"x\": \"\xff\"}\n\n".to_vec(),
                tiny.into_bytes(),
            ]),
            raw_repeat: 1_000_000,
            raw_hold: true,
            ..Default::default()
        }),
    );
    let resp = app.chat(&token, &stream_body()).await;
    assert_eq!(resp.status(), 200);
    let (data, _) = tokio::time::timeout(BOUND, sse_data(resp))
        .await
        .expect("the gateway never ended the stream (the idle timeout is 60 s)");
    let last: Value = serde_json::from_str(data.last().unwrap()).unwrap();
    assert_eq!(last["error"]["code"], "upstream_error", "{last}");
    assert!(!data.iter().any(|d| d == "[DONE]"), "never [DONE]");
    assert_eq!(reassemble(&data[..data.len() - 1]), "Partly ");
    settled_as_cut(&app, id).await;
}

/// A line past the cap that comes in small pieces (1 KiB writes, 16 MiB): cut at the cap
/// as fast as one sent at once. The SSE parser re-parses an unfinished line from its start
/// at every chunk, so a line fed in pieces cost the square of its length: a worker busy for
/// minutes on one lying stream.
#[tokio::test]
async fn a_line_in_small_pieces_is_cut_at_the_cap_without_reparsing_it() {
    let app = spawn_app().await;
    let (id, token) = app.token("pieces", Some("1")).await;
    let cap = app.settings.upstream.max_response_bytes;
    app.mock.state.sticky(
        KEY_A,
        Some(Script {
            raw_stream: Some(vec![role_chunk(), "data: ".into(), "x".repeat(1024)]),
            // Four times the cap: the mock is still writing when the gateway closes.
            raw_repeat: (4 * cap / 1024) as u64,
            raw_hold: true,
            ..Default::default()
        }),
    );
    let (data, took) =
        streamed_within_45_s(&app, &token, "the gateway never ended the stream").await;
    eprintln!("ended after {took:?}");
    let last: Value = serde_json::from_str(data.last().unwrap()).unwrap();
    assert!(
        last["error"]["message"]
            .as_str()
            .unwrap()
            .contains("larger than the gateway accepts"),
        "{last}"
    );
    settled_as_cut(&app, id).await;
}

/// Blank lines in bulk (4 MiB of `\n` in 1 MiB writes: no event, none past the cap), then
/// the answer: served whole, in time. The SSE parser copies the rest of its buffer at every
/// line it takes, so a frame of hundreds of thousands of short lines cost the square of the
/// frame — seconds of a worker (and every connection on it) per frame: not served within
/// 45 s before `EventCap` handed it small pieces, 3.4 s after (a debug build).
#[tokio::test]
async fn blank_lines_in_bulk_cost_no_more_than_their_bytes() {
    let app = spawn_app().await;
    let (_, token) = app.token("blank", Some("1")).await;
    let content = format!(
        "data: {}\n\ndata: [DONE]\n\n",
        json!({"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m",
            "choices": [{"index": 0, "delta": {"content": "whole"}, "finish_reason": "stop"}]})
    );
    let mut pieces = vec![role_chunk()];
    pieces.extend(std::iter::repeat_n("\n".repeat(1 << 20), 4));
    pieces.push(content);
    app.mock.state.sticky(
        KEY_A,
        Some(Script {
            raw_stream: Some(pieces),
            ..Default::default()
        }),
    );
    let (data, took) =
        streamed_within_45_s(&app, &token, "the gateway never finished the stream").await;
    eprintln!("served after {took:?}");
    assert_eq!(data.last().unwrap(), "[DONE]", "{:?}", data.last());
    assert_eq!(reassemble(&data), "Partly whole");
}

/// Upstreams for the partial-usage cases: `gpt-4o-mini` on OpenAI (key A), `claude` on
/// Anthropic (key B), `gem` on Gemini (`GEMINI_KEY`), each at 0.15 / 0.60 USD per Mtok.
const GEMINI_KEY: &str = "sk-upstream-partial-usage-gemini";

async fn partial_usage_app() -> TestApp {
    usage_app(false).await
}

/// The partial-usage upstreams and models, and with `bedrock` one more: `bed` on a Bedrock
/// upstream scripted by `BEDROCK_KEY`.
async fn usage_app(bedrock: bool) -> TestApp {
    spawn_app_with(|s, m| {
        s.upstreams.extend([
            native_upstream(sluice::config::Provider::Anthropic, "c", KEY_B, m),
            native_upstream(sluice::config::Provider::Gemini, "g", GEMINI_KEY, m),
        ]);
        s.models
            .extend([model("claude", &["c"]), model("gem", &["g"])]);
        if bedrock {
            s.upstreams.push(bedrock_upstream("br", BEDROCK_KEY, m));
            s.models.push(model("bed", &["br"]));
        }
    })
    .await
}

/// Scripts `key`'s next answer: `text` with `usage` (`answer_with_usage`).
fn script_answer(app: &TestApp, key: &str, text: &str, usage: &Value) {
    app.mock.state.script(
        key,
        [Script {
            body: Some(answer_with_usage(key, text, usage.clone())),
            ..Script::default()
        }],
    );
}

fn answer_with_usage(key: &str, text: &str, usage: Value) -> Value {
    match key {
        KEY_B => json!({"id": "msg_1", "type": "message", "role": "assistant",
            "model": "claude-upstream", "content": [{"type": "text", "text": text}],
            "stop_reason": "end_turn", "stop_sequence": null, "usage": usage}),
        GEMINI_KEY => json!({"candidates": [{"content": {"role": "model",
            "parts": [{"text": text}]}, "finishReason": "STOP", "index": 0}],
            "usageMetadata": usage, "modelVersion": "gem-upstream", "responseId": "r1"}),
        _ => json!({"id": "chatcmpl-1", "object": "chat.completion", "created": 1,
            "model": "gpt-4o-mini", "choices": [{"index": 0, "finish_reason": "stop",
            "message": {"role": "assistant", "content": text}}], "usage": usage}),
    }
}

/// Attack finding: a non-streamed answer whose usage leaves a side out (`"usage": {}`, an
/// output figure alone — OpenAI's `completion_tokens`, Anthropic's `output_tokens`,
/// Gemini's `candidatesTokenCount`) was charged 0 input and its row not marked: an
/// upstream (or a proxy before it) that drops the input figure made the prompt free. Each
/// side is read as reported or absent: an absent input is charged the gateway's estimate,
/// an absent output the count of the answer's text, and the row says `usage_estimated`.
/// An input the upstream reports as 0 stays 0 (its word), and that row is not marked.
#[tokio::test]
async fn an_answer_whose_usage_leaves_a_side_out_is_charged_the_estimate_for_it() {
    use sluice::quota::estimate::{chat_input, count_text};
    let app = partial_usage_app().await;
    let message = json!({"role": "user", "content": "Why does the engine light blink?"});
    let counted = chat_input(std::slice::from_ref(&message), None);
    let said = "The engine light blinks because the sensor reads low oil pressure.";
    let spoken = count_text(said);
    let micros =
        |input: i64, output: i64| (input * 150_000 + output * 600_000 + 999_999) / 1_000_000;
    // (model, its upstream's key, the usage it reports, input charged, output, estimated)
    let cases = [
        ("gpt-4o-mini", KEY_A, json!({}), counted, spoken, true),
        (
            "gpt-4o-mini",
            KEY_A,
            json!({"completion_tokens": 40}),
            counted,
            40,
            true,
        ),
        (
            "claude",
            KEY_B,
            json!({"output_tokens": 5}),
            counted,
            5,
            true,
        ),
        (
            "gem",
            GEMINI_KEY,
            json!({"candidatesTokenCount": 7}),
            counted,
            7,
            true,
        ),
        // Reported zeros are the upstream's word: not estimated.
        (
            "gpt-4o-mini",
            KEY_A,
            json!({"prompt_tokens": 0, "completion_tokens": 40}),
            0,
            40,
            false,
        ),
        (
            "claude",
            KEY_B,
            json!({"input_tokens": 0, "output_tokens": 5}),
            0,
            5,
            false,
        ),
        (
            "gem",
            GEMINI_KEY,
            json!({"promptTokenCount": 0, "candidatesTokenCount": 7}),
            0,
            7,
            false,
        ),
        // The input alone: the output is counted from the answer's text.
        (
            "gpt-4o-mini",
            KEY_A,
            json!({"prompt_tokens": 30}),
            30,
            spoken,
            true,
        ),
    ];
    for (i, (model, key, usage, input, output, estimated)) in cases.into_iter().enumerate() {
        let (id, token) = app.token(&format!("partial-{i}"), Some("1")).await;
        script_answer(&app, key, said, &usage);
        let body = json!({"model": model, "max_tokens": 100, "messages": [message.clone()]});
        let resp = app.chat(&token, &body).await;
        let status = resp.status();
        let answer: Value = resp.json().await.unwrap();
        assert_eq!(status, 200, "{model} {usage}: {answer}");
        assert_eq!(
            answer["choices"][0]["message"]["content"], said,
            "{model} {usage}"
        );
        app.wait_for_log_rows(i as i64 + 1).await;
        app.wait_settled().await;
        let charged = app
            .scalar(&format!(
                "SELECT limit_micros - remaining_micros FROM tokens WHERE id = {id}"
            ))
            .await;
        let (row_input, row_output, row_cost, code): (i64, i64, i64, Option<String>) = sql_row(
            app.db(),
            &format!(
                "SELECT input_tokens, output_tokens, cost_micros, error_code FROM requests \
                 WHERE token_id = {id}"
            ),
        )
        .await;
        assert_eq!(
            (row_input, row_output),
            (input, output),
            "{model} {usage}: the row's tokens"
        );
        assert_eq!(charged, micros(input, output), "{model} {usage}: charged");
        assert_eq!(
            row_cost, charged,
            "{model} {usage}: the row and the ledger agree"
        );
        assert_eq!(
            code.as_deref() == Some("usage_estimated"),
            estimated,
            "{model} {usage}: the row's code {code:?}"
        );
    }
    app.assert_invariant().await;
}

/// Review finding (s16): a translated answer whose upstream left a side of its usage out
/// showed the client 0 for that side (the internal form's default) while the ledger charged
/// the gateway's count for it: an OpenAI client of a Claude upstream answering
/// `{"output_tokens": 5}` read `prompt_tokens: 0` and was charged its prompt. A side the
/// gateway counted is written into the translated answer as charged (as a translated
/// stream's `message_start` carries the estimate); a reported side stays as reported.
#[tokio::test]
async fn a_translated_answer_shows_the_side_its_upstream_left_out_as_charged() {
    use sluice::quota::estimate::{chat_input, count_text};
    let app = partial_usage_app().await;
    let message = json!({"role": "user", "content": "Why does the engine light blink?"});
    let counted = chat_input(std::slice::from_ref(&message), None);
    let said = "The engine light blinks because the sensor reads low oil pressure.";
    let spoken = count_text(said);
    // (client, model, its upstream's key, the usage it reports, input and output charged)
    let cases = [
        (
            "openai",
            "claude",
            KEY_B,
            json!({"output_tokens": 5}),
            (counted, 5),
        ),
        (
            "openai",
            "gem",
            GEMINI_KEY,
            json!({"candidatesTokenCount": 7}),
            (counted, 7),
        ),
        (
            "openai",
            "claude",
            KEY_B,
            json!({"input_tokens": 12}),
            (12, spoken),
        ),
        (
            "anthropic",
            "gpt-4o-mini",
            KEY_A,
            json!({"completion_tokens": 40}),
            (counted, 40),
        ),
        (
            "anthropic",
            "gpt-4o-mini",
            KEY_A,
            json!({}),
            (counted, spoken),
        ),
    ];
    for (i, (client, model, key, usage, (input, output))) in cases.into_iter().enumerate() {
        let case = format!("{client} client of {model}, usage {usage}");
        let (id, token) = app.token(&format!("shown-{i}"), Some("1")).await;
        script_answer(&app, key, said, &usage);
        let body = json!({"model": model, "max_tokens": 100, "messages": [message.clone()]});
        let resp = match client {
            "openai" => app.chat(&token, &body).await,
            _ => app.messages(&token, &body).await,
        };
        let status = resp.status();
        let answer: Value = resp.json().await.unwrap();
        assert_eq!(status, 200, "{case}: {answer}");
        app.wait_for_log_rows(i as i64 + 1).await;
        let (row_input, row_output): (i64, i64) = sql_row(
            app.db(),
            &format!("SELECT input_tokens, output_tokens FROM requests WHERE token_id = {id}"),
        )
        .await;
        assert_eq!((row_input, row_output), (input, output), "{case}: the row");
        let shown = match client {
            "openai" => (
                answer["usage"]["prompt_tokens"].as_i64(),
                answer["usage"]["completion_tokens"].as_i64(),
                answer["usage"]["total_tokens"].as_i64(),
            ),
            _ => (
                answer["usage"]["input_tokens"].as_i64(),
                answer["usage"]["output_tokens"].as_i64(),
                Some(input + output),
            ),
        };
        assert_eq!(
            shown,
            (Some(input), Some(output), Some(input + output)),
            "{case}: {answer}"
        );
    }
    // A Responses client of a Claude upstream: the answer and the stored response alike.
    let (id, token) = app.token("shown-responses", Some("1")).await;
    app.mock.state.script(
        KEY_B,
        [Script {
            body: Some(answer_with_usage(KEY_B, said, json!({"output_tokens": 5}))),
            ..Script::default()
        }],
    );
    let body = json!({"model": "claude", "max_output_tokens": 100,
        "input": "Why does the engine light blink?"});
    let resp = app.post("/v1/responses", &token, &body).await;
    let status = resp.status();
    let answer: Value = resp.json().await.unwrap();
    assert_eq!(status, 200, "{answer}");
    app.wait_for_log_rows(6).await;
    let input = app
        .scalar(&format!(
            "SELECT input_tokens FROM requests WHERE token_id = {id}"
        ))
        .await;
    assert!(input > 0);
    let want = json!({"input": input, "output": 5, "total": input + 5});
    let shown = |r: &Value| {
        json!({"input": r["usage"]["input_tokens"], "output": r["usage"]["output_tokens"],
            "total": r["usage"]["total_tokens"]})
    };
    assert_eq!(shown(&answer), want, "{answer}");
    let stored: Value = app
        .http
        .get(format!(
            "{}/v1/responses/{}",
            app.address,
            answer["id"].as_str().unwrap()
        ))
        .bearer_auth(&token)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(shown(&stored), want, "{stored}");
    app.assert_invariant().await;
}

/// Review finding (s16): an embeddings answer has no output side (OpenAI's usage is
/// `{"prompt_tokens", "total_tokens"}`), so reading it side by side marked every embeddings
/// row `usage_estimated` though its upstream reported all it bills. Its output is 0 by
/// the endpoint's nature; the row is marked only when its input is absent.
#[tokio::test]
async fn an_embeddings_answer_with_its_input_reported_is_not_marked_estimated() {
    let app = spawn_app().await;
    let (id, token) = app.token("embeds", Some("1")).await;
    let body = json!({"model": "gpt-4o-mini", "input": "The engine light blinks."});
    let resp = app.post("/v1/embeddings", &token, &body).await;
    let status = resp.status();
    let answer: Value = resp.json().await.unwrap();
    assert_eq!(status, 200, "{answer}");
    let reported = answer["usage"]["prompt_tokens"].as_i64().unwrap();
    app.wait_for_log_rows(1).await;
    let (input, output, code): (i64, i64, Option<String>) = sql_row(
        app.db(),
        &format!(
            "SELECT input_tokens, output_tokens, error_code FROM requests WHERE token_id = {id}"
        ),
    )
    .await;
    assert_eq!((input, output, code.as_deref()), (reported, 0, None));

    // Its input left out: the estimate, marked.
    app.mock.state.script(
        KEY_A,
        [Script {
            body: Some(json!({"object": "list", "model": "gpt-4o-mini",
                "data": [{"object": "embedding", "index": 0, "embedding": [0.5, 0.5]}],
                "usage": {}})),
            ..Script::default()
        }],
    );
    let (id, token) = app.token("embeds-unreported", Some("1")).await;
    assert_eq!(
        app.post("/v1/embeddings", &token, &body).await.status(),
        200
    );
    app.wait_for_log_rows(2).await;
    let (input, code): (i64, Option<String>) = sql_row(
        app.db(),
        &format!("SELECT input_tokens, error_code FROM requests WHERE token_id = {id}"),
    )
    .await;
    assert!(input > 0);
    assert_eq!(code.as_deref(), Some("usage_estimated"));
    app.assert_invariant().await;
}

/// The key the mock scripts the negative-usage app's Bedrock upstream by.
const BEDROCK_KEY: &str = "AKIDNEGATIVEUSAGE";

/// Review finding (s16c #8): a negative usage figure (`"prompt_tokens": -100000`) was
/// clamped to a reported 0: the input was charged 0 and the row not marked. A negative is no
/// report: that side is charged the gateway's estimate and the row says `usage_estimated`
/// — on every wire format, streamed or not. (An OpenAI stream's usage chunk counts only
/// whole: without a valid input its output is counted from the text too, as for any
/// partial usage there.)
#[tokio::test]
async fn a_negative_usage_figure_is_no_report_and_is_estimated() {
    use sluice::quota::estimate::{chat_input, count_text};
    let app = usage_app(true).await;
    let message = json!({"role": "user", "content": "Why does the engine light blink?"});
    let counted = chat_input(std::slice::from_ref(&message), None);
    let said = "The engine light blinks because the sensor reads low oil pressure.";
    let micros =
        |input: i64, output: i64| (input * 150_000 + output * 600_000 + 999_999) / 1_000_000;
    let mut n = 0;
    for stream in [false, true] {
        for (model, key) in [
            ("gpt-4o-mini", KEY_A),
            ("claude", KEY_B),
            ("gem", GEMINI_KEY),
            ("bed", BEDROCK_KEY),
        ] {
            let what = format!("{model}, stream {stream}");
            let (id, token) = app.token(&format!("negative-{n}"), Some("1")).await;
            n += 1;
            app.mock.state.script(
                key,
                [Script {
                    text: Some(said.into()),
                    prompt_tokens: Some(-100_000),
                    completion_tokens: Some(5),
                    ..Script::default()
                }],
            );
            let body = json!({"model": model, "max_tokens": 100, "stream": stream,
                "messages": [message.clone()]});
            let resp = app.chat(&token, &body).await;
            assert_eq!(resp.status(), 200, "{what}");
            if stream {
                let (data, whole) = sse_data(resp).await;
                assert!(whole, "{what}: {data:?}");
                assert_eq!(reassemble(&data), said, "{what}");
            } else {
                let answer: Value = resp.json().await.unwrap();
                assert_eq!(answer["choices"][0]["message"]["content"], said, "{what}");
            }
            app.wait_for_log_rows(n).await;
            app.wait_settled().await;
            let (input, output, cost, code): (i64, i64, i64, Option<String>) = sql_row(
                app.db(),
                &format!(
                    "SELECT input_tokens, output_tokens, cost_micros, error_code FROM requests \
                     WHERE token_id = {id}"
                ),
            )
            .await;
            let output_wanted = if stream && key == KEY_A {
                count_text(said)
            } else {
                5
            };
            assert_eq!(
                (input, output, code.as_deref()),
                (counted, output_wanted, Some("usage_estimated")),
                "{what}"
            );
            assert_eq!(cost, micros(counted, output_wanted), "{what}");
            let charged = app
                .scalar(&format!(
                    "SELECT limit_micros - remaining_micros FROM tokens WHERE id = {id}"
                ))
                .await;
            assert_eq!(charged, cost, "{what}: the row and the ledger agree");
        }
    }
    app.assert_invariant().await;
}

/// A Responses client of an Anthropic upstream whose text never ends: the Responses
/// writer keeps the answer for the stored response, and what it keeps counts against the
/// cap as a held-back block does. Past it the stream ends by the cut rule — the error event
/// in the client's format, no `response.completed`, nothing stored — inside the bound,
/// though the upstream holds its connection open.
#[tokio::test]
async fn a_responses_answer_kept_past_the_cap_ends_the_stream() {
    let app = spawn_app_with(|s, m| {
        s.upstream.max_response_bytes = CAP;
        add_claude(s, m);
    })
    .await;
    let (_, token) = app.token("responses-kept", Some("1")).await;
    let event = |name: &str, data: Value| format!("event: {name}\ndata: {data}\n\n");
    let start = event(
        "message_start",
        json!({"type": "message_start", "message": {"id": "msg_1", "type": "message",
            "role": "assistant", "model": "claude", "content": [], "stop_reason": null,
            "usage": {"input_tokens": 12, "output_tokens": 1}}}),
    );
    let block = event(
        "content_block_start",
        json!({"type": "content_block_start", "index": 0,
            "content_block": {"type": "text", "text": ""}}),
    );
    let delta = event(
        "content_block_delta",
        json!({"type": "content_block_delta", "index": 0,
            "delta": {"type": "text_delta", "text": "word ".repeat(200)}}),
    );
    // 4 MiB of text, 16 times the cap, then an hour's silence.
    app.mock.state.sticky(
        KEY_B,
        Some(Script {
            raw_stream: Some(vec![start, block, delta]),
            raw_repeat: 4096,
            raw_hold: true,
            ..Default::default()
        }),
    );
    let body = json!({"model": "claude", "max_output_tokens": 100, "stream": true,
        "input": "Why does the engine light blink?"});
    let resp = app.post("/v1/responses", &token, &body).await;
    assert_eq!(resp.status(), 200);
    let text = tokio::time::timeout(BOUND, resp.text())
        .await
        .expect("the gateway ended the stream")
        .expect("the body ends cleanly after the error event");
    let data: Vec<&str> = text
        .split("\n\n")
        .filter_map(|e| e.lines().find_map(|l| l.strip_prefix("data: ")))
        .collect();
    let last: Value = serde_json::from_str(data.last().unwrap()).unwrap();
    assert_eq!(last["type"], "error", "{last}");
    assert_eq!(last["code"], "upstream_error", "{last}");
    assert!(
        last["message"].as_str().unwrap().contains("held back more"),
        "{last}"
    );
    assert!(!data.iter().any(|d| d.contains("response.completed")));
    app.wait_for_log_rows(1).await;
    let (status, code, output, cost): (i64, Option<String>, i64, i64) = sql_row(
        app.db(),
        "SELECT status, error_code, output_tokens, cost_micros FROM requests",
    )
    .await;
    assert_eq!((status, code.as_deref()), (200, Some("upstream_error")));
    assert!(output > 0 && cost > 0, "output {output}, cost {cost}");
    assert_eq!(
        app.scalar("SELECT COUNT(*) FROM stored_responses").await,
        0,
        "nothing stored"
    );
    app.assert_invariant().await;
    key_call_closed(&app, KEY_B).await;
}

/// A whole non-streamed chat answer, as raw text.
fn chat_answer() -> String {
    json!({"id": "chatcmpl-late", "object": "chat.completion", "created": 1, "model": "m",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "Late."},
            "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 12, "completion_tokens": 2, "total_tokens": 14}})
    .to_string()
}

/// Headers at once, then a space every 200 ms for 10 s (JSON takes leading whitespace:
/// OpenRouter's keep-alive while a model works), then `last`.
fn trickled(status: u16, last: String) -> Script {
    let mut pieces = vec![" ".to_string(); 50];
    pieces.push(last);
    Script {
        status: Some(status),
        raw_stream: Some(pieces),
        chunk_delay_ms: 200,
        ..Default::default()
    }
}

/// s30 upstream attack F1: the request's deadline bounded an attempt only up to its
/// headers; a body trickled after them held the request (its gate slot, queue slot,
/// reservation) for as long as bytes came — 10 s here, 1 500 ms asked. Now the deadline
/// ends the body's read: a 502 at the deadline, charged the input as any attempt the
/// deadline cut after the upstream had it, nothing left reserved, the upstream closed.
#[tokio::test]
async fn a_non_streamed_body_trickled_after_its_headers_ends_at_the_deadline() {
    let app = spawn_app().await;
    let (_, token) = app.token("trickle", Some("1")).await;
    app.mock.state.script(KEY_A, [trickled(200, chat_answer())]);
    let started = std::time::Instant::now();
    let resp = tokio::time::timeout(
        BOUND,
        app.chat_with_deadline(&token, &chat_body(100), 1_500),
    )
    .await
    .expect("answered within the bound");
    let took = started.elapsed();
    assert_eq!(resp.status(), 502, "{}", resp.text().await.unwrap());
    assert!(
        took < Duration::from_millis(2_000),
        "answered at the deadline (1 500 ms), not when the body ended: {took:?}"
    );
    app.wait_for_log_rows(1).await;
    let (code, cost): (Option<String>, i64) =
        sql_row(app.db(), "SELECT error_code, cost_micros FROM requests").await;
    assert_eq!(code.as_deref(), Some("upstream_error"));
    assert!(
        cost > 0,
        "cut by the deadline after the upstream had it: its input"
    );
    app.assert_invariant().await;
    upstream_call_closed(&app).await;
}

/// The same for an error body: key A's 429 trickles its body. It is read for a short
/// fixed while (it only classifies the answer), and the next key — here the fallback
/// model's, key B — serves well within the request's deadline.
#[tokio::test]
async fn a_429_whose_body_trickles_moves_to_the_next_key_in_time() {
    let app = spawn_app_with(|s, m| {
        s.upstreams.push(upstream("b", KEY_B, m));
        s.models[0].fallbacks = vec!["backup".into()];
        s.models.push(model("backup", &["b"]));
    })
    .await;
    let (_, token) = app.token("trickle", Some("1")).await;
    let error = json!({"error": {"message": "Rate limit reached", "type": "rate_limit_error",
        "param": null, "code": "rate_limit_exceeded"}});
    app.mock
        .state
        .script(KEY_A, [trickled(429, error.to_string())]);
    let started = std::time::Instant::now();
    let resp = tokio::time::timeout(
        BOUND,
        app.chat_with_deadline(&token, &chat_body(100), 6_000),
    )
    .await
    .expect("answered within the bound");
    let took = started.elapsed();
    assert_eq!(resp.status(), 200, "{}", resp.text().await.unwrap());
    assert_eq!(resp.headers().get("x-sluice-upstream").unwrap(), "b");
    assert!(
        took < Duration::from_millis(4_000),
        "the next key served within the deadline, not after the error body: {took:?}"
    );
    app.wait_settled().await;
    app.assert_invariant().await;
    key_call_closed(&app, KEY_A).await;
}

/// An upstream that says it is still working with SSE comment lines (OpenRouter's `:
/// OPENROUTER PROCESSING`) for three idle timeouts before its first event: the stream is
/// held open and served whole, not cut as stalled and counted against the key (s30 streams
/// attack F4: the parser drops comments, and the idle clock heard nothing). Comments after
/// the finish still hold nothing open.
#[tokio::test]
async fn comment_keepalives_before_the_first_event_hold_the_stream_open() {
    let app = spawn_app_with(|s, _| s.upstream.stream_idle_timeout_ms = 500).await;
    let (_, token) = app.token("keepalive", Some("1")).await;
    let finish = format!(
        "data: {}\n\n",
        json!({"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m",
            "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
    );
    let mut pieces = vec![": OPENROUTER PROCESSING\n\n".to_string(); 8];
    pieces.extend([role_chunk(), finish, "data: [DONE]\n\n".into()]);
    app.mock.state.sticky(
        KEY_A,
        Some(Script {
            raw_stream: Some(pieces),
            chunk_delay_ms: 200,
            ..Default::default()
        }),
    );
    let (data, took) = streamed_within_45_s(&app, &token, "the stream ended").await;
    assert_eq!(data.last().map(String::as_str), Some("[DONE]"), "{data:?}");
    assert!(took >= Duration::from_millis(1_600), "{took:?}");
    assert!(
        !data.iter().any(|d| d.contains("upstream_error")),
        "{data:?}"
    );
    app.wait_for_log_rows(1).await;
    let (code,): (Option<String>,) = sql_row(app.db(), "SELECT error_code FROM requests").await;
    // Whole (no usage was scripted: the estimate), not cut.
    assert_eq!(code.as_deref(), Some("usage_estimated"));
    assert_eq!(
        app.state.pool().breakers[0].state(),
        sluice::upstream::breaker::State::Closed
    );
    app.assert_invariant().await;

    // After the finish and its usage, comments are as pings: the stream completes at the
    // idle timeout.
    let usage = format!(
        "data: {}\n\n",
        json!({"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m",
            "choices": [], "usage": {"prompt_tokens": 10, "completion_tokens": 2, "total_tokens": 12}})
    );
    let finish = format!(
        "data: {}\n\n",
        json!({"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m",
            "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
    );
    app.mock.state.sticky(
        KEY_A,
        Some(Script {
            raw_stream: Some(vec![role_chunk(), finish, usage, ": still here\n\n".into()]),
            raw_repeat: 1_000,
            chunk_delay_ms: 100,
            ..Default::default()
        }),
    );
    let (data, took) = streamed_within_45_s(&app, &token, "the stream ended").await;
    assert_eq!(data.last().map(String::as_str), Some("[DONE]"), "{data:?}");
    assert!(took < Duration::from_secs(5), "{took:?}");
}
