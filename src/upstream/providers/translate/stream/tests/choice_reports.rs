//! The usages of an OpenAI answer of `n` choices whole at its end (a server that ignores
//! `n`) or reported part by part (`parted`): the most of them is charged, and the client
//! told it; an ordinary stream with one report passes byte for byte.

use bytes::Bytes;
use serde_json::json;

use super::choices_of;
use crate::error::WireFormat;
use crate::upstream::providers::translate::stream::{frame, StreamConverter};

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
