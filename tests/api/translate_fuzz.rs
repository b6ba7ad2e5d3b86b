//! Fuzz-style property tests of the translation, with a fixed seed (a failure replays as
//! it is; `SLUICE_TRANSLATE_CASES` sets the number of cases, 256 by default): arbitrary
//! JSON — deep nesting, wrong types, huge numbers, odd unicode, keys the translators look
//! for — mutated fixtures and extreme usage figures into every translation function:
//! requests both ways, answers, error bodies and usage both ways, stream events in all
//! four format pairs. Never a panic; a request becomes a JSON body or a refusal, a stream
//! event well-formed SSE. Round trips are in `translate_roundtrip.rs`.

use bytes::Bytes;
use proptest::prelude::*;
use proptest::test_runner::{Config, RngAlgorithm, TestCaseError, TestRng, TestRunner};
use serde_json::{json, Map, Value};
use sluice::config::Provider;
use sluice::error::WireFormat;
use sluice::upstream::providers::{self, translate::stream::StreamConverter};

pub const SEED: [u8; 32] = *b"sluice-translate-props-seed-0001";

pub fn runner() -> TestRunner {
    let cases = std::env::var("SLUICE_TRANSLATE_CASES")
        .ok()
        .and_then(|c| c.parse().ok())
        .unwrap_or(256);
    let config = Config {
        cases,
        failure_persistence: None,
        max_shrink_iters: 500,
        ..Config::default()
    };
    TestRunner::new_with_rng(config, TestRng::from_seed(RngAlgorithm::ChaCha, &SEED))
}

// ---------- arbitrary JSON ----------

/// Keys the translators look for, so arbitrary objects reach their inner paths.
const KEYS: &[&str] = &[
    "messages",
    "role",
    "content",
    "type",
    "text",
    "tool_calls",
    "function",
    "arguments",
    "name",
    "id",
    "index",
    "tools",
    "tool_choice",
    "stop",
    "stop_sequences",
    "usage",
    "choices",
    "delta",
    "message",
    "finish_reason",
    "stop_reason",
    "stop_sequence",
    "error",
    "source",
    "media_type",
    "data",
    "url",
    "image_url",
    "file",
    "file_data",
    "filename",
    "tool_use_id",
    "tool_call_id",
    "is_error",
    "input",
    "partial_json",
    "content_block",
    "system",
    "metadata",
    "user_id",
    "user",
    "temperature",
    "top_p",
    "n",
    "seed",
    "parallel_tool_calls",
    "disable_parallel_tool_use",
    "service_tier",
    "stream_options",
    "include_usage",
    "prompt_tokens",
    "completion_tokens",
    "input_tokens",
    "output_tokens",
    "cache_read_input_tokens",
    "prompt_tokens_details",
    "cached_tokens",
    "refusal",
    "title",
    "thinking",
    "code",
    "param",
    "max_tokens",
];

const WORDS: &[&str] = &[
    "user",
    "assistant",
    "system",
    "developer",
    "tool",
    "text",
    "image",
    "image_url",
    "file",
    "document",
    "tool_use",
    "tool_result",
    "function",
    "base64",
    "url",
    "application/pdf",
    "data:application/pdf;base64,JVBE",
    "data:image/png;base64,iVBO",
    "data:nope",
    "auto",
    "required",
    "any",
    "none",
    "stop",
    "length",
    "tool_calls",
    "content_filter",
    "refusal",
    "pause_turn",
    "stop_sequence",
    "end_turn",
    "message_start",
    "content_block_start",
    "content_block_delta",
    "message_delta",
    "message_stop",
    "error",
    "text_delta",
    "input_json_delta",
    "[DONE]",
    "[tool_result is_error=true]\n",
    "{\"a\":",
    "{}",
    "",
    "\u{0}",
    "\u{202e}rtl",
    "ü̈ñ",
    "🦀🦀",
    "\u{feff}",
    "\u{10ffff}",
];

fn leaf() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        prop_oneof![
            Just(i64::MAX),
            Just(i64::MIN),
            Just(-1i64),
            Just(0),
            Just(1)
        ]
        .prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        any::<f64>()
            .prop_filter("JSON has no NaN or infinity", |f| f.is_finite())
            .prop_map(Value::from),
        prop::sample::select(WORDS).prop_map(Value::from),
        "\\PC{0,12}".prop_map(Value::from),
    ]
}

fn key() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => prop::sample::select(KEYS).prop_map(str::to_string),
        1 => "\\PC{0,6}",
    ]
}

fn json_value() -> impl Strategy<Value = Value> {
    leaf().prop_recursive(6, 64, 8, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::btree_map(key(), inner, 0..8)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// A value buried `depth` levels deep in arrays and objects (within serde_json's parse
/// limit of 128, as every body and event the gateway reads is parsed first).
fn deep() -> impl Strategy<Value = Value> {
    (json_value(), 1usize..100, any::<bool>()).prop_map(|(mut v, depth, arrays)| {
        for i in 0..depth {
            v = if arrays || i % 2 == 0 {
                Value::Array(vec![v])
            } else {
                json!({"content": v})
            };
        }
        v
    })
}

fn object() -> impl Strategy<Value = Map<String, Value>> {
    (
        prop::collection::btree_map(key(), prop_oneof![3 => json_value(), 1 => deep()], 0..12),
        json_value(),
    )
        .prop_map(|(m, messages)| {
            let mut m: Map<String, Value> = m.into_iter().collect();
            if !m.contains_key("messages") {
                m.insert("messages".into(), messages);
            }
            m
        })
}

const FORMATS: [WireFormat; 2] = [WireFormat::OpenAi, WireFormat::Anthropic];
const PROVIDERS: [Provider; 2] = [Provider::Openai, Provider::Anthropic];

/// Each frame is `event: …` (Anthropic) then `data: <JSON or [DONE]>`, ending a blank line.
fn well_formed(frame: &Bytes) -> Result<(), TestCaseError> {
    let text = std::str::from_utf8(frame).map_err(|_| TestCaseError::fail("frame not UTF-8"))?;
    prop_assert!(text.ends_with("\n\n"), "frame not terminated: {text:?}");
    let data = text
        .lines()
        .find_map(|l| l.strip_prefix("data: "))
        .ok_or_else(|| TestCaseError::fail(format!("no data line: {text:?}")))?;
    prop_assert!(
        data == "[DONE]" || serde_json::from_str::<Value>(data).is_ok(),
        "data is not JSON: {data:?}"
    );
    Ok(())
}

/// Replaces the `pick`-th node (pre-order) of `v` by `with`.
fn replace_node(v: &mut Value, pick: &mut usize, with: &Value) -> bool {
    if *pick == 0 {
        *v = with.clone();
        return true;
    }
    *pick -= 1;
    match v {
        Value::Array(a) => a.iter_mut().any(|x| replace_node(x, pick, with)),
        Value::Object(m) => m.values_mut().any(|x| replace_node(x, pick, with)),
        _ => false,
    }
}

fn count_nodes(v: &Value) -> usize {
    1 + match v {
        Value::Array(a) => a.iter().map(count_nodes).sum(),
        Value::Object(m) => m.values().map(count_nodes).sum(),
        _ => 0,
    }
}

/// Valid inputs with some of their nodes replaced by arbitrary values: the way to reach
/// the inner paths of a translator (huge usage figures, a wrong-typed tool call, …).
fn mutated(template: Value) -> impl Strategy<Value = Value> {
    prop::collection::vec(
        (
            any::<usize>(),
            prop_oneof![3 => leaf(), 1 => json_value(), 1 => deep()],
        ),
        0..5,
    )
    .prop_map(move |picks| {
        let mut v = template.clone();
        for (pick, with) in picks {
            let mut at = pick % count_nodes(&v);
            replace_node(&mut v, &mut at, &with);
        }
        v
    })
    // Deeper than serde_json parses, it could never reach a translator.
    .prop_filter("deeper than a parsed body", |v| depth(v) < 120)
}

fn depth(v: &Value) -> usize {
    1 + match v {
        Value::Array(a) => a.iter().map(depth).max().unwrap_or(0),
        Value::Object(m) => m.values().map(depth).max().unwrap_or(0),
        _ => 0,
    }
}

fn templates() -> Vec<Value> {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
    let mut out = Vec::new();
    for dir in [
        "openai/requests",
        "anthropic/requests",
        "openai/answers",
        "anthropic/answers",
        "openai/streams",
        "anthropic/streams",
        "openai/wire",
        "anthropic/wire",
    ] {
        for e in std::fs::read_dir(root.join(dir)).unwrap() {
            let p = e.unwrap().path();
            if !p.to_string_lossy().ends_with(".expected.json") {
                out.push(serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap());
            }
        }
    }
    out
}

/// A fixture's input, answer or stream events, mutated: (request body, answer, events).
fn shaped() -> impl Strategy<Value = (Map<String, Value>, Value, Vec<(String, String)>)> {
    prop::sample::select(templates())
        .prop_flat_map(|t| (mutated(t.clone()), mutated(t)))
        .prop_map(|(a, b)| {
            let body = a
                .get("input")
                .or_else(|| a.get("request"))
                .and_then(Value::as_object)
                .cloned()
                .unwrap_or_default();
            let answer = b
                .get("input")
                .or_else(|| b.pointer("/upstream/body"))
                .cloned()
                .unwrap_or(b.clone());
            let list = b
                .get("input")
                .or_else(|| b.pointer("/upstream/events"))
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default();
            let events = list
                .iter()
                .map(|e| match e {
                    Value::Array(pair) => (
                        pair.first()
                            .and_then(Value::as_str)
                            .unwrap_or("")
                            .to_string(),
                        pair.get(1)
                            .map(|d| d.as_str().map_or_else(|| d.to_string(), str::to_string))
                            .unwrap_or_default(),
                    ),
                    Value::String(d) => (String::new(), d.clone()),
                    other => (String::new(), other.to_string()),
                })
                .collect();
            (body, answer, events)
        })
}

/// Every `usage` object in `v` filled with extreme figures (each from `pick`, in turn).
fn extreme_usage(v: &mut Value, pick: &mut impl Iterator<Item = i128>) {
    match v {
        Value::Object(m) => {
            for (k, x) in m.iter_mut() {
                if k == "usage" {
                    let mut n = || {
                        let i = pick.next().unwrap_or(0);
                        i64::try_from(i).map_or_else(|_| json!(u64::MAX), Value::from)
                    };
                    *x = json!({"input_tokens": n(), "output_tokens": n(), "cache_read_input_tokens": n(),
                        "cache_creation_input_tokens": n(), "prompt_tokens": n(), "completion_tokens": n(),
                        "total_tokens": n(), "prompt_tokens_details": {"cached_tokens": n()}});
                } else {
                    extreme_usage(x, pick);
                }
            }
        }
        Value::Array(a) => a.iter_mut().for_each(|x| extreme_usage(x, pick)),
        Value::String(d) => {
            // Stream events carry their JSON as text.
            if let Ok(mut inner) = serde_json::from_str::<Value>(d) {
                if inner.is_object() {
                    extreme_usage(&mut inner, pick);
                    *d = inner.to_string();
                }
            }
        }
        _ => {}
    }
}

/// Runs every translation function on one input.
fn translate_everything(
    body: &Map<String, Value>,
    answer: &Value,
    events: &[(String, String)],
    status: u16,
) -> Result<(), TestCaseError> {
    for client in FORMATS {
        for upstream in PROVIDERS {
            for stream in [false, true] {
                if let Ok(out) = providers::build_request(
                    client,
                    upstream,
                    body,
                    "m",
                    Some(("max_tokens", 16)),
                    stream,
                ) {
                    prop_assert!(serde_json::from_slice::<Value>(&out).is_ok_and(|v| v.is_object()));
                }
            }
        }
        for from in FORMATS {
            let raw = Bytes::from(answer.to_string());
            let out = providers::convert_answer(from, client, raw.clone(), (answer, None));
            prop_assert!(serde_json::from_slice::<Value>(&out).is_ok());
            // The gateway writes a translated answer from `relayable`'s read of it: the
            // same bytes as reading it again.
            if let Ok(Some(read)) = providers::relayable(from, client, answer) {
                let once =
                    providers::convert_answer(from, client, raw.clone(), (answer, Some(&read)));
                prop_assert_eq!(&once, &out);
            }
            let _ = providers::answer_usage(from, answer);
            let err = providers::convert_error(from, client, status, raw);
            if from != client {
                prop_assert!(serde_json::from_slice::<Value>(&err).is_ok());
            }
            for include_usage in [false, true] {
                let mut conv = StreamConverter::new(from, client, include_usage, 10);
                let mut frames = Vec::new();
                for (name, data) in events {
                    conv.event(name, data, &mut frames);
                }
                for f in &frames {
                    well_formed(f)?;
                }
                let _ = conv.usage();
                if let Some(f) = conv.error_frame("cut") {
                    well_formed(&f)?;
                }
            }
        }
    }
    Ok(())
}

#[test]
fn arbitrary_json_never_panics_any_translation() {
    let words = prop::collection::vec(
        (prop::sample::select(WORDS), json_value())
            .prop_map(|(w, d)| (w.to_string(), d.to_string())),
        0..12,
    );
    let strategy = (object(), json_value(), words, any::<u16>());
    let result = runner().run(&strategy, |(body, answer, mut events, status)| {
        // Each event as JSON text, and bare words too (`[DONE]`, garbage).
        let bare: Vec<_> = events
            .iter()
            .map(|(w, _)| (String::new(), w.clone()))
            .collect();
        events.extend(bare);
        translate_everything(&body, &answer, &events, status)
    });
    if let Err(e) = result {
        panic!("a translation failed on arbitrary input (seed {SEED:?}): {e}");
    }
}

#[test]
fn extreme_usage_figures_never_overflow() {
    let extremes = prop::sample::select(vec![
        i128::from(i64::MAX),
        i128::from(i64::MIN),
        -1,
        0,
        7,
        i128::from(u64::MAX),
    ]);
    let strategy = (
        prop::sample::select(templates()),
        prop::collection::vec(extremes, 64),
        any::<u16>(),
    );
    let result = runner().run(&strategy, |(mut t, picks, status)| {
        extreme_usage(&mut t, &mut picks.into_iter().cycle());
        let body = t
            .get("input")
            .or_else(|| t.get("request"))
            .and_then(Value::as_object)
            .cloned()
            .unwrap_or_default();
        let answer = t
            .get("input")
            .or_else(|| t.pointer("/upstream/body"))
            .cloned()
            .unwrap_or(Value::Null);
        let events: Vec<(String, String)> = t
            .get("input")
            .or_else(|| t.pointer("/upstream/events"))
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .map(|e| match e {
                Value::Array(pair) => (
                    pair[0].as_str().unwrap_or("").to_string(),
                    pair[1]
                        .as_str()
                        .map_or_else(|| pair[1].to_string(), str::to_string),
                ),
                Value::String(d) => (String::new(), d.clone()),
                other => (String::new(), other.to_string()),
            })
            .collect();
        translate_everything(&body, &answer, &events, status)
    });
    if let Err(e) = result {
        panic!("a translation failed on extreme usage figures (seed {SEED:?}): {e}");
    }
}

#[test]
fn mutated_fixtures_never_panic_any_translation() {
    let result = runner().run(
        &(shaped(), any::<u16>()),
        |((body, answer, events), status)| translate_everything(&body, &answer, &events, status),
    );
    if let Err(e) = result {
        panic!("a translation failed on a mutated fixture (seed {SEED:?}): {e}");
    }
}
