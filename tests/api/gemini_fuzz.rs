//! The Gemini adapter's readers on arbitrary JSON (fixed seed, 256 cases): answers, usage,
//! error bodies and stream chunks built from the keys they look for, wrong types, huge and
//! negative numbers. Never a panic; figures stay within the clamp.

use proptest::prelude::*;
use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};
use serde_json::Value;
use sluice::upstream::providers::formats::gemini as format;
use sluice::upstream::providers::MAX_REPORTED_TOKENS;
use sluice::upstream::retry::classify;
use sluice::upstream::UpstreamError;

const KEYS: &[&str] = &[
    "candidates",
    "content",
    "parts",
    "text",
    "thought",
    "thoughtSignature",
    "functionCall",
    "name",
    "args",
    "finishReason",
    "usageMetadata",
    "promptTokenCount",
    "candidatesTokenCount",
    "thoughtsTokenCount",
    "cachedContentTokenCount",
    "toolUsePromptTokenCount",
    "promptFeedback",
    "blockReason",
    "responseId",
    "modelVersion",
    "createTime",
    "error",
    "code",
    "message",
    "status",
    "details",
    "@type",
    "violations",
    "quotaId",
    "quotaValue",
    "retryDelay",
    "inlineData",
];

fn leaf() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        any::<f64>()
            .prop_map(|f| serde_json::Number::from_f64(f).map_or(Value::Null, Value::Number)),
        prop::sample::select(vec![
            "STOP",
            "MAX_TOKENS",
            "SAFETY",
            "RESOURCE_EXHAUSTED",
            "UNAVAILABLE",
            "type.googleapis.com/google.rpc.RetryInfo",
            "type.googleapis.com/google.rpc.QuotaFailure",
            "38s",
            "-1s",
            "1e308s",
            "NaNs",
            "PerDay",
            "0",
            "2025-06-01T12:00:00Z",
            "ż\u{0}\u{202e}",
        ])
        .prop_map(Value::from),
        ".*".prop_map(Value::from),
    ]
}

fn json_value() -> impl Strategy<Value = Value> {
    leaf().prop_recursive(6, 64, 8, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..5).prop_map(Value::Array),
            prop::collection::btree_map(
                prop::sample::select(KEYS).prop_map(String::from),
                inner,
                0..6
            )
            .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

#[test]
fn the_gemini_readers_never_panic_on_arbitrary_json() {
    let config = Config {
        cases: 256,
        failure_persistence: None,
        ..Config::default()
    };
    let mut runner = TestRunner::new_with_rng(
        config,
        TestRng::from_seed(RngAlgorithm::ChaCha, b"sluice-gemini-props-seed-0000001"),
    );
    runner
        .run(&prop::collection::vec(json_value(), 1..6), |chunks| {
            let mut reader = format::EventReader::new();
            let mut out = Vec::new();
            for v in &chunks {
                if let Ok(a) = format::read_answer(v) {
                    if let Some(u) = a.usage {
                        prop_assert!(
                            u.input >= 0 && u.output >= 0 && u.input <= 2 * MAX_REPORTED_TOKENS
                        );
                    }
                }
                let _ = format::read_usage(v);
                let _ = format::read_error(429, v);
                let _ = format::is_quota(v);
                let _ = format::retry_delay(v);
                let _ = reader.read("", &v.to_string(), &mut out);
                let _ = classify(&UpstreamError::Status {
                    status: 429,
                    body: bytes::Bytes::from(v.to_string()),
                    retry_after: None,
                });
            }
            Ok(())
        })
        .unwrap();
}
