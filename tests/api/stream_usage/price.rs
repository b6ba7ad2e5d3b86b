//! What a stream is charged, in every format: the usage reported where its format puts it
//! (zeros included, through an OpenAI, an Anthropic or a Responses client), the estimate
//! without one, the reservation when the usage is over it.

use serde_json::{json, Value};
use sluice::mock::Script;

use super::script::{scripted, usual, Piece};
use super::{app, cost, stream, Up, ALL, TEXT};
use crate::helpers::*;

/// CHECKS Q5: a stream whose final usage says 0 is charged 0, in every format.
#[tokio::test]
async fn a_final_usage_of_zeros_is_charged_zero() {
    let app = app().await;
    for up in ALL {
        let c = stream(
            &app,
            up,
            &format!("z-{up:?}"),
            scripted(up, &usual(up, Some((0, 0)))),
            100,
        )
        .await;
        c.complete(&format!("{up:?}"));
        c.exactly(&format!("{up:?}"), 0, 0);
    }
    app.assert_invariant().await;
}

/// The same through an Anthropic client (`/v1/messages`): its `message_delta` tells the
/// zeros it is charged, and `message_stop` ends its stream.
#[tokio::test]
async fn an_anthropic_client_is_charged_a_final_usage_of_zeros() {
    let app = app().await;
    for up in ALL {
        let (id, token) = app.token(&format!("za-{up:?}"), Some("1")).await;
        app.mock
            .state
            .script(up.key(), [scripted(up, &usual(up, Some((0, 0))))]);
        let resp = app
            .messages(
                &token,
                &json!({"model": up.model(), "stream": true, "max_tokens": 100,
                    "messages": [{"role": "user", "content": "hi"}]}),
            )
            .await;
        assert_eq!(resp.status(), 200, "{up:?}");
        let body = resp.text().await.unwrap();
        let events: Vec<Value> = body
            .split("\n\n")
            .filter_map(|e| e.lines().find_map(|l| l.strip_prefix("data: ")))
            .map(|d| serde_json::from_str(d).unwrap())
            .collect();
        assert_eq!(
            events.last().unwrap()["type"],
            "message_stop",
            "{up:?}: {body}"
        );
        let delta = events
            .iter()
            .find(|e| e["type"] == "message_delta")
            .unwrap_or_else(|| panic!("{up:?}: {body}"));
        assert_eq!(delta["usage"]["output_tokens"], 0, "{up:?}: {body}");
        app.wait_settled().await;
        let spent = app
            .scalar(&format!(
                "SELECT 1000000 - remaining_micros FROM tokens WHERE id = {id}"
            ))
            .await;
        assert_eq!(spent, 0, "{up:?}");
    }
    app.assert_invariant().await;
}

/// A usage in an event of its own after the finish (and, for OpenAI, no `[DONE]` after
/// it: some compatible servers send none) is read before the stream completes, and is
/// its price.
#[tokio::test]
async fn a_usage_after_the_finish_is_the_price() {
    let app = app().await;
    for (up, pieces) in [
        (
            Up::OpenAi,
            vec![
                Piece::Text,
                Piece::Finish(None),
                Piece::Usage(7, 4000),
                Piece::End,
            ],
        ),
        (
            Up::OpenAi,
            vec![Piece::Text, Piece::Finish(None), Piece::Usage(7, 4000)],
        ),
        (
            Up::Gemini,
            vec![Piece::Text, Piece::Finish(None), Piece::Usage(7, 4000)],
        ),
        (
            Up::Bedrock,
            vec![Piece::Text, Piece::Finish(None), Piece::Usage(7, 4000)],
        ),
        // Anthropic's usage rides on its finish; a server that sends no `message_stop`.
        (
            Up::Anthropic,
            vec![Piece::Text, Piece::Finish(Some((7, 4000)))],
        ),
    ] {
        let what = format!("{up:?} {pieces:?}");
        let c = stream(
            &app,
            up,
            &format!("a-{}", what.len()),
            scripted(up, &pieces),
            4096,
        )
        .await;
        c.complete(&what);
        c.exactly(&what, 7, 4000);
    }
    app.assert_invariant().await;
}

/// A running usage, then the final one: the last wins, never summed with the first.
#[tokio::test]
async fn a_usage_reported_twice_costs_the_last() {
    let app = app().await;
    for (up, pieces) in [
        (
            Up::OpenAi,
            vec![
                Piece::RunningText(1000, 1),
                Piece::Finish(Some((1000, 30))),
                Piece::Usage(1000, 40),
                Piece::End,
            ],
        ),
        (
            Up::Gemini,
            vec![
                Piece::RunningText(1000, 1),
                Piece::Finish(Some((1000, 30))),
                Piece::Usage(1000, 40),
            ],
        ),
        (
            Up::Anthropic,
            vec![
                Piece::RunningText(1000, 1),
                Piece::Finish(Some((1000, 40))),
                Piece::End,
            ],
        ),
    ] {
        let what = format!("{up:?}");
        let c = stream(&app, up, &format!("t-{what}"), scripted(up, &pieces), 4096).await;
        c.complete(&what);
        c.exactly(&what, 1000, 40);
    }
    app.assert_invariant().await;
}

/// A finish without any usage, with its format's end event (Bedrock's is its usage, so
/// a Bedrock stream without one is cut: `a_finish_whose_usage_and_end_never_came_is_a_cut`):
/// the estimate — the output counted from the text received — as before.
#[tokio::test]
async fn a_finish_without_usage_is_charged_the_estimate() {
    let app = app().await;
    let counted = sluice::quota::estimate::count_text(TEXT);
    for up in [Up::OpenAi, Up::Anthropic, Up::Gemini] {
        let what = format!("{up:?}");
        let c = stream(
            &app,
            up,
            &format!("n-{what}"),
            scripted(up, &usual(up, None)),
            100,
        )
        .await;
        c.complete_estimated(&what);
        let (input, output, cost_micros, _) = c.logged;
        assert_eq!(output, counted, "{what}");
        assert!(input > 0, "{what}: the input estimate");
        assert_eq!(
            (c.spent, cost_micros),
            (cost(input, output), cost(input, output)),
            "{what}"
        );
    }
    app.assert_invariant().await;
}

/// A usage over the reservation (an output far past the cap the upstream was sent): the
/// token is charged its reservation, the rest is absorbed (DESIGN "Settlement"), and the
/// log keeps the reported figures.
#[tokio::test]
async fn a_usage_over_the_reservation_is_charged_the_reservation_and_the_rest_absorbed() {
    let app = app().await;
    for up in ALL {
        let what = format!("{up:?}");
        let c = stream(
            &app,
            up,
            &format!("o-{what}"),
            scripted(up, &usual(up, Some((1000, 5000)))),
            10,
        )
        .await;
        c.complete(&what);
        let full = cost(1000, 5000);
        assert_eq!((c.logged.0, c.logged.1), (1000, 5000), "{what}");
        assert!(c.spent < full, "{what}: charged {} of {full}", c.spent);
        assert_eq!(c.spent + c.absorbed, full, "{what}");
        assert_eq!(c.logged.2, full, "{what}: the log keeps the whole cost");
    }
    app.assert_invariant().await;
}

/// The Responses API upstream reports its usage in `response.completed`, its finish and
/// end: zeros are charged zero there too.
#[tokio::test]
async fn a_responses_stream_whose_usage_says_zero_is_charged_zero() {
    let app = spawn_app().await;
    let (id, token) = app.token("r0", Some("1")).await;
    app.mock.state.script(
        KEY_A,
        [Script {
            prompt_tokens: Some(0),
            completion_tokens: Some(0),
            ..Script::default()
        }],
    );
    let resp = app
        .post(
            "/v1/responses",
            &token,
            &json!({"model": "gpt-4o-mini", "input": "hi", "stream": true}),
        )
        .await;
    assert_eq!(resp.status(), 200);
    let body = resp.text().await.unwrap();
    assert!(body.contains("response.completed"), "{body}");
    app.wait_settled().await;
    let spent = app
        .scalar(&format!(
            "SELECT 1000000 - remaining_micros FROM tokens WHERE id = {id}"
        ))
        .await;
    assert_eq!(spent, 0);
    app.assert_invariant().await;
}
