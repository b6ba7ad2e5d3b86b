//! The converter's limits: the text it keeps to count, the bytes it holds for the client.

use serde_json::json;

use crate::error::WireFormat;
use crate::quota::estimate;
use crate::upstream::providers::translate::stream::accounting::COUNT_EVERY;
use crate::upstream::providers::translate::stream::StreamConverter;

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
