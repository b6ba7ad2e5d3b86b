//! A stream written in one format, read and written again for a client of another, gives
//! that client the same text, tool calls and usage; a Responses client's final response
//! object says the same as its events.

use proptest::prelude::*;
use serde_json::Value;

use super::{runner, text, SEED};
use crate::upstream::providers::canonical::{Event, Finish, Reported, Usage};
use crate::upstream::providers::formats::responses::{adapter as responses, Stamp};
use crate::upstream::providers::formats::{anthropic, openai_chat};
use crate::upstream::providers::translate::stream::{ResponsesOut, StreamConverter};
use crate::upstream::providers::Format;

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
    // A `tool_use` no `partial_json` followed keeps its start's `input: {}`, as the SDKs
    // read it.
    for c in &mut seen.calls {
        if c.2.is_empty() {
            c.2.push_str("{}");
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
                // A call with no input has the arguments `{}` in every format.
                .map(|(id, name, args)| {
                    let args = args.concat();
                    let args = if args.is_empty() { "{}".into() } else { args };
                    (id.clone(), name.clone(), args)
                })
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
