//! Every upstream format to an OpenAI and an Anthropic client: when a scripted stream is
//! complete or cut, and what it costs.

use serde_json::{json, Value};

use crate::error::WireFormat;
use crate::quota::estimate;
use crate::upstream::providers::translate::stream::StreamConverter;
use crate::upstream::providers::Format;
use crate::usage::Usage;

/// How a scripted stream's usage is reported.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Report {
    /// A final usage of zeros, where the format puts its final usage.
    Zeros,
    /// Only placeholders or running figures before the finish: an input of 0 where the
    /// format has one (Anthropic's `message_start`, Gemini's running `promptTokenCount`,
    /// with Anthropic's placeholder output of 1), OpenAI's `usage: null`; Bedrock none.
    Placeholder,
}

pub(super) const TEXT: &str = "The engine light blinks when a cylinder misfires.";

fn data(v: Value) -> (&'static str, String) {
    ("", v.to_string())
}

/// One upstream's stream of `TEXT`, finished, with its usage reported as `r`.
fn stream(upstream: Format, r: Report) -> Vec<(&'static str, String)> {
    let zeros = r == Report::Zeros;
    match upstream {
        Format::OpenAiChat => {
            let c = |choices: Value, usage: Value| {
                data(
                    json!({"id": "c", "object": "chat.completion.chunk", "created": 1,
                    "model": "m", "choices": choices, "usage": usage}),
                )
            };
            let mut s = vec![
                c(
                    json!([{"index": 0, "delta": {"content": TEXT}, "finish_reason": null}]),
                    Value::Null,
                ),
                c(
                    json!([{"index": 0, "delta": {}, "finish_reason": "stop"}]),
                    Value::Null,
                ),
            ];
            if zeros {
                s.push(c(
                    json!([]),
                    json!({"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}),
                ));
            }
            s.push(("", "[DONE]".into()));
            s
        }
        Format::Anthropic => {
            let e = |name: &'static str, v: Value| (name, v.to_string());
            let delta_usage = if zeros {
                json!({"output_tokens": 0})
            } else {
                Value::Null
            };
            let mut delta = json!({"type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence": null}});
            if zeros {
                delta["usage"] = delta_usage;
            }
            vec![
                e(
                    "message_start",
                    json!({"type": "message_start", "message": {"id": "msg_1", "type": "message",
                        "role": "assistant", "model": "claude", "content": [],
                        "usage": {"input_tokens": 0, "output_tokens": if zeros { 0 } else { 1 }}}}),
                ),
                e(
                    "content_block_start",
                    json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
                ),
                e(
                    "content_block_delta",
                    json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": TEXT}}),
                ),
                e(
                    "content_block_stop",
                    json!({"type": "content_block_stop", "index": 0}),
                ),
                e("message_delta", delta),
                e("message_stop", json!({"type": "message_stop"})),
            ]
        }
        Format::Gemini => {
            let mut text = json!({"candidates": [{"content": {"role": "model", "parts": [{"text": TEXT}]}, "index": 0}],
                "responseId": "r1", "modelVersion": "gemini-2.5-flash"});
            let mut finish = json!({"candidates": [{"content": {"role": "model", "parts": []}, "index": 0,
                "finishReason": "STOP"}], "responseId": "r1"});
            if zeros {
                finish["usageMetadata"] =
                    json!({"promptTokenCount": 0, "candidatesTokenCount": 0, "totalTokenCount": 0});
            } else {
                text["usageMetadata"] = json!({"promptTokenCount": 0});
            }
            vec![data(text), data(finish)]
        }
        Format::Bedrock => {
            let mut s = vec![
                ("messageStart", json!({"role": "assistant"}).to_string()),
                (
                    "contentBlockDelta",
                    json!({"contentBlockIndex": 0, "delta": {"text": TEXT}}).to_string(),
                ),
                (
                    "contentBlockStop",
                    json!({"contentBlockIndex": 0}).to_string(),
                ),
                ("messageStop", json!({"stopReason": "end_turn"}).to_string()),
            ];
            if zeros {
                s.push((
                    "metadata",
                    json!({"usage": {"inputTokens": 0, "outputTokens": 0, "totalTokens": 0},
                        "metrics": {"latencyMs": 1}})
                    .to_string(),
                ));
            }
            s
        }
        Format::Responses => unreachable!("read by `responses::Native`"),
    }
}

/// The stream through a converter, then its body's end: (complete, what it costs, the
/// client's last frame).
pub(super) fn through(
    upstream: Format,
    client: WireFormat,
    events: &[(&str, String)],
) -> (bool, Usage, String) {
    let mut c = StreamConverter::new(upstream, client, true, 10);
    let mut out = Vec::new();
    for (name, data) in events {
        c.event(name, data, &mut out);
    }
    let complete = c.end(&mut out);
    let last = out
        .last()
        .map(|f| String::from_utf8_lossy(f).to_string())
        .unwrap_or_default();
    (complete, c.usage(), last)
}

const UPSTREAMS: [Format; 4] = [
    Format::OpenAiChat,
    Format::Anthropic,
    Format::Gemini,
    Format::Bedrock,
];

/// Per upstream format and client: a final usage of zeros costs 0, and placeholders or
/// running figures do not price the stream (its output is counted; an input reported as 0
/// is 0).
#[test]
fn a_final_usage_of_zeros_costs_nothing_and_a_placeholder_prices_nothing_in_every_format() {
    let counted = estimate::count_text(TEXT);
    for upstream in UPSTREAMS {
        for client in [WireFormat::OpenAi, WireFormat::Anthropic] {
            let (complete, u, last) = through(upstream, client, &stream(upstream, Report::Zeros));
            assert!(complete, "{upstream:?} → {client:?}");
            assert_eq!((u.input, u.output), (0, 0), "{upstream:?} → {client:?}");
            match client {
                WireFormat::OpenAi => assert_eq!(last, "data: [DONE]\n\n", "{upstream:?}"),
                WireFormat::Anthropic => assert!(last.contains("message_stop"), "{upstream:?}"),
            }
            let (complete, u, _) =
                through(upstream, client, &stream(upstream, Report::Placeholder));
            // Bedrock's end event is its usage: a stream without one was cut.
            assert_eq!(
                complete,
                upstream != Format::Bedrock,
                "{upstream:?} → {client:?}"
            );
            let input = match upstream {
                // Neither reports any input here: the estimate.
                Format::OpenAiChat | Format::Bedrock => 10,
                _ => 0,
            };
            assert_eq!(
                (u.input, u.output),
                (input, counted),
                "{upstream:?} → {client:?}"
            );
        }
    }
}

/// A stream whose body ends before its finish is cut, whatever it reported: `end` says
/// so and writes nothing (the pump sends the error event).
#[test]
fn a_body_that_ends_before_the_finish_is_a_cut() {
    for upstream in UPSTREAMS {
        for client in [WireFormat::OpenAi, WireFormat::Anthropic] {
            let events = stream(upstream, Report::Zeros);
            let before_finish = match upstream {
                Format::OpenAiChat | Format::Gemini => 1,
                Format::Anthropic => 4,
                _ => 3,
            };
            let mut c = StreamConverter::new(upstream, client, true, 10);
            let mut out = Vec::new();
            for (name, data) in &events[..before_finish] {
                c.event(name, data, &mut out);
            }
            let sent = out.len();
            assert!(!c.end(&mut out), "{upstream:?} → {client:?}");
            assert_eq!(out.len(), sent, "{upstream:?} → {client:?}");
            assert!(!c.done());
        }
    }
}

/// Gemini's usage in a chunk of its own after the finish, Bedrock's `metadata` before
/// `messageStop`: either is the final usage, read before the stream completes.
#[test]
fn a_usage_beside_the_finish_is_its_price() {
    let usage = json!({"promptTokenCount": 1000, "candidatesTokenCount": 10,
        "thoughtsTokenCount": 4000, "totalTokenCount": 5010});
    let mut gemini = stream(Format::Gemini, Report::Placeholder);
    gemini.push(data(json!({"usageMetadata": usage, "responseId": "r1"})));
    let (complete, u, last) = through(Format::Gemini, WireFormat::OpenAi, &gemini);
    assert!(complete);
    assert_eq!((u.input, u.output), (1000, 4010));
    assert!(last.contains("[DONE]"));

    let mut bedrock = stream(Format::Bedrock, Report::Placeholder);
    bedrock.insert(
        3,
        (
            "metadata",
            json!({"usage": {"inputTokens": 3, "outputTokens": 2}}).to_string(),
        ),
    );
    let mut c = StreamConverter::new(Format::Bedrock, WireFormat::OpenAi, true, 10);
    let mut out = Vec::new();
    for (name, data) in &bedrock {
        c.event(name, data, &mut out);
    }
    assert!(c.done(), "messageStop after metadata is the end");
    let u = c.usage();
    assert_eq!((u.input, u.output), (3, 2), "not a floor under the count");
}

/// An event the gateway cannot read after the finish — it may be the usage — ends the
/// stream with an error event, as before the finish; the usage then is the count.
#[test]
fn an_unreadable_event_after_the_finish_cuts_the_stream() {
    let mut c = StreamConverter::new(Format::Gemini, WireFormat::OpenAi, true, 10);
    let mut out = Vec::new();
    for (name, data) in stream(Format::Gemini, Report::Placeholder) {
        c.event(name, &data, &mut out);
    }
    c.event("", "{\"usageMetadata\": ", &mut out);
    assert!(c.upstream_failed() && !c.done());
    let last = String::from_utf8_lossy(out.last().unwrap()).to_string();
    assert!(last.contains("upstream_error"), "{last}");
    assert!(!c.end(&mut out));
    assert_eq!(c.usage().output, estimate::count_text(TEXT));
}

/// A tool call with no input (Anthropic streams `input: {}` and at most an empty
/// `partial_json`) reaches an OpenAI client with the arguments `{}`, as the same answer
/// unstreamed gives and as OpenAI itself sends: streamed it was `""`, which the SDK's
/// strict-tool parsing refuses and Gemini and Bedrock routes refuse when the history comes
/// back (s24 attack, translation #5).
#[test]
fn a_tool_call_without_input_streams_its_arguments_as_an_empty_object() {
    let e = |name: &'static str, v: Value| (name, v.to_string());
    let events = [
        e(
            "message_start",
            json!({"type": "message_start", "message": {"id": "m", "type": "message", "role": "assistant",
                "model": "c", "content": [], "stop_reason": null, "usage": {"input_tokens": 5, "output_tokens": 1}}}),
        ),
        e(
            "content_block_start",
            json!({"type": "content_block_start", "index": 0,
                "content_block": {"type": "tool_use", "id": "toolu_1", "name": "now", "input": {}}}),
        ),
        e(
            "content_block_delta",
            json!({"type": "content_block_delta", "index": 0,
                "delta": {"type": "input_json_delta", "partial_json": ""}}),
        ),
        e(
            "content_block_stop",
            json!({"type": "content_block_stop", "index": 0}),
        ),
        e(
            "message_delta",
            json!({"type": "message_delta", "delta": {"stop_reason": "tool_use"}, "usage": {"output_tokens": 3}}),
        ),
        e("message_stop", json!({"type": "message_stop"})),
    ];
    let mut c = StreamConverter::new(Format::Anthropic, WireFormat::OpenAi, true, 10);
    let mut out = Vec::new();
    for (name, data) in &events {
        c.event(name, data, &mut out);
    }
    assert!(c.end(&mut out));
    let arguments: String = out
        .iter()
        .filter_map(|f| {
            let text = String::from_utf8_lossy(f);
            let v: Value = serde_json::from_str(text.trim().strip_prefix("data: ")?).ok()?;
            let args = v.pointer("/choices/0/delta/tool_calls/0/function/arguments")?;
            Some(args.as_str()?.to_string())
        })
        .collect();
    assert_eq!(arguments, "{}");
}

/// The blocks an Anthropic client rebuilds from a stream's frames: (type, text, signature).
fn anthropic_blocks(out: &[bytes::Bytes]) -> Vec<(String, String, String)> {
    let mut blocks: Vec<(String, String, String)> = Vec::new();
    for f in out {
        let text = String::from_utf8_lossy(f);
        let Some(data) = text.lines().find_map(|l| l.strip_prefix("data: ")) else {
            continue;
        };
        let v: Value = serde_json::from_str(data).unwrap();
        match v["type"].as_str() {
            Some("content_block_start") => {
                let kind = v["content_block"]["type"].as_str().unwrap().to_string();
                blocks.push((kind, String::new(), String::new()));
            }
            Some("content_block_delta") => {
                let b = blocks.last_mut().unwrap();
                let d = &v["delta"];
                match d["type"].as_str() {
                    Some("thinking_delta") => b.1.push_str(d["thinking"].as_str().unwrap()),
                    // The SDKs assign each signature: the last one is the block's.
                    Some("signature_delta") => b.2 = d["signature"].as_str().unwrap().into(),
                    _ => {}
                }
            }
            _ => {}
        }
    }
    blocks
}

/// A Gemini thought signature on a function call reaches an Anthropic client streaming as
/// a thinking block of its own before the `tool_use`, as the whole answer gives it — the
/// stream dropped it, and the call sent back without it is refused by Gemini 3 — and a
/// signature on the part after a thought goes on a block of its own, not on the thought's
/// (s24 attack, translation #2).
#[test]
fn a_gemini_signature_on_a_call_streams_on_a_thinking_block_of_its_own() {
    let chunk = |parts: Value, finish: Value| {
        data(
            json!({"responseId": "r", "candidates": [{"content": {"role": "model", "parts": parts},
            "finishReason": finish}], "usageMetadata": {"promptTokenCount": 3, "candidatesTokenCount": 2}}),
        )
    };
    let events = [
        chunk(
            json!([{"text": "Let me look.", "thought": true, "thoughtSignature": "sig-thought"}]),
            Value::Null,
        ),
        chunk(
            json!([{"functionCall": {"name": "f", "args": {}}, "thoughtSignature": "sig-call"}]),
            json!("STOP"),
        ),
    ];
    let mut c = StreamConverter::new(Format::Gemini, WireFormat::Anthropic, true, 10);
    let mut out = Vec::new();
    for (name, data) in &events {
        c.event(name, data, &mut out);
    }
    assert!(c.end(&mut out));
    let blocks = anthropic_blocks(&out);
    let kinds: Vec<(&str, &str, &str)> = blocks
        .iter()
        .map(|(k, t, s)| (k.as_str(), t.as_str(), s.as_str()))
        .collect();
    assert_eq!(
        kinds,
        [
            ("thinking", "Let me look.", "sig-thought"),
            ("thinking", "", "sig-call"),
            ("tool_use", "", "")
        ]
    );
}

/// A Gemini signature on a text part in the middle of the text leaves the text one block:
/// a thinking block of its own there split it, `content[0].text` holding half (s24 final
/// attack #5).
#[test]
fn a_gemini_signature_inside_the_text_leaves_the_text_whole() {
    let chunk = |parts: Value, finish: Value| {
        data(
            json!({"responseId": "r", "candidates": [{"content": {"role": "model", "parts": parts},
            "finishReason": finish}], "usageMetadata": {"promptTokenCount": 3, "candidatesTokenCount": 2}}),
        )
    };
    let events = [
        chunk(json!([{"text": "Hel"}]), Value::Null),
        chunk(
            json!([{"text": "lo", "thoughtSignature": "sig-text"}]),
            json!("STOP"),
        ),
    ];
    let mut c = StreamConverter::new(Format::Gemini, WireFormat::Anthropic, true, 10);
    let mut out = Vec::new();
    for (name, data) in &events {
        c.event(name, data, &mut out);
    }
    assert!(c.end(&mut out));
    let kinds: Vec<String> = anthropic_blocks(&out).into_iter().map(|b| b.0).collect();
    assert_eq!(kinds, ["text"]);
}

/// An event whose data came over several `data:` lines (a pretty-printing server) is
/// passed on as several `data:` lines, as SSE frames it: a client's parser joins them back
/// into the same data, where one `data:` line with raw newlines would cut it at the first.
#[test]
fn data_of_several_lines_is_passed_on_as_several_data_lines() {
    let split = "{\"id\":\"c\",\"choices\":[{\"index\":0,\n\"delta\":{\"content\":\"Hi\"},\"finish_reason\":null}]}";
    let named = "{\"type\":\"content_block_delta\",\"index\":0,\n\"delta\":{\"type\":\"text_delta\",\"text\":\"Hi\"}}";
    for (format, name, data) in [
        (WireFormat::OpenAi, "", split),
        (WireFormat::Anthropic, "content_block_delta", named),
    ] {
        let mut c = StreamConverter::new(format, format, false, 10);
        let mut out = Vec::new();
        if format == WireFormat::Anthropic {
            let start = json!({"type": "message_start", "message": {"id": "m", "type": "message",
                "role": "assistant", "model": "m", "content": [], "usage": {"input_tokens": 5, "output_tokens": 1}}});
            c.event("message_start", &start.to_string(), &mut out);
            out.clear();
        }
        c.event(name, data, &mut out);
        let framed = String::from_utf8(out[0].to_vec()).unwrap();
        let (event, rest) = framed.split_once("\n\n").unwrap();
        assert_eq!(rest, "", "{framed:?}");
        let lines: Vec<&str> = event
            .lines()
            .filter(|l| !l.starts_with("event: "))
            .collect();
        assert!(lines.iter().all(|l| l.starts_with("data: ")), "{framed:?}");
        let joined: Vec<&str> = lines.iter().map(|l| &l["data: ".len()..]).collect();
        assert_eq!(joined.join("\n"), data, "{framed:?}");
    }
}

/// A Gemini or Bedrock error event in the middle of a stream ends it with the fault its
/// kind names — an overload, a rate limit, a server error — or none for any other (the
/// client's, a spent quota): the key's verdict (s28 diff attack F2: none of them named one).
#[test]
fn gemini_and_bedrock_error_events_name_the_upstreams_fault() {
    use crate::upstream::providers::canonical::Fault;
    let text = json!({"candidates": [{"content": {"role": "model", "parts": [{"text": "Hi"}]},
        "index": 0}]});
    let google = |code: u16, status: &str| {
        json!({"error": {"code": code, "status": status, "message": "no"}}).to_string()
    };
    let gemini = [
        (google(503, "UNAVAILABLE"), Some(Fault::Overloaded)),
        (google(429, "RESOURCE_EXHAUSTED"), Some(Fault::RateLimited)),
        (google(500, "INTERNAL"), Some(Fault::Server)),
        (google(400, "INVALID_ARGUMENT"), None),
        (google(403, "PERMISSION_DENIED"), None),
        // Names the reader does not know, or none: no fault, though they read as server
        // errors (s28 late attack F7).
        (google(499, "CANCELLED"), None),
        (json!({"error": {"message": "no"}}).to_string(), None),
        (
            json!({"error": {"code": 500, "message": "no"}}).to_string(),
            None,
        ),
    ];
    for (error, fault) in gemini {
        let mut c = StreamConverter::new(Format::Gemini, WireFormat::OpenAi, true, 10);
        let mut out = Vec::new();
        c.event("", &text.to_string(), &mut out);
        c.event("", &error, &mut out);
        assert!(c.upstream_failed() && !c.ended_by_the_gateway(), "{error}");
        assert_eq!(c.fault(), fault, "{error}");
    }
    let bedrock = [
        ("throttlingException", Some(Fault::RateLimited)),
        ("serviceUnavailableException", Some(Fault::Overloaded)),
        ("internalServerException", Some(Fault::Server)),
        ("modelStreamErrorException", Some(Fault::Server)),
        ("validationException", None),
        ("fooBarException", None),
    ];
    for (exception, fault) in bedrock {
        let mut c = StreamConverter::new(Format::Bedrock, WireFormat::Anthropic, true, 10);
        let mut out = Vec::new();
        c.event("messageStart", r#"{"role":"assistant"}"#, &mut out);
        c.event(
            "contentBlockDelta",
            r#"{"contentBlockIndex":0,"delta":{"text":"Hi"}}"#,
            &mut out,
        );
        c.event(exception, r#"{"message":"no"}"#, &mut out);
        assert!(
            c.upstream_failed() && !c.ended_by_the_gateway(),
            "{exception}"
        );
        assert_eq!(c.fault(), fault, "{exception}");
    }
}

/// The converter ends a stream on a part of a kind not modelled with the gateway's error
/// event, as on a broken one, charged alike (`ended_by_the_gateway`), but tells it apart
/// (`unsupported`): no failure of the key (s28 diff attack F1).
#[test]
fn a_part_not_modelled_ends_the_stream_but_is_told_apart() {
    let text = json!({"candidates": [{"content": {"role": "model", "parts": [{"text": "Hi"}]},
        "index": 0}]});
    let part = |p: Value| json!({"candidates": [{"content": {"parts": [p]}, "index": 0}]});
    let cases = [
        (
            part(json!({"inlineData": {"mimeType": "image/png", "data": "AA=="}})),
            true,
        ),
        (part(json!({})), false),
        (json!("not a chunk"), false),
    ];
    for (then, unsupported) in cases {
        let mut c = StreamConverter::new(Format::Gemini, WireFormat::OpenAi, true, 10);
        let mut out = Vec::new();
        c.event("", &text.to_string(), &mut out);
        out.clear();
        c.event("", &then.to_string(), &mut out);
        let told = String::from_utf8_lossy(&out.concat()).into_owned();
        assert!(told.contains("upstream_error"), "{then}: {told}");
        assert!(c.upstream_failed() && c.ended_by_the_gateway(), "{then}");
        assert_eq!(c.unsupported(), unsupported, "{then}");
        assert_eq!(c.fault(), None, "{then}");
    }
}

/// An Anthropic-compatible server that sends only `data:` lines: the SSE reader names each
/// event `message`, and passed on so, every Anthropic SDK dropped every event — an empty
/// stream to the client, charged in full (s30 streams attack F1). Each frame is named by
/// its data's `type`, the name the gateway's own accounting went by, whatever the upstream
/// named it.
#[test]
fn an_anthropic_upstream_without_event_lines_is_named_by_its_types() {
    let mut c = StreamConverter::new(Format::Anthropic, WireFormat::Anthropic, true, 10);
    let mut out = Vec::new();
    for (i, (_, data)) in stream(Format::Anthropic, Report::Zeros).iter().enumerate() {
        // Data-only lines, and one event misnamed by a lying upstream.
        let name = if i == 2 { "ping" } else { "message" };
        c.event(name, data, &mut out);
    }
    let names: Vec<String> = out
        .iter()
        .map(|f| {
            let f = String::from_utf8_lossy(f);
            f.lines().next().unwrap_or_default().to_string()
        })
        .collect();
    assert_eq!(
        names,
        [
            "event: message_start",
            "event: content_block_start",
            "event: content_block_delta",
            "event: content_block_stop",
            "event: message_delta",
            "event: message_stop"
        ]
    );
}

/// A lying upstream's `type` holding a line ending would end the `event:` line and inject
/// events of its choosing (text never charged): such a name is never written (s30 diff
/// attack F1), on the Anthropic pass-through as on every frame.
#[test]
fn an_anthropic_type_holding_a_line_ending_names_no_event() {
    let injected = "{\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"UNCOUNTED\"}}";
    for end in ["\n\n", "\r\r", "\r\n\r\n"] {
        let mut c = StreamConverter::new(Format::Anthropic, WireFormat::Anthropic, true, 10);
        let mut out = Vec::new();
        let start = &stream(Format::Anthropic, Report::Zeros)[0].1;
        c.event("message_start", start, &mut out);
        let kind =
            format!("ping{end}event: content_block_delta{end}data: {injected}{end}event: ping");
        let data = json!({ "type": kind }).to_string();
        c.event("message", &data, &mut out);
        let text = String::from_utf8_lossy(&out.concat()).into_owned();
        let events: Vec<&str> = text
            .split(['\n', '\r'])
            .filter(|l| l.starts_with("event:"))
            .collect();
        assert_eq!(events, ["event: message_start", "event: ping"], "{text:?}");
    }
    assert!(super::super::framing::plain_name("content_block_delta"));
    assert!(!super::super::framing::plain_name("a\nb"));
}

/// An OpenAI-format error chunk that carries `choices` reaches the client as the error
/// alone: passed as it came, its text reached a hand-rolled reader uncounted — the
/// stream was charged by the cut rule for the text before it (s31 diff attack F5).
#[test]
fn an_error_chunk_carries_no_text_to_the_client() {
    for client in [WireFormat::OpenAi, WireFormat::Anthropic] {
        let mut c = StreamConverter::new(Format::OpenAiChat, client, true, 10);
        let mut out = Vec::new();
        let first = json!({"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m",
            "choices": [{"index": 0, "delta": {"content": TEXT}, "finish_reason": null}]});
        c.event("", &first.to_string(), &mut out);
        let error = json!({"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m",
            "choices": [{"index": 0, "delta": {"content": "An uncounted tail."}, "finish_reason": null}],
            "error": {"message": "overloaded", "type": "server_error"}});
        c.event("", &error.to_string(), &mut out);
        assert!(c.upstream_failed(), "{client:?}");
        let told: String = out.iter().map(|f| String::from_utf8_lossy(f)).collect();
        assert!(!told.contains("uncounted"), "{client:?}: {told}");
        assert!(told.contains("overloaded"), "{client:?}: {told}");
        assert_eq!(c.usage().output, estimate::count_text(TEXT), "{client:?}");
    }
}
