//! What the client is told it is charged: the usage chunks it gets (only those that rise,
//! the gateway's own where the upstream's says other, with its details and the stream's
//! `object`) and a Responses client's one `response.completed`.

use serde_json::{json, Value};
use sluice::mock::{Script, SseEvent};

use super::script::{scripted, Piece};
use super::{app, cost, stream, stream_n, Up, TEXT};
use crate::helpers::*;

/// A Responses client of a translated upstream whose final usage comes after the finish
/// (and, for Gemini, a running one before it): `response.completed` is written once, after
/// that usage, and tells what the client is charged — the last report.
#[tokio::test]
async fn a_responses_client_gets_one_completed_with_the_usage_after_the_finish() {
    let app = app().await;
    let mut broken = Vec::new();
    for (up, pieces) in [
        (
            Up::OpenAi,
            vec![
                Piece::Text,
                Piece::Finish(Some((3, 2))),
                Piece::Usage(1000, 40),
                Piece::End,
            ],
        ),
        (
            Up::Anthropic,
            vec![Piece::Text, Piece::Finish(Some((1000, 40))), Piece::End],
        ),
        (
            Up::Gemini,
            vec![
                Piece::RunningText(1000, 1),
                Piece::Finish(Some((3, 2))),
                Piece::Usage(1000, 40),
            ],
        ),
        (
            Up::Bedrock,
            vec![Piece::Text, Piece::Finish(None), Piece::Usage(1000, 40)],
        ),
    ] {
        let what = format!("{up:?}");
        let (id, token) = app.token(&format!("resp-{what}"), Some("1")).await;
        app.mock.state.script(up.key(), [scripted(up, &pieces)]);
        let resp = app
            .post(
                "/v1/responses",
                &token,
                &json!({"model": up.model(), "input": "hi", "stream": true, "max_output_tokens": 4096}),
            )
            .await;
        assert_eq!(resp.status(), 200, "{what}");
        let body = resp.text().await.expect("the body ends cleanly");
        let data: Vec<String> = body
            .lines()
            .filter_map(|l| l.strip_prefix("data: "))
            .map(str::to_string)
            .collect();
        app.wait_settled().await;
        let completed: Vec<Value> = data
            .iter()
            .filter_map(|d| serde_json::from_str::<Value>(d).ok())
            .filter(|v| v["type"] == "response.completed")
            .collect();
        let spent = app
            .scalar(&format!(
                "SELECT 1000000 - remaining_micros FROM tokens WHERE id = {id}"
            ))
            .await;
        let told = completed.first().map(|c| {
            (
                c["response"]["usage"]["input_tokens"].as_i64(),
                c["response"]["usage"]["output_tokens"].as_i64(),
            )
        });
        if completed.len() != 1
            || told != Some((Some(1000), Some(40)))
            || spent != cost(1000, 40)
            || data
                .last()
                .and_then(|d| serde_json::from_str::<Value>(d).ok())
                != completed.first().cloned()
        {
            broken.push(format!(
                "{what}: {} response.completed, told {told:?}, spent {spent} (want {}), last {:?}",
                completed.len(),
                cost(1000, 40),
                data.last()
            ));
        }
    }
    assert!(broken.is_empty(), "{broken:#?}");
    app.assert_invariant().await;
}

/// The (input, output) of every usage the client was told, in order.
fn usages_told(data: &[String]) -> Vec<(i64, i64)> {
    data.iter()
        .filter_map(|d| serde_json::from_str::<Value>(d).ok())
        .filter(|v| v["usage"].is_object())
        .map(|v| {
            let u = &v["usage"];
            (
                u["prompt_tokens"].as_i64().unwrap_or(-1),
                u["completion_tokens"].as_i64().unwrap_or(-1),
            )
        })
        .collect()
}

/// Review finding (s20 G2): while an `n` = 2 answer of a server that ignores `n` is whole
/// at its end, every usage in a chunk of its own reached the client as it came — repeats
/// and lower ones too — and `[DONE]` then added the gateway's: 800, 0, 800 (an SDK that
/// sums the chunks, LangChain's `add_usage`, told 1600). Only a usage that raises a side
/// above what the client was told passes; the figures it is told never go down.
#[tokio::test]
async fn usages_of_an_answer_whole_at_its_end_reach_the_client_only_when_they_rise() {
    let app = app().await;
    for (row, (pieces, told)) in [
        (
            vec![
                Piece::Text,
                Piece::Finish(None),
                Piece::Usage(1000, 800),
                Piece::Usage(1000, 0),
                Piece::End,
            ],
            vec![(1000, 800)],
        ),
        (
            vec![
                Piece::Text,
                Piece::Finish(None),
                Piece::Usage(1000, 800),
                Piece::Usage(1000, 800),
                Piece::End,
            ],
            vec![(1000, 800)],
        ),
        (
            vec![
                Piece::Text,
                Piece::Finish(None),
                Piece::Usage(1000, 700),
                Piece::Usage(1000, 800),
                Piece::Usage(1000, 800),
                Piece::Usage(0, 0),
                Piece::End,
            ],
            vec![(1000, 700), (1000, 800)],
        ),
        // The body ends without `[DONE]`.
        (
            vec![
                Piece::Text,
                Piece::Finish(None),
                Piece::Usage(1000, 800),
                Piece::Usage(1000, 0),
            ],
            vec![(1000, 800)],
        ),
    ]
    .into_iter()
    .enumerate()
    {
        let what = format!("{pieces:?}");
        let c = stream_n(
            &app,
            Up::OpenAi,
            &format!("rise-{row}"),
            scripted(Up::OpenAi, &pieces),
            4096,
            2,
        )
        .await;
        assert_eq!(usages_told(&c.data), told, "{what}: {:?}", c.data);
        c.complete(&what);
        c.exactly(&what, 1000, 800);
    }
    app.assert_invariant().await;
}

/// Review finding (s20 G3): after the finish, the LiteLLM proxy's usage chunk — its one
/// choice, choice 0, empty and already finished, so filtered out — passed as it came when
/// its figures differed from the charge (a running report before had more input), and
/// `[DONE]` then added the gateway's: two usage chunks after the finish. It is replaced by
/// the gateway's, as a usage in a chunk of its own is.
#[tokio::test]
async fn a_usage_on_a_chunk_of_finished_choices_that_differs_from_the_charge_is_replaced() {
    let app = app().await;
    let pieces = [
        Piece::RunningText(1000, 1),
        Piece::Finish(None),
        Piece::EmptyChoiceUsage(900, 800),
        Piece::End,
    ];
    let c = stream(
        &app,
        Up::OpenAi,
        "litellm",
        scripted(Up::OpenAi, &pieces),
        4096,
    )
    .await;
    // The running one on the text, then one after the finish: the charge.
    assert_eq!(
        usages_told(&c.data),
        [(1000, 1), (1000, 800)],
        "{:?}",
        c.data
    );
    c.complete("litellm");
    c.exactly("litellm", 1000, 800);
    app.assert_invariant().await;
}

/// Review finding (s20 G4): the gateway's own usage chunk (here replacing a lower usage
/// after the one on the finish) told no reasoning tokens, and said `chat.completion.chunk`
/// on a `/v1/completions` stream too: it carries the usage's details, and its `object` is
/// the upstream's chunks' (not that of Azure's first chunk, the prompt's filter verdict,
/// whose `object` is empty).
#[tokio::test]
async fn the_gateway_s_usage_chunk_tells_the_reasoning_and_the_stream_s_object() {
    let app = app().await;
    for (path, object, azure) in [
        ("/v1/chat/completions", "chat.completion.chunk", false),
        ("/v1/completions", "text_completion", false),
        ("/v1/chat/completions", "chat.completion.chunk", true),
    ] {
        let chunk = |choice: Value, usage: Value| {
            SseEvent::Data(
                json!({"id": "c1", "object": object, "created": 1, "model": "m",
                "choices": choice, "usage": usage}),
            )
        };
        let text = if object == "text_completion" {
            json!([{"index": 0, "text": TEXT, "finish_reason": null}])
        } else {
            json!([{"index": 0, "delta": {"content": TEXT}, "finish_reason": null}])
        };
        let mut finish = text.clone();
        finish[0]["finish_reason"] = json!("stop");
        let mut events = vec![
            chunk(text, Value::Null),
            chunk(
                finish,
                json!({"prompt_tokens": 1000, "completion_tokens": 800, "total_tokens": 1800,
                    "completion_tokens_details": {"reasoning_tokens": 300}}),
            ),
            chunk(
                json!([]),
                json!({"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}),
            ),
            SseEvent::Data(json!("[DONE]")),
        ];
        if azure {
            events.insert(
                0,
                SseEvent::Data(json!({"choices": [], "created": 0, "id": "", "model": "",
                    "object": "", "prompt_filter_results": []})),
            );
        }
        let (_, token) = app
            .token(&format!("details-{object}-{azure}"), Some("1"))
            .await;
        app.mock.state.script(
            Up::OpenAi.key(),
            [Script {
                events: Some(events),
                ..Script::default()
            }],
        );
        let mut body = json!({"model": Up::OpenAi.model(), "stream": true, "max_tokens": 4096,
            "stream_options": {"include_usage": true}});
        if object == "text_completion" {
            body["prompt"] = json!("hi");
        } else {
            body["messages"] = json!([{"role": "user", "content": "hi"}]);
        }
        let resp = app.post(path, &token, &body).await;
        assert_eq!(resp.status(), 200, "{path}");
        let (data, whole) = sse_data(resp).await;
        assert!(whole);
        assert_eq!(data.last().map(String::as_str), Some("[DONE]"), "{data:?}");
        let last: Value = data
            .iter()
            .rev()
            .filter_map(|d| serde_json::from_str::<Value>(d).ok())
            .find(|v| v["usage"].is_object())
            .unwrap();
        assert_eq!(last["object"], object, "{path}: {data:?}");
        assert_eq!(last["usage"]["completion_tokens"], 800, "{path}: {data:?}");
        assert_eq!(
            last["usage"]["completion_tokens_details"]["reasoning_tokens"], 300,
            "{path}: {data:?}"
        );
    }
    app.wait_settled().await;
    app.assert_invariant().await;
}
