use super::adapter::{read_request, write_answer, EventWriter};
use super::stream::Native;
use super::*;
use crate::config::Provider;
use crate::upstream::providers::canonical::{
    Answer, Finish, Message, Part, ResponseFormat, Role, Source, ToolChoice, Usage as Figures,
};
use crate::upstream::providers::translate::stream::{ResponsesOut, StreamConverter};
use crate::upstream::providers::{build_request, Format};

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
            output: 30,
            reasoning: 20,
            ..Usage::default()
        })
    );
    assert_eq!(usage_of(&json!({"input_tokens": "lots"})), None);
    assert_eq!(usage_of(&Value::Null), None);
}

fn text(t: &str) -> Part {
    Part::Text {
        text: t.into(),
        cache: None,
    }
}

#[test]
fn items_are_read_into_the_internal_form_and_calls_join_one_assistant_turn() {
    let body = map(json!({"model": "m", "instructions": "Be brief.", "input": [
        {"role": "developer", "content": "Use metric units."},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"},
            {"type": "input_image", "image_url": "https://x/y.png", "detail": "low"}]},
        {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "Think."}], "encrypted_content": "opaque"},
        {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
        {"type": "function_call", "call_id": "c2", "name": "g", "arguments": "{\"a\":1}"},
        {"type": "function_call_output", "call_id": "c1", "output": "one"},
        {"type": "function_call_output", "call_id": "c2", "output": "two"},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "done"}]}],
        "tools": [{"type": "function", "name": "f", "parameters": {"type": "object"}}],
        "tool_choice": {"type": "function", "name": "f"},
        "text": {"format": {"type": "json_schema", "name": "r", "schema": {"type": "object"}, "strict": true}}}));
    let r = read_request(&body).unwrap();
    assert_eq!(r.system, [text("Be brief."), text("Use metric units.")]);
    let m = &r.messages;
    assert_eq!(m.len(), 4, "{m:?}");
    assert_eq!(
        m[0].content[1],
        Part::Image {
            source: Source::Url("https://x/y.png".into()),
            detail: Some("low".into()),
            cache: None
        }
    );
    assert_eq!(m[1].role, Role::Assistant);
    assert_eq!(
        m[1].content[0],
        Part::Reasoning {
            text: "Think.".into(),
            signature: Some("opaque".into()),
            redacted: None
        }
    );
    assert_eq!(
        m[1].content.len(),
        3,
        "the reasoning and both calls: one turn"
    );
    assert_eq!(m[2].role, Role::Tool);
    assert_eq!(m[2].content.len(), 2);
    assert_eq!(
        m[3],
        Message {
            role: Role::Assistant,
            content: vec![text("done")],
            name: None,
            plain: false
        }
    );
    assert_eq!(r.tools[0].name, "f");
    assert_eq!(r.tool_choice, Some(ToolChoice::Named("f".into())));
    assert!(
        matches!(r.response_format, Some(ResponseFormat::JsonSchema { ref name, .. }) if name == "r")
    );
}

/// A reasoning item reaches an upstream that takes reasoning back (Anthropic: a thinking
/// block with its signature) and is refused by name where chat completions have no place
/// for it — never left out.
#[test]
fn reasoning_items_are_carried_or_refused_by_name_never_dropped() {
    let body = map(json!({"model": "m", "input": [
        {"role": "user", "content": "hi"},
        {"type": "reasoning", "id": "rs_1", "summary": [], "content": [{"type": "reasoning_text", "text": "Hmm."}], "encrypted_content": "sig"},
        {"role": "assistant", "content": [{"type": "output_text", "text": "Hello."}]},
        {"role": "user", "content": "and?"}]}));
    let sent = build_request(
        Format::Responses,
        Provider::Anthropic,
        &body,
        "claude-up",
        Some(("max_tokens", 100)),
        false,
    )
    .unwrap();
    let sent: Value = serde_json::from_slice(&sent).unwrap();
    assert_eq!(
        sent["messages"][1]["content"][0],
        json!({"type": "thinking", "thinking": "Hmm.", "signature": "sig"}),
        "{sent}"
    );
    for chat in [Provider::AzureOpenai, Provider::OpenaiCompatible] {
        let e = build_request(Format::Responses, chat, &body, "gpt", None, false).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("input"));
        assert!(
            e.message
                .contains("input[1]: a `reasoning` item cannot be sent to an OpenAI-format model"),
            "{}",
            e.message
        );
    }
    // Without its encrypted content, Anthropic cannot take it back either: refused.
    let mut bare = body.clone();
    bare["input"][1]
        .as_object_mut()
        .unwrap()
        .remove("encrypted_content");
    let e = build_request(
        Format::Responses,
        Provider::Anthropic,
        &bare,
        "c",
        None,
        false,
    )
    .unwrap_err();
    assert!(e.message.contains("reasoning"), "{}", e.message);
}

#[test]
fn what_the_internal_form_cannot_take_is_refused_by_name() {
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
        // Named too, as the Responses API names an unknown parameter (s29 responses
        // attack F5: it was null).
        (
            json!({"input": "hi", "some_new_field": 1}),
            Some("some_new_field"),
        ),
    ] {
        let e = read_request(&map(body.clone())).unwrap_err();
        assert_eq!(e.param.as_deref(), param, "{body}: {}", e.message);
    }
}

#[test]
fn an_answer_becomes_a_response_object() {
    let a = Answer {
        id: "chatcmpl-1".into(),
        model: "up".into(),
        content: vec![
            text("hel"),
            text("lo"),
            Part::ToolCall {
                id: "call_1".into(),
                name: "f".into(),
                arguments: "{}".into(),
            },
        ],
        finish: Finish::Length,
        usage: Some(Figures {
            input: 5,
            output: 7,
            reasoning: 2,
            ..Figures::default()
        }),
        created: Some(7),
    };
    let mut r = write_answer(
        &a,
        &map(json!({"input": "x", "max_output_tokens": 7})),
        "gw",
    );
    stamp().apply(&mut r);
    assert_eq!(r["id"], "resp_gw");
    assert_eq!(r["previous_response_id"], "resp_before");
    assert_eq!(r["status"], "incomplete");
    assert_eq!(r["max_output_tokens"], 7);
    assert_eq!(r["incomplete_details"]["reason"], "max_output_tokens");
    assert_eq!(r["output"][0]["content"][0]["text"], "hello");
    assert_eq!(r["output"][1]["call_id"], "call_1");
    assert_eq!(r["output"][0]["id"], "msg_gw_0");
    assert_eq!(r["output"][1]["id"], "fc_gw_1");
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

/// A native error names the upstream's own fault only with OpenAI's `server_error` code (in
/// `response.failed`'s response, or at an `error` event's top): any other gives its key no
/// verdict (s26 streams F2).
#[test]
fn a_native_error_names_a_fault_only_for_a_server_error() {
    use crate::upstream::providers::canonical::Fault;
    let mut n = Native::new(stamp());
    let cases = [
        (
            json!({"type": "response.failed", "response": {"error": {"code": "server_error"}}}),
            Some(Fault::Server),
        ),
        (
            json!({"type": "error", "code": "server_error", "message": "x"}),
            Some(Fault::Server),
        ),
        (
            json!({"type": "response.failed", "response": {"error": {"code": "invalid_prompt"}}}),
            None,
        ),
        (
            json!({"type": "error", "code": "insufficient_quota", "message": "x"}),
            None,
        ),
        (json!({"type": "error", "message": "x"}), None),
    ];
    for (event, fault) in cases {
        let read = n.read("", &event.to_string()).unwrap();
        assert!(read.failed, "{event}");
        assert_eq!(read.fault, fault, "{event}");
    }
}

/// An OpenAI-chat upstream's chunks, read into the internal form by its reader and
/// written by the Responses writer: the events and sequence numbers the chat bridge wrote before it.
#[test]
fn chat_chunks_become_numbered_responses_events() {
    let w = EventWriter::new(map(json!({"input": "x"})), stamp());
    let mut c = StreamConverter::new(Format::OpenAiChat, Format::OpenAiChat, false, 9)
        .responses(ResponsesOut::Translated(Box::new(w)));
    let mut out = Vec::new();
    for chunk in [
        json!({"id": "c", "created": 1, "model": "up", "choices": [{"index": 0, "delta": {"role": "assistant", "content": "Hel"}}]}),
        json!({"id": "c", "choices": [{"index": 0, "delta": {"content": "lo"}}]}),
        json!({"id": "c", "choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "id": "call_1", "function": {"name": "f", "arguments": "{\"a\""}}]}}]}),
        json!({"id": "c", "choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": ":1}"}}]}, "finish_reason": "tool_calls"}]}),
        json!({"id": "c", "choices": [], "usage": {"prompt_tokens": 2, "completion_tokens": 3}}),
    ] {
        c.event("", &chunk.to_string(), &mut out);
    }
    c.event("", "[DONE]", &mut out);
    assert!(c.done());
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
    assert_eq!(events[0]["response"]["model"], "up");
    assert!(events[0]["response"]["created_at"].as_i64() > Some(0));
    let done = &events.last().unwrap()["response"];
    assert_eq!(done["id"], "resp_gw");
    assert_eq!(done["output"][0]["content"][0]["text"], "Hello");
    assert_eq!(done["output"][1]["arguments"], "{\"a\":1}");
    assert_eq!(done["output"][1]["call_id"], "call_1");
    assert_eq!(done["usage"]["input_tokens"], 2);
    assert_eq!(done["usage"]["output_tokens"], 3);
    assert_eq!(c.completed_response().as_ref(), Some(done));
}

/// What Codex CLI sends on a first turn (0.169, trimmed): bookkeeping (`client_metadata`,
/// `prompt_cache_key`, `metadata`), a reasoning summary request, `strict` function tools,
/// developer messages before the user's, and a developer message mid-conversation (an
/// environment update after a tool call).
fn codex_body() -> Map<String, Value> {
    map(json!({
        "model": "m",
        "client_metadata": {"session_id": "s-1"},
        "metadata": {"run": "r-1"},
        "include": ["reasoning.encrypted_content"],
        "prompt_cache_key": "s-1",
        "reasoning": {"summary": "auto"},
        "store": false,
        "stream": true,
        "tool_choice": "auto",
        "parallel_tool_calls": true,
        "tools": [{"type": "function", "name": "exec_command", "strict": true,
            "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}}},
            {"type": "namespace", "name": "multi_agent_v1", "description": "Sub-agents.",
             "tools": [{"type": "function", "name": "spawn_agent", "strict": false,
                "parameters": {"type": "object"}}]}],
        "input": [
            {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "You are Codex."}]},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "List the files."},
                {"type": "input_image", "image_url": "data:image/png;base64,iVBORw0KGgo=", "detail": "high"}]},
            {"type": "function_call", "call_id": "call_1", "name": "exec_command", "arguments": "{\"cmd\":\"ls\"}"},
            {"type": "function_call_output", "call_id": "call_1", "output": "a.txt"},
            {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "Approval mode is now never."}]},
            {"type": "message", "role": "user", "content": "Go on."}
        ]
    }))
}

fn built(to: Provider, body: &Map<String, Value>) -> (Value, Vec<&'static str>) {
    let b = crate::upstream::providers::build_responses_request(
        to,
        body,
        "up",
        Some(("max_tokens", 100)),
        (true, true),
    )
    .unwrap_or_else(|e| panic!("{to:?}: {e:?}"));
    (serde_json::from_slice(&b.body).unwrap(), b.dropped)
}

/// Codex's request reaches every translated upstream: the hints the upstream has no place
/// for are dropped and named (`x-sluice-dropped`), the bookkeeping is not sent, nothing
/// else is lost.
#[test]
fn what_codex_sends_reaches_every_translated_upstream_with_its_drops_named() {
    let body = codex_body();
    for (to, want) in [
        (
            Provider::AzureOpenai,
            vec![
                "client_metadata",
                "prompt_cache_key",
                "tools[].namespace",
                "reasoning.summary",
            ],
        ),
        (
            Provider::OpenaiCompatible,
            vec![
                "client_metadata",
                "prompt_cache_key",
                "tools[].namespace",
                "reasoning.summary",
            ],
        ),
        (
            Provider::Anthropic,
            vec![
                "client_metadata",
                "prompt_cache_key",
                "tools[].namespace",
                "reasoning.summary",
                "tools[].strict",
                "input_image.detail",
            ],
        ),
        (
            Provider::Gemini,
            vec![
                "client_metadata",
                "prompt_cache_key",
                "tools[].namespace",
                "tools[].strict",
                "input_image.detail",
            ],
        ),
        (
            Provider::Bedrock,
            vec![
                "client_metadata",
                "prompt_cache_key",
                "tools[].namespace",
                "reasoning.summary",
                "tools[].strict",
                "input_image.detail",
            ],
        ),
    ] {
        let (sent, dropped) = built(to, &body);
        assert_eq!(dropped, want, "{to:?}");
        let text = sent.to_string();
        for gone in [
            "s-1",
            "r-1",
            "client_metadata",
            "prompt_cache_key",
            "spawn_agent",
        ] {
            assert!(!text.contains(gone), "{to:?} was sent {gone}: {text}");
        }
        assert!(
            text.contains("Approval mode is now never."),
            "{to:?}: {text}"
        );
    }
}

/// A developer message after the conversation began keeps its place: a system message
/// where chat completions have one in place; elsewhere (one system slot only) a user turn
/// at that place, marked as the system's words.
#[test]
fn a_mid_conversation_developer_message_keeps_its_place() {
    let body = codex_body();
    let (chat, _) = built(Provider::OpenaiCompatible, &body);
    let roles: Vec<&str> = chat["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["role"].as_str().unwrap())
        .collect();
    assert_eq!(
        roles,
        ["system", "user", "assistant", "tool", "system", "user"]
    );
    assert_eq!(
        chat["messages"][4]["content"],
        "Approval mode is now never."
    );
    let marked = "<system-reminder>\nApproval mode is now never.\n</system-reminder>";
    let (claude, _) = built(Provider::Anthropic, &body);
    assert_eq!(claude["system"], "You are Codex.", "{claude}");
    let last = &claude["messages"][2];
    assert_eq!(last["role"], "user");
    assert_eq!(
        last["content"][1],
        json!({"type": "text", "text": marked}),
        "{claude}"
    );
    let (gemini, _) = built(Provider::Gemini, &body);
    let parts = &gemini["contents"][2]["parts"];
    assert_eq!(parts[1], json!({"text": marked}), "{gemini}");
    let (bedrock, _) = built(Provider::Bedrock, &body);
    assert_eq!(
        bedrock["messages"][2]["content"][1],
        json!({"text": marked}),
        "{bedrock}"
    );
}

/// Only hints are dropped: a `strict: false` tool, an `auto` image and no summary drop
/// nothing, and what changes the answer's shape is still refused by name.
#[test]
fn only_hints_are_dropped_and_shape_changes_are_still_refused() {
    let body = map(json!({"model": "m", "input": [{"role": "user", "content": [
        {"type": "input_text", "text": "hi"},
        {"type": "input_image", "image_url": "data:image/png;base64,iVBORw0KGgo=", "detail": "auto"}]}],
        "tools": [{"type": "function", "name": "f", "strict": false, "parameters": {"type": "object"}}]}));
    for to in [
        Provider::Anthropic,
        Provider::Gemini,
        Provider::Bedrock,
        Provider::AzureOpenai,
    ] {
        assert_eq!(built(to, &body).1, Vec::<&str>::new(), "{to:?}");
    }
    let mut schema = body.clone();
    schema.insert(
        "text".into(),
        json!({"format": {"type": "json_schema", "name": "x", "schema": {"type": "object"}}}),
    );
    let e = crate::upstream::providers::build_responses_request(
        Provider::Anthropic,
        &schema,
        "up",
        Some(("max_tokens", 100)),
        (false, true),
    )
    .unwrap_err();
    assert_eq!(e.param.as_deref(), Some("text"), "{e:?}");
}

/// A stream that opens call after call (no arguments) is kept by the Responses writer —
/// each call's ids and name — and counts against the hold limit like texts do: past it the
/// stream ends as an upstream failure (s26 diff attack #2: 1 000 calls of 1 KB names never
/// reached a 100 KB limit, where an Anthropic client's writer ends it).
#[test]
fn tool_calls_a_responses_writer_keeps_count_against_the_hold_limit() {
    let w = EventWriter::new(map(json!({"input": "x"})), stamp());
    let mut c = StreamConverter::new(Format::OpenAiChat, Format::OpenAiChat, false, 9)
        .hold_limit(100_000)
        .responses(ResponsesOut::Translated(Box::new(w)));
    let mut out = Vec::new();
    let name = "f".repeat(1_000);
    for k in 0..1_000 {
        let chunk = json!({"id": "c", "created": 1, "model": "up", "choices": [{"index": 0,
            "delta": {"tool_calls": [{"index": k, "id": format!("call_{k}"), "function": {"name": name}}]}}]});
        c.event("", &chunk.to_string(), &mut out);
        if c.upstream_failed() {
            assert!(k >= 10, "not before the limit: call {k}");
            return;
        }
    }
    panic!("1 000 calls of 1 KB names kept past a 100 KB hold limit");
}

/// An upstream's stream, read by its format's reader and written by the Responses writer:
/// the completed response.
fn streamed(from: Format, events: &[(&str, Value)]) -> Value {
    let w = EventWriter::new(map(json!({"input": "x"})), stamp());
    let mut c = StreamConverter::new(from, Format::OpenAiChat, false, 9)
        .responses(ResponsesOut::Translated(Box::new(w)));
    let mut out = Vec::new();
    for (name, e) in events {
        c.event(name, &e.to_string(), &mut out);
    }
    // The end of the upstream's body (Gemini says no `Done` of its own).
    c.end(&mut out);
    c.completed_response().expect("the stream completes")
}

/// The `(type, id)` of each output item.
fn item_order(r: &Value) -> Vec<(String, String)> {
    r["output"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| {
            (
                i["type"].as_str().unwrap().into(),
                i["id"].as_str().unwrap().into(),
            )
        })
        .collect()
}

/// The Gemini request that continues `output` with the call's result: the model turn's
/// parts.
fn gemini_continuation(output: &Value) -> Vec<Value> {
    let mut input = vec![json!({"role": "user", "content": "Weather?"})];
    input.extend(output["output"].as_array().unwrap().iter().cloned());
    input.push(json!({"type": "function_call_output", "call_id": output["output"].as_array().unwrap().iter().find(|i| i["type"] == "function_call").unwrap()["call_id"], "output": "sunny"}));
    let body = map(json!({"model": "m", "input": input}));
    let (sent, _) = built(Provider::Gemini, &body);
    let model = sent["contents"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["role"] == "model")
        .unwrap_or_else(|| panic!("no model turn: {sent}"));
    model["parts"].as_array().unwrap().clone()
}

/// The Gemini answer's candidate around `parts`, as a stream's one chunk and a whole answer.
fn gemini_chunk(parts: Value) -> Value {
    json!({"responseId": "r", "modelVersion": "gemini-3", "candidates": [{"content": {"role": "model", "parts": parts}, "finishReason": "STOP"}],
        "usageMetadata": {"promptTokenCount": 3, "candidatesTokenCount": 4}})
}

fn call_part(parts: &[Value]) -> &Value {
    parts
        .iter()
        .find(|p| p.get("functionCall").is_some())
        .unwrap_or_else(|| panic!("no call: {parts:?}"))
}

/// A Gemini thought then a signed call: streamed, the signature is a reasoning item of its
/// own before the call, and on continuation it goes back on the call (s29 responses attack
/// F2: it was put on the thought's item, and Gemini 3 refuses a call without its signature).
#[test]
fn a_thought_then_a_signed_call_streams_two_items_and_the_signature_reaches_the_call() {
    let chunk = gemini_chunk(json!([
        {"thought": true, "text": "Thinking about weather."},
        {"functionCall": {"name": "weather", "args": {"city": "Paris"}}, "thoughtSignature": "S"}
    ]));
    let streamed = streamed(Format::Gemini, &[("", chunk.clone())]);
    let parts = gemini_continuation(&streamed);
    assert_eq!(call_part(&parts)["thoughtSignature"], "S", "{parts:?}");
    let answer = crate::upstream::providers::formats::gemini::read_answer(&chunk).unwrap();
    let whole = write_answer(&answer, &map(json!({"input": "x"})), "gw");
    let kinds = |r: &Value| {
        item_order(r)
            .into_iter()
            .map(|(k, _)| k)
            .collect::<Vec<_>>()
    };
    assert_eq!(kinds(&streamed), kinds(&whole), "{streamed}\n{whole}");
    assert_eq!(
        kinds(&streamed),
        ["reasoning", "reasoning", "function_call"]
    );
}

/// A Gemini text then a signed call, as a whole answer: the items keep the parts' order,
/// so the signature goes back on the call (s29 responses attack F3: the reasoning item came
/// first, and the signature went out on its own before the text).
#[test]
fn a_whole_gemini_answer_keeps_its_parts_in_order_for_the_continuation() {
    let chunk = gemini_chunk(json!([
        {"text": "Let me check."},
        {"functionCall": {"name": "weather", "args": {"city": "Paris"}}, "thoughtSignature": "S"}
    ]));
    let answer = crate::upstream::providers::formats::gemini::read_answer(&chunk).unwrap();
    let whole = write_answer(&answer, &map(json!({"input": "x"})), "gw");
    let parts = gemini_continuation(&whole);
    assert_eq!(call_part(&parts)["thoughtSignature"], "S", "{parts:?}");
    let streamed = streamed(Format::Gemini, &[("", chunk)]);
    let kinds = |r: &Value| {
        item_order(r)
            .into_iter()
            .map(|(k, _)| k)
            .collect::<Vec<_>>()
    };
    assert_eq!(kinds(&whole), kinds(&streamed), "{whole}\n{streamed}");
    assert_eq!(kinds(&whole), ["message", "reasoning", "function_call"]);
    // Text on both sides of a call: two message items, each with an id of its own.
    let answer = Answer {
        content: vec![
            text("a"),
            Part::ToolCall {
                id: "c1".into(),
                name: "f".into(),
                arguments: "{}".into(),
            },
            text("b"),
        ],
        ..answer
    };
    let whole = write_answer(&answer, &map(json!({"input": "x"})), "gw");
    let order = item_order(&whole);
    assert_eq!(
        order.iter().map(|(k, _)| k.as_str()).collect::<Vec<_>>(),
        ["message", "function_call", "message"]
    );
    assert_ne!(order[0].1, order[2].1);
}

/// A streamed Anthropic `redacted_thinking` block is a reasoning item whose
/// `encrypted_content` is the redacted data, as the whole answer's is (s29 responses
/// attack F2: the data was dropped, and the item could not be sent back).
#[test]
fn a_streamed_redacted_thinking_block_keeps_its_data() {
    let events = [
        (
            "message_start",
            json!({"type": "message_start", "message": {"id": "m", "model": "claude", "usage": {"input_tokens": 3}}}),
        ),
        (
            "content_block_start",
            json!({"type": "content_block_start", "index": 0, "content_block": {"type": "thinking", "thinking": ""}}),
        ),
        (
            "content_block_delta",
            json!({"type": "content_block_delta", "index": 0, "delta": {"type": "thinking_delta", "thinking": "Hmm."}}),
        ),
        (
            "content_block_delta",
            json!({"type": "content_block_delta", "index": 0, "delta": {"type": "signature_delta", "signature": "sig"}}),
        ),
        (
            "content_block_stop",
            json!({"type": "content_block_stop", "index": 0}),
        ),
        (
            "content_block_start",
            json!({"type": "content_block_start", "index": 1, "content_block": {"type": "redacted_thinking", "data": "D"}}),
        ),
        (
            "content_block_stop",
            json!({"type": "content_block_stop", "index": 1}),
        ),
        (
            "content_block_start",
            json!({"type": "content_block_start", "index": 2, "content_block": {"type": "text", "text": ""}}),
        ),
        (
            "content_block_delta",
            json!({"type": "content_block_delta", "index": 2, "delta": {"type": "text_delta", "text": "Hi."}}),
        ),
        (
            "content_block_stop",
            json!({"type": "content_block_stop", "index": 2}),
        ),
        (
            "message_delta",
            json!({"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 5}}),
        ),
        ("message_stop", json!({"type": "message_stop"})),
    ];
    let r = streamed(Format::Anthropic, &events);
    let out = r["output"].as_array().unwrap();
    assert_eq!(out.len(), 3, "{r}");
    assert_eq!(out[0]["encrypted_content"], "sig");
    assert_eq!(out[0]["content"][0]["text"], "Hmm.");
    assert_eq!(out[1]["type"], "reasoning");
    assert_eq!(out[1]["encrypted_content"], "D", "{r}");
    assert_eq!(out[2]["type"], "message");
}
