//! Several usages of one answer: one before the finish is a floor under the output counted
//! from the text received, and a later, lower one after it lowers nothing.

use serde_json::{json, Value};

use super::script::{scripted, Piece};
use super::{app, cost, stream, stream_n, text_after_finish, Up, TEXT};

/// A running usage only before the finish (vLLM's continuous usage on its text chunks, none
/// on the finish chunk), the output it says far under the text received: the stream is
/// charged the counted output (the running figure is a floor), and the client that asked
/// for the usage is told that, in a last usage chunk — not left with the running figure as
/// the last it saw.
#[tokio::test]
async fn a_running_usage_under_the_count_is_not_the_last_usage_the_client_is_told() {
    let app = app().await;
    let counted = sluice::quota::estimate::count_text(&TEXT.repeat(4));
    let mut broken = Vec::new();
    for (up, pieces) in [
        (
            Up::OpenAi,
            vec![
                Piece::RunningText(1000, 1),
                Piece::RunningText(1000, 1),
                Piece::RunningText(1000, 1),
                Piece::RunningText(1000, 1),
                Piece::Finish(None),
                Piece::End,
            ],
        ),
        (
            Up::Gemini,
            vec![
                Piece::RunningText(1000, 1),
                Piece::RunningText(1000, 1),
                Piece::RunningText(1000, 1),
                Piece::RunningText(1000, 1),
                Piece::Finish(None),
            ],
        ),
    ] {
        let what = format!("{up:?} {}", pieces.len());
        let c = stream(
            &app,
            up,
            &format!("run-{}", broken.len() + pieces.len()),
            scripted(up, &pieces),
            4096,
        )
        .await;
        let result = std::panic::catch_unwind(|| {
            c.complete(&what);
            c.exactly(&what, 1000, counted);
        });
        if let Err(e) = result {
            let msg = e.downcast_ref::<String>().cloned().unwrap_or_default();
            broken.push(format!("{what}: {msg}"));
        }
    }
    assert!(broken.is_empty(), "{broken:#?}");
    app.assert_invariant().await;
}

/// A ConverseStream whose `metadata` (the usage) comes before `messageStop`, and then more
/// text: that usage was not the whole answer's. It is a floor under the output counted
/// from the text the client received, never the price of text it does not cover.
#[tokio::test]
async fn a_bedrock_usage_followed_by_more_text_is_a_floor_under_the_count() {
    let app = app().await;
    let pieces = [
        vec![Piece::Text, Piece::Usage(1000, 1)],
        vec![Piece::Text; 50],
        vec![Piece::Finish(None)],
    ]
    .concat();
    let c = stream(
        &app,
        Up::Bedrock,
        "early-metadata",
        scripted(Up::Bedrock, &pieces),
        4096,
    )
    .await;
    let (_, all) = text_after_finish(&c.data);
    assert_eq!(all, TEXT.repeat(51), "the client got every delta");
    let counted = sluice::quota::estimate::count_text(&all);
    assert!(counted > 1, "{counted}");
    c.complete("bedrock");
    c.exactly("bedrock", 1000, counted);
    app.assert_invariant().await;
}

/// Reports after the finish are totals of the same answer: a later, lower one (a lying or
/// confused upstream's zeros after the real figures) does not lower the price — the most
/// reported after the finish is charged, per side. The client's last usage chunk tells
/// what it is charged.
#[tokio::test]
async fn a_lower_usage_after_the_final_one_does_not_lower_the_price() {
    let app = app().await;
    for (up, pieces) in [
        (
            Up::OpenAi,
            vec![
                Piece::Text,
                Piece::Finish(Some((1000, 800))),
                Piece::Usage(0, 0),
                Piece::End,
            ],
        ),
        (
            Up::OpenAi,
            vec![
                Piece::Text,
                Piece::Finish(None),
                Piece::Usage(1000, 800),
                Piece::Usage(1000, 3),
                Piece::End,
            ],
        ),
        (
            Up::Gemini,
            vec![
                Piece::Text,
                Piece::Finish(Some((1000, 800))),
                Piece::Usage(0, 0),
            ],
        ),
        (
            Up::Bedrock,
            vec![
                Piece::Text,
                Piece::Finish(None),
                Piece::Usage(1000, 800),
                Piece::Usage(0, 0),
            ],
        ),
        (
            Up::Anthropic,
            vec![
                Piece::Text,
                Piece::Finish(Some((1000, 800))),
                Piece::Finish(Some((0, 0))),
                Piece::End,
            ],
        ),
        // Two `metadata` before `messageStop`, nothing of the answer between them.
        (
            Up::Bedrock,
            vec![
                Piece::Text,
                Piece::Usage(1000, 800),
                Piece::Usage(0, 0),
                Piece::Finish(None),
            ],
        ),
        // An input reported before the finish is the prompt's: not lowered after it.
        (
            Up::Anthropic,
            vec![
                Piece::RunningText(1000, 1),
                Piece::Finish(Some((0, 800))),
                Piece::End,
            ],
        ),
        (
            Up::Gemini,
            vec![Piece::RunningText(1000, 1), Piece::Finish(Some((0, 800)))],
        ),
        // Each side at its most: the client's last usage chunk is the gateway's.
        (
            Up::OpenAi,
            vec![
                Piece::Text,
                Piece::Finish(None),
                Piece::Usage(900, 800),
                Piece::Usage(1000, 3),
                Piece::End,
            ],
        ),
    ] {
        let what = format!("{up:?} {pieces:?}");
        let c = stream(
            &app,
            up,
            &format!("low-{}", what.len()),
            scripted(up, &pieces),
            4096,
        )
        .await;
        c.complete(&what);
        c.exactly(&what, 1000, 800);
    }
    // The first row with `n` = 2, to a server that ignores `n`: the usage in a chunk of its
    // own makes the answer whole at its end, and the report on choice 0's finish chunk
    // before it is not lowered by it either (review finding, s20 G1: charged 0 output,
    // marked exact).
    let pieces = [
        Piece::Text,
        Piece::Finish(Some((1000, 800))),
        Piece::Usage(1000, 0),
        Piece::End,
    ];
    let c = stream_n(
        &app,
        Up::OpenAi,
        "low-n2",
        scripted(Up::OpenAi, &pieces),
        4096,
        2,
    )
    .await;
    c.complete("n = 2");
    c.exactly("n = 2", 1000, 800);
    // An Anthropic client of an Anthropic upstream: the events pass as they came, but not
    // a second `message_delta` that would tell it less than it is charged.
    let (id, token) = app.token("low-anthropic-native", Some("1")).await;
    let pieces = [
        Piece::Text,
        Piece::Finish(Some((1000, 800))),
        Piece::Finish(Some((0, 0))),
        Piece::End,
    ];
    app.mock
        .state
        .script(Up::Anthropic.key(), [scripted(Up::Anthropic, &pieces)]);
    let resp = app
        .messages(
            &token,
            &json!({"model": Up::Anthropic.model(), "stream": true, "max_tokens": 4096,
                "messages": [{"role": "user", "content": "hi"}]}),
        )
        .await;
    assert_eq!(resp.status(), 200);
    let body = resp.text().await.unwrap();
    let deltas: Vec<Value> = body
        .split("\n\n")
        .filter_map(|e| e.lines().find_map(|l| l.strip_prefix("data: ")))
        .filter_map(|d| serde_json::from_str::<Value>(d).ok())
        .filter(|v| v["type"] == "message_delta")
        .collect();
    assert_eq!(deltas.len(), 1, "{body}");
    assert_eq!(deltas[0]["usage"]["output_tokens"], 800, "{body}");
    app.wait_settled().await;
    let spent = app
        .scalar(&format!(
            "SELECT 1000000 - remaining_micros FROM tokens WHERE id = {id}"
        ))
        .await;
    assert_eq!(spent, cost(1000, 800));
    app.assert_invariant().await;
}
