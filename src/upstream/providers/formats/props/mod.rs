//! Property tests of the adapters (fixed seed, as `tests/api/translate_fuzz.rs`): a
//! request in the internal form that a format can express comes back the same when
//! written in that format and read again (`requests`; the Responses API, a client format
//! only, by a writer of its items in `responses_requests`); and a stream written in one
//! format, read and written again for a client of the other, gives that client the same
//! text, tool calls and usage — a Responses API client included
//! (`responses::adapter::EventWriter`), whose final response object must say the same as
//! its events (`streams`). Here: the seeded runner and the strategies they share.

mod requests;
mod responses_requests;
mod streams;

use proptest::prelude::*;
use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};
use serde_json::{json, Value};

use crate::upstream::providers::canonical::{
    CacheMark, Message, Part, Request, Role, Source, Tool, ToolChoice,
};

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

/// The same request read back; the client's field names are not content.
fn without_names(mut r: Request) -> Request {
    r.names.clear();
    r
}
