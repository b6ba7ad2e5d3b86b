//! The mock's OpenAI Responses API (`POST /v1/responses`): a whole `response` object, or
//! its stream of typed events with `sequence_number`s, shaped like OpenAI's own (the
//! openai-python SDK's `types/responses/*`). A request that offers function tools and has
//! no `function_call_output` after the last function call is answered with a function call
//! (the first leg of a tool round trip); otherwise with text. Reasoning tokens
//! (`Script::reasoning_tokens`) add a `reasoning` item before the answer, with its
//! `encrypted_content` when `include` asks for it; as OpenAI, a `store: false` request whose
//! input carries a reasoning item without it is a 404 (the item is looked up by id). The same scripts and faults as the other formats apply (`responses::sse`).

use serde_json::{json, Value};

use super::responses::{pieces, Event, Plan, Script};

/// The tool to call: the request offered a function tool and its last input item is not
/// a tool's output.
pub(super) fn tool_to_call(body: &Value) -> Option<String> {
    let name = body
        .get("tools")?
        .as_array()?
        .iter()
        .find(|t| t.get("type").and_then(Value::as_str) == Some("function"))?
        .get("name")?
        .as_str()?
        .to_string();
    let answered = match body.get("input") {
        Some(Value::Array(items)) => items
            .iter()
            .any(|i| i.get("type").and_then(Value::as_str) == Some("function_call_output")),
        _ => false,
    };
    (!answered).then_some(name)
}

fn usage(p: &Plan) -> Value {
    json!({
        "input_tokens": p.prompt,
        "input_tokens_details": {"cached_tokens": p.cached},
        "output_tokens": p.completion,
        "output_tokens_details": {"reasoning_tokens": p.reasoning},
        "total_tokens": p.prompt + p.completion,
    })
}

/// The output items of the answer, complete.
fn items(p: &Plan, body: &Value) -> Vec<Value> {
    let mut out = Vec::new();
    if p.reasoning > 0 {
        out.push(reasoning_item(p, body));
    }
    out.push(match &p.tool {
        Some(name) => function_item(p, name, &p.tool_args, "completed"),
        None => message_item(p, &p.text, "completed"),
    });
    out
}

/// As OpenAI: the reasoning's `encrypted_content` only when `include` asks for it.
fn reasoning_item(p: &Plan, body: &Value) -> Value {
    let mut item = json!({"type": "reasoning", "id": format!("rs_{}", p.id), "summary": []});
    let asked = body
        .get("include")
        .and_then(Value::as_array)
        .is_some_and(|i| i.iter().any(|v| v == "reasoning.encrypted_content"));
    if asked {
        item["encrypted_content"] = json!(format!("mock-encrypted-{}", p.id));
    }
    item
}

/// OpenAI's 404 for a request with `store: false` whose input carries a reasoning item
/// without its `encrypted_content`: the item is looked up by id, and nothing was persisted.
pub(super) fn unpersisted_reasoning(body: &Value) -> Option<Value> {
    if body.get("store").and_then(Value::as_bool) != Some(false) {
        return None;
    }
    let id = body.get("input")?.as_array()?.iter().find_map(|i| {
        (i.get("type").and_then(Value::as_str) == Some("reasoning")
            && !i.get("encrypted_content").is_some_and(Value::is_string))
        .then(|| {
            i.get("id")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string()
        })
    })?;
    Some(
        json!({"error": {"message": format!("Item with id '{id}' not found. Items are not persisted when `store` is set to false. Try again with `store` set to true, or remove this item from your input."),
        "type": "invalid_request_error", "param": "input", "code": null}}),
    )
}

fn function_item(p: &Plan, name: &str, arguments: &str, status: &str) -> Value {
    json!({"type": "function_call", "id": format!("fc_{}", p.id), "call_id": format!("call_{}", p.id),
        "name": name, "arguments": arguments, "status": status})
}

fn message_item(p: &Plan, text: &str, status: &str) -> Value {
    let content = if status == "completed" {
        json!([{"type": "output_text", "text": text, "annotations": []}])
    } else {
        json!([])
    };
    json!({"type": "message", "id": format!("msg_{}", p.id), "status": status, "role": "assistant",
        "content": content})
}

fn response(p: &Plan, body: &Value, status: &str, output: Vec<Value>, usage: Value) -> Value {
    json!({
        "id": format!("resp_{}", p.id), "object": "response", "created_at": chrono::Utc::now().timestamp(),
        "status": status, "error": null, "incomplete_details": null,
        "instructions": body.get("instructions").cloned().unwrap_or(Value::Null),
        "max_output_tokens": body.get("max_output_tokens").cloned().unwrap_or(Value::Null),
        "model": p.model, "output": output, "parallel_tool_calls": true,
        "previous_response_id": null, "reasoning": {"effort": null, "summary": null},
        "store": body.get("store").cloned().unwrap_or(json!(true)),
        "temperature": 1.0, "text": {"format": {"type": "text"}},
        "tool_choice": body.get("tool_choice").cloned().unwrap_or(json!("auto")),
        "tools": body.get("tools").cloned().unwrap_or(json!([])),
        "top_p": 1.0, "truncation": "disabled", "usage": usage, "metadata": {},
    })
}

pub(super) fn answer(p: &Plan, body: &Value) -> Value {
    response(p, body, "completed", items(p, body), usage(p))
}

/// The stream: `response.created`, `response.in_progress`, the items' events, and
/// `response.completed` with the usage (left out with `Script::omit_usage`). Deltas are the
/// content events `cut_after` / `stall_after` / `corrupt_after` count.
pub(super) fn events(p: &Plan, body: &Value, s: &Script) -> Vec<Event> {
    let mut seq = 0u64;
    let mut out = Vec::new();
    let mut ev = |kind: &str, mut v: Value, content: bool| {
        v["type"] = json!(kind);
        v["sequence_number"] = json!(seq);
        seq += 1;
        out.push(Event {
            name: Some(kind.to_string()),
            data: v.to_string(),
            content,
        });
    };
    let open = response(p, body, "in_progress", vec![], Value::Null);
    ev("response.created", json!({"response": open}), false);
    ev("response.in_progress", json!({"response": open}), false);
    let mut index = 0;
    if p.reasoning > 0 {
        let item = reasoning_item(p, body);
        ev(
            "response.output_item.added",
            json!({"output_index": index, "item": item}),
            false,
        );
        ev(
            "response.output_item.done",
            json!({"output_index": index, "item": item}),
            false,
        );
        index += 1;
    }
    match &p.tool {
        Some(name) => {
            let id = format!("fc_{}", p.id);
            let item = function_item(p, name, "", "in_progress");
            ev(
                "response.output_item.added",
                json!({"output_index": index, "item": item}),
                false,
            );
            let (a, b) = p.tool_args.split_at(p.tool_args.len() / 2);
            for part in [a, b] {
                ev(
                    "response.function_call_arguments.delta",
                    json!({"item_id": id, "output_index": index, "delta": part}),
                    true,
                );
            }
            ev(
                "response.function_call_arguments.done",
                json!({"item_id": id, "output_index": index, "name": name, "arguments": p.tool_args}),
                false,
            );
            let done = function_item(p, name, &p.tool_args, "completed");
            ev(
                "response.output_item.done",
                json!({"output_index": index, "item": done}),
                false,
            );
        }
        None => {
            let id = format!("msg_{}", p.id);
            ev(
                "response.output_item.added",
                json!({"output_index": index, "item": message_item(p, "", "in_progress")}),
                false,
            );
            let part = json!({"type": "output_text", "text": "", "annotations": []});
            ev(
                "response.content_part.added",
                json!({"item_id": id, "output_index": index, "content_index": 0, "part": part}),
                false,
            );
            for piece in pieces(&p.text) {
                ev(
                    "response.output_text.delta",
                    json!({"item_id": id, "output_index": index, "content_index": 0, "delta": piece, "logprobs": []}),
                    true,
                );
            }
            ev(
                "response.output_text.done",
                json!({"item_id": id, "output_index": index, "content_index": 0, "text": p.text, "logprobs": []}),
                false,
            );
            let part = json!({"type": "output_text", "text": p.text, "annotations": []});
            ev(
                "response.content_part.done",
                json!({"item_id": id, "output_index": index, "content_index": 0, "part": part}),
                false,
            );
            ev(
                "response.output_item.done",
                json!({"output_index": index, "item": message_item(p, &p.text, "completed")}),
                false,
            );
        }
    }
    let usage = if s.omit_usage { Value::Null } else { usage(p) };
    let done = response(p, body, "completed", items(p, body), usage);
    ev("response.completed", json!({"response": done}), false);
    out
}
