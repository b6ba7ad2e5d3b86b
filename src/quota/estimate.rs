//! Counting tokens with a real BPE tokenizer (o200k_base, see `tokenizer`): the input side
//! of a reservation, and the output of a stream the client left before the upstream's usage
//! arrived. One tokenizer is built at start and shared read-only (no lock per request).

use std::cell::Cell;
use std::sync::OnceLock;

use serde_json::{Map, Value};

use super::tokenizer::Counter;

static BPE: OnceLock<Option<Counter>> = OnceLock::new();

/// Compiles the tokenizer's pattern; called once at start so the first request does not
/// pay for it.
pub fn init() {
    if bpe().is_none() {
        // Compiled in and checked by the tests, so a build went wrong: say so, since every
        // reservation now counts bytes / 3, below o200k's count for rare scripts.
        tracing::error!("the o200k tokenizer is unusable; input counted as bytes / 3");
    }
}

fn bpe() -> Option<&'static Counter> {
    BPE.get_or_init(Counter::o200k).as_ref()
}

thread_local! {
    /// While `counting_digits` runs on this thread, the ASCII digits of the text counted
    /// so far; `None` outside it. Counting is synchronous (nothing awaits inside), so the
    /// scope is exactly one call's.
    static DIGITS: Cell<Option<i64>> = const { Cell::new(None) };
}

/// `count`'s result and the ASCII digits of every text it counted (`count_text`): what a
/// tokenizer that makes each digit a token (Gemini's) counts beyond o200k, which takes
/// digits three at a time (`pipeline::long_context::beyond_the_estimate`). Only the text
/// the estimate counts: an image's or a document's payload is not read for digits.
pub fn counting_digits<T>(count: impl FnOnce() -> T) -> (T, i64) {
    let outer = DIGITS.with(|d| d.replace(Some(0)));
    let out = count();
    let digits = DIGITS.with(|d| d.replace(outer)).unwrap_or(0);
    if let Some(before) = outer {
        DIGITS.with(|d| d.set(Some(before.saturating_add(digits))));
    }
    (out, digits)
}

/// Tokens in a piece of text. Falls back to a conservative bytes/3 if the tokenizer could
/// not be built (it is compiled in, so this does not happen in practice).
pub fn count_text(text: &str) -> i64 {
    DIGITS.with(|d| {
        if let Some(n) = d.get() {
            let digits = text.bytes().filter(u8::is_ascii_digit).count();
            d.set(Some(
                n.saturating_add(i64::try_from(digits).unwrap_or(i64::MAX)),
            ));
        }
    });
    match bpe() {
        Some(b) => b.count(text) as i64,
        None => (text.len() as i64 + 2) / 3,
    }
}

/// Per-message framing tokens, as OpenAI documents for its chat format.
const PER_MESSAGE: i64 = 4;
const PER_REPLY: i64 = 3;
/// What the estimate counts an image at (a high-detail 2048 × 4096 image on gpt-4o): rate
/// windows and the context check use it; the money path adds what each route's provider
/// may bill beyond it (`images::Images::beyond_estimate`).
pub(crate) const PER_IMAGE: i64 = 1105;

/// Counts every string in a JSON value (tool arguments and schemas, `system`, a
/// `tool_use` input) as text: a part-shaped object here is no image or document to the
/// provider (`parts`), so its payload is text too.
pub fn count_value(v: &Value) -> i64 {
    match v {
        Value::String(s) => count_text(s),
        Value::Array(items) => items.iter().map(count_value).sum(),
        Value::Object(map) => fields(map, |_, v| count_value(v)),
        Value::Number(n) => count_number(n),
        Value::Bool(_) => 1,
        Value::Null => 0,
    }
}

/// A JSON number as the provider's tokenizer reads it: its text as written, which for a
/// long one is many tokens (o200k takes up to three digits in one, Gemini's one each —
/// `counting_digits` sees them). Formatted on the stack: without serde_json's
/// `arbitrary_precision` a number is an i64, a u64 or an f64, at most 24 bytes written.
fn count_number(n: &serde_json::Number) -> i64 {
    use std::io::Write;
    let mut buf = [0u8; 32];
    let mut rest = &mut buf[..];
    match write!(rest, "{n}") {
        Ok(()) => {
            let len = 32 - rest.len();
            count_text(std::str::from_utf8(&buf[..len]).unwrap_or_default())
        }
        Err(_) => count_text(&n.to_string()),
    }
}

/// Counts a message or Responses input item: the parts at its content-block positions
/// (`parts::holds_parts`) with images at `PER_IMAGE` and documents without their payload
/// (`documents`), everything else as text.
pub fn count_message(m: &Value) -> i64 {
    match m {
        Value::Object(item) => fields(item, |k, v| {
            if super::parts::holds_parts(item, k) {
                count_parts(v)
            } else {
                count_value(v)
            }
        }),
        _ => count_value(m),
    }
}

fn count_parts(v: &Value) -> i64 {
    match v {
        Value::Array(parts) => parts.iter().map(count_part).sum(),
        _ => count_value(v),
    }
}

fn count_part(p: &Value) -> i64 {
    match p {
        Value::Object(part) => count_object(part),
        _ => count_value(p),
    }
}

fn count_object(part: &Map<String, Value>) -> i64 {
    if super::parts::is_image(part) {
        return PER_IMAGE;
    }
    // The parts a part holds (a tool result's, a content document's, a fetched document)
    // are counted as parts, what is around them as text.
    if let Some(around) = super::parts::without_nested(part) {
        let inner: i64 = super::parts::nested(part)
            .into_iter()
            .map(count_object)
            .sum();
        return count_object(&around) + inner;
    }
    // A document's bytes or reference are sized by `documents`, not counted as text:
    // only its title, context, file name or plain-text source are.
    if let Some(text) = super::documents::without_payload(part) {
        return fields(&text, |_, v| count_value(v));
    }
    fields(part, |_, v| count_value(v))
}

/// An object's fields: each key as text, each value by `value`. A key is no framing the
/// provider drops: a tool's or a schema's property names reach the prompt as written, so
/// a long one is as many tokens as the same text in a description (s26 final attack #1:
/// keys counted at most 2 tokens hid a 20 000-token property name from the reservation).
fn fields(map: &Map<String, Value>, value: impl Fn(&str, &Value) -> i64) -> i64 {
    map.iter().map(|(k, v)| count_text(k) + value(k, v)).sum()
}

/// Input tokens of an OpenAI chat or Anthropic Messages request: messages plus tool
/// definitions.
pub fn chat_input(messages: &[Value], tools: Option<&Value>) -> i64 {
    let msgs: i64 = messages
        .iter()
        .map(|m| PER_MESSAGE + count_message(m))
        .sum();
    msgs + PER_REPLY + tools.map(count_value).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn counts_with_the_real_tokenizer() {
        assert_eq!(count_text("hello world"), 2);
        let msgs = vec![json!({"role": "user", "content": "hello world"})];
        let n = chat_input(&msgs, None);
        assert!((8..=12).contains(&n), "{n}");
        let img = vec![
            json!({"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:…"}}]}),
        ];
        assert!(chat_input(&img, None) > PER_IMAGE);
    }

    #[test]
    fn the_digits_of_the_counted_text_are_counted_and_an_images_are_not() {
        let msgs = vec![
            json!({"role": "user", "content": [{"type": "text", "text": "call 555-0123 now"},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,0123456789"}}]}),
            json!({"role": "assistant", "content": "٣ is no ASCII digit; 42 is two"}),
        ];
        let (tokens, digits) = counting_digits(|| chat_input(&msgs, None));
        assert_eq!(tokens, chat_input(&msgs, None));
        assert_eq!(digits, 7 + 2);
        // Outside a scope nothing is kept; a nested scope's digits are its outer's too.
        let (_, outer) = counting_digits(|| {
            let (_, inner) = counting_digits(|| count_text("12345"));
            assert_eq!(inner, 5);
            count_text("678")
        });
        assert_eq!(outer, 8);
        assert_eq!(counting_digits(|| count_text("no digits")).1, 0);
    }

    #[test]
    fn a_part_outside_the_content_is_text() {
        let big = "Zq9xW3".repeat(2_000);
        let shaped = [
            json!({"type": "image", "source": {"type": "base64", "data": big}}),
            json!({"type": "input_file", "file_data": big}),
            json!({"type": "document", "source": {"type": "url", "url": big}}),
        ];
        for part in shaped {
            let at_content = count_message(&json!({"role": "user", "content": [part]}));
            let as_input = count_message(&json!({"role": "assistant",
                "content": [{"type": "tool_use", "id": "t", "name": "f", "input": part}]}));
            assert!(at_content <= PER_IMAGE + 20, "{part}: {at_content}");
            assert!(as_input > count_text(&big), "{part}: {as_input}");
            assert!(count_value(&part) > count_text(&big), "{part}");
        }
        // A tool result's content and a Responses tool output hold parts.
        let image = json!({"type": "image", "source": {"type": "base64", "data": big}});
        let result = json!({"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "t", "content": [image]}]});
        assert!(count_message(&result) < PER_IMAGE + 30);
        let output = json!({"type": "function_call_output", "call_id": "c",
            "output": [{"type": "input_file", "file_data": big}]});
        assert!(count_message(&output) < 30);
    }

    /// The blocks of a content document (`source.content`) and a fetched document echoed
    /// back in a `web_fetch_tool_result` are parts: an image counted at `PER_IMAGE`, a
    /// PDF's bytes left to `documents` — not their base64 counted as text.
    #[test]
    fn a_content_documents_blocks_and_a_fetched_document_are_parts() {
        let big = "Zq9xW3".repeat(2_000);
        let content = json!({"role": "user", "content": [{"type": "document", "title": "T",
            "source": {"type": "content", "content": [{"type": "text", "text": "t"},
                {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": big}}]}}]});
        let n = count_message(&content);
        assert!((PER_IMAGE..PER_IMAGE + 30).contains(&n), "{n}");
        let fetched = json!({"role": "assistant", "content": [{"type": "web_fetch_tool_result",
            "tool_use_id": "s", "content": {"type": "web_fetch_result", "url": "https://x/a.pdf",
                "content": {"type": "document", "source": {"type": "base64",
                    "media_type": "application/pdf", "data": big}}}}]});
        assert!(count_message(&fetched) < 40, "{}", count_message(&fetched));
        // A fetched page as text is text.
        let text = json!({"role": "assistant", "content": [{"type": "web_fetch_tool_result",
            "tool_use_id": "s", "content": {"type": "web_fetch_result", "url": "https://x",
                "content": {"type": "document", "source": {"type": "text", "data": big}}}}]});
        assert!(count_message(&text) > count_text(&big));
    }
}
