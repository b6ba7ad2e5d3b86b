//! The Gemini adapter against fixtures in the shapes of Google's API reference
//! (`tests/fixtures/gemini/`).

use serde_json::{json, Value};

use super::*;
use crate::upstream::providers::canonical::*;
use crate::upstream::providers::formats::fixtures;

fn text(t: &str) -> Part {
    Part::Text {
        text: t.into(),
        cache: None,
    }
}

fn user(parts: Vec<Part>) -> Message {
    Message {
        role: Role::User,
        content: parts,
        name: None,
        plain: false,
    }
}

fn roundtrip_request() -> Request {
    Request {
        model: "gemini-flash".into(),
        system: vec![text("You are terse.")],
        messages: vec![
            user(vec![
                text("Weather in Paris and Oslo? See the map."),
                Part::Image {
                    source: Source::Base64 {
                        media_type: "image/png".into(),
                        data: "iVBORw0KGgo=".into(),
                    },
                    detail: None,
                    cache: None,
                },
                Part::File {
                    source: Source::Url("https://example.com/forecast.pdf".into()),
                    filename: Some("forecast.pdf".into()),
                    cache: None,
                },
            ]),
            Message {
                role: Role::Assistant,
                content: vec![
                    Part::Reasoning {
                        text: "Planning the calls.".into(),
                        signature: Some("sig-thought".into()),
                        redacted: None,
                    },
                    Part::Reasoning {
                        text: String::new(),
                        signature: Some("sig-call".into()),
                        redacted: None,
                    },
                    Part::ToolCall {
                        id: "call_a".into(),
                        name: "get_weather".into(),
                        arguments: r#"{"city":"Paris"}"#.into(),
                    },
                    Part::ToolCall {
                        id: "call_b".into(),
                        name: "get_weather".into(),
                        arguments: r#"{"city":"Oslo"}"#.into(),
                    },
                ],
                name: None,
                plain: false,
            },
            Message {
                role: Role::Tool,
                content: vec![Part::ToolResult {
                    call_id: "call_a".into(),
                    content: vec![text("18C")],
                    is_error: false,
                    cache: None,
                    plain: false,
                }],
                name: None,
                plain: false,
            },
            Message {
                role: Role::Tool,
                content: vec![Part::ToolResult {
                    call_id: "call_b".into(),
                    content: vec![text("station offline")],
                    is_error: true,
                    cache: None,
                    plain: false,
                }],
                name: None,
                plain: false,
            },
        ],
        tools: vec![Tool {
            name: "get_weather".into(),
            description: Some("Current weather".into()),
            parameters: json!({"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}),
            strict: None,
            cache: None,
        }],
        tool_choice: Some(ToolChoice::Named("get_weather".into())),
        max_output_tokens: Some(4096),
        temperature: Some(0.5),
        top_p: Some(0.9),
        stop: vec!["END".into()],
        response_format: Some(ResponseFormat::JsonSchema {
            name: "out".into(),
            schema: json!({"type": "object"}),
            strict: Some(true),
            description: None,
        }),
        reasoning: Some(Reasoning {
            effort: None,
            budget_tokens: Some(1024),
            summary: None,
        }),
        ..Request::default()
    }
}

#[test]
fn a_request_with_media_thoughts_and_a_tool_round_trip_is_the_golden_body() {
    let body = write_request(
        &roundtrip_request(),
        "gemini-2.5-flash",
        Some(("max_tokens", 256)),
        false,
    )
    .unwrap();
    assert_eq!(
        Value::Object(body),
        fixtures::json("gemini", "request_tools_roundtrip.json")
    );
}

#[test]
fn a_tool_result_for_an_unknown_call_id_is_refused_naming_the_id() {
    let mut r = roundtrip_request();
    r.messages.push(Message {
        role: Role::Tool,
        content: vec![Part::ToolResult {
            call_id: "call_zz".into(),
            content: vec![text("x")],
            is_error: false,
            cache: None,
            plain: false,
        }],
        name: None,
        plain: false,
    });
    let e = write_request(&r, "m", None, false).unwrap_err();
    assert_eq!(e.param.as_deref(), Some("tool_call_id"));
    assert!(e.message.contains("call_zz"), "{}", e.message);
}

#[test]
fn a_reused_call_id_names_the_nearest_call_before_its_result() {
    let call = |name: &str| Message {
        role: Role::Assistant,
        content: vec![Part::ToolCall {
            id: "call_0".into(),
            name: name.into(),
            arguments: "{}".into(),
        }],
        name: None,
        plain: false,
    };
    let result = || Message {
        role: Role::Tool,
        content: vec![Part::ToolResult {
            call_id: "call_0".into(),
            content: vec![text("ok")],
            is_error: false,
            cache: None,
            plain: false,
        }],
        name: None,
        plain: false,
    };
    let r = Request {
        messages: vec![
            user(vec![text("hi")]),
            call("first"),
            result(),
            call("second"),
            result(),
        ],
        ..Request::default()
    };
    let body = write_request(&r, "m", None, false).unwrap();
    let names: Vec<&str> = body["contents"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|c| c["parts"].as_array().unwrap())
        .filter_map(|p| p.pointer("/functionResponse/name")?.as_str())
        .collect();
    assert_eq!(names, ["first", "second"]);
}

#[test]
fn what_gemini_cannot_express_is_refused_naming_the_clients_field() {
    let base = || Request {
        messages: vec![user(vec![text("hi")])],
        ..Request::default()
    };
    // A request whose one user message is one image part from `source`.
    let image = |source| Request {
        messages: vec![user(vec![Part::Image {
            source,
            detail: None,
            cache: None,
        }])],
        ..base()
    };
    let cases: Vec<(Request, &str)> = vec![
        (
            Request {
                parallel_tool_calls: Some(false),
                names: vec![("parallel_tool_calls", "parallel_tool_calls")],
                ..base()
            },
            "parallel_tool_calls",
        ),
        (
            Request {
                service_tier: Some("flex".into()),
                ..base()
            },
            "service_tier",
        ),
        (
            Request {
                messages: vec![Message {
                    role: Role::User,
                    content: vec![text("hi")],
                    name: Some("bob".into()),
                    plain: false,
                }],
                ..base()
            },
            "name",
        ),
        (
            Request {
                tools: vec![Tool {
                    name: "f".into(),
                    description: None,
                    parameters: json!({}),
                    strict: Some(true),
                    cache: None,
                }],
                ..base()
            },
            "strict",
        ),
        (image(Source::FileId("file-1".into())), "image_url"),
        (image(Source::Url("https://x.test/pic".into())), "image_url"),
        // An image part that is no image: Gemini reads (and bills) whatever its MIME type
        // says, while the estimate counts it as one image (s27 attack, translated money #1).
        (
            image(Source::Base64 {
                media_type: "application/pdf".into(),
                data: "JVBERi0=".into(),
            }),
            "image_url",
        ),
        (
            image(Source::Base64 {
                media_type: "text/plain".into(),
                data: "aGk=".into(),
            }),
            "image_url",
        ),
        (
            image(Source::Url("https://x.test/book.PDF?x=1".into())),
            "image_url",
        ),
        (
            image(Source::Url("https://x.test/corpus.txt".into())),
            "image_url",
        ),
        (
            Request {
                messages: vec![Message {
                    role: Role::Assistant,
                    content: vec![Part::Reasoning {
                        text: String::new(),
                        signature: None,
                        redacted: Some("x".into()),
                    }],
                    name: None,
                    plain: false,
                }],
                ..base()
            },
            "redacted_thinking",
        ),
    ];
    for (r, field) in cases {
        let e = write_request(&r, "m", None, false).unwrap_err();
        assert_eq!(e.param.as_deref(), Some(field), "{}", e.message);
        assert!(e.message.contains(field), "{}", e.message);
    }
    // The client's own name for a field, where it differs from the internal one.
    let r = Request {
        parallel_tool_calls: Some(false),
        names: vec![("disable_parallel_tool_use", "parallel_tool_calls")],
        ..base()
    };
    assert_eq!(
        write_request(&r, "m", None, false)
            .unwrap_err()
            .param
            .as_deref(),
        Some("disable_parallel_tool_use")
    );
}

#[test]
fn usage_counts_thoughts_as_output_and_cached_tokens_inside_the_input() {
    let a = read_answer(&fixtures::json("gemini", "answer_thinking.json")).unwrap();
    assert_eq!(
        a.usage,
        Some(Usage {
            input: 1200,
            output: 7 + 94,
            cached_input: 1024,
            reasoning: 94,
            ..Usage::default()
        })
    );
    assert_eq!(a.id, "kX8uaPqZLabc");
    assert_eq!(a.model, "gemini-2.5-flash");
    assert_eq!(a.finish, Finish::Stop);
    assert_eq!(
        a.content,
        vec![
            Part::Reasoning {
                text: "The user asks for a sum. 2 + 2 is 4.".into(),
                signature: None,
                redacted: None
            },
            Part::Reasoning {
                text: String::new(),
                signature: Some("CiQB0e2Kb7sig".into()),
                redacted: None
            },
            text("2 + 2 = 4."),
        ]
    );
    // Tool-use prompt tokens are input on top of the prompt's.
    let u = read_usage(
        &json!({"promptTokenCount": 61, "candidatesTokenCount": 16, "toolUsePromptTokenCount": 5}),
    )
    .unwrap();
    assert_eq!((u.input, u.output), (66, 16));
    assert_eq!(read_usage(&json!({})), None);
    // A lying upstream's figures are clamped, never overflowing a sum.
    let u = read_usage(&json!({"promptTokenCount": i64::MAX, "candidatesTokenCount": -5, "thoughtsTokenCount": u64::MAX})).unwrap();
    assert!(
        u.input >= 0
            && u.output >= 0
            && u.output <= 2 * crate::upstream::providers::MAX_REPORTED_TOKENS
    );
}

#[test]
fn function_calls_get_ids_stable_for_the_answer_and_unique_across_answers() {
    let v = fixtures::json("gemini", "answer_function_calls.json");
    let a = read_answer(&v).unwrap();
    assert_eq!(a.finish, Finish::ToolCalls);
    assert_eq!(a.created, Some(1_748_779_200));
    let ids: Vec<&str> = a
        .content
        .iter()
        .filter_map(|p| match p {
            Part::ToolCall { id, .. } => Some(id.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(ids, ["call_resp-fc-1_0", "call_resp-fc-1_1"]);
    assert_eq!(
        a.content[0],
        Part::Reasoning {
            text: String::new(),
            signature: Some("CiwBsigA".into()),
            redacted: None
        }
    );
    assert_eq!(
        a.content[1],
        Part::ToolCall {
            id: ids[0].into(),
            name: "get_weather".into(),
            arguments: r#"{"city":"Paris"}"#.into()
        }
    );
    assert_eq!(read_answer(&v).unwrap(), a, "read twice, the same ids");
    // Without a responseId, ids still differ between two answers.
    let mut other = v.clone();
    other.as_object_mut().unwrap().remove("responseId");
    let mut third = other.clone();
    third["candidates"][0]["content"]["parts"][0]["functionCall"]["args"]["city"] = json!("Rome");
    let first_id = |a: &Answer| match &a.content[1] {
        Part::ToolCall { id, .. } => id.clone(),
        p => panic!("{p:?}"),
    };
    let (b, c) = (read_answer(&other).unwrap(), read_answer(&third).unwrap());
    assert_ne!(first_id(&b), first_id(&c));
    assert_eq!(first_id(&b), first_id(&read_answer(&other).unwrap()));
    // The ids of an answer resolve the names when the conversation comes back.
    let r = Request {
        messages: vec![
            user(vec![text("weather?")]),
            Message {
                role: Role::Assistant,
                content: a.content.clone(),
                name: None,
                plain: false,
            },
            Message {
                role: Role::Tool,
                content: vec![Part::ToolResult {
                    call_id: ids[1].into(),
                    content: vec![text("2C")],
                    is_error: false,
                    cache: None,
                    plain: false,
                }],
                name: None,
                plain: false,
            },
        ],
        ..Request::default()
    };
    let body = write_request(&r, "m", None, false).unwrap();
    assert_eq!(
        body["contents"][1]["parts"][0]["thoughtSignature"], "CiwBsigA",
        "the signature back on its call"
    );
    assert_eq!(
        body["contents"][2]["parts"][0]["functionResponse"]["name"],
        "get_weather"
    );
}

#[test]
fn a_prompt_blocked_by_safety_is_a_content_filter_finish() {
    let a = read_answer(&fixtures::json("gemini", "answer_blocked_prompt.json")).unwrap();
    assert_eq!(a.finish, Finish::ContentFilter);
    assert!(a.content.is_empty());
    assert_eq!(a.usage.map(|u| u.input), Some(9));
    for (reason, finish) in [
        ("MAX_TOKENS", Finish::Length),
        ("SAFETY", Finish::ContentFilter),
        ("RECITATION", Finish::ContentFilter),
        (
            "MALFORMED_FUNCTION_CALL",
            Finish::Other("MALFORMED_FUNCTION_CALL".into()),
        ),
    ] {
        let v = json!({"candidates": [{"content": {"parts": [{"text": "x"}]}, "finishReason": reason}]});
        assert_eq!(read_answer(&v).unwrap().finish, finish, "{reason}");
    }
}

#[test]
fn answers_in_no_known_shape_are_corrupt_not_cut() {
    for v in [
        json!([1]),
        json!({"candidates": {"x": 1}}),
        json!({"candidates": [{"content": {"parts": "text"}}]}),
        json!({"candidates": [{"content": {"parts": [{"inlineData": {"mimeType": "image/png", "data": "AA=="}}]}}]}),
        json!({"candidates": [{"content": {"parts": [{"functionCall": {"args": {}}}]}}]}),
        json!({"candidates": [{"content": {"parts": [{"functionCall": {"name": "f", "args": [1]}}]}}]}),
    ] {
        assert!(read_answer(&v).is_err(), "{v}");
    }
}

/// A part with fields of a kind the reader does not model (an image, code execution) is
/// `Unsupported` — the upstream's answer well-formed, no failure of its key — in an answer
/// and in a stream alike; a part that is no object, or an empty one, is `Shape`
/// (s28 diff attack F1).
#[test]
fn a_part_of_a_kind_not_modelled_is_told_apart_from_a_broken_one() {
    use crate::upstream::providers::translate::stream::Corrupt;
    let cases = [
        (
            json!({"inlineData": {"mimeType": "image/png", "data": "AA=="}}),
            Corrupt::Unsupported,
        ),
        (
            json!({"executableCode": {"language": "PYTHON", "code": "1"}}),
            Corrupt::Unsupported,
        ),
        (json!({}), Corrupt::Shape),
        (json!("text"), Corrupt::Shape),
        (json!({"functionCall": {"args": {}}}), Corrupt::Shape),
        // Fields of no documented kind: a garbled part, not an unmodelled one (s28 late
        // attack F6).
        (json!({"type": "text", "value": "x"}), Corrupt::Shape),
        (json!({"thought": false}), Corrupt::Shape),
        // A signed image is still an image (s28 final attack #2: dropped as a signature).
        (
            json!({"inlineData": {"mimeType": "image/png", "data": "AA=="}, "thoughtSignature": "c2ln"}),
            Corrupt::Unsupported,
        ),
    ];
    for (part, why) in cases {
        let v = json!({"candidates": [{"content": {"parts": [{"text": "x"}, part]}}]});
        assert_eq!(read_answer(&v).err(), Some(why), "{v}");
        let mut out = Vec::new();
        assert_eq!(
            EventReader::new().read("", &v.to_string(), &mut out).err(),
            Some(why),
            "{v}"
        );
    }
}

#[test]
fn a_stream_of_thoughts_text_and_a_call_reads_into_ordered_events_with_usage_last() {
    let chunks = fixtures::json("gemini", "stream_text_and_call.json");
    let mut reader = EventReader::new();
    let mut out = Vec::new();
    for c in chunks.as_array().unwrap() {
        reader.read("", &c.to_string(), &mut out).unwrap();
    }
    let expected = vec![
        Event::Start {
            id: "s-1".into(),
            model: "gemini-2.5-flash".into(),
            created: None,
        },
        Event::ReasoningStart { index: 0 },
        Event::ReasoningDelta {
            index: 0,
            text: "Let me check ".into(),
        },
        Event::Usage(Reported {
            input: Some(Input {
                input: 30,
                ..Input::default()
            }),
            output: None,
        }),
        Event::ReasoningDelta {
            index: 0,
            text: "the weather.".into(),
        },
        Event::Usage(Reported {
            input: Some(Input {
                input: 30,
                ..Input::default()
            }),
            output: None,
        }),
        Event::BlockStop { index: 0 },
        Event::TextStart { index: 1 },
        Event::TextDelta {
            index: 1,
            text: "Checking".into(),
        },
        Event::TextDelta {
            index: 1,
            text: " now.".into(),
        },
        Event::BlockStop { index: 1 },
        Event::ReasoningStart { index: 2 },
        Event::ReasoningSignature {
            index: 2,
            signature: "sig-1".into(),
        },
        Event::BlockStop { index: 2 },
        Event::ToolCallStart {
            index: 3,
            id: "call_s-1_0".into(),
            name: "get_weather".into(),
        },
        Event::ToolArgsDelta {
            index: 3,
            json: r#"{"city":"Paris"}"#.into(),
        },
        Event::BlockStop { index: 3 },
        Event::Finish(Finish::ToolCalls),
        Event::Usage(Reported::whole(Usage {
            input: 30,
            output: 32,
            cached_input: 16,
            reasoning: 20,
            ..Usage::default()
        })),
    ];
    assert_eq!(out, expected);
}

#[test]
fn a_stream_error_chunk_and_garbage_are_told_apart() {
    let mut out = Vec::new();
    let mut r = EventReader::new();
    assert!(matches!(
        r.read("", "{\"candidates\": [", &mut out),
        Err(crate::upstream::providers::translate::stream::Corrupt::Json)
    ));
    assert!(matches!(
        r.read("", "[1,2]", &mut out),
        Err(crate::upstream::providers::translate::stream::Corrupt::Shape)
    ));
    let err = fixtures::json("gemini", "error_vertex_unavailable.json")[0].clone();
    r.read("", &err.to_string(), &mut out).unwrap();
    assert!(
        matches!(
            out.last(),
            Some(Event::Error(ErrorInfo {
                status: 503,
                kind: ErrorKind::Overloaded,
                ..
            }))
        ),
        "{out:?}"
    );
    let blocked = fixtures::json("gemini", "answer_blocked_prompt.json");
    let mut out = Vec::new();
    EventReader::new()
        .read("", &blocked.to_string(), &mut out)
        .unwrap();
    assert_eq!(out[1], Event::Finish(Finish::ContentFilter));
    assert!(
        !out.contains(&Event::Done),
        "Gemini's stream ends with its body, not with a chunk: {out:?}"
    );
}

#[test]
fn googles_errors_map_to_the_kinds_the_retry_tiers_use() {
    let rate = fixtures::json("gemini", "error_rate_limited.json");
    assert_eq!(read_error(429, &rate).kind, ErrorKind::RateLimited);
    assert_eq!(retry_delay(&rate), Some(std::time::Duration::from_secs(38)));
    assert!(
        !is_quota(&rate),
        "a per-minute limit that says 'billing details' is not out of money"
    );
    let quota = fixtures::json("gemini", "error_quota_per_day.json");
    assert_eq!(read_error(429, &quota).kind, ErrorKind::QuotaExhausted);
    let bad = read_error(
        400,
        &fixtures::json("gemini", "error_invalid_argument.json"),
    );
    assert_eq!(
        (bad.kind, bad.code.as_deref()),
        (ErrorKind::InvalidRequest, Some("INVALID_ARGUMENT"))
    );
    let vertex = read_error(
        503,
        &fixtures::json("gemini", "error_vertex_unavailable.json"),
    );
    assert_eq!(
        (vertex.kind, vertex.message.as_str()),
        (
            ErrorKind::Overloaded,
            "The model is overloaded. Please try again later."
        )
    );
    for (status, s, kind) in [
        (403, "PERMISSION_DENIED", ErrorKind::PermissionDenied),
        (401, "UNAUTHENTICATED", ErrorKind::Authentication),
        (404, "NOT_FOUND", ErrorKind::NotFound),
        (500, "INTERNAL", ErrorKind::Server),
    ] {
        let e = read_error(
            status,
            &json!({"error": {"code": status, "message": "m", "status": s}}),
        );
        assert_eq!(e.kind, kind, "{s}");
    }
    assert_eq!(read_error(502, &json!("<html>")).kind, ErrorKind::Server);
}

/// Google refuses an empty text part ("empty text parameter") and a turn without parts;
/// OpenAI clients send an assistant turn with empty content when it only called tools.
#[test]
fn empty_text_and_empty_turns_are_not_sent() {
    let r = Request {
        messages: vec![
            user(vec![text("hi"), text("")]),
            Message {
                role: Role::Assistant,
                content: vec![text("")],
                name: None,
                plain: false,
            },
            user(vec![text("again")]),
        ],
        ..Request::default()
    };
    let body = write_request(&r, "m", None, false).unwrap();
    assert_eq!(
        body["contents"],
        json!([{"role": "user", "parts": [{"text": "hi"}, {"text": "again"}]}])
    );
}
