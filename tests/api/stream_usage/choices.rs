//! Which text reaches the client: nothing of the answer after its finish, not another
//! choice's either; before it every choice's, one on the wrong index included; with `n` > 1
//! each choice until its own finish.

use serde_json::{json, Value};
use sluice::mock::{Script, SseEvent};

use super::script::{scripted, Piece};
use super::{app, app_with, cost, stream, stream_n, text_after_finish, Up, TEXT};
use crate::helpers::*;

/// A lying upstream finishes, reports a tiny usage, and then goes on sending text: the
/// answer was whole at the finish, so nothing after it reaches the client — else the client
/// would hold many more tokens than the reported usage it is charged (the price, see the
/// module doc of `translate::stream`).
#[tokio::test]
async fn text_after_the_finish_does_not_reach_the_client_uncharged() {
    let app = app().await;
    let more = vec![Piece::Text; 200];
    let mut broken = Vec::new();
    for (up, pieces) in [
        (
            Up::OpenAi,
            [
                vec![Piece::Text, Piece::Finish(None), Piece::Usage(5, 1)],
                more.clone(),
                vec![Piece::End],
            ]
            .concat(),
        ),
        (
            Up::Anthropic,
            [
                vec![Piece::Text, Piece::Finish(Some((5, 1)))],
                more.clone(),
                vec![Piece::End],
            ]
            .concat(),
        ),
        (
            Up::Gemini,
            [vec![Piece::Text, Piece::Finish(Some((5, 1)))], more.clone()].concat(),
        ),
        (
            Up::Bedrock,
            [
                vec![Piece::Text, Piece::Finish(None)],
                more.clone(),
                vec![Piece::Usage(5, 1)],
            ]
            .concat(),
        ),
    ] {
        let what = format!("{up:?}");
        let c = stream(
            &app,
            up,
            &format!("after-{what}"),
            scripted(up, &pieces),
            4096,
        )
        .await;
        let (after, all) = text_after_finish(&c.data);
        if !after.is_empty() || (c.logged.0, c.logged.1) != (5, 1) {
            broken.push(format!(
                "{what}: {} bytes of text after the finish (of {} received), charged {:?}",
                after.len(),
                all.len(),
                (c.logged.0, c.logged.1)
            ));
        }
    }
    assert!(broken.is_empty(), "{broken:#?}");
    app.assert_invariant().await;
}

/// Review finding (s19 attack F1): an `n` = 1 upstream that numbers its choices wrongly —
/// LiteLLM in front of Claude with thinking: the reasoning on index 0, the answer's text on
/// index 1, the finish on either — had the answer dropped, its client getting only the
/// reasoning and paying the usage. Before the finish such a choice reaches the client.
#[tokio::test]
async fn an_answer_on_the_wrong_choice_index_reaches_the_client() {
    let app = app().await;
    let chunk = |choices: Value, usage: Value| {
        SseEvent::Data(
            json!({"id": "c1", "object": "chat.completion.chunk", "created": 1,
            "model": "m", "choices": choices, "usage": usage}),
        )
    };
    for finish_on in [0, 1] {
        let user = format!("wrong{finish_on}");
        let events = vec![
            chunk(
                json!([{"index": 0, "delta": {"reasoning_content": "thinking "},
                    "finish_reason": null}]),
                Value::Null,
            ),
            chunk(
                json!([{"index": 1, "delta": {"content": TEXT}, "finish_reason": null}]),
                Value::Null,
            ),
            chunk(
                json!([{"index": finish_on, "delta": {}, "finish_reason": "stop"}]),
                Value::Null,
            ),
            chunk(
                json!([]),
                json!({"prompt_tokens": 1000, "completion_tokens": 40, "total_tokens": 1040}),
            ),
            SseEvent::Data(json!("[DONE]")),
        ];
        let script = Script {
            events: Some(events),
            ..Script::default()
        };
        let c = stream(&app, Up::OpenAi, &user, script, 4096).await;
        let texts: String = c
            .data
            .iter()
            .filter_map(|d| serde_json::from_str::<Value>(d).ok())
            .flat_map(|v| v["choices"].as_array().cloned().unwrap_or_default())
            .filter_map(|ch| ch["delta"]["content"].as_str().map(str::to_string))
            .collect();
        assert_eq!(texts, TEXT, "finish on {finish_on}: {:?}", c.data);
        c.complete(&user);
        assert_eq!(c.logged.0, 1000, "{user}");
        assert!(c.logged.1 >= 40, "{user}: {:?}", c.logged);
    }
    app.assert_invariant().await;
}

/// After the final usage the answer and its price are told: text of another choice (one
/// the client never asked for) that a lying upstream sends then neither reaches the client
/// uncharged nor holds the stream open past the idle timeout.
#[tokio::test]
async fn text_of_another_choice_after_the_final_usage_is_not_passed_on() {
    let app = app_with(|s| s.upstream.stream_idle_timeout_ms = 1500).await;
    let pieces = [
        vec![Piece::Text, Piece::Finish(None), Piece::Usage(5, 1)],
        vec![Piece::OtherChoiceText; 100],
        vec![Piece::End],
    ]
    .concat();
    let c = stream(
        &app,
        Up::OpenAi,
        "other-choice",
        scripted(Up::OpenAi, &pieces),
        4096,
    )
    .await;
    let (after, all) = text_after_finish(&c.data);
    assert_eq!((after.as_str(), all.as_str()), ("", TEXT), "{:?}", c.data);
    c.complete("other choice");
    c.exactly("other choice", 5, 1);

    // Endless: one such chunk every 50 ms for 100 s, never an end.
    let mut script = scripted(
        Up::OpenAi,
        &[
            vec![Piece::Text, Piece::Finish(None), Piece::Usage(5, 1)],
            vec![Piece::OtherChoiceText; 2000],
        ]
        .concat(),
    );
    script.chunk_delay_ms = 50;
    let c = tokio::time::timeout(
        std::time::Duration::from_secs(60),
        stream(&app, Up::OpenAi, "other-choice-endless", script, 4096),
    )
    .await
    .expect("another choice's text after the final usage does not hold the stream open");
    c.complete("endless other choice");
    c.exactly("endless other choice", 5, 1);
    app.assert_invariant().await;
}

/// An `n` > 1 stream from a server that puts a running usage on its chunks (vLLM's
/// continuous usage): the usage on the chunk that finishes choice 0 is no final word while
/// choice 1 still streams — its text reaches the client, and the last usage chunk prices it.
/// (Until s19 the request asked for one choice, and its upstream's choice 1 — one not asked
/// for, no part of the answer after the finish, `translate::stream`'s
/// `a_choice_not_asked_for_is_neither_passed_on_nor_counted_after_the_finish` — stood for
/// the second.)
#[tokio::test]
async fn another_choice_still_streaming_after_a_usage_on_the_finish_reaches_the_client() {
    let app = app().await;
    let pieces = [
        Piece::Text,
        Piece::Finish(Some((5, 1))),
        Piece::OtherChoiceText,
        Piece::OtherChoiceText,
        Piece::OtherChoiceFinish,
        Piece::Usage(5, 9),
        Piece::End,
    ];
    let c = stream_n(
        &app,
        Up::OpenAi,
        "n2",
        scripted(Up::OpenAi, &pieces),
        4096,
        2,
    )
    .await;
    let (after, _) = text_after_finish(&c.data);
    assert_eq!(after, TEXT.repeat(2), "{:?}", c.data);
    c.complete("n2");
    c.exactly("n2", 5, 9);
    app.assert_invariant().await;
}

/// Review finding (s18 #4): with `n` = 2, choice 0's finish started the clock of "idle after
/// the finish" while choice 1 was still generating: its chunks that told no text yet (empty
/// deltas, as a server sends while a choice thinks) were not progress, and one idle timeout
/// after choice 0's finish the stream was cut — choice 1 never reached the client, the row
/// `upstream_error`. The answer is whole only at the last choice's finish; until then each
/// event holds the stream open, as before any finish.
#[tokio::test]
async fn a_choice_still_streaming_is_not_idle_after_another_choices_finish() {
    let app = app_with(|s| s.upstream.stream_idle_timeout_ms = 1000).await;
    let value = |choices: Value| {
        json!({"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": "m",
            "choices": choices})
    };
    let chunk = |choices: Value| SseEvent::Data(value(choices));
    let text = |i: i64, t: &str| {
        chunk(json!([{"index": i, "delta": {"content": t}, "finish_reason": null}]))
    };
    let finish = |i: i64| chunk(json!([{"index": i, "delta": {}, "finish_reason": "stop"}]));
    let mut events = vec![text(0, TEXT), finish(0)];
    // Two seconds of choice 1's empty deltas: twice the idle timeout, no text.
    events.extend((0..8).map(|_| text(1, "")));
    events.extend([text(1, TEXT), finish(1)]);
    let mut usage = value(json!([]));
    usage["usage"] = json!({"prompt_tokens": 5, "completion_tokens": 6, "total_tokens": 11});
    events.extend([SseEvent::Data(usage), SseEvent::Data(json!("[DONE]"))]);
    let (id, token) = app.token("n2-thinking", Some("1")).await;
    app.mock.state.script(
        Up::OpenAi.key(),
        [Script {
            events: Some(events),
            chunk_delay_ms: 250,
            ..Script::default()
        }],
    );
    let resp = app
        .chat(
            &token,
            &json!({"model": Up::OpenAi.model(), "stream": true, "max_tokens": 100, "n": 2,
                "stream_options": {"include_usage": true},
                "messages": [{"role": "user", "content": "hi"}]}),
        )
        .await;
    assert_eq!(resp.status(), 200);
    let (data, whole) = sse_data(resp).await;
    assert!(whole);
    assert_eq!(data.last().map(String::as_str), Some("[DONE]"), "{data:?}");
    let second: String = data
        .iter()
        .filter_map(|d| serde_json::from_str::<Value>(d).ok())
        .filter(|v| v["choices"][0]["index"] == 1)
        .filter_map(|v| {
            v["choices"][0]["delta"]["content"]
                .as_str()
                .map(str::to_string)
        })
        .collect();
    assert_eq!(second, TEXT, "choice 1 reached the client whole");
    app.wait_settled().await;
    app.wait_for_log_rows(1).await;
    let (code, input, output, charged): (Option<String>, i64, i64, i64) = sql_row(
        app.db(),
        &format!(
            "SELECT error_code, input_tokens, output_tokens, cost_micros FROM requests \
             WHERE token_id = {id}"
        ),
    )
    .await;
    assert_eq!((code, input, output, charged), (None, 5, 6, cost(5, 6)));
    app.assert_invariant().await;
}
