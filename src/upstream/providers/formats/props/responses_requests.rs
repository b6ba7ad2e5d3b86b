//! A request a Responses body expresses comes back the same when read (the Responses API is
//! a client format only: the test writes its items).

use proptest::prelude::*;
use serde_json::{json, Value};

use super::{choice, plain_text, runner, text, tool_call, tools, unit, user, without_names, SEED};
use crate::upstream::providers::canonical::{
    Message, Part, Reasoning, Request, ResponseFormat, Role, Source, ToolChoice,
};
use crate::upstream::providers::formats::responses::adapter as responses;

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
