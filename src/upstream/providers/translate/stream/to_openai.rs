//! An Anthropic stream for an OpenAI client: each `tool_use` block is the next tool-call
//! index, text deltas are content deltas, `message_delta` gives the finish reason, and the
//! usage chunk (when the client asked for it) carries Anthropic's figures.

use std::collections::HashMap;

use bytes::Bytes;
use serde_json::{json, Map, Value};

use super::shape::{self, Body, Corrupt};
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
    pub(super) fn anthropic_to_openai(
        &mut self,
        data: &str,
        out: &mut Vec<Bytes>,
    ) -> Result<(), Corrupt> {
        let e = shape::anthropic_event(data)?;
        self.note_anthropic_event(&e);
        let s = &mut self.openai_out;
        match &e.body {
            Body::MessageStart(m) => {
                s.id = m.id.clone().unwrap_or_default();
                s.model = m.model.clone().unwrap_or_default();
                s.created = chrono::Utc::now().timestamp();
                out.push(s.delta(json!({"role": "assistant", "content": ""})));
            }
            Body::BlockStart { index, block } if block.kind == "tool_use" => {
                let slot = s.next_tool;
                s.next_tool += 1;
                s.tools.insert(*index, slot);
                out.push(s.delta(
                    json!({"tool_calls": [{"index": slot, "id": block.id, "type": "function",
                    "function": {"name": block.name, "arguments": ""}}]}),
                ));
            }
            Body::BlockDelta { index, delta } => {
                if let Some(t) = &delta.text {
                    out.push(s.delta(json!({"content": t})));
                } else if let Some(p) = &delta.partial_json {
                    let slot = s.tools.get(index).copied().unwrap_or(0);
                    out.push(s.delta(
                        json!({"tool_calls": [{"index": slot, "function": {"arguments": p}}]}),
                    ));
                }
            }
            Body::MessageDelta(d, _) => {
                let reason = d.stop_reason.as_deref().unwrap_or("end_turn");
                let mut choice = Map::new();
                choice.insert("index".into(), json!(0));
                choice.insert("delta".into(), json!({}));
                choice.insert("logprobs".into(), Value::Null);
                let sequence = d.stop_sequence.as_deref().map_or(Value::Null, |q| json!(q));
                openai_finish(&mut choice, reason, &sequence);
                out.push(s.chunk(Value::Object(choice)));
            }
            Body::MessageStop => {
                if self.include_usage {
                    let u = self.usage();
                    let s = &self.openai_out;
                    out.push(frame(None, &json!({"id": s.id, "object": "chat.completion.chunk", "created": s.created,
                        "model": s.model, "choices": [], "usage": {"prompt_tokens": u.input, "completion_tokens": u.output,
                        "total_tokens": u.input.saturating_add(u.output), "prompt_tokens_details": {"cached_tokens": u.cached_input}}}).to_string()));
                }
                out.push(frame(None, "[DONE]"));
            }
            Body::Error(err) => {
                let t = err.kind.as_deref().unwrap_or("api_error");
                let message = err
                    .message
                    .as_deref()
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
        Ok(())
    }
}
