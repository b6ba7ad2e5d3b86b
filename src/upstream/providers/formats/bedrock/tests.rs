//! Golden fixtures in the shapes of the Bedrock Converse API reference
//! (`tests/fixtures/bedrock/`), read and written through the adapter.

use serde_json::{json, Value};

use super::*;
use crate::upstream::providers::canonical::{Answer, ErrorKind, Event, Finish, Reported, Usage};
use crate::upstream::providers::formats::fixtures;

fn text(t: &str) -> Part {
    Part::Text {
        text: t.into(),
        cache: None,
    }
}

fn round_trip_request() -> Request {
    Request {
        model: "claude-on-bedrock".into(),
        system: vec![Part::Text {
            text: "You are a weather bot.".into(),
            cache: Some(CacheMark { ttl: None }),
        }],
        messages: vec![
            Message {
                role: Role::User,
                content: vec![
                    text("What is the weather in Seattle?"),
                    Part::Image {
                        source: Source::Base64 {
                            media_type: "image/png".into(),
                            data: "iVBORw0KGgo=".into(),
                        },
                        detail: None,
                        cache: None,
                    },
                ],
                name: None,
                plain: false,
            },
            Message {
                role: Role::Assistant,
                content: vec![
                    Part::Reasoning {
                        text: "Need the tool.".into(),
                        signature: Some("c2ln".into()),
                        redacted: None,
                    },
                    Part::ToolCall {
                        id: "tooluse_1".into(),
                        name: "get_weather".into(),
                        arguments: r#"{"city":"Seattle"}"#.into(),
                    },
                ],
                name: None,
                plain: false,
            },
            Message {
                role: Role::Tool,
                content: vec![Part::ToolResult {
                    call_id: "tooluse_1".into(),
                    content: vec![text("12 C, rain")],
                    is_error: false,
                    plain: false,
                    cache: None,
                }],
                name: None,
                plain: false,
            },
            Message {
                role: Role::User,
                content: vec![
                    text("And in Paris?"),
                    Part::File {
                        source: Source::Base64 {
                            media_type: "application/pdf".into(),
                            data: "JVBERi0=".into(),
                        },
                        filename: Some("forecast.2024.pdf".into()),
                        cache: None,
                    },
                ],
                name: None,
                plain: false,
            },
        ],
        tools: vec![Tool {
            name: "get_weather".into(),
            description: Some("Current weather of a city".into()),
            parameters: json!({"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}),
            strict: None,
            cache: Some(CacheMark {
                ttl: Some("5m".into()),
            }),
        }],
        tool_choice: Some(ToolChoice::Required),
        max_output_tokens: Some(1024),
        temperature: Some(0.5),
        top_p: Some(0.9),
        stop: vec!["END".into()],
        reasoning: Some(Reasoning {
            effort: None,
            budget_tokens: Some(2048),
            summary: None,
        }),
        user: Some("user-42".into()),
        ..Request::default()
    }
}

const CLAUDE: &str = "anthropic.claude-3-7-sonnet-20250219-v1:0";

#[test]
fn a_tools_round_trip_request_is_the_documented_converse_body() {
    let got = write_request(
        &round_trip_request(),
        CLAUDE,
        Some(("max_tokens", 1024)),
        false,
    )
    .unwrap();
    let want: Value = fixtures::json("bedrock", "requests/tools_round_trip.json");
    assert_eq!(Value::Object(got), want);
}

fn refused(r: &Request, model: &str) -> TranslateError {
    write_request(r, model, Some(("max_tokens", 100)), false).unwrap_err()
}

fn simple() -> Request {
    Request {
        messages: vec![Message {
            role: Role::User,
            content: vec![text("hi")],
            name: None,
            plain: false,
        }],
        ..Request::default()
    }
}

#[test]
fn what_converse_cannot_express_is_refused_naming_the_clients_field() {
    let mut r = simple();
    r.messages[0].content.push(Part::Image {
        source: Source::Url("https://example.com/cat.png".into()),
        detail: None,
        cache: None,
    });
    let e = refused(&r, CLAUDE);
    assert_eq!(e.param.as_deref(), Some("image_url"));
    assert!(e.message.contains("base64"), "{}", e.message);

    let mut r = simple();
    r.response_format = Some(ResponseFormat::JsonSchema {
        name: "x".into(),
        schema: json!({"type":"object"}),
        strict: None,
        description: None,
    });
    assert_eq!(
        refused(&r, CLAUDE).param.as_deref(),
        Some("response_format")
    );
    // Named as the client wrote it (Responses: `text.format`).
    r.names = vec![("text.format", "response_format")];
    let e = refused(&r, CLAUDE);
    assert_eq!(e.param.as_deref(), Some("text.format"));
    assert!(e.message.contains("`text.format`"), "{}", e.message);

    let mut r = simple();
    r.parallel_tool_calls = Some(false);
    assert_eq!(
        refused(&r, CLAUDE).param.as_deref(),
        Some("parallel_tool_calls")
    );

    let mut r = simple();
    r.reasoning = Some(Reasoning {
        effort: Some("high".into()),
        budget_tokens: None,
        summary: None,
    });
    r.names = vec![("reasoning_effort", "reasoning")];
    assert_eq!(
        refused(&r, CLAUDE).param.as_deref(),
        Some("reasoning_effort")
    );

    let mut r = simple();
    r.reasoning = Some(Reasoning {
        effort: None,
        budget_tokens: Some(1024),
        summary: None,
    });
    assert_eq!(
        refused(&r, "amazon.nova-pro-v1:0").param.as_deref(),
        Some("reasoning")
    );

    let mut r = simple();
    r.tools = vec![Tool {
        name: "t".into(),
        description: None,
        parameters: json!({}),
        strict: None,
        cache: None,
    }];
    r.tool_choice = Some(ToolChoice::None);
    assert_eq!(refused(&r, CLAUDE).param.as_deref(), Some("tool_choice"));
}

#[test]
fn consecutive_user_turns_are_merged_and_tool_errors_flagged() {
    let mut r = simple();
    r.tools = vec![Tool {
        name: "t".into(),
        description: None,
        parameters: json!({"type":"object"}),
        strict: None,
        cache: None,
    }];
    r.messages.push(Message {
        role: Role::Assistant,
        content: vec![Part::ToolCall {
            id: "c1".into(),
            name: "t".into(),
            arguments: "{}".into(),
        }],
        name: None,
        plain: false,
    });
    r.messages.push(Message {
        role: Role::Tool,
        content: vec![Part::ToolResult {
            call_id: "c1".into(),
            content: vec![text("boom")],
            is_error: true,
            cache: None,
            plain: false,
        }],
        name: None,
        plain: false,
    });
    r.messages.push(Message {
        role: Role::User,
        content: vec![text("again")],
        name: None,
        plain: false,
    });
    let got = write_request(&r, CLAUDE, None, true).unwrap();
    let msgs = got["messages"].as_array().unwrap();
    assert_eq!(msgs.len(), 3);
    assert_eq!(msgs[2]["role"], "user");
    assert_eq!(msgs[2]["content"][0]["toolResult"]["status"], "error");
    assert_eq!(msgs[2]["content"][1]["text"], "again");
    assert!(got.get("inferenceConfig").is_none());
}

#[test]
fn a_converse_answer_reads_into_the_internal_form() {
    let v: Value = fixtures::json("bedrock", "answers/tool_use.json");
    let a: Answer = read_answer(&v).unwrap();
    assert!(a.id.starts_with("bedrock-"));
    assert_eq!(a.finish, Finish::ToolCalls);
    assert_eq!(
        a.content,
        vec![
            Part::Reasoning {
                text: "The user wants the weather.".into(),
                signature: Some("c2lnbmF0dXJl".into()),
                redacted: None
            },
            text("I'll look up the weather."),
            Part::ToolCall {
                id: "tooluse_kZJMlvQmRJ6eAyJE5GIl7Q".into(),
                name: "get_weather".into(),
                arguments: r#"{"city":"Seattle"}"#.into()
            },
        ]
    );
    // inputTokens excludes the cache: 320 + 1000 read + 200 written (not split by
    // lifetime: one-hour writes when the request marked one).
    assert_eq!(
        a.usage,
        Some(Usage {
            input: 1520,
            output: 58,
            cached_input: 1000,
            cache_write_5m: 200,
            cache_write_unsplit: 200,
            ..Usage::default()
        })
    );
    let v: Value = fixtures::json("bedrock", "answers/text.json");
    let a = read_answer(&v).unwrap();
    assert_eq!(a.finish, Finish::Stop);
    assert_eq!(a.usage.map(|u| (u.input, u.output)), Some((12, 9)));
}

#[test]
fn every_stop_reason_maps() {
    for (reason, finish) in [
        ("end_turn", Finish::Stop),
        ("tool_use", Finish::ToolCalls),
        ("max_tokens", Finish::Length),
        ("stop_sequence", Finish::StopSequence(None)),
        ("guardrail_intervened", Finish::ContentFilter),
        ("content_filtered", Finish::ContentFilter),
        (
            "model_context_window_exceeded",
            Finish::Other("model_context_window_exceeded".into()),
        ),
    ] {
        let v = json!({"output":{"message":{"role":"assistant","content":[]}},"stopReason":reason});
        assert_eq!(read_answer(&v).unwrap().finish, finish, "{reason}");
    }
}

#[test]
fn a_malformed_answer_is_corrupt_not_a_panic() {
    for v in [
        json!({}),
        json!({"output":{"message":{"content":"text"}},"stopReason":"end_turn"}),
        json!({"output":{"message":{"content":[{"text":5}]}},"stopReason":"end_turn"}),
        json!({"output":{"message":{"content":[{"toolUse":{"name":"x"}}]}},"stopReason":"tool_use"}),
        json!({"output":{"message":{"content":[]}}}),
    ] {
        assert!(read_answer(&v).is_err(), "{v}");
    }
}

#[test]
fn a_converse_stream_reads_into_events() {
    let mut reader = EventReader::new();
    let mut events = Vec::new();
    for line in fixtures::text("bedrock", "streams/tool_use.jsonl").lines() {
        let l: Value = serde_json::from_str(line).unwrap();
        reader
            .read(
                l["event"].as_str().unwrap(),
                &l["data"].to_string(),
                &mut events,
            )
            .unwrap();
    }
    assert!(matches!(&events[0], Event::Start { id, .. } if id.starts_with("bedrock-")));
    assert_eq!(
        events[1..].to_vec(),
        vec![
            Event::ReasoningStart { index: 0 },
            Event::ReasoningDelta {
                index: 0,
                text: "Weather needed.".into()
            },
            Event::ReasoningSignature {
                index: 0,
                signature: "c2ln".into()
            },
            Event::BlockStop { index: 0 },
            Event::TextStart { index: 1 },
            Event::TextDelta {
                index: 1,
                text: "Let me ".into()
            },
            Event::TextDelta {
                index: 1,
                text: "check.".into()
            },
            Event::BlockStop { index: 1 },
            Event::ToolCallStart {
                index: 2,
                id: "tooluse_abc".into(),
                name: "get_weather".into()
            },
            Event::ToolArgsDelta {
                index: 2,
                json: "{\"city\":".into()
            },
            Event::ToolArgsDelta {
                index: 2,
                json: "\"Seattle\"}".into()
            },
            Event::BlockStop { index: 2 },
            Event::Finish(Finish::ToolCalls),
            Event::Usage(Reported::whole(Usage {
                input: 25,
                output: 31,
                ..Usage::default()
            })),
            Event::Done,
        ]
    );
}

#[test]
fn a_stream_exception_becomes_an_error_event() {
    let mut reader = EventReader::new();
    let mut events = Vec::new();
    reader
        .read(
            "throttlingException",
            r#"{"message":"Too many tokens, please wait before trying again."}"#,
            &mut events,
        )
        .unwrap();
    let Event::Error(e) = &events[0] else {
        panic!("{events:?}")
    };
    assert_eq!((e.status, e.kind), (429, ErrorKind::RateLimited));
    assert_eq!(e.code.as_deref(), Some("throttlingException"));
    assert!(e.message.starts_with("Too many tokens"));
}

#[test]
fn corrupt_stream_events_are_refused() {
    for (name, data) in [
        ("contentBlockDelta", "not json"),
        ("contentBlockDelta", r#"{"delta":{"text":"x"}}"#),
        (
            "contentBlockDelta",
            r#"{"contentBlockIndex":0,"delta":{"toolUse":{"input":"{}"}}}"#,
        ),
        ("contentBlockStop", r#"{"contentBlockIndex":7}"#),
        ("messageStop", r#"{}"#),
        ("metadata", r#"{"usage":{"inputTokens":"many"}}"#),
        ("messageStart", "[]"),
    ] {
        let mut reader = EventReader::new();
        assert!(
            reader.read(name, data, &mut Vec::new()).is_err(),
            "{name} {data}"
        );
    }
}

#[test]
fn bedrock_errors_map_to_the_retry_kinds() {
    for (status, ty, kind) in [
        (429, "ThrottlingException", ErrorKind::RateLimited),
        (
            400,
            "ServiceQuotaExceededException",
            ErrorKind::QuotaExhausted,
        ),
        (429, "ModelNotReadyException", ErrorKind::Overloaded),
        (503, "ServiceUnavailableException", ErrorKind::Overloaded),
        (400, "ValidationException", ErrorKind::InvalidRequest),
        (403, "AccessDeniedException", ErrorKind::PermissionDenied),
        (404, "ResourceNotFoundException", ErrorKind::NotFound),
        (408, "ModelTimeoutException", ErrorKind::Server),
        (500, "InternalServerException", ErrorKind::Server),
    ] {
        let body = json!({"message": "m", "__type": format!("{ty}:http://internal.amazon.com/coral/com.amazon.bedrock/")});
        let e = read_error(status, &body);
        assert_eq!(e.kind, kind, "{ty}");
        assert_eq!(e.code.as_deref(), Some(ty));
        assert_eq!(e.message, "m");
    }
    assert_eq!(read_error(429, &json!({})).kind, ErrorKind::RateLimited);
}

#[test]
fn arbitrary_payloads_never_panic_the_reader_or_the_answer() {
    let mut seed = 0x2545_f491_u64;
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    let leaves = [
        json!(null),
        json!(0),
        json!(-1),
        json!(u64::MAX),
        json!(1.5),
        json!("s"),
        json!(true),
        json!([]),
        json!({}),
    ];
    let keys = [
        "contentBlockIndex",
        "delta",
        "start",
        "toolUse",
        "text",
        "input",
        "reasoningContent",
        "signature",
        "redactedContent",
        "stopReason",
        "usage",
        "inputTokens",
        "outputTokens",
        "output",
        "message",
        "content",
        "toolUseId",
        "name",
        "reasoningText",
        "message",
    ];
    fn build(depth: u32, next: &mut dyn FnMut() -> u64, leaves: &[Value], keys: &[&str]) -> Value {
        if depth == 0 || next().is_multiple_of(3) {
            return leaves[(next() % leaves.len() as u64) as usize].clone();
        }
        let mut m = serde_json::Map::new();
        for _ in 0..(next() % 4) {
            let k = keys[(next() % keys.len() as u64) as usize];
            m.insert(k.into(), build(depth - 1, next, leaves, keys));
        }
        Value::Object(m)
    }
    let names = [
        "messageStart",
        "contentBlockStart",
        "contentBlockDelta",
        "contentBlockStop",
        "messageStop",
        "metadata",
        "throttlingException",
        "other",
    ];
    for _ in 0..3000 {
        let mut reader = EventReader::new();
        let mut out = Vec::new();
        for _ in 0..6 {
            let v = build(5, &mut next, &leaves, &keys);
            let name = names[(next() % names.len() as u64) as usize];
            let _ = reader.read(name, &v.to_string(), &mut out);
        }
        let v = build(6, &mut next, &leaves, &keys);
        let _ = read_answer(&v);
        let _ = read_error(400, &v);
    }
}

/// A block that starts as anything but a tool call (one ConverseStream added later) is a
/// kind the reader does not model, `Unsupported`: no failure of the key; a start that is
/// missing, empty or no object is `Shape` (s28 diff attack F1).
#[test]
fn a_block_start_of_a_kind_not_modelled_is_told_apart_from_a_broken_one() {
    use crate::upstream::providers::translate::stream::Corrupt;
    let cases = [
        (
            json!({"contentBlockIndex": 0, "start": {"image": {"format": "png"}}}),
            Corrupt::Unsupported,
        ),
        (json!({"contentBlockIndex": 0}), Corrupt::Shape),
        (json!({"contentBlockIndex": 0, "start": {}}), Corrupt::Shape),
        (
            json!({"contentBlockIndex": 0, "start": "toolUse"}),
            Corrupt::Shape,
        ),
        (
            json!({"contentBlockIndex": 0, "start": {"toolUse": {"name": "f"}}}),
            Corrupt::Shape,
        ),
    ];
    for (event, why) in cases {
        let mut out = Vec::new();
        let read = EventReader::new().read("contentBlockStart", &event.to_string(), &mut out);
        assert_eq!(read.err(), Some(why), "{event}");
    }
}
