//! The converter: its accounting, its limits, and when a stream is complete and what it costs,
//! format by format.

use super::accounting::COUNT_EVERY;
use super::*;
use crate::error::WireFormat;
use crate::quota::{estimate, pricing};
use crate::upstream::providers::canonical::{self, Event, Reported};
use crate::usage::Usage;
use serde_json::json;

fn chunk(content: &str) -> String {
    json!({"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m",
        "choices": [{"index": 0, "delta": {"content": content}, "finish_reason": null}]})
    .to_string()
}

/// An endless stream of small events keeps no more than `COUNT_EVERY` of its text, and
/// the count of what it let go of is the count of the whole, give or take a token per
/// piece.
#[test]
fn a_long_stream_keeps_little_of_its_text_and_counts_all_of_it() {
    let piece = "The engine light blinks when a cylinder misfires. ";
    let n = 20_000;
    for client in [WireFormat::OpenAi, WireFormat::Anthropic] {
        let mut c = StreamConverter::new(WireFormat::OpenAi, client, false, 10);
        let mut out = Vec::new();
        for _ in 0..n {
            c.event("", &chunk(piece), &mut out);
            out.clear();
            assert!(c.text.len() <= COUNT_EVERY + piece.len());
        }
        let whole = estimate::count_text(&piece.repeat(n));
        let pieces = (piece.len() * n / COUNT_EVERY) as i64 + 1;
        let got = c.usage().output;
        assert!(
            (got - whole).abs() <= pieces,
            "{got} counted, {whole} in the whole text"
        );
    }
}

/// A second tool call held back behind a live one, its arguments growing for ever: the
/// converter ends the stream with an error event once it holds more than its limit.
#[test]
fn arguments_held_back_past_the_limit_end_the_stream_with_an_error() {
    let call = |index: i64, id: Option<&str>, name: Option<&str>, args: &str| {
        json!({"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m",
            "choices": [{"index": 0, "delta": {"tool_calls": [{"index": index, "id": id, "type": "function",
                "function": {"name": name, "arguments": args}}]}, "finish_reason": null}]})
        .to_string()
    };
    let mut c = StreamConverter::new(WireFormat::OpenAi, WireFormat::Anthropic, false, 10)
        .hold_limit(100_000);
    let mut out = Vec::new();
    c.event("", &call(0, Some("call_1"), Some("live"), "{"), &mut out);
    c.event("", &call(1, Some("call_2"), Some("held"), "{"), &mut out);
    let mut events = 0;
    while !c.upstream_failed() {
        events += 1;
        assert!(events < 20_000, "never ended");
        c.event("", &call(1, None, None, "\"xxxxxxxxxx\","), &mut out);
    }
    assert!(c.held_bytes() > 100_000);
    let last = String::from_utf8_lossy(out.last().unwrap()).to_string();
    assert!(last.starts_with("event: error\n"), "{last}");
    assert!(last.contains("upstream_error"), "{last}");
    // Nothing after the error.
    let before = out.len();
    c.event("", &call(1, None, None, "x"), &mut out);
    c.event("", "[DONE]", &mut out);
    assert_eq!(out.len(), before);
}

fn input(n: i64) -> Reported {
    Reported {
        input: Some(canonical::Input {
            input: n,
            ..canonical::Input::default()
        }),
        output: None,
    }
}

fn output(n: i64) -> Reported {
    Reported {
        input: None,
        output: Some(canonical::Output {
            output: n,
            ..canonical::Output::default()
        }),
    }
}

/// The accounting a format added later uses: output counted from its events, usage
/// figures set as they come — a floor before the finish, the price with or after it —
/// the end and errors noted.
#[test]
fn the_internal_form_s_events_are_accounted() {
    let mut c = StreamConverter::new(WireFormat::OpenAi, WireFormat::Anthropic, false, 10);
    c.note_event(&Event::TextDelta {
        index: 0,
        text: "The engine light blinks. ".repeat(10),
    });
    let counted = c.usage();
    assert_eq!(counted.input, 10, "the estimate until the upstream says");
    assert!(counted.output > 12);
    c.note_event(&Event::Usage(Reported {
        input: Some(canonical::Input {
            input: 31,
            cached_input: 4,
            ..canonical::Input::default()
        }),
        output: None,
    }));
    c.note_event(&Event::Usage(output(12)));
    // Before the finish a reported output is a running one, a floor: the output received
    // counts if more — also once the finish came, for it came before.
    let u = c.usage();
    assert_eq!((u.input, u.cached_input, u.output), (31, 4, counted.output));
    c.note_event(&Event::Finish(canonical::Finish::Stop));
    assert_eq!(c.usage().output, counted.output);
    assert!(!c.done());
    // With or after the finish it is the price.
    c.note_event(&Event::Usage(output(12)));
    let u = c.usage();
    assert_eq!((u.input, u.cached_input, u.output), (31, 4, 12));
    c.note_event(&Event::Done);
    assert!(c.done());
}

/// CHECKS Q5: a usage that says 0 is a figure — the price of a stream that reported it —
/// while a side a report does not carry is no figure at all.
#[test]
fn a_usage_of_zeros_is_the_price_and_an_absent_side_is_not() {
    let text = Event::TextDelta {
        index: 0,
        text: "The engine light blinks. ".repeat(10),
    };
    let mut zeros = StreamConverter::new(WireFormat::OpenAi, WireFormat::Anthropic, false, 10);
    zeros.note_event(&text);
    zeros.note_event(&Event::Finish(canonical::Finish::Stop));
    zeros.note_event(&Event::Usage(Reported::whole(canonical::Usage::default())));
    let u = zeros.usage();
    assert_eq!((u.input, u.cached_input, u.output), (0, 0, 0));

    let mut input_only = StreamConverter::new(WireFormat::OpenAi, WireFormat::Anthropic, false, 10);
    input_only.note_event(&text);
    let counted = input_only.usage().output;
    input_only.note_event(&Event::Finish(canonical::Finish::Stop));
    input_only.note_event(&Event::Usage(input(0)));
    let u = input_only.usage();
    assert_eq!(
        (u.input, u.output),
        (0, counted),
        "the output was never reported"
    );
}

/// Usages are cumulative figures, never summed: one with or after the finish replaces a
/// running one before it, even a lower one; among those after the finish the most is the
/// price (a later, lower report does not lower it).
#[test]
fn the_most_usage_after_the_finish_wins() {
    let mut c = StreamConverter::new(WireFormat::OpenAi, WireFormat::Anthropic, false, 10);
    c.note_event(&Event::Usage(Reported::whole(canonical::Usage {
        input: 7,
        output: 50,
        ..canonical::Usage::default()
    })));
    c.note_event(&Event::Finish(canonical::Finish::Stop));
    for n in [40, 30] {
        c.note_event(&Event::Usage(Reported::whole(canonical::Usage {
            input: 7,
            output: n,
            ..canonical::Usage::default()
        })));
    }
    let u = c.usage();
    assert_eq!((u.input, u.output), (7, 40));
}

/// Every part follows the rule of its side: output parts and web searches reported before
/// the finish are replaced by the ones with or after it, and the most of those counts, part
/// by part; cache writes count at the most reported in all, with the most reported one-hour
/// part among them (a later total without the split is no five-minute write).
#[test]
fn every_part_of_the_usage_follows_its_side_s_rule() {
    let mut c = StreamConverter::new(WireFormat::OpenAi, WireFormat::Anthropic, false, 10);
    let report = |c: &mut StreamConverter, u: canonical::Usage| {
        c.note_event(&Event::Usage(Reported::whole(u)));
    };
    report(
        &mut c,
        canonical::Usage {
            input: 100,
            cache_write_5m: 20,
            cache_write_1h: 30,
            audio_input: 5,
            output: 90,
            reasoning: 80,
            web_search_calls: 9,
            ..canonical::Usage::default()
        },
    );
    c.note_event(&Event::Finish(canonical::Finish::Stop));
    for (writes, reasoning, calls) in [(50, 10, 2), (40, 12, 1)] {
        report(
            &mut c,
            canonical::Usage {
                input: 100,
                cache_write_5m: writes,
                output: 30,
                reasoning,
                web_search_calls: calls,
                ..canonical::Usage::default()
            },
        );
    }
    let u = c.usage();
    assert_eq!(
        (u.cache_write_5m, u.cache_write_1h, u.audio_input),
        (20, 30, 5),
        "the writes' split and the audio input are kept"
    );
    assert_eq!(
        (u.output, u.reasoning, u.web_search_calls),
        (30, 12, 2),
        "the running output side is replaced; after the finish the most of each part"
    );
}

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

const TEXT: &str = "The engine light blinks when a cylinder misfires.";

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
fn through(
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

/// A later report with more input but more of it cached would lower the price: the most
/// reported input and the most of its uncached part count, each on its own.
#[test]
fn more_input_more_of_it_cached_does_not_lower_the_price() {
    let mut c = StreamConverter::new(WireFormat::OpenAi, WireFormat::Anthropic, false, 10);
    c.note_event(&Event::Finish(canonical::Finish::Stop));
    for (input, cached_input, output) in [(10_000, 0, 100), (10_001, 10_001, 0)] {
        c.note_event(&Event::Usage(Reported::whole(canonical::Usage {
            input,
            cached_input,
            output,
            ..canonical::Usage::default()
        })));
    }
    let u = c.usage();
    assert_eq!((u.input, u.cached_input, u.output), (10_001, 1, 100));
}

/// Writes count as unsplit by lifetime only where no report split them: Anthropic's
/// `message_start` splits them and its `message_delta` repeats the total without the
/// split (nothing unsplit); a stream that never splits them (Bedrock, older versions)
/// leaves them all unsplit.
#[test]
fn cache_writes_are_unsplit_only_where_no_report_split_them() {
    let unsplit = |first: canonical::Usage| {
        let mut c = StreamConverter::new(WireFormat::OpenAi, WireFormat::Anthropic, false, 10);
        let repeat = canonical::Usage {
            input: 100,
            cache_write_5m: 50,
            cache_write_unsplit: 50,
            output: 3,
            ..canonical::Usage::default()
        };
        for u in [first, repeat] {
            c.note_event(&Event::Usage(Reported::whole(u)));
        }
        let u = c.usage();
        (u.cache_write_5m, u.cache_write_1h, u.cache_write_unsplit)
    };
    let split = canonical::Usage {
        input: 100,
        cache_write_5m: 20,
        cache_write_1h: 30,
        ..canonical::Usage::default()
    };
    assert_eq!(unsplit(split), (20, 30, 0));
    let never = canonical::Usage {
        input: 100,
        cache_write_5m: 50,
        cache_write_unsplit: 50,
        ..canonical::Usage::default()
    };
    assert_eq!(unsplit(never), (50, 0, 50));
}

/// Anthropic's `message_start` splits the writes by lifetime (200 five-minute, 300
/// one-hour) and its `message_delta` reports a larger total without the split (800): the
/// 300 no report split are priced per the request's marks — at the one-hour rate when it
/// marked a one-hour write — as a whole answer's would be, never as five-minute writes.
#[test]
fn a_larger_unsplit_total_after_the_split_is_priced_per_the_marks() {
    let e = |name: &'static str, v: Value| (name, v.to_string());
    let events = vec![
        e(
            "message_start",
            json!({"type": "message_start", "message": {"id": "msg_1", "type": "message",
                "role": "assistant", "model": "claude", "content": [],
                "usage": {"input_tokens": 1000, "output_tokens": 1,
                    "cache_creation_input_tokens": 500,
                    "cache_creation": {"ephemeral_5m_input_tokens": 200,
                        "ephemeral_1h_input_tokens": 300}}}}),
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
        e(
            "message_delta",
            json!({"type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence": null},
                "usage": {"input_tokens": 1000, "output_tokens": 100,
                    "cache_creation_input_tokens": 800}}),
        ),
        e("message_stop", json!({"type": "message_stop"})),
    ];
    let (complete, usage, _) = through(Format::Anthropic, WireFormat::Anthropic, &events);
    assert!(complete);
    // Claude Sonnet: 3 USD input, 3.75 / 6 USD five-minute / one-hour writes, 15 USD output.
    let prices = pricing::Prices {
        cache_write_5m: 3_750_000,
        cache_write_1h: 6_000_000,
        ..pricing::Prices::plain(3_000_000, 15_000_000)
    };
    let marked = |hour: bool| pricing::InputKinds {
        cache_write_5m: true,
        cache_write_1h: hour,
        ..pricing::InputKinds::default()
    };
    // 1000 fresh × 3 + 200 × 3.75 + 600 × 6 + 100 × 15 = 3000 + 750 + 3600 + 1500.
    let hour = usage.at_worst_lifetime(marked(true));
    assert_eq!((hour.cache_write_5m, hour.cache_write_1h), (200, 600));
    assert_eq!(pricing::cost(hour, prices), 8_850);
    // Without a one-hour mark the 300 are five-minute writes: 500 × 3.75 + 300 × 6.
    let five = usage.at_worst_lifetime(marked(false));
    assert_eq!((five.cache_write_5m, five.cache_write_1h), (500, 300));
    assert_eq!(pricing::cost(five, prices), 3000 + 1875 + 1800 + 1500);
}

/// An `n` = 3 answer is whole once each of its choices finished, in any order — not at
/// choice 0's finish — and a usage that comes before then is a floor, not its price; a
/// body that ends before the last finish is a cut. With `n` = 1, choice 0's finish.
#[test]
fn an_answer_of_n_choices_is_whole_at_the_last_of_their_finishes() {
    let text = |i: i64, t: &str| {
        json!({"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m",
            "choices": [{"index": i, "delta": {"content": t}, "finish_reason": null}]})
        .to_string()
    };
    let finish = |i: i64| {
        json!({"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m",
            "choices": [{"index": i, "delta": {}, "finish_reason": "stop"}]})
        .to_string()
    };
    let usage = json!({"id": "c", "object": "chat.completion.chunk", "created": 1,
        "model": "m", "choices": [], "usage": {"prompt_tokens": 10, "completion_tokens": 1,
        "total_tokens": 11}})
    .to_string();
    let mut out = Vec::new();
    let mut c = StreamConverter::new(WireFormat::OpenAi, WireFormat::OpenAi, true, 10).choices(3);
    c.event("", &text(0, "one "), &mut out);
    c.event("", &finish(0), &mut out);
    assert!(!c.finished(), "choices 1 and 2 have not started");
    c.event("", &text(2, "three "), &mut out);
    c.event("", &finish(2), &mut out);
    assert!(!c.finished(), "choice 1 has not finished");
    // A running usage (vLLM's continuous usage, on a chunk with choices).
    let running = json!({"id": "c", "object": "chat.completion.chunk", "created": 1,
        "model": "m", "choices": [{"index": 1, "delta": {"content": "two "},
        "finish_reason": null}], "usage": {"prompt_tokens": 10, "completion_tokens": 1,
        "total_tokens": 11}})
    .to_string();
    c.event("", &running, &mut out);
    assert!(
        !c.usage_final(),
        "a usage before the answer is whole is a floor"
    );
    c.event("", &text(1, "two words here"), &mut out);
    assert!(c.usage().output > 1, "the count over the floor");
    assert!(!c.end(&mut Vec::new()), "a body ending now cuts choice 1");
    c.event("", &finish(1), &mut out);
    assert!(c.finished());
    c.event("", &usage, &mut out);
    assert!(c.usage_final());

    let mut one = StreamConverter::new(WireFormat::OpenAi, WireFormat::OpenAi, true, 10);
    one.event("", &text(0, "one "), &mut out);
    one.event("", &finish(0), &mut out);
    assert!(one.finished(), "n = 1: choice 0's finish");

    // Review finding (s18): a server that ignores `n` (Ollama) generates one choice; the
    // usage in a chunk of its own comes after every choice it generates, so with each one
    // started finished the answer is whole at the stream's end, that usage its price —
    // its body's end, or `[DONE]` (and the client gets no usage chunk of the gateway's).
    // Not at the usage itself (s19, see `a_choice_that_starts_after_a_usage_is_counted`).
    let ignored = || {
        let mut c =
            StreamConverter::new(WireFormat::OpenAi, WireFormat::OpenAi, true, 10).choices(3);
        let mut out = Vec::new();
        c.event("", &text(0, "one "), &mut out);
        c.event("", &finish(0), &mut out);
        assert!(!c.finished());
        c.event("", &usage, &mut out);
        c
    };
    let mut ended = ignored();
    assert!(!ended.finished(), "another choice may follow its usage");
    assert!(ended.end(&mut Vec::new()), "its body's end completes it");
    assert!(ended.finished() && ended.usage_final());
    assert_eq!(ended.usage().output, 1);
    let mut done = ignored();
    let mut tail = Vec::new();
    done.event("", "[DONE]", &mut tail);
    assert!(done.done() && done.finished() && done.usage_final());
    assert_eq!(tail, [frame(None, "[DONE]")]);
    assert_eq!(done.usage().output, 1);
}

/// Review finding (s18 final #4): an upstream that sends an `n` = 2 answer's choices one
/// after the other, a usage in a chunk of its own after each (a relay fanning `n` out into
/// n calls), had its answer whole at choice 0's usage: choice 1's text was passed on but
/// never counted, and a client leaving (or the shutdown) then settled a whole answer on
/// choice 0's figures. A usage after fewer choices started than asked makes the answer
/// whole only at the stream's end; a choice that starts after it is counted, a body
/// ending within it is a cut, and such an upstream's reports — each of one call, or of
/// every call so far: it does not say — are floors under the count of every choice's text.
#[test]
fn a_choice_that_starts_after_a_usage_is_counted() {
    let chunk = |choices: Value| {
        json!({"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m",
            "choices": choices})
        .to_string()
    };
    let text = |i: i64, t: &str| {
        chunk(json!([{"index": i, "delta": {"content": t}, "finish_reason": null}]))
    };
    let finish = |i: i64| chunk(json!([{"index": i, "delta": {}, "finish_reason": "stop"}]));
    let usage = |output: i64| {
        json!({"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m",
            "choices": [], "usage": {"prompt_tokens": 10, "completion_tokens": output,
            "total_tokens": 10 + output}})
        .to_string()
    };
    let second = "the second answer, told after the first one's usage ".repeat(8);
    let counted = estimate::count_text(&second);
    let sequential = |last: i64| {
        let mut c =
            StreamConverter::new(WireFormat::OpenAi, WireFormat::OpenAi, true, 10).choices(2);
        let mut out = Vec::new();
        c.event("", &text(0, "one "), &mut out);
        c.event("", &finish(0), &mut out);
        c.event("", &usage(2), &mut out);
        assert!(!c.finished(), "choice 1 may follow the usage");
        out.clear();
        c.event("", &text(1, &second), &mut out);
        assert!(String::from_utf8_lossy(&out.concat()).contains(&second));
        assert!(
            c.usage().output >= counted,
            "choice 1's text is counted: a client leaving now pays it ({} < {counted})",
            c.usage().output
        );
        assert!(!c.end(&mut Vec::new()), "a body ending now cuts choice 1");
        c.event("", &finish(1), &mut out);
        assert!(c.finished(), "both choices finished");
        out.clear();
        c.event("", &usage(last), &mut out);
        c.event("", "[DONE]", &mut out);
        assert!(c.done());
        (c, String::from_utf8_lossy(&out.concat()).into_owned())
    };
    // Each usage of one call: the count of both choices' text is charged, and told.
    let (c, told) = sequential(3);
    let charged = c.usage().output;
    assert!(charged >= counted, "{charged} < {counted}");
    assert!(!c.usage_final(), "the count, not a report");
    assert!(
        told.contains(&format!("\"completion_tokens\":{charged}")),
        "{told}"
    );
    // A usage of every call so far: the last is the most, and charged.
    let (c, _) = sequential(counted + 50);
    assert_eq!(c.usage().output, counted + 50);
}

/// After its own finish each choice of an `n` > 1 answer is whole, as choice 0 is: more of
/// it (text, a second finish) is neither passed on nor counted, while the choices still
/// streaming pass.
#[test]
fn text_of_a_finished_choice_is_neither_passed_on_nor_counted() {
    let chunk = |choices: Value| {
        json!({"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m",
            "choices": choices})
        .to_string()
    };
    let text = |i: i64, t: &str| {
        chunk(json!([{"index": i, "delta": {"content": t}, "finish_reason": null}]))
    };
    let finish = |i: i64| chunk(json!([{"index": i, "delta": {}, "finish_reason": "stop"}]));
    let mut out = Vec::new();
    let mut c = StreamConverter::new(WireFormat::OpenAi, WireFormat::OpenAi, false, 10).choices(2);
    c.event("", &text(0, "zero "), &mut out);
    c.event("", &text(1, "one "), &mut out);
    c.event("", &finish(1), &mut out);
    let counted = c.usage().output;
    out.clear();
    let more = " more words after its finish".repeat(20);
    c.event("", &text(1, &more), &mut out);
    c.event("", &finish(1), &mut out);
    assert!(out.is_empty(), "{out:?}");
    assert_eq!(c.usage().output, counted, "not counted");
    // Both in one chunk: choice 0, still streaming, passes alone.
    c.event(
        "",
        &chunk(
            json!([{"index": 0, "delta": {"content": "still "}, "finish_reason": null},
            {"index": 1, "delta": {"content": more}, "finish_reason": null}]),
        ),
        &mut out,
    );
    let passed = String::from_utf8_lossy(&out.concat()).to_string();
    assert!(
        passed.contains("still ") && !passed.contains("more words"),
        "{passed}"
    );
    assert!(!c.finished());
    c.event("", &finish(0), &mut out);
    assert!(c.finished());
}

/// Review finding (s18 final #5): a choice index outside the choices asked for (`n` or
/// more, or negative) never counted toward the finish, and after it its text passed to the
/// client uncounted, the usage its price: text the client kept free. After the finish such
/// a choice is no part of the answer: neither passed on nor counted, while the choices
/// asked for in the same chunk pass. Before it, it is passed on and counted (s19 attack
/// F1, `a_choice_numbered_wrongly_before_the_finish_reaches_the_client_and_is_counted`),
/// and counts toward no finish.
#[test]
fn a_choice_not_asked_for_is_neither_passed_on_nor_counted_after_the_finish() {
    let chunk = |choices: Value| {
        json!({"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m",
            "choices": choices})
        .to_string()
    };
    let text = |i: i64, t: &str| {
        chunk(json!([{"index": i, "delta": {"content": t}, "finish_reason": null}]))
    };
    let finish = |i: i64| chunk(json!([{"index": i, "delta": {}, "finish_reason": "stop"}]));
    let free = " free words of a choice nobody asked for".repeat(20);
    let passed = |out: &[Bytes]| String::from_utf8_lossy(&out.concat()).into_owned();
    let mut out = Vec::new();
    let mut c = StreamConverter::new(WireFormat::OpenAi, WireFormat::OpenAi, false, 10).choices(2);
    c.event("", &text(0, "zero "), &mut out);
    let counted = c.usage().output;
    for i in [2, 7, -1] {
        c.event("", &finish(i), &mut out);
    }
    assert!(!c.finished(), "counts toward no finish");
    c.event("", &text(2, &free), &mut out);
    assert!(passed(&out).contains("free words"), "{}", passed(&out));
    assert!(c.usage().output > counted, "counted before the finish");
    c.event("", &finish(0), &mut out);
    // The chunk that finishes the answer: what it says of such a choice passes still.
    out.clear();
    c.event(
        "",
        &chunk(
            json!([{"index": 1, "delta": {"content": "one "}, "finish_reason": "stop"},
            {"index": 2, "delta": {"content": "last "}, "finish_reason": null}]),
        ),
        &mut out,
    );
    assert!(c.finished());
    assert!(passed(&out).contains("last "), "{}", passed(&out));
    // After the finish: neither passed on nor counted, with `n` = 1 too.
    let mut one = StreamConverter::new(WireFormat::OpenAi, WireFormat::OpenAi, false, 10);
    one.event("", &text(0, "zero "), &mut out);
    one.event("", &finish(0), &mut out);
    let counted = (c.usage().output, one.usage().output);
    out.clear();
    for i in [1, -1] {
        c.event("", &text(i + 2, &free), &mut out);
        one.event("", &text(i, &free), &mut out);
    }
    assert!(out.is_empty(), "{}", passed(&out));
    assert_eq!(
        (c.usage().output, one.usage().output),
        counted,
        "not counted"
    );
}

/// Chunks of an OpenAI stream's choices, a usage in a chunk of its own, and what the
/// client was told (s19 attack tests below).
mod choices_of {
    use super::*;

    pub fn chunk(choices: Value) -> String {
        json!({"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m",
            "choices": choices})
        .to_string()
    }
    pub fn text(i: i64, t: &str) -> String {
        chunk(json!([{"index": i, "delta": {"content": t}, "finish_reason": null}]))
    }
    pub fn finish(i: i64) -> String {
        chunk(json!([{"index": i, "delta": {}, "finish_reason": "stop"}]))
    }
    pub fn usage_figures(output: i64) -> Value {
        json!({"prompt_tokens": 10, "completion_tokens": output, "total_tokens": 10 + output})
    }
    pub fn usage(output: i64) -> String {
        json!({"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m",
            "choices": [], "usage": usage_figures(output)})
        .to_string()
    }
    pub fn passed(out: &[Bytes]) -> String {
        String::from_utf8_lossy(&out.concat()).into_owned()
    }
    /// The `completion_tokens` of the last usage the client was told.
    pub fn last_told(out: &[Bytes]) -> Option<i64> {
        out.iter()
            .rev()
            .filter_map(|f| {
                let s = String::from_utf8_lossy(f);
                let data = s.trim().strip_prefix("data: ")?.to_string();
                let v: Value = serde_json::from_str(&data).ok()?;
                v["usage"]["completion_tokens"].as_i64()
            })
            .next()
    }
}

/// Review finding (s19 attack F1): an `n` = 1 upstream that numbers its choices wrongly
/// (LiteLLM in front of Claude with thinking: the reasoning on index 0, the answer's text
/// on index 1; TGI before 1.4.4: the token's position) had its answer dropped from the
/// first byte, the client paying the usage for nothing. Before the finish such a choice
/// is passed on and counted; only after it is it no part of the answer.
#[test]
fn a_choice_numbered_wrongly_before_the_finish_reaches_the_client_and_is_counted() {
    use choices_of::*;
    let answer = "the answer's text, on the wrong index ".repeat(10);
    let counted = estimate::count_text(&answer);
    for finish_on in [0, 1] {
        let mut c = StreamConverter::new(WireFormat::OpenAi, WireFormat::OpenAi, true, 10);
        let mut out = Vec::new();
        c.event(
            "",
            &chunk(json!([{"index": 0, "delta": {"reasoning_content": "hmm "},
                "finish_reason": null}])),
            &mut out,
        );
        c.event("", &text(1, &answer), &mut out);
        assert!(passed(&out).contains(&answer), "{}", passed(&out));
        assert!(
            c.usage().output >= counted,
            "counted: {} < {counted}",
            c.usage().output
        );
        c.event("", &finish(finish_on), &mut out);
        c.event("", &usage(counted + 5), &mut out);
        c.event("", "[DONE]", &mut out);
        assert!(c.done());
        assert_eq!(c.usage().output, counted + 5);
        assert!(passed(&out).contains(&answer));
    }
}

/// Review finding (s19 attack F3): a server that ignores `n` = 2 (Ollama, or a relay adding
/// its own usage chunk) sending its usage, then a lower one, then `[DONE]` was charged the
/// lower one as exact; the most of the reports is charged, as with `n` = 1, and the client
/// told it.
#[test]
fn a_lower_usage_after_an_answer_whole_at_its_end_does_not_lower_the_price() {
    use choices_of::*;
    for end in ["[DONE]", ""] {
        let mut c =
            StreamConverter::new(WireFormat::OpenAi, WireFormat::OpenAi, true, 10).choices(2);
        let mut out = Vec::new();
        c.event("", &text(0, "one "), &mut out);
        c.event("", &finish(0), &mut out);
        c.event("", &usage(800), &mut out);
        // A choice not asked for there is no part of the answer: its text would pass
        // free of the usage that prices it.
        let seen = out.len();
        c.event("", &text(5, " free words"), &mut out);
        assert_eq!(out.len(), seen, "{}", passed(&out));
        c.event("", &usage(0), &mut out);
        if end.is_empty() {
            assert!(c.end(&mut out));
        } else {
            c.event("", end, &mut out);
        }
        assert!(c.done() || end.is_empty());
        assert_eq!(c.usage().output, 800, "ended by {end:?}");
        assert!(c.usage_final());
        assert_eq!(last_told(&out), Some(800), "{}", passed(&out));
    }
    // The usage that made the answer whole at its end unusable: a running figure before
    // it is a floor under the count, not the price.
    let mut c = StreamConverter::new(WireFormat::OpenAi, WireFormat::OpenAi, true, 10).choices(2);
    let mut out = Vec::new();
    c.event(
        "",
        &json!({"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m",
            "choices": [{"index": 0, "delta": {"content": "many words of the answer here "},
            "finish_reason": null}], "usage": usage_figures(1)})
        .to_string(),
        &mut out,
    );
    c.event("", &finish(0), &mut out);
    c.event(
        "",
        &json!({"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m",
            "choices": [], "usage": {"prompt_tokens": 10}})
        .to_string(),
        &mut out,
    );
    c.event("", "[DONE]", &mut out);
    assert!(!c.usage_final(), "a running figure is no price");
    assert!(c.usage().output > 1);
}

/// Review finding (s19 attack F2): in an answer reported part by part (`parted`) each report
/// before the finish replaced the one before, so an earlier, higher one (a call's hidden
/// reasoning) was lost; every report is a floor.
#[test]
fn an_earlier_higher_report_of_a_parted_answer_is_a_floor() {
    use choices_of::*;
    let mut c = StreamConverter::new(WireFormat::OpenAi, WireFormat::OpenAi, true, 10).choices(2);
    let mut out = Vec::new();
    c.event("", &text(0, "zero "), &mut out);
    c.event("", &finish(0), &mut out);
    c.event("", &usage(500), &mut out);
    c.event("", &text(1, "one "), &mut out);
    c.event("", &finish(1), &mut out);
    c.event("", &usage(20), &mut out);
    c.event("", "[DONE]", &mut out);
    assert!(c.done());
    assert_eq!(c.usage().output, 500);
    assert_eq!(last_told(&out), Some(500), "{}", passed(&out));
}

/// Review finding (s19 attack F5): a parted answer whose last usage rides on its last finish
/// chunk was charged the count over it, and the client told only the usage.
#[test]
fn a_parted_answer_whose_last_usage_rides_on_the_finish_is_told_its_charge() {
    use choices_of::*;
    let second = "the second answer, told after the first one's usage ".repeat(8);
    let mut c = StreamConverter::new(WireFormat::OpenAi, WireFormat::OpenAi, true, 10).choices(2);
    let mut out = Vec::new();
    c.event("", &text(0, "zero "), &mut out);
    c.event("", &finish(0), &mut out);
    c.event("", &usage(2), &mut out);
    c.event("", &text(1, &second), &mut out);
    c.event(
        "",
        &json!({"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m",
            "choices": [{"index": 1, "delta": {}, "finish_reason": "stop"}],
            "usage": usage_figures(3)})
        .to_string(),
        &mut out,
    );
    c.event("", "[DONE]", &mut out);
    let charged = c.usage().output;
    assert!(charged > 3);
    assert_eq!(last_told(&out), Some(charged), "{}", passed(&out));
}

/// Review finding (s20 G1): with `n` > 1, a report made before the usage in a chunk of its
/// own that made the answer whole at its end (or `parted`) was replaced by it: a report on
/// choice 0's finish chunk, then a lower one, was charged the lower one. Every report of
/// an `n` > 1 answer is a floor: the most of them counts.
#[test]
fn a_report_on_a_finish_chunk_before_a_lower_usage_of_its_own_is_not_lost() {
    use choices_of::*;
    let finish_with = |i: i64, output: i64| {
        json!({"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m",
            "choices": [{"index": i, "delta": {}, "finish_reason": "stop"}],
            "usage": usage_figures(output)})
        .to_string()
    };
    // A relay fanning `n` = 2 out: call 0's report on its finish chunk, then a lower usage
    // of its own (the relay's), then call 1.
    let mut c = StreamConverter::new(WireFormat::OpenAi, WireFormat::OpenAi, true, 10).choices(2);
    let mut out = Vec::new();
    c.event("", &text(0, "zero "), &mut out);
    c.event("", &finish_with(0, 500), &mut out);
    c.event("", &usage(20), &mut out);
    c.event("", &text(1, "one "), &mut out);
    c.event("", &finish(1), &mut out);
    c.event("", &usage(30), &mut out);
    c.event("", "[DONE]", &mut out);
    assert!(c.done());
    assert_eq!(c.usage().output, 500, "{}", passed(&out));
    assert_eq!(last_told(&out), Some(500), "{}", passed(&out));
}

/// CHECKS L2 at the converter: an ordinary same-format stream with one report — `n` = 1,
/// `n` = 2 with both choices, `n` = 2 from a server that ignores `n` (Ollama) — reaches
/// the client byte for byte, with no usage chunk of the gateway's (s20: the rules for
/// usages of an answer whole at its end, G2, and the gateway's own chunk, G4, touch none).
#[test]
fn an_ordinary_stream_with_one_report_passes_byte_for_byte() {
    use choices_of::*;
    for (n, events) in [
        (
            1,
            vec![text(0, "zero "), finish(0), usage(2), "[DONE]".to_string()],
        ),
        (
            2,
            vec![
                text(0, "zero "),
                text(1, "one "),
                finish(0),
                finish(1),
                usage(4),
                "[DONE]".to_string(),
            ],
        ),
        (
            2,
            vec![text(0, "zero "), finish(0), usage(2), "[DONE]".to_string()],
        ),
    ] {
        let mut c =
            StreamConverter::new(WireFormat::OpenAi, WireFormat::OpenAi, true, 10).choices(n);
        let mut out = Vec::new();
        for e in &events {
            c.event("", e, &mut out);
        }
        assert!(c.done());
        let sent: Vec<Bytes> = events.iter().map(|e| frame(None, e)).collect();
        assert_eq!(out, sent, "n = {n}: {}", passed(&out));
    }
}
