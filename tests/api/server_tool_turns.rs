//! What a server-tool turn costs, as Anthropic bills it: every sampling step of the turn
//! re-bills its whole context (the prompt, every earlier tool result and every earlier
//! output) as input, so the reservation covers the sum over the steps; a client that leaves
//! a server-tool request before its usage pays what the upstream may already have run
//! (every step's input and every search allowed); searches the upstream answered with an
//! error result are not charged, and its report of the searches wins over the count.
//! The rig (an Anthropic upstream on the mock, Sonnet at 3 / 15 USD per Mtok and 10 USD
//! per 1 000 searches) is `server_tools`'.

use std::time::Duration;

use serde_json::{json, Value};
use sluice::mock::{Script, SseEvent};
use sluice::pipeline::request::TOOL_USE_PROMPT;
use sluice::quota::estimate;
use sluice::quota::pricing;
use sluice::usage::Usage;

use crate::helpers::*;
use crate::server_tools::{answer, app, search_block, sonnet_prices, spent_and_absorbed, KEY};

/// The input a turn reads at each step: the body's, and Claude's tool-use system prompt,
/// which the reservation counts (what a turn that may have run is charged).
fn with_tool_use_prompt(body: &Value) -> i64 {
    estimate::chat_input(body["messages"].as_array().unwrap(), body.get("tools")) + TOOL_USE_PROMPT
}

/// A turn with 5 searches is 6 sampling steps; the upstream bills the prompt in each and
/// each search's results in every step after it: the reservation covers that sum, so the
/// bill is charged exactly and nothing is absorbed.
#[tokio::test]
async fn a_turn_that_bills_each_steps_whole_context_is_reserved_and_charged_exactly() {
    let app = app().await;
    let (id, token) = app.token("steps", Some("10")).await;
    let body = json!({"model": "sonnet", "max_tokens": 1000,
        "tools": [{"type": "web_search_20250305", "name": "web_search", "max_uses": 5}],
        "messages": [{"role": "user", "content": "hi ".repeat(20_000)}]});
    let counted = estimate::chat_input(body["messages"].as_array().unwrap(), body.get("tools"));
    // Step j reads the prompt and the j pages before it: 6 prompts and 15 pages in all.
    let billed = 6 * counted + 25_000 * (5 + 4 + 3 + 2 + 1);
    app.mock.state.script(
        KEY,
        [Script {
            body: Some(answer(
                billed,
                1000,
                5,
                json!([{"type": "text", "text": "Found."}]),
            )),
            ..Script::default()
        }],
    );
    let resp = app.messages(&token, &body).await;
    assert_eq!(resp.status(), 200, "{}", resp.text().await.unwrap());
    let expected = pricing::cost(
        Usage {
            input: billed,
            output: 1000,
            web_search_calls: 5,
            ..Usage::default()
        },
        sonnet_prices(),
    );
    assert_eq!(spent_and_absorbed(&app, id).await, (expected, 0));
    app.assert_invariant().await;
}

/// A web-search request of at most 2 searches, capped at 100 output tokens.
fn two_searches(stream: bool) -> Value {
    searching(100, 2, stream)
}

/// "What is Sluice?" with web search, at most `max_uses` searches and `max_tokens` output.
fn searching(max_tokens: i64, max_uses: i64, stream: bool) -> Value {
    json!({"model": "sonnet", "max_tokens": max_tokens, "stream": stream,
        "tools": [{"type": "web_search_20250305", "name": "web_search", "max_uses": max_uses}],
        "messages": [{"role": "user", "content": "What is Sluice?"}]})
}

/// What a client that leaves a turn of 2 searches pays when its first step read `first`
/// input tokens and nothing more was reported: 3 steps of that input, the 2 pages re-read
/// (2 + 1), the output cap re-read by the 2 steps after the first, and both searches.
fn left_cost(first: i64) -> i64 {
    pricing::cost(
        Usage {
            input: 3 * first + 25_000 * (2 + 1) + 2 * 100,
            web_search_calls: 2,
            ..Usage::default()
        },
        sonnet_prices(),
    )
}

/// A non-streamed server-tool request whose client leaves while the upstream works: the
/// upstream may have run the whole turn, which is what it may bill — not the counted input
/// alone.
#[tokio::test]
async fn a_server_tool_request_whose_client_leaves_before_the_answer_pays_what_may_have_run() {
    let app = app().await;
    let (id, token) = app.token("left", Some("1")).await;
    let body = two_searches(false);
    leave_while_upstream_works(&app, KEY, 1, app.messages(&token, &body)).await;
    let counted = with_tool_use_prompt(&body);
    assert_eq!(spent_and_absorbed(&app, id).await, (left_cost(counted), 0));
    app.mock.state.sticky(KEY, None);
    app.assert_invariant().await;
}

/// A streamed server-tool request whose client leaves after the first bytes (the upstream
/// said its first step's input, then went quiet): the same rule, from the input reported.
#[tokio::test]
async fn a_server_tool_stream_whose_client_leaves_after_the_first_bytes_pays_what_may_have_run() {
    let app = app().await;
    let (id, token) = app.token("left-stream", Some("1")).await;
    app.mock.state.sticky(
        KEY,
        Some(Script {
            events: Some(vec![message_start(5), ping(), ping()]),
            stall_after: Some(1),
            ..Script::default()
        }),
    );
    {
        let mut resp = app.messages(&token, &two_searches(true)).await;
        assert_eq!(resp.status(), 200);
        let first = tokio::time::timeout(Duration::from_secs(10), resp.chunk())
            .await
            .expect("no first bytes")
            .unwrap();
        assert!(first.is_some_and(|b| String::from_utf8_lossy(&b).contains("message_start")));
    }
    // No call seen: the step it showed and one more (a call it may have been starting):
    // 2 steps of the 5 tokens, one page re-read once, the output cap re-read once, 1 search.
    let one_call = pricing::cost(
        Usage {
            input: 2 * 5 + 25_000 + 100,
            web_search_calls: 1,
            ..Usage::default()
        },
        sonnet_prices(),
    );
    assert_eq!(spent_and_absorbed(&app, id).await, (one_call, 0));
    app.mock.state.sticky(KEY, None);
    app.assert_invariant().await;
}

/// A stream shows how far its turn got: left after one search of five allowed, it pays that
/// search and the one call it may have been starting — 3 steps, 2 pages — not all five.
#[tokio::test]
async fn a_server_tool_stream_left_midway_pays_the_calls_it_showed_and_one_more() {
    let app = app().await;
    let (id, token) = app.token("left-midway", Some("10")).await;
    let mut events = vec![message_start(100)];
    events.extend(search_with_result(0, false));
    let shown = events.len();
    events.push(ping());
    app.mock.state.sticky(
        KEY,
        Some(Script {
            events: Some(events),
            stall_after: Some(shown),
            ..Script::default()
        }),
    );
    let body = searching(100, 5, true);
    {
        let mut resp = app.messages(&token, &body).await;
        assert_eq!(resp.status(), 200);
        let mut seen = String::new();
        while !seen.contains("web_search_tool_result") {
            let chunk = tokio::time::timeout(Duration::from_secs(10), resp.chunk())
                .await
                .expect("the search's result within 10 s")
                .unwrap()
                .expect("the stream goes on");
            seen.push_str(&String::from_utf8_lossy(&chunk));
        }
    }
    let output = estimate::count_text("{\"query\": \"sluice\"}");
    let expected = pricing::cost(
        Usage {
            input: 3 * 100 + 25_000 * (2 + 1) + 2 * 100,
            output,
            web_search_calls: 2,
            ..Usage::default()
        },
        sonnet_prices(),
    );
    assert_eq!(spent_and_absorbed(&app, id).await, (expected, 0));
    app.mock.state.sticky(KEY, None);
    app.assert_invariant().await;
}

/// A whole answer to a server-tool request that carries no usage: the turn ran (its answer
/// is whole) and nothing says how far: charged as a client that left it is, with the
/// output its text counts.
#[tokio::test]
async fn a_server_tool_answer_without_usage_pays_what_may_have_run() {
    let app = app().await;
    let (id, token) = app.token("no-usage", Some("1")).await;
    let mut unreported = answer(0, 0, 0, json!([{"type": "text", "text": "Found it."}]));
    unreported.as_object_mut().unwrap().remove("usage");
    app.mock.state.script(
        KEY,
        [Script {
            body: Some(unreported),
            ..Script::default()
        }],
    );
    let body = two_searches(false);
    assert_eq!(app.messages(&token, &body).await.status(), 200);
    let counted = with_tool_use_prompt(&body);
    let output = estimate::count_text("Found it.");
    // As `left_cost`, with the output counted (one rounding for the whole).
    let expected = pricing::cost(
        Usage {
            input: 3 * counted + 25_000 * (2 + 1) + 2 * 100,
            output,
            web_search_calls: 2,
            ..Usage::default()
        },
        sonnet_prices(),
    );
    assert_eq!(spent_and_absorbed(&app, id).await, (expected, 0));
    app.assert_invariant().await;
}

fn message_start(input: i64) -> SseEvent {
    SseEvent::Named(
        "message_start".into(),
        json!({"type": "message_start", "message": {"id": "msg_t", "type": "message",
            "role": "assistant", "model": "sonnet", "content": [], "stop_reason": null,
            "stop_sequence": null, "usage": {"input_tokens": input, "output_tokens": 1}}}),
    )
}

fn ping() -> SseEvent {
    SseEvent::Named("ping".into(), json!({"type": "ping"}))
}

/// The result block of search `index`: results, or Anthropic's error result (the search
/// past `max_uses`, not billed).
fn result_block(index: i64, errored: bool) -> Value {
    let content = if errored {
        json!({"type": "web_search_tool_result_error", "error_code": "max_uses_exceeded"})
    } else {
        json!([{"type": "web_search_result", "url": "https://example.com", "title": "Sluice",
            "encrypted_content": "abc", "page_age": null}])
    };
    json!({"type": "web_search_tool_result", "tool_use_id": format!("srvtoolu_{index}"),
        "content": content})
}

/// The events of search `index` (its `server_tool_use` block at `2 × index`) and its
/// result (at `2 × index + 1`).
fn search_with_result(index: i64, errored: bool) -> Vec<SseEvent> {
    let mut events = search_block(2 * index);
    events.push(SseEvent::Named(
        "content_block_start".into(),
        json!({"type": "content_block_start", "index": 2 * index + 1,
            "content_block": result_block(index, errored)}),
    ));
    events.push(SseEvent::Named(
        "content_block_stop".into(),
        json!({"type": "content_block_stop", "index": 2 * index + 1}),
    ));
    events
}

fn searches_cost(input: i64, output: i64, searches: i64) -> i64 {
    pricing::cost(
        Usage {
            input,
            output,
            web_search_calls: searches,
            ..Usage::default()
        },
        sonnet_prices(),
    )
}

/// Three searches, the third answered with an error result, reported as 2 searches: a
/// whole answer and a stream are each charged 2.
#[tokio::test]
async fn a_search_answered_with_an_error_is_not_charged_and_the_report_counts() {
    let app = app().await;
    let search = |i: i64| {
        json!({"type": "server_tool_use", "id": format!("srvtoolu_{i}"), "name": "web_search",
            "input": {"query": "sluice"}})
    };
    let content = json!([search(0), result_block(0, false), search(1), result_block(1, false),
        search(2), result_block(2, true), {"type": "text", "text": "Found it."}]);
    let (id, token) = app.token("whole", Some("1")).await;
    app.mock.state.script(
        KEY,
        [Script {
            body: Some(answer(1_000, 100, 2, content)),
            ..Script::default()
        }],
    );
    let body = searching(1000, 2, false);
    assert_eq!(app.messages(&token, &body).await.status(), 200);
    let expected = searches_cost(1_000, 100, 2);
    assert_eq!(spent_and_absorbed(&app, id).await, (expected, 0));

    let (id, token) = app.token("stream", Some("1")).await;
    let mut events = vec![message_start(1_000)];
    for i in 0..3 {
        events.extend(search_with_result(i, i == 2));
    }
    events.push(SseEvent::Named(
        "message_delta".into(),
        json!({"type": "message_delta", "delta": {"stop_reason": "end_turn"},
            "usage": {"output_tokens": 100, "server_tool_use": {"web_search_requests": 2}}}),
    ));
    events.push(SseEvent::Named(
        "message_stop".into(),
        json!({"type": "message_stop"}),
    ));
    app.mock.state.script(
        KEY,
        [Script {
            events: Some(events),
            ..Script::default()
        }],
    );
    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    let resp = app.messages(&token, &streamed).await;
    assert_eq!(resp.status(), 200);
    let _ = resp.text().await;
    assert_eq!(spent_and_absorbed(&app, id).await, (expected, 0));
    app.assert_invariant().await;
}

/// A stream the upstream cut after one search with results and one answered with an error
/// (no usage after them): one search is charged, and the turn of its one allowed call (2
/// steps of the 100 reported, its page re-read once, the output seen re-read once).
#[tokio::test]
async fn a_cut_stream_pays_the_searches_that_did_not_error() {
    let app = app().await;
    let (id, token) = app.token("cut", Some("1")).await;
    let mut events = vec![message_start(100)];
    events.extend(search_with_result(0, false));
    events.extend(search_with_result(1, true));
    let sent = events.len();
    events.push(SseEvent::Named(
        "message_delta".into(),
        json!({"type": "message_delta", "delta": {"stop_reason": "end_turn"},
            "usage": {"output_tokens": 50}}),
    ));
    stream_scripted(&app, &token, (events, Some(sent)), 1).await;
    let output = two_queries();
    let expected = searches_cost(2 * 100 + 25_000 + output, output, 1);
    assert_eq!(spent_and_absorbed(&app, id).await, (expected, 0));
    app.assert_invariant().await;
}

/// Streams "What is Sluice?" (at most `max_uses` searches, 1 000 output tokens) while the
/// upstream sends `events`, cut after the given number of them; read to its end.
async fn stream_scripted(
    app: &TestApp,
    token: &str,
    (events, cut_after): (Vec<SseEvent>, Option<usize>),
    max_uses: i64,
) {
    app.mock.state.script(
        KEY,
        [Script {
            events: Some(events),
            cut_after,
            ..Script::default()
        }],
    );
    let resp = app.messages(token, &searching(1000, max_uses, true)).await;
    assert_eq!(resp.status(), 200);
    let _ = resp.text().await;
}

/// The output two search calls count: their queries' JSON.
fn two_queries() -> i64 {
    estimate::count_text(&"{\"query\": \"sluice\"}".repeat(2))
}

/// A stream of up to 5 searches that the upstream ends after 2 (its error event, a broken
/// body, or its body's end without the final usage) ran those 2 and the sampling step
/// after each: 3 steps of the 100 reported, the 2 pages re-read 2 + 1 times, the output
/// seen re-read by the 2 steps after the first, and the 2 searches — as a client that
/// left would pay, less the call the upstream never showed.
#[tokio::test]
async fn a_server_tool_stream_the_upstream_cuts_pays_the_steps_its_calls_caused() {
    let app = app().await;
    let error = SseEvent::Named(
        "error".into(),
        json!({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}),
    );
    for (name, ending) in [("error-event", error), ("broken", ping()), ("eof", ping())] {
        let (id, token) = app.token(name, Some("10")).await;
        let mut events = vec![message_start(100)];
        events.extend(search_with_result(0, false));
        events.extend(search_with_result(1, false));
        let shown = events.len();
        events.push(ending);
        // The broken body: the connection drops after the second search's result (the ping
        // never goes).
        let cut_after = (name == "broken").then_some(shown);
        stream_scripted(&app, &token, (events, cut_after), 5).await;
        // Its `overloaded_error` rests the key: the next case starts on a key that serves.
        app.rest_no_more("an");
        let output = two_queries();
        let expected = searches_cost(3 * 100 + 25_000 * (2 + 1) + 2 * output, output, 2);
        assert_eq!(spent_and_absorbed(&app, id).await, (expected, 0), "{name}");
    }
    app.assert_invariant().await;
}

/// A stream the gateway itself ends — on an event it cannot read, after 2 searches of 5 —
/// was not broken off by the upstream, which may have run on: charged as a client that left
/// there pays (the 2 calls shown and the one it may have been starting: 4 steps of the 100
/// reported, 3 pages re-read 3 + 2 + 1 times, the output cap re-read by 3 steps, 3
/// searches), not the lower rule of a stream the upstream cut (s26 streams attack F5).
#[tokio::test]
async fn a_server_tool_stream_the_gateway_ends_on_an_unreadable_event_pays_what_may_have_run() {
    let app = app().await;
    let (id, token) = app.token("unreadable", Some("10")).await;
    let mut events = vec![message_start(100)];
    events.extend(search_with_result(0, false));
    events.extend(search_with_result(1, false));
    events.push(SseEvent::Named(
        "content_block_delta".into(),
        Value::String("{not json".into()),
    ));
    stream_scripted(&app, &token, (events, None), 5).await;
    let output = two_queries();
    let expected = searches_cost(4 * 100 + 25_000 * (3 + 2 + 1) + 3 * 1000, output, 3);
    assert_eq!(spent_and_absorbed(&app, id).await, (expected, 0));
    app.assert_invariant().await;
}
