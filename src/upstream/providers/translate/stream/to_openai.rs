//! An Anthropic stream for an OpenAI client: each `tool_use` block is the next tool-call
//! index, text deltas are content deltas, `message_delta` gives the finish reason, and the
//! usage chunk (when the client asked for it) carries Anthropic's figures.

use std::collections::HashMap;

use bytes::Bytes;
use serde_json::{json, Map, Value};

use super::{frame, StreamConverter};
use crate::upstream::providers::translate::response::{openai_error_type, openai_finish};

#[derive(Default)]
pub(super) struct State {
    id: String,
    model: String,
    created: i64,
    /// Anthropic block index → OpenAI tool-call index.
    tools: HashMap<i64, i64>,
    next_tool: i64,
}

impl State {
    fn chunk(&self, choice: Value) -> Bytes {
        frame(None, &json!({"id": self.id, "object": "chat.completion.chunk", "created": self.created, "model": self.model,
            "choices": [choice]}).to_string())
    }

    fn delta(&self, delta: Value) -> Bytes {
        self.chunk(json!({"index": 0, "delta": delta, "logprobs": null, "finish_reason": null}))
    }
}

impl StreamConverter {
    pub(super) fn anthropic_to_openai(&mut self, data: &str, out: &mut Vec<Bytes>) {
        let Ok(v) = serde_json::from_str::<Value>(data) else {
            return;
        };
        let kind = self.note_anthropic_event(&v).to_string();
        let s = &mut self.openai_out;
        match kind.as_str() {
            "message_start" => {
                let text = |p: &str| {
                    v.pointer(p)
                        .and_then(Value::as_str)
                        .unwrap_or("")
                        .to_string()
                };
                s.id = text("/message/id");
                s.model = text("/message/model");
                s.created = chrono::Utc::now().timestamp();
                out.push(s.delta(json!({"role": "assistant", "content": ""})));
            }
            "content_block_start"
                if v.pointer("/content_block/type").and_then(Value::as_str) == Some("tool_use") =>
            {
                let slot = s.next_tool;
                s.next_tool += 1;
                s.tools
                    .insert(v.get("index").and_then(Value::as_i64).unwrap_or(0), slot);
                let b = &v["content_block"];
                out.push(s.delta(
                    json!({"tool_calls": [{"index": slot, "id": b["id"], "type": "function",
                    "function": {"name": b["name"], "arguments": ""}}]}),
                ));
            }
            "content_block_delta" => {
                if let Some(t) = v.pointer("/delta/text").and_then(Value::as_str) {
                    out.push(s.delta(json!({"content": t})));
                } else if let Some(p) = v.pointer("/delta/partial_json").and_then(Value::as_str) {
                    let block = v.get("index").and_then(Value::as_i64).unwrap_or(0);
                    let slot = s.tools.get(&block).copied().unwrap_or(0);
                    out.push(s.delta(
                        json!({"tool_calls": [{"index": slot, "function": {"arguments": p}}]}),
                    ));
                }
            }
            "message_delta" => {
                let reason = v
                    .pointer("/delta/stop_reason")
                    .and_then(Value::as_str)
                    .unwrap_or("end_turn");
                let mut choice = Map::new();
                choice.insert("index".into(), json!(0));
                choice.insert("delta".into(), json!({}));
                choice.insert("logprobs".into(), Value::Null);
                openai_finish(
                    &mut choice,
                    reason,
                    v.pointer("/delta/stop_sequence").unwrap_or(&Value::Null),
                );
                out.push(s.chunk(Value::Object(choice)));
            }
            "message_stop" => {
                if self.include_usage {
                    let u = self.usage();
                    let s = &self.openai_out;
                    out.push(frame(None, &json!({"id": s.id, "object": "chat.completion.chunk", "created": s.created,
                        "model": s.model, "choices": [], "usage": {"prompt_tokens": u.input, "completion_tokens": u.output,
                        "total_tokens": u.input.saturating_add(u.output), "prompt_tokens_details": {"cached_tokens": u.cached_input}}}).to_string()));
                }
                out.push(frame(None, "[DONE]"));
            }
            "error" => {
                let e = v.get("error").unwrap_or(&Value::Null);
                let t = e.get("type").and_then(Value::as_str).unwrap_or("api_error");
                let message = e
                    .get("message")
                    .and_then(Value::as_str)
                    .unwrap_or("The upstream failed mid-stream.");
                out.push(frame(
                    None,
                    &json!({"error": {"message": message, "type": openai_error_type(t),
                    "param": null, "code": t}})
                    .to_string(),
                ));
            }
            _ => {}
        }
    }
}
