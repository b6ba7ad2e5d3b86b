//! Counting tokens with a real BPE tokenizer (o200k_base, see `tokenizer`): the input side
//! of a reservation, and the output of a stream the client left before the upstream's usage
//! arrived. One tokenizer is built at start and shared read-only (no lock per request).

use std::sync::OnceLock;

use serde_json::Value;

use super::tokenizer::Counter;

static BPE: OnceLock<Option<Counter>> = OnceLock::new();

/// Builds the tokenizer; called once at start so the first request does not pay for it.
pub fn init() {
    let _ = bpe();
    // Building the counter builds (and drops) `tiktoken-rs`'s tables: ~200 000 small
    // allocations that glibc would keep as free heap. Hand those pages back once.
    crate::ops::memory::release_free();
}

fn bpe() -> Option<&'static Counter> {
    BPE.get_or_init(Counter::o200k).as_ref()
}

/// Tokens in a piece of text. Falls back to a conservative bytes/3 if the tokenizer could
/// not be built (it is compiled in, so this does not happen in practice).
pub fn count_text(text: &str) -> i64 {
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

/// Counts every string in a JSON value (message content, tool arguments, tool schemas);
/// images at `PER_IMAGE`, documents without their payload (`documents`).
pub fn count_value(v: &Value) -> i64 {
    match v {
        Value::String(s) => count_text(s),
        Value::Array(items) => items.iter().map(count_value).sum(),
        Value::Object(map) => {
            let is_image = matches!(
                map.get("type").and_then(Value::as_str),
                Some("image_url" | "image" | "input_image")
            );
            if is_image {
                return PER_IMAGE;
            }
            // A document's bytes or reference are sized by `documents`, not counted as
            // text: only its title, context, file name or plain-text source are.
            if let Some(text) = super::documents::without_payload(map) {
                return text
                    .iter()
                    .map(|(k, v)| count_text(k).min(2) + count_value(v))
                    .sum();
            }
            map.iter()
                .map(|(k, v)| count_text(k).min(2) + count_value(v))
                .sum()
        }
        Value::Number(_) | Value::Bool(_) => 1,
        Value::Null => 0,
    }
}

/// Input tokens of an OpenAI chat request: messages plus tool definitions.
pub fn chat_input(messages: &[Value], tools: Option<&Value>) -> i64 {
    let msgs: i64 = messages.iter().map(|m| PER_MESSAGE + count_value(m)).sum();
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
}
