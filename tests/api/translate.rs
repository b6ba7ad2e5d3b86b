//! Table tests of the OpenAI ↔ Anthropic translation, driven by the fixtures under
//! `tests/fixtures/{openai,anthropic}/`. Each `<case>.json` holds an input; its
//! `<case>.expected.json` holds the reviewed translation (regenerate with SLUICE_BLESS=1,
//! then review the diff).

use std::path::{Path, PathBuf};

use serde_json::{json, Map, Value};
use sluice::config::Provider;
use sluice::error::WireFormat;
use sluice::upstream::providers::{self, translate::stream::StreamConverter};

/// The fixtures of `tests/fixtures/<dir>` (every `*.json` but the `*.expected.json`), by
/// name. Also used by the wire tests (`translate_wire.rs`).
pub(crate) fn cases(dir: &str) -> Vec<(PathBuf, Value)> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(dir);
    let mut out: Vec<(PathBuf, Value)> = std::fs::read_dir(&root)
        .unwrap_or_else(|_| panic!("{} exists", root.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| {
            p.extension().is_some_and(|e| e == "json")
                && !p.to_string_lossy().ends_with(".expected.json")
        })
        .map(|p| {
            let v = serde_json::from_str(&std::fs::read_to_string(&p).unwrap())
                .unwrap_or_else(|e| panic!("{}: {e}", p.display()));
            (p, v)
        })
        .collect();
    out.sort_by(|a, b| a.0.cmp(&b.0));
    assert!(!out.is_empty(), "no fixtures in {dir}");
    out
}

/// `created` timestamps are made at translation time; everything else must match exactly.
pub(crate) fn normalise(v: &mut Value) {
    match v {
        Value::Object(m) => {
            m.remove("created");
            m.values_mut().for_each(normalise);
        }
        Value::Array(a) => a.iter_mut().for_each(normalise),
        _ => {}
    }
}

fn check_golden(case: &Path, mut got: Value) {
    normalise(&mut got);
    let golden = case.with_extension("expected.json");
    if std::env::var("SLUICE_BLESS").is_ok() {
        std::fs::write(&golden, serde_json::to_string_pretty(&got).unwrap() + "\n").unwrap();
    }
    let want: Value = serde_json::from_str(
        &std::fs::read_to_string(&golden)
            .unwrap_or_else(|_| panic!("{} missing", golden.display())),
    )
    .unwrap();
    assert_eq!(got, want, "{}", case.display());
}

fn body(v: &Value) -> Map<String, Value> {
    v["input"].as_object().unwrap().clone()
}

#[test]
fn requests_translate_both_ways() {
    for (case, v) in cases("openai/requests") {
        let stream = v["input"]["stream"].as_bool().unwrap_or(false);
        let out = providers::build_request(
            WireFormat::OpenAi,
            Provider::Anthropic,
            &body(&v),
            "claude-upstream",
            Some(("max_tokens", 300)),
            stream,
        )
        .unwrap();
        check_golden(&case, serde_json::from_slice(&out).unwrap());
    }
    for (case, v) in cases("anthropic/requests") {
        let stream = v["input"]["stream"].as_bool().unwrap_or(false);
        let out = providers::build_request(
            WireFormat::Anthropic,
            Provider::Openai,
            &body(&v),
            "gpt-upstream",
            Some(("max_tokens", 300)),
            stream,
        )
        .unwrap();
        check_golden(&case, serde_json::from_slice(&out).unwrap());
    }
}

/// `<dir>/refusals/*.json`: a request the other side cannot express, and the `param` its
/// 400 names (`null` for a field neither format knows).
#[test]
fn what_the_other_side_cannot_express_is_refused_naming_the_field() {
    for (dir, client, upstream) in [
        ("openai/refusals", WireFormat::OpenAi, Provider::Anthropic),
        (
            "anthropic/refusals",
            WireFormat::Anthropic,
            Provider::Openai,
        ),
    ] {
        for (case, v) in cases(dir) {
            let err = providers::build_request(
                client,
                upstream,
                &body(&v),
                "c",
                Some(("max_tokens", 10)),
                false,
            )
            .expect_err(&case.display().to_string());
            assert_eq!(
                err.param.as_deref(),
                v["param"].as_str(),
                "{}",
                case.display()
            );
        }
    }
    let same = providers::build_request(
        WireFormat::OpenAi,
        Provider::Openai,
        &body(&cases("openai/refusals")[0].1),
        "g",
        Some(("max_tokens", 10)),
        false,
    );
    assert!(
        same.is_ok(),
        "the same request is fine for an OpenAI upstream"
    );
}

/// `openai/drops/*.json`: a hint an Anthropic upstream has no place for (a `strict` tool, a
/// speaker's `name`, an image's `detail`), left out and named as the client sent it — the
/// `x-sluice-dropped` list — and absent from the body sent.
#[test]
fn hints_the_other_side_has_no_place_for_are_dropped_and_named() {
    for (case, v) in cases("openai/drops") {
        let built = providers::build_request_with(
            WireFormat::OpenAi,
            Provider::Anthropic,
            &body(&v),
            "c",
            Some(("max_tokens", 10)),
            (false, true),
        )
        .unwrap_or_else(|e| panic!("{}: {e:?}", case.display()));
        let want: Vec<&str> = v["dropped"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| d.as_str().unwrap())
            .collect();
        assert_eq!(built.dropped, want, "{}", case.display());
        let sent: Value = serde_json::from_slice(&built.body).unwrap();
        for gone in ["\"strict\"", "\"name\":\"ann\"", "\"detail\""] {
            assert!(
                !sent.to_string().contains(gone),
                "{}: {sent}",
                case.display()
            );
        }
    }
}

#[test]
fn answers_translate_both_ways_with_usage() {
    for (case, v) in cases("anthropic/answers") {
        let raw = bytes::Bytes::from(v["input"].to_string());
        let out = providers::convert_answer(
            WireFormat::Anthropic,
            WireFormat::OpenAi,
            raw,
            (&v["input"], None),
        );
        let got: Value = serde_json::from_slice(&out).unwrap();
        let usage = providers::answer_usage(WireFormat::Anthropic, &v["input"])
            .usage()
            .unwrap();
        check_golden(
            &case,
            json!({"answer": got, "usage": [usage.input, usage.cached_input, usage.output]}),
        );
    }
    for (case, v) in cases("openai/answers") {
        let raw = bytes::Bytes::from(v["input"].to_string());
        let out = providers::convert_answer(
            WireFormat::OpenAi,
            WireFormat::Anthropic,
            raw,
            (&v["input"], None),
        );
        let got: Value = serde_json::from_slice(&out).unwrap();
        let usage = providers::answer_usage(WireFormat::OpenAi, &v["input"])
            .usage()
            .unwrap();
        check_golden(
            &case,
            json!({"answer": got, "usage": [usage.input, usage.cached_input, usage.output]}),
        );
    }
}

fn frames_to_json(frames: &[bytes::Bytes]) -> Value {
    let mut out = Vec::new();
    for f in frames {
        let text = std::str::from_utf8(f).unwrap();
        let mut event = Value::Null;
        let mut data = Value::Null;
        for line in text.lines() {
            if let Some(e) = line.strip_prefix("event: ") {
                event = json!(e);
            } else if let Some(d) = line.strip_prefix("data: ") {
                data = serde_json::from_str(d).unwrap_or_else(|_| json!(d));
            }
        }
        out.push(json!([event, data]));
    }
    Value::Array(out)
}

#[test]
fn streams_translate_event_by_event() {
    for dir in ["openai/streams", "anthropic/streams"] {
        let upstream = if dir.starts_with("openai") {
            WireFormat::OpenAi
        } else {
            WireFormat::Anthropic
        };
        for (case, v) in cases(dir) {
            let client = if v["client"] == "openai" {
                WireFormat::OpenAi
            } else {
                WireFormat::Anthropic
            };
            let include_usage = v["include_usage"].as_bool().unwrap_or(false);
            let mut conv = StreamConverter::new(
                upstream,
                client,
                include_usage,
                v["input_estimate"].as_i64().unwrap(),
            );
            let mut frames = Vec::new();
            for item in v["input"].as_array().unwrap() {
                match item {
                    Value::String(data) => conv.event("", data, &mut frames),
                    Value::Array(pair) => conv.event(
                        pair[0].as_str().unwrap(),
                        pair[1].as_str().unwrap(),
                        &mut frames,
                    ),
                    _ => unreachable!(),
                }
            }
            assert_eq!(
                conv.done(),
                v["done"].as_bool().unwrap_or(true),
                "{}",
                case.display()
            );
            let u = conv.usage();
            assert_eq!(
                (u.input, u.output),
                (
                    v["usage"]["input"].as_i64().unwrap(),
                    v["usage"]["output"].as_i64().unwrap()
                ),
                "{}",
                case.display()
            );
            check_golden(&case, frames_to_json(&frames));
        }
    }
}
