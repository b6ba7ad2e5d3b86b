//! Responses API streams, native (openai upstream) and translated (anthropic upstream):
//! the typed events with their sequence numbers, the usage of `response.completed`, the
//! stored copy, and the money of a stream the client leaves or the upstream cuts.

use std::time::Duration;

use serde_json::{json, Value};
use sluice::mock::{MockConfig, Script};

use crate::helpers::*;
use crate::responses::{ask, charged, cost, function_call, get, output_text};

/// The events of a Responses stream: (event name, data).
pub async fn events(resp: reqwest::Response) -> Vec<(String, Value)> {
    let text = resp.text().await.expect("the whole stream");
    text.split("\n\n")
        .filter(|e| !e.trim().is_empty())
        .map(|e| {
            let mut name = String::new();
            let mut data = String::new();
            for line in e.lines() {
                if let Some(n) = line.strip_prefix("event: ") {
                    name = n.to_string();
                } else if let Some(d) = line.strip_prefix("data: ") {
                    data.push_str(d);
                }
            }
            (name, serde_json::from_str(&data).unwrap_or(Value::Null))
        })
        .collect()
}

async fn stream(app: &TestApp, token: &str, body: &Value) -> Vec<(String, Value)> {
    let resp = app.post("/v1/responses", token, body).await;
    assert_eq!(resp.status(), 200);
    assert_eq!(
        resp.headers()["content-type"].to_str().unwrap(),
        "text/event-stream"
    );
    events(resp).await
}

/// Checks what every Responses stream must hold and returns the completed response.
fn check_stream(ev: &[(String, Value)]) -> Value {
    for (i, (name, data)) in ev.iter().enumerate() {
        assert_eq!(data["type"], name.as_str(), "event {i} names its type");
        assert_eq!(data["sequence_number"], i, "event {i}: {data}");
    }
    let names: Vec<&str> = ev.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(&names[..2], ["response.created", "response.in_progress"]);
    assert_eq!(*names.last().unwrap(), "response.completed", "{names:?}");
    let created = &ev[0].1["response"];
    let done = ev.last().unwrap().1["response"].clone();
    assert_eq!(created["id"], done["id"], "one id throughout");
    assert!(done["id"].as_str().unwrap().starts_with("resp_"));
    assert_eq!(created["status"], "in_progress");
    assert_eq!(done["status"], "completed");
    done
}

fn deltas(ev: &[(String, Value)], kind: &str) -> String {
    ev.iter()
        .filter(|(n, _)| n == kind)
        .map(|(_, d)| d["delta"].as_str().unwrap().to_string())
        .collect()
}

/// A stream of the mock's answer: its text in the deltas and the final response, its
/// usage charged, and the response stored as the stream ended it.
async fn assert_answered_charged_and_stored(
    app: &TestApp,
    token_id: i64,
    token: &str,
    ev: &[(String, Value)],
    done: &Value,
) {
    let text = MockConfig::default().text;
    assert_eq!(deltas(ev, "response.output_text.delta"), text);
    assert_eq!(output_text(done), text);
    assert_eq!(done["usage"]["input_tokens"], 12);
    assert_eq!(done["usage"]["output_tokens"], 24);
    assert_eq!(charged(app, token_id).await, cost(12, 24));
    let (status, stored) = get(app, done["id"].as_str().unwrap(), token).await;
    assert_eq!(status, 200);
    assert_eq!(&stored, done);
    app.assert_invariant().await;
}

#[tokio::test]
async fn a_native_stream_passes_the_events_with_the_gateways_id_and_is_stored() {
    let app = spawn_app().await;
    let (token_id, token) = app.token("ola", Some("10")).await;
    let mut body = ask();
    body["stream"] = json!(true);
    let ev = stream(&app, &token, &body).await;
    let done = check_stream(&ev);
    assert_answered_charged_and_stored(&app, token_id, &token, &ev, &done).await;
}

#[tokio::test]
async fn a_translated_stream_writes_the_responses_events_from_anthropic() {
    let app = spawn_app_with_claude().await;
    let (token_id, token) = app.token("ola", Some("10")).await;
    let body =
        json!({"model": "claude", "input": "Why?", "stream": true, "max_output_tokens": 300});
    let ev = stream(&app, &token, &body).await;
    let done = check_stream(&ev);
    let names: Vec<&str> = ev.iter().map(|(n, _)| n.as_str()).collect();
    for kind in [
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
    ] {
        assert!(names.contains(&kind), "{kind} in {names:?}");
    }
    assert_eq!(
        app.mock.state.stats(KEY_B).last_paths.back().unwrap(),
        "/v1/messages"
    );
    assert_answered_charged_and_stored(&app, token_id, &token, &ev, &done).await;
}

#[tokio::test]
async fn a_streamed_function_call_both_ways() {
    let app = spawn_app_with_claude().await;
    let (_, token) = app.token("ola", None).await;
    let tools = json!([{"type": "function", "name": "lookup_vehicle",
        "parameters": {"type": "object", "properties": {"vin": {"type": "string"}}}}]);
    for model in ["gpt-4o-mini", "claude"] {
        let body = json!({"model": model, "input": "Which car?", "tools": tools, "stream": true});
        let ev = stream(&app, &token, &body).await;
        let done = check_stream(&ev);
        let args = deltas(&ev, "response.function_call_arguments.delta");
        assert_eq!(args, r#"{"vin":"WVWZZZ1JZXW000001"}"#, "{model}");
        let call = function_call(&done);
        assert_eq!(call["name"], "lookup_vehicle", "{model}");
        assert_eq!(call["arguments"], args.as_str(), "{model}");
        let fin = ev
            .iter()
            .find(|(n, _)| n == "response.function_call_arguments.done")
            .unwrap();
        assert_eq!(fin.1["arguments"], args.as_str(), "{model}");
    }
}

#[tokio::test]
async fn a_stream_the_client_leaves_is_charged_what_it_received() {
    let app = spawn_app().await;
    let (token_id, token) = app.token("ola", Some("10")).await;
    app.mock.state.script(
        KEY_A,
        [Script {
            chunk_delay_ms: 200,
            ..Script::default()
        }],
    );
    let mut body = ask();
    body["stream"] = json!(true);
    let mut resp = app.post("/v1/responses", &token, &body).await;
    assert_eq!(resp.status(), 200);
    // Read until the first text delta has arrived, then leave.
    let mut seen = String::new();
    while !seen.contains("response.output_text.delta") {
        let chunk = tokio::time::timeout(Duration::from_secs(30), resp.chunk())
            .await
            .expect("a chunk in time")
            .expect("the stream")
            .expect("not ended");
        seen.push_str(&String::from_utf8_lossy(&chunk));
    }
    drop(resp);
    app.wait_settled().await;
    let charged = charged(&app, token_id).await;
    // The input (counted) plus the output counted from the deltas received: more than the
    // input alone, less than the whole answer's 24 output tokens.
    let counted = sluice::pipeline::responses::validate(body.as_object().unwrap()).unwrap();
    assert!(charged > cost(counted, 0) - 1, "{charged}");
    assert!(charged < cost(counted, 24), "{charged}");
    assert_eq!(
        app.scalar(&format!(
            "SELECT COUNT(*) FROM ledger WHERE token_id = {token_id} AND kind = 'settle'"
        ))
        .await,
        1
    );
    assert_eq!(
        app.scalar("SELECT COUNT(*) FROM stored_responses").await,
        0,
        "an unfinished response is not stored"
    );
    app.assert_invariant().await;
}

#[tokio::test]
async fn a_stream_the_upstream_cuts_ends_with_an_error_event() {
    let app = spawn_app_with_claude().await;
    let (_, token) = app.token("ola", Some("10")).await;
    for (key, model) in [(KEY_A, "gpt-4o-mini"), (KEY_B, "claude")] {
        app.mock.state.script(
            key,
            [Script {
                cut_after: Some(3),
                ..Script::default()
            }],
        );
        let body = json!({"model": model, "input": "Why?", "stream": true});
        let ev = stream(&app, &token, &body).await;
        let (name, last) = ev.last().unwrap();
        assert_eq!(name, "error", "{model}: {ev:?}");
        assert_eq!(last["type"], "error");
        assert_eq!(last["code"], "upstream_error");
        assert!(
            last["message"].as_str().unwrap().contains("upstream"),
            "{last}"
        );
        assert!(
            !ev.iter().any(|(n, _)| n == "response.completed"),
            "{model}"
        );
        for (i, (_, d)) in ev.iter().enumerate() {
            assert_eq!(d["sequence_number"], i, "{model}: event {i}");
        }
    }
    assert_eq!(app.scalar("SELECT COUNT(*) FROM stored_responses").await, 0);
    app.assert_invariant().await;
}
