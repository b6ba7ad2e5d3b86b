//! Property tests of the adapters (fixed seed, as `tests/api/translate_fuzz.rs`): a
//! request in the internal form that a format can express comes back the same when
//! written in that format and read again (the Responses API, a client format only, by a
//! writer of its items here); and a stream written in one format, read and
//! written again for a client of the other, gives that client the same text, tool calls
//! and usage — a Responses API client included (`responses::adapter::EventWriter`), whose
//! final response object must say the same as its events.

use proptest::prelude::*;
use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};
use serde_json::{json, Value};

use super::responses::{adapter as responses, Stamp};
use super::{anthropic, openai_chat};
use crate::upstream::providers::canonical::{
    CacheMark, Event, Finish, Message, Part, Reasoning, Reported, Request, ResponseFormat, Role,
    Source, Tool, ToolChoice, Usage,
};
use crate::upstream::providers::translate::stream::{ResponsesOut, StreamConverter};
use crate::upstream::providers::Format;

const SEED: [u8; 32] = *b"sluice-canonical-props-seed-0001";

fn runner() -> TestRunner {
    let config = Config {
        cases: 256,
        failure_persistence: None,
        ..Config::default()
    };
    TestRunner::new_with_rng(config, TestRng::from_seed(RngAlgorithm::ChaCha, &SEED))
}

fn text() -> impl Strategy<Value = String> {
    "[a-zA-Z0-9 .,?!éß中🦀]{1,12}"
}

fn unit() -> impl Strategy<Value = f64> {
    (0u32..=100).prop_map(|x| f64::from(x) / 100.0)
}

fn args() -> impl Strategy<Value = String> {
    prop::collection::btree_map("[a-z]{1,5}", any::<i32>(), 0..3).prop_map(|m| {
        Value::Object(m.into_iter().map(|(k, v)| (k, json!(v))).collect()).to_string()
    })
}

fn cache() -> impl Strategy<Value = Option<CacheMark>> {
    prop_oneof![
        Just(None),
        Just(Some(CacheMark { ttl: None })),
        Just(Some(CacheMark {
            ttl: Some("1h".into())
        }))
    ]
}

fn plain_text(t: String, cache: Option<CacheMark>) -> Part {
    Part::Text { text: t, cache }
}

/// A user part both formats carry; `cached`: with cache marks (Anthropic only).
fn user_part(cached: bool) -> impl Strategy<Value = Part> {
    let c = move || {
        if cached {
            cache().boxed()
        } else {
            Just(None).boxed()
        }
    };
    prop_oneof![
        (text(), c()).prop_map(|(t, cache)| plain_text(t, cache)),
        c().prop_map(|cache| Part::Image {
            source: Source::Base64 {
                media_type: "image/png".into(),
                data: "iVBORw0KGgo=".into()
            },
            detail: None,
            cache
        }),
        c().prop_map(|cache| Part::Image {
            source: Source::Url("https://example.com/a.jpg".into()),
            detail: None,
            cache
        }),
        (text(), c()).prop_map(|(n, cache)| Part::File {
            source: Source::Base64 {
                media_type: "application/pdf".into(),
                data: "JVBERi0xLjQK".into()
            },
            filename: Some(n),
            cache
        }),
    ]
}

fn tool_call() -> impl Strategy<Value = Part> {
    ("[a-z0-9_]{1,8}", "[a-z_]{1,8}", args()).prop_map(|(id, name, arguments)| Part::ToolCall {
        id: format!("call_{id}"),
        name,
        arguments,
    })
}

fn tool_result(cached: bool) -> impl Strategy<Value = Message> {
    let c = move || {
        if cached {
            cache().boxed()
        } else {
            Just(None).boxed()
        }
    };
    (
        "[a-z0-9_]{1,8}",
        any::<bool>(),
        prop_oneof![
            text().prop_map(|t| (vec![plain_text(t, None)], true)),
            prop::collection::vec((text(), c()).prop_map(|(t, c)| plain_text(t, c)), 1..3)
                .prop_map(|p| (p, false)),
        ],
        c(),
    )
        .prop_map(|(id, is_error, (content, plain), cache)| Message {
            role: Role::Tool,
            content: vec![Part::ToolResult {
                call_id: format!("call_{id}"),
                content,
                is_error,
                cache,
                plain,
            }],
            name: None,
            plain,
        })
}

fn user(cached: bool, may_be_plain: bool) -> impl Strategy<Value = Message> {
    prop_oneof![
        text().prop_map(move |t| (vec![plain_text(t, None)], may_be_plain)),
        prop::collection::vec(user_part(cached), 1..3).prop_map(|p| (p, false)),
    ]
    .prop_map(|(content, plain)| Message {
        role: Role::User,
        content,
        name: None,
        plain,
    })
}

fn tools(cached: bool) -> impl Strategy<Value = Vec<Tool>> {
    let c = move || {
        if cached {
            cache().boxed()
        } else {
            Just(None).boxed()
        }
    };
    prop::collection::vec(
        ("[a-z_]{1,8}", prop::option::of(text()), c()).prop_map(|(name, description, cache)| {
            Tool {
                name,
                description,
                parameters: json!({"type": "object", "properties": {"x": {"type": "string"}}}),
                strict: None,
                cache,
            }
        }),
        0..3,
    )
}

fn choice() -> impl Strategy<Value = Option<ToolChoice>> {
    prop_oneof![
        Just(None),
        Just(Some(ToolChoice::Auto)),
        Just(Some(ToolChoice::None)),
        Just(Some(ToolChoice::Required)),
        "[a-z_]{1,8}".prop_map(|n| Some(ToolChoice::Named(n))),
    ]
}

/// A request an OpenAI chat body expresses in one way only.
fn openai_request() -> impl Strategy<Value = Request> {
    let exchange = (
        user(false, true),
        prop::option::of(text()),
        prop::option::of(text()),
        prop::collection::vec(tool_call(), 0..3),
        prop::collection::vec(tool_result(false), 0..3),
    )
        .prop_map(|(u, said, refusal, calls, results)| {
            let mut content: Vec<Part> = said.into_iter().map(|t| plain_text(t, None)).collect();
            let plain = content.len() == 1 && refusal.is_none() && calls.is_empty();
            content.extend(refusal.map(|text| Part::Refusal { text }));
            content.extend(calls);
            let mut out = vec![
                u,
                Message {
                    role: Role::Assistant,
                    content,
                    name: None,
                    plain,
                },
            ];
            out.extend(results);
            out
        });
    (
        prop::collection::vec(text(), 0..3),
        prop::collection::vec(exchange, 0..3),
        user(false, true),
        (
            prop::option::of(unit()),
            prop::option::of(unit()),
            prop::option::of(any::<i32>()),
        ),
        (tools(false), choice(), any::<bool>()),
        (
            prop::option::of(prop_oneof![Just(0.5), Just(-1.0)]),
            prop::collection::vec(text(), 0..3),
            prop::option::of(text()),
            prop::option::of(prop_oneof![
                Just("low".to_string()),
                Just("high".to_string())
            ]),
            any::<bool>(),
            prop::option::of(prop_oneof![
                Just(ResponseFormat::JsonObject),
                text().prop_map(|name| ResponseFormat::JsonSchema {
                    name,
                    schema: json!({"type": "object"}),
                    strict: Some(true),
                    description: None
                })
            ]),
        ),
    )
        .prop_map(
            |(
                system,
                exchanges,
                last,
                (temperature, top_p, seed),
                (tools, tool_choice, serial),
                (penalty, stop, user, effort, stream, response_format),
            )| Request {
                model: "m".into(),
                system: system.into_iter().map(|t| plain_text(t, None)).collect(),
                messages: exchanges.into_iter().flatten().chain([last]).collect(),
                parallel_tool_calls: (!tools.is_empty() && serial).then_some(false),
                tools,
                tool_choice,
                max_output_tokens: Some(64),
                temperature,
                top_p,
                seed: seed.map(i64::from),
                frequency_penalty: penalty,
                presence_penalty: penalty,
                stop,
                response_format,
                reasoning: effort.map(|e| Reasoning {
                    effort: Some(e),
                    budget_tokens: None,
                    summary: None,
                }),
                stream,
                include_usage: stream,
                user,
                service_tier: Some("flex".into()),
                ..Request::default()
            },
        )
}

/// A request an Anthropic body expresses in one way only: turns alternate, tool results
/// lead the user turn they are in, and every user turn is written as blocks (as the
/// golden files pin it), so a plain one reads back as blocks.
fn anthropic_request() -> impl Strategy<Value = Request> {
    let assistant = prop::collection::vec(
        prop_oneof![
            (text(), cache()).prop_map(|(t, c)| plain_text(t, c)),
            tool_call(),
            (text(), "[a-zA-Z0-9]{4,12}").prop_map(|(text, s)| Part::Reasoning {
                text,
                signature: Some(s),
                redacted: None
            }),
            "[a-zA-Z0-9]{4,12}".prop_map(|d| Part::Reasoning {
                text: String::new(),
                signature: None,
                redacted: Some(d)
            }),
        ],
        1..4,
    )
    .prop_map(|content| Message {
        role: Role::Assistant,
        content,
        name: None,
        plain: false,
    });
    let exchange = (
        any::<bool>(),
        user(true, false),
        user(true, false),
        assistant,
        prop::collection::vec(tool_result(true), 0..3),
    );
    (
        prop::collection::vec((text(), cache()).prop_map(|(t, c)| plain_text(t, c)), 0..3),
        prop::collection::vec(exchange, 0..3),
        user(true, false),
        user(true, false),
        (
            prop::option::of(unit()),
            prop::option::of(unit()),
            prop::option::of(1i64..100),
        ),
        (tools(true), choice(), any::<bool>()),
        (
            prop::collection::vec(text(), 0..3),
            prop::option::of(text()),
            prop::option::of(prop_oneof![
                Just("auto".to_string()),
                Just("default".to_string())
            ]),
            prop::option::of(1024i64..4096),
            any::<bool>(),
        ),
    )
        .prop_map(
            |(
                system,
                exchanges,
                last_plain,
                last_merged,
                (temperature, top_p, top_k),
                (tools, tool_choice, serial),
                (stop, user, tier, budget, stream),
            )| {
                let mut messages = Vec::new();
                // Whether the last turn was a user turn (tool results included): a user
                // turn after it is merged into it, so written as blocks.
                let mut after_user = false;
                for (_, plain_user, merged_user, assistant, results) in exchanges {
                    messages.push(if after_user { merged_user } else { plain_user });
                    messages.push(assistant);
                    after_user = !results.is_empty();
                    messages.extend(results);
                }
                messages.push(if after_user { last_merged } else { last_plain });
                let parallel = !tools.is_empty()
                    && serial
                    && matches!(
                        tool_choice,
                        Some(ToolChoice::Auto | ToolChoice::Required | ToolChoice::Named(_))
                    );
                Request {
                    model: "m".into(),
                    system,
                    messages,
                    parallel_tool_calls: parallel.then_some(false),
                    tools,
                    tool_choice,
                    max_output_tokens: Some(64),
                    temperature,
                    top_p,
                    top_k,
                    stop,
                    reasoning: budget.map(|b| Reasoning {
                        effort: None,
                        budget_tokens: Some(b),
                        summary: None,
                    }),
                    stream,
                    include_usage: true,
                    user,
                    service_tier: tier,
                    ..Request::default()
                }
            },
        )
}

/// The same request read back; the client's field names are not content.
fn without_names(mut r: Request) -> Request {
    r.names.clear();
    r
}

#[test]
fn a_request_written_as_openai_chat_reads_back_the_same() {
    let result = runner().run(&openai_request(), |r| {
        let body = openai_chat::write_request(&r, "m", Some(("max_tokens", 64)), r.stream)
            .map_err(|e| TestCaseError::fail(format!("refused: {e}")))?;
        let back = openai_chat::read_request(&body)
            .map_err(|e| TestCaseError::fail(format!("refused back: {e} — {body:?}")))?;
        prop_assert_eq!(without_names(back), r);
        Ok(())
    });
    if let Err(e) = result {
        panic!("OpenAI chat lost something (seed {SEED:?}): {e}");
    }
}

#[test]
fn a_request_written_as_anthropic_reads_back_the_same() {
    let result = runner().run(&anthropic_request(), |r| {
        let body = anthropic::write_request(&r, "m", Some(("max_tokens", 64)), r.stream)
            .map_err(|e| TestCaseError::fail(format!("refused: {e}")))?;
        let back = anthropic::read_request(&body)
            .map_err(|e| TestCaseError::fail(format!("refused back: {e} — {body:?}")))?;
        prop_assert_eq!(without_names(back), r);
        Ok(())
    });
    if let Err(e) = result {
        panic!("Anthropic lost something (seed {SEED:?}): {e}");
    }
}

/// An assistant turn a Responses body writes as items: text (one `message` item) or
/// reasoning (a `reasoning` item), then function calls.
fn responses_assistant() -> impl Strategy<Value = Message> {
    (
        prop_oneof![
            prop::collection::vec(text(), 1..3).prop_map(|t| t
                .into_iter()
                .map(|t| plain_text(t, None))
                .collect::<Vec<_>>()),
            (text(), "[A-Za-z0-9+/]{4,16}").prop_map(|(text, sig)| vec![Part::Reasoning {
                text,
                signature: Some(sig),
                redacted: None
            }]),
            Just(vec![]),
        ],
        prop::collection::vec(tool_call(), 0..3),
    )
        .prop_filter("an assistant turn says something", |(p, c)| {
            !p.is_empty() || !c.is_empty()
        })
        .prop_map(|(mut content, calls)| {
            content.extend(calls);
            Message {
                role: Role::Assistant,
                content,
                name: None,
                plain: false,
            }
        })
}

/// Tool results as one Responses client writes them: plain `function_call_output`s.
fn responses_results() -> impl Strategy<Value = Message> {
    prop::collection::vec(("[a-z0-9_]{1,8}", text()), 1..3).prop_map(|rs| Message {
        role: Role::Tool,
        content: rs
            .into_iter()
            .map(|(id, t)| Part::ToolResult {
                call_id: format!("call_{id}"),
                content: vec![plain_text(t, None)],
                is_error: false,
                cache: None,
                plain: true,
            })
            .collect(),
        name: None,
        plain: false,
    })
}

/// A request a Responses body expresses in one way only.
fn responses_request() -> impl Strategy<Value = Request> {
    let exchange = (
        user(false, true),
        responses_assistant(),
        prop::option::of(responses_results()),
    )
        .prop_map(|(u, a, t)| {
            let mut out = vec![u, a];
            out.extend(t);
            out
        });
    (
        prop::collection::vec(text(), 0..3),
        prop::collection::vec(exchange, 0..3),
        user(false, true),
        (prop::option::of(unit()), prop::option::of(unit())),
        (tools(false), choice(), prop::option::of(any::<bool>())),
        (
            prop::option::of(text()),
            prop::option::of(prop_oneof![
                Just("low".to_string()),
                Just("high".to_string())
            ]),
            prop::option::of(Just("auto".to_string())),
            any::<bool>(),
            prop::option::of(prop_oneof![
                Just(ResponseFormat::JsonObject),
                text().prop_map(|name| ResponseFormat::JsonSchema {
                    name,
                    schema: json!({"type": "object"}),
                    strict: Some(true),
                    description: None
                })
            ]),
            prop::option::of(text()),
        ),
    )
        .prop_map(
            |(
                system,
                exchanges,
                last,
                (temperature, top_p),
                (tools, tool_choice, parallel_tool_calls),
                (user, effort, summary, stream, response_format, ticket),
            )| Request {
                model: "m".into(),
                system: system.into_iter().map(|t| plain_text(t, None)).collect(),
                messages: exchanges.into_iter().flatten().chain([last]).collect(),
                tools,
                tool_choice,
                parallel_tool_calls,
                max_output_tokens: Some(64),
                temperature,
                top_p,
                response_format,
                reasoning: (effort.is_some() || summary.is_some()).then_some(Reasoning {
                    effort,
                    budget_tokens: None,
                    summary,
                }),
                stream,
                include_usage: true,
                user,
                metadata: ticket
                    .map(|t| [("ticket".to_string(), json!(t))].into_iter().collect())
                    .unwrap_or_default(),
                service_tier: Some("flex".into()),
                ..Request::default()
            },
        )
}

/// A content part as a Responses client writes it.
fn responses_part(p: &Part, assistant: bool) -> Value {
    let url = |s: &Source| match s {
        Source::Url(u) => u.clone(),
        Source::Base64 { media_type, data } => format!("data:{media_type};base64,{data}"),
        Source::FileId(id) => id.clone(),
    };
    match p {
        Part::Text { text, .. } if assistant => json!({"type": "output_text", "text": text}),
        Part::Text { text, .. } => json!({"type": "input_text", "text": text}),
        Part::Image { source, detail, .. } => {
            let mut v = json!({"type": "input_image", "image_url": url(source)});
            if let Some(d) = detail {
                v["detail"] = json!(d);
            }
            v
        }
        Part::File {
            source, filename, ..
        } => {
            let mut v = json!({"type": "input_file", "file_data": url(source)});
            if let Some(n) = filename {
                v["filename"] = json!(n);
            }
            v
        }
        other => panic!("not a content part of this test: {other:?}"),
    }
}

/// The request as a Responses body (the test's writer: the format is a client format).
fn responses_body(r: &Request) -> serde_json::Map<String, Value> {
    let mut input = Vec::new();
    let text_of = |p: &Part| match p {
        Part::Text { text, .. } => text.clone(),
        _ => String::new(),
    };
    for extra in r.system.iter().skip(1) {
        input.push(json!({"role": "developer", "content": text_of(extra)}));
    }
    for m in &r.messages {
        match m.role {
            Role::System => {
                input.push(json!({"role": "developer", "content": text_of(&m.content[0])}));
            }
            Role::User => {
                let content = if m.plain {
                    json!(text_of(&m.content[0]))
                } else {
                    Value::Array(m.content.iter().map(|p| responses_part(p, false)).collect())
                };
                input.push(json!({"role": "user", "content": content}));
            }
            Role::Assistant => {
                let texts: Vec<Value> = m
                    .content
                    .iter()
                    .filter(|p| matches!(p, Part::Text { .. }))
                    .map(|p| responses_part(p, true))
                    .collect();
                if !texts.is_empty() {
                    input.push(json!({"type": "message", "role": "assistant", "content": texts}));
                }
                for p in &m.content {
                    match p {
                        Part::Reasoning {
                            text, signature, ..
                        } => input.push(json!({"type": "reasoning", "id": "rs_1", "summary": [],
                            "content": [{"type": "reasoning_text", "text": text}],
                            "encrypted_content": signature})),
                        Part::ToolCall {
                            id,
                            name,
                            arguments,
                        } => input.push(json!({"type": "function_call", "call_id": id,
                            "name": name, "arguments": arguments})),
                        _ => {}
                    }
                }
            }
            Role::Tool => {
                for p in &m.content {
                    if let Part::ToolResult {
                        call_id, content, ..
                    } = p
                    {
                        input.push(json!({"type": "function_call_output", "call_id": call_id,
                            "output": text_of(&content[0])}));
                    }
                }
            }
        }
    }
    let mut b = json!({"model": r.model, "input": input, "max_output_tokens": r.max_output_tokens,
        "stream": r.stream, "service_tier": r.service_tier});
    if let Some(first) = r.system.first() {
        b["instructions"] = json!(text_of(first));
    }
    if !r.tools.is_empty() {
        b["tools"] = Value::Array(
            r.tools
                .iter()
                .map(|t| {
                    let mut v =
                        json!({"type": "function", "name": t.name, "parameters": t.parameters});
                    if let Some(d) = &t.description {
                        v["description"] = json!(d);
                    }
                    v
                })
                .collect(),
        );
    }
    if let Some(c) = &r.tool_choice {
        b["tool_choice"] = match c {
            ToolChoice::Auto => json!("auto"),
            ToolChoice::None => json!("none"),
            ToolChoice::Required => json!("required"),
            ToolChoice::Named(n) => json!({"type": "function", "name": n}),
        };
    }
    let put = |b: &mut Value, k: &str, v: Option<Value>| {
        if let Some(v) = v {
            b[k] = v;
        }
    };
    put(
        &mut b,
        "parallel_tool_calls",
        r.parallel_tool_calls.map(Value::from),
    );
    put(&mut b, "temperature", r.temperature.map(Value::from));
    put(&mut b, "top_p", r.top_p.map(Value::from));
    put(&mut b, "user", r.user.as_ref().map(|u| json!(u)));
    if !r.metadata.is_empty() {
        b["metadata"] = Value::Object(r.metadata.clone());
    }
    if let Some(x) = &r.reasoning {
        b["reasoning"] = json!({"effort": x.effort, "summary": x.summary});
    }
    match &r.response_format {
        Some(ResponseFormat::JsonObject) => b["text"] = json!({"format": {"type": "json_object"}}),
        Some(ResponseFormat::JsonSchema {
            name,
            schema,
            strict,
            ..
        }) => {
            b["text"] = json!({"format": {"type": "json_schema", "name": name, "schema": schema,
                "strict": strict}})
        }
        _ => {}
    }
    match b {
        Value::Object(m) => m,
        _ => unreachable!("built as an object"),
    }
}

#[test]
fn a_request_written_as_a_responses_body_reads_back_the_same() {
    let result = runner().run(&responses_request(), |r| {
        let body = responses_body(&r);
        let back = responses::read_request(&body)
            .map_err(|e| TestCaseError::fail(format!("refused: {e} — {body:?}")))?;
        // `metadata` stays with the response object the gateway serves and stores: it is
        // accepted and not carried to the upstream.
        let mut want = r;
        want.metadata.clear();
        prop_assert_eq!(without_names(back), want);
        Ok(())
    });
    if let Err(e) = result {
        panic!("the Responses reader lost something (seed {SEED:?}): {e}");
    }
}

/// What a client makes of a stream: its text, its tool calls (id, name, arguments) and
/// its usage (input, output).
#[derive(Debug, Default, PartialEq)]
struct Seen {
    text: String,
    calls: Vec<(String, String, String)>,
    usage: (i64, i64),
}

/// A tool call of a generated stream: id, name, argument pieces.
type CallPieces = (String, String, Vec<String>);

/// A stream in the internal form: text pieces, tool calls with argument pieces, usage.
fn stream() -> impl Strategy<Value = (Vec<String>, Vec<CallPieces>, Usage)> {
    (
        prop::collection::vec(text(), 0..4),
        prop::collection::vec(
            (
                "[a-z0-9]{1,8}",
                "[a-z_]{1,8}",
                prop::collection::vec("[a-z0-9{}\":,]{1,6}", 0..4),
            ),
            0..3,
        ),
        (1i64..5000, 1i64..5000),
    )
        .prop_map(|(text, calls, (input, output))| {
            let calls = calls
                .into_iter()
                .map(|(id, name, args)| (format!("call_{id}"), name, args))
                .collect();
            let usage = Usage {
                input,
                output,
                ..Usage::default()
            };
            (text, calls, usage)
        })
}

fn events(text: &[String], calls: &[CallPieces], usage: Usage) -> Vec<Event> {
    let mut out = vec![
        Event::Usage(Reported::whole(Usage {
            input: usage.input,
            ..Usage::default()
        })),
        Event::Start {
            id: "id".into(),
            model: "m".into(),
            created: Some(1),
        },
    ];
    if !text.is_empty() {
        out.push(Event::TextStart { index: 0 });
        out.extend(text.iter().map(|t| Event::TextDelta {
            index: 0,
            text: t.clone(),
        }));
        out.push(Event::BlockStop { index: 0 });
    }
    for (i, (id, name, args)) in calls.iter().enumerate() {
        let index = i + 1;
        out.push(Event::ToolCallStart {
            index,
            id: id.clone(),
            name: name.clone(),
        });
        out.extend(args.iter().map(|a| Event::ToolArgsDelta {
            index,
            json: a.clone(),
        }));
        out.push(Event::BlockStop { index });
    }
    out.push(Event::Finish(if calls.is_empty() {
        Finish::Stop
    } else {
        Finish::ToolCalls
    }));
    out.push(Event::Usage(Reported::whole(usage)));
    out.push(Event::Done);
    out
}

/// SSE frames as (event name, data).
fn split(frames: &[bytes::Bytes]) -> Vec<(String, String)> {
    frames
        .iter()
        .map(|f| {
            let s = String::from_utf8_lossy(f);
            let mut name = String::new();
            let mut data = String::new();
            for line in s.lines() {
                if let Some(n) = line.strip_prefix("event: ") {
                    name = n.to_string();
                } else if let Some(d) = line.strip_prefix("data: ") {
                    data = d.to_string();
                }
            }
            (name, data)
        })
        .collect()
}

fn seen_by_anthropic_client(frames: &[(String, String)]) -> Seen {
    let mut seen = Seen::default();
    for (_, data) in frames {
        let v: Value = serde_json::from_str(data).unwrap_or(Value::Null);
        match v["type"].as_str() {
            Some("content_block_start") if v["content_block"]["type"] == "tool_use" => {
                let b = &v["content_block"];
                seen.calls.push((
                    b["id"].as_str().unwrap_or("").into(),
                    b["name"].as_str().unwrap_or("").into(),
                    String::new(),
                ));
            }
            Some("content_block_delta") => {
                if let Some(t) = v["delta"]["text"].as_str() {
                    seen.text.push_str(t);
                }
                if let (Some(p), Some(c)) =
                    (v["delta"]["partial_json"].as_str(), seen.calls.last_mut())
                {
                    c.2.push_str(p);
                }
            }
            Some("message_delta") => {
                let u = &v["usage"];
                let n = |k: &str| u[k].as_i64().unwrap_or(0);
                seen.usage = (
                    n("input_tokens")
                        + n("cache_read_input_tokens")
                        + n("cache_creation_input_tokens"),
                    n("output_tokens"),
                );
            }
            _ => {}
        }
    }
    seen
}

fn seen_by_openai_client(frames: &[(String, String)]) -> Seen {
    let mut seen = Seen::default();
    for (_, data) in frames {
        let v: Value = serde_json::from_str(data).unwrap_or(Value::Null);
        if let Some(u) = v.get("usage").filter(|u| u.is_object()) {
            seen.usage = (
                u["prompt_tokens"].as_i64().unwrap_or(0),
                u["completion_tokens"].as_i64().unwrap_or(0),
            );
        }
        let d = &v["choices"][0]["delta"];
        if let Some(t) = d["content"].as_str() {
            seen.text.push_str(t);
        }
        for tc in d["tool_calls"].as_array().into_iter().flatten() {
            let i = tc["index"].as_u64().unwrap_or(0) as usize;
            if seen.calls.len() <= i {
                seen.calls.resize(i + 1, Default::default());
            }
            let c = &mut seen.calls[i];
            if let Some(id) = tc["id"].as_str() {
                c.0 = id.into();
            }
            if let Some(n) = tc["function"]["name"].as_str() {
                c.1 = n.into();
            }
            if let Some(a) = tc["function"]["arguments"].as_str() {
                c.2.push_str(a);
            }
        }
    }
    seen
}

/// What a Responses client makes of a stream: its events' text, calls and usage, and the
/// same read from the final response object (which must agree).
fn seen_by_responses_client(frames: &[(String, String)]) -> (Seen, Seen) {
    let mut seen = Seen::default();
    let mut final_seen = Seen::default();
    // Output index → position in `seen.calls`.
    let mut at = std::collections::BTreeMap::new();
    for (seq, (name, data)) in frames.iter().enumerate() {
        let v: Value = serde_json::from_str(data).unwrap_or(Value::Null);
        assert_eq!(v["type"], name.as_str(), "{data}");
        assert_eq!(v["sequence_number"], seq, "{data}");
        match name.as_str() {
            "response.output_text.delta" => {
                seen.text.push_str(v["delta"].as_str().unwrap_or(""));
            }
            "response.output_item.added" if v["item"]["type"] == "function_call" => {
                at.insert(v["output_index"].as_u64(), seen.calls.len());
                let s = |k: &str| v["item"][k].as_str().unwrap_or("").to_string();
                seen.calls.push((s("call_id"), s("name"), String::new()));
            }
            "response.function_call_arguments.delta" => {
                if let Some(&i) = at.get(&v["output_index"].as_u64()) {
                    seen.calls[i].2.push_str(v["delta"].as_str().unwrap_or(""));
                }
            }
            "response.completed" | "response.incomplete" => {
                let r = &v["response"];
                let n = |k: &str| r["usage"][k].as_i64().unwrap_or(0);
                seen.usage = (n("input_tokens"), n("output_tokens"));
                final_seen.usage = seen.usage;
                for item in r["output"].as_array().into_iter().flatten() {
                    let s = |k: &str| item[k].as_str().unwrap_or("").to_string();
                    match item["type"].as_str() {
                        Some("message") => {
                            for p in item["content"].as_array().into_iter().flatten() {
                                final_seen.text.push_str(p["text"].as_str().unwrap_or(""));
                            }
                        }
                        Some("function_call") => {
                            final_seen
                                .calls
                                .push((s("call_id"), s("name"), s("arguments")))
                        }
                        _ => {}
                    }
                }
            }
            _ => {}
        }
    }
    (seen, final_seen)
}

#[test]
fn a_stream_read_and_written_again_gives_the_client_the_same_answer() {
    let result = runner().run(&stream(), |(text, calls, usage)| {
        let want = Seen {
            text: text.concat(),
            calls: calls
                .iter()
                .map(|(id, name, args)| (id.clone(), name.clone(), args.concat()))
                .collect(),
            usage: (usage.input, usage.output),
        };
        let evs = events(&text, &calls, usage);
        for (upstream, client) in [
            (Format::OpenAiChat, Format::Anthropic),
            (Format::Anthropic, Format::OpenAiChat),
            (Format::OpenAiChat, Format::Responses),
            (Format::Anthropic, Format::Responses),
        ] {
            // The upstream's stream, written by its own format's writer.
            let mut frames = Vec::new();
            match upstream {
                Format::OpenAiChat => {
                    let mut w = openai_chat::EventWriter::new(true);
                    evs.iter().for_each(|e| w.write(e, &mut frames));
                }
                Format::Anthropic => {
                    let mut w = anthropic::EventWriter::default();
                    evs.iter().for_each(|e| w.write(e, &mut frames));
                }
                Format::Responses | Format::Gemini | Format::Bedrock => {
                    unreachable!("not an upstream of this test")
                }
            }
            let mut conv = StreamConverter::new(upstream, client, true, 7);
            if client == Format::Responses {
                let stamp = Stamp {
                    id: "resp_p".into(),
                    store: false,
                    previous_response_id: None,
                };
                let w = responses::EventWriter::new(serde_json::Map::new(), stamp);
                conv = conv.responses(ResponsesOut::Translated(Box::new(w)));
            }
            let mut out = Vec::new();
            for (name, data) in split(&frames) {
                conv.event(&name, &data, &mut out);
            }
            prop_assert!(conv.done(), "{upstream:?} → {client:?} did not complete");
            let got = match client {
                // No client speaks Gemini: its streams reach clients as OpenAI's.
                Format::OpenAiChat | Format::Gemini => seen_by_openai_client(&split(&out)),
                Format::Anthropic => seen_by_anthropic_client(&split(&out)),
                Format::Responses => {
                    let (events, response) = seen_by_responses_client(&split(&out));
                    prop_assert_eq!(&response, &events, "the response object and its events");
                    events
                }
                Format::Bedrock => unreachable!("never a client's format"),
            };
            prop_assert_eq!(&got, &want, "{:?} → {:?}", upstream, client);
            let u = conv.usage();
            prop_assert_eq!((u.input, u.output), want.usage);
        }
        Ok(())
    });
    if let Err(e) = result {
        panic!("a stream lost something (seed {SEED:?}): {e}");
    }
}
