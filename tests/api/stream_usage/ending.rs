//! How a stream ends after its finish: its body's end or break completes it once the usage
//! came (or none was asked for); a usage lost on the way, or an event the gateway cannot
//! read, cuts it; a client leaving before the usage is settled once, at the count.

use serde_json::{json, Value};
use sluice::mock::{Script, SseEvent};

use super::script::{events, scripted, Piece};
use super::{app, app_with, cost, stream, stream_n, Up, TEXT};
use crate::helpers::*;

/// The body breaks after the finish and its usage, where `[DONE]`, `message_stop` or a
/// later chunk would come: the answer was whole, so the client's stream completes and the
/// reported usage is the price. (The mock cuts no scripted Bedrock stream; its `metadata`
/// is its end.)
#[tokio::test]
async fn a_body_cut_after_the_usage_that_followed_the_finish_is_complete_and_charged_it() {
    let app = app().await;
    for (up, pieces) in [
        (
            Up::OpenAi,
            vec![
                Piece::Text,
                Piece::Finish(None),
                Piece::Usage(1000, 40),
                Piece::End,
            ],
        ),
        (
            Up::Gemini,
            vec![
                Piece::Text,
                Piece::Finish(None),
                Piece::Usage(1000, 40),
                Piece::Usage(1, 1),
            ],
        ),
        (
            Up::Anthropic,
            vec![Piece::Text, Piece::Finish(Some((1000, 40))), Piece::End],
        ),
    ] {
        let what = format!("{up:?}");
        let mut script = scripted(up, &pieces);
        // Broken where the last event would come.
        script.cut_after = Some(script.events.as_ref().unwrap().len() - 1);
        let c = stream(&app, up, &format!("c-{what}"), script, 4096).await;
        c.complete(&what);
        c.exactly(&what, 1000, 40);
    }
    app.assert_invariant().await;
}

/// An event the gateway cannot read after the finish — here one larger than it accepts —
/// may be the usage: the stream is cut (an error event, logged as an upstream error) and
/// charged the usage reported with the finish.
#[tokio::test]
async fn an_event_too_large_after_the_finish_cuts_the_stream() {
    let app = app_with(|s| s.upstream.max_response_bytes = 64 * 1024).await;
    let mut events = events(Up::Gemini, &[Piece::Text, Piece::Finish(Some((7, 40)))]);
    events.push(SseEvent::Data(
        json!({"usageMetadata": {"promptTokenCount": 7, "candidatesTokenCount": 40},
            "padding": "x".repeat(128 * 1024)}),
    ));
    let script = Script {
        events: Some(events),
        ..Script::default()
    };
    let c = stream(&app, Up::Gemini, "too-large", script, 4096).await;
    let last: Value = serde_json::from_str(c.data.last().unwrap()).unwrap();
    assert_eq!(last["error"]["code"], "upstream_error", "{:?}", c.data);
    assert!(!c.data.iter().any(|d| d == "[DONE]"), "{:?}", c.data);
    assert_eq!(c.logged.3.as_deref(), Some("upstream_error"));
    assert_eq!((c.logged.0, c.logged.1), (7, 40));
    assert_eq!((c.spent, c.absorbed), (cost(7, 40), 0));
    app.assert_invariant().await;
}

/// The client leaves after the finish, while the upstream holds its body before the usage
/// (and the end): its answer was whole, so it is no departure (s16c finding 3) — the
/// gateway reads on for the usage at most `stream::AFTER_THE_FINISH` (2 s), then settles it
/// once, charged the input reported before the finish (or the estimate) and the output
/// counted from the text received.
#[tokio::test]
async fn a_client_leaving_after_the_finish_before_the_usage_is_settled_once_at_the_count() {
    let app = app().await;
    let counted = sluice::quota::estimate::count_text(&TEXT.repeat(3));
    for (up, pieces) in [
        (
            Up::OpenAi,
            vec![
                Piece::RunningText(1000, 1),
                Piece::Text,
                Piece::Text,
                Piece::Finish(None),
                Piece::Usage(1000, 40),
                Piece::End,
            ],
        ),
        (
            Up::Gemini,
            vec![
                Piece::RunningText(1000, 1),
                Piece::Text,
                Piece::Text,
                Piece::Finish(None),
                Piece::Usage(1000, 40),
            ],
        ),
        // (The mock holds no scripted Bedrock stream.)
    ] {
        let what = format!("{up:?}");
        let (id, token) = app.token(&format!("leave-{what}"), Some("1")).await;
        let mut script = scripted(up, &pieces);
        let all = script.events.as_ref().unwrap();
        // Held for an hour right after the finish.
        let finish = all.iter().rposition(|e| match e {
            SseEvent::Data(v) => {
                v["choices"][0]["finish_reason"].is_string()
                    || v["candidates"][0]["finishReason"].is_string()
            }
            SseEvent::Named(..) => false,
        });
        script.stall_after = Some(finish.unwrap() + 1);
        app.mock.state.script(up.key(), [script]);
        let resp = app
            .chat(
                &token,
                &json!({"model": up.model(), "stream": true, "max_tokens": 4096,
                    "stream_options": {"include_usage": true},
                    "messages": [{"role": "user", "content": "hi"}]}),
            )
            .await;
        assert_eq!(resp.status(), 200, "{what}");
        let mut body = resp.bytes_stream();
        let mut seen = String::new();
        while !seen.contains("finish_reason\":\"") {
            let chunk = tokio::time::timeout(
                std::time::Duration::from_secs(30),
                futures_util::StreamExt::next(&mut body),
            )
            .await
            .expect("the finish comes")
            .expect("the body is open")
            .unwrap();
            seen.push_str(&String::from_utf8_lossy(&chunk));
        }
        drop(body);
        let row = format!("FROM requests WHERE token_id = {id}");
        for _ in 0..1500 {
            if app.scalar(&format!("SELECT COUNT(*) {row}")).await == 1 {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        app.wait_settled().await;
        let logged: (i64, i64, i64, Option<String>) = sql_row(
            app.db(),
            &format!("SELECT input_tokens, output_tokens, cost_micros, error_code {row}"),
        )
        .await;
        assert_eq!(logged.3.as_deref(), None, "{what}: {logged:?}");
        assert_eq!(logged.1, counted, "{what}: the counted output");
        // The output is the gateway's count: the row says so in its column (its code
        // stays the input's alone, as before).
        assert_eq!(
            app.scalar(&format!(
                "SELECT CAST(CASE WHEN usage_estimated THEN 1 ELSE 0 END AS BIGINT) {row}"
            ))
            .await,
            1,
            "{what}: the counted output is estimated"
        );
        assert_eq!(
            logged.0, 1000,
            "{what}: the input reported before the finish"
        );
        let settles = app
            .scalar(&format!(
                "SELECT COUNT(*) FROM ledger WHERE kind = 'settle' AND token_id = {id}"
            ))
            .await;
        let spent = app
            .scalar(&format!(
                "SELECT 1000000 - remaining_micros FROM tokens WHERE id = {id}"
            ))
            .await;
        assert_eq!(
            (settles, spent),
            (1, cost(logged.0, logged.1)),
            "{what}: settled once"
        );
    }
    app.assert_invariant().await;
}

/// A format whose stream ends with an end event after its usage (OpenAI's usage chunk
/// and `[DONE]`, Anthropic's `message_delta` usage and `message_stop`, Bedrock's `metadata`)
/// whose body ends after the finish with neither the usage nor the end: the usage was
/// lost on the way — the stream is cut (CHECKS Q5: an error ending, not `[DONE]`), charged
/// the estimate. Gemini has no end event: its finish and the body's end complete it.
#[tokio::test]
async fn a_finish_whose_usage_and_end_never_came_is_a_cut() {
    let app = app().await;
    for (up, pieces) in [
        (Up::OpenAi, vec![Piece::Text, Piece::Finish(None)]),
        (Up::Anthropic, vec![Piece::Text, Piece::Finish(None)]),
        (Up::Bedrock, vec![Piece::Text, Piece::Finish(None)]),
    ] {
        let what = format!("{up:?}");
        let c = stream(
            &app,
            up,
            &format!("lost-{what}"),
            scripted(up, &pieces),
            100,
        )
        .await;
        let last: Value = serde_json::from_str(c.data.last().unwrap()).unwrap();
        assert_eq!(
            last["error"]["code"], "upstream_error",
            "{what}: {:?}",
            c.data
        );
        assert!(
            !c.data.iter().any(|d| d == "[DONE]"),
            "{what}: {:?}",
            c.data
        );
        assert_eq!(c.logged.3.as_deref(), Some("upstream_error"), "{what}");
        let counted = sluice::quota::estimate::count_text(TEXT);
        assert_eq!(c.logged.1, counted, "{what}");
        assert_eq!(c.spent, cost(c.logged.0, counted), "{what}");
    }
    app.assert_invariant().await;
}

/// A server the gateway does not ask for its usage (`quirks.include_usage = false`) that
/// sends no `[DONE]` either: its finish and the body's end complete the stream (no usage was
/// lost: none was asked for), charged the count.
#[tokio::test]
async fn a_server_not_asked_for_usage_completes_at_its_finish_and_the_body_end() {
    let app = app_with(|s| {
        let oa = s.upstreams.iter_mut().find(|u| u.id == "oa").unwrap();
        oa.quirks.include_usage = false;
    })
    .await;
    let pieces = [Piece::Text, Piece::Finish(None)];
    let c = stream(
        &app,
        Up::OpenAi,
        "no-usage-asked",
        scripted(Up::OpenAi, &pieces),
        100,
    )
    .await;
    c.complete_estimated("no usage asked");
    let counted = sluice::quota::estimate::count_text(TEXT);
    assert_eq!(c.logged.1, counted);
    assert_eq!(c.spent, cost(c.logged.0, counted));
    app.assert_invariant().await;
}

/// Review finding (s20 G5): an `n` = 3 answer whole at its end after call 0's usage, then
/// `parted` (choice 1 starts), whole at its end again at a usage the gateway cannot read,
/// its body ending without `[DONE]`: call 0's report still counted as one made with the
/// usage that made the answer whole at its end, and the stream completed. Without a
/// readable report since it is a cut, as with `n` = 1.
#[tokio::test]
async fn a_parted_answer_whose_last_usage_cannot_be_read_is_a_cut_at_its_body_s_end() {
    let app = app().await;
    let chunk = |choices: Value, usage: Value| {
        SseEvent::Data(
            json!({"id": "c1", "object": "chat.completion.chunk", "created": 1,
            "model": "m", "choices": choices, "usage": usage}),
        )
    };
    let text = |i: i64| {
        chunk(
            json!([{"index": i, "delta": {"content": TEXT}, "finish_reason": null}]),
            Value::Null,
        )
    };
    let finish = |i: i64| {
        chunk(
            json!([{"index": i, "delta": {}, "finish_reason": "stop"}]),
            Value::Null,
        )
    };
    let events = vec![
        text(0),
        finish(0),
        chunk(
            json!([]),
            json!({"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}),
        ),
        text(1),
        finish(1),
        chunk(json!([]), json!({"prompt_tokens": 10})),
    ];
    let c = stream_n(
        &app,
        Up::OpenAi,
        "parted-unread",
        Script {
            events: Some(events),
            ..Script::default()
        },
        4096,
        3,
    )
    .await;
    assert!(!c.data.iter().any(|d| d == "[DONE]"), "{:?}", c.data);
    let last: Value = serde_json::from_str(c.data.last().unwrap()).unwrap();
    assert_eq!(last["error"]["code"], "upstream_error", "{:?}", c.data);
    assert_eq!(c.logged.3.as_deref(), Some("upstream_error"));
    app.assert_invariant().await;
}
