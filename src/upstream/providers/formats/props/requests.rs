//! A request an OpenAI chat or an Anthropic body expresses comes back the same when written
//! in that format and read again.

use proptest::prelude::*;
use serde_json::json;

use super::{
    cache, choice, plain_text, runner, text, tool_call, tool_result, tools, unit, user,
    without_names, SEED,
};
use crate::upstream::providers::canonical::{
    Message, Part, Reasoning, Request, ResponseFormat, Role, ToolChoice,
};
use crate::upstream::providers::formats::{anthropic, openai_chat};

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
