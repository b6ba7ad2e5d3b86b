//! Responses API streams: typed SSE events (`event: response.…`) each carrying its `type`
//! and a `sequence_number`.
//!
//! - `Native` reads an `openai` upstream's own Responses stream and passes each event on,
//!   with the gateway's id written into the `response` objects it carries, while taking the
//!   text (to count when the usage never comes) and the usage of `response.completed`.
//! - `ChatToResponses` writes the Responses events of a chat-completions stream (an OpenAI
//!   chat upstream's, or an Anthropic one's already translated to chat chunks):
//!   `response.created`, `response.in_progress`, per item `response.output_item.added`,
//!   (`response.content_part.added`, `response.output_text.delta`…, `…done`) or
//!   (`response.function_call_arguments.delta`…, `…done`), `response.output_item.done`,
//!   and `response.completed` (or `response.incomplete`) with the usage.
//!
//! Either keeps the final response object for the stored copy.

use bytes::Bytes;
use serde_json::{json, Map, Value};

use super::{response_object, usage_json, usage_of, Stamp};
use crate::quota::pricing::Usage;
use crate::upstream::providers::translate::stream::frame;

/// The error event a Responses stream ends with.
pub fn error_frame(sequence_number: u64, message: &str, code: &str) -> Bytes {
    let data = json!({"type": "error", "code": code, "message": message, "param": null,
        "sequence_number": sequence_number});
    frame(Some("error"), &data.to_string())
}

/// What one native event told the accounting.
#[derive(Debug, Default)]
pub struct Read {
    pub frame: Option<Bytes>,
    /// Output text (or tool arguments) the event carried.
    pub text: Option<String>,
    pub usage: Option<Usage>,
    /// The response is complete (`response.completed` / `response.incomplete`).
    pub done: bool,
    /// The upstream ended the stream with its own error (`error` / `response.failed`).
    pub failed: bool,
}

pub struct Native {
    stamp: Stamp,
    /// The next sequence number the gateway would give an event of its own.
    pub next_seq: u64,
    /// The final response object, stamped.
    pub completed: Option<Value>,
}

impl Native {
    pub fn new(stamp: Stamp) -> Self {
        Native {
            stamp,
            next_seq: 0,
            completed: None,
        }
    }

    /// Reads one upstream event; `Err` when it is not a Responses event.
    pub fn read(&mut self, name: &str, data: &str) -> Result<Read, &'static str> {
        let mut v: Value = serde_json::from_str(data)
            .map_err(|_| "The upstream sent an event that is not JSON.")?;
        let kind = v
            .get("type")
            .and_then(Value::as_str)
            .ok_or("The upstream sent an event without a type.")?
            .to_string();
        if let Some(s) = v.get("sequence_number").and_then(Value::as_u64) {
            self.next_seq = self.next_seq.max(s.saturating_add(1));
        }
        let mut read = Read::default();
        if let Some(r) = v.get_mut("response") {
            self.stamp.apply(r);
        }
        match kind.as_str() {
            "response.output_text.delta"
            | "response.function_call_arguments.delta"
            | "response.refusal.delta"
            | "response.reasoning_summary_text.delta"
            // A custom tool's input (Codex's `apply_patch`) and raw reasoning text (gpt-oss
            // on vLLM): output billed as any other, counted when the usage never comes.
            | "response.custom_tool_call_input.delta"
            | "response.reasoning_text.delta" => {
                read.text = v.get("delta").and_then(Value::as_str).map(str::to_string);
            }
            "response.completed" | "response.incomplete" => {
                read.usage = v.pointer("/response/usage").and_then(usage_of);
                read.done = true;
                self.completed = v.get("response").cloned();
            }
            "response.failed" | "error" => read.failed = true,
            _ => {}
        }
        let name = if name.is_empty() || name == "message" {
            kind.as_str()
        } else {
            name
        };
        read.frame = Some(frame(Some(name), &v.to_string()));
        Ok(read)
    }
}

/// An item the chat stream has opened.
#[derive(Debug)]
enum Open {
    Message {
        index: usize,
        text: String,
    },
    Call {
        index: usize,
        id: String,
        call_id: String,
        name: String,
        args: String,
    },
}

pub struct ChatToResponses {
    body: Map<String, Value>,
    stamp: Stamp,
    seq: u64,
    started: bool,
    model: Value,
    created: i64,
    /// Items complete, in output order.
    done_items: Vec<Value>,
    /// The open message, if any.
    message: Option<Open>,
    /// Open tool calls by the chat chunk's tool-call index.
    calls: Vec<(u64, Open)>,
    finish: Option<String>,
    usage: Value,
    item_ids: String,
    pub completed: Option<Value>,
}

impl ChatToResponses {
    pub fn new(body: Map<String, Value>, stamp: Stamp) -> Self {
        let item_ids = stamp.id.trim_start_matches("resp_").to_string();
        ChatToResponses {
            body,
            stamp,
            seq: 0,
            started: false,
            model: Value::Null,
            created: 0,
            done_items: Vec::new(),
            message: None,
            calls: Vec::new(),
            finish: None,
            usage: Value::Null,
            item_ids,
            completed: None,
        }
    }

    pub fn next_seq(&self) -> u64 {
        self.seq
    }

    fn emit(&mut self, kind: &str, mut v: Value, out: &mut Vec<Bytes>) {
        v["type"] = json!(kind);
        v["sequence_number"] = json!(self.seq);
        self.seq += 1;
        out.push(frame(Some(kind), &v.to_string()));
    }

    fn response(&self, status_done: bool) -> Value {
        let output = if status_done {
            self.done_items.clone()
        } else {
            vec![]
        };
        let usage = if status_done {
            self.usage.clone()
        } else {
            Value::Null
        };
        let finish = if status_done {
            self.finish.as_deref()
        } else {
            None
        };
        let mut r = response_object(&self.body, &self.model, self.created, output, finish, usage);
        if !status_done {
            r["status"] = json!("in_progress");
        }
        self.stamp.apply(&mut r);
        r
    }

    fn next_index(&self) -> usize {
        self.done_items.len() + usize::from(self.message.is_some()) + self.calls.len()
    }

    fn close_message(&mut self, out: &mut Vec<Bytes>) {
        let Some(Open::Message { index, text }) = self.message.take() else {
            return;
        };
        let id = format!("msg_{}", self.item_ids);
        self.emit("response.output_text.done", json!({"item_id": id, "output_index": index, "content_index": 0, "text": text, "logprobs": []}), out);
        let part = json!({"type": "output_text", "text": text, "annotations": []});
        self.emit(
            "response.content_part.done",
            json!({"item_id": id, "output_index": index, "content_index": 0, "part": part}),
            out,
        );
        let item = json!({"type": "message", "id": id, "status": "completed", "role": "assistant", "content": [part]});
        self.emit(
            "response.output_item.done",
            json!({"output_index": index, "item": item}),
            out,
        );
        self.done_items.push(item);
    }

    fn close_calls(&mut self, out: &mut Vec<Bytes>) {
        for (_, open) in std::mem::take(&mut self.calls) {
            let Open::Call {
                index,
                id,
                call_id,
                name,
                args,
            } = open
            else {
                continue;
            };
            self.emit(
                "response.function_call_arguments.done",
                json!({"item_id": id, "output_index": index, "name": name, "arguments": args}),
                out,
            );
            let item = json!({"type": "function_call", "id": id, "call_id": call_id, "name": name, "arguments": args, "status": "completed"});
            self.emit(
                "response.output_item.done",
                json!({"output_index": index, "item": item}),
                out,
            );
            self.done_items.push(item);
        }
    }

    /// Takes one chat-completions event (a chunk, `[DONE]` or an error) and writes the
    /// Responses events it makes. Returns true when it was the end (`[DONE]`).
    pub fn push(&mut self, data: &str, out: &mut Vec<Bytes>) -> bool {
        if data == "[DONE]" {
            self.close_message(out);
            self.close_calls(out);
            let r = self.response(true);
            let kind = if r["status"] == "incomplete" {
                "response.incomplete"
            } else {
                "response.completed"
            };
            self.emit(kind, json!({"response": r}), out);
            self.completed = Some(r);
            return true;
        }
        let Ok(c) = serde_json::from_str::<Value>(data) else {
            return false;
        };
        if let Some(e) = c.get("error") {
            let message = e
                .get("message")
                .and_then(Value::as_str)
                .unwrap_or("The upstream failed.");
            let code = e
                .get("code")
                .and_then(Value::as_str)
                .or_else(|| e.get("type").and_then(Value::as_str))
                .unwrap_or("upstream_error");
            let seq = self.seq;
            self.seq += 1;
            out.push(error_frame(seq, message, code));
            return false;
        }
        if !self.started {
            self.started = true;
            self.model = c.get("model").cloned().unwrap_or(Value::Null);
            self.created = c.get("created").and_then(Value::as_i64).unwrap_or(0);
            let r = self.response(false);
            self.emit("response.created", json!({"response": r}), out);
            self.emit("response.in_progress", json!({"response": r}), out);
        }
        if let Some(u) = c.get("usage").filter(|u| u.is_object()) {
            self.usage = usage_json(u);
        }
        let Some(choice) = c.pointer("/choices/0") else {
            return false;
        };
        let delta = &choice["delta"];
        if let Some(t) = delta
            .get("content")
            .and_then(Value::as_str)
            .filter(|t| !t.is_empty())
        {
            if self.message.is_none() {
                self.close_calls(out);
                let index = self.next_index();
                let id = format!("msg_{}", self.item_ids);
                self.emit("response.output_item.added", json!({"output_index": index,
                    "item": {"type": "message", "id": id, "status": "in_progress", "role": "assistant", "content": []}}), out);
                self.emit(
                    "response.content_part.added",
                    json!({"item_id": id, "output_index": index, "content_index": 0,
                    "part": {"type": "output_text", "text": "", "annotations": []}}),
                    out,
                );
                self.message = Some(Open::Message {
                    index,
                    text: String::new(),
                });
            }
            let index = match &mut self.message {
                Some(Open::Message { index, text }) => {
                    text.push_str(t);
                    *index
                }
                _ => 0,
            };
            let id = format!("msg_{}", self.item_ids);
            self.emit("response.output_text.delta", json!({"item_id": id, "output_index": index, "content_index": 0, "delta": t, "logprobs": []}), out);
        }
        for tc in delta
            .get("tool_calls")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let k = tc.get("index").and_then(Value::as_u64).unwrap_or(0);
            if !self.calls.iter().any(|(i, _)| *i == k) {
                self.close_message(out);
                let index = self.next_index();
                let id = format!("fc_{}_{}", self.item_ids, index);
                let call_id = tc
                    .get("id")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_string();
                let name = tc
                    .pointer("/function/name")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_string();
                self.emit("response.output_item.added", json!({"output_index": index,
                    "item": {"type": "function_call", "id": id, "call_id": call_id, "name": name, "arguments": "", "status": "in_progress"}}), out);
                self.calls.push((
                    k,
                    Open::Call {
                        index,
                        id,
                        call_id,
                        name,
                        args: String::new(),
                    },
                ));
            }
            if let Some(a) = tc
                .pointer("/function/arguments")
                .and_then(Value::as_str)
                .filter(|a| !a.is_empty())
            {
                let mut ev = None;
                if let Some((
                    _,
                    Open::Call {
                        index, id, args, ..
                    },
                )) = self.calls.iter_mut().find(|(i, _)| *i == k)
                {
                    args.push_str(a);
                    ev = Some(json!({"item_id": id, "output_index": index, "delta": a}));
                }
                if let Some(ev) = ev {
                    self.emit("response.function_call_arguments.delta", ev, out);
                }
            }
        }
        if let Some(f) = choice.get("finish_reason").and_then(Value::as_str) {
            self.finish = Some(f.to_string());
        }
        false
    }
}
