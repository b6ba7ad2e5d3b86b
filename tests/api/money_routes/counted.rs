//! The checks of a cell where the gateway counts what the upstream did not report: a
//! stream without usage, a usage of zeros, a client that leaves mid-stream.

use sluice::mock::Script;

use super::cells::{self, Gateway, Kind, MODEL};
use super::checks::*;
use super::Route;

/// A stream whose upstream reports no usage at all (`omit_usage`): charged the counted
/// input and the tokenizer's count of the text (chat: 2.55 + 13.8 = 16.35 → 17), or the
/// upstream's input figure when one came (Anthropic's `message_start`: 12 → 1.8 + 13.8 =
/// 15.6 → 16).
pub(super) async fn usage_missing(gw: &Gateway, route: Route, cell: &str) {
    let app = &gw.app;
    let (id, token) = app.token("unreported", Some("1.00")).await;
    app.mock.state.script(
        &cells::key("main"),
        [Script {
            omit_usage: true,
            ..Script::default()
        }],
    );
    let resp = cells::send(
        app,
        route,
        &token,
        &cells::body(route, MODEL, PROMPT, 200, true),
    )
    .await;
    assert_eq!(resp.status(), 200, "{cell}");
    let frames = frames(resp).await;
    let text: String = frames
        .iter()
        .filter_map(|f| cells::delta_text(route, f))
        .collect();
    assert_eq!(text, sluice::mock::MockConfig::default().text, "{cell}");
    // A finish and then the format's end is a complete stream; a ConverseStream ends with
    // its usage (`metadata`), so one without it lost it on the way: cut (an error ending),
    // charged the same count.
    if gw.kind == Kind::Bedrock {
        // Chat and Messages carry it under `error`, a Responses `error` event at its top.
        let code = frames
            .last()
            .and_then(|(_, v)| v.pointer("/error/code").or_else(|| v.get("code")))
            .and_then(|c| c.as_str());
        assert_eq!(code, Some("upstream_error"), "{cell}: {frames:?}");
    } else {
        assert!(cells::completed(route, &frames), "{cell}: {frames:?}");
    }
    let input = match gw.kind {
        Kind::Anthropic => 12,
        _ => counted_input(route),
    };
    assert_eq!(
        spent(app, id, cell).await,
        cost(input, TEXT_TOKENS),
        "{cell}"
    );
}

/// An answer or a stream whose upstream reports a usage of zeros: charged 0 (CHECKS Q5).
pub(super) async fn zero_usage(gw: &Gateway, route: Route, cell: &str, stream: bool) {
    let app = &gw.app;
    let (id, token) = app.token("zero", Some("1.00")).await;
    app.mock.state.script(
        &cells::key("main"),
        [Script {
            prompt_tokens: Some(0),
            completion_tokens: Some(0),
            ..Script::default()
        }],
    );
    let resp = cells::send(
        app,
        route,
        &token,
        &cells::body(route, MODEL, PROMPT, 200, stream),
    )
    .await;
    assert_eq!(resp.status(), 200, "{cell}");
    answer_of(route, resp, stream, cell).await;
    // A stream without usage has nothing to say zero: it is charged its count.
    let expected = if stream && gw.kind == Kind::CompatibleNoUsage {
        cost(counted_input(route), TEXT_TOKENS)
    } else {
        0
    };
    assert_eq!(spent(app, id, cell).await, expected, "{cell}");
}

pub(super) async fn departure(gw: &Gateway, route: Route, cell: &str) {
    let app = &gw.app;
    let (id, token) = app.token("leaves", Some("1.00")).await;
    app.mock.state.script(
        &cells::key("main"),
        [Script {
            stall_after: Some(RECEIVED),
            ..Script::default()
        }],
    );
    let mut resp = cells::send(
        app,
        route,
        &token,
        &cells::body(route, MODEL, PROMPT, 200, true),
    )
    .await;
    assert_eq!(resp.status(), 200, "{cell}");
    let want: String =
        sluice::mock::pieces(&sluice::mock::MockConfig::default().text)[..RECEIVED].concat();
    let (mut buf, mut text) = (String::new(), String::new());
    let bound = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while text != want {
        assert!(std::time::Instant::now() < bound, "{cell}: got {text:?}");
        let chunk = resp.chunk().await.unwrap().expect("the stream goes on");
        buf.push_str(std::str::from_utf8(&chunk).unwrap());
        for f in cells::take_frames(&mut buf) {
            text.extend(cells::delta_text(route, &f));
        }
    }
    drop(resp);
    let charged = spent(app, id, cell).await;
    // The counted input (chat: 17 × 0.15 + 8 × 0.60 = 7.35 → 8), or the upstream's own
    // figure when it came before the text: Anthropic's `message_start` says 12 (1.8 + 4.8
    // = 6.6 → 7).
    let input = match gw.kind {
        Kind::Anthropic => 12,
        _ => counted_input(route),
    };
    let expected = cost(input, RECEIVED_TOKENS);
    assert_eq!(charged, expected, "{cell}: input + the output received");
    assert!(
        charged < worst_case(route, 200),
        "{cell}: never the full max"
    );
}
