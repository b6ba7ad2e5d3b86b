//! Streams across formats, event by event (nothing buffered beyond the current event),
//! and the accounting every stream needs whatever its formats: the usage the upstream
//! reported and the text it produced (to count when the usage never arrives).
//!
//! OpenAI → Anthropic client: `message_start` carries the input estimate (the real figure
//! comes last in OpenAI streams), `message_delta.usage` the actual output.
//! Anthropic → OpenAI client: deltas become `chat.completion.chunk`s; the usage chunk is
//! sent only when the client asked for it.

use std::collections::HashMap;

use bytes::{BufMut, Bytes, BytesMut};
use serde_json::{json, Value};

use super::response::{finish_to_stop, stop_to_finish};
use crate::error::WireFormat;
use crate::quota::estimate;
use crate::quota::pricing::Usage;
use crate::upstream::providers::{anthropic, openai};

pub struct StreamConverter {
    upstream: WireFormat,
    client: WireFormat,
    include_usage: bool,
    input_estimate: i64,
    input: Option<i64>,
    cached: i64,
    output: Option<i64>,
    text: String,
    done: bool,
    // The message being built on the other side.
    id: String,
    model: String,
    created: i64,
    started: bool,
    open_block: Option<usize>,
    next_block: usize,
    /// OpenAI tool-call index → Anthropic block index, or Anthropic block index → OpenAI tool index.
    tools: HashMap<i64, i64>,
    next_tool: i64,
    stop_reason: &'static str,
}

pub fn frame(event: Option<&str>, data: &str) -> Bytes {
    let mut b = BytesMut::with_capacity(data.len() + 32);
    if let Some(e) = event {
        b.put_slice(b"event: ");
        b.put_slice(e.as_bytes());
        b.put_slice(b"\n");
    }
    b.put_slice(b"data: ");
    b.put_slice(data.as_bytes());
    b.put_slice(b"\n\n");
    b.freeze()
}

/// An error event in `client`'s format, ending a stream that cannot complete.
pub fn error_event(client: WireFormat, message: &str, code: &str) -> Bytes {
    match client {
        WireFormat::OpenAi => frame(
            None,
            &json!({"error": {"message": message, "type": "server_error", "param": null, "code": code}}).to_string(),
        ),
        WireFormat::Anthropic => frame(
            Some("error"),
            &json!({"type": "error", "error": {"type": "api_error", "message": message, "code": code}}).to_string(),
        ),
    }
}

impl StreamConverter {
    pub fn new(
        upstream: WireFormat,
        client: WireFormat,
        include_usage: bool,
        input_estimate: i64,
    ) -> Self {
        Self {
            upstream,
            client,
            include_usage,
            input_estimate,
            input: None,
            cached: 0,
            output: None,
            text: String::new(),
            done: false,
            id: String::new(),
            model: String::new(),
            created: chrono::Utc::now().timestamp(),
            started: false,
            open_block: None,
            next_block: 0,
            tools: HashMap::new(),
            next_tool: 0,
            stop_reason: "end_turn",
        }
    }

    /// The upstream signalled a complete answer (`[DONE]` / `message_stop`).
    pub fn done(&self) -> bool {
        self.done
    }

    /// What to charge: the upstream's figures where they arrived, else the counted input and
    /// the output counted from the text received.
    pub fn usage(&self) -> Usage {
        Usage {
            input: self.input.unwrap_or(self.input_estimate),
            cached_input: self.cached,
            output: self
                .output
                .unwrap_or_else(|| estimate::count_text(&self.text)),
        }
    }

    /// The closing event of a stream that broke, in the client's format.
    pub fn error_frame(&self, message: &str) -> Bytes {
        error_event(self.client, message, "upstream_error")
    }

    /// Takes one upstream event and appends what the client must receive to `out`.
    pub fn event(&mut self, name: &str, data: &str, out: &mut Vec<Bytes>) {
        match (self.upstream, self.client) {
            (WireFormat::OpenAi, WireFormat::OpenAi) => self.openai_to_openai(data, out),
            (WireFormat::Anthropic, WireFormat::Anthropic) => {
                self.anthropic_to_anthropic(name, data, out)
            }
            (WireFormat::OpenAi, WireFormat::Anthropic) => self.openai_to_anthropic(data, out),
            (WireFormat::Anthropic, WireFormat::OpenAi) => self.anthropic_to_openai(data, out),
        }
    }

    fn note_openai_chunk(&mut self, v: &Value) {
        self.text.push_str(&openai::answer_text(v));
        if let Some(u) = v.get("usage").and_then(openai::usage_of) {
            self.input = Some(u.input);
            self.cached = u.cached_input;
            self.output = Some(u.output);
        }
    }

    fn openai_to_openai(&mut self, data: &str, out: &mut Vec<Bytes>) {
        if data == "[DONE]" {
            self.done = true;
            out.push(frame(None, data));
            return;
        }
        let Ok(v) = serde_json::from_str::<Value>(data) else {
            return;
        };
        self.note_openai_chunk(&v);
        let usage_only = v
            .get("choices")
            .and_then(Value::as_array)
            .is_some_and(Vec::is_empty)
            && v.get("usage").is_some_and(|u| !u.is_null());
        if !usage_only || self.include_usage {
            out.push(frame(None, data));
        }
    }

    fn note_anthropic_event(&mut self, v: &Value) -> &'static str {
        match v.get("type").and_then(Value::as_str).unwrap_or("") {
            "message_start" => {
                if let Some(u) = v.pointer("/message/usage").and_then(anthropic::usage_of) {
                    self.input = Some(u.input);
                    self.cached = u.cached_input;
                }
                "message_start"
            }
            "content_block_delta" => {
                for p in ["/delta/text", "/delta/partial_json"] {
                    if let Some(t) = v.pointer(p).and_then(Value::as_str) {
                        self.text.push_str(t);
                    }
                }
                "content_block_delta"
            }
            "message_delta" => {
                if let Some(o) = v.pointer("/usage/output_tokens").and_then(Value::as_i64) {
                    self.output = Some(o);
                }
                "message_delta"
            }
            "message_stop" => {
                self.done = true;
                "message_stop"
            }
            "content_block_start" => "content_block_start",
            "content_block_stop" => "content_block_stop",
            "error" => "error",
            _ => "ping",
        }
    }

    fn anthropic_to_anthropic(&mut self, name: &str, data: &str, out: &mut Vec<Bytes>) {
        let Ok(v) = serde_json::from_str::<Value>(data) else {
            return;
        };
        let kind = self.note_anthropic_event(&v);
        out.push(frame(Some(if name.is_empty() { kind } else { name }), data));
    }

    fn anthropic_event(out: &mut Vec<Bytes>, kind: &str, v: Value) {
        out.push(frame(Some(kind), &v.to_string()));
    }

    fn close_block(&mut self, out: &mut Vec<Bytes>) {
        if let Some(i) = self.open_block.take() {
            Self::anthropic_event(
                out,
                "content_block_stop",
                json!({"type": "content_block_stop", "index": i}),
            );
        }
    }

    fn open_block(&mut self, out: &mut Vec<Bytes>, block: Value) -> usize {
        self.close_block(out);
        let i = self.next_block;
        self.next_block += 1;
        self.open_block = Some(i);
        Self::anthropic_event(
            out,
            "content_block_start",
            json!({"type": "content_block_start", "index": i, "content_block": block}),
        );
        i
    }

    fn openai_to_anthropic(&mut self, data: &str, out: &mut Vec<Bytes>) {
        if data == "[DONE]" {
            if !self.started {
                return;
            }
            self.close_block(out);
            let output = self
                .output
                .unwrap_or_else(|| estimate::count_text(&self.text));
            Self::anthropic_event(
                out,
                "message_delta",
                json!({"type": "message_delta",
                "delta": {"stop_reason": self.stop_reason, "stop_sequence": null}, "usage": {"output_tokens": output}}),
            );
            Self::anthropic_event(out, "message_stop", json!({"type": "message_stop"}));
            self.done = true;
            return;
        }
        let Ok(v) = serde_json::from_str::<Value>(data) else {
            return;
        };
        self.note_openai_chunk(&v);
        if !self.started {
            self.started = true;
            let id = v.get("id").and_then(Value::as_str).unwrap_or("msg");
            Self::anthropic_event(
                out,
                "message_start",
                json!({"type": "message_start", "message": {
                "id": id, "type": "message", "role": "assistant", "model": v.get("model").cloned().unwrap_or(json!("")),
                "content": [], "stop_reason": null, "stop_sequence": null,
                "usage": {"input_tokens": self.input_estimate, "output_tokens": 0}}}),
            );
        }
        let Some(choice) = v.pointer("/choices/0") else {
            return;
        };
        if let Some(t) = choice
            .pointer("/delta/content")
            .and_then(Value::as_str)
            .filter(|t| !t.is_empty())
        {
            let idx = match self.open_block {
                Some(i) if !self.tools.values().any(|b| *b as usize == i) => i,
                _ => self.open_block(out, json!({"type": "text", "text": ""})),
            };
            Self::anthropic_event(
                out,
                "content_block_delta",
                json!({"type": "content_block_delta", "index": idx,
                "delta": {"type": "text_delta", "text": t}}),
            );
        }
        for tc in choice
            .pointer("/delta/tool_calls")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let slot = tc.get("index").and_then(Value::as_i64).unwrap_or(0);
            let block = match self.tools.get(&slot) {
                Some(b) if tc.get("id").is_none() => *b as usize,
                _ => {
                    let b = self.open_block(out, json!({"type": "tool_use", "id": tc.get("id").cloned().unwrap_or(json!("")),
                        "name": tc.pointer("/function/name").cloned().unwrap_or(json!("")), "input": {}}));
                    self.tools.insert(slot, b as i64);
                    b
                }
            };
            if let Some(args) = tc
                .pointer("/function/arguments")
                .and_then(Value::as_str)
                .filter(|a| !a.is_empty())
            {
                Self::anthropic_event(
                    out,
                    "content_block_delta",
                    json!({"type": "content_block_delta", "index": block,
                    "delta": {"type": "input_json_delta", "partial_json": args}}),
                );
            }
        }
        if let Some(f) = choice.get("finish_reason").and_then(Value::as_str) {
            self.stop_reason = finish_to_stop(f);
        }
    }

    fn openai_chunk(&self, delta: Value, finish: Option<&str>) -> Bytes {
        frame(None, &json!({"id": self.id, "object": "chat.completion.chunk", "created": self.created, "model": self.model,
            "choices": [{"index": 0, "delta": delta, "logprobs": null, "finish_reason": finish}]}).to_string())
    }

    fn anthropic_to_openai(&mut self, data: &str, out: &mut Vec<Bytes>) {
        let Ok(v) = serde_json::from_str::<Value>(data) else {
            return;
        };
        match self.note_anthropic_event(&v) {
            "message_start" => {
                self.id = v
                    .pointer("/message/id")
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_string();
                self.model = v
                    .pointer("/message/model")
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_string();
                out.push(self.openai_chunk(json!({"role": "assistant", "content": ""}), None));
            }
            "content_block_start"
                if v.pointer("/content_block/type").and_then(Value::as_str) == Some("tool_use") =>
            {
                let slot = self.next_tool;
                self.next_tool += 1;
                self.tools
                    .insert(v.get("index").and_then(Value::as_i64).unwrap_or(0), slot);
                let b = &v["content_block"];
                out.push(self.openai_chunk(
                    json!({"tool_calls": [{"index": slot, "id": b["id"], "type": "function",
                    "function": {"name": b["name"], "arguments": ""}}]}),
                    None,
                ));
            }
            "content_block_delta" => {
                if let Some(t) = v.pointer("/delta/text").and_then(Value::as_str) {
                    out.push(self.openai_chunk(json!({"content": t}), None));
                } else if let Some(p) = v.pointer("/delta/partial_json").and_then(Value::as_str) {
                    let slot = self
                        .tools
                        .get(&v.get("index").and_then(Value::as_i64).unwrap_or(0))
                        .copied()
                        .unwrap_or(0);
                    out.push(self.openai_chunk(
                        json!({"tool_calls": [{"index": slot, "function": {"arguments": p}}]}),
                        None,
                    ));
                }
            }
            "message_delta" => {
                let stop = v
                    .pointer("/delta/stop_reason")
                    .and_then(Value::as_str)
                    .unwrap_or("end_turn");
                out.push(self.openai_chunk(json!({}), Some(stop_to_finish(stop))));
            }
            "message_stop" => {
                if self.include_usage {
                    let u = self.usage();
                    out.push(frame(None, &json!({"id": self.id, "object": "chat.completion.chunk", "created": self.created,
                        "model": self.model, "choices": [], "usage": {"prompt_tokens": u.input, "completion_tokens": u.output,
                        "total_tokens": u.input + u.output, "prompt_tokens_details": {"cached_tokens": u.cached_input}}}).to_string()));
                }
                out.push(frame(None, "[DONE]"));
            }
            _ => {}
        }
    }
}
