//! The converter: its accounting, its limits, and when a stream is complete and what it costs,
//! format by format.

mod choice_reports;
mod choices;
mod formats;
mod limits;
mod reports;
mod unvouched;

/// Chunks of an OpenAI stream's choices, a usage in a chunk of its own, and what the
/// client was told (the s19 attack tests of `choices` and `choice_reports`).
mod choices_of {
    use bytes::Bytes;
    use serde_json::{json, Value};

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
