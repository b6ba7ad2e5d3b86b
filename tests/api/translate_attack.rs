//! The translation under attack: wire formats as real upstreams and clients use them, in
//! the corners the golden files did not reach — a tool call whose name comes in a later
//! chunk, choices the client never asked for, error bodies that are not JSON, roles the
//! client's format does not have. Each goes end to end through the gateway to the mock.

use serde_json::{json, Value};

use crate::translate_wire::{app, run_case};

fn chunk(choice: Value) -> Value {
    json!({"id": "chatcmpl-a", "object": "chat.completion.chunk", "created": 1, "model": "m", "choices": [choice]})
}

fn usage_chunk() -> Value {
    json!({"id": "chatcmpl-a", "object": "chat.completion.chunk", "created": 1, "model": "m", "choices": [],
        "usage": {"prompt_tokens": 9, "completion_tokens": 4, "total_tokens": 13}})
}

/// The `[event, data]` pairs of one event type.
fn of_type<'v>(events: &'v Value, kind: &str) -> Vec<&'v Value> {
    events
        .as_array()
        .expect("a stream")
        .iter()
        .filter(|e| e[0] == kind)
        .map(|e| &e[1])
        .collect()
}

/// Some OpenAI-compatible servers send a tool call's id first and its name in a later
/// chunk. The Anthropic client's `tool_use` block must carry the name, not `""`.
#[tokio::test]
async fn a_tool_call_whose_name_comes_later_keeps_its_name() {
    let app = app().await;
    let (_, token) = app.token("late-name", None).await;
    let events = json!([
        chunk(
            json!({"index": 0, "delta": {"role": "assistant", "content": null,
            "tool_calls": [{"index": 0, "id": "call_1", "type": "function", "function": {"arguments": ""}}]}, "finish_reason": null})
        ),
        chunk(
            json!({"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"name": "lookup_vin"}}]}, "finish_reason": null})
        ),
        chunk(
            json!({"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": "{\"vin\":"}}]}, "finish_reason": null})
        ),
        chunk(
            json!({"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": "\"WVW\"}"}}]}, "finish_reason": null})
        ),
        chunk(json!({"index": 0, "delta": {}, "finish_reason": "tool_calls"})),
        usage_chunk(),
        "[DONE]"
    ]);
    let case = json!({"client": "anthropic", "request": {"max_tokens": 50, "stream": true,
        "messages": [{"role": "user", "content": "Decode this VIN"}],
        "tools": [{"name": "lookup_vin", "input_schema": {"type": "object"}}]},
        "upstream": {"events": events}});
    let got = run_case(&app, &token, "openai", &case).await;
    assert_eq!(got["status"], 200, "{got}");
    let events = &got["response"];
    let starts = of_type(events, "content_block_start");
    assert_eq!(starts.len(), 1, "{events}");
    assert_eq!(
        starts[0]["content_block"],
        json!({"type": "tool_use", "id": "call_1", "name": "lookup_vin", "input": {}}),
        "{events}"
    );
    let args: String = of_type(events, "content_block_delta")
        .iter()
        .map(|d| d["delta"]["partial_json"].as_str().unwrap_or(""))
        .collect();
    assert_eq!(args, "{\"vin\":\"WVW\"}");
    let delta = of_type(events, "message_delta");
    assert_eq!(delta[0]["delta"]["stop_reason"], "tool_use", "{events}");
    assert_eq!(
        events.as_array().unwrap().last().unwrap()[0],
        "message_stop"
    );
}
