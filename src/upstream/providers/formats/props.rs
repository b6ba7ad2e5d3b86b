//! Property tests of the adapters (fixed seed, as `tests/api/translate_fuzz.rs`): a
//! request in the internal form that a format can express comes back the same when
//! written in that format and read again; and a stream written in one format, read and
//! written again for a client of the other, gives that client the same text, tool calls
//! and usage.

use proptest::prelude::*;
use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};
use serde_json::{json, Value};

use super::{anthropic, openai_chat};
use crate::upstream::providers::canonical::{
    CacheMark, Event, Finish, Message, Part, Reasoning, Request, ResponseFormat, Role, Source,
    Tool, ToolChoice, Usage,
};
use crate::upstream::providers::translate::stream::StreamConverter;
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
        Event::Usage(Usage {
            input: usage.input,
            ..Usage::default()
        }),
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
    out.push(Event::Usage(usage));
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
                // Not in the pairs above: no Gemini or Bedrock writer (upstream formats only).
                Format::Gemini | Format::Bedrock => {}
            }
            let mut conv = StreamConverter::new(upstream, client, true, 7);
            let mut out = Vec::new();
            for (name, data) in split(&frames) {
                conv.event(&name, &data, &mut out);
            }
            prop_assert!(conv.done(), "{upstream:?} → {client:?} did not complete");
            let got = match client {
                // No client speaks Gemini: its streams reach clients as OpenAI's.
                Format::OpenAiChat | Format::Gemini => seen_by_openai_client(&split(&out)),
                Format::Anthropic => seen_by_anthropic_client(&split(&out)),
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
