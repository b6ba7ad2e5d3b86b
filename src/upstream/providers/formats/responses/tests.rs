use super::stream::{ChatToResponses, Native};
use super::*;

fn map(v: Value) -> Map<String, Value> {
    match v {
        Value::Object(m) => m,
        _ => Map::new(),
    }
}

fn stamp() -> Stamp {
    Stamp {
        id: "resp_gw".into(),
        store: true,
        previous_response_id: Some("resp_before".into()),
    }
}

#[test]
fn the_native_request_never_asks_the_upstream_to_store() {
    let body = map(json!({"model": "alias", "input": "hi", "store": true,
        "previous_response_id": "resp_x", "max_output_tokens": 9000, "reasoning": {"effort": "low"}}));
    let out = shape_request(&body, "gpt-up", Some(100));
    assert_eq!(out["model"], "gpt-up");
    assert_eq!(out["store"], false);
    assert_eq!(out["max_output_tokens"], 100);
    assert!(!out.contains_key("previous_response_id"));
    assert_eq!(out["include"], json!(["reasoning.encrypted_content"]));
}

#[test]
fn usage_is_read_with_cached_and_reasoning_inside_the_totals() {
    let u = json!({"input_tokens": 100, "input_tokens_details": {"cached_tokens": 40},
        "output_tokens": 30, "output_tokens_details": {"reasoning_tokens": 20}});
    assert_eq!(
        usage_of(&u),
        Some(Usage {
            input: 100,
            cached_input: 40,
            output: 30
        })
    );
    assert_eq!(usage_of(&json!({"input_tokens": "lots"})), None);
    assert_eq!(usage_of(&Value::Null), None);
}

#[test]
fn items_become_chat_messages_and_calls_join_one_assistant_turn() {
    let body = map(json!({"model": "m", "instructions": "Be brief.", "input": [
        {"role": "developer", "content": "Use metric units."},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"},
            {"type": "input_image", "image_url": "https://x/y.png", "detail": "low"}]},
        {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "opaque"},
        {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
        {"type": "function_call", "call_id": "c2", "name": "g", "arguments": "{\"a\":1}"},
        {"type": "function_call_output", "call_id": "c1", "output": "one"},
        {"type": "function_call_output", "call_id": "c2", "output": "two"},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "done"}]}],
        "tools": [{"type": "function", "name": "f", "parameters": {"type": "object"}}],
        "tool_choice": {"type": "function", "name": "f"},
        "text": {"format": {"type": "json_schema", "name": "r", "schema": {"type": "object"}, "strict": true}}}));
    let chat = to_chat(&body).unwrap();
    let m = chat["messages"].as_array().unwrap();
    assert_eq!(m[0], json!({"role": "system", "content": "Be brief."}));
    assert_eq!(
        m[1],
        json!({"role": "system", "content": "Use metric units."})
    );
    assert_eq!(
        m[2]["content"][1],
        json!({"type": "image_url", "image_url": {"url": "https://x/y.png", "detail": "low"}})
    );
    assert_eq!(m[3]["tool_calls"].as_array().unwrap().len(), 2, "{m:?}");
    assert_eq!(
        m[4],
        json!({"role": "tool", "tool_call_id": "c1", "content": "one"})
    );
    assert_eq!(m[6], json!({"role": "assistant", "content": "done"}));
    assert_eq!(m.len(), 7);
    assert_eq!(chat["tools"][0]["function"]["name"], "f");
    assert_eq!(
        chat["tool_choice"],
        json!({"type": "function", "function": {"name": "f"}})
    );
    assert_eq!(chat["response_format"]["json_schema"]["name"], "r");
}

#[test]
fn what_chat_cannot_take_is_refused_by_name() {
    for (body, param) in [
        (
            json!({"input": "hi", "top_logprobs": 2}),
            Some("top_logprobs"),
        ),
        (
            json!({"input": "hi", "include": ["file_search_call.results"]}),
            Some("include"),
        ),
        (
            json!({"input": "hi", "tools": [{"type": "web_search"}]}),
            Some("tools"),
        ),
        (
            json!({"input": [{"type": "local_shell_call", "call_id": "x"}]}),
            Some("input"),
        ),
        (json!({"input": "hi", "some_new_field": 1}), None),
    ] {
        let e = to_chat(&map(body.clone())).unwrap_err();
        assert_eq!(e.param, param, "{body}: {}", e.message);
    }
}

#[test]
fn a_chat_answer_becomes_a_response_object() {
    let chat = json!({"id": "chatcmpl-1", "created": 7, "model": "up", "choices": [{"index": 0,
        "message": {"role": "assistant", "content": "hello", "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
        "finish_reason": "length"}],
        "usage": {"prompt_tokens": 5, "completion_tokens": 7, "completion_tokens_details": {"reasoning_tokens": 2}}});
    let mut r = from_chat(
        &map(json!({"input": "x", "max_output_tokens": 7})),
        &chat,
        "gw",
    );
    stamp().apply(&mut r);
    assert_eq!(r["id"], "resp_gw");
    assert_eq!(r["previous_response_id"], "resp_before");
    assert_eq!(r["status"], "incomplete");
    assert_eq!(r["incomplete_details"]["reason"], "max_output_tokens");
    assert_eq!(r["output"][0]["content"][0]["text"], "hello");
    assert_eq!(r["output"][1]["call_id"], "call_1");
    assert_eq!(r["usage"]["total_tokens"], 12);
    assert_eq!(r["usage"]["output_tokens_details"]["reasoning_tokens"], 2);
}

#[test]
fn native_events_are_stamped_and_counted() {
    let mut n = Native::new(stamp());
    let created = json!({"type": "response.created", "sequence_number": 0,
        "response": {"id": "resp_upstream", "status": "in_progress"}})
    .to_string();
    let read = n.read("response.created", &created).unwrap();
    let text = String::from_utf8(read.frame.unwrap().to_vec()).unwrap();
    assert!(
        text.starts_with("event: response.created\ndata: "),
        "{text}"
    );
    assert!(
        text.contains("resp_gw") && !text.contains("resp_upstream"),
        "{text}"
    );
    let delta = json!({"type": "response.output_text.delta", "sequence_number": 1, "delta": "Hi"})
        .to_string();
    assert_eq!(n.read("", &delta).unwrap().text.as_deref(), Some("Hi"));
    let done = json!({"type": "response.completed", "sequence_number": 2,
        "response": {"id": "resp_upstream", "usage": {"input_tokens": 3, "output_tokens": 4}}})
    .to_string();
    let read = n.read("response.completed", &done).unwrap();
    assert!(read.done);
    assert_eq!(read.usage.unwrap().output, 4);
    assert_eq!(n.completed.as_ref().unwrap()["id"], "resp_gw");
    assert_eq!(n.next_seq, 3);
    assert!(n.read("x", "{not json").is_err());
    assert!(n.read("x", "{\"no\": \"type\"}").is_err());
}

#[test]
fn chat_chunks_become_numbered_responses_events() {
    let mut w = ChatToResponses::new(map(json!({"input": "x"})), stamp());
    let mut out = Vec::new();
    for c in [
        json!({"id": "c", "created": 1, "model": "up", "choices": [{"index": 0, "delta": {"role": "assistant", "content": "Hel"}}]}),
        json!({"id": "c", "choices": [{"index": 0, "delta": {"content": "lo"}}]}),
        json!({"id": "c", "choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "id": "call_1", "function": {"name": "f", "arguments": "{\"a\""}}]}}]}),
        json!({"id": "c", "choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": ":1}"}}]}, "finish_reason": "tool_calls"}]}),
        json!({"id": "c", "choices": [], "usage": {"prompt_tokens": 2, "completion_tokens": 3}}),
    ] {
        w.push(&c.to_string(), &mut out);
    }
    assert!(w.push("[DONE]", &mut out));
    let events: Vec<Value> = out
        .iter()
        .map(|f| {
            let t = std::str::from_utf8(f).unwrap();
            serde_json::from_str(t.split("data: ").nth(1).unwrap().trim()).unwrap()
        })
        .collect();
    let kinds: Vec<&str> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
    assert_eq!(
        kinds,
        [
            "response.created",
            "response.in_progress",
            "response.output_item.added",
            "response.content_part.added",
            "response.output_text.delta",
            "response.output_text.delta",
            "response.output_text.done",
            "response.content_part.done",
            "response.output_item.done",
            "response.output_item.added",
            "response.function_call_arguments.delta",
            "response.function_call_arguments.delta",
            "response.function_call_arguments.done",
            "response.output_item.done",
            "response.completed",
        ]
    );
    for (i, e) in events.iter().enumerate() {
        assert_eq!(e["sequence_number"], i);
    }
    let done = &events.last().unwrap()["response"];
    assert_eq!(done["id"], "resp_gw");
    assert_eq!(done["output"][0]["content"][0]["text"], "Hello");
    assert_eq!(done["output"][1]["arguments"], "{\"a\":1}");
    assert_eq!(done["output"][1]["call_id"], "call_1");
    assert_eq!(done["usage"]["input_tokens"], 2);
    assert_eq!(w.completed.as_ref(), Some(done));
}
