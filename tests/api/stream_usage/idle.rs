//! An upstream that keeps its body open after the finish — silent, with keep-alive
//! comments, with small events or a usage that keeps changing: the gateway waits no longer
//! than the idle timeout after the last of the answer, then completes the stream.

use serde_json::{json, Value};
use sluice::mock::{Script, SseEvent};

use super::script::{scripted, Piece};
use super::{app_with, stream, stream_n, Up, TEXT};

/// An upstream that finished, told its usage and then holds its body open: the idle timer
/// ends the wait, and the stream is complete and charged that usage.
#[tokio::test]
async fn a_body_held_open_after_the_finish_completes_at_the_idle_timeout() {
    let app = app_with(|s| s.upstream.stream_idle_timeout_ms = 1500).await;
    for (up, pieces) in [
        (
            Up::OpenAi,
            vec![
                Piece::Text,
                Piece::Finish(None),
                Piece::Usage(1000, 40),
                Piece::Text,
            ],
        ),
        (
            Up::Gemini,
            vec![
                Piece::Text,
                Piece::Finish(Some((1000, 40))),
                Piece::Usage(1000, 40),
            ],
        ),
    ] {
        let what = format!("{up:?}");
        let mut script = scripted(up, &pieces);
        // Held before its last event, for an hour.
        script.stall_after = Some(script.events.as_ref().unwrap().len() - 1);
        let c = stream(&app, up, &format!("s-{what}"), script, 4096).await;
        c.complete(&what);
        c.exactly(&what, 1000, 40);
    }
    app.assert_invariant().await;
}

/// After its finish and usage, an upstream keeps its body open with an endless run of SSE
/// comments (keep-alives): they carry no event, so they do not hold the idle timer off —
/// the stream completes at the idle timeout, charged the usage.
#[tokio::test]
async fn keep_alive_comments_after_the_finish_do_not_hold_the_stream_open() {
    let app = app_with(|s| s.upstream.stream_idle_timeout_ms = 1500).await;
    let data = |v: Value| format!("data: {v}\n\n");
    let script = Script {
        raw_stream: Some(vec![
            data(
                json!({"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": "m",
                "choices": [{"index": 0, "delta": {"content": TEXT}, "finish_reason": null}]}),
            ),
            data(
                json!({"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": "m",
                "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}),
            ),
            data(
                json!({"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": "m",
                "choices": [], "usage": {"prompt_tokens": 1000, "completion_tokens": 40, "total_tokens": 1040}}),
            ),
            ": keep-alive\n\n".to_string(),
        ]),
        raw_repeat: 50_000,
        raw_hold: true,
        ..Script::default()
    };
    let c = stream(&app, Up::OpenAi, "comments", script, 4096).await;
    c.complete("comments");
    c.exactly("comments", 1000, 40);
    app.assert_invariant().await;
}

/// After its finish (and usage) an upstream sends small events without end — Anthropic's
/// `ping`, OpenAI's usage chunk again and again — and never ends its body (the mock sends
/// no raw Gemini stream). The answer is whole: the
/// gateway waits for the end no longer than the idle timeout after the finish, and the
/// client's stream completes, charged the last usage — not held open as long as the
/// upstream likes (the client never getting its `[DONE]`, the reservation never settled).
#[tokio::test]
async fn endless_small_events_after_the_finish_do_not_hold_the_stream_open() {
    let app = app_with(|s| s.upstream.stream_idle_timeout_ms = 1500).await;
    let data = |v: Value| format!("data: {v}\n\n");
    let named = |n: &str, v: Value| format!("event: {n}\ndata: {v}\n\n");
    let openai_usage = json!({"id": "c1", "object": "chat.completion.chunk", "created": 1,
        "model": "m", "choices": [], "usage": {"prompt_tokens": 1000, "completion_tokens": 40,
        "total_tokens": 1040}});
    for (up, pieces) in [
        (
            Up::Anthropic,
            vec![
                named(
                    "message_start",
                    json!({"type": "message_start", "message": {"id": "msg_1",
                    "type": "message", "role": "assistant", "model": "claude", "content": [],
                    "stop_reason": null, "usage": {"input_tokens": 1000, "output_tokens": 1}}}),
                ),
                named(
                    "content_block_start",
                    json!({"type": "content_block_start", "index": 0,
                    "content_block": {"type": "text", "text": ""}}),
                ),
                named(
                    "content_block_delta",
                    json!({"type": "content_block_delta", "index": 0,
                    "delta": {"type": "text_delta", "text": TEXT}}),
                ),
                named(
                    "content_block_stop",
                    json!({"type": "content_block_stop", "index": 0}),
                ),
                named(
                    "message_delta",
                    json!({"type": "message_delta",
                    "delta": {"stop_reason": "end_turn", "stop_sequence": null},
                    "usage": {"output_tokens": 40}}),
                ),
                named("ping", json!({"type": "ping"})),
            ],
        ),
        (
            Up::OpenAi,
            vec![
                data(
                    json!({"id": "c1", "object": "chat.completion.chunk", "created": 1,
                    "model": "m", "choices": [{"index": 0, "delta": {"content": TEXT},
                    "finish_reason": null}]}),
                ),
                data(
                    json!({"id": "c1", "object": "chat.completion.chunk", "created": 1,
                    "model": "m", "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}),
                ),
                data(openai_usage),
            ],
        ),
    ] {
        let what = format!("{up:?}");
        let script = Script {
            raw_stream: Some(pieces),
            raw_repeat: 1 << 40,
            raw_hold: true,
            ..Script::default()
        };
        let c = tokio::time::timeout(
            std::time::Duration::from_secs(60),
            stream(&app, up, &format!("endless-{what}"), script, 4096),
        )
        .await
        .unwrap_or_else(|_| panic!("{what}: the stream did not complete in 60 s"));
        c.complete(&what);
        c.exactly(&what, 1000, 40);
    }
    app.assert_invariant().await;
}

/// After its finish a lying upstream tells a new usage every 50 ms for 100 s, never the
/// same twice, and never ends its body: only the answer's own text holds the stream open
/// after the finish, so the gateway waits no longer than the idle timeout after the last
/// of it, then completes the stream, charged the last usage it read and told the client.
#[tokio::test]
async fn usage_that_keeps_changing_after_the_finish_does_not_hold_the_stream_open() {
    let app = app_with(|s| s.upstream.stream_idle_timeout_ms = 1500).await;
    let chunk = |choices: Value, usage: Value| {
        SseEvent::Data(
            json!({"id": "c1", "object": "chat.completion.chunk", "created": 1,
            "model": "m", "choices": choices, "usage": usage}),
        )
    };
    let mut events = vec![
        chunk(
            json!([{"index": 0, "delta": {"content": TEXT}, "finish_reason": null}]),
            Value::Null,
        ),
        chunk(
            json!([{"index": 0, "delta": {}, "finish_reason": "stop"}]),
            Value::Null,
        ),
    ];
    events.extend((0..2000).map(|i| {
        chunk(
            json!([]),
            json!({"prompt_tokens": 1000, "completion_tokens": 40 + i, "total_tokens": 1040 + i}),
        )
    }));
    let script = Script {
        events: Some(events),
        chunk_delay_ms: 50,
        ..Script::default()
    };
    let c = tokio::time::timeout(
        std::time::Duration::from_secs(60),
        stream(&app, Up::OpenAi, "changing", script, 4096),
    )
    .await
    .expect("the stream completes: changing usage after the finish does not hold it open");
    c.complete("changing");
    let output = c.logged.1;
    assert!((40..2040).contains(&output), "{output}");
    c.exactly("changing", 1000, output);
    app.assert_invariant().await;
}

/// Review finding (s19 attack F6): an `n` = 2 answer from a server that ignores `n` — choice
/// 0, its finish, then a new usage every 50 ms for 30 s, never ending its body — is whole at
/// its end, and its usages tell no more of it: they held the stream open as long as they
/// came (the idle clock was armed only at the finish of every choice asked for). The
/// gateway waits no longer than the idle timeout after the last of its text, then completes
/// it, charged the most reported and told the client.
#[tokio::test]
async fn usage_that_keeps_changing_after_an_answer_whole_at_its_end_does_not_hold_the_stream_open()
{
    let app = app_with(|s| s.upstream.stream_idle_timeout_ms = 1500).await;
    let chunk = |choices: Value, usage: Value| {
        SseEvent::Data(
            json!({"id": "c1", "object": "chat.completion.chunk", "created": 1,
            "model": "m", "choices": choices, "usage": usage}),
        )
    };
    let mut events = vec![
        chunk(
            json!([{"index": 0, "delta": {"content": TEXT}, "finish_reason": null}]),
            Value::Null,
        ),
        chunk(
            json!([{"index": 0, "delta": {}, "finish_reason": "stop"}]),
            Value::Null,
        ),
    ];
    events.extend((0..600).map(|i| {
        chunk(
            json!([]),
            json!({"prompt_tokens": 1000, "completion_tokens": 40 + i, "total_tokens": 1040 + i}),
        )
    }));
    let script = Script {
        events: Some(events),
        chunk_delay_ms: 50,
        ..Script::default()
    };
    let c = tokio::time::timeout(
        std::time::Duration::from_secs(20),
        stream_n(&app, Up::OpenAi, "ignored", script, 4096, 2),
    )
    .await
    .expect("the stream completes: usages after an answer whole at its end do not hold it open");
    c.complete("ignored");
    let output = c.logged.1;
    assert!((40..640).contains(&output), "{output}");
    c.exactly("ignored", 1000, output);
    app.assert_invariant().await;
}
