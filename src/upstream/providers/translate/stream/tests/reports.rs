//! The usage reports of a stream, side by side and part by part: a floor before the finish,
//! the price with or after it (the most of such reports), zeros a figure, cache writes
//! split by lifetime only where a report split them.

use serde_json::{json, Value};

use super::formats::{through, TEXT};
use crate::error::WireFormat;
use crate::quota::pricing;
use crate::upstream::providers::canonical::{self, Event, Reported};
use crate::upstream::providers::translate::stream::StreamConverter;
use crate::upstream::providers::Format;

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
