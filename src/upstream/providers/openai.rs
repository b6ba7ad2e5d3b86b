//! The OpenAI wire format (also vLLM, Ollama, llama.cpp): shaping the forwarded request,
//! reading usage from answers and stream chunks.

use std::borrow::Cow;

use serde::Deserialize;
use serde_json::{Map, Value};

use crate::quota::pricing::Usage;

/// Top-level body fields some SDKs and proxies use to pick an upstream or a key. Sluice
/// routes only by its config, so they are dropped rather than forwarded.
pub const ROUTING_FIELDS: &[&str] = &[
    "api_base",
    "base_url",
    "api_key",
    "api_version",
    "extra_headers",
    "user_config",
    "organization",
];

/// The body sent upstream: the client's fields, the upstream's model name, the reserved
/// output cap, and (for streams) a request for the usage chunk.
pub fn shape_request(
    body: &Map<String, Value>,
    upstream_model: &str,
    cap: Option<(&'static str, i64)>,
    stream: bool,
) -> Vec<u8> {
    let mut out = body.clone();
    out.insert("model".into(), Value::String(upstream_model.to_string()));
    if let Some((field, cap)) = cap {
        out.remove("max_tokens");
        out.remove("max_completion_tokens");
        out.insert(field.into(), Value::from(cap));
    }
    if stream {
        let opts = out
            .entry("stream_options")
            .or_insert_with(|| Value::Object(Map::new()));
        if let Value::Object(o) = opts {
            o.insert("include_usage".into(), Value::Bool(true));
        }
    }
    serde_json::to_vec(&Value::Object(out)).unwrap_or_default()
}

#[derive(Debug, Deserialize, Default)]
struct WireUsage {
    #[serde(default)]
    prompt_tokens: Option<i64>,
    #[serde(default)]
    completion_tokens: Option<i64>,
    #[serde(default)]
    prompt_tokens_details: Option<PromptDetails>,
}

#[derive(Debug, Deserialize, Default)]
struct PromptDetails {
    #[serde(default)]
    cached_tokens: Option<i64>,
}

impl WireUsage {
    fn usage(&self) -> Usage {
        Usage {
            input: self.prompt_tokens.unwrap_or(0),
            cached_input: self
                .prompt_tokens_details
                .as_ref()
                .and_then(|d| d.cached_tokens)
                .unwrap_or(0),
            output: self.completion_tokens.unwrap_or(0),
        }
    }
}

#[derive(Debug, Deserialize)]
struct Answer {
    #[serde(default)]
    usage: Option<WireUsage>,
    #[serde(default)]
    model: Option<String>,
}

/// Usage and model of a non-streamed answer; `None` if the body is not a JSON answer.
pub fn answer_usage(body: &[u8]) -> Option<(Option<Usage>, Option<String>)> {
    let a: Answer = serde_json::from_slice(body).ok()?;
    Some((a.usage.map(|u| u.usage()), a.model))
}

#[derive(Debug, Deserialize)]
struct Chunk<'a> {
    #[serde(default, borrow)]
    choices: Vec<ChunkChoice<'a>>,
    #[serde(default)]
    usage: Option<WireUsage>,
}

#[derive(Debug, Deserialize)]
struct ChunkChoice<'a> {
    #[serde(default, borrow)]
    delta: Option<Delta<'a>>,
    #[serde(default, borrow)]
    text: Option<Cow<'a, str>>,
}

#[derive(Debug, Deserialize)]
struct Delta<'a> {
    #[serde(default, borrow)]
    content: Option<Cow<'a, str>>,
    #[serde(default)]
    tool_calls: Option<Value>,
}

/// What the gateway needs from one stream chunk.
#[derive(Debug, Default)]
pub struct ChunkInfo {
    pub usage: Option<Usage>,
    /// The chunk carries only usage (`choices: []`): dropped if the client did not ask for it.
    pub usage_only: bool,
}

/// Reads one `data:` payload; appends generated text to `text` (for counting the output
/// of a stream that ends without usage). `None` if the payload is not a chunk.
pub fn inspect_chunk(data: &str, text: &mut String) -> Option<ChunkInfo> {
    let c: Chunk<'_> = serde_json::from_str(data).ok()?;
    for ch in &c.choices {
        if let Some(t) = &ch.text {
            text.push_str(t);
        }
        if let Some(d) = &ch.delta {
            if let Some(t) = &d.content {
                text.push_str(t);
            }
            if let Some(tc) = &d.tool_calls {
                text.push_str(&tc.to_string());
            }
        }
    }
    let usage = c.usage.map(|u| u.usage());
    Some(ChunkInfo {
        usage_only: c.choices.is_empty() && usage.is_some(),
        usage,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn shapes_and_reads() {
        let body =
            json!({"model": "alias", "messages": [], "max_tokens": 10, "api_base": "http://evil"});
        let Value::Object(mut m) = body else {
            unreachable!()
        };
        for f in ROUTING_FIELDS {
            m.remove(*f);
        }
        let out: Value =
            serde_json::from_slice(&shape_request(&m, "gpt-x", Some(("max_tokens", 10)), true))
                .unwrap();
        assert_eq!(out["model"], "gpt-x");
        assert_eq!(out["stream_options"]["include_usage"], true);
        assert!(out.get("api_base").is_none());

        let mut text = String::new();
        let info =
            inspect_chunk(r#"{"choices":[{"delta":{"content":"Hel"}}]}"#, &mut text).unwrap();
        assert!(info.usage.is_none());
        assert_eq!(text, "Hel");
        let info = inspect_chunk(
            r#"{"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":0}}"#,
            &mut text,
        )
        .unwrap();
        assert!(info.usage_only);
        assert_eq!(info.usage.unwrap().output, 0);
    }
}
